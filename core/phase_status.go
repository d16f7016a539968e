package core

import (
	"context"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
)

// writeStatus renders the per-group state and writes it when it changed.
func (a *Autoscaler) writeStatus(ctx context.Context, l *loop) error {
	if a.status == nil {
		return nil
	}
	st := a.loopStatus(l)
	cmp, full, err := boundStatus(&st)
	if err != nil {
		return err
	}
	if cmp == a.lastStatus {
		return nil
	}
	a.publishStatus(ctx, cmp, full)
	return nil
}

// loopStatus is the loop's status, as the status ConfigMap shows it.
func (a *Autoscaler) loopStatus(l *loop) Status {
	st := Status{Nodes: len(l.nodes), UnschedulablePods: l.unschedulable, PodsAwaitingNodes: l.awaiting}
	for _, n := range l.nodes {
		if a.usable(l, n) {
			st.ReadyNodes++
		}
	}
	st.NodeGroups = a.nodeGroupsStatus(l)
	st.ScaleDown = ScaleDownInfo{UnneededNodes: l.scaleDown.Unneeded, Removing: l.scaleDown.Removing,
		BrakeEngaged: l.scaleDown.Braked, RecentDeletions: l.scaleDown.RecentCount, HeldBecause: l.scaleDown.Skipped, Kept: l.scaleDown.Kept}
	st.PodsWithoutScaleUp = codeCounts(l.noScaleUp)
	st.NodeAddition = a.queueStatus(l.addition)
	st.WarmPools = warmStatus(l.warm)
	st.ClusterUnhealthy = l.unhealthy
	st.ConfigFallback = a.configFallback()
	st.ReplacementsHeld = l.replacementsHeld
	st.ReplacementsBlocked = l.replacementsBlocked
	st.PreflightIncidents = l.incidents
	st.PreflightFailuresSettling = l.failuresSettling
	st.Health = a.healthStatus(l)
	st.ProvisioningRequests = a.provisioningRequestsStatus(l)
	st.CapacityBuffers = a.buffersStatus(l)
	st.LastChange = l.now.UTC()
	return st
}

// nodeGroupsStatus is each registered group's state, with the source of
// its template and whether health has it degraded.
func (a *Autoscaler) nodeGroupsStatus(l *loop) []GroupStatus {
	var out []GroupStatus
	for _, gs := range a.registry.Groups() {
		g := groupStatus(gs)
		if ng, ok := l.byID[gs.ID]; ok {
			g.TemplateSource, _ = a.templates.source(a, l, ng)
		}
		if l.health != nil {
			g.Degraded = l.health.degraded[gs.ID]
		}
		out = append(out, g)
	}
	return out
}

// healthStatus is the node health's part of the status: nil when there is
// nothing to show.
func (a *Autoscaler) healthStatus(l *loop) *HealthStatus {
	h := l.health
	if h == nil || !(h.paused || len(h.nodes) > 0 || len(h.breakers) > 0 || len(h.incidents) > 0 || len(h.notJudged) > 0 || len(h.repairs) > 0 || a.health.policyErr != "") {
		return nil
	}
	return &HealthStatus{Paused: h.paused, PolicyError: a.health.policyErr, Unhealthy: h.nodes, More: h.more, Breakers: h.breakers,
		Incidents: h.incidents, Cordoned: h.cordoned, CordonCeiling: h.ceiling, NotJudged: h.notJudged, NotJudgedMore: h.notJudgedMore,
		Repairs: h.repairs, RepairsMore: h.repairsMore}
}

// publishStatus writes the rendered status, when the gate lets it; a
// failed write is counted and told (its first of a run as an event).
func (a *Autoscaler) publishStatus(ctx context.Context, cmp, full string) {
	if err := a.gate.Write("status"); err != nil {
		klog.FromContext(ctx).V(2).Info("Status not written", "err", err.Error())
		return
	}
	if err := a.status.WriteStatus(ctx, full); err != nil {
		// The status is for people; the loop's work is done. A write
		// that fails (the API server, a refused size) is counted and
		// told, never a failed loop (which /healthz would turn into a
		// restart of the leader, then of the standby).
		a.metrics.StatusWriteFailures.Inc()
		klog.FromContext(ctx).Error(err, "Writing the status ConfigMap; retried next loop")
		if a.rec != nil && a.lastStatusErr == "" {
			a.groupEvent(apiv1.EventTypeWarning, EventStatusWriteFailed, capText("writing the status failed: "+err.Error(), maxStatusMessage))
		}
		a.lastStatusErr = err.Error()
		return
	}
	a.lastStatus, a.lastStatusErr = cmp, ""
}

// EventStatusWriteFailed is on the status ConfigMap when writing it
// fails (the first failure of a run of them).
const EventStatusWriteFailed = "StatusWriteFailed"

func groupStatus(gs *clusterstate.GroupState) GroupStatus {
	r := gs.Readiness
	out := GroupStatus{
		Name: gs.ID, Min: gs.Min, Max: gs.Max,
		Ready: r.Ready, Unready: r.Unready, NotStarted: r.NotStarted, Unregistered: r.Unregistered,
		LongUnregistered: r.LongUnregistered, InError: r.InError, Deleting: r.Deleting, Upcoming: r.Upcoming,
		Preflight: r.Preflight, PreflightFailed: r.PreflightFailed, MaxWarning: gs.MaxWarning, FailedRunning: r.FailedRunning,
		InstancesStale: gs.InstancesStale,
	}
	if r.TargetKnown {
		t := r.Target
		out.Target = &t
	}
	if gs.SizeError != nil {
		out.SizeError = gs.SizeError.Error()
	}
	if gs.Backoff.Active {
		out.Backoff = &BackoffStatus{Until: gs.Backoff.Until.UTC(), Reason: gs.Backoff.Reason}
	}
	if !gs.LastScaleUp.IsZero() {
		t := gs.LastScaleUp.UTC()
		out.LastScaleUp = &t
	}
	return out
}

// codeCounts are the loop's pods without a scale-up by reason, as the
// status keeps them (nil when there are none).
func codeCounts(byCode map[scaleup.ReasonCode]int) map[string]int {
	var out map[string]int
	for code, n := range byCode {
		if n > 0 {
			if out == nil {
				out = map[string]int{}
			}
			out[string(code)] = n
		}
	}
	return out
}
