package core

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/trigger"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// freshDriver gives the autoscaler a driver with nothing pending, so a
// test sees only what its handler calls asked for.
func freshDriver(e *env) {
	e.a.driver = trigger.New(e.clock, e.a.triggerTiming)
}

// pending is the reason of the next loop asked for — at once, or the
// timed wake's (a follow-up) — and whether a batch of pods is open.
func pending(e *env) (trigger.Reason, bool) {
	r, batched := e.a.driver.Pending()
	if r == trigger.None {
		r, _ = e.a.driver.Timed()
	}
	return r, batched
}

// TestPodHandler: a pod wakes a loop (opens the batch) when it turns
// unbound and unschedulable: added so (not in the initial list), or
// updated from anything else; while it stays so, only when the scheduler
// writes a new verdict and the last loop expected pods to be placed on
// usable or coming nodes.
func TestPodHandler(t *testing.T) {
	fresh := func() *apiv1.Pod { return to.Pod("p", to.Requests("1", "1Gi")) }
	unsched := func() *apiv1.Pod { return to.Pod("p", to.Requests("1", "1Gi"), to.Unschedulable()) }
	gated := func() *apiv1.Pod {
		p := fresh()
		p.Status.Conditions = []apiv1.PodCondition{{Type: apiv1.PodScheduled, Status: apiv1.ConditionFalse, Reason: apiv1.PodReasonSchedulingGated}}
		return p
	}
	bound := func() *apiv1.Pod { p := unsched(); p.Spec.NodeName = "n1"; return p }
	deleting := func() *apiv1.Pod { p := unsched(); p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}; return p }
	newMessage := func() *apiv1.Pod {
		p := unsched()
		p.Status.Conditions[0].Message = "0/7500 nodes are available"
		return p
	}
	for _, tc := range []struct {
		name      string
		old, new  *apiv1.Pod // old nil: an add
		initial   bool
		expecting bool // the last loop left pods to usable or coming nodes
		want      bool
	}{
		{"added unschedulable", nil, unsched(), false, false, true},
		{"added unschedulable in the initial list", nil, unsched(), true, false, false},
		{"added not yet tried", nil, fresh(), false, false, false},
		{"turned unschedulable", fresh(), unsched(), false, false, true},
		{"from gated to unschedulable", gated(), unsched(), false, false, true},
		{"turned gated", fresh(), gated(), false, false, false},
		{"still unschedulable, new message", unsched(), newMessage(), false, false, false},
		{"still unschedulable, new message, pods expected to fit", unsched(), newMessage(), false, true, true},
		{"still unschedulable, same verdict, pods expected to fit", unsched(), unsched(), false, true, false},
		{"re-marked but bound", newMessage(), bound(), false, true, false},
		{"bound", unsched(), bound(), false, false, false},
		{"being deleted", fresh(), deleting(), false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t).start()
			freshDriver(e)
			e.a.expecting.Store(tc.expecting)
			h := e.a.PodHandler()
			if tc.old == nil {
				h.OnAdd(tc.new, tc.initial)
			} else {
				h.OnUpdate(tc.old, tc.new)
			}
			h.OnDelete(tc.new) // never a trigger
			// A new pod opens the batch; a new verdict is a follow-up (a
			// timed wake for pods).
			r, batched := pending(e)
			if woke := batched || r == trigger.Pods; woke != tc.want || (r != trigger.None && r != trigger.Pods) {
				t.Fatalf("pending %v, batch open %v; want a wake for pods %v", r, batched, tc.want)
			}
		})
	}
}

// TestNodeHandler: a node wakes a loop when it turns usable by the loop's
// own rule (Ready, no not-ready taint, past preflight, no startup taint,
// GPUs advertised when labelled a GPU node), with the taint keys in force,
// and only while the last loop left nodes queued.
func TestNodeHandler(t *testing.T) {
	d := DefaultOptions()
	pf := d.Preflight.Taint
	withTaint := func(key string, effect apiv1.TaintEffect) to.NodeOption {
		return func(n *apiv1.Node) { n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: key, Effect: effect}) }
	}
	node := func(opts ...to.NodeOption) *apiv1.Node { return to.Node("n1", "96", "900Gi", opts...) }
	gpuLabel := to.NodeLabels(d.GPULabel, "nvidia-a100")
	for _, tc := range []struct {
		name     string
		opts     func(*Options)
		old, new *apiv1.Node // old nil: an add
		initial  bool
		queued   bool
		want     bool
	}{
		{"turned Ready", nil, node(to.NotReady()), node(), false, true, true},
		{"turned Ready, nothing queued", nil, node(to.NotReady()), node(), false, false, false},
		{"Ready, still the not-ready taint", nil, node(to.NotReady()), node(withTaint(apiv1.TaintNodeNotReady, apiv1.TaintEffectNoSchedule)), false, true, false},
		{"not-ready taint lifted", nil, node(withTaint(apiv1.TaintNodeNotReady, apiv1.TaintEffectNoSchedule)), node(), false, true, true},
		{"Ready under the preflight taint", nil, node(to.NotReady(), withTaint(pf.Key, pf.Effect)), node(withTaint(pf.Key, pf.Effect)), false, true, false},
		{"preflight passed", nil, node(withTaint(pf.Key, pf.Effect)), node(), false, true, true},
		{"preflight failed", nil, node(withTaint(pf.Key, pf.Effect)), node(to.NodeLabels(d.Preflight.Label, "failed")), false, true, false},
		{"preflight off: its taint is nothing", func(o *Options) { o.Preflight.Enabled = false }, node(to.NotReady(), withTaint(pf.Key, pf.Effect)), node(withTaint(pf.Key, pf.Effect)), false, true, true},
		{"a startup taint lifted", nil, node(withTaint(d.StartupTaints[0], apiv1.TaintEffectNoSchedule)), node(), false, true, true},
		{"a prefixed startup taint lifted", nil, node(withTaint(clusterstate.StartupTaintPrefix+"cni", apiv1.TaintEffectNoExecute)), node(), false, true, true},
		{"a configured startup taint lifted", func(o *Options) { o.StartupTaints = []string{"example.com/agent"} }, node(withTaint("example.com/agent", apiv1.TaintEffectNoSchedule)), node(), false, true, true},
		{"an unknown taint is no startup taint", nil, node(to.NotReady(), withTaint("example.com/other", apiv1.TaintEffectNoSchedule)), node(withTaint("example.com/other", apiv1.TaintEffectNoSchedule)), false, true, true},
		{"GPU node before its GPUs", nil, node(to.NotReady(), gpuLabel), node(gpuLabel), false, true, false},
		{"GPU node's GPUs advertised", nil, node(gpuLabel), node(gpuLabel, to.NodeGPUs(8)), false, true, true},
		{"unlabelled node's GPUs advertised", nil, node(), node(to.NodeGPUs(8)), false, true, true},
		{"still usable", nil, node(to.NodeGPUs(8)), node(to.NodeGPUs(8), to.NodeLabels("x", "y")), false, true, false},
		{"turned NotReady", nil, node(), node(to.NotReady()), false, true, false},
		{"added usable", nil, nil, node(), false, true, true},
		{"added usable in the initial list", nil, nil, node(), true, true, false},
		{"added NotReady", nil, nil, node(to.NotReady()), false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []envOption
			if tc.opts != nil {
				opts = append(opts, withOptions(tc.opts))
			}
			e := newEnv(t, opts...).start()
			freshDriver(e)
			e.a.additionQueued.Store(tc.queued)
			h := e.a.NodeHandler()
			if tc.old == nil {
				h.OnAdd(tc.new, tc.initial)
			} else {
				h.OnUpdate(tc.old, tc.new)
			}
			want := trigger.None
			if tc.want {
				want = trigger.NodeReady
			}
			if r, _ := pending(e); r != want {
				t.Fatalf("pending %v, want %v", r, want)
			}
		})
	}
}

// TestNodeRulesFollowReload: the node handler reads the preflight and
// startup taints in force, from the loop that applied a reload on.
func TestNodeRulesFollowReload(t *testing.T) {
	e := newEnv(t).start()
	e.a.additionQueued.Store(true)
	key := "example.com/gpu-check"
	tainted := to.Node("n1", "96", "900Gi", to.Taint(key, "pending"))
	h := e.a.NodeHandler()
	freshDriver(e)
	h.OnUpdate(to.Node("n1", "96", "900Gi", to.NotReady()), tainted)
	if r, _ := pending(e); r != trigger.NodeReady {
		t.Fatalf("before the reload, %s is no preflight taint: pending %v", key, r)
	}
	o := e.a.Options()
	o.Preflight.Taint.Key = key
	if err := e.a.Reconfigure(o); err != nil {
		t.Fatal(err)
	}
	e.run()
	e.a.additionQueued.Store(true)
	freshDriver(e)
	h.OnUpdate(to.Node("n1", "96", "900Gi", to.NotReady()), tainted)
	if r, _ := pending(e); r != trigger.None {
		t.Fatalf("%s is the preflight taint now: pending %v", key, r)
	}
	h.OnUpdate(tainted, to.Node("n1", "96", "900Gi"))
	if r, _ := pending(e); r != trigger.NodeReady {
		t.Fatalf("preflight passed: pending %v", r)
	}
}

// TestAdditionQueuedAfterLoop: a loop that leaves nodes queued by the
// in-flight cap lets nodes turning usable wake the next; one that leaves
// none, or leaves them to the rate (tokens, not nodes, free them), does not.
func TestAdditionQueuedAfterLoop(t *testing.T) {
	rate := newEnv(t, smoothing(60, 10, 1000))
	rate.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	rate.start()
	rate.add(pendingPods(30, "train", wholeGPU()...))
	rate.run()
	if rate.a.additionQueued.Load() {
		t.Fatal("20 nodes held by the rate: a node turning usable frees no token, yet told queued")
	}
	e := newEnv(t, smoothing(6000, 100, 10))
	e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	pods := pendingPods(30, "train", wholeGPU()...)
	e.add(pods)
	e.run()
	if !e.a.additionQueued.Load() {
		t.Fatal("20 nodes queued by the in-flight cap, not told")
	}
	for _, p := range pods {
		if err := e.pods.Delete(p); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Step(10 * time.Second)
	e.run()
	if e.a.additionQueued.Load() {
		t.Fatal("the demand went away, the queue is empty: still told queued")
	}
}

// TestRateHeldNodesWake: a loop that leaves nodes to the rate asks for a
// loop when the bucket holds them (or a burst's worth), no sooner than a
// follow-up may come after its release and at most half a scan interval
// later; one that leaves them to the in-flight cap, or leaves nothing,
// asks for none.
func TestRateHeldNodesWake(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  envOption
		pods int
		want time.Duration // 0: no timed wake
	}{
		// 10 released, 20 held: a burst of 10 at 1 a second is 10 s.
		{"the burst's worth at the rate", smoothing(60, 10, 1000), 30, 10 * time.Second},
		// 3 held at 1 a second: 3 s, but the follow-up pace
		// (--node-group-write-interval) is 5 s by default...
		{"no sooner than the follow-up pace", smoothing(60, 10, 1000), 13, 5 * time.Second},
		// ...and what it is set to.
		{"a shorter pace", combine(smoothing(60, 10, 1000), withOptions(func(o *Options) { o.NodeGroupWriteInterval = 4 * time.Second })), 13, 4 * time.Second},
		{"no pace", combine(smoothing(60, 10, 1000), withOptions(func(o *Options) { o.NodeGroupWriteInterval = 0 })), 13, 3 * time.Second},
		// 10 at 0.1 a second is 100 s: half the scan interval instead.
		{"at most half the scan interval", smoothing(6, 10, 1000), 30, 15 * time.Second},
		{"held by the in-flight cap", smoothing(6000, 100, 10), 30, 0},
		{"nothing held", smoothing(600, 10, 1000), 5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opt, withOptions(func(o *Options) { o.ScanInterval = 30 * time.Second }))
			e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
			e.start()
			e.add(pendingPods(tc.pods, "train", wholeGPU()...))
			freshDriver(e)
			start := e.clock.Now()
			if err := e.a.RunOnce(e.ctx); err != nil {
				t.Fatal(err)
			}
			r, at := e.a.driver.Timed()
			switch {
			case tc.want == 0 && !at.IsZero():
				t.Fatalf("timed wake %v at +%v, want none", r, at.Sub(start))
			case tc.want != 0 && (r != trigger.Queue || at.Sub(start) != tc.want):
				t.Fatalf("timed wake %v at +%v, want queue at +%v", r, at.Sub(start), tc.want)
			}
		})
	}
}

// TestFollowUpGap: a follow-up loop (a node turning usable, a new verdict
// on a pod left to coming nodes, the bucket refilling) comes no sooner
// than --node-group-write-interval after the last loop that released nodes; at once when
// that loop is older.
func TestFollowUpGap(t *testing.T) {
	e := newEnv(t, smoothing(6000, 100, 10))
	e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(30, "train", wholeGPU()...))
	e.run() // releases 10, the cap holds 20
	released := e.clock.Now()
	if !e.a.additionQueued.Load() {
		t.Fatal("the in-flight cap held 20 nodes: not told queued")
	}
	e.clock.Step(time.Second)
	freshDriver(e)
	ready := to.Node("gpu-0", "96", "900Gi")
	notReady := ready.DeepCopy()
	notReady.Status.Conditions[0].Status = apiv1.ConditionFalse
	e.a.NodeHandler().OnUpdate(notReady, ready)
	if r, at := e.a.driver.Timed(); r != trigger.NodeReady || !at.Equal(released.Add(e.writeGap())) {
		t.Fatalf("timed wake %v at %v, want node-ready %v after the release", r, at.Sub(released), e.writeGap())
	}
	e.clock.Step(e.writeGap())
	freshDriver(e)
	e.a.NodeHandler().OnUpdate(notReady, ready)
	if r, at := e.a.driver.Timed(); r != trigger.NodeReady || !at.Equal(e.clock.Now()) {
		t.Fatalf("timed wake %v at %v, want node-ready at once (%v)", r, at, e.clock.Now())
	}
	// A new verdict on a pod left to coming nodes: at least the gap after
	// the last loop's start, released or not.
	e.run()
	loopStart := e.clock.Now()
	e.clock.Step(time.Second)
	freshDriver(e)
	e.a.expecting.Store(true)
	unsched := to.Pod("p", to.Requests("1", "1Gi"), to.Unschedulable())
	again := unsched.DeepCopy()
	again.Status.Conditions[0].Message = "0/7500 nodes are available"
	e.a.PodHandler().OnUpdate(unsched, again)
	if r, at := e.a.driver.Timed(); r != trigger.Pods || !at.Equal(loopStart.Add(e.writeGap())) {
		t.Fatalf("timed wake %v at %v after the loop, want pods %v after", r, at.Sub(loopStart), e.writeGap())
	}
}

// TestExpectingAfterLoop: a loop that leaves pending pods to coming nodes
// lets the scheduler's new verdicts on them wake the next; one that leaves
// no pod to any node does not.
func TestExpectingAfterLoop(t *testing.T) {
	e := newEnv(t)
	e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	pods := pendingPods(2, "train", wholeGPU()...)
	e.add(pods)
	e.run()
	e.clock.Step(10 * time.Second)
	e.run() // the nodes bought are coming: the pods await them
	if !e.a.expecting.Load() {
		t.Fatal("2 pods left to 2 coming nodes: not expecting")
	}
	for _, p := range pods {
		if err := e.pods.Delete(p); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Step(10 * time.Second)
	e.run()
	if e.a.expecting.Load() {
		t.Fatal("no pending pod: still expecting")
	}
}

// TestScaleUpFailureWakes: a scale-up the cloud refuses for the group's
// sake (quota, capacity: the group is backed off) wakes a loop, which
// plans its pods on the other groups; a throttled, busy or fenced cloud
// does not (the same request would meet the same answer at once).
func TestScaleUpFailureWakes(t *testing.T) {
	for _, tc := range []struct {
		class cloudprovider.ErrorClass
		want  trigger.Reason
	}{
		{cloudprovider.ClassQuota, trigger.CloudFailure},
		{cloudprovider.ClassOutOfCapacity, trigger.CloudFailure},
		{cloudprovider.ClassOther, trigger.CloudFailure},
		{cloudprovider.ClassThrottled, trigger.None},
		{cloudprovider.ClassConflict, trigger.None},
	} {
		t.Run(tc.class.String(), func(t *testing.T) {
			e := newEnv(t)
			g := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"))
			e.start()
			g.SetIncreaseError(cloudprovider.NewError(tc.class, "Code", "refused", nil))
			e.add(pendingPods(2, "train", wholeGPU()...))
			freshDriver(e)
			err := e.a.RunOnce(e.ctx)
			if r, _ := pending(e); r != tc.want {
				t.Fatalf("pending %v after a %v failure (RunOnce: %v; increases %v), want %v", r, tc.class, err, g.Increases(), tc.want)
			}
		})
	}
}

// TestLoopsTotalAtZero: every trigger's series exists before any loop.
func TestLoopsTotalAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	if n := testutil.CollectAndCount(m.Loops); n != len(trigger.Reasons()) {
		t.Fatalf("%d series of loops_total, want %d", n, len(trigger.Reasons()))
	}
	for _, r := range []string{"periodic", "pods", "node-ready", "cloud-failure", "config", "queue"} {
		if v := testutil.ToFloat64(m.Loops.WithLabelValues(r)); v != 0 {
			t.Fatalf("loops_total{trigger=%q} = %v at start", r, v)
		}
	}
}

// TestRunWokenByEvents: Run, on the autoscaler's clock, counts each loop
// under what woke it: the first loop (periodic), a failed scale-up, a
// reload (whose new scan interval is the floor from then on), pods after
// their batching window, and the floor.
func TestRunWokenByEvents(t *testing.T) {
	e := newEnv(t)
	g := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"))
	other := e.provider.AddGroup("gpu-b", 0, 20, gpuTemplate("gpu-b"))
	e.start()
	g.SetIncreaseError(cloudprovider.NewError(cloudprovider.ClassQuota, "QuotaExceeded", "0 of 8 cores left", nil))
	other.SetIncreaseError(cloudprovider.NewError(cloudprovider.ClassQuota, "QuotaExceeded", "0 of 8 cores left", nil))
	e.add(pendingPods(1, "train", wholeGPU()...))
	ctx, cancel := context.WithCancel(e.ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		e.a.Run(ctx, nil)
	}()
	defer func() { cancel(); <-stopped }()
	loops := func(r trigger.Reason) float64 {
		return testutil.ToFloat64(e.a.metrics.Loops.WithLabelValues(r.String()))
	}
	want := map[trigger.Reason]float64{}
	await := func(r trigger.Reason) {
		t.Helper()
		want[r]++
		// Real time, generous: a loop takes milliseconds, but a loaded
		// machine running -race may hold the goroutine for seconds.
		deadline := time.Now().Add(time.Minute)
		for loops(r) < want[r] {
			if time.Now().After(deadline) {
				t.Fatalf("no loop woken by %v: loops_total %v", r, map[string]float64{
					"periodic": loops(trigger.Periodic), "pods": loops(trigger.Pods), "config": loops(trigger.Config),
					"cloud-failure": loops(trigger.CloudFailure), "node-ready": loops(trigger.NodeReady)})
			}
			time.Sleep(time.Millisecond)
		}
		for _, x := range trigger.Reasons() {
			if got := loops(x); got != want[x] {
				t.Fatalf("after the %v loop, loops_total{%v} = %v, want %v", r, x, got, want[x])
			}
		}
	}
	// The first loop: both groups refuse, one per pass; each failure
	// wakes, and the wakes make one loop after the minimum gap.
	await(trigger.Periodic)
	e.clock.Step(time.Second)
	await(trigger.CloudFailure)
	// A reload: its loop puts the new scan interval in force.
	o := e.a.Options()
	o.ScanInterval = time.Minute
	if err := e.a.Reconfigure(o); err != nil {
		t.Fatal(err)
	}
	e.a.Wake(trigger.Config)
	e.clock.Step(time.Second)
	await(trigger.Config)
	// A pod turns unschedulable: a loop once the batch is quiet.
	e.a.PodHandler().OnUpdate(to.Pod("late"), to.Pod("late", to.Unschedulable()))
	e.clock.Step(time.Second)
	await(trigger.Pods)
	// The floor is the new interval, from the last loop's start.
	e.clock.Step(time.Minute)
	await(trigger.Periodic)
}
