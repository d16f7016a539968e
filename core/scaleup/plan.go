package scaleup

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// Candidate is a node group the planner may scale.
type Candidate struct {
	Group string
	// Template is the group's template node with its DaemonSet pods; nil
	// when the group cannot be used (Skip says why).
	Template fwk.NodeInfo
	// Limit is how many nodes the group may still add (max − target).
	Limit int
	// Skip, when set, is why the group is not considered this loop
	// ("in backoff until 10:42 after quota error", "size unknown"), and
	// SkipCode the reason's code.
	Skip     string
	SkipCode ReasonCode
	// GPUPodsOnly keeps pods that request no GPU from growing this group:
	// a CPU pod must never buy an 8-GPU machine.
	GPUPodsOnly bool
	// Refuse, when set, names why a pod group may not grow this group
	// (e.g. a borrower and a team's group); "" allows it.
	Refuse func(*simulator.Group) string
}

// ScaleUp is a group the planner asked for nodes.
type ScaleUp struct {
	Group string
	Delta int
	Pods  []*apiv1.Pod
	// Queued is the part of the plan the node-addition queue held back
	// (set by the core after the queue decided; Delta is what was requested).
	Queued int
	// Balloon marks demand for balloon pods: the queue's lowest class.
	Balloon bool
	// Last marks demand released after all other demand of its class
	// (capacity buffers' chunks, behind balloons).
	Last bool
	// Gang names the gang the nodes are for: the queue releases all the
	// gang's nodes together, across groups, or none.
	Gang string
}

// Failed is a scale-up the cloud refused.
type Failed struct {
	Group string
	Delta int
	Err   error
	Pods  []*apiv1.Pod
}

// NoScaleUp is a set of pods no group was asked for, and why: Reason in
// words (the groups' reasons, counted), Code the reason most groups gave.
type NoScaleUp struct {
	Pods   []*apiv1.Pod
	Reason string
	Code   ReasonCode
}

// Result is the outcome of a planning round.
type Result struct {
	ScaleUps []ScaleUp
	Failed   []Failed
	NoScale  []NoScaleUp
	// Placed are the gangs (keys) whose minimum fits on ready and coming
	// nodes: they need no new nodes.
	Placed []string
	// Fork holds the simulated cluster with the new nodes and their pods.
	Fork *snapshot.Fork
}

// Planner runs the estimator and expander over the candidates.
type Planner struct {
	Estimator *Estimator
	Expander  *Chain
	// EstimateEach turns off the sharing of estimates between equivalent
	// groups (equivalent.go): every group is estimated for itself. For
	// tests that compare the two.
	EstimateEach bool
}

// Plan estimates every usable group for the pending pods, takes the
// expander's choice, and repeats for the pods that choice does not help,
// each group at most once per loop. It states demand only: nothing is
// requested from the cloud here (the Orchestrator does that). maxNew caps
// the nodes added in total (--max-nodes-total minus the cluster's current
// size).
func (p *Planner) Plan(ctx context.Context, fork *snapshot.Fork, pending []Pending, cands []Candidate, maxNew int) Result {
	res := Result{Fork: fork}
	st := &planning{fork: fork, pending: append([]Pending(nil), pending...), maxNew: maxNew}
	// reasons[i][group] is why node group `group` cannot take pending group i.
	st.reasons = make([]map[string]reason, len(st.pending))
	for i := range st.reasons {
		st.reasons[i] = map[string]reason{}
	}
	usable := st.usable(cands)
	if !p.EstimateEach {
		st.classes = equivalentClasses(fork, st.pending, usable)
	}
	for len(usable) > 0 && anyLeft(st.pending) {
		options, limits := p.estimateRound(ctx, st, usable)
		if len(options) == 0 {
			break
		}
		chosen, ok := p.confirm(ctx, st, usable, limits, p.Expander.Pick(options))
		if !ok {
			st.classes = nil
			continue
		}
		res.ScaleUps = append(res.ScaleUps, ScaleUp{Group: chosen.Group, Delta: chosen.Estimate.NewNodes, Pods: placedPods(st.pending, chosen.Estimate)})
		st.take(chosen.Estimate)
		res.Fork = st.fork
		usable = removeCandidate(usable, chosen.Group)
	}
	for i, pg := range st.pending {
		if pg.Left() <= 0 {
			continue
		}
		res.NoScale = append(res.NoScale, noScaleUp(pg, st.reasons[i], len(cands)))
	}
	return res
}

// planning is one Plan's state: the simulated cluster with the nodes
// chosen so far, the pods still pending, why each group cannot take each
// pending group, the groups' equivalence classes (nil: every group
// estimated for itself) and the nodes that may still be added.
type planning struct {
	fork    *snapshot.Fork
	pending []Pending
	reasons []map[string]reason
	classes map[string]string
	maxNew  int
}

// usable is the candidates the planner may estimate; a skipped one (or
// one without a template) gives every pending group its reason.
func (st *planning) usable(cands []Candidate) []Candidate {
	usable := make([]Candidate, 0, len(cands))
	for _, c := range cands {
		if c.Skip != "" || c.Template == nil {
			for i := range st.reasons {
				st.reasons[i][c.Group] = c.skipReason()
			}
			continue
		}
		usable = append(usable, c)
	}
	return usable
}

// estimateRound estimates every usable group within its limit (and the
// nodes left in total), recording why each leaves pods: the options are
// the groups that add nodes, limits each estimated group's bound.
func (p *Planner) estimateRound(ctx context.Context, st *planning, usable []Candidate) ([]*Option, map[string]int) {
	var options []*Option
	// shared[class and limit] is the estimate of the class's first
	// group by ID this round.
	shared := map[string]*Estimate{}
	limits := make(map[string]int, len(usable))
	for _, c := range sortedByGroup(usable) {
		limit := min(c.Limit, st.maxNew)
		if limit <= 0 {
			st.noRoom(c)
			continue
		}
		limits[c.Group] = limit
		est := p.estimateShared(ctx, st, c, limit, shared)
		st.recordReasons(est, c, limit)
		if est.NewNodes > 0 {
			options = append(options, &Option{Group: c.Group, Estimate: est})
		}
	}
	return options, limits
}

// noRoom records, for the pods still pending, that group c can add no
// node: its max size, or --max-nodes-total.
func (st *planning) noRoom(c Candidate) {
	why := reason{ReasonMaxSize, fmt.Sprintf("max size %s reached", c.Group)}
	if st.maxNew <= 0 {
		why = reason{ReasonMaxNodesTotal, "max-nodes-total reached"}
	}
	for i := range st.pending {
		if st.pending[i].Left() > 0 {
			st.reasons[i][c.Group] = why
		}
	}
}

// estimateShared is group c's estimate within limit: its class's when
// an equivalent group was estimated this round (shared), else its own.
func (p *Planner) estimateShared(ctx context.Context, st *planning, c Candidate, limit int, shared map[string]*Estimate) *Estimate {
	key, ok := st.classes[c.Group]
	key += "\x00" + strconv.Itoa(limit)
	est := shared[key]
	if !ok || est == nil {
		est = p.Estimator.Estimate(ctx, st.fork, st.pending, c.Group, c.Template, limit, c.GPUPodsOnly, c.Refuse)
		if ok {
			shared[key] = est
		}
	}
	return est
}

// recordReasons records why group c's estimate leaves the rest of each
// pending group.
func (st *planning) recordReasons(est *Estimate, c Candidate, limit int) {
	for i := range est.Reasons {
		if r := estimateReason(est, i, c, limit); r.msg != "" && est.Placed[i] < st.pending[i].Left() {
			st.reasons[i][c.Group] = r
		}
	}
}

// confirm estimates the chosen group for itself when its estimate was an
// equivalent group's, so the fork holds its own nodes; ok is false when
// that estimate adds no node (the groups were not equivalent after all).
func (p *Planner) confirm(ctx context.Context, st *planning, usable []Candidate, limits map[string]int, chosen *Option) (*Option, bool) {
	if chosen.Estimate.Group == chosen.Group {
		return chosen, true
	}
	c := candidateOf(usable, chosen.Group)
	chosen = &Option{Group: c.Group, Estimate: p.Estimator.Estimate(ctx, st.fork, st.pending, c.Group, c.Template, limits[c.Group], c.GPUPodsOnly, c.Refuse)}
	if chosen.Estimate.NewNodes == 0 {
		// Not equivalent after all (the class key missed something):
		// no group is dropped for it, the next round decides again.
		klog.FromContext(ctx).Info("Estimate shared by equivalent node groups did not hold for the chosen one; planning again", "group", c.Group)
		return nil, false
	}
	return chosen, true
}

// take moves the plan past a chosen estimate: its fork, its nodes and
// the pods it places.
func (st *planning) take(est *Estimate) {
	st.fork = est.Fork()
	st.maxNew -= est.NewNodes
	for i := range st.pending {
		st.pending[i].From += est.Placed[i]
	}
}

func anyLeft(p []Pending) bool {
	for _, x := range p {
		if x.Left() > 0 {
			return true
		}
	}
	return false
}

func placedPods(pending []Pending, est *Estimate) []*apiv1.Pod {
	var out []*apiv1.Pod
	for i, n := range est.Placed {
		if n > 0 {
			out = append(out, pending[i].G.Pods[pending[i].From:pending[i].From+n]...)
		}
	}
	return out
}

// sortedByGroup returns the candidates ordered by group ID (the expander's
// tie-break), so a class's shared estimate is its first group's.
func sortedByGroup(cs []Candidate) []Candidate {
	out := append([]Candidate(nil), cs...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

func candidateOf(cs []Candidate, group string) Candidate {
	for _, c := range cs {
		if c.Group == group {
			return c
		}
	}
	return Candidate{}
}

func removeCandidate(cs []Candidate, group string) []Candidate {
	out := make([]Candidate, 0, len(cs))
	for _, c := range cs {
		if c.Group != group {
			out = append(out, c)
		}
	}
	return out
}

// summarize folds per-group reasons into one message, most common first:
// "2 node groups: Insufficient nvidia.com/gpu; 1 node group: node(s) had untolerated taint(s)".
func summarize(byGroup map[string]reason, total int) string {
	if total == 0 {
		return "no node groups"
	}
	count := map[string]int{}
	for _, rr := range byGroup {
		r := rr.msg
		if r == "" {
			r = "pod does not fit"
		}
		count[r]++
	}
	if len(count) == 0 {
		return "no node group can take the pod"
	}
	type rc struct {
		r string
		n int
	}
	var list []rc
	for r, n := range count {
		list = append(list, rc{r, n})
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].n != list[j].n {
			return list[i].n > list[j].n
		}
		return list[i].r < list[j].r
	})
	parts := make([]string, 0, len(list))
	for _, x := range list {
		noun := "node groups"
		if x.n == 1 {
			noun = "node group"
		}
		parts = append(parts, fmt.Sprintf("%d %s: %s", x.n, noun, x.r))
	}
	return strings.Join(parts, "; ")
}

// skipReason is why a skipped group takes no pod.
func (c Candidate) skipReason() reason {
	code := c.SkipCode
	if code == "" {
		code = ReasonNoTemplate
	}
	return reason{code, c.Skip}
}

// estimateReason is why group c's estimate left pending group i's rest:
// its max size (or --max-nodes-total, when limit is below the group's
// room), or the estimator's reason.
func estimateReason(est *Estimate, i int, c Candidate, limit int) reason {
	r := reason{est.Codes[i], est.Reasons[i]}
	if r.msg == "max-size" {
		r = reason{ReasonMaxSize, fmt.Sprintf("node group %s would exceed its max size", c.Group)}
		if limit < c.Limit {
			r = reason{ReasonMaxNodesTotal, "max-nodes-total reached"}
		}
	}
	return r
}

// noScaleUp is pending group pg's pods no group was asked for, with the
// groups' reasons counted in words and the code most gave.
func noScaleUp(pg Pending, byGroup map[string]reason, groups int) NoScaleUp {
	code := dominant(byGroup)
	if len(byGroup) == 0 && groups > 0 {
		code = ReasonDoesNotFit
	}
	return NoScaleUp{Pods: pg.G.Pods[pg.From:], Reason: summarize(byGroup, groups), Code: code}
}
