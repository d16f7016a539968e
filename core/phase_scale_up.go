package core

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/trigger"
)

// scaleUp finds the unschedulable pods that fit neither on usable nodes
// nor on nodes already coming, and asks node groups for the nodes they
// need, through the node-addition queue.
func (a *Autoscaler) scaleUp(ctx context.Context, l *loop) error {
	a.events.startLoop()
	defer a.events.forget(l.epoch)
	// The ProvisioningRequests' condition changes of this loop are written
	// last, whatever happens below.
	defer a.writeProvisioningRequests(ctx, l)
	defer a.writeBuffers(ctx, l)
	passes := a.scaleUpPasses(l)
	a.metrics.UnschedulablePods.Set(float64(l.unschedulable))
	req, err := a.scaleUpRequest(ctx, l, passes)
	if err != nil {
		return err
	}
	a.nodeAdd.writing = writingGroups(l.groups)
	// Even with nothing to add, the queue decides and reports: demand
	// queued last loop and gone now was cancelled.
	out, err := a.orchestrator.Run(ctx, req, a.nodeAdd, increaser{a: a, l: l})
	if err != nil {
		return err
	}
	l.awaiting, l.claimed = out.Awaiting, out.Claimed
	a.provisioningRequestResults(l, out)
	a.bufferResults(l, out)
	a.metrics.PodsAwaitingNodes.Set(float64(out.Awaiting))
	rep := additionReport{InFlight: out.InFlight, Limit: out.Limit, HeldGangs: out.HeldGangs, Released: out.Released, Queued: out.Queued}
	for g, byClass := range out.Released {
		for c, n := range byClass {
			a.metrics.NodesReleased.WithLabelValues(g, c.String()).Add(float64(n))
		}
	}
	a.reportQueue(ctx, l, rep)
	l.addition = rep
	l.scaleUp = out.Result
	a.reportScaleUp(ctx, l, out.Result)
	return nil
}

// scaleUpPasses sorts the pending pods into the planning passes, in order,
// and counts them in l.unschedulable: gangs still missing members, with
// the real pods that can preempt balloons (their room is free: the
// scheduler will preempt them, so no node is bought for a pod that fits by
// displacing balloons); real pods that cannot (preemptionPolicy Never, or
// priority not above the balloons'); balloons, at the queue's lowest
// class; and the capacity buffers' chunks, at that class too.
func (a *Autoscaler) scaleUpPasses(l *loop) []scaleup.Pass {
	var preempting, other, balloons []*apiv1.Pod
	gangs, pendingPods := a.collectGangs(l, a.dropConsumers(l, a.pendingPods(l)))
	for _, g := range gangs {
		l.unschedulable += len(g.Pending)
	}
	// Best-effort-atomic ProvisioningRequests are gangs of their pods.
	gangs = withRequestGangs(l, gangs)
	expected := a.expectedPods(l, pendingPods)
	l.expected = len(expected)
	a.metrics.ExpectedPods.Set(float64(l.expected))
	// The ReplicaSets' pods to come are planned with their twins, in the
	// same pass: a pass packs its pods onto the nodes it buys, and a pass
	// of their own left its predecessor's half-filled new nodes unused (an
	// e2e run bought 9 nodes for 40 pods that fit 8).
	for _, p := range slices.Concat(pendingPods, expected) {
		switch {
		case a.opts.isBalloon(p):
			balloons = append(balloons, p)
		case a.opts.BalloonAware && a.canPreemptBalloons(p):
			preempting = append(preempting, p)
		default:
			other = append(other, p)
		}
	}
	l.unschedulable += len(preempting) + len(other) - len(expected)
	// Room held for capacity buffers is free to every pod the scheduler
	// sees (it does not see the buffers' chunks), balloons included.
	var chunks func(*apiv1.Pod) bool
	if l.buffers != nil {
		chunks = capacitybuffer.IsBufferPod
	}
	first := chunks
	switch {
	case a.opts.BalloonAware && chunks != nil:
		first = a.opts.isWarm
	case a.opts.BalloonAware:
		first = a.opts.isBalloon
	}
	return []scaleup.Pass{
		{Pods: preempting, Gangs: gangs, Free: first},
		{Pods: other, Free: chunks},
		{Pods: balloons, Balloon: true, Free: chunks},
		// The buffers' chunks that fit on no ready node, last of all.
		{Pods: bufferPending(l), Balloon: true, Last: true},
	}
}

// bufferPending are the buffers' chunks that fit on no ready node.
func bufferPending(l *loop) []*apiv1.Pod {
	if l.buffers == nil {
		return nil
	}
	return l.buffers.pending
}

// inFlight is what the in-flight cap counts: every group's upcoming
// nodes (requested, booting, registering, in preflight). A group whose
// size is unknown this loop (a failed VM list, throttling) counts as many
// as when it was last known: its machines still boot, and hiding them
// would let the other groups add a whole cap more.
func (a *Autoscaler) inFlight(l *loop) int {
	n := 0
	for _, g := range l.groups {
		gs := a.registry.Group(g.ID())
		switch {
		case gs == nil:
		case gs.Readiness.TargetKnown:
			n += gs.Readiness.Upcoming
		default:
			n += gs.Readiness.LastKnownUpcoming
		}
	}
	return n
}

// scaleUpRequest describes the loop to the orchestrator. Templates and
// candidates are built only when some pass has pods.
func (a *Autoscaler) scaleUpRequest(ctx context.Context, l *loop, passes []scaleup.Pass) (scaleup.Request, error) {
	req := scaleup.Request{Now: l.now, Snap: l.snap, MaxNew: int(^uint(0) >> 1), IsBalloon: a.opts.isBalloon, IsLast: capacitybuffer.IsBufferPod,
		GangSplit: a.opts.GangSplit, Passes: passes, Bookings: bookedForUpcoming(l)}
	req.InFlight = a.inFlight(l)
	if !a.nodeAdd.seeded {
		a.nodeAdd.seeded = true
		a.nodeAdd.queue.Seed(recentNodes(l.nodes, l.now, time.Minute))
	}
	// Booked pods that fit on no ready node are placed on the coming ones
	// even with nothing pending, to tell when their capacity is gone.
	empty := len(req.Bookings) == 0
	for _, p := range passes {
		empty = empty && len(p.Pods) == 0 && len(p.Gangs) == 0
	}
	if empty {
		return req, nil
	}
	dss, err := a.listers.DaemonSets.List(labels.Everything())
	if err != nil {
		return req, fmt.Errorf("listing DaemonSets from cache: %w", err)
	}
	for i := 0; i < l.snap.Len(); i++ {
		if a.usable(l, l.snap.NodeInfo(i).Node()) {
			req.Usable = append(req.Usable, i)
		}
	}
	upcoming := 0
	for _, g := range l.groups {
		c, tmpl := a.candidate(ctx, l, g, dss)
		sg := scaleup.Group{Candidate: c}
		if gs := a.registry.Group(g.ID()); gs != nil && tmpl != nil {
			sg.Upcoming, sg.UpcomingTemplate = gs.Readiness.Upcoming, tmpl
			upcoming += gs.Readiness.Upcoming
		}
		req.Groups = append(req.Groups, sg)
	}
	if a.opts.MaxNodesTotal > 0 {
		req.MaxNew = a.opts.MaxNodesTotal - len(l.nodes) - upcoming
	}
	return req, nil
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
func (a *Autoscaler) candidate(ctx context.Context, l *loop, g cloudprovider.NodeGroup, dss []*appsv1.DaemonSet) (scaleup.Candidate, fwk.NodeInfo) {
	c := scaleup.Candidate{Group: g.ID()}
	gs := a.registry.Group(g.ID())
	switch {
	case gs == nil:
		c.Skip, c.SkipCode = "node group not known to the cluster state yet", scaleup.ReasonGroupNotRegistered
		return c, nil
	case gs.SizeError != nil || !gs.Readiness.TargetKnown:
		c.Skip, c.SkipCode = "node group size unknown", scaleup.ReasonSizeUnknown
		return c, nil
	}
	tmpl, err := a.templates.build(ctx, a, l, g, dss)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Skipping node group without template", "nodeGroup", g.ID())
		c.Skip, c.SkipCode = "no template node: "+err.Error(), scaleup.ReasonNoTemplate
		return c, nil
	}
	switch {
	case gs.Backoff.Active:
		c.Skip, c.SkipCode = fmt.Sprintf("node group in backoff until %s after %s", gs.Backoff.Until.UTC().Format(time.RFC3339), backoffWhy(gs.Backoff)), scaleup.ReasonBackoff
		return c, tmpl
	case gs.Readiness.Target >= gs.Max:
		c.Skip, c.SkipCode = fmt.Sprintf("node group %s at max size %d", g.ID(), gs.Max), scaleup.ReasonMaxSize
		return c, tmpl
	}
	// A group's health breaker never stops it scaling up: it bounds what
	// the health signals can make the autoscaler do to the group's nodes
	// (cordons, drains, replacements), and a breaker held by a few bad
	// nodes of a small pool left its pods pending for good (issue #39).
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
	g, ok := in.l.byID[group]
	if !ok {
		return fmt.Errorf("node group %s not found", group)
	}
	logger := klog.FromContext(ctx)
	if err := g.IncreaseSize(ctx, delta); err != nil {
		class := cloudprovider.ClassOf(err)
		reason := class.String()
		if scaleup.Deferred(err) {
			// Deferred, not failed: the provider sends one write per
			// scale set at a time (its previous operation runs for the
			// minutes its VMs take to boot) and the demand stays queued
			// for the write of the absolute target after it. Loops see
			// this every scan while a GPU scale-up runs: no warning
			// event, no error log, no failure counted.
			logger.V(2).Info("Scale-up deferred", "nodeGroup", group, "delta", delta, "why", err.Error())
			return fmt.Errorf("increasing node group %s by %d: %w", group, delta, err)
		}
		switch class {
		case cloudprovider.ClassThrottled, cloudprovider.ClassConflict, cloudprovider.ClassFenced:
			// Retry next loop; a throttled or busy cloud, or a replica that
			// may not write, is not the group's fault.
		default:
			in.a.registry.RegisterFailedScaleUp(group, class, err.Error(), in.l.now)
			// The group is backed off: a loop soon plans what this one
			// could not place again (gangs whole) on the other groups.
			in.a.Wake(trigger.CloudFailure)
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
			held, ok := l.addition.HeldGangs[su.Gang]
			reason, msg = EventScaleUpQueued, queuedMessage(su.Group, l.addition.Limit, su.Gang, held, ok)
		}
		for _, p := range su.Pods {
			if isVirtual(p) {
				continue // a ProvisioningRequest's or a buffer's: their statuses say it
			}
			a.events.emit(p, l.now, l.epoch, apiv1.EventTypeNormal, reason, msg)
		}
	}
	noScale := a.reportNoScaleUp(l, res.NoScale)
	var groups []string
	for _, su := range res.ScaleUps {
		if su.Delta > 0 {
			groups = append(groups, su.Group+"+"+strconv.Itoa(su.Delta))
		}
	}
	if len(groups) == 0 && queued == 0 && len(res.Failed) == 0 && noScale == 0 {
		a.lastDecision = ""
		return // nothing asked, nothing refused: the steady state logs nothing at default verbosity
	}
	// A decision that only repeats the last one (pods that cannot get a
	// node, loop after loop: a group backed off, at its max) is logged at
	// -v=2: at default verbosity once, not every second.
	logger := klog.FromContext(ctx)
	if len(groups) == 0 && len(res.Failed) == 0 {
		same := fmt.Sprintf("%d/%d/%s", noScale, queued, l.addition.Limit)
		if same == a.lastDecision {
			logger = logger.V(2)
		}
		a.lastDecision = same
	} else {
		a.lastDecision = ""
	}
	logger.Info("Scale-up decision", "unschedulablePods", l.unschedulable, "expectedPods", l.expected, "awaitingUpcoming", l.awaiting,
		"scaleUps", strings.Join(groups, ","), "queuedNodes", queued, "heldBy", l.addition.Limit, "inFlight", l.addition.InFlight,
		"failed", len(res.Failed), "podsWithoutScaleUp", noScale,
		"podEventsDropped", a.events.dropped)
}

// recentNodes counts the nodes created within d before now: at a new
// leader's first loop, the nodes its predecessor's last releases made
// (once per leadership: O(nodes)).
func recentNodes(nodes []*apiv1.Node, now time.Time, d time.Duration) int {
	n := 0
	for _, node := range nodes {
		if c := node.CreationTimestamp.Time; !c.IsZero() && now.Sub(c) < d {
			n++
		}
	}
	return n
}

// reportNoScaleUp tells each real pod no group was asked for why (a
// NotTriggerScaleUp event in words), counts them by reason (the metric,
// the status) and returns how many there are.
func (a *Autoscaler) reportNoScaleUp(l *loop, noScale []scaleup.NoScaleUp) int {
	n := 0
	l.noScaleUp = map[scaleup.ReasonCode]int{}
	for _, ns := range noScale {
		msg := "pod didn't trigger scale-up: " + ns.Reason
		for _, p := range ns.Pods {
			if isVirtual(p) {
				continue
			}
			n++
			l.noScaleUp[ns.Code]++
			a.events.emit(p, l.now, l.epoch, apiv1.EventTypeNormal, EventNotTriggerScaleUp, msg)
		}
	}
	for _, code := range scaleup.ReasonCodes() {
		a.metrics.PodsWithoutScaleUp.WithLabelValues(string(code)).Set(float64(l.noScaleUp[code]))
	}
	return n
}
