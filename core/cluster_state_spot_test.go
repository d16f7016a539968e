package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// spotEnv is a Spot group of 6 running 8-GPU nodes, each running a
// training pod, preferred by the priority expander over a regular group.
type spotEnv struct {
	*env
	spot, regular *inmemory.Group
	// made is how many training pods were made so far.
	made int
}

func newSpotEnv(t *testing.T, opts ...envOption) *spotEnv {
	t.Helper()
	opts = append([]envOption{withOptions(func(o *Options) { o.Expanders = []string{"priority", "least-waste"} })}, opts...)
	e := &spotEnv{env: newEnv(t, opts...)}
	e.spot = e.provider.AddGroup("spot", 0, 20, gpuTemplate("spot"), inmemory.WithTarget(6))
	e.regular = e.provider.AddGroup("regular", 0, 20, gpuTemplate("regular"))
	e.start()
	cm := &apiv1.ConfigMap{}
	cm.Name, cm.Namespace, cm.ResourceVersion = e.opts.PriorityConfigMapName, e.opts.Namespace, "1"
	cm.Data = map[string]string{"priorities": "50:\n  - spot\n10:\n  - regular\n"}
	if err := e.cms.Add(cm); err != nil {
		t.Fatal(err)
	}
	e.register(e.spot)
	for i := range 6 {
		e.add(to.Pod(e.nextPod(), append(wholeGPU(), to.OnNode(nodeName(e.spot, i)), to.ControlledBy("ReplicaSet", "train", "rs-train"), grace(30))...))
	}
	e.run()
	return e
}

func (e *spotEnv) nextPod() string {
	e.made++
	return fmt.Sprintf("train-%d", e.made)
}

// evict has the cloud take n of the Spot group's machines back; their
// nodes go, and their pods come back pending (as the pod garbage
// collector and their controller make them).
func (e *spotEnv) evict(deallocate bool, n int) {
	e.t.Helper()
	ids := e.spot.ProviderIDs()
	var gone []string
	for _, id := range ids {
		if len(gone) == n {
			break
		}
		if inst := e.instance(id); inst.Error == nil && inst.State == cloudprovider.InstanceRunning {
			gone = append(gone, id)
		}
	}
	if err := e.spot.Evict(deallocate, gone...); err != nil {
		e.t.Fatal(err)
	}
	for _, id := range gone {
		name := strings.NewReplacer("://", "-", "/", "-").Replace(id)
		for _, o := range e.pods.List() {
			if p := o.(*apiv1.Pod); p.Spec.NodeName == name {
				if err := e.pods.Delete(p); err != nil {
					e.t.Fatal(err)
				}
			}
		}
		if err := e.nodes.Delete(&apiv1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			e.t.Fatal(err)
		}
	}
	e.add(pendingPods(n, e.nextPod(), wholeGPU()...))
}

// eventsByReason takes the events recorded so far, by reason.
func (e *spotEnv) eventsByReason() map[string][]string {
	out := map[string][]string{}
	for {
		select {
		case ev := <-e.rec.Events:
			if f := strings.Fields(ev); len(f) > 1 {
				out[f[1]] = append(out[f[1]], ev)
			}
		default:
			return out
		}
	}
}

func (e *spotEnv) instance(id string) cloudprovider.Instance {
	e.t.Helper()
	ins, _ := e.spot.Instances()
	for _, in := range ins {
		if in.ProviderID == id {
			return in
		}
	}
	e.t.Fatalf("no instance %s", id)
	return cloudprovider.Instance{}
}

// TestSpotEvictionsBackOffTheGroupAfterN: each eviction is told of (an
// event, spot_evictions_total by group) and its pods are bought new
// machines; two within the window still buy Spot, the third backs the
// Spot group off (the reason naming the evictions), and the priority
// expander's fallback buys the regular group. Nothing of the evicted
// machines is deleted by the autoscaler (the cloud deleted them). Evictions
// further apart than the window back nothing off.
func TestSpotEvictionsBackOffTheGroupAfterN(t *testing.T) {
	e := newSpotEnv(t)
	if n := testutil.ToFloat64(e.a.metrics.SpotEvictions.WithLabelValues("regular")); n != 0 {
		t.Fatalf("spot_evictions_total{regular} = %v before any eviction", n)
	}
	e.evict(false, 2)
	e.run()
	if evs := e.events(EventSpotEvicted); len(evs) != 1 || !strings.Contains(evs[0], "node group spot: 2 machines evicted by the cloud (2 deleted, 0 deallocated") {
		t.Fatalf("events %v, want one SpotEvicted for 2", evs)
	}
	if got := testutil.ToFloat64(e.a.metrics.SpotEvictions.WithLabelValues("spot")); got != 2 {
		t.Fatalf("spot_evictions_total{spot} = %v, want 2", got)
	}
	if gs := e.a.registry.Group("spot"); gs.Backoff.Active {
		t.Fatalf("backed off after 2 evictions: %+v", gs.Backoff)
	}
	if got := e.spot.Increases(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("spot increases %v, want one of 2 (the preferred group, not backed off)", got)
	}
	e.spot.MarkRunning()
	e.register(e.spot)

	e.clock.Step(9 * time.Minute) // within the 10-minute window of the first two
	e.evict(false, 1)
	e.run()
	gs := e.a.registry.Group("spot")
	if !gs.Backoff.Active || gs.Backoff.Class != cloudprovider.ClassEvicted || !strings.Contains(gs.Backoff.Reason, "Spot evictions within 10m0s: 3 ") {
		t.Fatalf("backoff %+v, want one naming 3 Spot evictions within 10m0s", gs.Backoff)
	}
	if evs := e.events(EventSpotEvictionBackoff); len(evs) != 1 || !strings.Contains(evs[0], "node group spot backed off until") {
		t.Fatalf("events %v, want one SpotEvictionBackoff", evs)
	}
	if got := testutil.ToFloat64(e.a.metrics.Backoff.WithLabelValues("spot")); got != 1 {
		t.Fatalf("node_group_backoff{spot} = %v, want 1", got)
	}
	if got := e.regular.Increases(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("regular increases %v, want the evicted pod's machine from the fallback", got)
	}
	if got := e.spot.Increases(); len(got) != 1 {
		t.Fatalf("spot increases %v: a backed-off group scaled up", got)
	}
	if got := e.spot.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v: the cloud deleted the evicted machines, not the autoscaler", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedScaleUps.WithLabelValues("spot", "instance-error")); got != 0 {
		t.Fatalf("evictions counted as failed scale-ups: %v", got)
	}

	// Two more, further apart than the window: no second backoff.
	e.clock.Step(e.opts.MaxNodeGroupBackoffDuration + time.Minute)
	e.regular.MarkRunning()
	e.register(e.regular)
	e.spot.MarkRunning()
	e.register(e.spot)
	e.run()
	e.evict(false, 1)
	e.run()
	e.clock.Step(11 * time.Minute)
	e.evict(false, 1)
	e.run()
	e.clock.Step(time.Minute)
	e.evict(false, 1)
	e.run()
	if gs := e.a.registry.Group("spot"); gs.Backoff.Active {
		t.Fatalf("backed off by evictions outside one window: %+v", gs.Backoff)
	}
	if got := testutil.ToFloat64(e.a.metrics.SpotEvictions.WithLabelValues("spot")); got != 6 {
		t.Fatalf("spot_evictions_total{spot} = %v, want 6", got)
	}
}

// TestSpotDeallocatedMachinesAreDeletedWithinTheBrake: machines evicted
// and deallocated run nothing but hold quota: they are deleted through the
// Remover within the replacement brake (2 of 3 in the first loop, under a
// budget of 2), with no failed scale-up told of; the third eviction backs
// the group off as deleted ones do. A deallocated machine whose node still
// says Ready (its kubelet's death not seen yet) is never deleted while it
// does: it may run pods; NotReady, its pod is evicted with its grace
// before the machine goes.
func TestSpotDeallocatedMachinesAreDeletedWithinTheBrake(t *testing.T) {
	acts := &fakeActions{}
	e := newSpotEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ReplacementBrakeMinNodes, o.ReplacementBrakeClusterShare = 2, 0
	}))
	acts.graceful = e.clock
	e.evict(true, 3)
	e.run()
	if got := e.spot.Deleted(); len(got) != 2 {
		t.Fatalf("deleted %v, want 2 of the 3 deallocated machines (the brake's budget)", got)
	}
	evs := e.eventsByReason()
	if got := evs[EventFailedScaleUp]; len(got) != 0 {
		t.Fatalf("evictions told of as failed scale-ups: %v", got)
	}
	if evs := evs[EventSpotEvicted]; len(evs) != 1 || !strings.Contains(evs[0], "3 machines evicted by the cloud (0 deleted, 3 deallocated") {
		t.Fatalf("events %v, want one SpotEvicted for 3 deallocated", evs)
	}
	if gs := e.a.registry.Group("spot"); !gs.Backoff.Active || !strings.Contains(gs.Backoff.Reason, "Spot evictions within 10m0s: 3 ") {
		t.Fatalf("backoff %+v, want one naming the evictions", gs.Backoff)
	}
	if got := e.regular.Increases(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("regular increases %v, want 3 for the evicted pods", got)
	}
	e.clock.Step(e.opts.ReplacementBrakeWindow)
	e.run()
	if got := e.spot.Deleted(); len(got) != 3 {
		t.Fatalf("deleted %v, want the third once the brake's window moved on", got)
	}

	// Deallocated, its node still Ready: kept, with its pod.
	id := e.spot.ProviderIDs()[0]
	name := strings.NewReplacer("://", "-", "/", "-").Replace(id)
	if err := e.spot.Evict(true, id); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		e.clock.Step(e.opts.ScanInterval)
		e.run()
	}
	if got := e.spot.Deleted(); len(got) != 3 {
		t.Fatalf("deleted %v: a machine whose node is Ready", got)
	}
	if got := acts.evictedPods(); len(got) != 0 {
		t.Fatalf("evicted %v from a Ready node", got)
	}
	obj, _, _ := e.nodes.GetByKey(name)
	n := obj.(*apiv1.Node).DeepCopy()
	to.NotReady()(n)
	if err := e.nodes.Update(n); err != nil {
		t.Fatal(err)
	}
	e.run()
	if got := acts.evictedPods(); len(got) != 1 {
		t.Fatalf("evicted %v, want the NotReady node's pod", got)
	}
	if got := e.spot.Deleted(); len(got) != 3 {
		t.Fatalf("deleted %v in the loop that evicted the node's pod", got)
	}
	e.clock.Step(30*time.Second + actuation.GraceMargin)
	e.run()
	if got := e.spot.Deleted(); len(got) != 4 || !slices.Contains(got, id) {
		t.Fatalf("deleted %v, want %s once its pod's grace ran out", got, id)
	}
}

// TestSpotEvictionStateSurvivesAFailover: a new leader keeps the group's
// eviction backoff (the safety state's backoffs) and the evictions counted
// within the window that have not backed it off yet (its spotEvictions):
// 2 before the failover and 1 after back the group off.
func TestSpotEvictionStateSurvivesAFailover(t *testing.T) {
	e := newSpotEnv(t)
	e.safety = &memSafety{}
	e.failover()
	e.run()
	e.evict(false, 2)
	e.run()
	e.failover()
	e.clock.Step(time.Minute)
	e.evict(false, 1)
	e.run()
	gs := e.a.registry.Group("spot")
	if !gs.Backoff.Active || !strings.Contains(gs.Backoff.Reason, "Spot evictions within 10m0s: 3 ") {
		t.Fatalf("backoff %+v after 2 evictions before the failover and 1 after, want one for 3", gs.Backoff)
	}
	e.failover()
	e.clock.Step(time.Minute)
	e.add(pendingPods(1, "late", wholeGPU()...))
	e.run()
	if gs := e.a.registry.Group("spot"); !gs.Backoff.Active || !strings.Contains(gs.Backoff.Reason, "Spot evictions within 10m0s: 3 ") {
		t.Fatalf("backoff %+v on the next leader, want the evictions' backoff kept", gs.Backoff)
	}
	if got := e.spot.Increases(); len(got) != 1 {
		t.Fatalf("spot increases %v: the next leader scaled up a group backed off for its evictions", got)
	}
}

// TestSpotEvictionFlags: --spot-eviction-backoff-count and
// --spot-eviction-window are checked, naming the flag, and live: lowered
// to 1, the next eviction backs the group off; 0 never backs off.
func TestSpotEvictionFlags(t *testing.T) {
	for _, tc := range []struct {
		count  int
		window time.Duration
		want   string
	}{
		{-1, time.Minute, "--spot-eviction-backoff-count"},
		{3, 0, "--spot-eviction-window: must be positive with --spot-eviction-backoff-count 3"},
		{3, 30 * 24 * time.Hour, "--spot-eviction-window"},
	} {
		o := DefaultOptions()
		o.SpotEvictionBackoffCount, o.SpotEvictionWindow = tc.count, tc.window
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("count %d, window %s: %v, want an error naming %s", tc.count, tc.window, err, tc.want)
		}
	}
	o := DefaultOptions()
	o.SpotEvictionBackoffCount, o.SpotEvictionWindow = 0, 0
	if err := o.Validate(); err != nil {
		t.Errorf("backoff off: %v", err)
	}

	e := newSpotEnv(t, withOptions(func(o *Options) { o.SpotEvictionBackoffCount = 0 }))
	e.evict(false, 3)
	e.run()
	if gs := e.a.registry.Group("spot"); gs.Backoff.Active {
		t.Fatalf("backed off with --spot-eviction-backoff-count=0: %+v", gs.Backoff)
	}
	live := e.a.Options()
	live.SpotEvictionBackoffCount = 1
	if err := e.a.Reconfigure(live); err != nil {
		t.Fatal(err)
	}
	e.clock.Step(time.Minute)
	e.evict(false, 1)
	e.run()
	if gs := e.a.registry.Group("spot"); !gs.Backoff.Active || !strings.Contains(gs.Backoff.Reason, "Spot evictions within 10m0s: 1 ") {
		t.Fatalf("backoff %+v after the live change to 1, want one", gs.Backoff)
	}
}
