package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	schedv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
)

// gang creates a native PodGroup with minCount members and a Deployment of
// that many whole-node GPU pods belonging to it, on the given scale sets.
func (sc *scenario) gang(name string, members int32, sets ...string) {
	sc.t.Helper()
	sc.gangWith(name, members, func(*appsv1.Deployment) {}, sets...)
}

// gangWith is gang (a native PodGroup and a Deployment of its whole-node
// GPU pods) with the Deployment changed before it is created.
func (sc *scenario) gangWith(name string, members int32, change func(*appsv1.Deployment), sets ...string) {
	sc.t.Helper()
	pg := &schedv1alpha2.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sc.ns}}
	pg.Spec.SchedulingPolicy.Gang = &schedv1alpha2.GangSchedulingPolicy{MinCount: members}
	if _, err := sc.s.cp.Client.SchedulingV1alpha2().PodGroups(sc.ns).Create(sc.ctx, pg, metav1.CreateOptions{}); err != nil {
		sc.t.Fatalf("creating PodGroup %s: %v", name, err)
	}
	d := sc.deployment(name, members, "90", 8, sets...)
	d.Spec.Template.Spec.SchedulingGroup = &apiv1.PodSchedulingGroup{PodGroupName: &name}
	change(d)
	sc.create(d)
}

// running counts the Running pods of a Deployment.
func (sc *scenario) running(app string) int {
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		sc.t.Fatal(err)
	}
	n := 0
	for _, p := range pods.Items {
		if p.Status.Phase == apiv1.PodRunning {
			n++
		}
	}
	return n
}

func (sc *scenario) eventsWith(reason, text string) int {
	n := 0
	for _, e := range sc.events(reason) {
		if strings.Contains(e.Message, text) {
			n++
		}
	}
	return n
}

// A gang of 16 whole-node pods, min 16, with a node-addition burst of 4:
// its 16 nodes go in one request, and the real scheduler's gang scheduling
// runs all 16.
func TestGangOf16NodesReleasedTogether(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, nil)
	as := sc.autoscaler("autoscaler", "--nodes=0:20:"+gpu, "--node-addition-burst=4", "--node-addition-adaptive=false")
	sc.gang("train", 16, gpu)
	sc.eventually("16 gang pods Running", 3*time.Minute, allRunning(sc, 16))
	if got := sc.capacity(gpu); got != 16 {
		t.Fatalf("capacity %d, want 16", got)
	}
	_, body := sc.get(as, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_scale_ups_total{node_group="`+gpu+`"}`); got != 1 {
		t.Fatalf("scale-up requests %v, want 1: a gang's nodes are released together", got)
	}
}

// A gang bigger than its group's max gets no node at all, and its pods say
// why; a group with room for one of two gangs provisions one whole.
func TestGangAllOrNothing(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	small := sc.scaleSet("small", "Standard_ND96isr_H100_v5", 0, nil)
	room := sc.scaleSet("room", "Standard_ND96isr_H100_v5", 0, nil)
	as := sc.autoscaler("autoscaler", "--nodes=0:10:"+small, "--nodes=0:16:"+room)
	sc.gang("big", 16, small)
	sc.gang("first", 12, room)
	sc.gang("second", 12, room)
	sc.eventually("one of the two competing gangs Running", 3*time.Minute, func() (bool, string) {
		a, b := sc.running("first"), sc.running("second")
		return (a == 12 && b == 0) || (a == 0 && b == 12), fmt.Sprintf("first %d, second %d running, capacity %d", a, b, sc.capacity(room))
	})
	sc.eventually("the too-big gang's pods told why", time.Minute, func() (bool, string) {
		n := sc.eventsWith("NotTriggerScaleUp", "node group "+small+" can add 10 nodes, the gang needs 16")
		return n > 0, fmt.Sprintf("%d events", n)
	})
	sc.stays(small, 0, as, 5)
	sc.stays(room, 12, as, 2)
	if a, b := sc.running("first"), sc.running("second"); a+b != 12 {
		t.Fatalf("running %d + %d, want one gang whole and none of the other", a, b)
	}
}

// Team capacity: groups carry team taints from their tags; a pod
// tolerating its team's taint grows only that team's group; a borrower
// (catch-all toleration) grows no team's group.
func TestTeamGroups(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	tag := func(team string) map[string]string {
		return map[string]string{armsim.TaintTagPrefix + "openai.com__team": team + ":NoSchedule"}
	}
	rl := sc.scaleSet("rl", "Standard_ND96isr_H100_v5", 0, tag("rl"))
	cv := sc.scaleSet("cv", "Standard_ND96isr_H100_v5", 0, tag("cv"))
	as := sc.autoscaler("autoscaler", "--nodes=0:5:"+rl, "--nodes=0:5:"+cv)
	team := sc.deployment("rl-job", 2, "90", 8, rl, cv)
	team.Spec.Template.Spec.Tolerations = []apiv1.Toleration{{Key: "openai.com/team", Operator: apiv1.TolerationOpEqual, Value: "rl", Effect: apiv1.TaintEffectNoSchedule}}
	sc.create(team)
	sc.eventually("the rl team's pods Running", 2*time.Minute, func() (bool, string) {
		n := sc.running("rl-job")
		return n == 2, fmt.Sprintf("%d running, rl %d cv %d", n, sc.capacity(rl), sc.capacity(cv))
	})
	borrower := sc.deployment("borrower", 1, "90", 8, rl, cv)
	borrower.Spec.Template.Spec.Tolerations = []apiv1.Toleration{{Operator: apiv1.TolerationOpExists}}
	sc.create(borrower)
	sc.eventually("the borrower told why", time.Minute, func() (bool, string) {
		// This scenario's group named: every autoscaler in the cluster sees
		// the pod, and others with team groups refuse it too.
		n := sc.eventsWith("NotTriggerScaleUp", "of node group "+rl+" only through a catch-all toleration")
		return n > 0, fmt.Sprintf("%d events", n)
	})
	sc.stays(rl, 2, as, 5)
	sc.stays(cv, 0, as, 1)
	if n := sc.running("borrower"); n != 0 {
		t.Fatalf("borrower running %d: there was no idle room", n)
	}
}

// The coscheduling plugin's gangs: its PodGroup CRD (installed here from
// our own manifest; the plugin itself is not built), the pod label, and
// spec.minMember read through a dynamic informer. 6 members with
// minMember 4 on a group that can add 5: the gang's minimum fits, so 5
// nodes are requested — with the minimum unknown (all 6) it would get none.
func TestCoschedulingGang(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	dc, err := dynamic.NewForConfig(sc.s.cp.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "podgroups.scheduling.x-k8s.io"},
		"spec": map[string]any{
			"group": "scheduling.x-k8s.io", "scope": "Namespaced",
			"names": map[string]any{"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup", "shortNames": []any{"pg"}},
			"versions": []any{map[string]any{"name": "v1alpha1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Create(sc.ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pgs := dc.Resource(schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}).Namespace(sc.ns)
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": "mpi", "namespace": sc.ns},
		"spec":     map[string]any{"minMember": int64(4)},
	}}
	sc.eventually("the PodGroup CRD served", 30*time.Second, func() (bool, string) {
		_, err := pgs.Create(sc.ctx, pg, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	// Custom resources are served once the CRD's names are accepted, but
	// discovery, which the autoscaler reads once at start, lists them only
	// once it is Established.
	sc.eventually("the PodGroup API in discovery", 30*time.Second, func() (bool, string) {
		res, err := sc.s.cp.Client.Discovery().ServerResourcesForGroupVersion("scheduling.x-k8s.io/v1alpha1")
		if err != nil {
			return false, err.Error()
		}
		for _, r := range res.APIResources {
			if r.Name == "podgroups" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("resources %v", res.APIResources)
	})
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, nil)
	as := sc.autoscaler("autoscaler", "--nodes=0:5:"+gpu)
	sc.eventually("the coscheduling API seen", 30*time.Second, func() (bool, string) {
		return sc.logContains(as, "reading coscheduling PodGroups"), "not yet"
	})
	d := sc.deployment("mpi", 6, "90", 8, gpu)
	d.Spec.Template.Labels[gang.CoschedulingLabel] = "mpi"
	sc.create(d)
	sc.eventually("5 members Running", 2*time.Minute, func() (bool, string) {
		n := sc.running("mpi")
		return n == 5, fmt.Sprintf("%d running, capacity %d", n, sc.capacity(gpu))
	})
	sc.stays(gpu, 5, as, 3)
}
