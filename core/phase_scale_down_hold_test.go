package core

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// TestQueuedDemandDoesNotHoldScaleDown: GPU demand that the node-addition
// queue only queues (the in-flight cap is full) asks the cloud for
// nothing; an empty CPU node is removed after its unneeded time as if
// there were no demand, as cluster-autoscaler holds scale-down only in a
// loop that scaled up.
func TestQueuedDemandDoesNotHoldScaleDown(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), smoothing(600, 100, 2), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	cpu := e.provider.AddGroup("cpu", 0, 10, cpuTemplate("cpu"), inmemory.WithTarget(1))
	e.start()
	e.register(cpu)
	e.add(pendingPods(10, "train", wholeGPU()...))
	e.run() // 2 requested, 8 queued behind the in-flight cap
	if got := gpu.Increases(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("increases %v, want [2] under the in-flight cap", got)
	}
	for range 8 {
		e.clock.Step(15 * time.Second)
		e.run()
	}
	if got := gpu.Increases(); len(got) != 1 {
		t.Fatalf("increases %v: the cap should still hold the rest", got)
	}
	if got := cpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v after 2 minutes of queued demand, want the empty CPU node", got)
	}
}

// TestScaleDownHeldOrDisabledKeepsCleaningUp: while scale-down is held (a
// scale-up this loop) or disabled live, drained nodes are still deleted,
// stale ToBeDeleted taints still removed, and unneeded times start again:
// nothing goes the moment scale-down resumes.
func TestScaleDownHeldOrDisabledKeepsCleaningUp(t *testing.T) {
	t.Run("disabled live: a drained node is still deleted", func(t *testing.T) {
		acts := &fakeActions{}
		e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
			o.ScaleDownUnneededTime = time.Minute
			o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
		}))
		cpu := e.provider.AddGroup("cpu", 0, 10, cpuTemplate("cpu"), inmemory.WithTarget(3))
		e.start()
		e.register(cpu)
		busyNode := nodeName(cpu, 2)
		e.add(to.Pod("small", to.Requests("1", "1Gi"), to.OnNode(nodeName(cpu, 0)), to.ControlledBy("ReplicaSet", "web", "rs-web")))
		e.add(to.Pod("busy", to.Requests("12", "10Gi"), to.OnNode(busyNode), to.ControlledBy("ReplicaSet", "db", "rs-db")))
		e.run()
		e.clock.Step(2 * time.Minute)
		e.run() // the empty node deleted, the small one's drain started
		e.a.WaitForDrains()
		if got := len(cpu.Deleted()); got != 1 {
			t.Fatalf("%d deleted, want the empty node", got)
		}
		o := e.opts
		o.ScaleDownEnabled = false
		if err := e.a.Reconfigure(o); err != nil {
			t.Fatal(err)
		}
		e.clock.Step(time.Second)
		e.run()
		if got := len(cpu.Deleted()); got != 2 {
			t.Fatalf("%d deleted: the drained node must be deleted though scale-down was disabled since", got)
		}
	})
	t.Run("disabled and enabled again: a new unneeded time", func(t *testing.T) {
		acts := &fakeActions{}
		e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
			o.ScaleDownUnneededTime = time.Minute
			o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
		}))
		cpu := e.provider.AddGroup("cpu", 0, 10, cpuTemplate("cpu"), inmemory.WithTarget(1))
		e.start()
		e.register(cpu)
		e.run() // the empty node is unneeded from now
		e.clock.Step(30 * time.Second)
		o := e.opts
		o.ScaleDownEnabled = false
		must(t, e.a.Reconfigure(o))
		e.run()
		e.clock.Step(10 * time.Minute)
		e.run()
		o.ScaleDownEnabled = true
		must(t, e.a.Reconfigure(o))
		e.run()
		if got := len(cpu.Deleted()); got != 0 {
			t.Fatalf("%d deleted the moment scale-down was enabled again, want a new unneeded time first", got)
		}
		e.clock.Step(2 * time.Minute)
		e.run()
		if got := len(cpu.Deleted()); got != 1 {
			t.Fatalf("%d deleted after a new unneeded time, want 1", got)
		}
	})
	t.Run("held by a scale-up: a stale taint is removed", func(t *testing.T) {
		acts := &fakeActions{}
		e := newEnv(t, withScaleDown(acts))
		cpu := e.provider.AddGroup("cpu", 0, 10, cpuTemplate("cpu"), inmemory.WithTarget(1))
		gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
		e.start()
		e.register(cpu)
		// A previous leader tainted the node and died before deleting it.
		obj, _, _ := e.nodes.GetByKey(nodeName(cpu, 0))
		n := obj.(*apiv1.Node).DeepCopy()
		n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: scaledown.ToBeDeletedTaint, Effect: apiv1.TaintEffectNoSchedule})
		must(t, e.nodes.Update(n))
		acts.taints[n.Name] = []string{scaledown.ToBeDeletedTaint}
		e.add(to.Pod("busy", to.Requests("12", "10Gi"), to.OnNode(n.Name), to.ControlledBy("ReplicaSet", "db", "rs-db")))
		e.add(pendingPods(1, "train", wholeGPU()...))
		e.run()
		if got := gpu.Increases(); len(got) != 1 {
			t.Fatalf("increases %v, want a scale-up in this loop", got)
		}
		if !slicesContain(acts.untaints(), n.Name+" "+scaledown.ToBeDeletedTaint) {
			t.Fatalf("untainted %v: the stale taint must go in a loop that scaled up too", acts.untaints())
		}
		if got := testutil.ToFloat64(e.a.metrics.UnneededNodes); got != 0 {
			t.Fatalf("unneeded_nodes %v, want nothing planned in a held loop", got)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestPendingRemovalsCountAgainstTheMinimum: empty nodes tainted and
// waiting for --node-delete-delay-after-taint count as deleting, so the
// loops in between do not plan the group below its minimum.
func TestPendingRemovalsCountAgainstTheMinimum(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.NodeDeleteDelayAfterTaint = 5 * time.Second
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	cpu := e.provider.AddGroup("cpu", 1, 10, cpuTemplate("cpu"), inmemory.WithTarget(3))
	e.start()
	e.register(cpu)
	e.run()
	e.clock.Step(2 * time.Minute)
	for range 8 {
		e.run()
		e.clock.Step(time.Second)
	}
	if got := len(cpu.Deleted()); got != 2 {
		t.Fatalf("%d of 3 deleted, want 2: the minimum is 1", got)
	}
}
