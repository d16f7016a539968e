package core

import (
	"context"
	"fmt"
	"math"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
)

// Events of preflight incidents, on the status ConfigMap.
const (
	// EventPreflightIncident: many nodes fail the same check at once.
	EventPreflightIncident = "PreflightIncident"
	// EventPreflightIncidentOver: fewer than the threshold fail it now.
	EventPreflightIncidentOver = "PreflightIncidentOver"
)

// incidents tells many nodes failing the same preflight check at once (a
// DNS outage makes the chart's DNS check fail everywhere) from many bad
// machines: the first is the check's target broken, and replacing the
// nodes, even within the replacement brake's budget, would take healthy
// machines away for nothing.
type incidents struct {
	// firstFailed is when each failed node was first seen failed.
	firstFailed map[string]time.Time
	// active are the checks in an incident, with the nodes failing them.
	active map[string]int
	// belowSince is when fewer than the threshold began to fail an active
	// check: it ends once that has lasted --preflight-failure-settle.
	belowSince map[string]time.Time
}

func newIncidents() incidents {
	return incidents{firstFailed: map[string]time.Time{}, active: map[string]int{}, belowSince: map[string]time.Time{}}
}

// settled says a failed node's failure has stood for settle: it may be
// acted on. A node not seen failed by detectIncidents has not.
func (in *incidents) settled(name string, now time.Time, settle time.Duration) bool {
	first, ok := in.firstFailed[name]
	return ok && now.Sub(first) >= settle
}

// clusterTarget is the sum of the groups' known targets.
func (a *Autoscaler) clusterTarget() int {
	total := 0
	for _, gs := range a.registry.Groups() {
		if gs.Readiness.TargetKnown {
			total += gs.Readiness.Target
		}
	}
	return total
}

// incidentThreshold is how many nodes failing one check within the window
// make an incident.
func (a *Autoscaler) incidentThreshold() int {
	o := a.opts
	return max(o.PreflightIncidentMinNodes, int(math.Ceil(o.PreflightIncidentClusterShare*float64(a.clusterTarget()))))
}

// detectIncidents groups the failed nodes by the check they failed. An
// incident starts when at least the threshold of nodes first seen failing
// within --preflight-incident-window fail one check, and lasts until fewer
// than the threshold have failed it for --preflight-failure-settle (a node
// passes again when the agent's periodic re-run succeeds, and the agents
// report one by one). It returns the checks in an incident.
func (a *Autoscaler) detectIncidents(ctx context.Context, l *loop, failed []clusterstate.NodeResult) map[string]int {
	in := &a.preflight.incidents
	recent, all := a.countFailedChecks(l, failed)
	threshold := a.incidentThreshold()
	a.startIncidents(ctx, recent, all, threshold)
	a.endIncidents(ctx, l, all, threshold)
	out := make(map[string]int, len(in.active))
	for c, n := range in.active {
		out[c] = n
		a.metrics.PreflightIncidentNodes.WithLabelValues(c).Set(float64(n))
	}
	return out
}

// countFailedChecks counts the failed nodes by the check they failed: all
// of them, and those first seen failing within --preflight-incident-window
// (recent). It keeps when each node was first seen failing, and forgets
// the nodes that fail no more.
func (a *Autoscaler) countFailedChecks(l *loop, failed []clusterstate.NodeResult) (recent, all map[string]int) {
	in := &a.preflight.incidents
	now, window := l.now, a.opts.PreflightIncidentWindow
	recent, all = map[string]int{}, map[string]int{}
	present := make(map[string]bool, len(failed))
	for _, f := range failed {
		name := f.Node.Name
		present[name] = true
		first, ok := in.firstFailed[name]
		if !ok {
			first = now
			in.firstFailed[name] = now
		}
		c := a.opts.Preflight.FailedCheck(f.Node)
		all[c]++
		if now.Sub(first) <= window {
			recent[c]++
		}
	}
	for name := range in.firstFailed {
		if !present[name] {
			delete(in.firstFailed, name)
		}
	}
	return recent, all
}

// startIncidents starts an incident for each check not in one that at
// least threshold nodes recently failed.
func (a *Autoscaler) startIncidents(ctx context.Context, recent, all map[string]int, threshold int) {
	in := &a.preflight.incidents
	window := a.opts.PreflightIncidentWindow
	logger := klog.FromContext(ctx)
	for _, c := range sortedKeys(recent) {
		if _, on := in.active[c]; on || recent[c] < threshold {
			continue
		}
		in.active[c] = all[c]
		delete(in.belowSince, c)
		msg := fmt.Sprintf("preflight incident: %d nodes failed check %q within %s (at least %d: --preflight-incident-min-nodes, --preflight-incident-cluster-share); "+
			"what it tests is broken, not the machines: nodes failing it are not cordoned, drained or deleted until fewer than %d have failed it for %s (--preflight-failure-settle)",
			recent[c], c, window, threshold, threshold, a.opts.PreflightFailureSettle)
		logger.Info("Preflight incident: nodes failing the same check are kept", "check", c, "nodes", recent[c], "threshold", threshold)
		a.groupEvent(apiv1.EventTypeWarning, EventPreflightIncident, msg)
	}
}

// endIncidents updates each incident's count of failed nodes, and ends
// those with fewer than threshold failed nodes for
// --preflight-failure-settle.
func (a *Autoscaler) endIncidents(ctx context.Context, l *loop, all map[string]int, threshold int) {
	in := &a.preflight.incidents
	now := l.now
	logger := klog.FromContext(ctx)
	for _, c := range sortedKeys(in.active) {
		in.active[c] = all[c]
		if all[c] >= threshold {
			delete(in.belowSince, c)
			continue
		}
		since, ok := in.belowSince[c]
		if !ok {
			since = now
			in.belowSince[c] = now
		}
		if now.Sub(since) < a.opts.PreflightFailureSettle {
			continue // the rest of the agents may still be reporting
		}
		delete(in.active, c)
		delete(in.belowSince, c)
		a.metrics.PreflightIncidentNodes.DeleteLabelValues(c)
		logger.Info("Preflight incident over", "check", c, "nodesStillFailing", all[c], "threshold", threshold)
		a.groupEvent(apiv1.EventTypeNormal, EventPreflightIncidentOver,
			fmt.Sprintf("preflight incident over: %d nodes fail check %q now, fewer than %d; they are replaced as failed nodes again", all[c], c, threshold))
	}
}
