package actuation

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apiv1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
)

// Scale-down events, as in cluster-autoscaler.
const (
	EventScaleDown       = "ScaleDown"
	EventScaleDownFailed = "ScaleDownFailed"
)

// Options are the scale-down actuator's settings.
type Options struct {
	Evict EvictOptions
	// MaxSoftTaintsPerLoop caps the taint writes of SoftTaint and
	// UntaintStale per loop (--max-soft-taints-per-loop).
	MaxSoftTaintsPerLoop int
	// DeleteDelayAfterTaint is how long a node carries its ToBeDeleted
	// taint before its machine is deleted (--node-delete-delay-after-taint,
	// CA's name): a pod the scheduler bound before the taint reached it
	// shows up in the meantime, and the removal is given up.
	DeleteDelayAfterTaint time.Duration
}

// Metrics are the actuator's metrics.
type Metrics struct {
	Evictions      *prometheus.CounterVec // {result}
	ScaledDown     *prometheus.CounterVec // {node_group, reason}
	Failed         *prometheus.CounterVec // {node_group, step}
	DrainsInFlight prometheus.Gauge
}

// SendCounter is told when a removal the brake reserved has its machine's
// deletion asked of the cloud, or is given up (scaledown.Brake): the
// brake counts a window from the sending, not the decision.
type SendCounter interface {
	Sent(now time.Time, group, node string)
	Dropped(node string)
}

// ScaleDown carries out scale-down's decisions: DeletionCandidate soft
// taints, ToBeDeleted taints, batched deletion of empty nodes, and drains
// in background goroutines whose nodes the next loop deletes, one
// DeleteNodes per group, all through the Remover. Its methods are called
// by the loop; drains run concurrently with it and read only what they
// were handed when they started, so a live reload never races with a
// drain.
type ScaleDown struct {
	actions NodeActions
	remover *Remover
	evictor Evictor
	pods    corelisters.PodLister
	rec     record.EventRecorder // nil: no events
	metrics Metrics
	clock   clock.Clock
	opts    Options // the loop's; drains get a copy
	brake   SendCounter

	mu sync.Mutex
	// gone holds nodes whose machines were deleted, until their Node
	// objects disappear: they are never planned again. A machine the
	// cloud lists alive again after its deletion (the asynchronous delete
	// failed) is taken back by Reconcile.
	gone map[string]removed
	// drained holds nodes whose drain finished (empty nodes at once):
	// the loops from their notBefore on delete them with one DeleteNodes
	// per group.
	drained []toDelete
	// draining are the nodes a goroutine is draining, or drained and not
	// yet deleted.
	// (node name → its group)
	draining map[string]string
	// lastDelete and lastFailure drive --scale-down-delay-after-delete and
	// -after-failure; drains write them from their goroutines.
	lastDelete, lastFailure time.Time
	wg                      sync.WaitGroup
}

// toDelete is a tainted node whose machine is to be deleted: not before
// notBefore (the delay after its taint), and given up at deadline while
// pods it evicted are still terminating.
type toDelete struct {
	r                   scaledown.Removal
	notBefore, deadline time.Time
}

// NewScaleDown returns an idle actuator that deletes through remover and
// tells brake when each removal is sent or given up.
func NewScaleDown(actions NodeActions, remover *Remover, brake SendCounter, pods corelisters.PodLister, rec record.EventRecorder, m Metrics, clk clock.Clock, o Options) *ScaleDown {
	return &ScaleDown{actions: actions, remover: remover, brake: brake, evictor: Evictor{Actions: actions, Results: m.Evictions}, pods: pods, rec: rec,
		metrics: m, clock: clk, opts: o, gone: map[string]removed{}, draining: map[string]string{}}
}

// SetOptions changes the options for what starts next; running drains keep
// theirs. Called by the loop, between loops.
func (s *ScaleDown) SetOptions(o Options) { s.opts = o }

// Wait blocks until running drains finish (tests, shutdown).
func (s *ScaleDown) Wait() { s.wg.Wait() }

// InFlight is the number of nodes being drained or waiting for deletion.
func (s *ScaleDown) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.draining)
}

// setInFlight sets the drains-in-flight gauge under the lock, so a drain
// goroutine's older count never overwrites a newer one.
func (s *ScaleDown) setInFlight() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metrics.DrainsInFlight.Set(float64(len(s.draining)))
}

// InFlightIn is the number of a group's nodes being drained or waiting for
// their deletion: the planner counts them as deleting, so a group is never
// planned below its minimum by removals not yet sent.
func (s *ScaleDown) InFlightIn(group string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, g := range s.draining {
		if g == group {
			n++
		}
	}
	return n
}

// IsDraining says a node is being drained or waits for its deletion.
func (s *ScaleDown) IsDraining(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.draining[name]
	return ok
}

// IsGone says a node's machine was deleted by this actuator.
func (s *ScaleDown) IsGone(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.gone[name]
	return ok
}

// removed is a node whose machine this actuator deleted.
type removed struct {
	r  scaledown.Removal
	at time.Time
}

// Reconcile takes back deletions that failed after they were accepted
// (an asynchronous delete operation that failed): a machine deleted in an
// earlier loop that its group lists again as alive, not deleting. Its node
// gets its ToBeDeleted taint removed and becomes a candidate again, the
// failure is counted (failed_scale_downs_total{step="delete"}) and evented,
// and scale-down waits --scale-down-delay-after-failure before trying
// again: the backoff.
func (s *ScaleDown) Reconcile(ctx context.Context, now time.Time, groups map[string]cloudprovider.NodeGroup) {
	s.mu.Lock()
	var check []removed
	for _, g := range s.gone {
		if g.at.Before(now) {
			check = append(check, g)
		}
	}
	s.mu.Unlock()
	alive := map[string]map[string]bool{}
	for _, g := range check {
		id := g.r.Group
		if _, ok := alive[id]; !ok {
			alive[id] = map[string]bool{}
			if ng, ok := groups[id]; ok {
				if ins, err := ng.Instances(); err == nil {
					for _, in := range ins {
						if in.State != cloudprovider.InstanceDeleting {
							alive[id][cloudprovider.ProviderIDKey(in.ProviderID)] = true
						}
					}
				}
			}
		}
		if !alive[id][cloudprovider.ProviderIDKey(g.r.Node.Spec.ProviderID)] {
			continue
		}
		s.mu.Lock()
		delete(s.gone, g.r.Node.Name)
		s.mu.Unlock()
		s.fail(ctx, now, g.r, "delete", fmt.Errorf("machine %s of node group %s is alive again: its deletion, accepted at %s, failed",
			g.r.Node.Spec.ProviderID, id, g.at.UTC().Format(time.RFC3339)))
	}
}

// Forget drops deleted nodes whose Node objects are gone.
func (s *ScaleDown) Forget(present func(name string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.gone {
		if !present(name) {
			delete(s.gone, name)
		}
	}
}

// Held says why scale-down waits at now, or "": within a delay after the
// last deletion or the last failure.
func (s *ScaleDown) Held(now time.Time, afterDelete, afterFailure time.Duration) string {
	s.mu.Lock()
	lastDelete, lastFailure := s.lastDelete, s.lastFailure
	s.mu.Unlock()
	switch {
	case !lastDelete.IsZero() && now.Sub(lastDelete) < afterDelete:
		return "within --scale-down-delay-after-delete"
	case !lastFailure.IsZero() && now.Sub(lastFailure) < afterFailure:
		return "within --scale-down-delay-after-failure"
	}
	return ""
}

// SoftTaint keeps DeletionCandidate taints on exactly the unneeded nodes,
// within the per-loop write budget. Which nodes carry the taint is read
// from the nodes themselves, so a restart cleans up after the previous
// leader. Only nodes of this process's node groups (managed) are
// untainted: the key is cluster-autoscaler's too, and a node of another
// autoscaler (another cluster-autoscaler, or ours for other scale sets) is
// that one's to taint.
func (s *ScaleDown) SoftTaint(ctx context.Context, now time.Time, nodes []*apiv1.Node, unneeded []string, managed func(name string) bool) {
	has, tainted := softTainted(nodes, managed)
	taint := apiv1.Taint{Key: scaledown.DeletionCandidateTaint, Value: fmt.Sprint(now.Unix()), Effect: apiv1.TaintEffectPreferNoSchedule}
	budget := s.addSoftTaints(ctx, unneeded, tainted, taint, s.opts.MaxSoftTaintsPerLoop)
	s.removeSoftTaints(ctx, has, unneeded, budget)
}

// softTainted are the managed nodes that carry the DeletionCandidate
// taint, sorted, and as a set.
func softTainted(nodes []*apiv1.Node, managed func(name string) bool) ([]string, map[string]bool) {
	var has []string
	tainted := map[string]bool{}
	for _, n := range nodes {
		if managed(n.Name) && HasTaintKey(n, scaledown.DeletionCandidateTaint) {
			has = append(has, n.Name)
			tainted[n.Name] = true
		}
	}
	sort.Strings(has)
	return has, tainted
}

// addSoftTaints taints the unneeded nodes not tainted yet, within
// budget; it returns the budget left.
func (s *ScaleDown) addSoftTaints(ctx context.Context, unneeded []string, tainted map[string]bool, taint apiv1.Taint, budget int) int {
	for _, n := range unneeded {
		if tainted[n] {
			continue
		}
		if budget <= 0 {
			return budget
		}
		budget--
		if err := s.actions.AddTaint(ctx, n, taint); err != nil {
			klog.FromContext(ctx).Error(err, "Adding deletion-candidate taint", "node", n)
		}
	}
	return budget
}

// removeSoftTaints untaints the tainted nodes (has) no longer unneeded,
// within budget.
func (s *ScaleDown) removeSoftTaints(ctx context.Context, has, unneeded []string, budget int) {
	want := make(map[string]bool, len(unneeded))
	for _, n := range unneeded {
		want[n] = true
	}
	for _, n := range has {
		if want[n] {
			continue
		}
		if budget <= 0 {
			return
		}
		budget--
		if err := s.actions.RemoveTaint(ctx, n, scaledown.DeletionCandidateTaint); err != nil {
			klog.FromContext(ctx).Error(err, "Removing deletion-candidate taint", "node", n)
		}
	}
}

// UntaintStale removes ToBeDeleted taints this process is not acting on
// and whose machine is not being deleted: left by a drain that a crash or
// a leader change interrupted, they would keep pods off a healthy node.
// managed says a node belongs to a node group.
func (s *ScaleDown) UntaintStale(ctx context.Context, nodes []*apiv1.Node, groups []cloudprovider.NodeGroup, managed func(name string) bool) {
	// Only nodes whose machine is listed and not deleting are untainted; a
	// node whose machine is gone is on its way out.
	alive := aliveMachines(groups)
	budget := s.opts.MaxSoftTaintsPerLoop
	for _, n := range nodes {
		if budget <= 0 {
			return
		}
		if !s.staleTaint(n, managed, alive) {
			continue
		}
		budget--
		if err := s.actions.RemoveTaint(ctx, n.Name, scaledown.ToBeDeletedTaint); err != nil {
			klog.FromContext(ctx).Error(err, "Removing a stale to-be-deleted taint", "node", n.Name)
			continue
		}
		klog.FromContext(ctx).Info("Removed a stale to-be-deleted taint", "node", n.Name)
	}
}

// aliveMachines are the provider ID keys of the groups' machines listed
// and not deleting (a group that cannot list them adds none).
func aliveMachines(groups []cloudprovider.NodeGroup) map[string]bool {
	alive := map[string]bool{}
	for _, g := range groups {
		ins, err := g.Instances()
		if err != nil {
			continue
		}
		for _, in := range ins {
			if in.State != cloudprovider.InstanceDeleting {
				alive[cloudprovider.ProviderIDKey(in.ProviderID)] = true
			}
		}
	}
	return alive
}

// staleTaint says whether a managed node's ToBeDeleted taint is stale:
// not being drained or deleted by this process, its machine alive.
func (s *ScaleDown) staleTaint(n *apiv1.Node, managed func(name string) bool, alive map[string]bool) bool {
	return managed(n.Name) && HasTaintKey(n, scaledown.ToBeDeletedTaint) &&
		!s.IsDraining(n.Name) && !s.IsGone(n.Name) && alive[cloudprovider.ProviderIDKey(n.Spec.ProviderID)]
}

// RemoveEmpty taints empty nodes and hands them to deletion after
// --node-delete-delay-after-taint (this very loop when it is zero): the
// Remover looks at their pods again then, and a node that got a pod since
// the decision is kept.
func (s *ScaleDown) RemoveEmpty(ctx context.Context, now time.Time, groups map[string]cloudprovider.NodeGroup, empty []scaledown.Removal) {
	if len(empty) == 0 {
		return
	}
	delay := s.opts.DeleteDelayAfterTaint
	for _, r := range empty {
		if err := s.actions.AddTaint(ctx, r.Node.Name, ToBeDeleted(now)); err != nil {
			s.fail(ctx, now, r, "taint", err)
			continue
		}
		s.mu.Lock()
		s.draining[r.Node.Name] = r.Group
		s.drained = append(s.drained, toDelete{r: r, notBefore: now.Add(delay), deadline: s.deadline(now.Add(delay), s.opts.Evict)})
		s.mu.Unlock()
	}
	s.setInFlight()
	if delay <= 0 {
		s.FlushDrained(ctx, now, groups)
	}
}

// deadline is when a removal whose pods are still terminating from is
// given up: the graceful-termination cap plus a minute.
func (s *ScaleDown) deadline(from time.Time, o EvictOptions) time.Time {
	return from.Add(time.Duration(o.MaxGracefulTerminationSec)*time.Second + time.Minute)
}

// FlushDrained deletes the nodes whose drain finished (and the empty
// nodes) once their delay after the taint is over, one DeleteNodes per
// group, through the Remover. It runs whatever else the loop decides. A
// node the Remover finds a running pod on is kept: the removal is given
// up (untainted, counted as failed_scale_downs_total{step="recheck"},
// and an event names the pod). One whose evicted pods are still within
// their grace period waits for the next loop, until its deadline.
func (s *ScaleDown) FlushDrained(ctx context.Context, now time.Time, groups map[string]cloudprovider.NodeGroup) {
	due := s.takeDue(now)
	if len(due) == 0 {
		return
	}
	machines := make([]Machine, len(due))
	for i, d := range due {
		machines[i] = MachineOf(d.r.Group, d.r.Node)
	}
	deleted := map[string]int{}
	var wait []toDelete
	for i, o := range s.remover.Remove(ctx, groups, machines) {
		d := due[i]
		if s.settle(ctx, now, d, o) {
			wait = append(wait, d)
			continue // still draining
		}
		if o.Deleted {
			deleted[d.r.Group]++
		}
	}
	s.mu.Lock()
	s.drained = append(s.drained, wait...)
	s.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(deleted)) {
		klog.FromContext(ctx).Info("Removed nodes", "nodeGroup", id, "count", deleted[id])
	}
	s.setInFlight()
}

// takeDue takes the drained nodes whose delay after the taint is over
// out of drained.
func (s *ScaleDown) takeDue(now time.Time) []toDelete {
	s.mu.Lock()
	defer s.mu.Unlock()
	var due, later []toDelete
	for _, d := range s.drained {
		if d.notBefore.After(now) {
			later = append(later, d)
		} else {
			due = append(due, d)
		}
	}
	s.drained = later
	return due
}

// settle records what the Remover did with a drained node: removed,
// uncertain, or failed (untainted) at the step that failed; it says
// whether the node waits instead, its evicted pods still terminating
// before its deadline. A node settled is no longer draining.
func (s *ScaleDown) settle(ctx context.Context, now time.Time, d toDelete, o Outcome) (waits bool) {
	switch {
	case o.Deleted:
		s.removed(now, d.r)
	case o.Err != nil && o.Sent:
		s.uncertain(ctx, now, d.r, o.Err)
	case o.Err != nil:
		s.fail(ctx, now, d.r, "delete", o.Err)
	case o.Held.Terminating && now.Before(d.deadline):
		return true
	case o.Held.Terminating:
		s.fail(ctx, now, d.r, "drain-timeout", fmt.Errorf("%s, past the drain's deadline %s", o.Held, d.deadline.UTC().Format(time.RFC3339)))
	default:
		s.fail(ctx, now, d.r, "recheck", fmt.Errorf("%s: it came after the scale-down decision; the node is kept", o.Held))
	}
	s.mu.Lock()
	delete(s.draining, d.r.Node.Name)
	s.mu.Unlock()
	return false
}

// UncertainDeleteWait is how long a node whose deletion failed without a
// clear answer (a timeout, a lost connection: the cloud may have started
// deleting it) keeps its ToBeDeleted taint before Reconcile looks at its
// machine again: longer than the provider's default cache lifetime
// (1 minute ±10%), so the machine's state is read after the deletion.
const UncertainDeleteWait = 3 * time.Minute

// uncertain keeps a node whose deletion failed without a clear answer
// tainted and out of every plan: untainted now, it could take a gang's
// pods while its machine goes away. Reconcile takes it back (untaint,
// failed_scale_downs_total{step="delete"}) if its machine is still alive
// after UncertainDeleteWait; a machine that did go takes its Node along.
func (s *ScaleDown) uncertain(ctx context.Context, now time.Time, r scaledown.Removal, err error) {
	klog.FromContext(ctx).Error(err, "Deleting a node's machine failed without a clear answer; kept tainted until its machine is read again",
		"node", r.Node.Name, "nodeGroup", r.Group, "recheckAfter", UncertainDeleteWait)
	s.mu.Lock()
	s.gone[r.Node.Name] = removed{r: r, at: now.Add(UncertainDeleteWait)}
	s.lastFailure = now
	s.mu.Unlock()
	s.brake.Sent(now, r.Group, r.Node.Name) // the cloud may be deleting it
}

func (s *ScaleDown) removed(now time.Time, r scaledown.Removal) {
	s.brake.Sent(now, r.Group, r.Node.Name)
	s.mu.Lock()
	s.lastDelete = now
	s.gone[r.Node.Name] = removed{r: r, at: now}
	s.mu.Unlock()
	s.metrics.ScaledDown.WithLabelValues(r.Group, r.Reason).Inc()
	if s.rec != nil {
		s.rec.Eventf(r.Node, apiv1.EventTypeNormal, EventScaleDown, "node removed by vmss-autoscaler (%s, utilisation %.2f)", r.Reason, r.Util)
	}
}

// fail untaints the node and records why its removal failed.
func (s *ScaleDown) fail(ctx context.Context, now time.Time, r scaledown.Removal, step string, err error) {
	klog.FromContext(ctx).Error(err, "Scale-down failed", "node", r.Node.Name, "nodeGroup", r.Group, "step", step)
	s.brake.Dropped(r.Node.Name)
	s.metrics.Failed.WithLabelValues(r.Group, step).Inc()
	if uerr := s.actions.RemoveTaint(context.WithoutCancel(ctx), r.Node.Name, scaledown.ToBeDeletedTaint); uerr != nil {
		klog.FromContext(ctx).Error(uerr, "Removing the to-be-deleted taint after a failed scale-down", "node", r.Node.Name)
	}
	s.mu.Lock()
	s.lastFailure = now
	s.mu.Unlock()
	if s.rec != nil {
		s.rec.Eventf(r.Node, apiv1.EventTypeWarning, EventScaleDownFailed, "scale-down failed at %s: %v", step, err)
	}
}

// StartDrain taints and evicts a node in the background; the next loop's
// FlushDrained deletes it. The drain works with a copy of the options in
// force now.
func (s *ScaleDown) StartDrain(ctx context.Context, now time.Time, r scaledown.Removal) {
	s.mu.Lock()
	s.draining[r.Node.Name] = r.Group
	s.mu.Unlock()
	s.setInFlight()
	o, delay := s.opts.Evict, s.opts.DeleteDelayAfterTaint
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.drain(ctx, now, o, r); err != nil {
			s.mu.Lock()
			delete(s.draining, r.Node.Name)
			s.mu.Unlock()
			s.setInFlight()
			return
		}
		// Still marked draining until a loop deletes it, batched with the
		// other drained nodes of its group, once its taint is old enough.
		s.mu.Lock()
		s.drained = append(s.drained, toDelete{r: r, notBefore: now.Add(delay), deadline: s.deadline(now, o)})
		s.mu.Unlock()
	}()
}

// drain taints the node, evicts its pods through the Eviction API (retrying
// while a PodDisruptionBudget says not yet) and waits until they are gone,
// all within the graceful-termination cap plus a minute.
func (s *ScaleDown) drain(ctx context.Context, now time.Time, o EvictOptions, r scaledown.Removal) error {
	if err := s.actions.AddTaint(ctx, r.Node.Name, ToBeDeleted(now)); err != nil {
		s.fail(ctx, s.clock.Now(), r, "taint", err)
		return err
	}
	deadline := s.clock.Now().Add(time.Duration(o.MaxGracefulTerminationSec)*time.Second + time.Minute)
	if err := s.evictAll(ctx, o, r, deadline); err != nil {
		return err
	}
	if r.Reason == "unready" {
		// No kubelet will confirm the pods' end on an unready node; the
		// accepted evictions are what the node's removal waits for.
		return nil
	}
	return s.awaitGone(ctx, r, deadline)
}

// evictAll evicts the node's pods, again every 5 s while some are
// refused (a PodDisruptionBudget says not yet), until deadline; a
// failure is recorded (step "evict").
func (s *ScaleDown) evictAll(ctx context.Context, o EvictOptions, r scaledown.Removal, deadline time.Time) error {
	pending := append([]*apiv1.Pod(nil), r.Pods...)
	for len(pending) > 0 {
		retry, err := s.evictEach(ctx, o, r, pending)
		if err != nil {
			return err
		}
		pending = retry
		if len(pending) == 0 {
			break
		}
		if s.clock.Now().After(deadline) {
			err := fmt.Errorf("%d pods of node %s could not be evicted before the deadline", len(pending), r.Node.Name)
			s.fail(ctx, s.clock.Now(), r, "evict", err)
			return err
		}
		if err := s.pause(ctx, 5*time.Second); err != nil {
			s.fail(ctx, s.clock.Now(), r, "evict", err)
			return err
		}
	}
	return nil
}

// evictEach asks for each pod's eviction once; it returns the pods to
// ask again, or the gate's refusal (recorded).
func (s *ScaleDown) evictEach(ctx context.Context, o EvictOptions, r scaledown.Removal, pods []*apiv1.Pod) ([]*apiv1.Pod, error) {
	var retry []*apiv1.Pod
	for _, p := range pods {
		if err := s.evictor.Evict(ctx, o, p); err != nil {
			if Refused(err) {
				// The gate closed under the drain (the cluster turned
				// unhealthy, or this replica lost its lease): stop now,
				// not at the deadline.
				s.fail(ctx, s.clock.Now(), r, "evict", err)
				return nil, err
			}
			retry = append(retry, p)
			continue
		}
		if s.rec != nil {
			s.rec.Eventf(p, apiv1.EventTypeNormal, EventScaleDown, "deleting pod for node scale down of %s", r.Node.Name)
		}
	}
	return retry, nil
}

// awaitGone waits, every second, until the evicted pods are gone from the
// node, until deadline; a timeout is recorded (step "drain-timeout").
func (s *ScaleDown) awaitGone(ctx context.Context, r scaledown.Removal, deadline time.Time) error {
	for {
		left := s.podsLeft(r)
		if left == 0 {
			return nil
		}
		if s.clock.Now().After(deadline) {
			err := fmt.Errorf("%d evicted pods of node %s still there at the deadline", left, r.Node.Name)
			s.fail(ctx, s.clock.Now(), r, "drain-timeout", err)
			return err
		}
		if err := s.pause(ctx, time.Second); err != nil {
			s.fail(ctx, s.clock.Now(), r, "drain-timeout", err)
			return err
		}
	}
}

// podsLeft is how many of the removal's pods are still running on its
// node (the same pods, by UID, not finished).
func (s *ScaleDown) podsLeft(r scaledown.Removal) int {
	left := 0
	for _, p := range r.Pods {
		cur, err := s.pods.Pods(p.Namespace).Get(p.Name)
		if err == nil && cur.UID == p.UID && cur.Spec.NodeName == r.Node.Name && cur.Status.Phase != apiv1.PodSucceeded && cur.Status.Phase != apiv1.PodFailed {
			left++
		}
	}
	return left
}

// pause waits d on the actuator's clock, or until ctx ends.
func (s *ScaleDown) pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.clock.After(d):
		return nil
	}
}

// HasTaintKey says the node has a taint with the key.
func HasTaintKey(n *apiv1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// ToBeDeleted is the taint put on a node about to be removed.
func ToBeDeleted(now time.Time) apiv1.Taint {
	return apiv1.Taint{Key: scaledown.ToBeDeletedTaint, Value: fmt.Sprint(now.Unix()), Effect: apiv1.TaintEffectNoSchedule}
}
