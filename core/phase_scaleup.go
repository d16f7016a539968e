package core

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
)

// scaleUp finds the unschedulable pods that fit neither on ready nodes nor
// on nodes already coming, and asks node groups for the nodes they need.
func (a *Autoscaler) scaleUp(ctx context.Context, l *loop) error {
	a.events.startLoop()
	defer a.events.forget(l.epoch)
	// Three kinds of pending pods, planned in this order, each pass seeing
	// the upcoming nodes the earlier ones took: real pods that can preempt
	// balloons (their room is free: the scheduler will preempt them, so no
	// node is bought for a pod that fits by displacing balloons); real pods
	// that cannot (preemptionPolicy Never, or priority not above the
	// balloons'); and balloons themselves, at the queue's lowest class.
	var preempting, other, balloons []*apiv1.Pod
	gangs, pendingPods := a.collectGangs(l, a.pendingPods(l))
	for _, g := range gangs {
		l.unschedulable += len(g.Pending)
	}
	for _, p := range pendingPods {
		switch {
		case a.opts.isBalloon(p):
			balloons = append(balloons, p)
		case a.opts.BalloonAware && a.canPreemptBalloons(p):
			preempting = append(preempting, p)
		default:
			other = append(other, p)
		}
	}
	l.unschedulable += len(preempting) + len(other)
	a.metrics.UnschedulablePods.Set(float64(l.unschedulable))
	var res scaleup.Result
	var cands []scaleup.Candidate
	maxNew, awaiting := 0, 0
	var carry []placement
	// Gangs go in the first pass, before single pods take the room they
	// need; balloons' room is free to them when balloon-aware.
	for _, pass := range []struct {
		pods         []*apiv1.Pod
		gangs        []*gang.Gang
		freeBalloons bool
		balloon      bool
	}{{preempting, gangs, a.opts.BalloonAware, false}, {other, nil, false, false}, {balloons, nil, false, true}} {
		if len(pass.pods) == 0 && len(pass.gangs) == 0 {
			continue
		}
		out, err := a.plan(ctx, l, planInput{pods: pass.pods, gangs: pass.gangs, freeBalloons: pass.freeBalloons, reserved: planned(res), carry: carry})
		if err != nil {
			return err
		}
		carry = append(carry, out.upcoming...)
		if pass.balloon {
			markBalloon(out.res.ScaleUps)
		} else {
			awaiting += out.awaiting
		}
		res.ScaleUps = append(res.ScaleUps, out.res.ScaleUps...)
		res.NoScale = append(res.NoScale, out.res.NoScale...)
		if res.Fork == nil {
			res.Fork = out.res.Fork
		}
		if cands == nil {
			cands, maxNew = out.cands, out.maxNew
		}
	}
	l.awaiting = awaiting
	a.metrics.PodsAwaitingNodes.Set(float64(awaiting))
	// Even with nothing to add, the queue reports: demand queued last loop
	// and gone now was cancelled.
	res = a.addNodes(ctx, l, res, cands, maxNew)
	l.scaleUp = res
	a.reportScaleUp(ctx, l, res)
	return nil
}

// plan finds the pods that fit neither on ready nodes nor on nodes already
// coming, and plans nodes for them: the demand for the node-addition queue.
func (a *Autoscaler) plan(ctx context.Context, l *loop, in planInput) (planOutput, error) {
	pending := in.pods
	if len(pending) == 0 && len(in.gangs) == 0 {
		return planOutput{}, nil
	}
	dss, err := a.listers.DaemonSets.List(labels.Everything())
	if err != nil {
		return planOutput{}, fmt.Errorf("listing DaemonSets from cache: %w", err)
	}
	groups := simulator.GroupPods(pending, a.opts.GPUResourceName)
	fork := l.snap.Fork()
	cands := make([]scaleup.Candidate, 0, len(l.groups))
	var candidates []int
	for i := 0; i < l.snap.Len(); i++ {
		if a.usable(l.snap.NodeInfo(i).Node(), l.now) {
			candidates = append(candidates, i)
			if in.freeBalloons {
				fork.RemovePods(i, a.opts.isBalloon)
			}
		}
	}
	upcomingTotal := 0
	for _, g := range l.groups {
		c, tmpl := a.candidate(ctx, g, dss, l.now)
		cands = append(cands, c)
		gs := a.registry.Group(g.ID())
		if gs == nil || tmpl == nil {
			continue
		}
		upcomingTotal += gs.Readiness.Upcoming
		for i := 0; i < gs.Readiness.Upcoming; i++ {
			idx, err := fork.AddNode(scaleup.CloneTemplate(tmpl, "upcoming-"+g.ID()+"-"+strconv.Itoa(i)))
			if err != nil {
				return planOutput{}, fmt.Errorf("adding upcoming node of group %s: %w", g.ID(), err)
			}
			candidates = append(candidates, idx)
		}
	}
	for _, c := range in.carry {
		if idx, ok := fork.Index(c.node); ok {
			fork.AddPod(idx, c.info)
		}
	}
	maxNew := int(^uint(0) >> 1)
	if a.opts.MaxNodesTotal > 0 {
		maxNew = a.opts.MaxNodesTotal - len(l.nodes) - upcomingTotal - in.reserved
	}
	var out planOutput
	if len(in.gangs) > 0 {
		fork = a.planGangs(ctx, l, in.gangs, fork, candidates, cands, &maxNew, &out)
	}
	gangs := out.res
	// Existing and coming nodes first: what fits there needs no new node.
	var rest []scaleup.Pending
	awaiting := out.awaiting
	for _, g := range groups {
		placed := a.sim.FitOnNodes(ctx, fork, g, 0, candidates, func(pod, node int) {
			if node >= l.snap.Len() {
				awaiting++
				out.upcoming = append(out.upcoming, placement{node: fork.NodeInfo(node).Node().Name, info: g.PodInfo(pod)})
			}
		})
		if placed < len(g.Pods) {
			rest = append(rest, scaleup.Pending{G: g, From: placed})
		}
	}
	out.cands, out.maxNew, out.awaiting = cands, maxNew, awaiting
	if len(rest) == 0 {
		klog.FromContext(ctx).V(2).Info("All unschedulable pods fit on existing or upcoming nodes", "pods", len(pending), "awaitingUpcoming", awaiting)
		out.res = scaleup.Result{Fork: fork, ScaleUps: gangs.ScaleUps, NoScale: gangs.NoScale}
		return out, nil
	}
	out.res = a.planner.Plan(ctx, fork, rest, cands, maxNew, planOnly{})
	out.res.ScaleUps = append(gangs.ScaleUps, out.res.ScaleUps...)
	out.res.NoScale = append(gangs.NoScale, out.res.NoScale...)
	return out, nil
}

// planInput is one planning pass: the pods, whether balloons' room counts
// as free, nodes already planned in this loop (against --max-nodes-total),
// and pods an earlier pass put on upcoming nodes.
type planInput struct {
	pods         []*apiv1.Pod
	gangs        []*gang.Gang
	freeBalloons bool
	reserved     int
	carry        []placement
}

// planOutput is a pass's plan, the candidates and cap it used, the pods
// that fit on upcoming nodes, and where they went.
type planOutput struct {
	res      scaleup.Result
	cands    []scaleup.Candidate
	maxNew   int
	awaiting int
	upcoming []placement
}

// placement is a pod placed on an upcoming (template) node.
type placement struct {
	node string
	info fwk.PodInfo
}

// pendingPods are the unbound pods the scheduler marked unschedulable,
// older than the scale-up delay, not being deleted, and not waiting for a
// node the scheduler nominated after preempting.
func (a *Autoscaler) pendingPods(l *loop) []*apiv1.Pod {
	var out []*apiv1.Pod
	for _, p := range l.unbound {
		if p.DeletionTimestamp != nil || !isUnschedulable(p) {
			continue
		}
		if l.now.Sub(p.CreationTimestamp.Time) < a.opts.NewPodScaleUpDelay {
			continue
		}
		if n := p.Status.NominatedNodeName; n != "" {
			if _, ok := l.snap.Index(n); ok {
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

func isUnschedulable(p *apiv1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == apiv1.PodScheduled {
			return c.Status == apiv1.ConditionFalse && c.Reason == apiv1.PodReasonUnschedulable
		}
	}
	return false
}

// candidate describes a group to the planner, or why it is skipped.
func (a *Autoscaler) candidate(ctx context.Context, g cloudprovider.NodeGroup, dss []*appsv1.DaemonSet, now time.Time) (scaleup.Candidate, fwk.NodeInfo) {
	c := scaleup.Candidate{Group: g.ID()}
	gs := a.registry.Group(g.ID())
	switch {
	case gs == nil:
		c.Skip = "node group not known to the cluster state yet"
		return c, nil
	case gs.SizeError != nil || !gs.Readiness.TargetKnown:
		c.Skip = "node group size unknown"
		return c, nil
	}
	tmpl, err := a.templates.build(ctx, a, g, dss)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Skipping node group without template", "nodeGroup", g.ID())
		c.Skip = "no template node: " + err.Error()
		return c, nil
	}
	switch {
	case gs.Backoff.Active:
		c.Skip = fmt.Sprintf("node group in backoff until %s after %s", gs.Backoff.Until.UTC().Format(time.RFC3339), backoffWhy(gs.Backoff))
		return c, tmpl
	case gs.Readiness.Target >= gs.Max:
		c.Skip = fmt.Sprintf("node group %s at max size %d", g.ID(), gs.Max)
		return c, tmpl
	}
	c.Template = tmpl
	c.Limit = gs.Max - gs.Readiness.Target
	c.GPUPodsOnly = a.opts.GPUGroupsForGPUPodsOnly && tmpl.GetAllocatable().GetScalarResources()[a.opts.GPUResourceName] > 0
	if !a.opts.BorrowersScaleTeamGroups {
		c.Refuse = refuseBorrowers(g.ID(), teamTaints(tmpl.Node()))
	}
	return c, tmpl
}

func backoffWhy(b clusterstate.BackoffStatus) string {
	switch b.Class {
	case cloudprovider.ClassQuota:
		return "quota error"
	case cloudprovider.ClassOutOfCapacity:
		return "out-of-capacity error"
	default:
		if b.Reason != "" {
			return b.Reason
		}
		return "failed scale-up"
	}
}

// increaser is the loop's only cloud write for scale-up.
type increaser struct {
	a *Autoscaler
	l *loop
}

func (in increaser) IncreaseSize(ctx context.Context, group string, delta int) error {
	var g cloudprovider.NodeGroup
	for _, x := range in.l.groups {
		if x.ID() == group {
			g = x
		}
	}
	if g == nil {
		return fmt.Errorf("node group %s not found", group)
	}
	logger := klog.FromContext(ctx)
	if err := g.IncreaseSize(ctx, delta); err != nil {
		class := cloudprovider.ClassOf(err)
		reason := class.String()
		switch class {
		case cloudprovider.ClassThrottled, cloudprovider.ClassConflict:
			// Retry next loop; a throttled or busy cloud is not the group's fault.
		default:
			in.a.registry.RegisterFailedScaleUp(group, class, err.Error(), in.l.now)
		}
		in.a.metrics.FailedScaleUps.WithLabelValues(group, reason).Inc()
		logger.Error(err, "Scale-up failed", "nodeGroup", group, "delta", delta, "class", reason)
		in.a.groupEvent(apiv1.EventTypeWarning, EventFailedScaleUp, fmt.Sprintf("node group %s: increase by %d failed: %v", group, delta, err))
		return fmt.Errorf("increasing node group %s by %d: %w", group, delta, err)
	}
	in.a.registry.RegisterScaleUp(group, delta, in.l.now)
	in.a.metrics.ScaleUps.WithLabelValues(group).Inc()
	in.a.metrics.ScaledUpNodes.WithLabelValues(group).Add(float64(delta))
	gs := in.a.registry.Group(group)
	logger.Info("Scaled up node group", "nodeGroup", group, "delta", delta, "target", gs.Readiness.Target, "max", gs.Max)
	in.a.groupEvent(apiv1.EventTypeNormal, EventScaledUpGroup,
		fmt.Sprintf("Scale-up: node group %s size set to %d instead of %d (max: %d)", group, gs.Readiness.Target, gs.Readiness.Target-delta, gs.Max))
	return nil
}

// reportScaleUp writes the pod events and the summary log line.
func (a *Autoscaler) reportScaleUp(ctx context.Context, l *loop, res scaleup.Result) {
	queued := 0
	for _, su := range res.ScaleUps {
		gs := a.registry.Group(su.Group)
		queued += su.Queued
		reason := EventTriggeredScaleUp
		msg := fmt.Sprintf("pod triggered scale-up: [{%s %d->%d (max: %d)}]", su.Group, gs.Readiness.Target-su.Delta, gs.Readiness.Target, gs.Max)
		if su.Queued > 0 {
			// Part of the demand waits: the message stays the same from loop
			// to loop, so the event is not rewritten each time a few nodes go.
			reason, msg = EventScaleUpQueued, queuedMessage(su.Group, l.addition.Limit)
		}
		for _, p := range su.Pods {
			a.events.emit(p, l.now, l.epoch, apiv1.EventTypeNormal, reason, msg)
		}
	}
	noScale := 0
	for _, ns := range res.NoScale {
		noScale += len(ns.Pods)
		msg := "pod didn't trigger scale-up: " + ns.Reason
		for _, p := range ns.Pods {
			a.events.emit(p, l.now, l.epoch, apiv1.EventTypeNormal, EventNotTriggerScaleUp, msg)
		}
	}
	var groups []string
	for _, su := range res.ScaleUps {
		if su.Delta > 0 {
			groups = append(groups, su.Group+"+"+strconv.Itoa(su.Delta))
		}
	}
	if len(groups) == 0 && queued == 0 && len(res.Failed) == 0 && noScale == 0 {
		return // nothing asked, nothing refused: the steady state logs nothing at default verbosity
	}
	klog.FromContext(ctx).Info("Scale-up decision", "unschedulablePods", l.unschedulable, "awaitingUpcoming", l.awaiting,
		"scaleUps", strings.Join(groups, ","), "queuedNodes", queued, "heldBy", l.addition.Limit, "inFlight", l.addition.InFlight,
		"failed", len(res.Failed), "podsWithoutScaleUp", noScale,
		"podEventsDropped", a.events.dropped)
}
