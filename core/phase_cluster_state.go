package core

import (
	"context"
	"fmt"
	"sort"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
)

// updateClusterState recomputes each group's readiness, then removes what
// failed: machines whose creation failed, machines that never registered,
// and requested machines the cloud never created. Their groups are backed
// off by the registry, so the scale-up phase of this same loop sends the
// pods elsewhere.
func (a *Autoscaler) updateClusterState(ctx context.Context, l *loop) error {
	logger := klog.FromContext(ctx)
	act := a.registry.Update(l.now, l.groups, l.nodes, func(n *apiv1.Node) cloudprovider.NodeGroup { return l.groupOf[n.Name] })
	l.actions = act
	a.guardUnready(ctx, l)
	a.reportFailedRunning(ctx, act)
	a.takeEvictions(ctx, l)
	for _, g := range sortedKeys(act.LostDeletes) {
		a.metrics.ReplacementsLost.WithLabelValues(g, "failed-machine").Add(float64(act.LostDeletes[g]))
		logger.Info("Failed machines still listed long after their deletion was sent; asking again", "nodeGroup", g, "count", act.LostDeletes[g],
			"after", a.opts.DeletionLostAfter)
	}
	a.reportScaleUpFailures(ctx, act.Failures)
	if l.unhealthy != "" && len(act.Delete) > 0 {
		// Held, not forgotten: asked again by the next Update.
		for id, ids := range act.Delete {
			a.registry.RetryDelete(ids)
			logger.Info("Failed machines kept while the cluster is unhealthy", "nodeGroup", id, "count", len(ids), "reason", l.unhealthy)
		}
		act.Delete = nil
	}
	a.removeFailedMachines(ctx, l, act.Delete)
	a.lowerUncreatedTargets(ctx, l, act.DecreaseTarget)
	for _, gs := range a.registry.Groups() {
		a.publishGroupMetrics(gs)
		if gs.SizeError != nil {
			a.metrics.SizeUnknown.WithLabelValues(gs.ID).Inc()
			logger.Info("Skipping node group with unknown size", "nodeGroup", gs.ID, "err", gs.SizeError.Error())
		}
	}
	return nil
}

// reportScaleUpFailures counts, logs and tells the scale-up failures the
// cluster state's Update found.
func (a *Autoscaler) reportScaleUpFailures(ctx context.Context, failures []clusterstate.Failure) {
	logger := klog.FromContext(ctx)
	for _, f := range failures {
		a.metrics.FailedScaleUps.WithLabelValues(f.Group, f.Reason).Inc()
		logger.Info("Scale-up failed", "nodeGroup", f.Group, "reason", f.Reason, "class", f.Class.String(), "message", f.Message)
		reason := EventFailedScaleUp
		if f.Reason == "preflight" {
			reason = EventPreflightFailures
		}
		a.groupEvent(apiv1.EventTypeWarning, reason, fmt.Sprintf("node group %s: %s", f.Group, f.Message))
	}
}

// lowerUncreatedTargets lowers each group's target by the machines it
// requested that the cloud never created.
func (a *Autoscaler) lowerUncreatedTargets(ctx context.Context, l *loop, decrease map[string]int) {
	logger := klog.FromContext(ctx)
	for _, id := range sortedKeys(decrease) {
		delta := decrease[id]
		if err := l.byID[id].DecreaseTargetSize(ctx, delta); err != nil {
			logger.Error(err, "Lowering target for machines never created", "nodeGroup", id, "delta", delta)
			continue
		}
		logger.Info("Lowered target for machines never created", "nodeGroup", id, "delta", delta)
	}
}

// Events of the cluster-wide unready guard, on the status ConfigMap.
const (
	EventClusterUnhealthy = "ClusterUnhealthy"
	EventClusterHealthy   = "ClusterHealthy"
)

// guardUnready is the cluster-wide unready guard: when more than
// --ok-total-unready-count managed nodes and more than
// --max-total-unready-percentage of them are unready (or never registered),
// the trouble is the cluster's, not the machines': l.unhealthy says why,
// and no path deletes, cordons or drains this loop.
func (a *Autoscaler) guardUnready(ctx context.Context, l *loop) {
	unready, total := 0, 0
	for _, gs := range a.registry.Groups() {
		rd := gs.Readiness
		unready += rd.Unready + rd.LongUnregistered
		total += rd.Registered + rd.LongUnregistered
	}
	if unready > a.opts.OkTotalUnreadyCount && float64(unready) > a.opts.MaxTotalUnreadyPercentage/100*float64(total) {
		l.unhealthy = fmt.Sprintf("%d of %d managed nodes unready, more than %d and %.0f%% (--ok-total-unready-count, --max-total-unready-percentage)",
			unready, total, a.opts.OkTotalUnreadyCount, a.opts.MaxTotalUnreadyPercentage)
	}
	switch {
	case l.unhealthy != "" && a.unhealthy == "":
		klog.FromContext(ctx).Info("Cluster unhealthy: no deletion, cordon or drain until it recovers; scale-up goes on", "reason", l.unhealthy)
		a.groupEvent(apiv1.EventTypeWarning, EventClusterUnhealthy, "no deletion, cordon or drain until the cluster recovers: "+l.unhealthy)
	case l.unhealthy == "" && a.unhealthy != "":
		klog.FromContext(ctx).Info("Cluster healthy again", "was", a.unhealthy)
		a.groupEvent(apiv1.EventTypeNormal, EventClusterHealthy, "cluster healthy again; scale-down and replacement resume")
	}
	a.unhealthy = l.unhealthy
	// The gate holds every deletion, cordon, taint and eviction from now
	// until a loop finds the cluster healthy, drains between loops included.
	a.gate.Hold(l.unhealthy)
	v := 0.0
	if l.unhealthy != "" {
		v = 1
	}
	a.metrics.ClusterUnhealthy.Set(v)
}

func (a *Autoscaler) publishGroupMetrics(gs *clusterstate.GroupState) {
	// Scale-down's counters exist for every group from its first loop, at
	// zero: dashboards and alerts on their rate have a series before the
	// first removal or failure (a handful of series per group).
	for _, reason := range []string{"empty", "underutilized", "unready"} {
		a.metrics.ScaledDownNodes.WithLabelValues(gs.ID, reason)
	}
	for _, step := range []string{"taint", "evict", "drain-timeout", "recheck", "delete"} {
		a.metrics.FailedScaleDowns.WithLabelValues(gs.ID, step)
	}
	r := gs.Readiness
	for state, v := range map[string]int{
		"ready": r.Ready, "unready": r.Unready, "not_started": r.NotStarted, "unregistered": r.Unregistered,
		"long_unregistered": r.LongUnregistered, "in_error": r.InError, "deleting": r.Deleting, "upcoming": r.Upcoming,
		"preflight": r.Preflight, "preflight_failed": r.PreflightFailed, "failed_running": r.FailedRunning,
	} {
		a.metrics.Nodes.WithLabelValues(gs.ID, state).Set(float64(v))
	}
	if r.TargetKnown {
		a.metrics.TargetSize.WithLabelValues(gs.ID).Set(float64(r.Target))
	} else {
		a.metrics.TargetSize.DeleteLabelValues(gs.ID)
	}
	a.metrics.MinSize.WithLabelValues(gs.ID).Set(float64(gs.Min))
	a.metrics.MaxSize.WithLabelValues(gs.ID).Set(float64(gs.Max))
	b := 0.0
	if gs.Backoff.Active {
		b = 1
	}
	a.metrics.Backoff.WithLabelValues(gs.ID).Set(b)
}

// groupEvent records an event on the status ConfigMap, where CA also puts
// its node-group events.
func (a *Autoscaler) groupEvent(eventType, reason, msg string) {
	if a.rec == nil {
		return
	}
	ref := &apiv1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: a.opts.Namespace, Name: a.opts.StatusConfigMapName}
	a.rec.Event(ref, eventType, reason, msg)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
