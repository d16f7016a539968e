package core

import (
	"context"
	"fmt"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
)

// EventReplacementBrake is on the status ConfigMap when the replacement
// brake holds deletions back.
const EventReplacementBrake = "ReplacementBrake"

// replacements is the replacement brake: the budget of deletions that are
// not scale-down (nodes that failed preflight, machines in error or never
// registered), shared by every such path.
type replacements struct {
	brake  *scaledown.Brake
	braked bool
	// stopped is, per node being replaced, when new pods stopped landing
	// on it as this process knows: its own cordon, else the first loop
	// that found it cordoned or tainted not-ready (pausedForReplacement).
	stopped map[string]time.Time
	// reasked are the nodes whose lost deletion retryLostDeletions handed
	// back to their path, which path and when: that path's next deletion
	// of the node is the same replacement asked again, not a new one
	// (firstDeletion).
	reasked map[string]reask
}

// reask is a lost deletion handed back to its path.
type reask struct {
	path string
	at   time.Time
}

// firstDeletion says whether path's accepted deletion of node's machine
// is a replacement of its own, to be counted and told as one, rather than
// its lost deletion asked again (counted by
// replacement_deletions_lost_total when it was handed back). A hand-back
// is good for one deletion by the same path within twice
// --deletion-lost-after (the node may have passed again or recovered
// since, and a later replacement is a new one).
func (a *Autoscaler) firstDeletion(now time.Time, node, path string) bool {
	r, ok := a.replace.reasked[node]
	if !ok {
		return true
	}
	delete(a.replace.reasked, node)
	return r.path != path || now.Sub(r.at) >= 2*a.opts.DeletionLostAfter
}

// cordonForReplacement cordons a node a replacement path (health,
// preflight) will drain and delete, and starts its pause.
func (a *Autoscaler) cordonForReplacement(ctx context.Context, l *loop, node, reason string) error {
	if err := a.actions.Cordon(ctx, node, reason); err != nil {
		return err
	}
	if a.replace.stopped == nil {
		a.replace.stopped = map[string]time.Time{}
	}
	a.replace.stopped[node] = l.now
	return nil
}

// schedulingStopped says new pods no longer land on the node, or could
// not run there: it is cordoned, tainted not-ready or unreachable by the
// node lifecycle controller, or not Ready (a failed machine's node, before
// that controller's taint).
func schedulingStopped(n *apiv1.Node) bool {
	return n.Spec.Unschedulable || actuation.HasTaintKey(n, apiv1.TaintNodeNotReady) ||
		actuation.HasTaintKey(n, apiv1.TaintNodeUnreachable) || !clusterstate.IsReady(n)
}

// pausedForReplacement says a node being replaced is still within its
// pause: --node-delete-delay-after-taint from when new pods stopped
// landing on it, before anything is evicted or its machine deleted, on
// every replacement path (health, preflight, failed machines), as
// scale-down waits after its taint. The scheduler may have bound a pod
// just before it saw the cordon (a gang member waiting in Permit, say):
// after the pause the pod is in the snapshot, and is evicted with its
// grace period instead of dying with the machine. Before, a rule already
// due as the node was first judged (after a failover, an unpause, a new
// rule) cordoned and deleted an empty node microseconds apart. A node
// still schedulable in this loop's snapshot (cordoned this loop) waits;
// one cordoned before this process knew it waits from the first loop
// that sees it so (a new leader: one pause more, never less).
func (a *Autoscaler) pausedForReplacement(l *loop, n *apiv1.Node) bool {
	d := a.opts.NodeDeleteDelayAfterTaint
	if d <= 0 {
		return false
	}
	if a.replace.stopped == nil {
		a.replace.stopped = map[string]time.Time{}
	}
	at, known := a.replace.stopped[n.Name]
	switch {
	case known && (at.Equal(l.now) || schedulingStopped(n)):
		// Cordoned by this process (this very loop, when the snapshot
		// still shows it schedulable), or still stopped since.
	case known:
		// Schedulable again since (recovered, uncordoned): its old pause
		// is no pause for a new replacement.
		delete(a.replace.stopped, n.Name)
		return true
	case schedulingStopped(n):
		at = l.now
		a.replace.stopped[n.Name] = at
	default:
		return true
	}
	return l.now.Sub(at) < d
}

// EventReplacementLost is on a node whose machine a replacement path
// deleted and that still runs Ready long after: the deletion is asked
// again.
const EventReplacementLost = "ReplacementLost"

// retryLostDeletions forgets, in deleted (node → when its machine's
// deletion was accepted), the nodes still Ready --deletion-lost-after
// later (ARM accepted the deletion, its operation failed, and the VM runs
// on: armsim's FaultDeleteFails; cluster-autoscaler's Azure provider waits for
// the delete's result and takes the node back on failure; a deletion's
// operation lasts until its VMs are gone, minutes for GPU VMs, and a
// deleted VM's node stops being Ready within the node monitor's grace),
// so the path that deleted them asks again (its admission is kept: the
// replacement brake is not charged twice), with an event, a log line and
// the metric. path names the path ("health", "preflight").
func (a *Autoscaler) retryLostDeletions(ctx context.Context, l *loop, deleted map[string]time.Time, path string) {
	for _, name := range sortedKeys(deleted) {
		idx, ok := l.snap.Index(name)
		if !ok {
			continue
		}
		n, at := l.snap.NodeInfo(idx).Node(), deleted[name]
		if !clusterstate.IsReady(n) || l.now.Sub(at) < a.opts.DeletionLostAfter || a.registry.Deleting(n.Spec.ProviderID) {
			continue
		}
		delete(deleted, name)
		if a.replace.reasked == nil {
			a.replace.reasked = map[string]reask{}
		}
		a.replace.reasked[name] = reask{path: path, at: l.now}
		group := ""
		if g, ok := l.groupOf[name]; ok {
			group = g.ID()
		}
		a.metrics.ReplacementsLost.WithLabelValues(group, path).Inc()
		msg := fmt.Sprintf("the machine's deletion (%s) was accepted %s ago but the node still runs Ready: the deletion was lost; asked again", path, l.now.Sub(at).Round(time.Second))
		klog.FromContext(ctx).Info("Replacement deletion lost; asking again", "node", klog.KObj(n), "nodeGroup", group, "path", path)
		if a.rec != nil {
			a.rec.Event(nodeRef(n), apiv1.EventTypeWarning, EventReplacementLost, msg)
		}
	}
}

// pruneStopped forgets the pauses, and the deletions asked again, of
// nodes gone from the snapshot.
func (a *Autoscaler) pruneStopped(l *loop) {
	for name := range a.replace.stopped {
		if _, ok := l.snap.Index(name); !ok {
			delete(a.replace.stopped, name)
		}
	}
	for name, r := range a.replace.reasked {
		if _, ok := l.snap.Index(name); !ok || l.now.Sub(r.at) >= 2*a.opts.DeletionLostAfter {
			delete(a.replace.reasked, name)
		}
	}
}

func (o Options) replacementBrakeOptions() scaledown.BrakeOptions {
	return scaledown.BrakeOptions{ClusterShare: o.ReplacementBrakeClusterShare, GroupShare: 1,
		Window: o.ReplacementBrakeWindow, Min: o.ReplacementBrakeMinNodes, MaxPending: o.maxRemovalPending()}
}

// allowReplacement says whether the machine key names (a node's name, or
// a machine's provider ID when it has no node) of group may be deleted
// once drained, and reserves it in the budget (replacementSent counts
// it from its deletion); when not, it waits.
func (a *Autoscaler) allowReplacement(l *loop, group, key string) bool {
	cluster, size := a.clusterTarget(), 0
	if gs := a.registry.Group(group); gs != nil && gs.Readiness.TargetKnown {
		size = gs.Readiness.Target
	}
	if !a.replace.brake.Allow(l.now, group, cluster, size) {
		l.replacementsHeld++
		return false
	}
	a.replace.brake.Reserve(l.now, group, key)
	return true
}

// replacementSent tells the replacement brake that the machine of an
// admitted replacement was asked to be deleted now (the first time: a
// lost deletion asked again is not charged twice).
func (a *Autoscaler) replacementSent(l *loop, m actuation.Machine) {
	a.replace.brake.Sent(l.now, m.Group, machineKey(m))
}

// machineKey names a replaced machine for the replacement brake: its
// node's name, or its provider ID when it has no node.
func machineKey(m actuation.Machine) string {
	if m.Node != nil {
		return m.Node.Name
	}
	return m.ProviderID
}

// reportReplacements says whether the brake held anything this loop: an
// event when it engages, the metric, the status.
func (a *Autoscaler) reportReplacements(ctx context.Context, l *loop) {
	a.pruneStopped(l)
	held := l.replacementsHeld > 0
	if held && !a.replace.braked {
		o := a.opts
		msg := fmt.Sprintf("replacement brake engaged: %d deletions held; %d nodes replaced within %s, the most allowed (%.0f%% of the cluster or %d nodes)",
			l.replacementsHeld, a.replace.brake.Recent(l.now), o.ReplacementBrakeWindow, 100*o.ReplacementBrakeClusterShare, o.ReplacementBrakeMinNodes)
		klog.FromContext(ctx).Info("Replacement brake engaged", "held", l.replacementsHeld, "recent", a.replace.brake.Recent(l.now), "window", o.ReplacementBrakeWindow)
		a.groupEvent(apiv1.EventTypeWarning, EventReplacementBrake, msg)
	}
	a.replace.braked = held
	v := 0.0
	if held {
		v = 1
	}
	a.metrics.ReplacementBrakeEngaged.Set(v)
}

// EventReplacementBlocked is on a node being replaced whose pods may not be
// evicted (a bare pod, safe-to-evict=false, local storage, a
// PodDisruptionBudget): it stays cordoned, never force-deleted.
const EventReplacementBlocked = "ReplacementBlocked"

// drainForReplacement drains a node being replaced (it failed preflight, or
// its machine failed) the way scale-down drains one: the same rules for
// which pods may be evicted, evictions through the Eviction API with each
// pod's grace period (capped by --max-graceful-termination-sec), never a
// forced deletion. It says whether the node has nothing left to evict:
// its machine may then be handed to the Remover, which deletes it once the
// evicted pods are gone or their grace ran out. A node a pod keeps stays
// cordoned; an event and the status say which pod and why.
// With scratch, pods whose only local storage is emptyDir are evicted too
// (a health rule's evictLocalScratch: the node is judged broken).
func (a *Autoscaler) drainForReplacement(ctx context.Context, l *loop, n *apiv1.Node, scratch bool) bool {
	idx, ok := l.snap.Index(n.Name)
	if !ok {
		return true // not in the snapshot: the Remover reads its pods
	}
	if a.pausedForReplacement(l, n) {
		return false
	}
	running := runningPods(l, idx)
	if len(running) == 0 {
		delete(a.preflight.blocked, n.Name)
		return true
	}
	move, reason, why := a.replacementMoves(l, running, scratch)
	if reason != scaledown.ReasonNone {
		a.blockReplacement(ctx, l, n, reason, why)
		return false
	}
	delete(a.preflight.blocked, n.Name)
	o := a.opts.evictOptions()
	for _, p := range move {
		if err := a.evictor.Evict(ctx, o, p); err != nil {
			klog.FromContext(ctx).V(2).Info("Eviction from a node being replaced refused; retried", "pod", klog.KObj(p), "err", err.Error())
		}
	}
	return false
}

// runningPods are the pods of the snapshot's node idx that hold it and
// are not terminating.
func runningPods(l *loop, idx int) []*apiv1.Pod {
	var running []*apiv1.Pod
	for _, p := range l.snap.Pods(idx) {
		if h := actuation.HolderOf(p, l.now); h != nil && !h.Terminating {
			running = append(running, p)
		}
	}
	return running
}

// replacementMoves are the running pods to evict from a node being
// replaced, by scale-down's rules (emptyDir pods too with scratch), taken
// from the loop's PodDisruptionBudgets; or the reason one may not be
// evicted and why (a PDB reason when the budgets could not be read).
func (a *Autoscaler) replacementMoves(l *loop, running []*apiv1.Pod, scratch bool) ([]*apiv1.Pod, scaledown.Reason, string) {
	pdbs, err := a.replacementPDBs(l)
	if err != nil {
		return nil, scaledown.ReasonPDB, err.Error()
	}
	rules := a.opts.scaleDownOptions().Rules
	rules.EvictScratch = scratch
	move, reason, why := scaledown.PodsToMove(running, pdbs, rules)
	if reason == scaledown.ReasonNone {
		pdbs.Take(move)
	}
	return move, reason, why
}

// blockReplacement keeps a node being replaced cordoned while a pod may
// not be evicted: the status says why, and the log and an event on the
// node say it when why changed.
func (a *Autoscaler) blockReplacement(ctx context.Context, l *loop, n *apiv1.Node, reason scaledown.Reason, why string) {
	l.replacementsBlocked = append(l.replacementsBlocked, n.Name+": "+why)
	if a.preflight.blocked[n.Name] == why {
		return
	}
	a.preflight.blocked[n.Name] = why
	klog.FromContext(ctx).Info("A node being replaced keeps a pod that may not be evicted; kept cordoned", "node", klog.KObj(n), "reason", why)
	if a.rec != nil {
		a.rec.Event(nodeRef(n), apiv1.EventTypeWarning, EventReplacementBlocked,
			fmt.Sprintf("node kept cordoned, not replaced, while %s (%s)", why, reason))
	}
}

// pdbs are the PodDisruptionBudgets from the cache.
// replacementPDBs is the loop's PodDisruptionBudgets for the replacement
// paths, built once a loop (it was built again for every draining or
// blocked node: 6.8 ms at 3,000 PDBs, a second a loop at 150 nodes), each
// drain's evictions taken from it so two nodes drained in one loop do
// not both spend a budget's last disruption.
func (a *Autoscaler) replacementPDBs(l *loop) (*scaledown.PDBs, error) {
	if l.replacePDBs != nil {
		return l.replacePDBs, nil
	}
	p, err := a.pdbs()
	if err != nil {
		return nil, err
	}
	l.replacePDBs = p
	return p, nil
}

func (a *Autoscaler) pdbs() (*scaledown.PDBs, error) {
	if a.listers.PDBs == nil {
		return scaledown.NewPDBs(nil), nil
	}
	list, err := a.listers.PDBs.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing PodDisruptionBudgets from cache: %w", err)
	}
	return scaledown.NewPDBs(list), nil
}

// removeFailedMachines deletes the machines the cluster state found failed
// (a creation error, never registered), within the replacement brake. A
// failed machine whose Node exists may run pods: it is cordoned and
// drained like any replacement, and deleted once nothing holds it; until
// then it is asked again by the next loop.
func (a *Autoscaler) removeFailedMachines(ctx context.Context, l *loop, del map[string][]string) {
	if len(del) == 0 {
		return
	}
	machines, listed := a.admitFailedMachines(ctx, l, del)
	// A machine no longer asked for (deleted, or it recovered) is
	// forgotten: asked again later, it is counted by the brake again.
	a.forgetUnlistedMachines(listed)
	if !a.saveReplacementCount(ctx, l, machines) {
		return
	}
	a.deleteFailedMachines(ctx, l, machines)
}

// admitFailedMachines are the failed machines the replacement brake admits
// and whose nodes have nothing left to evict (each with its Node, when it
// has one); the others are asked again by the next Update. listed are all
// the machines asked for.
func (a *Autoscaler) admitFailedMachines(ctx context.Context, l *loop, del map[string][]string) (machines []actuation.Machine, listed map[string]bool) {
	nodeOf := nodesByProviderID(l.nodes)
	listed = map[string]bool{}
	for _, id := range sortedKeys(del) {
		for _, pid := range del[id] {
			listed[pid] = true
			m := actuation.Machine{Group: id, ProviderID: pid, Node: nodeOf[cloudprovider.ProviderIDKey(pid)]}
			if !a.admitReplacement(ctx, l, m) {
				a.registry.RetryDelete([]string{pid}) // asked again by the next Update
				continue
			}
			machines = append(machines, m)
		}
	}
	return machines, listed
}

// nodesByProviderID are the nodes with a provider ID, by its key.
func nodesByProviderID(nodes []*apiv1.Node) map[string]*apiv1.Node {
	nodeOf := make(map[string]*apiv1.Node, len(nodes))
	for _, n := range nodes {
		if n.Spec.ProviderID != "" {
			nodeOf[cloudprovider.ProviderIDKey(n.Spec.ProviderID)] = n
		}
	}
	return nodeOf
}

// forgetUnlistedMachines forgets the node-less machines admitted earlier
// and no longer asked for: their admission, whether their deletion was
// sent, and their place in the brake.
func (a *Autoscaler) forgetUnlistedMachines(listed map[string]bool) {
	for pid := range a.preflight.admittedMachines {
		if !listed[pid] {
			delete(a.preflight.admittedMachines, pid)
			delete(a.preflight.sent, pid)
			a.replace.brake.Dropped(pid)
		}
	}
}

// saveReplacementCount is the write-ahead of deleting machines: the brake
// counted them, and the next leader must see them counted. It says
// whether they may be deleted; when the count could not be saved they are
// asked again by the next Update.
func (a *Autoscaler) saveReplacementCount(ctx context.Context, l *loop, machines []actuation.Machine) bool {
	if len(machines) == 0 {
		return true
	}
	err := a.persistSafetyState(ctx, l.now)
	if err == nil {
		return true
	}
	klog.FromContext(ctx).Error(err, "Failed machines not deleted: the brake's count could not be saved first; retried next loop")
	for _, m := range machines {
		a.registry.RetryDelete([]string{m.ProviderID})
	}
	return false
}

// deleteFailedMachines hands the admitted machines to the Remover: one
// deleted is charged to the brake once and kept from the preflight phase;
// one not deleted is asked again by the next Update.
func (a *Autoscaler) deleteFailedMachines(ctx context.Context, l *loop, machines []actuation.Machine) {
	logger := klog.FromContext(ctx)
	deleted := map[string]int{}
	for _, o := range a.remover.Remove(ctx, l.byID, machines) {
		switch {
		case o.Deleted:
			deleted[o.Group]++
			if key := machineKey(o.Machine); !a.preflight.sent[key] {
				a.preflight.sent[key] = true // asked again later: charged once
				a.replacementSent(l, o.Machine)
			}
			if o.Node != nil {
				// The preflight phase must not delete it again.
				a.preflight.deleted[o.Node.Name] = l.now
			}
			continue
		case o.Err != nil:
			logger.Error(o.Err, "Deleting a failed machine; retried next loop", "providerID", o.ProviderID, "nodeGroup", o.Group)
		default:
			logger.V(2).Info("Failed machine waits for its pods", "node", klog.KObj(o.Node), "holder", o.Held.String())
		}
		a.registry.RetryDelete([]string{o.ProviderID})
	}
	for _, id := range sortedKeys(deleted) {
		logger.Info("Deleted failed machines", "nodeGroup", id, "count", deleted[id])
	}
}

// admitReplacement says whether a failed machine may be deleted this loop:
// the replacement brake admits it (once; a machine admitted earlier and
// still draining is not counted again) and, when its Node exists, the node
// has nothing left to evict. (That node is not Ready — a failed machine
// whose node is Ready runs, and is kept — so the node lifecycle
// controller's not-ready taint keeps new pods off it; no cordon is added
// that a recovery would have to take back.)
func (a *Autoscaler) admitReplacement(ctx context.Context, l *loop, m actuation.Machine) bool {
	ps := a.preflight
	// A node's admission is forgotten with the node (pruneFailed); a
	// machine without one, when it is no longer asked for.
	admitted, key := ps.admitted, ""
	if m.Node != nil {
		key = m.Node.Name
	} else {
		admitted, key = ps.admittedMachines, m.ProviderID
	}
	if !admitted[key] {
		if !a.allowReplacement(l, m.Group, key) {
			return false
		}
		admitted[key] = true
	}
	if m.Node == nil {
		return true
	}
	return a.drainForReplacement(ctx, l, m.Node, false)
}
