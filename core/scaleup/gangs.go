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
	total := 0
	for _, p := range rest {
		total += p.Left()
	}
	var options []*Option
	var short []string
	type partial struct {
		c      Candidate
		placed int
	}
	var partials []partial
	// Equivalent groups share their estimates (equivalent.go): shared[key]
	// by class and bound; bound[group] is the bound of a group's option.
	var classes map[string]string
	if share {
		classes = equivalentClasses(base, rest, cands)
	}
	shared := map[string]*Estimate{}
	bound := map[string]int{}
	estimate := func(c Candidate, n int) *Estimate {
		key, ok := classes[c.Group]
		key += "\x00" + strconv.Itoa(n)
		if est := shared[key]; ok && est != nil {
			return est
		}
		est := o.Planner.Estimator.Estimate(ctx, base, rest, c.Group, c.Template, n, c.GPUPodsOnly, c.Refuse)
		if ok {
			shared[key] = est
		}
		return est
	}
	for _, c := range sortedByGroup(cands) {
		if c.Skip != "" || c.Template == nil {
			if c.Skip != "" {
				short = append(short, c.Skip)
			}
			continue
		}
		limit := min(c.Limit, maxNew)
		if limit <= 0 {
			short = append(short, fmt.Sprintf("node group %s can add 0 nodes", c.Group))
			continue
		}
		// How many nodes the members need on this group, unbounded (at most
		// one per member), to say so when the group's room is short.
		est := estimate(c, total)
		got := sumInts(est.Placed)
		if got < need {
			short = append(short, fmt.Sprintf("node group %s: %s", c.Group, firstReason(est.Reasons)))
			continue
		}
		if est.NewNodes <= limit {
			options = append(options, &Option{Group: c.Group, Estimate: est})
			bound[c.Group] = total
			continue
		}
		bounded := estimate(c, limit)
		b := sumInts(bounded.Placed)
		if b >= need {
			options = append(options, &Option{Group: c.Group, Estimate: bounded})
			bound[c.Group] = limit
			continue
		}
		partials = append(partials, partial{c: c, placed: b})
		short = append(short, fmt.Sprintf("node group %s can add %d nodes, the gang needs %d", c.Group, limit, est.NewNodes))
	}
	if len(options) > 0 {
		best := o.Planner.Expander.Pick(options)
		if best.Estimate.Group != best.Group {
			// Another group's estimate: the fork must hold this group's nodes.
			c := candidateOf(cands, best.Group)
			est := o.Planner.Estimator.Estimate(ctx, base, rest, c.Group, c.Template, bound[c.Group], c.GPUPodsOnly, c.Refuse)
			if sumInts(est.Placed) < need {
				klog.FromContext(ctx).Info("Estimate shared by equivalent node groups did not hold for the chosen one; estimating each", "group", c.Group, "gang", gg.Key.String())
				return o.gangNodesSharing(ctx, gg, base, rest, cands, need, maxNew, split, false)
			}
			best = &Option{Group: c.Group, Estimate: est}
		}
		return &gangPlan{scaleUps: []ScaleUp{{Group: best.Group, Delta: best.Estimate.NewNodes, Pods: gg.Pending}}, fork: best.Estimate.Fork()}, ""
	}
	why := fmt.Sprintf("gang %s needs %d more members on new nodes (min %d, %d running) and no node group can take them all: %s",
		gg.Key, need, gg.Min, gg.Running, strings.Join(short, "; "))
	if !split || len(partials) < 2 {
		return nil, why
	}
	// Split: the groups that take most first, chained, until the minimum.
	sort.SliceStable(partials, func(i, j int) bool { return partials[i].placed > partials[j].placed })
	fork := base
	left := rest
	got := 0
	var ups []ScaleUp
	for _, p := range partials {
		if got >= need || maxNew <= 0 {
			break
		}
		est := o.Planner.Estimator.Estimate(ctx, fork, left, p.c.Group, p.c.Template, min(p.c.Limit, maxNew), p.c.GPUPodsOnly, p.c.Refuse)
		if est.NewNodes == 0 {
			continue
		}
		ups = append(ups, ScaleUp{Group: p.c.Group, Delta: est.NewNodes, Pods: gg.Pending})
		maxNew -= est.NewNodes
		got += sumInts(est.Placed)
		fork = est.Fork()
		left = advance(left, est.Placed)
	}
	if got < need {
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
