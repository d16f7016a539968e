package core

import (
	"context"
	"fmt"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/health"
)

// The repair ladder (#42). An 8-GPU VM given back to Azure may not come
// back (H100 capacity is scarce), so a replace rule may list in-place
// repairs (`repair: [reboot, reimage, redeploy]`, cheapest first, as AKS's
// node auto-repair orders them) that are tried on the drained node, one
// at a time, before its machine is deleted: each is asked of the cloud
// (cloudprovider.Repairer; the same write guards and deletion hold as a
// deletion) and given the rule's repairTimeout for the node to stop
// matching. A node that stops matching is fixed: it is released like any
// node that recovers (uncordoned, HealthRecovered) and HealthRepaired says
// by which step. A step that fails in the cloud or times out moves to the
// next; past the last, the machine is replaced as before. The whole
// ladder is one admission of the replacement brake (taken at the drain):
// a repair that fixes the node counts a window from that admission, as a
// drain does; a ladder that ends in a replacement counts from the
// deletion. A new leader goes on with the ladder where the last left it
// (the safety state's healthRepairs).
//
// Not yet: preflight again after a repair (the chart's admission policy
// lets the autoscaler put back neither the preflight taint nor its label),
// and a memory of the steps that fixed a node which breaks again later
// (it starts from the first step).

// Repair events.
const (
	EventHealthRepair       = "HealthRepair"
	EventHealthRepairFailed = "HealthRepairFailed"
	EventHealthRepaired     = "HealthRepaired"
)

// RepairRun is a node's repair ladder in progress, kept in the safety
// state for the next leader.
type RepairRun struct {
	Rule string `json:"rule"`
	// Step indexes the rule's repair steps; Action is that step.
	Step   int    `json:"step"`
	Action string `json:"action"`
	// Started is when the step was asked of the cloud (zero: not yet);
	// Asked when it was first tried (a step the cloud will not take is
	// given up after the rule's repairTimeout too).
	Started time.Time `json:"started,omitzero"`
	Asked   time.Time `json:"asked,omitzero"`
}

// repairInPlace runs the rule's repair ladder on a drained node due for
// replacement: true while the node waits on a repair (or one is being
// started), false when the ladder is done (or the rule has none, or the
// group cannot repair) and its machine may be deleted.
func (a *Autoscaler) repairInPlace(ctx context.Context, l *loop, c *healthCandidate, rule health.Rule) bool {
	if len(rule.Repair) == 0 {
		return false
	}
	g, ok := l.byID[c.group]
	rep, isRepairer := g.(cloudprovider.Repairer)
	if !ok || !isRepairer || !rep.CanRepair() {
		return false
	}
	hs, name, pid := a.health, c.node.Name, c.node.Spec.ProviderID
	run := hs.repairs[name]
	// A run of another rule, or one whose step began longer ago than the
	// loops could have left it (a stale run a new leader restored), starts
	// over.
	stale := run != nil && !run.Asked.IsZero() && l.now.Sub(run.Asked) > 4*rule.RepairTimeout
	if run == nil || run.Rule != rule.Name || run.Step >= len(rule.Repair) || stale {
		run = &RepairRun{Rule: rule.Name, Step: 0, Action: string(rule.Repair[0])}
		hs.repairs[name] = run
	}
	// The whole ladder is one admission of the replacement brake: it
	// stays reserved while the ladder runs, however long.
	a.replace.brake.Reserve(l.now, c.group, name)
	if run.Asked.IsZero() {
		run.Asked = l.now
	}
	if !run.Started.IsZero() || l.now.Sub(run.Asked) >= rule.RepairTimeout {
		st, known := rep.RepairState(pid)
		failed := !run.Started.IsZero() && known && st.Done && st.Err != nil && string(st.Action) == run.Action
		if !failed && l.now.Sub(run.Asked) < rule.RepairTimeout {
			a.setHealthState(c, "repairing: "+run.Action)
			return true
		}
		why := fmt.Sprintf("still matches %s after it", rule.RepairTimeout)
		outcome := "timeout"
		switch {
		case failed:
			why, outcome = st.Err.Error(), "failed"
		case run.Started.IsZero():
			why, outcome = fmt.Sprintf("not taken by the cloud within %s", rule.RepairTimeout), "failed"
		}
		a.endRepairStep(ctx, l, c, run, outcome, why)
		if run.Step+1 >= len(rule.Repair) {
			delete(hs.repairs, name)
			klog.FromContext(ctx).Info("Repairs did not fix the node; replacing its machine", "node", klog.KObj(c.node), "nodeGroup", c.group, "rule", rule.Name)
			return false
		}
		run.Step, run.Action, run.Started, run.Asked = run.Step+1, string(rule.Repair[run.Step+1]), time.Time{}, l.now
	}
	// A repair stops what runs on the machine, as a deletion does: it
	// waits for the same pods a deletion would (a pod still within its
	// grace, one bound in the cordon window).
	if h, err := a.remover.Holder(ctx, name); err != nil || h != nil {
		why := "its pods could not be read"
		if h != nil {
			why = h.String()
		}
		a.setHealthState(c, fmt.Sprintf("repair (%s) waits: %s", run.Action, why))
		return true
	}
	// Write-ahead, as a deletion: the next leader must know the step was
	// asked, or it would ask it again.
	if err := a.persistSafetyState(ctx, l.now); err != nil {
		klog.FromContext(ctx).Error(err, "Repair not sent: the safety state could not be saved first; retried next loop", "node", klog.KObj(c.node))
		a.setHealthState(c, "repairing: "+run.Action)
		return true
	}
	err := rep.Repair(ctx, pid, cloudprovider.RepairAction(run.Action))
	switch {
	case err == nil:
		run.Started, run.Asked = l.now, l.now
		a.metrics.HealthRepairs.WithLabelValues(c.group, run.Action, "started").Inc()
		klog.FromContext(ctx).Info("Repairing an unhealthy node in place", "node", klog.KObj(c.node), "nodeGroup", c.group, "rule", rule.Name, "action", run.Action)
		if a.rec != nil {
			a.rec.Event(nodeRef(c.node), apiv1.EventTypeWarning, EventHealthRepair,
				fmt.Sprintf("%s (health rule %q, step %d of %d): it has %s to stop matching, else the next step", run.Action, rule.Name, run.Step+1, len(rule.Repair), rule.RepairTimeout))
		}
	case cloudprovider.NotSent(err):
		// Held (throttled, fenced, the unready guard) or not listed yet:
		// asked again next loop.
		klog.FromContext(ctx).V(2).Info("Repair not sent; asked again next loop", "node", klog.KObj(c.node), "action", run.Action, "err", err.Error())
	default:
		// Refused or failed in the cloud: the step counts as failed now,
		// with no time given.
		run.Started, run.Asked = l.now.Add(-rule.RepairTimeout), l.now.Add(-rule.RepairTimeout)
		klog.FromContext(ctx).Error(err, "Repairing an unhealthy node failed; the next step next loop", "node", klog.KObj(c.node), "action", run.Action)
	}
	a.setHealthState(c, "repairing: "+run.Action)
	return true
}

// endRepairStep says that a step did not fix the node.
func (a *Autoscaler) endRepairStep(ctx context.Context, l *loop, c *healthCandidate, run *RepairRun, outcome, why string) {
	a.metrics.HealthRepairs.WithLabelValues(c.group, run.Action, outcome).Inc()
	klog.FromContext(ctx).Info("Repair did not fix the node", "node", klog.KObj(c.node), "nodeGroup", c.group, "action", run.Action, "outcome", outcome, "why", why)
	if a.rec != nil {
		a.rec.Event(nodeRef(c.node), apiv1.EventTypeWarning, EventHealthRepairFailed,
			fmt.Sprintf("%s did not fix it (%s): %s", run.Action, outcome, why))
	}
}

// repaired says that the node a ladder was repairing stopped matching: a
// step fixed it.
func (a *Autoscaler) repaired(l *loop, name string) {
	run, ok := a.health.repairs[name]
	if !ok {
		return
	}
	delete(a.health.repairs, name)
	if run.Started.IsZero() {
		return // it recovered before the step was asked
	}
	group := ""
	if g, ok := l.groupOf[name]; ok {
		group = g.ID()
	}
	a.metrics.HealthRepairs.WithLabelValues(group, run.Action, "fixed").Inc()
	if idx, ok := l.snap.Index(name); ok && a.rec != nil {
		a.rec.Event(nodeRef(l.snap.NodeInfo(idx).Node()), apiv1.EventTypeNormal, EventHealthRepaired,
			fmt.Sprintf("fixed by %s (health rule %q): the machine is kept", run.Action, run.Rule))
	}
}
