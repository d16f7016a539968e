package scaledown

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/simtest"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

var rs = to.ControlledBy("ReplicaSet", "web", "rs-web")

func pdb(ns string, allowed int32, kv ...string) *policyv1.PodDisruptionBudget {
	sel := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		sel[kv[i]] = kv[i+1]
	}
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "pdb", Namespace: ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
	}
}

func annotate(k, v string) to.PodOption {
	return func(p *apiv1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}

func emptyDir(medium apiv1.StorageMedium) to.PodOption {
	return func(p *apiv1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, apiv1.Volume{Name: "scratch", VolumeSource: apiv1.VolumeSource{EmptyDir: &apiv1.EmptyDirVolumeSource{Medium: medium}}})
	}
}

func TestPodsToMove(t *testing.T) {
	ds := to.ControlledBy("DaemonSet", "agent", "ds-agent")
	rules := Rules{SkipNodesWithSystemPods: true, SkipNodesWithLocalStorage: true}
	tests := []struct {
		name   string
		pods   []*apiv1.Pod
		pdbs   []*policyv1.PodDisruptionBudget
		rules  Rules
		want   Reason
		nMoved int
	}{
		{name: "replicated pod moves", pods: []*apiv1.Pod{to.Pod("a", rs)}, rules: rules, nMoved: 1},
		{name: "daemonset and mirror pods stay with the node", pods: []*apiv1.Pod{to.Pod("d", ds), to.Pod("m", annotate(mirrorPodAnnotation, "x"))}, rules: rules},
		{name: "no controller", pods: []*apiv1.Pod{to.Pod("bare")}, rules: rules, want: ReasonNotReplicated},
		{name: "no controller but safe-to-evict", pods: []*apiv1.Pod{to.Pod("bare", annotate(SafeToEvictAnnotation, "true"))}, rules: rules, nMoved: 1},
		{name: "safe-to-evict false", pods: []*apiv1.Pod{to.Pod("a", rs, annotate(SafeToEvictAnnotation, "false"))}, rules: rules, want: ReasonSafeToEvictFalse},
		{name: "kube-system without pdb", pods: []*apiv1.Pod{to.Pod("dns", rs, to.Namespace("kube-system"))}, rules: rules, want: ReasonKubeSystem},
		{name: "kube-system without pdb, rule off", pods: []*apiv1.Pod{to.Pod("dns", rs, to.Namespace("kube-system"))}, rules: Rules{SkipNodesWithLocalStorage: true}, nMoved: 1},
		{name: "kube-system with pdb", pods: []*apiv1.Pod{to.Pod("dns", rs, to.Namespace("kube-system"), to.Labels("k", "dns"))},
			pdbs: []*policyv1.PodDisruptionBudget{pdb("kube-system", 1, "k", "dns")}, rules: rules, nMoved: 1},
		{name: "local storage", pods: []*apiv1.Pod{to.Pod("a", rs, emptyDir(""))}, rules: rules, want: ReasonLocalStorage},
		{name: "memory emptyDir is not local storage", pods: []*apiv1.Pod{to.Pod("a", rs, emptyDir(apiv1.StorageMediumMemory))}, rules: rules, nMoved: 1},
		{name: "local storage, rule off", pods: []*apiv1.Pod{to.Pod("a", rs, emptyDir(""))}, rules: Rules{}, nMoved: 1},
		{name: "pdb allows none", pods: []*apiv1.Pod{to.Pod("a", rs, to.Labels("app", "web"))},
			pdbs: []*policyv1.PodDisruptionBudget{pdb("default", 0, "app", "web")}, rules: rules, want: ReasonPDB},
		{name: "pdb allows one of two", pods: []*apiv1.Pod{to.Pod("a", rs, to.Labels("app", "web")), to.Pod("b", rs, to.Labels("app", "web"))},
			pdbs: []*policyv1.PodDisruptionBudget{pdb("default", 1, "app", "web")}, rules: rules, want: ReasonPDB},
		{name: "pdb in another namespace", pods: []*apiv1.Pod{to.Pod("a", rs, to.Labels("app", "web"))},
			pdbs: []*policyv1.PodDisruptionBudget{pdb("other", 0, "app", "web")}, rules: rules, nMoved: 1},
		// A balloon must find room elsewhere, whatever the other rules say
		// (no controller check, kube-system without a PDB, no budget).
		{name: "free room (balloon) moves, past the other rules", pods: []*apiv1.Pod{to.Pod("balloon", to.Namespace("kube-system"), to.Labels("vmss-autoscaler.io/balloon", "g"))},
			rules: Rules{SkipNodesWithSystemPods: true, IsFreeRoom: func(p *apiv1.Pod) bool { return p.Labels["vmss-autoscaler.io/balloon"] != "" }}, nMoved: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			move, reason, why := PodsToMove(tc.pods, NewPDBs(tc.pdbs), tc.rules)
			if reason != tc.want || len(move) != tc.nMoved {
				t.Fatalf("reason %q (%s), %d pods to move; want %q, %d", reason, why, len(move), tc.want, tc.nMoved)
			}
		})
	}
}

func TestUtilization(t *testing.T) {
	n := to.Node("n", "10", "10Gi")
	pods := []*apiv1.Pod{
		to.Pod("a", rs, to.Requests("2", "1Gi")),
		to.Pod("ds", to.ControlledBy("DaemonSet", "x", "ds"), to.Requests("5", "5Gi")),
		to.Pod("done", rs, to.Requests("5", "5Gi"), func(p *apiv1.Pod) { p.Status.Phase = apiv1.PodSucceeded }),
	}
	u := UtilizationOf(n, pods, to.GPU, Rules{}, nil)
	if u.Max() != 0.2 || u.HasGPU {
		t.Fatalf("utilization %+v, want cpu 0.2 and no GPU (DaemonSet and finished pods excluded)", u)
	}
	// From the NodeInfo's aggregate (which never holds finished pods): the same answer.
	agg := snapshot.NewNodeInfo(n, pods[0], pods[1]).GetRequested()
	total := &Requested{MilliCPU: agg.GetMilliCPU(), Memory: agg.GetMemory()}
	if got := UtilizationOf(n, pods, to.GPU, Rules{}, total); got != u {
		t.Fatalf("utilization from the aggregate %+v, want %+v", got, u)
	}
	g := to.Node("g", "96", "900Gi", to.NodeGPUs(8))
	u = UtilizationOf(g, []*apiv1.Pod{to.Pod("t", rs, to.Requests("1", "1Gi"), to.GPUs(8))}, to.GPU, Rules{}, nil)
	if !u.HasGPU || u.Max() != 1 {
		t.Fatalf("gpu node utilization %+v, want 1 from GPUs", u)
	}
}

func TestBrake(t *testing.T) {
	t0 := time.Unix(0, 0)
	b := NewBrake(BrakeOptions{ClusterShare: 0.5, GroupShare: 0.5, Window: 10 * time.Minute})
	allowed := 0
	// A 10-node cluster in one group going NotReady at once: at most 5 go.
	for i := 0; i < 10; i++ {
		if b.Allow(t0, "g", 10-allowed, 10-allowed) {
			b.Record(t0, "g")
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("brake let %d of 10 nodes go within the window, want 5", allowed)
	}
	if !b.Allow(t0.Add(11*time.Minute), "g", 5, 5) {
		t.Fatal("brake still closed after the window")
	}
	small := NewBrake(BrakeOptions{ClusterShare: 0.5, GroupShare: 0.5, Window: time.Minute})
	if !small.Allow(t0, "g", 1, 1) {
		t.Fatal("a one-node cluster can never shrink")
	}
}

func newSim(t testing.TB) *simulator.Simulator { return simtest.New(t) }

type cluster struct {
	nodes []Node
	snap  *snapshot.Snapshot
}

func build(nodes []*apiv1.Node, group func(string) string, pods ...*apiv1.Pod) cluster {
	var c cluster
	var infos []fwk.NodeInfo
	for _, n := range nodes {
		var on []*apiv1.Pod
		for _, p := range pods {
			if p.Spec.NodeName == n.Name {
				on = append(on, p)
			}
		}
		infos = append(infos, snapshot.NewNodeInfo(n, on...))
		c.nodes = append(c.nodes, Node{Node: n, Pods: on, Group: group(n.Name), Ready: true,
			UnneededTime: 10 * time.Minute, UnreadyTime: 20 * time.Minute, UtilizationThreshold: 0.5, GPUUtilizationThreshold: 0.5})
	}
	c.snap = snapshot.New(infos, to.GPU)
	return c
}

func planner(t testing.TB) *Planner {
	return NewPlanner(Options{Rules: Rules{SkipNodesWithSystemPods: true, SkipNodesWithLocalStorage: true},
		MaxParallelism: 10, MaxEmptyBulkDelete: 10, GPU: to.GPU}, newSim(t),
		NewBrake(BrakeOptions{ClusterShare: 1, GroupShare: 1, Window: time.Minute}))
}

func names(rs []Removal) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Node.Name)
	}
	return out
}

func TestPlanUnneededTimeAndSimulation(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1000, 0)
	all := func(string) string { return "g" }
	pods := []*apiv1.Pod{
		// a and b each hold a small pod; c is busy with room for one more.
		to.Pod("pa", rs, to.Requests("1", "1Gi"), to.OnNode("a")),
		to.Pod("pb", rs, to.Requests("1", "1Gi"), to.OnNode("b")),
		to.Pod("pc", rs, to.Requests("6", "1Gi"), to.OnNode("c")),
	}
	c := build([]*apiv1.Node{to.Node("a", "8", "8Gi"), to.Node("b", "8", "8Gi"), to.Node("c", "8", "8Gi"), to.Node("e", "8", "8Gi")}, all, pods...)
	groups := map[string]*Group{"g": {Min: 0, Target: 4, Healthy: true}}
	p := planner(t)
	d := p.Plan(ctx, t0, c.snap, c.nodes, groups, NewPDBs(nil), 0)
	if len(d.Unneeded) != 3 || len(d.Empty)+len(d.Drain) != 0 {
		t.Fatalf("first pass: unneeded %v, removals %v %v; want 3 unneeded (a, b, e) and nothing removed yet", d.Unneeded, names(d.Empty), names(d.Drain))
	}
	d = p.Plan(ctx, t0.Add(9*time.Minute), c.snap, c.nodes, groups, NewPDBs(nil), 0)
	if len(d.Empty)+len(d.Drain) != 0 {
		t.Fatal("removed before the unneeded time")
	}
	d = p.Plan(ctx, t0.Add(10*time.Minute), c.snap, c.nodes, groups, NewPDBs(nil), 0)
	// e is empty and goes; a's pod moves (to b, c); the node receiving it
	// stays in this pass, so of a and b exactly one is drained.
	if fmt.Sprint(names(d.Empty)) != "[e]" || len(d.Drain) != 1 {
		t.Fatalf("removals empty %v drain %v; want [e] and one of a, b", names(d.Empty), names(d.Drain))
	}
}

func TestPlanPodOnlyFitsOnAnotherCandidate(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1000, 0)
	// a's pod only fits b (selector), b's pod only fits a: removing both
	// would strand them, so one stays.
	pods := []*apiv1.Pod{
		to.Pod("pa", rs, to.Requests("1", "1Gi"), to.NodeSelector("slot", "b"), to.OnNode("a")),
		to.Pod("pb", rs, to.Requests("1", "1Gi"), to.NodeSelector("slot", "a"), to.OnNode("b")),
	}
	c := build([]*apiv1.Node{to.Node("a", "8", "8Gi", to.NodeLabels("slot", "a")), to.Node("b", "8", "8Gi", to.NodeLabels("slot", "b"))},
		func(string) string { return "g" }, pods...)
	groups := map[string]*Group{"g": {Min: 0, Target: 2, Healthy: true}}
	p := planner(t)
	p.Plan(ctx, t0, c.snap, c.nodes, groups, NewPDBs(nil), 0)
	d := p.Plan(ctx, t0.Add(time.Hour), c.snap, c.nodes, groups, NewPDBs(nil), 0)
	if len(d.Drain) != 1 || d.Kept[ReasonNoPlaceToMove] != 1 {
		t.Fatalf("drain %v kept %v; want exactly one removed and one kept for no place to move", names(d.Drain), d.Kept)
	}
}

func TestPlanKeepsMinSizeAndDisabledNodes(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1000, 0)
	disabled := to.Node("d", "8", "8Gi")
	disabled.Annotations = map[string]string{ScaleDownDisabledAnnotation: "true"}
	c := build([]*apiv1.Node{to.Node("a", "8", "8Gi"), to.Node("b", "8", "8Gi"), to.Node("c", "8", "8Gi"), disabled},
		func(string) string { return "g" })
	groups := map[string]*Group{"g": {Min: 2, Target: 4, Healthy: true}}
	p := planner(t)
	p.Plan(ctx, t0, c.snap, c.nodes, groups, NewPDBs(nil), 0)
	d := p.Plan(ctx, t0.Add(time.Hour), c.snap, c.nodes, groups, NewPDBs(nil), 0)
	if len(d.Empty) != 2 || d.Kept[ReasonMinSize] != 1 || d.Kept[ReasonDisabled] != 1 {
		t.Fatalf("empty %v kept %v; want 2 removed (min 2 of 4), one kept for min size, the annotated one kept", names(d.Empty), d.Kept)
	}
	for _, r := range d.Empty {
		if r.Node.Name == "d" {
			t.Fatal("removed a scale-down-disabled node")
		}
	}
	groups["g"].Healthy = false
	p2 := planner(t)
	p2.Plan(ctx, t0, c.snap, c.nodes, groups, NewPDBs(nil), 0)
	if d := p2.Plan(ctx, t0.Add(time.Hour), c.snap, c.nodes, groups, NewPDBs(nil), 0); len(d.Empty) != 0 || d.Kept[ReasonGroupUnhealthy] == 0 {
		t.Fatalf("unhealthy group scaled down: %v %v", names(d.Empty), d.Kept)
	}
}

func TestPlanBrakeStopsMassDeletion(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1000, 0)
	var nodes []*apiv1.Node
	for i := 0; i < 10; i++ {
		nodes = append(nodes, to.Node(fmt.Sprintf("n%d", i), "8", "8Gi", to.NotReady()))
	}
	c := build(nodes, func(string) string { return "g" })
	for i := range c.nodes {
		c.nodes[i].Ready = false
	}
	groups := map[string]*Group{"g": {Min: 0, Target: 10, Healthy: true}}
	p := NewPlanner(Options{MaxParallelism: 10, MaxEmptyBulkDelete: 100, GPU: to.GPU}, newSim(t),
		NewBrake(BrakeOptions{ClusterShare: 0.5, GroupShare: 1, Window: 10 * time.Minute}))
	p.Plan(ctx, t0, c.snap, c.nodes, groups, NewPDBs(nil), 0)
	d := p.Plan(ctx, t0.Add(time.Hour), c.snap, c.nodes, groups, NewPDBs(nil), 0)
	if len(d.Empty) != 5 || !d.Braked || d.Kept[ReasonBrake] != 5 {
		t.Fatalf("removed %d, braked %v, kept %v; want 5 removed and the brake engaged for the rest", len(d.Empty), d.Braked, d.Kept)
	}
}

// TestPlannerKeepsUtilizationWhileTheNodeIsUnchanged: a node's utilisation
// is computed again when its Version changes, kept while it does not,
// dropped with the node, and forgotten on a reload.
func TestPlannerKeepsUtilizationWhileTheNodeIsUnchanged(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1000, 0)
	all := func(string) string { return "g" }
	groups := map[string]*Group{"g": {Min: 0, Target: 2, Healthy: true}}
	nodes := []*apiv1.Node{to.Node("a", "8", "8Gi"), to.Node("b", "8", "8Gi")}
	light := build(nodes, all, to.Pod("pa", rs, to.Requests("1", "1Gi"), to.OnNode("a")), to.Pod("pb", rs, to.Requests("7", "1Gi"), to.OnNode("b")))
	heavy := build(nodes, all, to.Pod("pa2", rs, to.Requests("6", "1Gi"), to.OnNode("a")), to.Pod("pb", rs, to.Requests("7", "1Gi"), to.OnNode("b")))
	versions := func(c cluster, a, b int64) cluster {
		c.nodes[0].Version, c.nodes[1].Version = a, b
		return c
	}
	p := planner(t)
	// b is busy: only its utilisation reads its pod (PodsToMove does not).
	readsOfB := 0
	o := p.opts
	o.Rules.IsFreeRoom = func(pod *apiv1.Pod) bool {
		if pod.Name == "pb" {
			readsOfB++
		}
		return false
	}
	p.SetOptions(o)
	unneeded := func(c cluster) string {
		d := p.Plan(ctx, t0, c.snap, c.nodes, groups, NewPDBs(nil), 0)
		return fmt.Sprint(d.Unneeded)
	}
	if got := unneeded(versions(light, 1, 1)); got != "[a]" {
		t.Fatalf("light: unneeded %s, want [a]", got)
	}
	entry := p.util["a"]
	if entry == nil || entry.version != 1 {
		t.Fatalf("utilisation of a not kept: %+v", entry)
	}
	reads := readsOfB
	if got := unneeded(versions(light, 1, 1)); got != "[a]" || p.util["a"] != entry || entry.version != 1 {
		t.Fatalf("unchanged: unneeded %s, entry %p (was %p)", got, p.util["a"], entry)
	}
	if readsOfB != reads {
		t.Fatalf("b's pods were read again (%d times) though b did not change", readsOfB-reads)
	}
	if got := unneeded(versions(heavy, 2, 1)); got != "[]" {
		t.Fatalf("a's pods changed (version 2): unneeded %s, want none", got)
	}
	if u := p.util["a"]; u.version != 2 || u.u.CPU != 0.75 {
		t.Fatalf("a after the change: %+v, want version 2 at 75%% CPU", u)
	}
	p.SetOptions(p.opts)
	if len(p.util) != 0 {
		t.Fatalf("a reload kept %d utilisations", len(p.util))
	}
	unneeded(versions(light, 1, 1))
	only := build(nodes[1:], all, to.Pod("pb", rs, to.Requests("7", "1Gi"), to.OnNode("b")))
	only.nodes[0].Version = 1
	unneeded(only)
	if _, ok := p.util["a"]; ok || len(p.util) != 1 {
		t.Fatalf("a node gone from the pass is still remembered (%d entries)", len(p.util))
	}
	// Version 0 (not known) is computed every pass and never kept.
	unneeded(versions(light, 0, 0))
	if len(p.util) != 0 {
		t.Fatalf("%d utilisations kept for nodes without a version", len(p.util))
	}
}
