package core

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// pendingPreflight is how nodes join: tainted and labelled pending.
func pendingPreflight() to.NodeOption {
	return func(n *apiv1.Node) {
		to.Taint(preflight.DefaultTaintKey, preflight.ValuePending)(n)
		n.Labels[preflight.DefaultLabel] = preflight.ValuePending
	}
}

// failedPreflight is what the agent leaves on a node that failed.
func failedPreflight(why string) to.NodeOption {
	return func(n *apiv1.Node) {
		pendingPreflight()(n)
		n.Labels[preflight.DefaultLabel] = preflight.ValueFailed
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[preflight.DefaultFailureAnnotation] = why
	}
}

// passPreflight is the agent lifting the taint on every node of the env.
func (e *env) passPreflight() {
	e.t.Helper()
	for _, o := range e.nodes.List() {
		n := o.(*apiv1.Node).DeepCopy()
		var ts []apiv1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != preflight.DefaultTaintKey {
				ts = append(ts, t)
			}
		}
		n.Spec.Taints = ts
		n.Labels[preflight.DefaultLabel] = preflight.ValuePassed
		if err := e.nodes.Update(n); err != nil {
			e.t.Fatal(err)
		}
	}
}

func TestPreflightPendingNodesAreComingCapacity(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.MaxNodeStartupTime = 5 * time.Minute // shorter than preflight: pending must never turn unready
	}))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(4))
	e.start()
	e.register(gpu, pendingPreflight())
	e.add(pendingPods(4, "train", wholeGPU()...))
	for i := 0; i < 5; i++ { // 10 minutes of loops, past the startup time and the unneeded time
		e.run()
		e.clock.Step(2 * time.Minute)
	}
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: pods waiting for nodes in preflight triggered another scale-up", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.PodsAwaitingNodes); got != 4 {
		t.Fatalf("pods awaiting upcoming nodes %v, want 4", got)
	}
	if got := gpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v: a node pending preflight is never a scale-down candidate", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.Nodes.WithLabelValues("gpu", "unready")); got != 0 {
		t.Fatalf("unready nodes %v: preflight must not count as unready", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.PreflightPending.WithLabelValues("gpu")); got != 4 {
		t.Fatalf("preflight_pending_nodes %v, want 4", got)
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "preflightPending: 4") {
		t.Fatalf("status lacks the pending nodes:\n%s", last)
	}
	e.passPreflight()
	e.run()
	if got := testutil.CollectAndCount(e.a.metrics.PreflightDuration); got != 1 {
		t.Fatalf("preflight_duration_seconds series %d, want 1", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.PreflightResults.WithLabelValues("gpu", "passed")); got != 4 {
		t.Fatalf("passed results %v, want 4", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.Nodes.WithLabelValues("gpu", "ready")); got != 4 {
		t.Fatalf("ready nodes %v after passing, want 4", got)
	}
}

// TestPreflightFailedNodeIsReplacedAtOnce: a failed node is not capacity,
// so its replacement is bought in the loop that sees the failure; the
// failed node itself is left alone until its failure has stood
// --preflight-failure-settle (the first report of an outage looks like a
// bad machine), then cordoned and its machine deleted, once.
func TestPreflightFailedNodeIsReplacedAtOnce(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts))
	settle := e.opts.PreflightFailureSettle
	if settle <= 0 {
		t.Fatalf("default --preflight-failure-settle %s, want positive", settle)
	}
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.register(gpu, failedPreflight("check gpus: 7 lines matched, want 8"))
	e.add(pendingPods(1, "train", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("increases %v, want the replacement [1] in the same loop", got)
	}
	if len(acts.cordoned) != 0 || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %v, deleted %v before the failure settled, want nothing", acts.cordoned, gpu.Deleted())
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "preflightFailuresSettling: 1") {
		t.Fatalf("status does not count the settling failure:\n%s", last)
	}
	e.clock.Step(settle - time.Second)
	e.run()
	if len(acts.cordoned) != 0 || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %v, deleted %v a second before the failure settled", acts.cordoned, gpu.Deleted())
	}
	e.clock.Step(time.Second)
	e.run()
	if len(acts.cordoned) != 1 {
		t.Fatalf("cordoned %v, want the failed node", acts.cordoned)
	}
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v, want the failed node's machine", got)
	}
	if got := gpu.Increases(); len(got) != 1 {
		t.Fatalf("increases %v, want the one replacement only", got)
	}
	if evs := e.events(EventPreflightFailed); len(evs) != 1 || !strings.Contains(evs[0], "7 lines matched") {
		t.Fatalf("PreflightFailed events %v", evs)
	}
	if got := testutil.ToFloat64(e.a.metrics.PreflightResults.WithLabelValues("gpu", "failed")); got != 1 {
		t.Fatalf("failed results %v", got)
	}
	e.run() // the Node object lingers: not deleted or counted again
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v, want one deletion", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.PreflightResults.WithLabelValues("gpu", "failed")); got != 1 {
		t.Fatalf("failed results %v after a second loop, want still 1", got)
	}
}

func TestPreflightTimeoutIsAFailure(t *testing.T) {
	e := newEnv(t, withScaleDown(&fakeActions{}), actOnFailuresAtOnce(), withOptions(func(o *Options) { o.Preflight.MaxPreflightTime = 10 * time.Minute }))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(2))
	e.start()
	e.register(gpu, pendingPreflight())
	e.run()
	if got := gpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v within the preflight time", got)
	}
	e.clock.Step(11 * time.Minute)
	e.run()
	if got := gpu.Deleted(); len(got) != 2 {
		t.Fatalf("deleted %v, want both nodes past --max-preflight-time", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.PreflightResults.WithLabelValues("gpu", "timeout")); got != 2 {
		t.Fatalf("timeout results %v, want 2", got)
	}
}

func TestPreflightFailuresBackTheGroupOff(t *testing.T) {
	e := newEnv(t, withScaleDown(&fakeActions{}), withOptions(func(o *Options) {
		o.PreflightFailuresBeforeBackoff = 3
		o.Expanders = []string{"priority"}
	}))
	bad := e.provider.AddGroup("gpu-a", 0, 20, gpuTemplate("gpu-a"), inmemory.WithTarget(3))
	good := e.provider.AddGroup("gpu-b", 0, 20, gpuTemplate("gpu-b"))
	e.start()
	e.register(bad, failedPreflight("dcgmi diag: fail"))
	e.add(pendingPods(3, "train", wholeGPU()...))
	e.run()
	if got := bad.Increases(); len(got) != 0 {
		t.Fatalf("gpu-a increases %v: a group backed off for preflight failures must not grow", got)
	}
	if got := good.Increases(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("gpu-b increases %v, want [3]: the other group keeps scaling", got)
	}
	if evs := e.events(EventPreflightFailures); len(evs) != 1 || !strings.Contains(evs[0], "3 nodes failed preflight") {
		t.Fatalf("PreflightFailures events %v", evs)
	}
	if got := testutil.ToFloat64(e.a.metrics.Backoff.WithLabelValues("gpu-a")); got != 1 {
		t.Fatalf("gpu-a backoff %v, want 1", got)
	}
}

func TestPreflightFailedNodeWithPodsIsDrainedFirst(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), actOnFailuresAtOnce())
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	// A periodic re-run failed a node that runs work: no taint, label failed.
	e.register(gpu, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValueFailed
	})
	node := e.nodes.List()[0].(*apiv1.Node).Name
	e.add(to.Pod("worker", append(wholeGPU(), to.OnNode(node), to.ControlledBy("ReplicaSet", "w", "rs-w"))...))
	e.run()
	if len(acts.evicted) != 1 || acts.evicted[0] != "worker" {
		t.Fatalf("evicted %v, want [worker]", acts.evicted)
	}
	e.run() // the eviction removed the pod from the cache: now the machine goes
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v after the drain, want the failed node", got)
	}
}
