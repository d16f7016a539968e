package core

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// TestClusterUnreadyGuard: with most of the cluster's nodes unready (kwok
// or the kubelets stopped heartbeating: an etcd or network incident),
// nothing is deleted or cordoned — not the empty nodes, not a node that
// failed preflight, not a machine that never registered — and scale-up goes
// on; once the nodes are back, all of it resumes.
func TestClusterUnreadyGuard(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime, o.ScaleDownUnreadyTime = time.Minute, time.Minute
		o.MaxNodeStartupTime, o.MaxNodeProvisionTime = time.Minute, 5*time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	cpu := e.provider.AddGroup("cpu", 0, 20, cpuTemplate("cpu"), inmemory.WithTarget(6))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.register(cpu, to.NotReady(), to.NodeCreatedAt(e.clock.Now().Add(-time.Hour)))
	e.register(gpu, failedPreflight("7 GPUs, want 8"))
	e.add(pendingPods(1, "train", wholeGPU()...))
	if err := cpu.IncreaseSize(e.ctx, 1); err != nil { // a machine that will never register
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ { // 16 minutes: past every unneeded, unready and provision time
		e.run()
		e.register(gpu) // the pod's new node joins
		e.clock.Step(2 * time.Minute)
	}
	if got := append(cpu.Deleted(), gpu.Deleted()...); len(got) != 0 {
		t.Fatalf("deleted %v while 6 of 8 nodes were unready", got)
	}
	if len(acts.cordoned) != 0 {
		t.Fatalf("cordoned %v while the cluster was unhealthy", acts.cordoned)
	}
	if got := gpu.Increases(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("gpu increases %v, want the pending pod's node: scale-up goes on", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.ClusterUnhealthy); got != 1 {
		t.Fatalf("cluster_unhealthy %v, want 1", got)
	}
	if len(e.events(EventClusterUnhealthy)) != 1 {
		t.Fatal("want one ClusterUnhealthy event, on the transition")
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "clusterUnhealthy: 7 of 9 managed nodes unready") {
		t.Fatalf("status does not say why:\n%s", last)
	}
	// The incident ends: the nodes are Ready again.
	for _, n := range e.nodeNames() {
		e.updateNode(n, func(n *apiv1.Node) {
			n.Status.Conditions = []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionTrue}}
		})
	}
	e.run()
	e.a.WaitForDrains()
	e.run()
	if got := testutil.ToFloat64(e.a.metrics.ClusterUnhealthy); got != 0 {
		t.Fatalf("cluster_unhealthy %v after recovery", got)
	}
	if len(acts.cordoned) != 1 || len(gpu.Deleted()) != 1 {
		t.Fatalf("cordoned %v, gpu deleted %v: the failed node is replaced once the cluster is healthy", acts.cordoned, gpu.Deleted())
	}
	if len(cpu.Deleted()) == 0 {
		t.Fatal("nothing of cpu deleted after recovery: the never-registered machine and the empty nodes go")
	}
	if len(e.events(EventClusterHealthy)) != 1 {
		t.Fatal("want one ClusterHealthy event")
	}
}

// TestGangLargerThanTheInFlightCapScales: a 400-node job with the default
// cap of 300 nodes in flight waits while other nodes are in flight, says
// why, then goes whole.
func TestGangLargerThanTheInFlightCapScales(t *testing.T) {
	e := newEnv(t, withGangs(mins{"train": 400}), withOptions(func(o *Options) { o.NodeAdditionAdaptive = false }))
	gpu := e.provider.AddGroup("gpu", 0, 1000, gpuTemplate("gpu"))
	cpu := e.provider.AddGroup("cpu", 0, 100, cpuTemplate("cpu"))
	e.start()
	e.add(pendingPods(5, "web", to.Requests("12", "8Gi")))
	e.run() // 5 cpu nodes in flight
	if got := sum(cpu.Increases()); got != 5 {
		t.Fatalf("cpu increases %v, want 5", cpu.Increases())
	}
	e.add(gangMembers(400, "train"))
	e.clock.Step(time.Minute)
	e.run()
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("gpu increases %v with 5 nodes in flight: the 400-node gang must wait for an empty queue", got)
	}
	if evs := e.events(EventScaleUpQueued); len(evs) == 0 || !strings.Contains(evs[0], "gang default/train waits for its 400 nodes") {
		t.Fatalf("events %v, want ScaleUpQueued saying the gang waits whole and why", evs)
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "heldGangs:") {
		t.Fatalf("status does not list the held gang:\n%s", last)
	}
	e.register(cpu) // the cpu nodes are up: nothing in flight
	e.clock.Step(time.Minute)
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 400 {
		t.Fatalf("gpu increases %v, want the whole gang of 400 at once", got)
	}
}

// TestFencedReplicaWritesNothing: a replica whose lease is stale runs no
// loop; one whose fence closes in the middle of a loop sends no write, and
// the group is not backed off for it.
func TestFencedReplicaWritesNothing(t *testing.T) {
	var closed atomic.Bool
	e := newEnv(t)
	e.fence = func() error {
		if closed.Load() {
			return errors.New("lease not renewed within the renew deadline")
		}
		return nil
	}
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(2, "train", wholeGPU()...))
	closed.Store(true)
	if err := e.a.RunOnce(e.ctx); err == nil || !strings.Contains(err.Error(), "not acting") {
		t.Fatalf("RunOnce = %v, want a refusal to act", err)
	}
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("increases %v by a fenced replica", got)
	}
	// The fence closes between the loop's start and its write.
	closed.Store(false)
	e.a.fence = nil
	e.a.provider = cloudprovider.WithFence(e.provider, func() error { return errors.New("stalled past the lease") })
	e.run()
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("increases %v through a closed fence", got)
	}
	if gs := e.a.registry.Group("gpu"); gs.Backoff.Active {
		t.Fatal("group backed off for a fenced write: the group is fine")
	}
}

// TestFenceClosedMidLoopWritesNoStatusOrBalloons: the fence closes after
// the loop started (the leader stalled past its lease meanwhile): neither
// the balloon Deployments nor the status ConfigMap are written, and the
// refusals are counted.
func TestFenceClosedMidLoopWritesNoStatusOrBalloons(t *testing.T) {
	calls := 0
	rec := &recordingBalloons{}
	e := newEnv(t, withOptions(func(o *Options) { o.WarmPools = map[string]balloon.Policy{"gpu": {Fixed: 1}} }))
	e.balloons = rec
	e.fence = func() error {
		calls++
		if calls > 1 { // open when the loop starts, closed from then on
			return errors.New("lease not renewed within the renew deadline")
		}
		return nil
	}
	e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.run()
	if len(rec.specs) != 0 || len(e.status.writes) != 0 {
		t.Fatalf("%d balloon syncs and %d status writes through a closed fence", len(rec.specs), len(e.status.writes))
	}
	for _, action := range []string{"balloons", "status"} {
		if got := testutil.ToFloat64(e.a.metrics.GateRefused.WithLabelValues("fence", action)); got != 1 {
			t.Errorf("gate_refused_writes_total{fence,%s} = %v, want 1", action, got)
		}
	}
}

// TestDeleteThatFailsLaterIsTakenBack: the cloud accepts a deletion and
// its operation then fails; the machine is listed alive again. Its node is
// untainted, the failure counted and evented, and it is removed again
// after --scale-down-delay-after-failure, once the cloud deletes it.
func TestDeleteThatFailsLaterIsTakenBack(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownDelayAfterFailure = 3 * time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	cpu := e.provider.AddGroup("cpu", 0, 10, cpuTemplate("cpu"), inmemory.WithTarget(1))
	e.start()
	e.register(cpu)
	node := e.nodeNames()[0]
	cpu.SetLostDeletes(true)
	e.run()
	e.clock.Step(2 * time.Minute)
	e.run() // deleted: accepted, then lost
	if !e.a.scaleDown.actuator.IsGone(node) {
		t.Fatal("the node is not recorded as removed")
	}
	e.clock.Step(10 * time.Second)
	e.run() // the machine is listed alive: taken back
	if e.a.scaleDown.actuator.IsGone(node) {
		t.Fatal("a machine listed alive after its deletion is still counted gone: its node would stay tainted forever")
	}
	for _, k := range acts.taintsOf(node) {
		if k == scaledown.ToBeDeletedTaint {
			t.Fatalf("taints %v: the to-be-deleted taint stayed on a node whose deletion failed", acts.taintsOf(node))
		}
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedScaleDowns.WithLabelValues("cpu", "delete")); got != 1 {
		t.Fatalf("failed_scale_downs_total{delete} = %v, want 1", got)
	}
	if len(e.events(EventScaleDownFailed)) != 1 {
		t.Fatal("no ScaleDownFailed event")
	}
	cpu.SetLostDeletes(false)
	e.clock.Step(time.Minute)
	e.run()
	if len(cpu.Deleted()) != 0 {
		t.Fatal("removed again within the delay after the failure")
	}
	// Held, the node's unneeded time started again: it must be unneeded
	// for the whole of it once scale-down may act.
	e.clock.Step(3 * time.Minute)
	e.run()
	if got := cpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v the moment scale-down resumed, before a new unneeded time", got)
	}
	e.clock.Step(2 * time.Minute)
	e.run()
	if got := cpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v after the delay and a new unneeded time, want the empty node", got)
	}
}

// TestReplacementRespectsPodDisruptionBudgets: a node failed by the
// periodic agent runs a pod whose budget refuses its eviction: the node
// stays cordoned, past the termination cap, and goes once the pod can.
func TestReplacementRespectsPodDisruptionBudgets(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) { o.MaxGracefulTerminationSec = 60 }))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.register(gpu, func(n *apiv1.Node) { n.Labels[preflight.DefaultLabel] = preflight.ValueFailed })
	node := e.nodeNames()[0]
	e.add(to.Pod("worker", append(wholeGPU(), to.OnNode(node), to.ControlledBy("ReplicaSet", "w", "rs-w"))...))
	acts.setRefuse(true)
	for i := 0; i < 5; i++ { // 10 minutes, far past the 60 s cap
		e.run()
		e.clock.Step(2 * time.Minute)
	}
	if got := gpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v while the pod's budget refused its eviction", got)
	}
	if len(acts.cordoned) == 0 || acts.cordoned[0] != node {
		t.Fatalf("cordoned %v, want the failed node", acts.cordoned)
	}
	acts.setRefuse(false)
	e.run() // evicted
	e.run() // gone from the cache: the machine goes
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v once the pod could go, want the node", got)
	}
}

// TestReplacementBrake: 30 nodes of a 100-node cluster fail their periodic
// check at once (the chart's DNS check, in a DNS outage): at most 10 are
// replaced per window (the default 2% of the cluster, or 10), with an
// event, the metric and the status; the rest wait, cordoned, and go in the
// next windows.
func TestReplacementBrake(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), actOnFailuresAtOnce(), withOptions(func(o *Options) {
		o.PreflightFailuresBeforeBackoff = 0
		o.PreflightIncidentMinNodes = 1000 // the brake is the subject: no incident
	}))
	gpu := e.provider.AddGroup("gpu", 0, 200, gpuTemplate("gpu"), inmemory.WithTarget(70))
	bad := e.provider.AddGroup("bad", 0, 200, gpuTemplate("bad"), inmemory.WithTarget(30))
	e.start()
	e.register(gpu)
	e.register(bad, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValueFailed
		n.Annotations = map[string]string{preflight.DefaultFailureAnnotation: "dns: lookup kubernetes.default failed"}
	})
	for i, n := range e.loopView().nodesOf["bad"] {
		e.add(to.Pod(fmt.Sprintf("worker-%d", i), append(wholeGPU(), to.OnNode(n.Name), to.ControlledBy("ReplicaSet", "w", "rs-w"))...))
	}
	e.run()
	if got := len(acts.evicted); got != 10 {
		t.Fatalf("evicted %d pods of the 30 failed nodes, want the brake's 10: past the budget a node is only cordoned", got)
	}
	e.run() // the admitted nodes' pods are gone: their machines go
	if got := len(bad.Deleted()); got != 10 {
		t.Fatalf("deleted %d of 30, want the brake's 10", got)
	}
	cordoned := map[string]bool{}
	for _, n := range acts.cordoned {
		cordoned[n] = true
	}
	if len(cordoned) != 30 {
		t.Fatalf("cordoned %d nodes, want all 30 failed nodes", len(cordoned))
	}
	if got := testutil.ToFloat64(e.a.metrics.ReplacementBrakeEngaged); got != 1 {
		t.Fatalf("replacement_brake_engaged %v, want 1", got)
	}
	if evs := e.events(EventReplacementBrake); len(evs) != 1 {
		t.Fatalf("events %v, want one ReplacementBrake", evs)
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "replacementsHeld: 20") {
		t.Fatalf("status does not count the held deletions:\n%s", last)
	}
	e.clock.Step(5 * time.Minute)
	e.run()
	if got := len(bad.Deleted()); got != 10 {
		t.Fatalf("deleted %d within the window, want still 10", got)
	}
	e.clock.Step(6 * time.Minute)
	e.run() // 10 more admitted, their pods evicted
	e.run() // and their machines deleted
	if got := len(bad.Deleted()); got != 20 {
		t.Fatalf("deleted %d in the second window, want 20", got)
	}
}

// TestNodesPendingPodsFitOnAreKept: a usable node is empty only because the
// scheduler has not placed the pods waiting for it yet (a gang waiting for
// all its members, a pod in backoff): it is no scale-down candidate.
func TestNodesPendingPodsFitOnAreKept(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownDelayAfterAdd = 0
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(3))
	e.start()
	e.register(gpu)
	e.add(pendingPods(2, "train", wholeGPU()...))
	for i := 0; i < 5; i++ {
		e.run()
		e.clock.Step(time.Minute)
	}
	e.a.WaitForDrains()
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v, want only the node no pending pod fits on (2 of the 3 wait for the training pods)", got)
	}
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: the pods fit on the nodes there", got)
	}
}

// TestDrainStopsWhenTheClusterTurnsUnhealthy: a drain that started while
// the cluster was healthy evicts nothing more once most nodes go unready
// (the gate's hold covers the drains between loops, not only the phases):
// it ends at once, its node is untainted, and nothing is deleted.
func TestDrainStopsWhenTheClusterTurnsUnhealthy(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownUnreadyTime = time.Hour
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
		o.MaxGracefulTerminationSec = 600
	}))
	cpu := e.provider.AddGroup("cpu", 1, 10, cpuTemplate("cpu"), inmemory.WithTarget(6))
	e.start()
	e.register(cpu, to.NodeCreatedAt(e.clock.Now().Add(-time.Hour)))
	names := e.nodeNames()
	sort.Strings(names)
	drained := names[0]
	e.add(to.Pod("web", to.Requests("1", "1Gi"), to.OnNode(drained), to.ControlledBy("ReplicaSet", "web", "rs-web")))
	for i, n := range names[1:] {
		e.add(to.Pod(fmt.Sprintf("db-%d", i), to.Requests("12", "10Gi"), to.OnNode(n), to.ControlledBy("ReplicaSet", "db", "rs-db")))
	}
	acts.setRefuse(true) // a PodDisruptionBudget says not yet
	e.run()
	e.clock.Step(2 * time.Minute)
	e.run()
	if !e.a.scaleDown.actuator.IsDraining(drained) {
		t.Fatalf("node %s is not being drained", drained)
	}
	waitForClockWaiter(t, e)
	// An incident: 5 of 6 nodes stop heartbeating.
	for _, n := range names[1:] {
		e.updateNode(n, func(n *apiv1.Node) {
			n.Status.Conditions = []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionUnknown}}
		})
	}
	e.run()
	if e.a.gate.Held() == "" {
		t.Fatal("the gate does not hold with 5 of 6 nodes unready")
	}
	acts.setRefuse(false) // the budget would now allow it: only the gate stands in the way
	deadline := time.Now().Add(30 * time.Second)
	for e.a.scaleDown.actuator.IsDraining(drained) {
		if time.Now().After(deadline) {
			t.Fatal("the drain goes on while the cluster is unhealthy")
		}
		if e.clock.HasWaiters() {
			e.clock.Step(5 * time.Second)
		}
		runtime.Gosched()
	}
	for _, p := range acts.evictedPods() {
		if p == "web" {
			t.Fatal("pod web evicted by a drain while the cluster was unhealthy")
		}
	}
	for _, k := range acts.taintsOf(drained) {
		if k == scaledown.ToBeDeletedTaint {
			t.Fatalf("node %s keeps its to-be-deleted taint after its drain stopped", drained)
		}
	}
	e.run()
	if got := cpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v while the cluster was unhealthy", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.GateRefused.WithLabelValues("hold", "evict")); got < 1 {
		t.Fatalf("gate_refused_writes_total{hold,evict} = %v, want the drain's refused eviction", got)
	}
}

// waitForClockWaiter polls until a goroutine (a drain) waits on the fake clock.
func waitForClockWaiter(t *testing.T, e *env) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !e.clock.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the drain never waited for its retry")
		}
		runtime.Gosched()
	}
}
