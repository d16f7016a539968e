package core

import (
	"context"
	"fmt"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// Event reasons of the preflight gate.
const (
	// EventPreflightFailed is on a node that failed preflight and is replaced.
	EventPreflightFailed = "PreflightFailed"
	// EventPreflightFailures is on the status ConfigMap when a group's
	// preflight failures back it off.
	EventPreflightFailures = "PreflightFailures"
	// EventPreflightRecovered is on a failed node that passed again and was uncordoned.
	EventPreflightRecovered = "PreflightRecovered"
)

// preflightState remembers the failed nodes being replaced between loops.
type preflightState struct {
	// blocked are nodes being replaced that keep a pod which may not be
	// evicted, with why (told once per reason).
	blocked map[string]string
	// deleted are failed nodes whose machines were deleted (name → when),
	// until their Node objects go.
	deleted map[string]time.Time
	// admitted are failed nodes the replacement brake let through: their
	// pods are evicted and their machines deleted.
	admitted map[string]bool
	// admittedMachines are failed machines without a Node the brake let
	// through, by provider ID, while their deletion is asked again.
	admittedMachines map[string]bool
	// cordoned are failed nodes this process cordoned: uncordoned if they
	// pass again before they are deleted (the agent's periodic re-run).
	cordoned map[string]bool
	// sent are the admitted failed machines (node name, or provider ID
	// without a node) whose deletion was sent once: one asked again (a
	// lost deletion) is not charged to the replacement brake twice.
	sent map[string]bool
	// incidents are checks many nodes fail at once.
	incidents incidents
}

// release forgets what was done to a failed node that is not to be
// replaced after all (it passed again, or its check is in an incident):
// its cordon, its admission by the replacement brake, its eviction start.
func (ps *preflightState) release(name string) {
	delete(ps.cordoned, name)
	delete(ps.admitted, name)
	delete(ps.blocked, name)
	delete(ps.sent, name)
}

func newPreflightState() *preflightState {
	return &preflightState{blocked: map[string]string{}, admittedMachines: map[string]bool{}, deleted: map[string]time.Time{}, admitted: map[string]bool{},
		cordoned: map[string]bool{}, sent: map[string]bool{}, incidents: newIncidents()}
}

// startingUp says a node is Ready but still starting up (a startup taint,
// GPUs not advertised) and young enough to be coming capacity; past
// --max-node-startup-time it is unready like any node that never made it.
func (a *Autoscaler) startingUp(l *loop, n *apiv1.Node) bool {
	group := ""
	if g, ok := l.groupOf[n.Name]; ok {
		group = g.ID()
	}
	return l.now.Sub(n.CreationTimestamp.Time) < a.opts.MaxNodeStartupTime && a.registry.StartingUp(n, group) != ""
}

// usable says a node can take pods now: ready, past preflight, and not
// starting up (no startup taint; GPUs advertised on a GPU group's node).
func (a *Autoscaler) usable(l *loop, n *apiv1.Node) bool {
	if !clusterstate.IsReady(n) {
		return false
	}
	if st, _ := a.opts.Preflight.Classify(n, l.now); st != preflight.Passed {
		return false
	}
	group := ""
	if g, ok := l.groupOf[n.Name]; ok {
		group = g.ID()
	}
	return a.registry.StartingUp(n, group) == ""
}

// replaceFailedPreflight handles the cluster state's preflight results:
// times and counts passes, and replaces failed nodes — cordon, evict their
// pods (if any; a node failed by a periodic re-run may run work), delete
// their machines. The cluster state already counts a failed node as
// neither capacity nor upcoming, so the scale-up phase of this same loop
// plans its replacement.
func (a *Autoscaler) replaceFailedPreflight(ctx context.Context, l *loop) error {
	logger := klog.FromContext(ctx)
	act := l.actions
	a.reportPreflightPasses(ctx, l, act.PreflightPassed)
	a.reportPreflightFailures(ctx, act.PreflightNewFailures)
	a.publishPreflightPending()
	// The repair ladders an earlier leader left: their nodes' preflight
	// results are theirs (repairOwns), from this leader's first loop.
	a.adoptRepairs(ctx, l)
	l.incidents = a.detectIncidents(ctx, l, act.PreflightFailed)
	if a.actions == nil {
		a.pruneFailed(l)
		return nil
	}
	a.adoptCordons(l)
	a.uncordonRecovered(ctx, l)
	a.retryLostDeletions(ctx, l, a.preflight.deleted, "preflight")
	if len(act.PreflightFailed) == 0 {
		a.pruneFailed(l)
		return nil
	}
	if l.unhealthy != "" {
		logger.V(2).Info("Nodes that failed preflight kept while the cluster is unhealthy", "nodes", len(act.PreflightFailed), "reason", l.unhealthy)
		a.pruneFailed(l)
		return nil
	}
	var toDelete []actuation.Machine
	atOnce := settling{held: a.settlingCordons(l, act.PreflightFailed)}
	for _, f := range act.PreflightFailed {
		if a.replaceableNow(ctx, l, f, &atOnce) {
			toDelete = append(toDelete, actuation.MachineOf(f.Group, f.Node))
		}
	}
	a.logKeptFailures(ctx, l, atOnce)
	toDelete = a.savePreflightCount(ctx, l, toDelete)
	a.deletePreflightFailed(ctx, l, toDelete)
	a.pruneFailed(l)
	return nil
}

// reportPreflightPasses observes how long the nodes that passed preflight
// took (a repaired node's second pass from its start again), and counts
// and logs them.
func (a *Autoscaler) reportPreflightPasses(ctx context.Context, l *loop, passed []clusterstate.NodeResult) {
	logger := klog.FromContext(ctx)
	for _, p := range passed {
		since := p.Node.CreationTimestamp.Time
		if t, ok := preflight.AgainAt(p.Node, l.now); ok && t.After(since) {
			since = t // a repaired node's second pass
		}
		took := preflight.PassedAt(p.Node, l.now).Sub(since)
		a.metrics.PreflightDuration.WithLabelValues(p.Group).Observe(took.Seconds())
		a.metrics.PreflightResults.WithLabelValues(p.Group, "passed").Inc()
		logger.V(2).Info("Node passed preflight", "node", klog.KObj(p.Node), "nodeGroup", p.Group, "took", took.Round(time.Second))
	}
}

// reportPreflightFailures counts, logs and tells the nodes first seen
// failing preflight (failed, or timed out), but those a repair ladder
// owns.
func (a *Autoscaler) reportPreflightFailures(ctx context.Context, failures []clusterstate.NodeResult) {
	logger := klog.FromContext(ctx)
	for _, f := range failures {
		if a.repairOwns(f.Node.Name) {
			continue // a repair step's check: the ladder's (health_repair.go)
		}
		result := "failed"
		if f.Node.Labels[a.opts.Preflight.Label] != preflight.ValueFailed {
			result = "timeout"
		}
		a.metrics.PreflightResults.WithLabelValues(f.Group, result).Inc()
		logger.Info("Node failed preflight; replacing it", "node", klog.KObj(f.Node), "nodeGroup", f.Group, "reason", f.Reason)
		if a.rec != nil {
			a.rec.Event(nodeRef(f.Node), apiv1.EventTypeWarning, EventPreflightFailed,
				fmt.Sprintf("node failed preflight and will be replaced: %s", f.Reason))
		}
	}
}

// publishPreflightPending sets each group's count of nodes pending
// preflight.
func (a *Autoscaler) publishPreflightPending() {
	pending := map[string]int{}
	for _, gs := range a.registry.Groups() {
		pending[gs.ID] = gs.Readiness.Preflight
	}
	for g, n := range pending {
		a.metrics.PreflightPending.WithLabelValues(g).Set(float64(n))
	}
}

// replaceableNow takes a node that failed preflight one step towards its
// replacement and says whether its machine may be deleted now. A node
// already deleted or a repair ladder's is left alone; one failing a check
// in an incident is kept (and released); one whose failure has not
// settled is at most cordoned; the others are cordoned, admitted by the
// replacement brake and drained.
func (a *Autoscaler) replaceableNow(ctx context.Context, l *loop, f clusterstate.NodeResult, atOnce *settling) bool {
	ps := a.preflight
	n := f.Node
	if _, done := ps.deleted[n.Name]; done || a.repairOwns(n.Name) {
		// A node a repair ladder sent through preflight again is the
		// ladder's: a failure moves it to its next step (health_repair.go).
		return false
	}
	if _, on := l.incidents[a.opts.Preflight.FailedCheck(n)]; on {
		// Many nodes fail this check at once: what it tests is broken,
		// not this machine. Nothing is done to it while that lasts, and
		// what was done before the incident was seen is taken back.
		l.incidentKept++
		a.releaseForIncident(ctx, n)
		return false
	}
	if !ps.incidents.settled(n.Name, l.now, a.opts.PreflightFailureSettle) {
		// Too recent to tell a bad machine from the first report of an
		// outage: the other agents may still be reporting. Nothing is
		// evicted or deleted yet; a node that had passed is cordoned
		// at once (below).
		l.failuresSettling++
		a.cordonAtOnce(ctx, l, n, atOnce)
		return false
	}
	if !a.cordonAndAdmit(ctx, l, f) {
		return false
	}
	return a.drainForReplacement(ctx, l, n, false)
}

// cordonAndAdmit cordons a node that failed preflight and says whether the
// replacement brake admits it (once). The brake admits a node before its
// pods are evicted: past the budget, a failed node is cordoned and nothing
// more.
func (a *Autoscaler) cordonAndAdmit(ctx context.Context, l *loop, f clusterstate.NodeResult) bool {
	ps := a.preflight
	n := f.Node
	if !n.Spec.Unschedulable {
		if err := a.cordonForReplacement(ctx, l, n.Name, cordonPreflight); err != nil {
			klog.FromContext(ctx).Error(err, "Cordoning a node that failed preflight", "node", klog.KObj(n))
			return false
		}
		ps.cordoned[n.Name] = true
	}
	if !ps.admitted[n.Name] {
		if !a.allowReplacement(l, f.Group, n.Name) {
			return false
		}
		ps.admitted[n.Name] = true
	}
	return true
}

// logKeptFailures logs the failed nodes kept for incidents and those
// whose failure has not settled.
func (a *Autoscaler) logKeptFailures(ctx context.Context, l *loop, atOnce settling) {
	logger := klog.FromContext(ctx)
	if l.incidentKept > 0 {
		logger.V(2).Info("Failed nodes kept for preflight incidents", "nodes", l.incidentKept, "incidents", l.incidents)
	}
	if l.failuresSettling > 0 {
		logger.V(2).Info("Failed nodes not drained or deleted until their failure settles", "nodes", l.failuresSettling,
			"settle", a.opts.PreflightFailureSettle, "cordonedAtOnce", atOnce.cordoned, "leftSchedulable", atOnce.capped)
	}
}

// savePreflightCount is the write-ahead of deleting machines that failed
// preflight: the brake counted them, and the next leader must see them
// counted. It returns the machines to delete: none when the count could
// not be saved.
func (a *Autoscaler) savePreflightCount(ctx context.Context, l *loop, toDelete []actuation.Machine) []actuation.Machine {
	if len(toDelete) > 0 {
		if err := a.persistSafetyState(ctx, l.now); err != nil {
			klog.FromContext(ctx).Error(err, "Machines that failed preflight not deleted: the brake's count could not be saved first; retried next loop")
			return nil
		}
	}
	return toDelete
}

// deletePreflightFailed hands the machines that failed preflight to the
// Remover, and counts and logs those deleted (each once).
func (a *Autoscaler) deletePreflightFailed(ctx context.Context, l *loop, toDelete []actuation.Machine) {
	logger := klog.FromContext(ctx)
	ps := a.preflight
	replaced := map[string]int{}
	for _, o := range a.remover.Remove(ctx, l.byID, toDelete) {
		switch {
		case o.Deleted:
			ps.deleted[o.Node.Name] = l.now
			if a.firstDeletion(l.now, o.Node.Name, "preflight") {
				replaced[o.Group]++
				a.replacementSent(l, o.Machine)
			}
		case o.Err != nil:
			logger.Error(o.Err, "Deleting a machine that failed preflight; retried next loop", "node", klog.KObj(o.Node), "nodeGroup", o.Group)
		default:
			// Its pods are terminating within their grace, or one came:
			// the next loop evicts what runs and looks again.
			logger.V(2).Info("Machine that failed preflight waits for its pods", "node", klog.KObj(o.Node), "holder", o.Held.String())
		}
	}
	for _, id := range sortedKeys(replaced) {
		a.metrics.PreflightReplaced.WithLabelValues(id).Add(float64(replaced[id]))
		logger.Info("Deleted machines that failed preflight", "nodeGroup", id, "count", replaced[id])
	}
}

// settlingCordons counts the failed nodes this process cordoned whose
// failure has not settled yet: the cordons cordonAtOnce holds.
func (a *Autoscaler) settlingCordons(l *loop, failed []clusterstate.NodeResult) int {
	ps, n := a.preflight, 0
	for _, f := range failed {
		if ps.cordoned[f.Node.Name] && !ps.incidents.settled(f.Node.Name, l.now, a.opts.PreflightFailureSettle) {
			n++
		}
	}
	return n
}

// settling counts, in a loop, the cordons cordonAtOnce holds (held:
// those of earlier loops and this one), writes (cordoned) and leaves for
// a later loop (capped).
type settling struct {
	held, cordoned, capped int
}

// cordonAtOnce cordons a node the agent's periodic re-run failed (it had
// passed: the preflight label says failed and the gate's taint is gone,
// so new pods still land on it) while its failure settles: a cordon stops
// new work and takes nothing from the work running there, and is taken
// back if the failure turns out to be an incident or the node passes
// again. A node that never passed carries the gate's taint and needs no
// cordon. Cordons held this way are fewer than the incident threshold
// and never more than maxHealthCordonsPerLoop at once
// (--preflight-incident-cluster-share may raise the threshold far), which
// also bounds the cordons one loop writes: an outage of several checks at once
// cordons at most what one check's incident would have allowed; a node
// past either bound stays schedulable until its failure settles (counted
// in capped).
func (a *Autoscaler) cordonAtOnce(ctx context.Context, l *loop, n *apiv1.Node, s *settling) {
	ps := a.preflight
	if n.Spec.Unschedulable || ps.cordoned[n.Name] || a.opts.Preflight.HasTaint(n) {
		return
	}
	if s.held >= min(a.incidentThreshold()-1, maxHealthCordonsPerLoop) {
		s.capped++
		return
	}
	if err := a.cordonForReplacement(ctx, l, n.Name, cordonPreflight); err != nil {
		klog.FromContext(ctx).Error(err, "Cordoning a node its periodic preflight re-run failed", "node", klog.KObj(n))
		return
	}
	ps.cordoned[n.Name] = true
	s.held++
	s.cordoned++
	klog.FromContext(ctx).V(2).Info("Node failed its periodic preflight re-run; cordoned while the failure settles", "node", klog.KObj(n),
		"settle", a.opts.PreflightFailureSettle)
}

// releaseForIncident takes back the cordon this process put on a failed
// node whose check turned out to be in an incident (it failed, and was
// acted on, before enough others reported): the node is uncordoned and no
// longer counts as admitted by the replacement brake. (A node whose
// machine is being deleted is not brought here.)
func (a *Autoscaler) releaseForIncident(ctx context.Context, n *apiv1.Node) {
	ps := a.preflight
	if !ps.cordoned[n.Name] {
		return
	}
	// Uncordoned whatever the snapshot says: a cordon of the last loop may
	// not show yet, and Uncordon changes nothing on a node without this
	// process's cordon annotation.
	if err := a.actions.Uncordon(ctx, n.Name); err != nil {
		klog.FromContext(ctx).Error(err, "Uncordoning a failed node kept for a preflight incident", "node", klog.KObj(n))
		return
	}
	ps.release(n.Name)
	a.replace.brake.Dropped(n.Name)
	delete(a.replace.stopped, n.Name)
	klog.FromContext(ctx).V(2).Info("Failed node kept for a preflight incident; uncordoned", "node", klog.KObj(n))
}

// adoptCordons takes over the preflight and health cordons an earlier
// leader (or this process before a restart) put on nodes: they carry
// actuation.CordonedAnnotation, so a node that passes again, or recovers,
// is uncordoned by whoever leads now.
func (a *Autoscaler) adoptCordons(l *loop) {
	ps := a.preflight
	for _, n := range l.nodes {
		if ps.cordoned[n.Name] {
			continue
		}
		if _, managed := l.groupOf[n.Name]; !managed {
			continue
		}
		if why, ok := actuation.CordonedBy(n); ok && strings.HasPrefix(why, cordonPreflight+" ") {
			ps.cordoned[n.Name] = true
		}
		a.health.adoptHealthCordon(n)
	}
}

// cordonPreflight is the reason on the cordons of nodes that failed preflight.
const cordonPreflight = "preflight-failed"

// uncordonRecovered makes schedulable again the failed nodes this process
// cordoned that passed since (the agent's periodic re-run succeeded after
// the check's target recovered), unless their machines were deleted: a
// node held by the replacement brake or an incident does not stay
// cordoned for ever once it is healthy.
func (a *Autoscaler) uncordonRecovered(ctx context.Context, l *loop) {
	ps := a.preflight
	for _, name := range sortedKeys(ps.cordoned) {
		idx, ok := l.snap.Index(name)
		if !ok {
			continue // pruned below
		}
		if _, gone := ps.deleted[name]; gone {
			continue
		}
		n := l.snap.NodeInfo(idx).Node()
		if st, _ := a.opts.Preflight.Classify(n, l.now); st != preflight.Passed {
			continue
		}
		// Whatever the snapshot says (see releaseForIncident).
		if err := a.actions.Uncordon(ctx, name); err != nil {
			klog.FromContext(ctx).Error(err, "Uncordoning a node that passed preflight again", "node", klog.KObj(n))
			continue
		}
		ps.release(name)
		a.replace.brake.Dropped(name)
		delete(a.replace.stopped, name)
		klog.FromContext(ctx).V(2).Info("Node passed preflight again; uncordoned", "node", klog.KObj(n))
		if a.rec != nil {
			a.rec.Event(nodeRef(n), apiv1.EventTypeNormal, EventPreflightRecovered, "node passed preflight again and was uncordoned")
		}
	}
}

// pruneFailed forgets replaced nodes whose Node objects are gone.
func (a *Autoscaler) pruneFailed(l *loop) {
	for name := range a.preflight.deleted {
		if _, ok := l.snap.Index(name); !ok {
			delete(a.preflight.deleted, name)
		}
	}
	for name := range a.preflight.blocked {
		if _, ok := l.snap.Index(name); !ok {
			delete(a.preflight.blocked, name)
		}
	}
	for name := range a.preflight.admitted {
		if _, ok := l.snap.Index(name); !ok {
			delete(a.preflight.admitted, name)
			delete(a.preflight.sent, name)
			a.replace.brake.Dropped(name) // gone: counted from its admission if never sent
		}
	}
	for name := range a.preflight.cordoned {
		if _, ok := l.snap.Index(name); !ok {
			delete(a.preflight.cordoned, name)
		}
	}
}

func nodeRef(n *apiv1.Node) *apiv1.ObjectReference {
	return &apiv1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}
}
