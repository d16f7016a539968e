package core

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// fakeActions records scale-down's Kubernetes writes; an eviction deletes
// the pod from the informer store, as the API server and kubelet would.
type fakeActions struct {
	mu       sync.Mutex
	pods     cache.Indexer
	taints   map[string][]string
	evicted  []string
	cordoned []string
	// uncordoned are the nodes made schedulable again.
	uncordoned []string
	// refuse, when set, refuses evictions (a PodDisruptionBudget says not
	// yet); graces records every eviction's grace period by pod.
	refuse bool
	graces map[string][]int64
	// graceful, when set, makes an eviction leave the pod terminating
	// (deletionTimestamp = now + grace by this clock), not gone at once.
	graceful *clocktesting.FakeClock
	// untainted records every RemoveTaint as "node key".
	untainted []string
	// nodes, when set, get the cordons and uncordons (with the
	// annotation), as the API server's nodes would.
	nodes cache.Indexer
	// repairWrites are the nodes whose repair record was written, once
	// per write; preflightAgain those sent through preflight again.
	repairWrites, preflightAgain []string
}

func (f *fakeActions) AddTaint(_ context.Context, node string, t apiv1.Taint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.taints[node] = append(f.taints[node], t.Key)
	return nil
}

func (f *fakeActions) RemoveTaint(_ context.Context, node, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.untainted = append(f.untainted, node+" "+key)
	var kept []string
	for _, k := range f.taints[node] {
		if k != key {
			kept = append(kept, k)
		}
	}
	f.taints[node] = kept
	return nil
}

func (f *fakeActions) Evict(_ context.Context, p *apiv1.Pod, grace int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.graces == nil {
		f.graces = map[string][]int64{}
	}
	f.graces[p.Name] = append(f.graces[p.Name], grace)
	if f.refuse {
		return errors.New("Cannot evict pod as it would violate the pod's disruption budget")
	}
	f.evicted = append(f.evicted, p.Name)
	if f.graceful != nil {
		// As the API server does: the pod stays, terminating until its
		// grace runs out; the kubelet removes it when its process exits.
		obj, ok, err := f.pods.Get(p)
		if err != nil || !ok {
			return err
		}
		c := obj.(*apiv1.Pod).DeepCopy()
		c.DeletionTimestamp = &metav1.Time{Time: f.graceful.Now().Add(time.Duration(grace) * time.Second)}
		c.DeletionGracePeriodSeconds = &grace
		return f.pods.Update(c)
	}
	return f.pods.Delete(p)
}

func (f *fakeActions) Cordon(_ context.Context, node, reason string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cordoned = append(f.cordoned, node)
	return f.writeNode(node, func(n *apiv1.Node) {
		n.Spec.Unschedulable = true
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		now := time.Now()
		if f.graceful != nil {
			now = f.graceful.Now() // the env's clock, as the autoscaler's
		}
		n.Annotations[actuation.CordonedAnnotation] = reason + " " + now.UTC().Format(time.RFC3339)
	})
}

// writeNode changes a node of f.nodes, when set.
func (f *fakeActions) writeNode(name string, change func(*apiv1.Node)) error {
	if f.nodes == nil {
		return nil
	}
	obj, ok, err := f.nodes.GetByKey(name)
	if err != nil || !ok {
		return fmt.Errorf("node %s: found %v: %w", name, ok, err)
	}
	n := obj.(*apiv1.Node).DeepCopy()
	change(n)
	return f.nodes.Update(n)
}

func (f *fakeActions) evictedPods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.evicted...)
}

func (f *fakeActions) Uncordon(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uncordoned = append(f.uncordoned, node)
	return f.writeNode(node, func(n *apiv1.Node) {
		n.Spec.Unschedulable = false
		delete(n.Annotations, actuation.CordonedAnnotation)
	})
}

func (f *fakeActions) UpdateRepair(_ context.Context, node string, change func(string) string, again *actuation.PreflightAgain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var refused error
	err := f.writeNode(node, func(n *apiv1.Node) { _, refused = actuation.ChangeRepair(n, change, again) })
	if err == nil {
		err = refused
	}
	if err == nil {
		f.repairWrites = append(f.repairWrites, node)
		if again != nil {
			f.preflightAgain = append(f.preflightAgain, node)
		}
	}
	return err
}

func (f *fakeActions) taintsOf(node string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]string(nil), f.taints[node]...)
	sort.Strings(out)
	return out
}

func (f *fakeActions) untaints() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.untainted...)
}

func withScaleDown(f *fakeActions) envOption {
	return func(e *env) {
		f.pods = e.pods
		f.taints = map[string][]string{}
		e.actions = f
	}
}

func TestScaleDownAfterUnneededTime(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = 10 * time.Minute
		o.MaxPodEventsPerLoop = 100
		// Three nodes: the default brake (half the cluster per window) would
		// allow one removal; this test is about the unneeded time.
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	cpu := e.provider.AddGroup("cpu", 1, 10, cpuTemplate("cpu"), inmemory.WithTarget(3))
	e.start()
	e.register(cpu)
	ids := cpu.ProviderIDs()
	name := func(i int) string { return fmt.Sprintf("inmemory-cpu-%s", ids[i][len("inmemory://cpu/"):]) }
	e.add(to.Pod("small", to.Requests("1", "1Gi"), to.OnNode(name(0)), to.ControlledBy("ReplicaSet", "web", "rs-web")))
	e.add(to.Pod("busy", to.Requests("10", "10Gi"), to.OnNode(name(2)), to.ControlledBy("ReplicaSet", "db", "rs-db")))
	e.run()
	if got := testutil.ToFloat64(e.a.metrics.UnneededNodes); got != 2 {
		t.Fatalf("unneeded_nodes = %v, want 2", got)
	}
	if got := acts.taintsOf(name(1)); len(got) != 1 || got[0] != scaledown.DeletionCandidateTaint {
		t.Fatalf("taints of the empty node %v, want the soft deletion-candidate taint", got)
	}
	e.clock.Step(9 * time.Minute)
	e.run()
	if len(cpu.Deleted()) != 0 {
		t.Fatal("removed before the unneeded time")
	}
	e.clock.Step(2 * time.Minute)
	e.run()
	e.a.WaitForDrains()
	if got := cpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v, want only the empty node in the loop that starts the drain", got)
	}
	e.run() // the drained node is deleted, batched per group, by the next loop
	e.run() // and deleted nodes are not planned again while their Node objects linger
	for _, step := range []string{"taint", "evict", "drain-timeout", "delete"} {
		if n := testutil.ToFloat64(e.a.metrics.FailedScaleDowns.WithLabelValues("cpu", step)); n != 0 {
			t.Fatalf("%v failed scale-downs at step %s: a deleted node was planned again", n, step)
		}
	}
	if got := cpu.Deleted(); len(got) != 2 {
		t.Fatalf("deleted %v, want the empty node and the drained one (min size 1 of 3 leaves the busy one)", got)
	}
	if len(acts.evicted) != 1 || acts.evicted[0] != "small" {
		t.Fatalf("evicted %v, want [small]", acts.evicted)
	}
	for _, i := range []int{0, 1} {
		found := false
		for _, k := range acts.taintsOf(name(i)) {
			found = found || k == scaledown.ToBeDeletedTaint
		}
		if !found {
			t.Errorf("node %s not tainted %s before removal", name(i), scaledown.ToBeDeletedTaint)
		}
	}
	if got := testutil.ToFloat64(e.a.metrics.ScaledDownNodes.WithLabelValues("cpu", "empty")); got != 1 {
		t.Errorf("scaled_down_nodes_total{empty} = %v", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.ScaledDownNodes.WithLabelValues("cpu", "underutilized")); got != 1 {
		t.Errorf("scaled_down_nodes_total{underutilized} = %v", got)
	}
	if len(e.events(EventScaleDown)) < 3 {
		t.Error("missing ScaleDown events on the nodes and the evicted pod")
	}
}

func TestStaleToBeDeletedTaintIsRemoved(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts))
	cpu := e.provider.AddGroup("cpu", 0, 10, cpuTemplate("cpu"), inmemory.WithTarget(1))
	e.start()
	e.register(cpu)
	// A previous leader tainted the node and crashed before deleting it.
	obj, _, _ := e.nodes.GetByKey(fmt.Sprintf("inmemory-cpu-%s", cpu.ProviderIDs()[0][len("inmemory://cpu/"):]))
	n := obj.(*apiv1.Node).DeepCopy()
	n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: scaledown.ToBeDeletedTaint, Effect: apiv1.TaintEffectNoSchedule})
	if err := e.nodes.Update(n); err != nil {
		t.Fatal(err)
	}
	acts.taints[n.Name] = []string{scaledown.ToBeDeletedTaint}
	e.add(to.Pod("busy", to.Requests("12", "10Gi"), to.OnNode(n.Name), to.ControlledBy("ReplicaSet", "db", "rs-db")))
	e.run()
	if got := acts.taintsOf(n.Name); len(got) != 0 {
		t.Fatalf("taints %v: the stale to-be-deleted taint is still there", got)
	}
	if len(cpu.Deleted()) != 0 {
		t.Fatal("a busy node was deleted")
	}
}

func TestFailedRemovalIsUntaintedAndRecorded(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	cpu := e.provider.AddGroup("cpu", 0, 10, cpuTemplate("cpu"), inmemory.WithTarget(1))
	e.start()
	e.register(cpu)
	cpu.SetDeleteError(errors.New("ARM said no"))
	e.run()
	e.clock.Step(2 * time.Minute)
	e.run()
	node := fmt.Sprintf("inmemory-cpu-%s", cpu.ProviderIDs()[0][len("inmemory://cpu/"):])
	// The cloud may have started deleting it (an error says nothing sure):
	// the node keeps its taint, so no pod lands on a machine going away,
	// until its machine is read again after UncertainDeleteWait.
	if !slicesContain(acts.taintsOf(node), scaledown.ToBeDeletedTaint) {
		t.Fatalf("taints %v: untainted while its deletion may be under way", acts.taintsOf(node))
	}
	e.clock.Step(actuation.UncertainDeleteWait + time.Second)
	e.run()
	for _, k := range acts.taintsOf(node) {
		if k == scaledown.ToBeDeletedTaint {
			t.Fatalf("taints %v: the to-be-deleted taint stayed after its machine was read alive again", acts.taintsOf(node))
		}
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedScaleDowns.WithLabelValues("cpu", "delete")); got != 1 {
		t.Fatalf("failed_scale_downs_total{delete} = %v, want 1", got)
	}
	if len(e.events(EventScaleDownFailed)) != 1 {
		t.Fatal("no ScaleDownFailed event")
	}
	// The failure holds scale-down for --scale-down-delay-after-failure.
	cpu.SetDeleteError(nil)
	e.clock.Step(time.Minute)
	e.run()
	if len(cpu.Deleted()) != 0 {
		t.Fatal("removed again within the delay after failure")
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

func (f *fakeActions) setRefuse(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = v
}

func (f *fakeActions) gracesOf(pod string) []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64(nil), f.graces[pod]...)
}

// TestReloadDuringDrain reloads the options, loop after loop, while a
// drain retries an eviction a PodDisruptionBudget refuses. The drain keeps
// the options in force when it started (grace 30 s for the pod, none for
// the balloon), and under -race the reloads and the drain never touch the
// same memory.
func TestReloadDuringDrain(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
		o.MaxGracefulTerminationSec = 30
	}))
	cpu := e.provider.AddGroup("cpu", 1, 10, cpuTemplate("cpu"), inmemory.WithTarget(2))
	e.start()
	e.register(cpu)
	ids := cpu.ProviderIDs()
	name := func(i int) string { return fmt.Sprintf("inmemory-cpu-%s", ids[i][len("inmemory://cpu/"):]) }
	balloonOpts := e.opts.Balloons
	e.add(to.Pod("web", to.Requests("1", "1Gi"), to.OnNode(name(0)), to.ControlledBy("ReplicaSet", "web", "rs-web")))
	e.add(to.Pod("warm", to.Requests("1", "1Gi"), to.OnNode(name(0)), to.ControlledBy("ReplicaSet", "warm", "rs-warm"),
		to.Labels(balloonOpts.Label, "cpu", balloonOpts.ManagedByLabel, balloonOpts.ManagedByValue), to.Namespace(balloonOpts.Namespace),
		func(p *apiv1.Pod) { p.Spec.PriorityClassName = balloonOpts.PriorityClassName }))
	e.add(to.Pod("db", to.Requests("10", "10Gi"), to.OnNode(name(1)), to.ControlledBy("ReplicaSet", "db", "rs-db")))
	acts.setRefuse(true)
	e.run()
	e.clock.Step(2 * time.Minute)
	e.run() // node 0 is unneeded for long enough: its drain starts
	if !e.a.scaleDown.actuator.IsDraining(name(0)) {
		t.Fatalf("node %s is not being drained", name(0))
	}
	// 12 rounds of 5 s stay within the drain's deadline: its 30 s grace
	// plus a minute.
	for i := 0; i < 12; i++ {
		// The drain goroutine waits on the clock for its next retry: each
		// step of the clock is then one more attempt.
		waitForClockWaiter(t, e)
		o := e.a.Options()
		o.BalloonAware = i%2 == 1
		o.MaxGracefulTerminationSec = 600 + i
		o.MaxSoftTaintsPerLoop = 10 + i
		if err := e.a.Reconfigure(o); err != nil {
			t.Fatal(err)
		}
		e.clock.Step(5 * time.Second) // the drain retries its evictions
		e.run()                       // and the reload lands meanwhile
	}
	acts.setRefuse(false)
	deadline := time.Now().Add(30 * time.Second)
	for e.a.scaleDown.actuator.InFlight() > 0 && len(cpu.Deleted()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not finish within 30 s of polling")
		}
		if e.clock.HasWaiters() {
			e.clock.Step(5 * time.Second)
		}
		e.run()
		runtime.Gosched()
	}
	e.a.WaitForDrains()
	e.run()
	if got := cpu.Deleted(); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("deleted %v, want the drained node %s", got, ids[0])
	}
	for pod, want := range map[string]int64{"web": 30, "warm": 0} {
		gs := acts.gracesOf(pod)
		if len(gs) < 2 {
			t.Fatalf("pod %s evicted %d times, want the refused attempts and the last", pod, len(gs))
		}
		for _, g := range gs {
			if g != want {
				t.Fatalf("pod %s evicted with grace %v, want %d every time: the drain must keep the options it started with", pod, gs, want)
			}
		}
	}
}

// The deletion-candidate taint is cluster-autoscaler's key too: a node of
// another autoscaler (another cluster-autoscaler, or ours for other scale
// sets) keeps the taint that one put there, while a node of ours that is
// no longer unneeded loses it.
func TestSoftTaintLeavesOtherAutoscalersNodes(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts))
	cpu := e.provider.AddGroup("cpu", 1, 10, cpuTemplate("cpu"), inmemory.WithTarget(1))
	e.start()
	candidate := apiv1.Taint{Key: scaledown.DeletionCandidateTaint, Value: "1", Effect: apiv1.TaintEffectPreferNoSchedule}
	e.register(cpu, func(n *apiv1.Node) { n.Spec.Taints = append(n.Spec.Taints, candidate) })
	ours := cpu.ProviderIDs()[0]
	oursName := strings.NewReplacer("://", "-", "/", "-").Replace(ours)
	e.add(to.Pod("busy", to.Requests("10", "10Gi"), to.OnNode(oursName), to.ControlledBy("ReplicaSet", "db", "rs-db")))
	e.add(to.Node("theirs", "16", "64Gi", to.ProviderID("azure:///subscriptions/other/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/theirs/virtualMachines/0"),
		func(n *apiv1.Node) { n.Spec.Taints = append(n.Spec.Taints, candidate) }))
	e.run()
	got := acts.untaints()
	if !slices.Contains(got, oursName+" "+scaledown.DeletionCandidateTaint) {
		t.Errorf("untainted %v: our busy node kept its deletion-candidate taint", got)
	}
	for _, u := range got {
		if strings.HasPrefix(u, "theirs ") {
			t.Errorf("untainted %v: another autoscaler's node lost its taint", got)
		}
	}
}
