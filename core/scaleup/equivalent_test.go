package scaleup

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// planText is a plan as text: each scale-up with its pods, then each
// no-scale-up with its reason.
func planText(r Result) string {
	var b strings.Builder
	for _, su := range r.ScaleUps {
		fmt.Fprintf(&b, "%s+%d:", su.Group, su.Delta)
		for _, p := range su.Pods {
			b.WriteString(" " + p.Name)
		}
		b.WriteString("\n")
	}
	for _, ns := range r.NoScale {
		fmt.Fprintf(&b, "none (%s):", ns.Reason)
		for _, p := range ns.Pods {
			b.WriteString(" " + p.Name)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func zoneClaim(p *apiv1.Pod) {
	p.Spec.Volumes = append(p.Spec.Volumes, apiv1.Volume{Name: "data", VolumeSource: apiv1.VolumeSource{
		PersistentVolumeClaim: &apiv1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}})
}

func antiByZone(p *apiv1.Pod) {
	p.Spec.Affinity = &apiv1.Affinity{PodAntiAffinity: &apiv1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []apiv1.PodAffinityTerm{{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}, TopologyKey: apiv1.LabelTopologyZone}}}}
}

// TestSharedEstimatesPlanAsEstimatingEach: planning with estimates shared
// between equivalent groups gives exactly the plan of estimating every
// group for itself — for identical groups, and for groups that differ in
// what a pod selects, tolerates, claims, or what a running pod's
// anti-affinity keys on — and estimates fewer times when groups are alike.
func TestSharedEstimatesPlanAsEstimatingEach(t *testing.T) {
	gpuNode := func(name string, opts ...to.NodeOption) fwk.NodeInfo {
		o := append([]to.NodeOption{to.NodeGPUs(8), to.NodeLabels("pool", name, apiv1.LabelTopologyZone, "z"+name[len(name)-1:])}, opts...)
		return tmplInfo(to.Node(name, "96", "900Gi", o...), to.Pod("ds-"+name, to.Requests("1", "1Gi")))
	}
	same := func(n int, limit int) []Candidate {
		var cs []Candidate
		for i := n - 1; i >= 0; i-- { // not in ID order: the class's estimate is still its first group's
			g := fmt.Sprintf("gpu-%d", i)
			cs = append(cs, Candidate{Group: g, Template: gpuNode(g), Limit: limit, GPUPodsOnly: true})
		}
		return cs
	}
	whole := []to.PodOption{to.Requests("90", "800Gi"), to.GPUs(8)}
	half := []to.PodOption{to.Requests("40", "400Gi"), to.GPUs(4)}
	dbNode := to.Node("db-node", "8", "8Gi", to.NodeLabels(apiv1.LabelTopologyZone, "z1"))
	db := to.Pod("db", to.Labels("app", "db"), to.OnNode("db-node"))
	antiByZone(db)
	tests := []struct {
		name     string
		expander []string
		cands    []Candidate
		existing []fwk.NodeInfo
		pods     [][]*apiv1.Pod
		// fewer: sharing must estimate fewer times than estimating each.
		fewer bool
	}{
		{name: "identical groups", cands: same(6, 4), pods: [][]*apiv1.Pod{podsOf(14, "t", whole...), podsOf(9, "h", half...)}, fewer: true},
		{name: "identical groups with different limits", cands: append(same(3, 2), Candidate{Group: "gpu-9", Template: gpuNode("gpu-9"), Limit: 7, GPUPodsOnly: true}),
			pods: [][]*apiv1.Pod{podsOf(12, "t", whole...)}, fewer: true},
		{name: "pods select one pool", cands: same(5, 4), pods: [][]*apiv1.Pod{podsOf(3, "t", append(whole, to.NodeSelector("pool", "gpu-3"))...)}},
		{name: "pods select one zone", cands: same(5, 2), pods: [][]*apiv1.Pod{podsOf(3, "t", append(whole, to.NodeSelector(apiv1.LabelTopologyZone, "z2"))...),
			podsOf(4, "w", whole...)}},
		{name: "one group tainted", cands: append(same(3, 4), Candidate{Group: "gpu-a", Template: gpuNode("gpu-a", to.Taint("team", "a")), Limit: 4, GPUPodsOnly: true}),
			pods: [][]*apiv1.Pod{podsOf(6, "t", whole...), podsOf(2, "team", append(whole, to.Tolerate("team", "a"))...)}},
		{name: "pods claim volumes", cands: same(4, 3), pods: [][]*apiv1.Pod{podsOf(5, "t", append(whole, zoneClaim)...)}},
		{name: "a running pod's anti-affinity by zone", cands: same(4, 3), existing: []fwk.NodeInfo{snapshot.NewNodeInfo(dbNode, db)},
			pods: [][]*apiv1.Pod{podsOf(5, "t", append(whole, to.Labels("app", "db"))...)}},
		{name: "priority prefers a later group", expander: []string{Priority, LeastWaste}, cands: same(5, 3),
			pods: [][]*apiv1.Pod{podsOf(8, "t", whole...)}, fewer: true},
		{name: "random expander", expander: []string{Random}, cands: same(5, 3), pods: [][]*apiv1.Pod{podsOf(8, "t", whole...)}, fewer: true},
	}
	prio, err := ParsePriorities("10:\n- gpu-3\n- gpu-1\n1:\n- .*\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan := func(each bool) (string, int) {
				p, n := countingPlanner(t, tc.expander, prio, each)
				fork := snapshot.New(tc.existing, to.GPU).Fork()
				res := p.Plan(context.Background(), fork, pendingPodsOf(tc.pods...), tc.cands, 1000)
				return planText(res), *n
			}
			compareSharing(t, plan, tc.fewer)
		})
	}
}

// compareSharing plans with shared estimates and estimating each group
// (plan returns the plan as text and the estimates made): the plans must
// be equal, and with fewer set sharing must estimate fewer times.
func compareSharing(t *testing.T, plan func(each bool) (string, int), fewer bool) {
	t.Helper()
	want, each := plan(true)
	got, shared := plan(false)
	if got != want {
		t.Fatalf("plan with shared estimates:\n%s\nplan estimating each group:\n%s", got, want)
	}
	if fewer && shared >= each {
		t.Fatalf("%d estimates shared, %d estimating each: nothing shared", shared, each)
	}
	t.Logf("%d estimates (%d estimating each) for %s", shared, each, got)
}

// countingPlanner is a planner with the expanders named (least-waste when
// none) that counts its estimates.
func countingPlanner(t *testing.T, expanders []string, prio *Priorities, each bool) (*Planner, *int) {
	t.Helper()
	if expanders == nil {
		expanders = []string{LeastWaste}
	}
	chain, err := NewChain(expanders, to.GPU, func() *Priorities { return prio }, rand.New(rand.NewPCG(7, 7)))
	if err != nil {
		t.Fatal(err)
	}
	n := new(int)
	return &Planner{Estimator: &Estimator{Sim: newSim(t), count: n}, Expander: chain, EstimateEach: each}, n
}

// TestEquivalentClasses: which templates share a class, for which pods.
func TestEquivalentClasses(t *testing.T) {
	node := func(name, zone string, opts ...to.NodeOption) *apiv1.Node {
		return to.Node(name, "96", "900Gi", append([]to.NodeOption{to.NodeGPUs(8), to.NodeLabels("pool", name, apiv1.LabelTopologyZone, zone)}, opts...)...)
	}
	ds := func(name string) *apiv1.Pod { return to.Pod("ds-"+name, to.Requests("1", "1Gi")) }
	cand := func(n *apiv1.Node, pods ...*apiv1.Pod) Candidate {
		return Candidate{Group: n.Name, Template: tmplInfo(n, pods...), Limit: 5, GPUPodsOnly: true}
	}
	plain := podsOf(2, "t", to.GPUs(8))
	dbNode := to.Node("db-node", "8", "8Gi", to.NodeLabels(apiv1.LabelTopologyZone, "z1"))
	db := to.Pod("db", to.Labels("app", "db"), to.OnNode("db-node"))
	antiByZone(db)
	tests := []struct {
		name     string
		a, b     Candidate
		pods     []*apiv1.Pod
		existing []fwk.NodeInfo
		same     bool
	}{
		{name: "names, pools, zones and hostnames nobody reads", a: cand(node("g1", "z1"), ds("g1")), b: cand(node("g2", "z2"), ds("g2")), pods: plain, same: true},
		{name: "a taint", a: cand(node("g1", "z1")), b: cand(node("g2", "z1", to.Taint("team", "a"))), pods: plain},
		{name: "allocatable", a: cand(node("g1", "z1")), b: cand(to.Node("g2", "96", "800Gi", to.NodeGPUs(8), to.NodeLabels("pool", "g2", apiv1.LabelTopologyZone, "z1"))), pods: plain},
		{name: "DaemonSet requests", a: cand(node("g1", "z1"), ds("g1")), b: cand(node("g2", "z1"), to.Pod("ds-g2", to.Requests("2", "1Gi"))), pods: plain},
		{name: "GPU pods only", a: cand(node("g1", "z1")), b: Candidate{Group: "g2", Template: tmplInfo(node("g2", "z1")), Limit: 5}, pods: plain},
		{name: "a refuse rule", a: cand(node("g1", "z1")), b: Candidate{Group: "g2", Template: tmplInfo(node("g2", "z1")), Limit: 5, GPUPodsOnly: true,
			Refuse: func(*simulator.Group) string { return "" }}, pods: plain},
		{name: "a pod selects the pool", a: cand(node("g1", "z1")), b: cand(node("g2", "z1")), pods: podsOf(1, "s", to.NodeSelector("pool", "g1"))},
		{name: "a pod spreads by zone", a: cand(node("g1", "z1")), b: cand(node("g2", "z2")), pods: podsOf(1, "s", func(p *apiv1.Pod) {
			p.Spec.TopologySpreadConstraints = []apiv1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: apiv1.LabelTopologyZone, WhenUnsatisfiable: apiv1.DoNotSchedule,
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "s"}}}}
		})},
		{name: "a pod claims a volume", a: cand(node("g1", "z1")), b: cand(node("g2", "z2")), pods: podsOf(1, "v", zoneClaim)},
		{name: "a volume, labels equal", a: cand(node("g1", "z1")), b: cand(to.Node("g2", "96", "900Gi", to.NodeGPUs(8), to.NodeLabels("pool", "g1", apiv1.LabelTopologyZone, "z1"))),
			pods: podsOf(1, "v", zoneClaim), same: true},
		{name: "a running pod's anti-affinity by zone", a: cand(node("g1", "z1")), b: cand(node("g2", "z2")), pods: plain, existing: []fwk.NodeInfo{snapshot.NewNodeInfo(dbNode, db)}},
		{name: "a template pod with a host port", a: cand(node("g1", "z1"), to.Pod("ds", to.HostPort(9100))), b: cand(node("g2", "z1"), to.Pod("ds", to.HostPort(9100))), pods: plain},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fork := snapshot.New(tc.existing, to.GPU).Fork()
			classes := equivalentClasses(fork, pendingPodsOf(tc.pods), []Candidate{tc.a, tc.b})
			ka, oka := classes[tc.a.Group]
			kb, okb := classes[tc.b.Group]
			if same := oka && okb && ka == kb; same != tc.same {
				t.Fatalf("same class: %v, want %v (keys %q, %q)", same, tc.same, ka, kb)
			}
		})
	}
}

// TestSharedEstimatesPlanGangsAsEstimatingEach: the gang planner gives the
// same plan (or the same reason for none) with shared estimates.
func TestSharedEstimatesPlanGangsAsEstimatingEach(t *testing.T) {
	gpuNode := func(name string, opts ...to.NodeOption) fwk.NodeInfo {
		return tmplInfo(to.Node(name, "96", "900Gi", append([]to.NodeOption{to.NodeGPUs(8), to.NodeLabels("pool", name)}, opts...)...))
	}
	same := func(n, limit int) []Candidate {
		var cs []Candidate
		for i := n - 1; i >= 0; i-- {
			g := fmt.Sprintf("gpu-%d", i)
			cs = append(cs, Candidate{Group: g, Template: gpuNode(g), Limit: limit, GPUPodsOnly: true})
		}
		return cs
	}
	whole := []to.PodOption{to.Requests("90", "800Gi"), to.GPUs(8)}
	prio, err := ParsePriorities("10:\n- gpu-3\n1:\n- .*\n")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		expander []string
		cands    []Candidate
		members  []*apiv1.Pod
		split    bool
		fewer    bool
	}{
		{name: "one of identical groups", cands: same(5, 10), members: podsOf(8, "g", whole...), fewer: true},
		{name: "too big for any group", cands: same(4, 3), members: podsOf(8, "g", whole...), fewer: true},
		{name: "split over identical groups", cands: same(4, 3), members: podsOf(8, "g", whole...), split: true, fewer: true},
		{name: "priority prefers a later group", expander: []string{Priority, LeastWaste}, cands: same(5, 10), members: podsOf(8, "g", whole...), fewer: true},
		{name: "only the tainted group tolerated", cands: append(same(3, 10), Candidate{Group: "gpu-t", Template: gpuNode("gpu-t", to.Taint("team", "a")), Limit: 10, GPUPodsOnly: true}),
			members: podsOf(6, "g", append(whole, to.Tolerate("team", "a"), to.NodeSelector("pool", "gpu-t"))...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan := func(each bool) (string, int) {
				p, n := countingPlanner(t, tc.expander, prio, each)
				o := &Orchestrator{Planner: p, GPU: to.GPU}
				gg := &gang.Gang{Key: gang.Key{Namespace: "default", Name: "g"}, Min: len(tc.members), MinKnown: true, Pending: tc.members}
				gp, why := o.gangNodes(context.Background(), gg, snapshot.New(nil, to.GPU).Fork(), pendingPodsOf(tc.members), tc.cands, len(tc.members), 1000, tc.split)
				if gp == nil {
					return "none: " + why, *n
				}
				var b strings.Builder
				for _, su := range gp.scaleUps {
					fmt.Fprintf(&b, "%s+%d ", su.Group, su.Delta)
				}
				return b.String(), *n
			}
			compareSharing(t, plan, tc.fewer)
		})
	}
}
