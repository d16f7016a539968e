package core

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// collectGangs splits the pending pods into gangs that still miss members
// for their minimum, and the rest (including members beyond a minimum
// that running members already reach).
func (a *Autoscaler) collectGangs(l *loop, pending []*apiv1.Pod) ([]*gang.Gang, []*apiv1.Pod) {
	var keys map[gang.Key]int
	running := func(k gang.Key) int {
		if keys == nil {
			// One pass over the bound pods, only when some gang is pending.
			keys = map[gang.Key]int{}
			for i := 0; i < l.snap.Len(); i++ {
				for _, pi := range l.snap.NodeInfo(i).GetPods() {
					p := pi.GetPod()
					if p.Status.Phase == apiv1.PodSucceeded || p.Status.Phase == apiv1.PodFailed {
						continue
					}
					if k, ok := gang.KeyOf(p); ok {
						keys[k]++
					}
				}
			}
		}
		return keys[k]
	}
	gangs, rest := gang.Collect(pending, running, a.gangs)
	out := gangs[:0]
	for _, g := range gangs {
		if g.Need() == 0 {
			rest = append(rest, g.Pending...)
			continue
		}
		out = append(out, g)
	}
	return out, rest
}

// planGangs plans each gang as one unit, oldest first: its members go on
// ready and upcoming nodes first; the rest must reach the gang's minimum on
// new nodes of one group (the same fabric), least waste among the groups
// that can; only with --gang-allow-split on several. A gang that cannot
// reach its minimum gets nothing, and its pods say why. Capacity a gang
// takes is taken from the fork and the candidates' limits for what comes
// after it.
func (a *Autoscaler) planGangs(ctx context.Context, l *loop, gangs []*gang.Gang, fork *snapshot.Fork, nodes []int,
	cands []scaleup.Candidate, maxNew *int, out *planOutput) *snapshot.Fork {
	for _, gg := range gangs {
		child := fork.Fork()
		var upcoming []placement
		placed := 0
		var rest []scaleup.Pending
		for _, sg := range simulator.GroupPods(gg.Pending, a.opts.GPUResourceName) {
			n := a.sim.FitOnNodes(ctx, child, sg, 0, nodes, func(pod, node int) {
				if node >= l.snap.Len() {
					upcoming = append(upcoming, placement{node: child.NodeInfo(node).Node().Name, info: sg.PodInfo(pod)})
				}
			})
			placed += n
			if n < len(sg.Pods) {
				rest = append(rest, scaleup.Pending{G: sg, From: n})
			}
		}
		need := gg.Need() - placed
		if need <= 0 {
			// Enough room on ready and coming nodes; members beyond the
			// minimum wait there or for the next loop.
			fork = child
			out.upcoming = append(out.upcoming, upcoming...)
			out.awaiting += len(upcoming)
			continue
		}
		ups, why := a.gangNodes(ctx, gg, child, rest, cands, need, *maxNew)
		if ups == nil {
			out.res.NoScale = append(out.res.NoScale, scaleup.NoScaleUp{Pods: gg.Pending, Reason: why})
			klog.FromContext(ctx).V(2).Info("Gang gets no nodes", "gang", gg.Key.String(), "reason", why)
			continue
		}
		fork = ups.fork
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
	scaleUps []scaleup.ScaleUp
	fork     *snapshot.Fork
}

// gangNodes finds new nodes for a gang's remaining members: one group if
// any can take at least need of them, else (with --gang-allow-split)
// several. nil and the reason when the gang cannot reach its minimum.
func (a *Autoscaler) gangNodes(ctx context.Context, gg *gang.Gang, base *snapshot.Fork, rest []scaleup.Pending,
	cands []scaleup.Candidate, need, maxNew int) (*gangPlan, string) {
	total := 0
	for _, p := range rest {
		total += p.Left()
	}
	var options []*scaleup.Option
	var short []string
	type partial struct {
		c      scaleup.Candidate
		placed int
	}
	var partials []partial
	for _, c := range cands {
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
		est := a.planner.Estimator.Estimate(ctx, base, rest, c.Group, c.Template, total, c.GPUPodsOnly, c.Refuse)
		got := sum(est.Placed)
		if got < need {
			short = append(short, fmt.Sprintf("node group %s: %s", c.Group, firstReason(est.Reasons)))
			continue
		}
		if est.NewNodes <= limit {
			options = append(options, &scaleup.Option{Group: c.Group, Estimate: est})
			continue
		}
		bounded := a.planner.Estimator.Estimate(ctx, base, rest, c.Group, c.Template, limit, c.GPUPodsOnly, c.Refuse)
		b := sum(bounded.Placed)
		if b >= need {
			options = append(options, &scaleup.Option{Group: c.Group, Estimate: bounded})
			continue
		}
		partials = append(partials, partial{c: c, placed: b})
		short = append(short, fmt.Sprintf("node group %s can add %d nodes, the gang needs %d", c.Group, limit, est.NewNodes))
	}
	if len(options) > 0 {
		best := a.planner.Expander.Pick(options)
		return &gangPlan{scaleUps: []scaleup.ScaleUp{{Group: best.Group, Delta: best.Estimate.NewNodes, Pods: gg.Pending}}, fork: best.Estimate.Fork()}, ""
	}
	why := fmt.Sprintf("gang %s needs %d more members on new nodes (min %d, %d running) and no node group can take them all: %s",
		gg.Key, need, gg.Min, gg.Running, strings.Join(short, "; "))
	if !a.opts.GangSplit || len(partials) < 2 {
		return nil, why
	}
	// Split: the groups that take most first, chained, until the minimum.
	sort.SliceStable(partials, func(i, j int) bool { return partials[i].placed > partials[j].placed })
	fork := base
	left := rest
	got := 0
	var ups []scaleup.ScaleUp
	for _, p := range partials {
		if got >= need || maxNew <= 0 {
			break
		}
		est := a.planner.Estimator.Estimate(ctx, fork, left, p.c.Group, p.c.Template, min(p.c.Limit, maxNew), p.c.GPUPodsOnly, p.c.Refuse)
		if est.NewNodes == 0 {
			continue
		}
		ups = append(ups, scaleup.ScaleUp{Group: p.c.Group, Delta: est.NewNodes, Pods: gg.Pending})
		maxNew -= est.NewNodes
		got += sum(est.Placed)
		fork = est.Fork()
		left = advance(left, est.Placed)
	}
	if got < need {
		return nil, why + " (not even split across groups)"
	}
	return &gangPlan{scaleUps: ups, fork: fork}, ""
}

// advance moves each pending group past what an estimate placed.
func advance(ps []scaleup.Pending, placed []int) []scaleup.Pending {
	out := make([]scaleup.Pending, len(ps))
	for i, p := range ps {
		out[i] = scaleup.Pending{G: p.G, From: p.From + placed[i]}
	}
	return out
}

func sum(xs []int) int {
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
