package core

import (
	"context"
	"fmt"
	"sort"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
)

// EventBalloonsUpdated is on the status ConfigMap when a balloon
// Deployment was resized or repaired.
const EventBalloonsUpdated = "BalloonsUpdated"

// BalloonController keeps the balloon Deployments (balloon.Controller).
type BalloonController interface {
	Sync(ctx context.Context, specs []balloon.GroupSpec) (balloon.Result, error)
}

// isBalloon says a pod is a balloon the autoscaler understands: its room
// is free to real pods and it never makes a node needed. The receiver is a
// value: the method value o.isBalloon binds a copy of the options, so it
// may be handed to what outlives a loop (drains) without racing a reload.
func (o Options) isBalloon(p *apiv1.Pod) bool {
	return o.BalloonAware && o.Balloons.IsBalloon(p)
}

// isWarm says a pod is warm capacity: a balloon the autoscaler
// understands, or a capacity buffer's chunk. Its nodes are planned at the
// queue's lowest class.
func (o Options) isWarm(p *apiv1.Pod) bool {
	return o.isBalloon(p) || capacitybuffer.IsBufferPod(p)
}

// warmPool is one group's warm pool as of this loop.
type warmPool struct {
	Group     string
	Target    int
	WarmReady int // usable nodes of the group running a balloon
	Pending   int // balloon pods waiting for a node
}

// syncBalloons sizes each group's balloon Deployment to its warm target:
// pods of a pause container requesting the template node's allocatable
// less its DaemonSet pods, pinned to the group, tolerating its taints
// (never the preflight taint: warm nodes are nodes that passed).
func (a *Autoscaler) syncBalloons(ctx context.Context, l *loop) error {
	var specs []balloon.GroupSpec
	known := true
	if len(a.opts.WarmPools) > 0 {
		var err error
		if specs, l.warm, known, err = a.warmSpecs(ctx, l); err != nil {
			return err
		}
	}
	a.countWarm(l, l.warm)
	// With no pools the controller still runs: it removes the Deployments
	// of pools dropped by a reload or before a restart (cache reads only).
	if a.balloons == nil || !known {
		return nil
	}
	// The loop checked the fence when it started; a leader that stalled
	// since must not write Deployments either.
	if err := a.gate.Write("balloons"); err != nil {
		klog.FromContext(ctx).V(2).Info("Balloon Deployments not synced", "err", err.Error())
		return nil
	}
	res, err := a.balloons.Sync(ctx, specs)
	if err != nil {
		return fmt.Errorf("syncing balloon Deployments: %w", err)
	}
	// The controller logs what it wrote; the status ConfigMap gets an event
	// when a pool was resized or someone's edit was undone.
	for _, c := range res.Updated {
		a.groupEvent(apiv1.EventTypeNormal, EventBalloonsUpdated, fmt.Sprintf("balloon Deployment %s of node group %s set to %d replicas: %s", c.Name, c.Group, c.Replicas, c.Reason))
	}
	return nil
}

// warmSpecs are the balloon Deployments the warm pools want, and the pools
// to report. known is false when a group with a pool has an unknown size
// or no template: then nothing may be deleted on this view.
func (a *Autoscaler) warmSpecs(ctx context.Context, l *loop) ([]balloon.GroupSpec, map[string]*warmPool, bool, error) {
	dss, err := a.listers.DaemonSets.List(labels.Everything())
	if err != nil {
		return nil, nil, false, fmt.Errorf("listing DaemonSets from cache: %w", err)
	}
	var specs []balloon.GroupSpec
	known := true
	pools := map[string]*warmPool{}
	for _, g := range l.groups {
		pol, ok := a.opts.WarmPools[g.ID()]
		if !ok {
			continue
		}
		gs := a.registry.Group(g.ID())
		if gs == nil || !gs.Readiness.TargetKnown {
			// Size unknown: no action on this group, and no deletion of its
			// Deployment either (Sync deletes what specs omit).
			known = false
			continue
		}
		tmpl, err := a.templates.build(ctx, a, l, g, dss)
		if err != nil {
			klog.FromContext(ctx).Error(err, "No balloons for a group without a template", "nodeGroup", g.ID())
			known = false
			continue
		}
		// Cut to --balloon-max-replicas, which the chart's admission
		// policy holds the Deployment to: one refused would stop the loop.
		target := min(pol.WarmTarget(gs.Readiness.Target), gs.Max, int(a.opts.Balloons.MaxReplicas))
		pools[g.ID()] = &warmPool{Group: g.ID(), Target: target}
		requests := a.balloonRequests(tmpl)
		label, value, ok := a.groupSelector(g.ID(), tmpl.Node())
		if !ok {
			klog.FromContext(ctx).Error(nil, "No balloons for a group whose nodes no label selects", "nodeGroup", g.ID(),
				"labels", []string{a.opts.Balloons.NodeGroupLabel, AgentPoolLabel})
			known = false
			continue
		}
		tols := a.balloonTolerations(tmpl.Node())
		specs = append(specs, balloon.GroupSpec{Group: g.ID(), Replicas: int32(target), Requests: requests, Tolerations: tols,
			NodeLabel: label, NodeLabelValue: value})
	}
	return specs, pools, known, nil
}

// balloonRequests are what one balloon requests: the room a node of the
// template leaves free (its GPUs only when it has some).
func (a *Autoscaler) balloonRequests(tmpl fwk.NodeInfo) apiv1.ResourceList {
	alloc, req := tmpl.GetAllocatable(), tmpl.GetRequested()
	requests := apiv1.ResourceList{
		apiv1.ResourceCPU:    *resource.NewMilliQuantity(alloc.GetMilliCPU()-req.GetMilliCPU(), resource.DecimalSI),
		apiv1.ResourceMemory: *resource.NewQuantity(alloc.GetMemory()-req.GetMemory(), resource.BinarySI),
	}
	if gpus := alloc.GetScalarResources()[a.opts.GPUResourceName] - req.GetScalarResources()[a.opts.GPUResourceName]; gpus > 0 {
		requests[a.opts.GPUResourceName] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	return requests
}

// balloonTolerations tolerate the template node's taints but the
// preflight taint.
func (a *Autoscaler) balloonTolerations(tmpl *apiv1.Node) []apiv1.Toleration {
	var tols []apiv1.Toleration
	for _, t := range tmpl.Spec.Taints {
		if t.Key == a.opts.Preflight.Taint.Key {
			continue
		}
		tols = append(tols, apiv1.Toleration{Key: t.Key, Operator: apiv1.TolerationOpEqual, Value: t.Value, Effect: t.Effect})
	}
	return tols
}

// AgentPoolLabel is the label AKS puts on a node pool's nodes, with the
// pool's name.
const AgentPoolLabel = "kubernetes.azure.com/agentpool"

// groupSelector is the label that selects a group's nodes, read off its
// template (a live node when it has one): the node-group label naming the
// group when the nodes carry it (from the scale set's custom data:
// kubelet --node-labels), else AKS's agent-pool label. ok is false when
// neither is there: balloons pinned by a label the nodes lack would never
// run, and each would buy a node.
func (a *Autoscaler) groupSelector(group string, tmpl *apiv1.Node) (label, value string, ok bool) {
	if tmpl.Labels[a.opts.Balloons.NodeGroupLabel] == group {
		return "", "", true // the default: the node-group label
	}
	if pool := tmpl.Labels[AgentPoolLabel]; pool != "" {
		return AgentPoolLabel, pool, true
	}
	return "", "", false
}

// countWarm counts warm nodes and pending balloons per group; with no
// pools it only clears the metrics.
func (a *Autoscaler) countWarm(l *loop, pools map[string]*warmPool) {
	a.metrics.WarmTarget.Reset()
	a.metrics.WarmReady.Reset()
	a.metrics.BalloonsPending.Reset()
	if len(pools) == 0 {
		return
	}
	a.countWarmReady(l, pools)
	a.countPendingBalloons(l, pools)
	for id, w := range pools {
		a.metrics.WarmTarget.WithLabelValues(id).Set(float64(w.Target))
		a.metrics.WarmReady.WithLabelValues(id).Set(float64(w.WarmReady))
		a.metrics.BalloonsPending.WithLabelValues(id).Set(float64(w.Pending))
	}
}

// countWarmReady counts each pool's usable nodes that hold a balloon.
func (a *Autoscaler) countWarmReady(l *loop, pools map[string]*warmPool) {
	for i := 0; i < l.snap.Len(); i++ {
		ni := l.snap.NodeInfo(i)
		g, ok := l.groupOf[ni.Node().Name]
		if !ok || pools[g.ID()] == nil || !a.usable(l, ni.Node()) {
			continue
		}
		for _, pi := range ni.GetPods() {
			if a.opts.Balloons.IsBalloon(pi.GetPod()) {
				pools[g.ID()].WarmReady++
				break
			}
		}
	}
}

// countPendingBalloons counts each pool's balloons waiting for a node (not
// being deleted).
func (a *Autoscaler) countPendingBalloons(l *loop, pools map[string]*warmPool) {
	for _, p := range l.unbound {
		if a.opts.Balloons.IsBalloon(p) && p.DeletionTimestamp == nil {
			if w := pools[a.opts.Balloons.GroupOf(p)]; w != nil {
				w.Pending++
			}
		}
	}
}

// warmStatus lists the warm pools for the status ConfigMap.
func warmStatus(pools map[string]*warmPool) []WarmPoolStatus {
	out := make([]WarmPoolStatus, 0, len(pools))
	for _, w := range pools {
		out = append(out, WarmPoolStatus{NodeGroup: w.Group, Target: w.Target, WarmReady: w.WarmReady, BalloonsPending: w.Pending})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NodeGroup < out[j].NodeGroup })
	return out
}

// canPreemptBalloons says the scheduler would preempt balloons for p: its
// priority is above theirs and it may preempt.
func (a *Autoscaler) canPreemptBalloons(p *apiv1.Pod) bool {
	if p.Spec.PreemptionPolicy != nil && *p.Spec.PreemptionPolicy == apiv1.PreemptNever {
		return false
	}
	prio := int32(0)
	if p.Spec.Priority != nil {
		prio = *p.Spec.Priority
	}
	return prio > a.opts.Balloons.PriorityValue
}
