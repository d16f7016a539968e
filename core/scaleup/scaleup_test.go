package scaleup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/simtest"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

func newSim(t testing.TB) *simulator.Simulator { return simtest.New(t) }

func podsOf(n int, prefix string, opts ...to.PodOption) []*apiv1.Pod {
	out := make([]*apiv1.Pod, n)
	for i := range out {
		o := append([]to.PodOption{to.ControlledBy("Job", prefix, types.UID("job-"+prefix)), to.Labels("app", prefix)}, opts...)
		out[i] = to.Pod(fmt.Sprintf("%s-%d", prefix, i), o...)
	}
	return out
}

func pendingPodsOf(pods ...[]*apiv1.Pod) []Pending {
	var all []*apiv1.Pod
	for _, p := range pods {
		all = append(all, p...)
	}
	var out []Pending
	for _, g := range simulator.GroupPods(all, to.GPU) {
		out = append(out, Pending{G: g})
	}
	return out
}

func tmplInfo(n *apiv1.Node, pods ...*apiv1.Pod) fwk.NodeInfo {
	return snapshot.NewNodeInfo(n, pods...)
}

func TestEstimator(t *testing.T) {
	sim := newSim(t)
	est := &Estimator{Sim: sim}
	gpuNode := to.Node("gpu", "96", "900Gi", to.NodeGPUs(8))
	cpuNode := to.Node("cpu", "16", "64Gi")
	dsPod := to.Pod("ds", to.Requests("2", "2Gi"))
	tests := []struct {
		name       string
		tmpl       fwk.NodeInfo
		existing   []*apiv1.Node
		pending    []Pending
		limit      int
		gpuOnly    bool
		wantNodes  int
		wantPlaced int
		wantReason string
	}{
		{name: "whole-node gpu pods", tmpl: tmplInfo(gpuNode), pending: pendingPodsOf(podsOf(7, "t", to.Requests("90", "800Gi"), to.GPUs(8))),
			limit: 100, wantNodes: 7, wantPlaced: 7},
		{name: "half-node gpu pods pair up", tmpl: tmplInfo(gpuNode), pending: pendingPodsOf(podsOf(7, "h", to.Requests("40", "400Gi"), to.GPUs(4))),
			limit: 100, wantNodes: 4, wantPlaced: 7},
		{name: "small pods binpack", tmpl: tmplInfo(cpuNode), pending: pendingPodsOf(podsOf(33, "w", to.Requests("1", "1Gi"))),
			limit: 100, wantNodes: 3, wantPlaced: 33},
		{name: "daemonset overhead counts", tmpl: tmplInfo(cpuNode, dsPod), pending: pendingPodsOf(podsOf(16, "w", to.Requests("1", "1Gi"))),
			limit: 100, wantNodes: 2, wantPlaced: 16},
		{name: "limit caps nodes", tmpl: tmplInfo(gpuNode), pending: pendingPodsOf(podsOf(7, "t", to.Requests("90", "800Gi"), to.GPUs(8))),
			limit: 3, wantNodes: 3, wantPlaced: 3, wantReason: "max-size"},
		{name: "pod bigger than node", tmpl: tmplInfo(cpuNode), pending: pendingPodsOf(podsOf(2, "big", to.Requests("32", "1Gi"))),
			limit: 100, wantNodes: 0, wantPlaced: 0, wantReason: "Insufficient cpu"},
		{name: "anti-affinity one per node", tmpl: tmplInfo(cpuNode), pending: pendingPodsOf(podsOf(4, "mpi", to.Requests("1", "1Gi"), to.AntiAffinity("app", "mpi"))),
			limit: 100, wantNodes: 4, wantPlaced: 4},
		// One existing (full) host with no matching pod keeps the minimum at 0.
		{name: "spread max skew 2 over new hosts", tmpl: tmplInfo(cpuNode), existing: []*apiv1.Node{to.Node("full", "0", "0")}, pending: pendingPodsOf(podsOf(6, "sp", to.Requests("1", "1Gi"), to.SpreadByHostname(2, "app", "sp"))),
			limit: 100, wantNodes: 3, wantPlaced: 6},
		{name: "gpu group keeps cpu pods out", tmpl: tmplInfo(gpuNode), pending: pendingPodsOf(podsOf(3, "w", to.Requests("1", "1Gi"))),
			limit: 100, gpuOnly: true, wantNodes: 0, wantReason: "requests no GPU"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var infos []fwk.NodeInfo
			for _, n := range tc.existing {
				infos = append(infos, snapshot.NewNodeInfo(n))
			}
			base := snapshot.New(infos, to.GPU).Fork()
			e := est.Estimate(context.Background(), base, tc.pending, "g", tc.tmpl, tc.limit, tc.gpuOnly, nil)
			if e.NewNodes != tc.wantNodes || e.PodsPlaced() != tc.wantPlaced {
				t.Fatalf("nodes %d placed %d, want nodes %d placed %d (reasons %q)", e.NewNodes, e.PodsPlaced(), tc.wantNodes, tc.wantPlaced, e.Reasons)
			}
			if tc.wantReason != "" && !strings.Contains(strings.Join(e.Reasons, "|"), tc.wantReason) {
				t.Fatalf("reasons %q, want one containing %q", e.Reasons, tc.wantReason)
			}
			if len(e.Nodes) != e.NewNodes {
				t.Fatalf("%d node infos for %d nodes", len(e.Nodes), e.NewNodes)
			}
		})
	}
}

func option(group string, nodes int, alloc, used string, gpus, usedGPUs int64, pods int) *Option {
	e := &Estimate{Group: group, NewNodes: nodes, Placed: []int{pods}}
	for i := 0; i < nodes; i++ {
		n := to.Node(fmt.Sprintf("%s-%d", group, i), alloc, "100Gi")
		var ps []*apiv1.Pod
		if gpus > 0 {
			to.NodeGPUs(gpus)(n)
		}
		p := to.Pod(fmt.Sprintf("%s-p%d", group, i), to.Requests(used, "50Gi"))
		if usedGPUs > 0 {
			to.GPUs(usedGPUs)(p)
		}
		ps = append(ps, p)
		e.Nodes = append(e.Nodes, snapshot.NewNodeInfo(n, ps...))
	}
	return &Option{Group: group, Estimate: e}
}

func TestExpanders(t *testing.T) {
	prio, err := ParsePriorities("10:\n  - ^cpu-.*\n50:\n  - ^gpu-h100$\n")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		chain   []string
		options []*Option
		want    string
	}{
		{name: "least-waste picks the fuller node", chain: []string{LeastWaste},
			options: []*Option{option("a", 1, "16", "4", 0, 0, 1), option("b", 1, "8", "4", 0, 0, 1)}, want: "b"},
		{name: "least-waste counts idle GPUs", chain: []string{LeastWaste},
			options: []*Option{option("a", 1, "16", "15", 8, 4, 1), option("b", 1, "16", "8", 4, 4, 1)}, want: "b"},
		{name: "least-waste tie goes to more pods", chain: []string{LeastWaste},
			options: []*Option{option("a", 1, "16", "8", 0, 0, 1), option("b", 1, "16", "8", 0, 0, 3)}, want: "b"},
		{name: "most-pods", chain: []string{MostPods},
			options: []*Option{option("a", 1, "16", "8", 0, 0, 5), option("b", 1, "16", "15", 0, 0, 2)}, want: "a"},
		{name: "priority then least-waste", chain: []string{Priority, LeastWaste},
			options: []*Option{option("cpu-a", 1, "16", "4", 0, 0, 1), option("cpu-b", 1, "8", "4", 0, 0, 1), option("other", 1, "4", "4", 0, 0, 1)}, want: "cpu-b"},
		{name: "priority highest wins", chain: []string{Priority},
			options: []*Option{option("cpu-a", 1, "16", "4", 0, 0, 1), option("gpu-h100", 1, "16", "4", 0, 0, 1)}, want: "gpu-h100"},
		{name: "ties resolve to lowest group id", chain: []string{MostPods},
			options: []*Option{option("z", 1, "16", "8", 0, 0, 1), option("m", 1, "16", "8", 0, 0, 1)}, want: "m"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewChain(tc.chain, to.GPU, func() *Priorities { return prio }, rand.New(rand.NewPCG(1, 1)))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Pick(tc.options); got.Group != tc.want {
				t.Fatalf("picked %s, want %s", got.Group, tc.want)
			}
		})
	}
}

func TestRandomExpanderUsesEveryOption(t *testing.T) {
	c, err := NewChain([]string{Random}, to.GPU, nil, rand.New(rand.NewPCG(7, 7)))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		opts := []*Option{option("a", 1, "16", "8", 0, 0, 1), option("b", 1, "16", "8", 0, 0, 1), option("c", 1, "16", "8", 0, 0, 1)}
		seen[c.Pick(opts).Group] = true
	}
	if len(seen) != 3 {
		t.Fatalf("random picked %v over 200 draws, want all three", seen)
	}
}

func TestChainAndPrioritiesErrors(t *testing.T) {
	if _, err := NewChain([]string{"cheapest"}, to.GPU, nil, nil); err == nil || !strings.Contains(err.Error(), `--expander: unknown expander "cheapest"`) {
		t.Fatalf("err = %v", err)
	}
	for _, bad := range []string{"ten: [a]", "10: ['(']", "not yaml: [", "10: a"} {
		if _, err := ParsePriorities(bad); err == nil {
			t.Errorf("ParsePriorities(%q) accepted", bad)
		}
	}
}

type recordingIncreaser struct {
	fail  map[string]error
	calls []string
}

func (r *recordingIncreaser) IncreaseSize(_ context.Context, g string, d int) error {
	r.calls = append(r.calls, fmt.Sprintf("%s+%d", g, d))
	return r.fail[g]
}

// releaseAll is a queue with smoothing off: everything at once.
type releaseAll struct{ refunded int }

func (q *releaseAll) Decide(_ time.Time, ds []ratelimit.Demand, _ int) ratelimit.Decision {
	d := ratelimit.Decision{ReleaseClass: map[string]map[ratelimit.Class]int{}, Queued: map[string]map[ratelimit.Class]int{}}
	for _, x := range ds {
		if d.ReleaseClass[x.Group] == nil {
			d.ReleaseClass[x.Group] = map[ratelimit.Class]int{}
		}
		d.ReleaseClass[x.Group][x.Class] += x.Count
	}
	return d
}

func (q *releaseAll) Refund(n int) { q.refunded += n }

func (q *releaseAll) Defer(_ string, n int, _ time.Time) { q.refunded += n }

func TestOrchestratorSplitsPodsAcrossGroupsAndFallsBack(t *testing.T) {
	sim := newSim(t)
	chain, _ := NewChain([]string{LeastWaste}, to.GPU, nil, nil)
	o := &Orchestrator{Planner: &Planner{Estimator: &Estimator{Sim: sim}, Expander: chain}, GPU: to.GPU}
	gpuTmpl := tmplInfo(to.Node("gpu", "96", "900Gi", to.NodeGPUs(8)))
	cpuTmpl := tmplInfo(to.Node("cpu", "16", "64Gi"))
	groups := []Group{
		{Candidate: Candidate{Group: "gpu-a", Template: gpuTmpl, Limit: 10, GPUPodsOnly: true}},
		{Candidate: Candidate{Group: "gpu-b", Template: gpuTmpl, Limit: 10, GPUPodsOnly: true}},
		{Candidate: Candidate{Group: "cpu", Template: cpuTmpl, Limit: 10}},
		{Candidate: Candidate{Group: "gpu-c", Skip: "node group in backoff"}},
	}
	inc := &recordingIncreaser{fail: map[string]error{"gpu-a": errors.New("quota")}}
	var pods []*apiv1.Pod
	for _, ps := range [][]*apiv1.Pod{podsOf(2, "t", to.Requests("90", "800Gi"), to.GPUs(8)), podsOf(8, "w", to.Requests("4", "8Gi")), podsOf(1, "huge", to.GPUs(16))} {
		pods = append(pods, ps...)
	}
	q := &releaseAll{}
	out, err := o.Run(context.Background(), Request{Snap: snapshot.New(nil, to.GPU), Groups: groups, MaxNew: 100, Passes: []Pass{{Pods: pods}}}, q, inc)
	if err != nil {
		t.Fatal(err)
	}
	res := out.Result
	want := []string{"gpu-a+2", "cpu+2", "gpu-b+2"}
	if strings.Join(inc.calls, ",") != strings.Join(want, ",") {
		t.Fatalf("increase calls %v, want %v: the refused group's pods planned again at once on the next best", inc.calls, want)
	}
	if q.refunded != 2 {
		t.Fatalf("refunded %d tokens, want the refused request's 2", q.refunded)
	}
	var got []string
	for _, su := range res.ScaleUps {
		if su.Delta > 0 {
			got = append(got, fmt.Sprintf("%s+%d", su.Group, su.Delta))
		}
	}
	if strings.Join(got, ",") != "cpu+2,gpu-b+2" || len(res.Failed) != 1 {
		t.Fatalf("scale-ups %v failed %+v", got, res.Failed)
	}
	if len(res.NoScale) != 1 || res.NoScale[0].Pods[0].Name != "huge-0" {
		t.Fatalf("no-scale %+v, want the 16-GPU pod", res.NoScale)
	}
	if res.Failed[0].Group != "gpu-a" || len(res.Failed[0].Pods) != 2 {
		t.Fatalf("failed %+v, want gpu-a for the 2 training pods", res.Failed[0])
	}
	for _, want := range []string{"3 node groups: Insufficient nvidia.com/gpu", "1 node group: node group in backoff"} {
		if !strings.Contains(res.NoScale[0].Reason, want) {
			t.Errorf("reason %q does not mention %q", res.NoScale[0].Reason, want)
		}
	}
}

// TestPassesShareAGroupsLimit: each pass gets its own copy of the
// candidates, less what earlier passes planned, so two passes never plan
// a group past its max size together.
func TestPassesShareAGroupsLimit(t *testing.T) {
	sim := newSim(t)
	chain, _ := NewChain([]string{LeastWaste}, to.GPU, nil, nil)
	o := &Orchestrator{Planner: &Planner{Estimator: &Estimator{Sim: sim}, Expander: chain}, GPU: to.GPU}
	groups := []Group{{Candidate: Candidate{Group: "gpu", Template: tmplInfo(to.Node("gpu", "96", "900Gi", to.NodeGPUs(8))), Limit: 5}}}
	whole := []to.PodOption{to.Requests("90", "800Gi"), to.GPUs(8)}
	req := Request{Snap: snapshot.New(nil, to.GPU), Groups: groups, MaxNew: 100, Passes: []Pass{
		{Pods: podsOf(4, "first", whole...)},
		{Pods: podsOf(4, "second", whole...)},
	}}
	inc := &recordingIncreaser{}
	out, err := o.Run(context.Background(), req, &releaseAll{}, inc)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(inc.calls, ",") != "gpu+5" {
		t.Fatalf("increase calls %v, want gpu+5: the group's max less what the first pass took", inc.calls)
	}
	if len(out.Result.NoScale) != 1 || len(out.Result.NoScale[0].Pods) != 3 {
		t.Fatalf("no-scale %+v, want the 3 pods of the second pass beyond the max", out.Result.NoScale)
	}
}
