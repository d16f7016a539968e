package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/health"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// The repair ladder (#42). An 8-GPU VM given back to Azure may not come
// back (H100 capacity is scarce), so a replace rule may list in-place
// repairs (`repair: [reboot, reimage, redeploy]`, cheapest first, as AKS's
// node auto-repair orders them: "Node auto-repair", learn.microsoft.com
// aks/node-auto-repair) that are tried on the drained node, one at a
// time, before its machine is deleted. Each step:
//
//  1. is written ahead on the node (RepairAnnotation: a new leader reads
//     it and never asks the step twice), then asked of the cloud
//     (cloudprovider.Repairer: the same write guards and pod holds as a
//     deletion);
//  2. when the cloud's operation ends, sends the node through preflight
//     again (the preflight taint and the pending label put back,
//     preflight.AgainAnnotation: the kubelet of a rebooted or reimaged
//     machine registers again under its old Node object, which keeps
//     its old labels and gains no taint, so nothing else would gate it);
//  3. is done when the node passed preflight again and no longer matches
//     the rule: it is released like any node that recovers (uncordoned,
//     HealthRecovered) and HealthRepaired says by which step. A step
//     that fails in the cloud, fails preflight, or has not brought the
//     node back within its timeout (the rule's StepTimeout) moves to the
//     next; past the last, the machine is replaced as before.
//
// The whole ladder is one admission of the replacement brake (taken at
// the drain): a repair that fixes the node counts a window from that
// admission, as a drain does; a ladder that ends in a replacement counts
// from the deletion. A node that a step fixed and that breaks again under
// the same rule within repairMemory starts at the step after it (a flaky
// GPU is not rebooted for ever).

// Repair events.
const (
	EventHealthRepair       = "HealthRepair"
	EventHealthRepairFailed = "HealthRepairFailed"
	EventHealthRepaired     = "HealthRepaired"
)

// repairReplace is the Action of a run past its last step: the machine
// is replaced.
const repairReplace = "replace"

// repairMemory is how long a step that fixed a node is remembered: the
// node breaking again under the same rule within it starts at the next.
const repairMemory = 7 * 24 * time.Hour

// maxRepairHistory bounds the outcomes a repair record keeps.
const maxRepairHistory = 8

// RepairRun is a node's repair ladder in progress, kept on the node
// (RepairAnnotation) for the next leader.
type RepairRun struct {
	Rule string `json:"rule"`
	// Step indexes the rule's repair steps; Action is that step
	// (repairReplace past the last).
	Step   int    `json:"step"`
	Action string `json:"action"`
	// Since is when the ladder began (a record older than the node's
	// cordon is a stale one, not read back).
	Since time.Time `json:"since,omitzero"`
	// Asked is when the step was first tried (a step the cloud will not
	// take is given up after its timeout); Started when it was asked of
	// the cloud (zero: not yet); Again when the node was last sent
	// through preflight again (zero: not since the machine was touched).
	Asked   time.Time `json:"asked,omitzero"`
	Started time.Time `json:"started,omitzero"`
	Again   time.Time `json:"again,omitzero"`
	// Touched: a step was asked of the cloud since the node last passed
	// preflight: until it passes again (after Again) it takes no work,
	// whatever its rules say. BootID is the node's boot ID when the step
	// was asked: a new leader that does not know the cloud's operation
	// waits for it to change.
	Touched bool   `json:"touched,omitempty"`
	BootID  string `json:"bootID,omitempty"`
}

// active says the run still owns its node: a step is due or running.
func (r *RepairRun) active() bool { return r.Action != repairReplace }

// RepairOutcome is one step's end in a node's repair record.
type RepairOutcome struct {
	Rule    string    `json:"rule"`
	Action  string    `json:"action"`
	Outcome string    `json:"outcome"`
	At      time.Time `json:"at"`
}

// repairRecord is RepairAnnotation's value.
type repairRecord struct {
	Run     *RepairRun      `json:"run,omitempty"`
	History []RepairOutcome `json:"history,omitempty"`
}

// readRepairRecord reads a node's repair record; a garbled one is empty.
func readRepairRecord(n *apiv1.Node) repairRecord {
	var rec repairRecord
	if s := n.Annotations[actuation.RepairAnnotation]; s != "" {
		if json.Unmarshal([]byte(s), &rec) != nil {
			return repairRecord{}
		}
	}
	return rec
}

// writeRepairRecord sets the node's run (nil: none) and adds an outcome
// (nil: none) to its record, and with again sends it through preflight
// again, in one write.
func (a *Autoscaler) writeRepairRecord(ctx context.Context, node string, run *RepairRun, out *RepairOutcome, again *actuation.PreflightAgain) error {
	return a.actions.UpdateRepair(ctx, node, func(old string) string {
		var rec repairRecord
		if old != "" && json.Unmarshal([]byte(old), &rec) != nil {
			rec = repairRecord{}
		}
		rec.Run = nil
		if run != nil {
			r := *run
			rec.Run = &r
		}
		if out != nil {
			rec.History = append(rec.History, *out)
		}
		if n := len(rec.History); n > maxRepairHistory {
			rec.History = rec.History[n-maxRepairHistory:]
		}
		if rec.Run == nil && len(rec.History) == 0 {
			return ""
		}
		b, _ := json.Marshal(rec) // plain data: cannot fail
		return string(b)
	}, again)
}

// preflightAgain is the write that sends a node through preflight again
// at now; nil when the preflight gate is off.
func (a *Autoscaler) preflightAgain(now time.Time) *actuation.PreflightAgain {
	o := a.opts.Preflight
	if !o.Enabled {
		return nil
	}
	return &actuation.PreflightAgain{Taint: o.Taint, Label: o.Label, Value: preflight.ValuePending, AgainAnnotation: preflight.AgainAnnotation, At: now}
}

// repairerOf is the group's Repairer when its machines can be repaired
// in place.
func repairerOf(l *loop, group string) cloudprovider.Repairer {
	rep, ok := l.byID[group].(cloudprovider.Repairer)
	if !ok || !rep.CanRepair() {
		return nil
	}
	return rep
}

// repairInPlace runs the rule's repair ladder on a drained node due for
// replacement: true while the ladder owns the node (a step due, running,
// or bringing it back), false when the ladder is done (or the rule has
// none, or the group cannot repair) and its machine may be deleted. The
// steps are asked and followed by followRepairs.
func (a *Autoscaler) repairInPlace(ctx context.Context, l *loop, c *healthCandidate, rule health.Rule) bool {
	if len(rule.Repair) == 0 {
		return false
	}
	rep := repairerOf(l, c.group)
	hs, name := a.health, c.node.Name
	ours := a.cordonedForHealth(c.node)
	if rep == nil || !ours {
		// Not repairable in place, or cordoned by someone else (an
		// operator, an upgrade): replaced as before.
		return false
	}
	run := a.currentRepairRun(ctx, l, c.node, rule)
	// The whole ladder is one admission of the replacement brake: it
	// stays reserved while the ladder runs, however long.
	a.replace.brake.Reserve(l.now, c.group, name)
	if !run.active() {
		return false
	}
	if run.Started.IsZero() {
		a.askRepair(ctx, l, c.node, c.group, rep, run, rule)
	}
	state := "repairing: " + run.Action
	if run.Started.IsZero() {
		state = fmt.Sprintf("repair (%s) waits: %s", run.Action, hs.repairWhy[name])
	}
	a.setHealthState(c, state)
	return true
}

// cordonedForHealth says node health cordoned n: its cordon is ours, for
// health, or health remembers cordoning it.
func (a *Autoscaler) cordonedForHealth(n *apiv1.Node) bool {
	why, ours := actuation.CordonedBy(n)
	return (ours && strings.HasPrefix(why, cordonHealth)) || a.health.cordoned[n.Name] != ""
}

// currentRepairRun is the node's run of the rule's ladder. A run of
// another rule or of other steps (the policy changed), or one whose step
// was tried longer ago than the loops could have left it, starts over;
// what the machine went through is kept.
func (a *Autoscaler) currentRepairRun(ctx context.Context, l *loop, n *apiv1.Node, rule health.Rule) *RepairRun {
	hs := a.health
	run := hs.repairs[n.Name]
	if repairRunOutdated(run, rule, l.now) {
		old := run
		run = a.newRepairRun(ctx, l, n, rule)
		if old != nil {
			run.Touched, run.Again, run.BootID = old.Touched, old.Again, old.BootID
		}
		hs.repairs[n.Name] = run
	}
	return run
}

// repairRunOutdated says a node's run must start over for the rule: there
// is none, it is of another rule or of other steps, or its step was tried
// longer ago than the loops could have left it (stale).
func repairRunOutdated(run *RepairRun, rule health.Rule, now time.Time) bool {
	stale := run != nil && !run.Asked.IsZero() && now.Sub(run.Asked) > 4*rule.StepTimeout(-1)
	return run == nil || run.Rule != rule.Name || stale || run.stepsChanged(&rule)
}

// stepsChanged says an active run's step is not the rule's (nil: no such
// rule any more) step at its place: the policy changed under the ladder.
func (run *RepairRun) stepsChanged(rule *health.Rule) bool {
	return run.active() && (rule == nil || run.Step >= len(rule.Repair) || string(rule.Repair[run.Step]) != run.Action)
}

// newRepairRun starts a node's ladder: at its first step, or past the
// step that fixed it within repairMemory under the same rule.
func (a *Autoscaler) newRepairRun(ctx context.Context, l *loop, n *apiv1.Node, rule health.Rule) *RepairRun {
	run := &RepairRun{Rule: rule.Name, Action: string(rule.Repair[0]), Since: l.now}
	hist := readRepairRecord(n).History
	for i := len(hist) - 1; i >= 0; i-- {
		h := hist[i]
		if h.Outcome != "fixed" || h.Rule != rule.Name || l.now.Sub(h.At) > repairMemory {
			continue
		}
		at := slices.Index(rule.Repair, health.RepairStep(h.Action))
		if at < 0 {
			break
		}
		run.Step = at + 1
		run.Action = repairReplace
		if run.Step < len(rule.Repair) {
			run.Action = string(rule.Repair[run.Step])
		}
		klog.FromContext(ctx).Info("Node broke again after a repair fixed it; the ladder goes on past that step", "node", klog.KObj(n), "rule", rule.Name,
			"fixedBy", h.Action, "fixedAt", h.At, "next", run.Action)
		if a.rec != nil {
			a.rec.Event(nodeRef(n), apiv1.EventTypeWarning, EventHealthRepairFailed,
				fmt.Sprintf("%s fixed it %s ago and it broke again (health rule %q): next %s", h.Action, l.now.Sub(h.At).Round(time.Minute), rule.Name, run.Action))
		}
		break
	}
	return run
}

// askRepair asks the cloud for the run's step on its drained node, once
// no pod a deletion would wait for is there, with the step written ahead
// on the node and the brake's count saved first.
func (a *Autoscaler) askRepair(ctx context.Context, l *loop, n *apiv1.Node, group string, rep cloudprovider.Repairer, run *RepairRun, rule health.Rule) {
	hs, name, logger := a.health, n.Name, klog.FromContext(ctx)
	if run.Asked.IsZero() {
		run.Asked = l.now
	}
	// A repair stops what runs on the machine, as a deletion does: it
	// waits for the same pods a deletion would (a pod still within its
	// grace, one bound in the cordon window).
	if a.repairWaitsForPods(ctx, name) {
		return
	}
	if err := a.persistSafetyState(ctx, l.now); err != nil {
		hs.repairWhy[name] = "the brake's count could not be saved"
		logger.Error(err, "Repair not sent: the safety state could not be saved first; retried next loop", "node", klog.KObj(n))
		return
	}
	// Write-ahead: the next leader must know the step was asked, or it
	// would ask it again.
	sent := *run
	sent.Started, sent.Touched, sent.Again, sent.BootID = l.now, true, time.Time{}, n.Status.NodeInfo.BootID
	if err := a.writeRepairRecord(ctx, name, &sent, nil, nil); err != nil {
		hs.repairWhy[name] = "its repair record could not be written"
		logger.Error(err, "Repair not sent: the node's repair record could not be written first; retried next loop", "node", klog.KObj(n))
		return
	}
	err := rep.Repair(ctx, n.Spec.ProviderID, cloudprovider.RepairAction(run.Action))
	switch {
	case err == nil || errors.Is(err, cloudprovider.ErrOutcomeUnknown):
		// Sent (an unclear answer included: the action may run, and is
		// followed as running until its step times out).
		a.repairSent(ctx, n, group, run, &sent, rule)
	case cloudprovider.NotSent(err) || cloudprovider.IsThrottled(err):
		// Held (fenced, the unready guard), not listed yet, or throttled
		// by ARM or the VM's Compute policy (a 429 runs nothing): asked
		// again next loop, the provider honouring the Retry-After.
		hs.repairWhy[name] = err.Error()
		logger.V(2).Info("Repair not sent; asked again next loop", "node", klog.KObj(n), "action", run.Action, "err", err.Error())
	default:
		// Refused or failed in the cloud: the step failed, the next one
		// is asked next loop.
		a.nextRepairStep(ctx, l, n, group, run, rule, "failed", err.Error())
	}
}

// repairWaitsForPods says a pod a deletion would wait for is on the node
// (or its pods could not be read), and keeps why for the status.
func (a *Autoscaler) repairWaitsForPods(ctx context.Context, name string) bool {
	hs := a.health
	h, err := a.remover.Holder(ctx, name)
	if err == nil && h == nil {
		return false
	}
	hs.repairWhy[name] = "its pods could not be read"
	if h != nil {
		hs.repairWhy[name] = h.String()
	}
	return true
}

// repairSent takes a step the cloud was sent (an unclear answer included:
// the action may run, and is followed as running until its step times
// out): the run as written ahead, counted, logged and told.
func (a *Autoscaler) repairSent(ctx context.Context, n *apiv1.Node, group string, run, sent *RepairRun, rule health.Rule) {
	delete(a.health.repairWhy, n.Name)
	run.Started, run.Touched, run.Again, run.BootID = sent.Started, true, time.Time{}, sent.BootID
	a.metrics.HealthRepairs.WithLabelValues(group, run.Action, "started").Inc()
	klog.FromContext(ctx).Info("Repairing an unhealthy node in place", "node", klog.KObj(n), "nodeGroup", group, "rule", rule.Name, "action", run.Action)
	if a.rec != nil {
		a.rec.Event(nodeRef(n), apiv1.EventTypeWarning, EventHealthRepair,
			fmt.Sprintf("%s (health rule %q, step %d of %d): it has %s to pass preflight again and stop matching, else the next step",
				run.Action, rule.Name, run.Step+1, len(rule.Repair), rule.StepTimeout(run.Step)))
	}
}

// followRepairs moves every ladder on: a step the cloud ended sends its
// node through preflight again; a step that failed in the cloud or in
// preflight, or ran out of time, gives way to the next; a due step of a
// node no rule judged this loop (it is going through preflight again, or
// NotReady) is asked here, a judged bad one's by repairInPlace after its
// drain; a judged node that stopped matching after its machine was
// touched is sent through preflight again, not repaired further. It
// returns the machines of ladders that ended with their node NotReady and
// no preflight gate to catch it: they are replaced.
func (a *Autoscaler) followRepairs(ctx context.Context, l *loop, pol *health.Policy, j judgement) []actuation.Machine {
	var giveUp []actuation.Machine
	for _, name := range sortedKeys(a.health.repairs) {
		if m, ok := a.followLadder(ctx, l, pol, j, name); ok {
			giveUp = append(giveUp, m)
		}
	}
	return giveUp
}

// followLadder moves the node's ladder on (followRepairs); it returns the
// node's machine when the ladder ended and it is given up.
func (a *Autoscaler) followLadder(ctx context.Context, l *loop, pol *health.Policy, j judgement, name string) (actuation.Machine, bool) {
	hs := a.health
	run := hs.repairs[name]
	n, group, rep, ok := a.ladderNode(l, name)
	if !ok {
		return actuation.Machine{}, false
	}
	rule := pol.Rule(run.Rule)
	if run.stepsChanged(rule) {
		// The policy changed under the ladder: it ends. A node whose
		// machine it touched is still verified before it takes work;
		// a new ladder starts if the node still matches a rule.
		if !a.repairUnverified(name, n) {
			delete(hs.repairs, name)
			delete(hs.repairWhy, name)
			return actuation.Machine{}, false
		}
		run.Action, run.Rule = repairReplace, "" // over; of no rule (repairInPlace starts anew)
	}
	_, judgedBad := j.cands[name]
	if !run.active() {
		return a.followEndedRepair(ctx, l, n, group, rep, run, j.judged[name])
	}
	// The ladder's admission of the replacement brake stays reserved
	// whoever judges the node.
	a.replace.brake.Reserve(l.now, group, name)
	if a.followRepair(ctx, l, n, group, rep, run, *rule, j.judged[name], judgedBad) && run.active() && !j.judged[name] {
		a.askRepair(ctx, l, n, group, rep, run, *rule)
	}
	return actuation.Machine{}, false
}

// ladderNode is the node of a ladder, its group and the group's repairer;
// false when the node is not in the snapshot, in no group, or its group
// cannot repair.
func (a *Autoscaler) ladderNode(l *loop, name string) (*apiv1.Node, string, cloudprovider.Repairer, bool) {
	idx, ok := l.snap.Index(name)
	g, grouped := l.groupOf[name]
	if !ok || !grouped {
		return nil, "", nil, false
	}
	n, group := l.snap.NodeInfo(idx).Node(), g.ID()
	rep := repairerOf(l, group)
	if rep == nil {
		return nil, "", nil, false
	}
	return n, group, rep, true
}

// followRepair moves one ladder on; true when it moved to another step.
func (a *Autoscaler) followRepair(ctx context.Context, l *loop, n *apiv1.Node, group string, rep cloudprovider.Repairer, run *RepairRun, rule health.Rule, judged, judgedBad bool) bool {
	timeout := rule.StepTimeout(run.Step)
	var outcome, why string
	if run.Started.IsZero() {
		outcome, why = a.followUnstartedRepair(ctx, l, n, group, rep, run, rule, timeout, judged, judgedBad)
	} else {
		outcome, why = a.followStartedRepair(ctx, l, n, rep, run, timeout)
	}
	if outcome == "" {
		return false
	}
	a.nextRepairStep(ctx, l, n, group, run, rule, outcome, why)
	return true
}

// followUnstartedRepair follows a step the cloud has not started: failed
// when not taken within its timeout, asked (again) otherwise, unless the
// node was judged this loop. It returns the step's outcome ("" while it
// goes on) and why.
func (a *Autoscaler) followUnstartedRepair(ctx context.Context, l *loop, n *apiv1.Node, group string, rep cloudprovider.Repairer, run *RepairRun, rule health.Rule,
	timeout time.Duration, judged, judgedBad bool) (string, string) {
	switch {
	case !run.Asked.IsZero() && l.now.Sub(run.Asked) >= timeout:
		return "failed", fmt.Sprintf("not taken by the cloud within %s", timeout)
	case judgedBad:
		// Asked by repairInPlace after its drain.
	case judged:
		// It no longer matches: an earlier step may have fixed it.
		// Verified, not repaired further.
		if run.Touched && run.Again.IsZero() && !repairRunning(rep, n) {
			a.sendThroughPreflight(ctx, l, n, run)
		}
	default:
		a.askRepair(ctx, l, n, group, rep, run, rule)
	}
	return "", ""
}

// followStartedRepair follows a step the cloud started: its failure, its
// end (the node then goes through preflight again), a preflight failure
// after it, or its timeout. It returns the step's outcome ("" while it
// goes on) and why.
func (a *Autoscaler) followStartedRepair(ctx context.Context, l *loop, n *apiv1.Node, rep cloudprovider.Repairer, run *RepairRun, timeout time.Duration) (string, string) {
	st, known := rep.RepairState(n.Spec.ProviderID)
	known = known && string(st.Action) == run.Action
	state, why := a.opts.Preflight.Classify(n, l.now)
	late := l.now.Sub(run.Started) >= timeout
	if known {
		if outcome, msg, decided := knownRepairOutcome(st, run, late, timeout); decided {
			return outcome, msg
		}
	} else if run.BootID != "" && n.Status.NodeInfo.BootID == run.BootID {
		// A new leader, not knowing the operation: the node has not
		// booted again since the step was asked.
		return timedOut(late, "the node did not boot again within %s", timeout)
	}
	return a.followRepairedNode(ctx, l, n, run, state, why, late, timeout)
}

// knownRepairOutcome is the outcome of a started step whose operation the
// cloud knows: failed, or a timeout while it runs (or its outcome is
// unknown: it may run); decided is false once it ended well.
func knownRepairOutcome(st cloudprovider.RepairStatus, run *RepairRun, late bool, timeout time.Duration) (outcome, why string, decided bool) {
	switch {
	case st.Done && st.Err != nil && !st.Unknown:
		return "failed", st.Err.Error(), true
	case !st.Done || st.Unknown:
		// Running, or its outcome unknown (it may run): waited for.
		outcome, why = timedOut(late, "the cloud's %s did not end within %s", run.Action, timeout)
		return outcome, why, true
	}
	return "", "", false
}

// timedOut is a step's timeout, once it is late ("" while it is not).
func timedOut(late bool, format string, args ...any) (string, string) {
	if !late {
		return "", ""
	}
	return "timeout", fmt.Sprintf(format, args...)
}

// followRepairedNode follows a node whose repair step ended (or, to a new
// leader, that booted again): through preflight again before anything
// else, then back unless preflight fails it or it is not back in time.
// state and why are its preflight state.
func (a *Autoscaler) followRepairedNode(ctx context.Context, l *loop, n *apiv1.Node, run *RepairRun, state preflight.State, why string, late bool,
	timeout time.Duration) (string, string) {
	switch {
	case run.Again.IsZero():
		// Done (or, to a new leader, the node booted again): through
		// preflight again before anything else.
		if !a.sendThroughPreflight(ctx, l, n, run) && late {
			return "timeout", fmt.Sprintf("not sent through preflight again within %s", timeout)
		}
	case state == preflight.Failed && a.sawAgain(n, run):
		return "preflight-failed", why
	case late:
		return "timeout", fmt.Sprintf("not back (preflight passed, the rule no longer matching) %s after it", timeout)
	}
	return "", ""
}

// followEndedRepair follows a ladder past its last step (its machine is
// being replaced): a node whose machine it touched is sent through
// preflight again once nothing runs on the machine (the gate's deadline
// replaces it if it does not pass), and a NotReady node no gate will
// catch (the gate off, or the node passed it) is given up: its machine
// is returned for deletion.
func (a *Autoscaler) followEndedRepair(ctx context.Context, l *loop, n *apiv1.Node, group string, rep cloudprovider.Repairer, run *RepairRun, judged bool) (actuation.Machine, bool) {
	if run.Touched && run.Again.IsZero() && !repairRunning(rep, n) {
		a.sendThroughPreflight(ctx, l, n, run)
	}
	if judged || clusterstate.IsReady(n) {
		return actuation.Machine{}, false
	}
	if st, _ := a.opts.Preflight.Classify(n, l.now); a.opts.Preflight.Enabled && st != preflight.Passed {
		return actuation.Machine{}, false
	}
	return actuation.MachineOf(group, n), true
}

// repairRunning says the cloud's last repair of the node's machine runs
// (or its outcome is unknown) as far as this process knows.
func repairRunning(rep cloudprovider.Repairer, n *apiv1.Node) bool {
	st, known := rep.RepairState(n.Spec.ProviderID)
	return known && (!st.Done || st.Unknown)
}

// sendThroughPreflight puts the preflight taint and pending label back on
// a node whose repair step the cloud ended: it takes work again only
// once the agent passed it.
func (a *Autoscaler) sendThroughPreflight(ctx context.Context, l *loop, n *apiv1.Node, run *RepairRun) bool {
	again := *run
	again.Again = l.now
	if err := a.writeRepairRecord(ctx, n.Name, &again, nil, a.preflightAgain(l.now)); err != nil {
		klog.FromContext(ctx).Error(err, "Sending a repaired node through preflight again; retried next loop", "node", klog.KObj(n))
		return false
	}
	run.Again = l.now
	klog.FromContext(ctx).Info("The node's machine was repaired; it goes through preflight again", "node", klog.KObj(n), "action", run.Action)
	return true
}

// sawAgain says the node as the loop sees it was sent through preflight
// again for the run's step (the informer has the write): its preflight
// state is the repaired machine's, not the broken one's.
func (a *Autoscaler) sawAgain(n *apiv1.Node, run *RepairRun) bool {
	if run.Again.IsZero() {
		return false
	}
	if !a.opts.Preflight.Enabled {
		return true
	}
	at, ok := preflight.AgainAt(n, run.Again.Add(time.Second))
	return ok && !at.Before(run.Again.Truncate(time.Second))
}

// repairUnverified says a ladder touched the node's machine and the node
// has not passed preflight since it was sent through again: it stays
// cordoned whatever its rules say (a condition may have cleared only
// because the machine went down).
func (a *Autoscaler) repairUnverified(name string, n *apiv1.Node) bool {
	run := a.health.repairs[name]
	if run == nil || !run.Touched {
		return false
	}
	return n == nil || !a.sawAgain(n, run)
}

// nextRepairStep ends the run's step as not fixing the node and moves the
// run to the next step (asked when first tried) or, past the last, to the
// replacement. What the machine went through (Touched, Again) is kept.
func (a *Autoscaler) nextRepairStep(ctx context.Context, l *loop, n *apiv1.Node, group string, run *RepairRun, rule health.Rule, outcome, why string) {
	a.metrics.HealthRepairs.WithLabelValues(group, run.Action, outcome).Inc()
	klog.FromContext(ctx).Info("Repair did not fix the node", "node", klog.KObj(n), "nodeGroup", group, "action", run.Action, "outcome", outcome, "why", why)
	if a.rec != nil {
		a.rec.Event(nodeRef(n), apiv1.EventTypeWarning, EventHealthRepairFailed,
			fmt.Sprintf("%s did not fix it (%s): %s", run.Action, outcome, why))
	}
	out := &RepairOutcome{Rule: run.Rule, Action: run.Action, Outcome: outcome, At: l.now}
	run.Step++
	// The next step's clock starts when it is first tried (askRepair),
	// not while the node is held (a breaker, its pods).
	run.Asked, run.Started = time.Time{}, time.Time{}
	if run.Step < len(rule.Repair) {
		run.Action = string(rule.Repair[run.Step])
	} else {
		run.Action = repairReplace
		klog.FromContext(ctx).Info("Repairs did not fix the node; replacing its machine", "node", klog.KObj(n), "nodeGroup", group, "rule", rule.Name)
	}
	if err := a.writeRepairRecord(ctx, n.Name, run, out, nil); err != nil {
		klog.FromContext(ctx).Error(err, "Writing a node's repair record", "node", klog.KObj(n))
	}
}

// repaired says that the node a ladder was repairing is back: a step
// fixed it.
func (a *Autoscaler) repaired(ctx context.Context, l *loop, name string) {
	run, ok := a.health.repairs[name]
	if !ok {
		return
	}
	delete(a.health.repairs, name)
	delete(a.health.repairWhy, name)
	if !run.Touched {
		// It recovered before any step touched the machine: the record
		// keeps no run.
		if err := a.writeRepairRecord(ctx, name, nil, nil, nil); err != nil {
			klog.FromContext(ctx).Error(err, "Writing a node's repair record", "node", name)
		}
		return
	}
	group := ""
	if g, ok := l.groupOf[name]; ok {
		group = g.ID()
	}
	a.metrics.HealthRepairs.WithLabelValues(group, run.Action, "fixed").Inc()
	if err := a.writeRepairRecord(ctx, name, nil, &RepairOutcome{Rule: run.Rule, Action: run.Action, Outcome: "fixed", At: l.now}, nil); err != nil {
		klog.FromContext(ctx).Error(err, "Writing a node's repair record", "node", name)
	}
	if idx, ok := l.snap.Index(name); ok && a.rec != nil {
		a.rec.Event(nodeRef(l.snap.NodeInfo(idx).Node()), apiv1.EventTypeNormal, EventHealthRepaired,
			fmt.Sprintf("fixed by %s (health rule %q): passed preflight again, the machine is kept", run.Action, run.Rule))
	}
}

// adoptRepairs reads, once per leadership, the ladders an earlier leader
// left on the nodes it cordoned (RepairAnnotation).
func (a *Autoscaler) adoptRepairs(ctx context.Context, l *loop) {
	hs := a.health
	if hs.repairsAdopted {
		return
	}
	hs.repairsAdopted = true
	for _, n := range l.nodes {
		if run := a.leftRepairRun(n); run != nil {
			hs.repairs[n.Name] = run
		}
	}
	if len(hs.repairs) > 0 {
		klog.FromContext(ctx).Info("Repair ladders read back from the nodes", "nodes", len(hs.repairs))
	}
}

// leftRepairRun is the ladder an earlier leader left on a node it
// cordoned for health, when this process follows none there yet; nil
// otherwise.
func (a *Autoscaler) leftRepairRun(n *apiv1.Node) *RepairRun {
	why, ours := actuation.CordonedBy(n)
	if !ours || !strings.HasPrefix(why, cordonHealth) || n.Annotations[actuation.RepairAnnotation] == "" {
		return nil
	}
	rec := readRepairRecord(n)
	if rec.Run == nil || a.health.repairs[n.Name] != nil {
		return nil
	}
	// A run older than the node's cordon is a stale record (the
	// node was released and cordoned again since), not this ladder.
	if _, at, ok := strings.Cut(why, " "); ok {
		if t, err := time.Parse(time.RFC3339, at); err == nil && rec.Run.Since.Before(t.Add(-time.Minute)) {
			return nil
		}
	}
	return rec.Run
}

// countRepairing counts, for the breakers, the nodes of an active ladder
// that no rule judged this loop (the machine down, or going through
// preflight again): until the ladder ends each is still an unhealthy
// node of its group, as it was when it was drained.
func (a *Autoscaler) countRepairing(l *loop, j judgement) {
	for name, run := range a.health.repairs {
		if !run.active() || j.judged[name] {
			continue
		}
		if g, ok := l.groupOf[name]; ok {
			j.over[g.ID()]++
			j.live[g.ID()]++
		}
	}
}

// repairOwns says an active ladder owns the node: its preflight results
// are the ladder's, not the preflight gate's.
func (a *Autoscaler) repairOwns(name string) bool {
	run := a.health.repairs[name]
	return run != nil && run.active()
}

// repairReport lists the ladders in progress for the status, the first
// maxHealthListed by node name.
func (a *Autoscaler) repairReport(l *loop, pol *health.Policy) ([]HealthRepair, int) {
	hs := a.health
	a.setRepairingGauge(l)
	var out []HealthRepair
	more := 0
	for _, name := range sortedKeys(hs.repairs) {
		if len(out) == maxHealthListed {
			more++
			continue
		}
		out = append(out, a.repairStatus(l, pol, name))
	}
	return out, more
}

// repairStatus is the node's ladder in progress, for the status: its
// step (with its place on the ladder while it runs), its stage and since
// when.
func (a *Autoscaler) repairStatus(l *loop, pol *health.Policy, name string) HealthRepair {
	hs := a.health
	run := hs.repairs[name]
	r := HealthRepair{Node: name, Rule: run.Rule, Step: run.Action}
	if !run.Asked.IsZero() {
		r.Since = run.Asked.UTC()
	}
	if g, ok := l.groupOf[name]; ok {
		r.NodeGroup = g.ID()
	}
	if rule := pol.Rule(run.Rule); rule != nil && run.active() {
		r.Step = fmt.Sprintf("%d/%d %s", run.Step+1, len(rule.Repair), run.Action)
	}
	switch stage := repairStage(run); stage {
	case "replace":
		r.State = "replacing: no step fixed it"
	case "due":
		r.State = "due"
		if why := hs.repairWhy[name]; why != "" {
			r.State += ": " + why
		}
	case "cloud":
		r.State, r.Since = "in the cloud", run.Started.UTC()
	default:
		r.State, r.Since = "preflight again, then the rule must clear", run.Again.UTC()
	}
	return r
}

// repairStage is where a run is, for the metric: due, cloud, preflight,
// replace.
func repairStage(run *RepairRun) string {
	switch {
	case !run.active():
		return "replace"
	case run.Started.IsZero():
		return "due"
	case run.Again.IsZero():
		return "cloud"
	}
	return "preflight"
}

// repairStages are repairStage's values.
var repairStages = []string{"due", "cloud", "preflight", "replace"}

// setRepairingGauge sets health_repairing_nodes for every group that can
// repair, every stage (0 included: a group whose repairs ended reads 0,
// not its last count).
func (a *Autoscaler) setRepairingGauge(l *loop) {
	counts := map[[2]string]int{}
	for name, run := range a.health.repairs {
		if g, ok := l.groupOf[name]; ok {
			counts[[2]string{g.ID(), repairStage(run)}]++
		}
	}
	for id := range l.byID {
		if repairerOf(l, id) == nil {
			continue
		}
		for _, st := range repairStages {
			a.metrics.HealthRepairing.WithLabelValues(id, st).Set(float64(counts[[2]string{id, st}]))
		}
	}
}
