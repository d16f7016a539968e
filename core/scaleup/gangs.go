package scaleup

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// planGangs plans each gang as one unit, oldest first: its members go on
// ready and upcoming nodes first; the rest must reach the gang's minimum on
// new nodes of one group (the same fabric), least waste among the groups
// that can; only with --gang-allow-split on several. A gang that cannot
// reach its minimum gets nothing, and its pods say why. Capacity a gang
// takes is taken from the fork and the candidates' limits for what comes
// after it.
func (o *Orchestrator) planGangs(ctx context.Context, req Request, gangs []*gang.Gang, fork *snapshot.Fork, nodes []int,
	cands []Candidate, maxNew *int, out *passOutput) *snapshot.Fork {
	for _, gg := range gangs {
		child := fork.Fork()
		var upcoming []placement
		var claimed []string
		placed := 0
		var rest []Pending
		for _, sg := range simulator.GroupPods(gg.Pending, o.GPU) {
			n := o.Planner.Estimator.Sim.FitOnNodes(ctx, child, sg, 0, nodes, func(pod, node int) {
				if node >= req.Snap.Len() {
					upcoming = append(upcoming, placement{node: child.NodeInfo(node).Node().Name, info: sg.PodInfo(pod)})
				} else {
					claimed = append(claimed, child.NodeInfo(node).Node().Name)
				}
			})
			placed += n
			if n < len(sg.Pods) {
				rest = append(rest, Pending{G: sg, From: n})
			}
		}
		need := gg.Need() - placed
		if need <= 0 {
			// Enough room on ready and coming nodes; members beyond the
			// minimum wait there or for the next loop.
			fork = child
			out.res.Placed = append(out.res.Placed, gg.Key.String())
			out.claimed = append(out.claimed, claimed...)
			out.upcoming = append(out.upcoming, upcoming...)
			out.awaiting += len(upcoming)
			continue
		}
		ups, why := o.gangNodes(ctx, gg, child, rest, cands, need, *maxNew, req.GangSplit)
		if ups == nil {
			out.res.NoScale = append(out.res.NoScale, NoScaleUp{Pods: gg.Pending, Reason: why, Code: ReasonGangDoesNotFit})
			klog.FromContext(ctx).V(2).Info("Gang gets no nodes", "gang", gg.Key.String(), "reason", why)
			continue
		}
		fork = ups.fork
		out.claimed = append(out.claimed, claimed...)
		out.upcoming = append(out.upcoming, upcoming...)
		out.awaiting += len(upcoming)
		for _, su := range ups.scaleUps {
			su.Gang = gg.Key.String()
			out.res.ScaleUps = append(out.res.ScaleUps, su)
			*maxNew -= su.Delta
			for i := range cands {
				if cands[i].Group == su.Group {
					cands[i].Limit -= su.Delta
				}
			}
		}
	}
	return fork
}

type gangPlan struct {
	scaleUps []ScaleUp
	fork     *snapshot.Fork
}

// gangNodes finds new nodes for a gang's remaining members: one group if
// any can take at least need of them, else (with --gang-allow-split)
// several. nil and the reason when the gang cannot reach its minimum.
func (o *Orchestrator) gangNodes(ctx context.Context, gg *gang.Gang, base *snapshot.Fork, rest []Pending,
	cands []Candidate, need, maxNew int, split bool) (*gangPlan, string) {
	return o.gangNodesSharing(ctx, gg, base, rest, cands, need, maxNew, split, !o.Planner.EstimateEach)
}

// gangNodesSharing is gangNodes, with estimates shared between equivalent
// groups when share is set.
func (o *Orchestrator) gangNodesSharing(ctx context.Context, gg *gang.Gang, base *snapshot.Fork, rest []Pending,
	cands []Candidate, need, maxNew int, split, share bool) (*gangPlan, string) {
	s := &gangSearch{o: o, gg: gg, base: base, rest: rest, need: need, maxNew: maxNew, shared: map[string]*Estimate{}, bound: map[string]int{}}
	for _, p := range rest {
		s.total += p.Left()
	}
	// Equivalent groups share their estimates (equivalent.go).
	if share {
		s.classes = equivalentClasses(base, rest, cands)
	}
	for _, c := range sortedByGroup(cands) {
		s.consider(ctx, c)
	}
	if len(s.options) > 0 {
		best, ok := s.confirm(ctx, cands)
		if !ok {
			return o.gangNodesSharing(ctx, gg, base, rest, cands, need, maxNew, split, false)
		}
		return &gangPlan{scaleUps: []ScaleUp{{Group: best.Group, Delta: best.Estimate.NewNodes, Pods: gg.Pending}}, fork: best.Estimate.Fork()}, ""
	}
	why := fmt.Sprintf("gang %s needs %d more members on new nodes (min %d, %d running) and no node group can take them all: %s",
		gg.Key, need, gg.Min, gg.Running, strings.Join(s.short, "; "))
	if !split || len(s.partials) < 2 {
		return nil, why
	}
	return s.splitAcross(ctx, why)
}

// gangSearch is one gangNodesSharing's search for a group that takes a
// gang's remaining members.
type gangSearch struct {
	o            *Orchestrator
	gg           *gang.Gang
	base         *snapshot.Fork
	rest         []Pending
	need, maxNew int
	// total is the members left: at most one node each.
	total int
	// classes are the groups' equivalence classes (nil: none shared);
	// shared[key] is an estimate by class and bound; bound[group] is the
	// bound of a group's option.
	classes map[string]string
	shared  map[string]*Estimate
	bound   map[string]int
	// options are the groups that can take the gang whole within their
	// room, partials those that can take part of it, and short why each
	// other group cannot.
	options  []*Option
	partials []gangPartial
	short    []string
}

// gangPartial is a group that can take only part of a gang.
type gangPartial struct {
	c      Candidate
	placed int
}

// estimate is group c's estimate for the members, at most n nodes: its
// class's when an equivalent group was estimated with that bound.
func (s *gangSearch) estimate(ctx context.Context, c Candidate, n int) *Estimate {
	key, ok := s.classes[c.Group]
	key += "\x00" + strconv.Itoa(n)
	if est := s.shared[key]; ok && est != nil {
		return est
	}
	est := s.o.Planner.Estimator.Estimate(ctx, s.base, s.rest, c.Group, c.Template, n, c.GPUPodsOnly, c.Refuse)
	if ok {
		s.shared[key] = est
	}
	return est
}

// consider estimates group c for the gang: an option when it takes the
// gang's need within its room, a partial when its room takes only part
// of it, else (and for a partial) why it falls short.
func (s *gangSearch) consider(ctx context.Context, c Candidate) {
	if c.Skip != "" || c.Template == nil {
		if c.Skip != "" {
			s.short = append(s.short, c.Skip)
		}
		return
	}
	limit := min(c.Limit, s.maxNew)
	if limit <= 0 {
		s.short = append(s.short, fmt.Sprintf("node group %s can add 0 nodes", c.Group))
		return
	}
	// How many nodes the members need on this group, unbounded (at most
	// one per member), to say so when the group's room is short.
	est := s.estimate(ctx, c, s.total)
	if sumInts(est.Placed) < s.need {
		s.short = append(s.short, fmt.Sprintf("node group %s: %s", c.Group, firstReason(est.Reasons)))
		return
	}
	if est.NewNodes <= limit {
		s.options = append(s.options, &Option{Group: c.Group, Estimate: est})
		s.bound[c.Group] = s.total
		return
	}
	bounded := s.estimate(ctx, c, limit)
	b := sumInts(bounded.Placed)
	if b >= s.need {
		s.options = append(s.options, &Option{Group: c.Group, Estimate: bounded})
		s.bound[c.Group] = limit
		return
	}
	s.partials = append(s.partials, gangPartial{c: c, placed: b})
	s.short = append(s.short, fmt.Sprintf("node group %s can add %d nodes, the gang needs %d", c.Group, limit, est.NewNodes))
}

// confirm is the expander's pick of the options, estimated for itself
// when its estimate was an equivalent group's (the fork must hold its
// own nodes); false when that estimate does not take the gang's need.
func (s *gangSearch) confirm(ctx context.Context, cands []Candidate) (*Option, bool) {
	best := s.o.Planner.Expander.Pick(s.options)
	if best.Estimate.Group == best.Group {
		return best, true
	}
	// Another group's estimate: the fork must hold this group's nodes.
	c := candidateOf(cands, best.Group)
	est := s.o.Planner.Estimator.Estimate(ctx, s.base, s.rest, c.Group, c.Template, s.bound[c.Group], c.GPUPodsOnly, c.Refuse)
	if sumInts(est.Placed) < s.need {
		klog.FromContext(ctx).Info("Estimate shared by equivalent node groups did not hold for the chosen one; estimating each", "group", c.Group, "gang", s.gg.Key.String())
		return nil, false
	}
	return &Option{Group: c.Group, Estimate: est}, true
}

// splitAcross chains the partial groups, those that take most first,
// until the gang's minimum (--gang-allow-split); nil and why when even
// that does not reach it.
func (s *gangSearch) splitAcross(ctx context.Context, why string) (*gangPlan, string) {
	sort.SliceStable(s.partials, func(i, j int) bool { return s.partials[i].placed > s.partials[j].placed })
	fork := s.base
	left := s.rest
	got := 0
	maxNew := s.maxNew
	var ups []ScaleUp
	for _, p := range s.partials {
		if got >= s.need || maxNew <= 0 {
			break
		}
		est := s.o.Planner.Estimator.Estimate(ctx, fork, left, p.c.Group, p.c.Template, min(p.c.Limit, maxNew), p.c.GPUPodsOnly, p.c.Refuse)
		if est.NewNodes == 0 {
			continue
		}
		ups = append(ups, ScaleUp{Group: p.c.Group, Delta: est.NewNodes, Pods: s.gg.Pending})
		maxNew -= est.NewNodes
		got += sumInts(est.Placed)
		fork = est.Fork()
		left = advance(left, est.Placed)
	}
	if got < s.need {
		return nil, why + " (not even split across groups)"
	}
	return &gangPlan{scaleUps: ups, fork: fork}, ""
}

// advance moves each pending group past what an estimate placed.
func advance(ps []Pending, placed []int) []Pending {
	out := make([]Pending, len(ps))
	for i, p := range ps {
		out[i] = Pending{G: p.G, From: p.From + placed[i]}
	}
	return out
}

func sumInts(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

func firstReason(rs []string) string {
	for _, r := range rs {
		if r != "" {
			return r
		}
	}
	return "no room"
}
