package core

import (
	"context"
	"fmt"
	"sync"
	"time"

	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// Scale-down events, as in cluster-autoscaler.
const (
	EventScaleDown       = "ScaleDown"
	EventScaleDownFailed = "ScaleDownFailed"
	EventScaleDownBrake  = "ScaleDownBrake"
)

// scaleDownState is kept between loops.
type scaleDownState struct {
	planner *scaledown.Planner
	braked  bool

	mu sync.Mutex
	// gone holds nodes whose machines this process deleted, until their
	// Node objects disappear: they are never planned again.
	gone map[string]bool
	// drained holds, per group, nodes whose drain finished; the next loop
	// deletes them with one DeleteNodes per group.
	drained map[string][]scaledown.Removal
	// lastDelete and lastFailure drive --scale-down-delay-after-delete and
	// -after-failure; drains write them from their goroutines.
	lastDelete, lastFailure time.Time
	draining                map[string]bool // nodes being drained by a goroutine
	brake                   *scaledown.Brake
	wg                      sync.WaitGroup
}

func newScaleDownState(o Options, sim *simulator.Simulator, isBalloon func(*apiv1.Pod) bool) *scaleDownState {
	brake := scaledown.NewBrake(o.brakeOptions())
	p := scaledown.NewPlanner(o.scaleDownOptions(isBalloon), sim, brake)
	return &scaleDownState{planner: p, brake: brake, draining: map[string]bool{}, drained: map[string][]scaledown.Removal{}, gone: map[string]bool{}}
}

func (o Options) brakeOptions() scaledown.BrakeOptions {
	return scaledown.BrakeOptions{ClusterShare: o.ScaleDownBrakeClusterShare, GroupShare: o.ScaleDownBrakeGroupShare, Window: o.ScaleDownBrakeWindow}
}

func (o Options) scaleDownOptions(isBalloon func(*apiv1.Pod) bool) scaledown.Options {
	return scaledown.Options{
		Rules: scaledown.Rules{SkipNodesWithSystemPods: o.SkipNodesWithSystemPods, SkipNodesWithLocalStorage: o.SkipNodesWithLocalStorage,
			IsFreeRoom: isBalloon},
		UtilizationThreshold:    o.ScaleDownUtilizationThreshold,
		GPUUtilizationThreshold: o.ScaleDownGPUUtilizationThreshold,
		UnneededTime:            o.ScaleDownUnneededTime,
		UnreadyTime:             o.ScaleDownUnreadyTime,
		MaxParallelism:          o.MaxScaleDownParallelism,
		MaxEmptyBulkDelete:      o.MaxEmptyBulkDelete,
		GPU:                     o.GPUResourceName,
	}
}

// scaleDownReport is what the status and metrics say about the last pass.
type scaleDownReport struct {
	Unneeded    int
	Removing    int
	Braked      bool
	RecentCount int
	Skipped     string
}

func (s *scaleDownState) inflight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.draining)
}

// Wait blocks until running drains finish (tests, shutdown).
func (a *Autoscaler) WaitForDrains() { a.scaleDown.wg.Wait() }

// scaleDownPhase finds unneeded nodes and removes those unneeded for long
// enough: empty ones in bulk, others drained in parallel.
func (a *Autoscaler) scaleDownPhase(ctx context.Context, l *loop) error {
	sd := a.scaleDown
	if !a.opts.ScaleDownEnabled || a.actions == nil {
		return nil
	}
	// Drains that finished since the last loop are deleted whatever else
	// this loop decides: their pods are gone already.
	a.flushDrained(ctx, l)
	if why := a.scaleDownHeld(l); why != "" {
		l.scaleDown.Skipped = why
		klog.FromContext(ctx).V(2).Info("Scale-down held", "reason", why)
		return nil
	}
	var pdbList []*policyv1.PodDisruptionBudget
	if a.listers.PDBs != nil {
		var err error
		if pdbList, err = a.listers.PDBs.List(labels.Everything()); err != nil {
			return fmt.Errorf("listing PodDisruptionBudgets from cache: %w", err)
		}
	}
	groups := map[string]*scaledown.Group{}
	byID := map[string]cloudprovider.NodeGroup{}
	for _, g := range l.groups {
		byID[g.ID()] = g
		gs := a.registry.Group(g.ID())
		if gs == nil || gs.SizeError != nil || !gs.Readiness.TargetKnown {
			continue
		}
		rd := gs.Readiness
		unready := rd.Unready + rd.LongUnregistered
		healthy := !(unready > 3 && float64(unready) > a.opts.ScaleDownMaxUnreadyShare*float64(rd.Registered+rd.LongUnregistered))
		groups[g.ID()] = &scaledown.Group{Min: gs.Min, Target: rd.Target, Deleting: rd.Deleting, Healthy: healthy,
			RecentScaleUp: !gs.LastScaleUp.IsZero() && l.now.Sub(gs.LastScaleUp) < a.opts.ScaleDownDelayAfterAdd}
	}
	defaults := cloudprovider.GroupOptions{
		ScaleDownUtilizationThreshold: a.opts.ScaleDownUtilizationThreshold, ScaleDownGPUUtilizationThreshold: a.opts.ScaleDownGPUUtilizationThreshold,
		ScaleDownUnneededTime: a.opts.ScaleDownUnneededTime, ScaleDownUnreadyTime: a.opts.ScaleDownUnreadyTime,
	}
	groupOpts := map[string]cloudprovider.GroupOptions{}
	for id, g := range byID {
		groupOpts[id] = g.Options(defaults)
	}
	sd.pruneGone(l)
	nodes := make([]scaledown.Node, 0, l.snap.Len())
	for i := 0; i < l.snap.Len(); i++ {
		ni := l.snap.NodeInfo(i)
		n := ni.Node()
		req := ni.GetRequested()
		// A node whose machine was deleted but whose Node object lingers is
		// no destination for moved pods.
		sn := scaledown.Node{Node: n, Ready: a.usable(n, l.now) && !sd.isGone(n.Name), Requested: &scaledown.Requested{
			MilliCPU: req.GetMilliCPU(), Memory: req.GetMemory(), GPU: req.GetScalarResources()[a.opts.GPUResourceName]}}
		// A node pending preflight is coming capacity and one that failed
		// is being replaced: neither is a scale-down candidate.
		pf, _ := a.opts.Preflight.Classify(n, l.now)
		if g, ok := l.groupOf[n.Name]; ok && pf == preflight.Passed && !sd.isDraining(n.Name) && !sd.isGone(n.Name) {
			sn.Group = g.ID()
			o := groupOpts[g.ID()]
			sn.UnneededTime, sn.UnreadyTime = o.ScaleDownUnneededTime, o.ScaleDownUnreadyTime
			sn.UtilizationThreshold, sn.GPUUtilizationThreshold = o.ScaleDownUtilizationThreshold, o.ScaleDownGPUUtilizationThreshold
		}
		for _, pi := range ni.GetPods() {
			sn.Pods = append(sn.Pods, pi.GetPod())
		}
		nodes = append(nodes, sn)
	}
	a.untaintStale(ctx, l)
	d := sd.planner.Plan(ctx, l.now, l.snap, nodes, groups, scaledown.NewPDBs(pdbList), sd.inflight())
	a.reportScaleDownPlan(ctx, l, d)
	a.softTaint(ctx, l, d.Unneeded)
	a.removeEmpty(ctx, l, byID, d.Empty)
	for _, r := range d.Drain {
		a.startDrain(ctx, l, r)
	}
	return nil
}

// scaleDownHeld says why scale-down waits this loop, or "".
func (a *Autoscaler) scaleDownHeld(l *loop) string {
	sd := a.scaleDown
	sd.mu.Lock()
	lastDelete, lastFailure := sd.lastDelete, sd.lastFailure
	sd.mu.Unlock()
	switch {
	case len(l.scaleUp.ScaleUps) > 0:
		return "scaled up in this loop"
	case !lastDelete.IsZero() && l.now.Sub(lastDelete) < a.opts.ScaleDownDelayAfterDelete:
		return "within --scale-down-delay-after-delete"
	case !lastFailure.IsZero() && l.now.Sub(lastFailure) < a.opts.ScaleDownDelayAfterFailure:
		return "within --scale-down-delay-after-failure"
	}
	return ""
}

func (s *scaleDownState) isGone(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gone[name]
}

// pruneGone forgets deleted nodes whose Node objects are gone.
func (s *scaleDownState) pruneGone(l *loop) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.gone {
		if _, ok := l.snap.Index(name); !ok {
			delete(s.gone, name)
		}
	}
}

func (s *scaleDownState) isDraining(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining[name]
}

func (a *Autoscaler) reportScaleDownPlan(ctx context.Context, l *loop, d scaledown.Decision) {
	sd := a.scaleDown
	a.metrics.UnneededNodes.Set(float64(len(d.Unneeded)))
	a.metrics.KeptNodes.Reset()
	for r, n := range d.Kept {
		a.metrics.KeptNodes.WithLabelValues(string(r)).Set(float64(n))
	}
	b := 0.0
	if d.Braked {
		b = 1
		if !sd.braked {
			msg := fmt.Sprintf("scale-down brake engaged: %d nodes deleted within %s, the most allowed (%.0f%% of the cluster, %.0f%% of a group)",
				sd.planner.Brake().Recent(l.now), a.opts.ScaleDownBrakeWindow, 100*a.opts.ScaleDownBrakeClusterShare, 100*a.opts.ScaleDownBrakeGroupShare)
			klog.FromContext(ctx).Info("Scale-down brake engaged", "recentDeletions", sd.planner.Brake().Recent(l.now), "window", a.opts.ScaleDownBrakeWindow)
			a.groupEvent(apiv1.EventTypeWarning, EventScaleDownBrake, msg)
		}
	}
	sd.braked = d.Braked
	a.metrics.BrakeEngaged.Set(b)
	l.scaleDown = scaleDownReport{Unneeded: len(d.Unneeded), Removing: len(d.Empty) + len(d.Drain) + sd.inflight(),
		Braked: d.Braked, RecentCount: sd.planner.Brake().Recent(l.now)}
	if len(d.Empty)+len(d.Drain) > 0 {
		klog.FromContext(ctx).Info("Scale-down decision", "unneeded", len(d.Unneeded), "empty", len(d.Empty), "drain", len(d.Drain), "braked", d.Braked)
	}
}

// softTaint keeps DeletionCandidate taints on exactly the unneeded nodes,
// within a per-loop write budget. Which nodes carry the taint is read from
// the nodes themselves, so a restart cleans up after the previous leader.
func (a *Autoscaler) softTaint(ctx context.Context, l *loop, unneeded []string) {
	budget := a.opts.MaxSoftTaintsPerLoop
	want := make(map[string]bool, len(unneeded))
	for _, n := range unneeded {
		want[n] = true
	}
	has := map[string]bool{}
	for _, n := range l.nodes {
		if hasTaintKey(n, scaledown.DeletionCandidateTaint) {
			has[n.Name] = true
		}
	}
	taint := apiv1.Taint{Key: scaledown.DeletionCandidateTaint, Value: fmt.Sprint(l.now.Unix()), Effect: apiv1.TaintEffectPreferNoSchedule}
	for _, n := range unneeded {
		if has[n] {
			continue
		}
		if budget <= 0 {
			return
		}
		budget--
		if err := a.actions.AddTaint(ctx, n, taint); err != nil {
			klog.FromContext(ctx).Error(err, "Adding deletion-candidate taint", "node", n)
		}
	}
	for _, n := range sortedKeys(has) {
		if want[n] {
			continue
		}
		if budget <= 0 {
			return
		}
		budget--
		if err := a.actions.RemoveTaint(ctx, n, scaledown.DeletionCandidateTaint); err != nil {
			klog.FromContext(ctx).Error(err, "Removing deletion-candidate taint", "node", n)
		}
	}
}

// untaintStale removes ToBeDeleted taints this process is not acting on and
// whose machine is not being deleted: left by a drain that a crash or a
// leader change interrupted, they would keep pods off a healthy node.
func (a *Autoscaler) untaintStale(ctx context.Context, l *loop) {
	// Only nodes whose machine is listed and not deleting are untainted; a
	// node whose machine is gone is on its way out.
	alive := map[string]bool{}
	for _, g := range l.groups {
		ins, err := g.Instances()
		if err != nil {
			continue
		}
		for _, in := range ins {
			if in.State != cloudprovider.InstanceDeleting {
				alive[in.ProviderID] = true
			}
		}
	}
	budget := a.opts.MaxSoftTaintsPerLoop
	for _, n := range l.nodes {
		if budget <= 0 {
			return
		}
		if _, managed := l.groupOf[n.Name]; !managed || !hasTaintKey(n, scaledown.ToBeDeletedTaint) ||
			a.scaleDown.isDraining(n.Name) || a.scaleDown.isGone(n.Name) || !alive[n.Spec.ProviderID] {
			continue
		}
		budget--
		if err := a.actions.RemoveTaint(ctx, n.Name, scaledown.ToBeDeletedTaint); err != nil {
			klog.FromContext(ctx).Error(err, "Removing a stale to-be-deleted taint", "node", n.Name)
			continue
		}
		klog.FromContext(ctx).Info("Removed a stale to-be-deleted taint", "node", n.Name)
	}
}

func hasTaintKey(n *apiv1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func toBeDeleted(now time.Time) apiv1.Taint {
	return apiv1.Taint{Key: scaledown.ToBeDeletedTaint, Value: fmt.Sprint(now.Unix()), Effect: apiv1.TaintEffectNoSchedule}
}

// removeEmpty taints and deletes empty nodes, one DeleteNodes per group.
func (a *Autoscaler) removeEmpty(ctx context.Context, l *loop, byID map[string]cloudprovider.NodeGroup, empty []scaledown.Removal) {
	if len(empty) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	perGroup := map[string][]scaledown.Removal{}
	for _, r := range empty {
		if err := a.actions.AddTaint(ctx, r.Node.Name, toBeDeleted(l.now)); err != nil {
			a.failRemoval(ctx, l.now, r, "taint", err)
			continue
		}
		perGroup[r.Group] = append(perGroup[r.Group], r)
	}
	for _, id := range sortedKeys(perGroup) {
		rs := perGroup[id]
		ids := make([]string, 0, len(rs))
		for _, r := range rs {
			ids = append(ids, r.Node.Spec.ProviderID)
		}
		if err := byID[id].DeleteNodes(ctx, ids); err != nil {
			for _, r := range rs {
				a.failRemoval(ctx, l.now, r, "delete", err)
			}
			continue
		}
		for _, r := range rs {
			a.removed(l.now, r)
		}
		logger.Info("Removed empty nodes", "nodeGroup", id, "count", len(rs))
	}
}

func (a *Autoscaler) removed(now time.Time, r scaledown.Removal) {
	a.scaleDown.mu.Lock()
	a.scaleDown.lastDelete = now
	a.scaleDown.gone[r.Node.Name] = true
	a.scaleDown.mu.Unlock()
	a.metrics.ScaledDownNodes.WithLabelValues(r.Group, r.Reason).Inc()
	if a.rec != nil {
		a.rec.Eventf(r.Node, apiv1.EventTypeNormal, EventScaleDown, "node removed by vmss-autoscaler (%s, utilisation %.2f)", r.Reason, r.Util)
	}
}

// failRemoval untaints the node and records why.
func (a *Autoscaler) failRemoval(ctx context.Context, now time.Time, r scaledown.Removal, step string, err error) {
	klog.FromContext(ctx).Error(err, "Scale-down failed", "node", r.Node.Name, "nodeGroup", r.Group, "step", step)
	a.metrics.FailedScaleDowns.WithLabelValues(r.Group, step).Inc()
	if uerr := a.actions.RemoveTaint(context.WithoutCancel(ctx), r.Node.Name, scaledown.ToBeDeletedTaint); uerr != nil {
		klog.FromContext(ctx).Error(uerr, "Removing the to-be-deleted taint after a failed scale-down", "node", r.Node.Name)
	}
	a.scaleDown.mu.Lock()
	a.scaleDown.lastFailure = now
	a.scaleDown.mu.Unlock()
	if a.rec != nil {
		a.rec.Eventf(r.Node, apiv1.EventTypeWarning, EventScaleDownFailed, "scale-down failed at %s: %v", step, err)
	}
}

// startDrain taints and evicts a node in the background; the next loop
// deletes it.
func (a *Autoscaler) startDrain(ctx context.Context, l *loop, r scaledown.Removal) {
	sd := a.scaleDown
	sd.mu.Lock()
	sd.draining[r.Node.Name] = true
	sd.mu.Unlock()
	a.metrics.DrainsInFlight.Set(float64(sd.inflight()))
	sd.wg.Add(1)
	go func() {
		defer sd.wg.Done()
		if err := a.drain(ctx, l.now, r); err != nil {
			sd.mu.Lock()
			delete(sd.draining, r.Node.Name)
			sd.mu.Unlock()
			a.metrics.DrainsInFlight.Set(float64(sd.inflight()))
			return
		}
		// Still marked draining until the next loop deletes it, batched
		// with the other drained nodes of its group.
		sd.mu.Lock()
		sd.drained[r.Group] = append(sd.drained[r.Group], r)
		sd.mu.Unlock()
	}()
}

// flushDrained deletes the drained nodes, one DeleteNodes per group.
func (a *Autoscaler) flushDrained(ctx context.Context, l *loop) {
	sd := a.scaleDown
	sd.mu.Lock()
	batch := sd.drained
	sd.drained = map[string][]scaledown.Removal{}
	sd.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	byID := make(map[string]cloudprovider.NodeGroup, len(l.groups))
	for _, g := range l.groups {
		byID[g.ID()] = g
	}
	for _, id := range sortedKeys(batch) {
		rs := batch[id]
		ids := make([]string, 0, len(rs))
		for _, r := range rs {
			ids = append(ids, r.Node.Spec.ProviderID)
		}
		var err error
		if g, ok := byID[id]; ok {
			err = g.DeleteNodes(ctx, ids)
		} else {
			err = fmt.Errorf("node group %s is gone", id)
		}
		for _, r := range rs {
			if err != nil {
				a.failRemoval(ctx, l.now, r, "delete", err)
			} else {
				a.removed(l.now, r)
			}
			sd.mu.Lock()
			delete(sd.draining, r.Node.Name)
			sd.mu.Unlock()
		}
		if err == nil {
			klog.FromContext(ctx).Info("Removed drained nodes", "nodeGroup", id, "count", len(rs))
		}
	}
	a.metrics.DrainsInFlight.Set(float64(sd.inflight()))
}

// drain taints the node, evicts its pods through the Eviction API (retrying
// while a PodDisruptionBudget says not yet) and waits until they are gone,
// all within the graceful-termination cap plus a minute.
func (a *Autoscaler) drain(ctx context.Context, now time.Time, r scaledown.Removal) error {
	if err := a.actions.AddTaint(ctx, r.Node.Name, toBeDeleted(now)); err != nil {
		a.failRemoval(ctx, a.clock.Now(), r, "taint", err)
		return err
	}
	grace := int64(a.opts.MaxGracefulTerminationSec)
	deadline := a.clock.Now().Add(time.Duration(grace)*time.Second + time.Minute)
	pending := append([]*apiv1.Pod(nil), r.Pods...)
	for len(pending) > 0 {
		var retry []*apiv1.Pod
		for _, p := range pending {
			g := grace
			switch {
			case a.isBalloon(p):
				g = 0 // a placeholder: nothing to shut down
			case p.Spec.TerminationGracePeriodSeconds != nil && *p.Spec.TerminationGracePeriodSeconds < g:
				g = *p.Spec.TerminationGracePeriodSeconds
			}
			if err := a.actions.Evict(ctx, p, g); err != nil {
				a.metrics.Evictions.WithLabelValues("blocked").Inc()
				retry = append(retry, p)
				continue
			}
			a.metrics.Evictions.WithLabelValues("ok").Inc()
			if a.rec != nil {
				a.rec.Eventf(p, apiv1.EventTypeNormal, EventScaleDown, "deleting pod for node scale down of %s", r.Node.Name)
			}
		}
		pending = retry
		if len(pending) == 0 {
			break
		}
		if a.clock.Now().After(deadline) {
			err := fmt.Errorf("%d pods of node %s could not be evicted before the deadline", len(pending), r.Node.Name)
			a.failRemoval(ctx, a.clock.Now(), r, "evict", err)
			return err
		}
		select {
		case <-ctx.Done():
			a.failRemoval(ctx, a.clock.Now(), r, "evict", ctx.Err())
			return ctx.Err()
		case <-a.clock.After(5 * time.Second):
		}
	}
	if r.Reason == "unready" {
		// No kubelet will confirm the pods' end on an unready node; the
		// accepted evictions are what the node's removal waits for.
		return nil
	}
	for {
		left := 0
		for _, p := range r.Pods {
			cur, err := a.listers.Pods.Pods(p.Namespace).Get(p.Name)
			if err == nil && cur.UID == p.UID && cur.Spec.NodeName == r.Node.Name && cur.Status.Phase != apiv1.PodSucceeded && cur.Status.Phase != apiv1.PodFailed {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		if a.clock.Now().After(deadline) {
			err := fmt.Errorf("%d evicted pods of node %s still there at the deadline", left, r.Node.Name)
			a.failRemoval(ctx, a.clock.Now(), r, "drain-timeout", err)
			return err
		}
		select {
		case <-ctx.Done():
			a.failRemoval(ctx, a.clock.Now(), r, "drain-timeout", ctx.Err())
			return ctx.Err()
		case <-a.clock.After(time.Second):
		}
	}
}
