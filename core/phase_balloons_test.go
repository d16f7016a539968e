package core

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// balloonPod is a whole-node GPU placeholder of group g, as the balloon
// controller makes it: in the balloon namespace, with the managed-by label
// and the balloon PriorityClass.
func balloonPod(name, g string, opts ...to.PodOption) *apiv1.Pod {
	bo := balloon.DefaultOptions()
	o := append([]to.PodOption{to.Labels(bo.Label, g, bo.ManagedByLabel, bo.ManagedByValue), to.Namespace(bo.Namespace),
		func(p *apiv1.Pod) {
			p.Spec.PriorityClassName, p.Spec.Priority = bo.PriorityClassName, new(bo.PriorityValue)
		},
		to.ControlledBy("ReplicaSet", "balloon-"+g, types.UID("rs-balloon-"+g))}, wholeGPU()...)
	return to.Pod(name, append(o, opts...)...)
}

// nodeNames lists the env's node names.
func (e *env) nodeNames() []string {
	var out []string
	for _, o := range e.nodes.List() {
		out = append(out, o.(*apiv1.Node).Name)
	}
	return out
}

func TestRealPodsTakeBalloonRoomWithoutAScaleUp(t *testing.T) {
	never := apiv1.PreemptNever
	low := int32(-200)
	for _, tc := range []struct {
		name      string
		aware     bool
		pod       to.PodOption
		wantNodes int
	}{
		{"balloon-aware: the scheduler preempts the balloons, no node bought", true, nil, 0},
		{"control, awareness off: balloons count as real work", false, nil, 2},
		{"pods that may not preempt get no balloon room", true, func(p *apiv1.Pod) { p.Spec.PreemptionPolicy = &never }, 2},
		{"pods below the balloons' priority get no balloon room", true, func(p *apiv1.Pod) { p.Spec.Priority = &low }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withOptions(func(o *Options) { o.BalloonAware = tc.aware }))
			gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(2))
			e.start()
			e.register(gpu)
			for i, n := range e.nodeNames() {
				e.add(balloonPod("balloon-"+string(rune('a'+i)), "gpu", to.OnNode(n)))
			}
			opts := wholeGPU()
			if tc.pod != nil {
				opts = append(opts, tc.pod)
			}
			e.add(pendingPods(2, "train", opts...))
			e.run()
			if got := sum(gpu.Increases()); got != tc.wantNodes {
				t.Fatalf("nodes requested %d (%v), want %d", got, gpu.Increases(), tc.wantNodes)
			}
		})
	}
}

// TestLookalikeBalloonsAreNotFreeRoom: a pod is a balloon only in the
// balloon namespace, with the managed-by label and the balloon
// PriorityClass. A tenant that labels its own pods like balloons does not
// get their room counted as free: the scheduler would not preempt a pod of
// priority 0 for the pending pods, so they get nodes.
func TestLookalikeBalloonsAreNotFreeRoom(t *testing.T) {
	bo := balloon.DefaultOptions()
	tenant := func(p *apiv1.Pod) { p.Namespace = "team-a" }
	priority0 := func(p *apiv1.Pod) { p.Spec.PriorityClassName, p.Spec.Priority = "", new(int32(0)) }
	for _, tc := range []struct {
		name      string
		pod       []to.PodOption
		wantNodes int
	}{
		{"real balloons: their room is free", nil, 0},
		{"tenant pods labelled as balloons, priority 0", []to.PodOption{tenant, priority0}, 2},
		{"tenant pods labelled as balloons, with the balloon PriorityClass", []to.PodOption{tenant}, 2},
		{"in the balloon namespace without the PriorityClass", []to.PodOption{priority0}, 2},
		{"in the balloon namespace without the managed-by label", []to.PodOption{func(p *apiv1.Pod) { delete(p.Labels, bo.ManagedByLabel) }}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(2))
			e.start()
			e.register(gpu)
			for i, n := range e.nodeNames() {
				e.add(balloonPod("balloon-"+string(rune('a'+i)), "gpu", append([]to.PodOption{to.OnNode(n)}, tc.pod...)...))
			}
			e.add(pendingPods(2, "train", wholeGPU()...))
			e.run()
			if got := sum(gpu.Increases()); got != tc.wantNodes {
				t.Fatalf("nodes requested %d (%v), want %d", got, gpu.Increases(), tc.wantNodes)
			}
		})
	}
}

func TestDisplacedBalloonsComeBackAtTheLowestClass(t *testing.T) {
	e := newEnv(t, smoothing(60, 2, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"))
	e.start()
	// Two real pods and two displaced balloons wait; the bucket holds 2.
	e.add(pendingPods(2, "train", wholeGPU()...))
	e.add(balloonPod("balloon-a", "gpu", to.Unschedulable()), balloonPod("balloon-b", "gpu", to.Unschedulable()))
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("increases %v, want [2]", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.NodesReleased.WithLabelValues("gpu", "workload")); got != 2 {
		t.Fatalf("workload nodes released %v, want 2: real work goes first", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.QueueDepth.WithLabelValues("gpu", "balloon")); got != 2 {
		t.Fatalf("balloon nodes queued %v, want 2", got)
	}
	e.clock.Step(e.writeGap()) // past the pace of the group's writes: tokens for both
	e.run()
	if got := testutil.ToFloat64(e.a.metrics.NodesReleased.WithLabelValues("gpu", "balloon")); got != 2 {
		t.Fatalf("balloon nodes released %v, want 2", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.UnschedulablePods); got != 2 {
		t.Fatalf("unschedulable_pods %v, want 2 (balloons are reported apart)", got)
	}
}

// scaleDownAfter runs a loop, lets d pass, runs the loop that removes,
// waits for its drains and runs the loop that deletes the drained nodes.
func (e *env) scaleDownAfter(d time.Duration) {
	e.t.Helper()
	e.run()
	e.clock.Step(d)
	e.run()
	e.a.WaitForDrains()
	e.run()
}

func TestScaleDownKeepsWarmNodes(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(3))
	e.start()
	e.register(gpu)
	names := e.nodeNames()
	// Two nodes hold balloons (utilisation 0: balloons are free room), one
	// is empty.
	e.add(balloonPod("balloon-a", "gpu", to.OnNode(names[0])), balloonPod("balloon-b", "gpu", to.OnNode(names[1])))
	e.scaleDownAfter(2 * time.Minute)
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v, want only the empty node: a balloon that cannot move is warm capacity", got)
	}
	if len(acts.evicted) != 0 {
		t.Fatalf("evicted %v: balloons were displaced by scale-down", acts.evicted)
	}
	// The warm target is lowered: the ReplicaSet deletes a balloon, and
	// its node goes after the unneeded time.
	if err := e.pods.Delete(balloonPod("balloon-b", "gpu", to.OnNode(names[1]))); err != nil {
		t.Fatal(err)
	}
	e.scaleDownAfter(2 * time.Minute)
	if got := gpu.Deleted(); len(got) != 2 {
		t.Fatalf("deleted %v, want the surplus warm node too", got)
	}
}

type recordingBalloons struct{ specs [][]balloon.GroupSpec }

func (r *recordingBalloons) Sync(_ context.Context, specs []balloon.GroupSpec) (balloon.Result, error) {
	r.specs = append(r.specs, specs)
	return balloon.Result{}, nil
}

func TestWarmPoolSpecs(t *testing.T) {
	rec := &recordingBalloons{}
	e := newEnv(t, withOptions(func(o *Options) {
		o.WarmPools = map[string]balloon.Policy{"gpu": {Fixed: 3}}
	}))
	e.balloons = rec
	tmpl := gpuTemplate("gpu")
	to.Taint("openai.com/team", "rl")(tmpl)
	to.Taint(preflight.DefaultTaintKey, preflight.ValuePending)(tmpl)
	e.provider.AddGroup("gpu", 0, 20, tmpl, inmemory.WithTarget(1))
	e.provider.AddGroup("cpu", 0, 20, cpuTemplate("cpu"))
	e.start()
	e.run()
	if len(rec.specs) != 1 || len(rec.specs[0]) != 1 {
		t.Fatalf("specs %+v, want one group", rec.specs)
	}
	s := rec.specs[0][0]
	if s.Group != "gpu" || s.Replicas != 3 {
		t.Fatalf("spec %+v, want 3 replicas for gpu", s)
	}
	if q := s.Requests[to.GPU]; q.Value() != 8 {
		t.Fatalf("GPU request %v, want the whole node's 8", q.String())
	}
	if len(s.Tolerations) != 1 || s.Tolerations[0].Key != "openai.com/team" {
		t.Fatalf("tolerations %+v, want the team taint only (never preflight)", s.Tolerations)
	}
	if got := testutil.ToFloat64(e.a.metrics.WarmTarget.WithLabelValues("gpu")); got != 3 {
		t.Fatalf("warm_pool_target_nodes %v", got)
	}
}

// TestWarmPoolCutToBalloonMaxReplicas (#40): a warm pool above
// --balloon-max-replicas asks for that many balloons, which the chart's
// admission policy admits (before, the Deployment was refused and the
// balloons phase failed every loop).
func TestWarmPoolCutToBalloonMaxReplicas(t *testing.T) {
	rec := &recordingBalloons{}
	e := newEnv(t, withOptions(func(o *Options) {
		o.WarmPools = map[string]balloon.Policy{"gpu": {Fixed: 5}}
		o.Balloons.MaxReplicas = 2
	}))
	e.balloons = rec
	e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.run()
	if len(rec.specs) != 1 || len(rec.specs[0]) != 1 || rec.specs[0][0].Replicas != 2 {
		t.Fatalf("specs %+v, want 2 balloons (cut from 5)", rec.specs)
	}
}
