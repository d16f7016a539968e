package clusterstate

import (
	"context"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func opts() Options {
	return Options{
		MaxNodeProvisionTime: 15 * time.Minute,
		MaxNodeStartupTime:   10 * time.Minute,
		Backoff:              BackoffOptions{Initial: 5 * time.Minute, Max: 30 * time.Minute, Reset: 3 * time.Hour},
	}
}

func update(r *Registry, p *inmemory.Provider, now time.Time, nodes ...*apiv1.Node) Actions {
	return r.Update(now, p.NodeGroups(), nodes, func(n *apiv1.Node) cloudprovider.NodeGroup {
		g, _ := p.NodeGroupForNode(n)
		return g
	})
}

func TestReadinessTransitions(t *testing.T) {
	p := inmemory.New()
	g := p.AddGroup("g", 0, 10, to.Node("t", "1", "1Gi"))
	r := NewRegistry(opts())
	ctx := context.Background()
	update(r, p, t0)
	if err := g.IncreaseSize(ctx, 3); err != nil {
		t.Fatal(err)
	}
	r.RegisterScaleUp("g", 3, t0)
	ids := g.ProviderIDs()
	node := func(i int, ready bool, created time.Time) *apiv1.Node {
		o := []to.NodeOption{to.ProviderID(ids[i]), to.NodeCreatedAt(created)}
		if !ready {
			o = append(o, to.NotReady())
		}
		return to.Node("n"+ids[i], "1", "1Gi", o...)
	}
	lost := func(i int, created, since time.Time) *apiv1.Node {
		return to.Node("n"+ids[i], "1", "1Gi", to.ProviderID(ids[i]), to.NodeCreatedAt(created), to.LostSince(since))
	}
	steps := []struct {
		name  string
		at    time.Duration
		nodes []*apiv1.Node
		want  Readiness
	}{
		{name: "just requested", at: time.Minute,
			want: Readiness{Target: 3, TargetKnown: true, Unregistered: 3, Upcoming: 3}},
		{name: "one registered, not ready yet", at: 2 * time.Minute, nodes: []*apiv1.Node{node(0, false, t0.Add(2*time.Minute))},
			want: Readiness{Target: 3, TargetKnown: true, Registered: 1, NotStarted: 1, Unregistered: 2, Upcoming: 3}},
		{name: "one ready, one starting", at: 4 * time.Minute, nodes: []*apiv1.Node{node(0, true, t0.Add(2*time.Minute)), node(1, false, t0.Add(4*time.Minute))},
			want: Readiness{Target: 3, TargetKnown: true, Registered: 2, Ready: 1, NotStarted: 1, Unregistered: 1, Upcoming: 2}},
		// Node 0 ran, then its kubelet went silent: unready at once, not
		// coming capacity, though it is younger than the startup time.
		{name: "a node that ran and went silent is unready", at: 5 * time.Minute,
			nodes: []*apiv1.Node{lost(0, t0.Add(2*time.Minute), t0.Add(5*time.Minute)), node(1, false, t0.Add(4*time.Minute))},
			want:  Readiness{Target: 3, TargetKnown: true, Registered: 2, Unready: 1, NotStarted: 1, Unregistered: 1, Upcoming: 2}},
		// Node 1's first status came within 2 minutes of its creation, as a
		// booting kubelet's does: still starting.
		{name: "a node that never was Ready is still starting", at: 6 * time.Minute,
			nodes: []*apiv1.Node{node(0, true, t0.Add(2*time.Minute)), lost(1, t0.Add(4*time.Minute), t0.Add(5*time.Minute))},
			want:  Readiness{Target: 3, TargetKnown: true, Registered: 2, Ready: 1, NotStarted: 1, Unregistered: 1, Upcoming: 2}},
		{name: "starting node turns unready after startup time", at: 15 * time.Minute, nodes: []*apiv1.Node{node(0, true, t0.Add(2*time.Minute)), node(1, false, t0.Add(4*time.Minute))},
			want: Readiness{Target: 3, TargetKnown: true, Registered: 2, Ready: 1, Unready: 1, Unregistered: 1, Upcoming: 1}},
		{name: "never-registered machine passes provision time", at: 16 * time.Minute, nodes: []*apiv1.Node{node(0, true, t0.Add(2*time.Minute)), node(1, false, t0.Add(4*time.Minute))},
			want: Readiness{Target: 3, TargetKnown: true, Registered: 2, Ready: 1, Unready: 1, LongUnregistered: 1, Upcoming: 0}},
	}
	for _, s := range steps {
		act := update(r, p, t0.Add(s.at), s.nodes...)
		s.want.LastKnownUpcoming = s.want.Upcoming // the size is known at every step
		if got := r.Group("g").Readiness; got != s.want {
			t.Fatalf("%s: readiness\n got %+v\nwant %+v", s.name, got, s.want)
		}
		if s.want.LongUnregistered > 0 {
			if len(act.Delete["g"]) != 1 || act.Delete["g"][0] != ids[2] || len(act.Failures) != 1 || act.Failures[0].Reason != "provision-timeout" {
				t.Fatalf("%s: actions %+v, want delete of %s with a provision-timeout failure", s.name, act, ids[2])
			}
			if !r.Group("g").Backoff.Active {
				t.Fatalf("%s: group not backed off", s.name)
			}
		} else if len(act.Delete) != 0 || len(act.Failures) != 0 {
			t.Fatalf("%s: unexpected actions %+v", s.name, act)
		}
	}
	// The same machine is not reported twice.
	act := update(r, p, t0.Add(17*time.Minute))
	if len(act.Failures) != 0 {
		t.Fatalf("failure reported again: %+v", act.Failures)
	}
}

func TestInstanceErrorsBackOffOnce(t *testing.T) {
	p := inmemory.New()
	g := p.AddGroup("g", 0, 10, to.Node("t", "1", "1Gi"))
	r := NewRegistry(opts())
	g.FailNextCreation(cloudprovider.ClassOutOfCapacity, "AllocationFailed", "no capacity")
	if err := g.IncreaseSize(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	act := update(r, p, t0)
	if len(act.Delete["g"]) != 2 || len(act.Failures) != 2 || act.Failures[0].Reason != "out-of-capacity" {
		t.Fatalf("actions %+v", act)
	}
	rd := r.Group("g").Readiness
	if rd.InError != 2 || rd.Upcoming != 0 {
		t.Fatalf("readiness %+v, want 2 in error and nothing upcoming", rd)
	}
	// Deletion failed: asked again, without a new failure.
	r.RetryDelete(act.Delete["g"])
	act = update(r, p, t0.Add(time.Minute))
	if len(act.Delete["g"]) != 2 || len(act.Failures) != 0 {
		t.Fatalf("retry actions %+v, want the 2 deletions and no failure", act)
	}
	act = update(r, p, t0.Add(2*time.Minute))
	if len(act.Delete) != 0 {
		t.Fatalf("deleted again without a retry: %+v", act)
	}
	// The deletion was accepted (no RetryDelete) and lost: the machines are
	// still listed, not deleting, DefaultLostDeletionAfter after it was sent, and
	// are asked again, counted, without a new failure. Before, never.
	act = update(r, p, t0.Add(time.Minute+DefaultLostDeletionAfter))
	if len(act.Delete["g"]) != 2 || act.LostDeletes["g"] != 2 || len(act.Failures) != 0 {
		t.Fatalf("actions %+v after the lost-deletion delay, want the 2 asked again, counted lost, no failure", act)
	}
	if act = update(r, p, t0.Add(2*time.Minute+DefaultLostDeletionAfter)); len(act.Delete) != 0 {
		t.Fatalf("asked again at once: %+v", act)
	}
}

func TestSizeUnknown(t *testing.T) {
	p := inmemory.New()
	g := p.AddGroup("g", 0, 10, to.Node("t", "1", "1Gi"), inmemory.WithTarget(2))
	g.FailNextCreation(cloudprovider.ClassQuota, "QuotaExceeded", "")
	if err := g.IncreaseSize(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	g.SetSizeUnknown(true)
	r := NewRegistry(opts())
	act := update(r, p, t0)
	gs := r.Group("g")
	if !cloudprovider.IsSizeUnknown(gs.SizeError) || gs.Readiness.TargetKnown || gs.Readiness.Upcoming != 0 {
		t.Fatalf("group state %+v, want size unknown and nothing upcoming", gs)
	}
	if len(act.Delete)+len(act.DecreaseTarget)+len(act.Failures) != 0 {
		t.Fatalf("acted on an unknown size: %+v", act)
	}
	// Hours later, with machines that never registered: still no action.
	act = update(r, p, t0.Add(5*time.Hour))
	if len(act.Delete)+len(act.DecreaseTarget)+len(act.Failures) != 0 {
		t.Fatalf("acted on an unknown size after hours: %+v", act)
	}
}

func TestBackoff(t *testing.T) {
	b := NewBackoff(BackoffOptions{Initial: 5 * time.Minute, Max: 30 * time.Minute, Reset: 3 * time.Hour})
	steps := []struct {
		at    time.Duration
		class cloudprovider.ErrorClass
		want  time.Duration
	}{
		{0, cloudprovider.ClassOther, 5 * time.Minute},
		{10 * time.Minute, cloudprovider.ClassOutOfCapacity, 10 * time.Minute},
		{30 * time.Minute, cloudprovider.ClassOther, 20 * time.Minute},
		{60 * time.Minute, cloudprovider.ClassOther, 30 * time.Minute}, // capped
		{70 * time.Minute, cloudprovider.ClassOther, 30 * time.Minute},
		{5 * time.Hour, cloudprovider.ClassOther, 5 * time.Minute}, // reset after 3h without failure
		{5*time.Hour + time.Minute, cloudprovider.ClassQuota, 30 * time.Minute},
		{9 * time.Hour, cloudprovider.ClassSizeLimit, 30 * time.Minute}, // a platform limit does not lift in minutes
	}
	for _, s := range steps {
		if got := b.Fail("g", s.class, "x", t0.Add(s.at)); got != s.want {
			t.Fatalf("at %s: backoff %s, want %s", s.at, got, s.want)
		}
		st := b.Status("g", t0.Add(s.at).Add(s.want-time.Second))
		if !st.Active {
			t.Fatalf("at %s: not active just before the end", s.at)
		}
		if b.Status("g", t0.Add(s.at).Add(s.want+time.Second)).Active {
			t.Fatalf("at %s: still active after the end", s.at)
		}
	}
}

func TestIsReadyNeedsTaintsLifted(t *testing.T) {
	tests := []struct {
		name string
		node *apiv1.Node
		want bool
	}{
		{"ready", to.Node("n", "1", "1Gi"), true},
		{"not ready", to.Node("n", "1", "1Gi", to.NotReady()), false},
		{"ready but not-ready taint still on", to.Node("n", "1", "1Gi", func(n *apiv1.Node) {
			n.Spec.Taints = []apiv1.Taint{{Key: apiv1.TaintNodeNotReady, Effect: apiv1.TaintEffectNoSchedule}}
		}), false},
		{"ready but uninitialized", to.Node("n", "1", "1Gi", func(n *apiv1.Node) {
			n.Spec.Taints = []apiv1.Taint{{Key: "node.cloudprovider.kubernetes.io/uninitialized", Effect: apiv1.TaintEffectNoSchedule}}
		}), false},
		{"other taints do not matter", to.Node("n", "1", "1Gi", to.Taint("openai.com/team", "rl")), true},
	}
	for _, tc := range tests {
		if got := IsReady(tc.node); got != tc.want {
			t.Errorf("%s: IsReady = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// limited is a node group whose cloud holds fewer machines than configured.
type limited struct {
	cloudprovider.NodeGroup
	configured, limit int
}

func (l limited) SizeLimit() (int, int, string) { return l.configured, l.limit, "Uniform scale set" }

func TestMaxWarning(t *testing.T) {
	p := inmemory.New()
	g := p.AddGroup("g", 0, 1000, to.Node("t", "1", "1Gi"))
	tests := []struct {
		name  string
		group cloudprovider.NodeGroup
		want  string
	}{
		{"no limit known", g, ""},
		{"configured above the limit", limited{g, 2500, 1000},
			"configured max 2500 is more than the node group can hold (1000: Uniform scale set); max is 1000"},
		{"configured at the limit", limited{g, 1000, 1000}, ""},
		{"no limit", limited{g, 2500, 0}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRegistry(opts())
			r.Update(t0, []cloudprovider.NodeGroup{tt.group}, nil, func(*apiv1.Node) cloudprovider.NodeGroup { return nil })
			gs := r.Group("g")
			if gs.MaxWarning != tt.want {
				t.Fatalf("MaxWarning = %q, want %q", gs.MaxWarning, tt.want)
			}
			if gs.Max != 1000 {
				t.Fatalf("Max = %d, want the group's MaxSize 1000", gs.Max)
			}
		})
	}
}

// A machine the cloud reports failed while it runs (power state running,
// or its node registered and Ready) is a running machine: counted as its
// node, listed to be told of, never deleted or counted as a failure. Only
// one that does not run is a failed creation.
func TestFailedButRunningInstancesAreKept(t *testing.T) {
	p := inmemory.New()
	g := p.AddGroup("g", 0, 10, to.Node("t", "1", "1Gi"))
	r := NewRegistry(opts())
	if err := g.IncreaseSize(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	ids := g.ProviderIDs()
	node := func(i int, o ...to.NodeOption) *apiv1.Node {
		return to.Node("n"+ids[i], "1", "1Gi", append([]to.NodeOption{to.ProviderID(ids[i]), to.NodeCreatedAt(t0)}, o...)...)
	}
	ext := &cloudprovider.InstanceError{Class: cloudprovider.ClassOther, Code: "VMExtensionProvisioningError", Message: "extension failed"}
	disk := &cloudprovider.InstanceError{Class: cloudprovider.ClassOther, Code: "AttachDiskWhileBeingDetached", Message: "disk attach failed"}
	alloc := &cloudprovider.InstanceError{Class: cloudprovider.ClassOutOfCapacity, Code: "AllocationFailed", Message: "no capacity"}
	g.SetInstanceFailure(ids[0], true, ext)    // the cloud says it runs
	g.SetInstanceFailure(ids[1], false, disk)  // no power state, but its node is Ready
	g.SetInstanceFailure(ids[2], false, alloc) // never became a node
	act := update(r, p, t0.Add(time.Minute), node(0), node(1))
	if len(act.Delete["g"]) != 1 || act.Delete["g"][0] != ids[2] || len(act.Failures) != 1 || act.Failures[0].Reason != "out-of-capacity" {
		t.Fatalf("actions %+v, want only %s deleted as a failed creation", act, ids[2])
	}
	rd := r.Group("g").Readiness
	if rd.FailedRunning != 2 || rd.InError != 1 || rd.Ready != 2 || rd.Upcoming != 0 {
		t.Fatalf("readiness %+v, want 2 Ready and failed-running, 1 in error, none upcoming", rd)
	}
	codes := map[string]string{}
	for _, f := range act.FailedRunning {
		if !f.New || f.Node == nil {
			t.Errorf("failed-running %+v: want it new, with its node", f)
		}
		codes[f.ProviderID] = f.Error.Code
	}
	if codes[ids[0]] != ext.Code || codes[ids[1]] != disk.Code || len(codes) != 2 {
		t.Fatalf("failed-running %v, want %s and %s", codes, ext.Code, disk.Code)
	}
	// Listed again, not new; nothing deleted.
	act = update(r, p, t0.Add(2*time.Minute), node(0), node(1))
	if len(act.FailedRunning) != 2 || act.FailedRunning[0].New || act.FailedRunning[1].New || len(act.Delete) != 0 {
		t.Fatalf("second update %+v, want the 2 listed again, not new, nothing deleted", act)
	}
	// Machine 0 repaired: recovered. Machine 1's node goes NotReady and its
	// VM reports no power state: a failed machine that does not run.
	g.SetInstanceFailure(ids[0], true, nil)
	act = update(r, p, t0.Add(3*time.Minute), node(0), node(1, to.NotReady()))
	if len(act.FailedRunningRecovered) != 1 || act.FailedRunningRecovered[0].ProviderID != ids[0] || act.FailedRunningRecovered[0].Error.Code != ext.Code {
		t.Fatalf("recovered %+v, want %s (was %s)", act.FailedRunningRecovered, ids[0], ext.Code)
	}
	if len(act.FailedRunning) != 0 || len(act.Delete["g"]) != 1 || act.Delete["g"][0] != ids[1] {
		t.Fatalf("actions %+v, want nothing failed-running and %s listed for deletion", act, ids[1])
	}
}

// TestEvictedInstancesAreDeletedWithoutBackoff: a machine the cloud took
// back (ClassEvicted: a Spot VM deallocated) is listed for deletion once,
// counted in error, with no failure and no backoff (the core counts
// evictions); while its node still says Ready it may run pods, and is
// kept as a machine failed while it runs.
func TestEvictedInstancesAreDeletedWithoutBackoff(t *testing.T) {
	p := inmemory.New()
	g := p.AddGroup("spot", 0, 10, to.Node("t", "1", "1Gi"), inmemory.WithTarget(3))
	ids := g.ProviderIDs()
	ready := to.Node("n2", "1", "1Gi", to.ProviderID(ids[2]))
	r := NewRegistry(opts())
	update(r, p, t0, ready)
	if err := g.Evict(true, ids[0], ids[2]); err != nil {
		t.Fatal(err)
	}
	act := update(r, p, t0.Add(time.Minute), ready)
	if got := act.Delete["spot"]; len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("deletions %v, want the evicted machine without a node, %s", act.Delete, ids[0])
	}
	if len(act.Failures) != 0 {
		t.Fatalf("failures %+v for evictions", act.Failures)
	}
	gs := r.Group("spot")
	if gs.Backoff.Active || gs.Readiness.InError != 1 || gs.Readiness.FailedRunning != 1 {
		t.Fatalf("backoff %+v, readiness %+v; want none, 1 in error, 1 failed while running", gs.Backoff, gs.Readiness)
	}
	if act := update(r, p, t0.Add(2*time.Minute), ready); len(act.Delete["spot"]) != 0 {
		t.Fatalf("deletions %v asked again", act.Delete)
	}
}
