package core

import (
	"time"

	"context"
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// Scale-down events, as in cluster-autoscaler.
const (
	EventScaleDown       = actuation.EventScaleDown
	EventScaleDownFailed = actuation.EventScaleDownFailed
	EventScaleDownBrake  = "ScaleDownBrake"
)

// scaleDownState is kept between loops: the planner (unneeded times, the
// brake) and the actuator (taints, drains, deletions).
type scaleDownState struct {
	planner  *scaledown.Planner
	brake    *scaledown.Brake
	actuator *actuation.ScaleDown // nil: no Kubernetes writes, no scale-down
	braked   bool
}

func newScaleDownState(d Deps, m *Metrics, remover *actuation.Remover) *scaleDownState {
	o := d.Options
	brake := scaledown.NewBrake(o.brakeOptions())
	s := &scaleDownState{planner: scaledown.NewPlanner(o.scaleDownOptions(), d.Simulator, brake), brake: brake}
	if d.Actions != nil {
		s.actuator = actuation.NewScaleDown(d.Actions, remover, brake, d.Listers.Pods, d.Recorder, actuation.Metrics{
			Evictions: m.Evictions, ScaledDown: m.ScaledDownNodes, Failed: m.FailedScaleDowns, DrainsInFlight: m.DrainsInFlight,
		}, d.Clock, o.actuationOptions())
	}
	return s
}

// setOptions hands new options to the planner, the brake and the
// actuator (drains already running keep theirs).
func (s *scaleDownState) setOptions(o Options) {
	s.planner.SetOptions(o.scaleDownOptions())
	s.brake.SetOptions(o.brakeOptions())
	if s.actuator != nil {
		s.actuator.SetOptions(o.actuationOptions())
	}
}

func (o Options) brakeOptions() scaledown.BrakeOptions {
	return scaledown.BrakeOptions{ClusterShare: o.ScaleDownBrakeClusterShare, GroupShare: o.ScaleDownBrakeGroupShare, Window: o.ScaleDownBrakeWindow,
		MaxPending: o.maxRemovalPending()}
}

// maxRemovalPending bounds how long a decided removal takes to be sent:
// the pause after its taint, its drain's deadline (the graceful-termination
// cap plus a minute) and a minute for the loops between.
func (o Options) maxRemovalPending() time.Duration {
	return o.NodeDeleteDelayAfterTaint + time.Duration(o.MaxGracefulTerminationSec)*time.Second + 2*time.Minute
}

// evictOptions are copied into every eviction; isBalloon is bound to this
// copy of o, never to the autoscaler's options.
func (o Options) evictOptions() actuation.EvictOptions {
	return actuation.EvictOptions{MaxGracefulTerminationSec: o.MaxGracefulTerminationSec, IsPlaceholder: o.isBalloon}
}

func (o Options) actuationOptions() actuation.Options {
	return actuation.Options{Evict: o.evictOptions(), MaxSoftTaintsPerLoop: o.MaxSoftTaintsPerLoop, DeleteDelayAfterTaint: o.NodeDeleteDelayAfterTaint}
}

func (o Options) scaleDownOptions() scaledown.Options {
	return scaledown.Options{
		Rules: scaledown.Rules{SkipNodesWithSystemPods: o.SkipNodesWithSystemPods, SkipNodesWithLocalStorage: o.SkipNodesWithLocalStorage,
			IsFreeRoom: o.isBalloon},
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
	// Kept counts the managed nodes kept, by reason (scaledown.Reason).
	Kept map[string]int
}

// WaitForDrains blocks until running drains finish (tests, shutdown).
func (a *Autoscaler) WaitForDrains() {
	if a.scaleDown.actuator != nil {
		a.scaleDown.actuator.Wait()
	}
}

// scaleDownPhase finds unneeded nodes and removes those unneeded for long
// enough: empty ones in bulk, others drained in parallel.
func (a *Autoscaler) scaleDownPhase(ctx context.Context, l *loop) error {
	act := a.scaleDown.actuator
	if act == nil {
		return nil
	}
	if l.unhealthy != "" {
		// The gate refuses every deletion and taint now; what was started
		// waits for the cluster to recover.
		a.scaleDown.planner.Reset()
		l.scaleDown.Skipped = "cluster unhealthy: " + l.unhealthy
		return nil
	}
	// Removals already under way finish whatever else this loop decides
	// (scale-down disabled or held included): drained nodes are deleted
	// (their pods are gone), deletions that failed after they were
	// accepted are taken back, and ToBeDeleted taints nobody acts on any
	// more (a dead leader's, a cancelled drain's) are removed.
	act.FlushDrained(ctx, l.now, l.byID)
	act.Reconcile(ctx, l.now, l.byID)
	act.Forget(func(name string) bool { _, ok := l.snap.Index(name); return ok })
	managed := func(name string) bool { _, ok := l.groupOf[name]; return ok }
	act.UntaintStale(ctx, l.nodes, l.groups, managed)
	if a.holdScaleDown(ctx, l, managed) {
		return nil
	}
	pdbList, err := a.scaleDownPDBs()
	if err != nil {
		return err
	}
	nodes := a.scaleDownNodes(l)
	d := a.scaleDown.planner.Plan(ctx, l.now, l.snap, nodes, a.scaleDownGroups(l), scaledown.NewPDBs(pdbList), act.InFlight())
	a.reportScaleDownPlan(ctx, l, d)
	act.SoftTaint(ctx, l.now, l.nodes, d.Unneeded, managed)
	if !a.saveScaleDownCount(ctx, l, d) {
		return nil
	}
	act.RemoveEmpty(ctx, l.now, l.byID, d.Empty)
	for _, r := range d.Drain {
		act.StartDrain(ctx, l.now, r)
	}
	return nil
}

// holdScaleDown says whether scale-down waits this loop (held, or
// disabled); when it does, unneeded times start again and, disabled, no
// node keeps its soft taint.
func (a *Autoscaler) holdScaleDown(ctx context.Context, l *loop, managed func(string) bool) bool {
	why := a.scaleDownHeld(l)
	if !a.opts.ScaleDownEnabled {
		why = "--scale-down-enabled=false"
	}
	if why == "" {
		return false
	}
	// Unneeded times start again when scale-down resumes: a node is
	// removed only after it was unneeded for the whole unneeded time
	// while scale-down could have acted.
	a.scaleDown.planner.Reset()
	if !a.opts.ScaleDownEnabled {
		// Disabled: no node is a deletion candidate.
		a.scaleDown.actuator.SoftTaint(ctx, l.now, l.nodes, nil, managed)
	}
	l.scaleDown.Skipped = why
	klog.FromContext(ctx).V(2).Info("Scale-down held", "reason", why)
	return true
}

// scaleDownPDBs are the PodDisruptionBudgets from the cache (none without
// their lister).
func (a *Autoscaler) scaleDownPDBs() ([]*policyv1.PodDisruptionBudget, error) {
	if a.listers.PDBs == nil {
		return nil, nil
	}
	pdbList, err := a.listers.PDBs.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing PodDisruptionBudgets from cache: %w", err)
	}
	return pdbList, nil
}

// saveScaleDownCount is the write-ahead of a decision that removes nodes:
// the brake counted these removals, and the next leader must see them
// counted even if this one dies mid-way. It says whether the removals may
// start; when the count could not be saved, the brake forgets them.
func (a *Autoscaler) saveScaleDownCount(ctx context.Context, l *loop, d scaledown.Decision) bool {
	if len(d.Empty)+len(d.Drain) == 0 {
		return true
	}
	err := a.persistSafetyState(ctx, l.now)
	if err == nil {
		return true
	}
	klog.FromContext(ctx).Error(err, "Scale-down not started: the brake's count could not be saved first; retried next loop")
	for _, r := range d.Empty {
		a.scaleDown.brake.Unreserve(r.Node.Name) // not carried out
	}
	for _, r := range d.Drain {
		a.scaleDown.brake.Unreserve(r.Node.Name)
	}
	return false
}

// scaleDownGroups are the groups scale-down may act on: known size, with
// their minimum, target and health.
func (a *Autoscaler) scaleDownGroups(l *loop) map[string]*scaledown.Group {
	groups := map[string]*scaledown.Group{}
	for _, g := range l.groups {
		gs := a.registry.Group(g.ID())
		if gs == nil || gs.SizeError != nil || !gs.Readiness.TargetKnown {
			continue
		}
		rd := gs.Readiness
		unready := rd.Unready + rd.LongUnregistered
		healthy := !(unready > 3 && float64(unready) > a.opts.ScaleDownMaxUnreadyShare*float64(rd.Registered+rd.LongUnregistered))
		// Removals decided and not yet sent (waiting for the delay after
		// their taint, or draining) count as deleting.
		groups[g.ID()] = &scaledown.Group{Min: gs.Min, Target: rd.Target, Deleting: rd.Deleting + a.scaleDown.actuator.InFlightIn(g.ID()), Healthy: healthy,
			RecentScaleUp: !gs.LastScaleUp.IsZero() && l.now.Sub(gs.LastScaleUp) < a.opts.ScaleDownDelayAfterAdd}
	}
	return groups
}

// scaleDownNodes describes every node to the planner: all are destinations
// for moved pods when usable; only managed nodes past preflight and not
// already being removed are candidates, with their group's thresholds.
func (a *Autoscaler) scaleDownNodes(l *loop) []scaledown.Node {
	defaults := cloudprovider.GroupOptions{
		ScaleDownUtilizationThreshold: a.opts.ScaleDownUtilizationThreshold, ScaleDownGPUUtilizationThreshold: a.opts.ScaleDownGPUUtilizationThreshold,
		ScaleDownUnneededTime: a.opts.ScaleDownUnneededTime, ScaleDownUnreadyTime: a.opts.ScaleDownUnreadyTime,
	}
	groupOpts := make(map[string]cloudprovider.GroupOptions, len(l.byID))
	for id, g := range l.byID {
		groupOpts[id] = g.Options(defaults)
	}
	nodes := make([]scaledown.Node, 0, l.snap.Len())
	for i := 0; i < l.snap.Len(); i++ {
		ni := l.snap.NodeInfo(i)
		n := ni.Node()
		req := ni.GetRequested()
		gone := a.machineDeleted(n.Name)
		// A node whose machine was deleted but whose Node object lingers is
		// no destination for moved pods.
		sn := scaledown.Node{Node: n, Ready: a.usable(l, n) && !gone, Version: ni.GetGeneration(), Requested: &scaledown.Requested{
			MilliCPU: req.GetMilliCPU(), Memory: req.GetMemory(), GPU: req.GetScalarResources()[a.opts.GPUResourceName]}}
		if g, ok := a.candidateGroup(l, n, gone); ok {
			sn.Group = g.ID()
			o := groupOpts[g.ID()]
			sn.UnneededTime, sn.UnreadyTime = o.ScaleDownUnneededTime, o.ScaleDownUnreadyTime
			sn.UtilizationThreshold, sn.GPUUtilizationThreshold = o.ScaleDownUtilizationThreshold, o.ScaleDownGPUUtilizationThreshold
		}
		sn.Pods = l.snap.Pods(i) // shared with the snapshot: read only
		nodes = append(nodes, sn)
	}
	return nodes
}

// candidateGroup is the group of a node that is a scale-down candidate;
// false for a node that is none: unmanaged, or one of those below.
func (a *Autoscaler) candidateGroup(l *loop, n *apiv1.Node, gone bool) (cloudprovider.NodeGroup, bool) {
	// A node pending preflight, or still starting up (a startup taint,
	// GPUs not advertised yet) within --max-node-startup-time, is coming
	// capacity, and one that failed preflight is being replaced: none is
	// a scale-down candidate.
	pf, _ := a.opts.Preflight.Classify(n, l.now)
	// A node pending pods fit on will be used as soon as the scheduler
	// places them (a gang waiting for all its members): not a candidate.
	// Nor is one holding room a ProvisioningRequest booked (the booked
	// pods are in the snapshot, and are no pods to move).
	// Nor is a node health handling cordoned: its policy keeps it (a
	// drain rule keeps the machine), replaces it, or uncordons it.
	_, healthCordoned := a.health.cordoned[n.Name]
	if g, ok := l.groupOf[n.Name]; ok && pf == preflight.Passed && !a.startingUp(l, n) && !l.claimed[n.Name] && !l.bookedNode(n.Name) && !l.bufferNode(n.Name) && !a.scaleDown.actuator.IsDraining(n.Name) && !gone && !healthCordoned {
		return g, true
	}
	return nil, false
}

// scaleDownHeld says why scale-down waits this loop, or "".
func (a *Autoscaler) scaleDownHeld(l *loop) string {
	// Held as cluster-autoscaler holds it: in a loop that asked the cloud
	// for nodes. Demand the node-addition queue only queued asked for
	// nothing, and with smoothing it may wait many minutes.
	for _, su := range l.scaleUp.ScaleUps {
		if su.Delta > 0 {
			return "scaled up in this loop"
		}
	}
	return a.scaleDown.actuator.Held(l.now, a.opts.ScaleDownDelayAfterDelete, a.opts.ScaleDownDelayAfterFailure)
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
	l.scaleDown = scaleDownReport{Unneeded: len(d.Unneeded), Removing: len(d.Empty) + len(d.Drain) + sd.actuator.InFlight(),
		Braked: d.Braked, RecentCount: sd.planner.Brake().Recent(l.now), Kept: map[string]int{}}
	for r, n := range d.Kept {
		l.scaleDown.Kept[string(r)] = n
	}
	if len(d.Empty)+len(d.Drain) > 0 {
		klog.FromContext(ctx).Info("Scale-down decision", "unneeded", len(d.Unneeded), "empty", len(d.Empty), "drain", len(d.Drain), "braked", d.Braked)
	}
}
