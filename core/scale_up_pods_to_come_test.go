package core

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

func replicaSet(name string, replicas int32, conds ...appsv1.ReplicaSetCondition) *appsv1.ReplicaSet {
	// Its template is what rsPods make: a whole GPU node a pod.
	sample := rsPods(name, 0, 1, false)[0]
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("rs-" + name)},
		Spec: appsv1.ReplicaSetSpec{Replicas: &replicas, Template: apiv1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: sample.Labels}, Spec: *sample.Spec.DeepCopy()}},
		Status: appsv1.ReplicaSetStatus{Conditions: conds},
	}
}

// rsPods are n pods of ReplicaSet rs, from index from, each taking a whole
// GPU node; unschedulable when marked.
func rsPods(rs string, from, n int, unschedulable bool, opts ...to.PodOption) []*apiv1.Pod {
	out := make([]*apiv1.Pod, n)
	for i := range out {
		o := append([]to.PodOption{to.ControlledBy("ReplicaSet", rs, types.UID("rs-"+rs))}, wholeGPU()...)
		if unschedulable {
			o = append(o, to.Unschedulable())
		}
		out[i] = to.Pod(fmt.Sprintf("%s-%d", rs, from+i), append(o, opts...)...)
	}
	return out
}

// TestExpectedPods: once some of a ReplicaSet's pods are unschedulable,
// the loop buys nodes for the replicas it has yet to create too: its
// spec.replicas less every pod of it in the cache that is not terminal or
// terminating (bound, pending, not yet tried). None for a ReplicaSet that
// reports a ReplicaFailure, one with no unschedulable pod, a gang's
// pods, or with the option off. Expected pods get no event and are not
// counted as unschedulable.
func TestExpectedPods(t *testing.T) {
	deleting := func(p *apiv1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)} }
	failed := func(p *apiv1.Pod) { p.Status.Phase = apiv1.PodFailed }
	running := func(p *apiv1.Pod) { p.Spec.NodeName = "gone-node"; p.Status.Phase = apiv1.PodRunning }
	gated := func(p *apiv1.Pod) {
		p.Spec.SchedulingGates = []apiv1.PodSchedulingGate{{Name: "g"}}
	}
	gangMember := func(p *apiv1.Pod) { p.Labels = map[string]string{"scheduling.x-k8s.io/pod-group": "g"} }
	for _, tc := range []struct {
		name     string
		rs       *appsv1.ReplicaSet
		pods     []*apiv1.Pod
		off      bool
		want     int // nodes bought
		expected int // expected_pods
	}{
		{"the replicas to come", replicaSet("web", 40), rsPods("web", 0, 10, true), false, 40, 30},
		{"option off", replicaSet("web", 40), rsPods("web", 0, 10, true), true, 10, 0},
		{
			// 10 unschedulable, 20 not yet tried (planned now), 10 to
			// come; the 5 terminating and 5 failed ones are not the
			// ReplicaSet's any more.
			"pods not yet tried, and the rest to come", replicaSet("web", 40),
			concat(rsPods("web", 0, 10, true), rsPods("web", 10, 20, false), rsPods("web", 30, 5, false, deleting), rsPods("web", 35, 5, true, failed)),
			false, 40, 30,
		},
		{
			// All 40 made (its controller says so): the 30 the scheduler
			// has not tried are planned with the 10 it failed.
			"all made, 30 not yet tried", func() *appsv1.ReplicaSet { rs := replicaSet("web", 40); rs.Status.Replicas = 40; return rs }(),
			concat(rsPods("web", 0, 10, true), rsPods("web", 10, 30, false)), false, 40, 30,
		},
		{
			"a gated pod is not untried", func() *appsv1.ReplicaSet { rs := replicaSet("web", 40); rs.Status.Replicas = 40; return rs }(),
			concat(rsPods("web", 0, 10, true), rsPods("web", 10, 30, false, gated)), false, 10, 0,
		},
		{
			"a ReplicaSet failing to create pods", replicaSet("web", 40, appsv1.ReplicaSetCondition{Type: appsv1.ReplicaSetReplicaFailure, Status: apiv1.ConditionTrue}),
			rsPods("web", 0, 10, true), false, 10, 0,
		},
		{"no unschedulable pod", replicaSet("web", 40), rsPods("web", 0, 10, false), false, 0, 0},
		{
			// Scaled from 20 to 40: 10 of the 20 run (bound, on a node the
			// cache may not have yet), 10 are unschedulable, 20 to come.
			"scaled up: running pods count", func() *appsv1.ReplicaSet { rs := replicaSet("web", 40); rs.Status.Replicas = 20; return rs }(),
			concat(rsPods("web", 0, 10, false, running), rsPods("web", 10, 10, true)), false, 30, 20,
		},
		{"as many as it wants", replicaSet("web", 10), rsPods("web", 0, 10, true), false, 10, 0},
		{
			// Its controller reports all 40 made and the cache has seen
			// 10: the cache lags, and the 30 it has not seen are to come
			// (planned now, not a whole operation later).
			"its controller has them all, the cache lags", func() *appsv1.ReplicaSet { rs := replicaSet("web", 40); rs.Status.Replicas = 40; return rs }(),
			rsPods("web", 0, 10, true), false, 40, 30,
		},
		{"scaled down below its pods", replicaSet("web", 4), rsPods("web", 0, 10, true), false, 10, 0},
		{"gang members", replicaSet("web", 40), rsPods("web", 0, 10, true, gangMember), false, 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withOptions(func(o *Options) { o.ScaleUpForExpectedPods = !tc.off }))
			gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
			e.start()
			if err := e.rss.Add(tc.rs); err != nil {
				t.Fatal(err)
			}
			e.add(tc.pods)
			e.run()
			got := 0
			for _, n := range gpu.Increases() {
				got += n
			}
			if got != tc.want {
				t.Fatalf("bought %d nodes (increases %v), want %d", got, gpu.Increases(), tc.want)
			}
			if v := testutil.ToFloat64(e.a.metrics.ExpectedPods); v != float64(tc.expected) {
				t.Fatalf("expected_pods = %v, want %d", v, tc.expected)
			}
			real := 0
			for _, p := range tc.pods {
				if isUnschedulable(p) && p.DeletionTimestamp == nil && p.Status.Phase != apiv1.PodFailed {
					real++
				}
			}
			if v := testutil.ToFloat64(e.a.metrics.UnschedulablePods); v != float64(real) {
				t.Fatalf("unschedulable_pods = %v, want the %d real ones", v, real)
			}
			if n := len(e.events(EventTriggeredScaleUp)); tc.want > 0 && n != real {
				t.Fatalf("%d TriggeredScaleUp events, want one per real pod (%d)", n, real)
			}
		})
	}
}

// TestExpectedPodsReplacedByRealOnes: as the ReplicaSet's pods arrive,
// each replaces an expected one: the next loops buy nothing more.
func TestExpectedPodsReplacedByRealOnes(t *testing.T) {
	e := newEnv(t)
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	if err := e.rss.Add(replicaSet("web", 40)); err != nil {
		t.Fatal(err)
	}
	e.add(rsPods("web", 0, 10, true))
	e.run()
	for from := 10; from < 40; from += 10 {
		e.add(rsPods("web", from, 10, true))
		e.clock.Step(10 * time.Second)
		e.run()
	}
	if got := gpu.Increases(); len(got) != 1 || got[0] != 40 {
		t.Fatalf("increases %v, want [40]: the real pods took the expected ones' nodes", got)
	}
}

// countingPods counts List calls per namespace, and fails those of the
// namespaces in fail.
type countingPods struct {
	corelisters.PodLister
	lists map[string]int
	fail  map[string]bool
}

func (c *countingPods) Pods(ns string) corelisters.PodNamespaceLister {
	return &countingNamespace{PodNamespaceLister: c.PodLister.Pods(ns), c: c, ns: ns}
}

type countingNamespace struct {
	corelisters.PodNamespaceLister
	c  *countingPods
	ns string
}

func (n *countingNamespace) List(sel labels.Selector) ([]*apiv1.Pod, error) {
	n.c.lists[n.ns]++
	if n.c.fail[n.ns] {
		return nil, errors.New("cache not synced")
	}
	return n.PodNamespaceLister.List(sel)
}

// TestExpectedPodsTwoReplicaSetsInANamespace: each ReplicaSet's pods to
// come are its own replicas less its own pods, with the namespace's pods
// listed once a loop for both: web wants 40 (10 unschedulable: 30 to
// come), api 20 (5 running, 5 unschedulable: 10 to come). A namespace
// whose pods cannot be listed expects none (never all the replicas).
func TestExpectedPodsTwoReplicaSetsInANamespace(t *testing.T) {
	running := func(p *apiv1.Pod) { p.Spec.NodeName = "gone-node"; p.Status.Phase = apiv1.PodRunning }
	for _, tc := range []struct {
		name           string
		fail           bool
		bought, expect int
	}{
		{"listed once", false, 55, 40},
		{"not listed", true, 15, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, smoothing(6000, 100, 1000))
			gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
			e.start()
			counter := &countingPods{PodLister: e.a.listers.Pods, lists: map[string]int{}, fail: map[string]bool{"default": tc.fail}}
			e.a.listers.Pods = counter
			api := replicaSet("api", 20)
			api.Status.Replicas = 10
			for _, rs := range []*appsv1.ReplicaSet{replicaSet("web", 40), api} {
				if err := e.rss.Add(rs); err != nil {
					t.Fatal(err)
				}
			}
			e.add(concat(rsPods("web", 0, 10, true), rsPods("api", 0, 5, false, running), rsPods("api", 5, 5, true)))
			e.run()
			if got := gpu.Increases(); len(got) != 1 || got[0] != tc.bought {
				t.Fatalf("increases %v, want [%d]", got, tc.bought)
			}
			if v := testutil.ToFloat64(e.a.metrics.ExpectedPods); v != float64(tc.expect) {
				t.Fatalf("expected_pods = %v, want %d", v, tc.expect)
			}
			if n := counter.lists["default"]; n != 1 {
				t.Fatalf("the namespace's pods listed %d times in a loop, want once", n)
			}
		})
	}
}

func concat(pods ...[]*apiv1.Pod) []*apiv1.Pod {
	var out []*apiv1.Pod
	for _, p := range pods {
		out = append(out, p...)
	}
	return out
}

// TestExpectedPodsPackLikeRealOnes: copies buy what the real pods they
// stand for would, packed onto the same new nodes: 40 pods of 3 CPUs
// need as many nodes whether 13 are unschedulable and 27 untried, or all
// 40 unschedulable (planned in a pass of their own, the copies once left
// the real pods' half-filled new nodes unused: 9 nodes for 8).
func TestExpectedPodsPackLikeRealOnes(t *testing.T) {
	bought := func(t *testing.T, unschedulable int) int {
		e := newEnv(t)
		cpu := e.provider.AddGroup("cpu", 0, 100, cpuTemplate("cpu"))
		e.start()
		rs := replicaSet("web", 40)
		rs.Status.Replicas = 40
		if err := e.rss.Add(rs); err != nil {
			t.Fatal(err)
		}
		pods := func(from, n int, unsched bool) []*apiv1.Pod {
			out := make([]*apiv1.Pod, n)
			for i := range out {
				o := []to.PodOption{to.ControlledBy("ReplicaSet", "web", types.UID("rs-web")), to.Requests("3", "4Gi")}
				if unsched {
					o = append(o, to.Unschedulable())
				}
				out[i] = to.Pod(fmt.Sprintf("web-%d", from+i), o...)
			}
			return out
		}
		rs.Spec.Template.Spec = *pods(0, 1, false)[0].Spec.DeepCopy() // its template: what its pods are
		if err := e.rss.Update(rs); err != nil {
			t.Fatal(err)
		}
		e.add(pods(0, unschedulable, true), pods(unschedulable, 40-unschedulable, false))
		e.run()
		n := 0
		for _, d := range cpu.Increases() {
			n += d
		}
		return n
	}
	want := bought(t, 40)
	if got := bought(t, 13); got != want {
		t.Fatalf("13 unschedulable and 27 untried bought %d nodes, 40 unschedulable %d", got, want)
	}
}

// TestExpectedPodsFromTheTemplateNotAPod (#40): a tenant with the stock
// edit role gives one hand-made 8-GPU pod a controller reference to a
// ReplicaSet of 5,000 one-CPU pods that is still creating them: that pod
// is planned as itself (one GPU node), its siblings to come are copies of
// the template (one CPU each), never of it (before: 50 GPU nodes). A pod
// of the template brings the same.
func TestExpectedPodsFromTheTemplateNotAPod(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handMad bool
		wantGPU int
		wantCPU bool
	}{
		{"a hand-made pod of another shape", true, 1, true},
		{"a pod of the template", false, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
			cpu := e.provider.AddGroup("cpu", 0, 100, cpuTemplate("cpu"))
			e.start()
			rs := replicaSet("tiny", 5000)
			tiny := to.Pod("tiny-0", to.ControlledBy("ReplicaSet", "tiny", types.UID("rs-tiny")), to.Requests("1", "1Gi"))
			rs.Spec.Template.Spec = *tiny.Spec.DeepCopy()
			if err := e.rss.Add(rs); err != nil {
				t.Fatal(err)
			}
			p := to.Pod("tiny-0", to.ControlledBy("ReplicaSet", "tiny", types.UID("rs-tiny")), to.Requests("1", "1Gi"), to.Unschedulable())
			if tc.handMad {
				p = to.Pod("tiny-x", append(wholeGPU(), to.ControlledBy("ReplicaSet", "tiny", types.UID("rs-tiny")), to.Unschedulable())...)
			}
			e.add(p)
			e.run()
			sum := func(g []int) int {
				n := 0
				for _, d := range g {
					n += d
				}
				return n
			}
			if got := sum(gpu.Increases()); got != tc.wantGPU {
				t.Fatalf("bought %d GPU nodes, want %d", got, tc.wantGPU)
			}
			if got := sum(cpu.Increases()); (got > 1) != tc.wantCPU {
				t.Fatalf("bought %d CPU nodes: want the siblings to come planned %v", got, tc.wantCPU)
			}
		})
	}
}

// latePods is a pod lister whose namespace lists also return pods the
// cache got after the loop's snapshot (created meanwhile, untried).
type latePods struct {
	corelisters.PodLister
	late []*apiv1.Pod
}

func (l *latePods) Pods(ns string) corelisters.PodNamespaceLister {
	return &lateNamespace{PodNamespaceLister: l.PodLister.Pods(ns), late: l.late}
}

type lateNamespace struct {
	corelisters.PodNamespaceLister
	late []*apiv1.Pod
}

func (n *lateNamespace) List(sel labels.Selector) ([]*apiv1.Pod, error) {
	pods, err := n.PodNamespaceLister.List(sel)
	return append(pods, n.late...), err
}

// TestExpectedPodsCreatedAfterTheSnapshot: pods the cache gets while a
// loop runs, after its snapshot, are not the loop's untried pods; they
// are pods to come like the ones not yet made. web wants 40: 10
// unschedulable in the snapshot, 20 more made meanwhile: 30 to come, 40
// nodes. Before, the 20 were counted as the ReplicaSet's pods but never
// planned: 20 nodes, the rest a loop (and, on Azure, an operation) later.
func TestExpectedPodsCreatedAfterTheSnapshot(t *testing.T) {
	e := newEnv(t, smoothing(6000, 100, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.a.listers.Pods = &latePods{PodLister: e.a.listers.Pods, late: rsPods("web", 10, 20, false)}
	if err := e.rss.Add(replicaSet("web", 40)); err != nil {
		t.Fatal(err)
	}
	e.add(rsPods("web", 0, 10, true))
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 40 {
		t.Fatalf("increases %v, want [40]", got)
	}
	if v := testutil.ToFloat64(e.a.metrics.ExpectedPods); v != 30 {
		t.Fatalf("expected_pods = %v, want 30", v)
	}
}
