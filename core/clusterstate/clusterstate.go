// Package clusterstate keeps what the autoscaler knows about each node
// group between loops: how many of its machines are ready, still coming, or
// lost; which scale-ups failed; and which groups are backed off. It is pure
// bookkeeping: Update returns the actions the loop must take (delete failed
// machines, lower targets) and never calls the cloud itself.
package clusterstate

import (
	"fmt"
	"time"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// Options configure the registry.
type Options struct {
	// MaxNodeProvisionTime is how long a requested machine may take to
	// register as a node (per-group override through GroupOptions).
	MaxNodeProvisionTime time.Duration
	// MaxNodeStartupTime is how long a registered node may stay not ready
	// before it counts as unready rather than still starting.
	MaxNodeStartupTime time.Duration
	Backoff            BackoffOptions
	// GroupDefaults are the defaults handed to NodeGroup.Options.
	GroupDefaults cloudprovider.GroupOptions
	// Preflight is the readiness gate: a pending node is coming capacity,
	// never ready nor unready; a failed one is replaced.
	Preflight preflight.Options
	// PreflightFailuresBeforeBackoff failures in a group within
	// PreflightFailureWindow back the group off (a bad batch of hardware
	// must not loop); 0 never backs off for preflight.
	PreflightFailuresBeforeBackoff int
	PreflightFailureWindow         time.Duration
	// Startup says which Ready nodes are not capacity yet.
	Startup StartupOptions
	// LostDeletionAfter is how long a machine handed out for deletion may
	// still be listed, not deleting, before its deletion is taken as lost
	// and asked again (0: DefaultLostDeletionAfter).
	LostDeletionAfter time.Duration
}

// Readiness counts a group's machines by stage.
type Readiness struct {
	// Target is the size the cloud was asked for; valid when TargetKnown.
	Target      int
	TargetKnown bool
	// Registered nodes have a Node object; Ready, Unready and NotStarted split them.
	// NotStarted includes Ready nodes that are not capacity yet (a startup
	// taint, GPUs not advertised yet) within the startup time.
	Registered, Ready, Unready, NotStarted int
	// Unregistered machines exist in the cloud without a Node object, within
	// the provision time; LongUnregistered ones are past it.
	Unregistered, LongUnregistered int
	// InError machines are ones the cloud reported as failed and that do
	// not run: failed creations, deleted for that.
	InError int
	// FailedRunning machines are ones the cloud reported as failed that
	// run: power state running, or their Node registered and Ready (a VM
	// whose extension, data-disk attach or model update failed). They are
	// counted as the nodes they are, and never deleted for the failure.
	FailedRunning int
	// Deleting machines are being removed.
	Deleting int
	// NotCreated is the part of the target the cloud has not made machines for yet.
	NotCreated int
	// Preflight nodes are registered and wait for the preflight agent: they
	// are coming capacity (part of Upcoming), never unready.
	Preflight int
	// PreflightFailed nodes failed preflight (or timed out) and are being
	// replaced: not capacity, not upcoming.
	PreflightFailed int
	// Upcoming is what the target promises beyond usable nodes: machines
	// that are coming and count against new scale-ups.
	Upcoming int
	// LastKnownUpcoming is Upcoming as of the last Update that knew the
	// group's size (raised by scale-ups since): what the in-flight cap
	// counts for the group while its size is unknown.
	LastKnownUpcoming int
}

// GroupState is one group as of the last Update.
type GroupState struct {
	ID          string
	Min, Max    int
	Readiness   Readiness
	SizeError   error
	Backoff     BackoffStatus
	LastScaleUp time.Time
	// GPU says the group makes GPU nodes: its nodes are not capacity until
	// they advertise their GPUs.
	GPU bool
	// MaxWarning says the configured max is more than the cloud lets the
	// group hold (Max is the cloud's limit then); empty otherwise.
	MaxWarning string
	// InstancesStale says the group's machines are an older list's (the
	// cloud's last list of them failed): how old, and why.
	InstancesStale string
}

// Failure is a scale-up failure found by Update.
type Failure struct {
	Group   string
	Class   cloudprovider.ErrorClass
	Reason  string // short, for metrics: "quota", "out-of-capacity", "provision-timeout", ...
	Message string
}

// Actions are what the loop must do after Update.
type Actions struct {
	// Delete lists, per group, the provider IDs of machines to delete:
	// failed creations and machines that never registered.
	Delete map[string][]string
	// LostDeletes counts, per group, machines listed in Delete again
	// because Options.LostDeletionAfter after they were handed out for deletion
	// the cloud still lists them, not deleting: the deletion was lost.
	LostDeletes map[string]int
	// DecreaseTarget lists, per group, a negative delta for requested
	// machines the cloud never created within the provision time.
	DecreaseTarget map[string]int
	// Failures found in this update; their groups are backed off already.
	Failures []Failure
	// PreflightFailed are the registered nodes that failed preflight: the
	// loop cordons, drains and deletes them. Listed every Update until gone.
	PreflightFailed []NodeResult
	// PreflightPassed are the nodes seen pending before and passed now.
	PreflightPassed []NodeResult
	// PreflightNewFailures are the nodes first seen failed in this Update.
	PreflightNewFailures []NodeResult
	// FailedRunning are the machines the cloud reports failed while they
	// run (see Readiness.FailedRunning), listed every Update: the loop
	// tells of them and leaves them.
	FailedRunning []FailedRunning
	// FailedRunningRecovered are the machines listed in FailedRunning by an
	// earlier Update that run now with no failure (Error holds the code
	// they had).
	FailedRunningRecovered []FailedRunning
}

// FailedRunning is a machine the cloud reports failed while it runs.
type FailedRunning struct {
	Group      string
	ProviderID string
	// Node is the machine's Node, nil when it has none yet.
	Node *apiv1.Node
	// Error is the cloud's failure: its code and message.
	Error cloudprovider.InstanceError
	// New says the machine was not listed failed, or with another code,
	// by the previous Update.
	New bool
}

// NodeResult is a node's preflight outcome.
type NodeResult struct {
	Group  string
	Node   *apiv1.Node
	Reason string
}

// Registry is the cluster state. It is not safe for concurrent use; the
// loop owns it.
type Registry struct {
	opts Options
	// deleting are the machines the last Update saw deleting, by
	// ProviderIDKey.
	deleting          map[string]bool
	backoff           *Backoff
	groups            map[string]*GroupState
	order             []string
	unregisteredSince map[string]time.Time
	notCreatedSince   map[string]time.Time
	// handled machines were already counted as failures, with when they
	// were last handed out for deletion; retry holds the ones whose
	// deletion must be asked again without a new failure.
	handled     map[string]time.Time
	retry       map[string]bool
	lastScaleUp map[string]time.Time
	// lastUpcoming is each group's upcoming count when its size was last
	// known, raised by the scale-ups since.
	lastUpcoming map[string]int
	// preflightPending are nodes seen pending (name → group);
	// preflightFailed nodes already counted as failures; preflightFailures
	// the recent failure times per group, for the backoff.
	preflightPending  map[string]string
	preflightFailed   map[string]bool
	preflightFailures map[string][]time.Time
	// prevUpdate is the time of the previous Update: a machine or a target
	// first seen now appeared after it.
	prevUpdate time.Time
	// failedRunningCode are the machines listed failed while running, by
	// provider ID, with their error code.
	failedRunningCode map[string]string
}

// NewRegistry returns an empty registry.
func NewRegistry(opts Options) *Registry {
	return &Registry{
		opts:              opts,
		backoff:           NewBackoff(opts.Backoff),
		groups:            map[string]*GroupState{},
		unregisteredSince: map[string]time.Time{},
		notCreatedSince:   map[string]time.Time{},
		handled:           map[string]time.Time{},
		retry:             map[string]bool{},
		lastScaleUp:       map[string]time.Time{},
		lastUpcoming:      map[string]int{},
		preflightPending:  map[string]string{},
		preflightFailed:   map[string]bool{},
		preflightFailures: map[string][]time.Time{},
		failedRunningCode: map[string]string{},
	}
}

// SetOptions changes the registry's options (a live reload); counts and
// backoffs already running are kept, and take the new durations from
// their next change.
func (r *Registry) SetOptions(o Options) {
	r.opts = o
	r.backoff.opts = o.Backoff
}

// Options returns the registry's options.
func (r *Registry) Options() Options { return r.opts }

// NodeGroupForNode maps a node to its group; nil for unmanaged nodes.
type NodeGroupForNode func(*apiv1.Node) cloudprovider.NodeGroup

// Update recomputes every group's readiness from the nodes and the
// provider's cached instances, and returns the actions to take. Per group:
// count its nodes, read its target and instances, classify the instances,
// and check for targets the cloud never created; then forget what is gone.
func (r *Registry) Update(now time.Time, groups []cloudprovider.NodeGroup, nodes []*apiv1.Node, groupOf NodeGroupForNode) Actions {
	act := Actions{Delete: map[string][]string{}, DecreaseTarget: map[string]int{}}
	u := updateState{now: now, prev: r.prevUpdate, act: &act, seen: map[string]bool{}, nodeByID: make(map[string]*apiv1.Node, len(nodes)),
		perGroup: map[string][]*apiv1.Node{}}
	r.prevUpdate = now
	for _, n := range nodes {
		if g := groupOf(n); g != nil {
			u.nodeByID[cloudprovider.ProviderIDKey(n.Spec.ProviderID)] = n
			u.perGroup[g.ID()] = append(u.perGroup[g.ID()], n)
		}
	}
	r.groups = make(map[string]*GroupState, len(groups))
	r.order = r.order[:0]
	r.deleting = map[string]bool{}
	for _, g := range groups {
		gs := &GroupState{ID: g.ID(), Min: g.MinSize(), Max: g.MaxSize(), LastScaleUp: r.lastScaleUp[g.ID()],
			GPU: r.opts.Startup.isGPUGroup(g), MaxWarning: maxWarning(g), InstancesStale: instancesStale(g, now)}
		r.groups[g.ID()] = gs
		r.order = append(r.order, g.ID())
		r.countNodes(&u, gs)
		instances := r.readCloud(gs, g)
		for _, in := range instances {
			u.seen[in.ProviderID] = true
		}
		// Nothing is decided on a group whose cloud view is unknown or
		// stale (CA #3240: a throttled read once led to deleting 197 of 200
		// nodes): its machines are neither counted nor acted on.
		if gs.SizeError == nil {
			provision := g.Options(r.opts.GroupDefaults).MaxNodeProvisionTime
			if provision <= 0 {
				provision = r.opts.MaxNodeProvisionTime
			}
			live := r.classifyInstances(&u, gs, instances, provision)
			r.checkNeverCreated(&u, gs, live, provision)
			gs.Readiness.Upcoming = max(0, gs.Readiness.Target-gs.Readiness.Ready-gs.Readiness.Unready-
				gs.Readiness.LongUnregistered-gs.Readiness.InError-gs.Readiness.PreflightFailed)
			r.lastUpcoming[g.ID()] = gs.Readiness.Upcoming
		}
		gs.Readiness.LastKnownUpcoming = r.lastUpcoming[g.ID()]
		gs.Backoff = r.backoff.Status(g.ID(), now)
	}
	r.forgetGone(u.seen, nodes)
	for id := range r.lastUpcoming {
		if _, ok := r.groups[id]; !ok {
			delete(r.lastUpcoming, id)
		}
	}
	return act
}

// updateState is the working state of one Update.
type updateState struct {
	now, prev time.Time
	act       *Actions
	// seen are the provider IDs of every instance listed.
	seen     map[string]bool
	nodeByID map[string]*apiv1.Node   // managed nodes by ProviderIDKey
	perGroup map[string][]*apiv1.Node // managed nodes by group
}

// appearedAt is the earliest time a machine or target first seen now can
// date from: after the previous update, and not before the group's last
// scale-up. After a restart there is no previous update, and age counts
// from now.
func (r *Registry) appearedAt(u *updateState, group string) time.Time {
	if u.prev.IsZero() {
		return u.now
	}
	t := u.prev
	if su := r.lastScaleUp[group]; su.After(t) && !su.After(u.now) {
		t = su
	}
	return t
}

// countNodes counts a group's registered nodes by stage and tracks their
// preflight outcomes.
func (r *Registry) countNodes(u *updateState, gs *GroupState) {
	rd := &gs.Readiness
	for _, n := range u.perGroup[gs.ID] {
		rd.Registered++
		pf, why := r.opts.Preflight.Classify(n, u.now)
		if pf == preflight.Passed && r.preflightPending[n.Name] != "" {
			delete(r.preflightPending, n.Name)
			u.act.PreflightPassed = append(u.act.PreflightPassed, NodeResult{Group: gs.ID, Node: n})
		}
		switch {
		case pf == preflight.Failed:
			rd.PreflightFailed++
			r.preflightFailure(u.act, gs.ID, n, why, u.now)
		case pf == preflight.Pending:
			rd.Preflight++
			r.preflightPending[n.Name] = gs.ID
		case isReady(n) && r.opts.Startup.Pending(n, gs.GPU) == "":
			rd.Ready++
		case u.now.Sub(n.CreationTimestamp.Time) < r.opts.MaxNodeStartupTime && stillStarting(n):
			rd.NotStarted++
		default:
			rd.Unready++
		}
	}
}

// readCloud reads a group's target size and instances from the provider's
// cache; either failing sets the group's SizeError.
func (r *Registry) readCloud(gs *GroupState, g cloudprovider.NodeGroup) []cloudprovider.Instance {
	rd := &gs.Readiness
	if target, err := g.TargetSize(); err != nil {
		gs.SizeError = err
	} else {
		rd.Target, rd.TargetKnown = target, true
	}
	instances, err := g.Instances()
	if err != nil && gs.SizeError == nil {
		gs.SizeError = cloudprovider.ErrSizeUnknown(g.ID(), fmt.Errorf("listing instances: %w", err))
		rd.TargetKnown = false
	}
	return instances
}

// classifyInstances counts a group's machines as deleting, in error,
// registered, unregistered or long unregistered, lists failed and
// never-registered machines for deletion, and returns the number of live
// (not deleting) machines.
func (r *Registry) classifyInstances(u *updateState, gs *GroupState, instances []cloudprovider.Instance, provision time.Duration) int {
	live := 0
	for _, in := range instances {
		if in.State == cloudprovider.InstanceDeleting {
			gs.Readiness.Deleting++
			r.deleting[cloudprovider.ProviderIDKey(in.ProviderID)] = true
			delete(r.failedRunningCode, in.ProviderID)
			continue
		}
		live++
		r.classifyLive(u, gs, in, provision)
	}
	return live
}

// classifyLive counts a machine not being deleted: failed while it runs,
// in error (listed for deletion), registered, or not registered (listed
// for deletion past the provision time).
func (r *Registry) classifyLive(u *updateState, gs *GroupState, in cloudprovider.Instance, provision time.Duration) {
	id := in.ProviderID
	node := u.nodeByID[cloudprovider.ProviderIDKey(id)]
	r.trackFailedRunning(u, gs, &in, node)
	if in.Error != nil {
		r.instanceError(u, gs, id, in.Error)
		return
	}
	if node != nil {
		delete(r.unregisteredSince, id)
		return
	}
	r.unregistered(u, gs, id, provision)
}

// trackFailedRunning lists a machine failed while it runs, and one that
// recovered from it. A machine failed with no power state that says it
// runs, whose node is registered and Ready, runs (the power state may be
// missing from the instance view): its error is taken as failed while
// running, and cleared from in.
func (r *Registry) trackFailedRunning(u *updateState, gs *GroupState, in *cloudprovider.Instance, node *apiv1.Node) {
	id := in.ProviderID
	failed := in.FailedRunning
	if failed == nil && in.Error != nil && node != nil && isReady(node) {
		// Its pods live on it.
		failed, in.Error = in.Error, nil
	}
	if failed != nil {
		r.failedRunning(u, gs, id, node, *failed)
	} else if code, ok := r.failedRunningCode[id]; ok {
		delete(r.failedRunningCode, id)
		if in.Error == nil {
			u.act.FailedRunningRecovered = append(u.act.FailedRunningRecovered,
				FailedRunning{Group: gs.ID, ProviderID: id, Node: node, Error: cloudprovider.InstanceError{Code: code}})
		}
	}
}

// instanceError counts a machine in error and lists it for deletion: an
// evicted one without a failure, any other as a failed scale-up.
func (r *Registry) instanceError(u *updateState, gs *GroupState, id string, e *cloudprovider.InstanceError) {
	gs.Readiness.InError++
	if e.Class == cloudprovider.ClassEvicted {
		// The cloud took it back (a Spot VM evicted and deallocated):
		// it runs nothing, so it is deleted, and no scale-up failed.
		// The core counts evictions (cloudprovider.EvictionReporter).
		r.deleteOnce(u.act, gs.ID, id, u.now, nil)
		return
	}
	r.deleteOnce(u.act, gs.ID, id, u.now, func() Failure {
		return r.fail(gs.ID, e.Class, errorReason(e.Class),
			fmt.Sprintf("instance %s failed: %s %s", id, e.Code, e.Message), u.now)
	})
}

// unregistered counts a machine with no node: unregistered within the
// provision time, long unregistered after it (listed for deletion as a
// failed scale-up).
func (r *Registry) unregistered(u *updateState, gs *GroupState, id string, provision time.Duration) {
	since, ok := r.unregisteredSince[id]
	if !ok {
		since = r.appearedAt(u, gs.ID)
		r.unregisteredSince[id] = since
	}
	if u.now.Sub(since) <= provision {
		gs.Readiness.Unregistered++
		return
	}
	gs.Readiness.LongUnregistered++
	r.deleteOnce(u.act, gs.ID, id, u.now, func() Failure {
		return r.fail(gs.ID, cloudprovider.ClassOther, "provision-timeout",
			fmt.Sprintf("instance %s did not register as a node within %s", id, provision), u.now)
	})
}

// failedRunning counts and lists a machine the cloud reports failed while
// it runs. Nothing is deleted for it.
func (r *Registry) failedRunning(u *updateState, gs *GroupState, id string, node *apiv1.Node, e cloudprovider.InstanceError) {
	gs.Readiness.FailedRunning++
	isNew := r.failedRunningCode[id] != e.Code
	r.failedRunningCode[id] = e.Code
	u.act.FailedRunning = append(u.act.FailedRunning, FailedRunning{Group: gs.ID, ProviderID: id, Node: node, Error: e, New: isNew})
}

// DefaultLostDeletionAfter is how long, by default (--deletion-lost-after),
// a machine handed out for deletion may still be listed, not deleting,
// before its deletion is taken as lost and asked again: the cloud accepted
// it and its operation failed (the VM runs on). A deletion's operation
// lasts until its VMs are gone, minutes for GPU VMs.
const DefaultLostDeletionAfter = 15 * time.Minute

// lostDeletionAfter is Options.LostDeletionAfter, or its default.
func (o Options) lostDeletionAfter() time.Duration {
	if o.LostDeletionAfter > 0 {
		return o.LostDeletionAfter
	}
	return DefaultLostDeletionAfter
}

// deleteOnce lists a failed machine for deletion: the first time with its
// failure (which backs the group off; nil: none), afterwards only when its
// deletion failed and is to be asked again (RetryDelete), or when it is
// still listed, not deleting, Options.LostDeletionAfter after it was last handed
// out (LostDeletes): before, a deletion accepted and then failed was never
// asked again, and the machine stayed for good.
func (r *Registry) deleteOnce(act *Actions, group, id string, now time.Time, failure func() Failure) {
	at, done := r.handled[id]
	switch {
	case !done:
		r.handled[id] = now
		act.Delete[group] = append(act.Delete[group], id)
		if failure != nil {
			act.Failures = append(act.Failures, failure())
		}
	case r.retry[id]:
		delete(r.retry, id)
		r.handled[id] = now
		act.Delete[group] = append(act.Delete[group], id)
	case now.Sub(at) >= r.opts.lostDeletionAfter():
		r.handled[id] = now
		act.Delete[group] = append(act.Delete[group], id)
		if act.LostDeletes == nil {
			act.LostDeletes = map[string]int{}
		}
		act.LostDeletes[group]++
	}
}

// checkNeverCreated lowers the target by the machines requested and not
// created within the provision time, as a failed scale-up.
func (r *Registry) checkNeverCreated(u *updateState, gs *GroupState, live int, provision time.Duration) {
	rd := &gs.Readiness
	if !rd.TargetKnown {
		return
	}
	rd.NotCreated = max(0, rd.Target-live)
	if rd.NotCreated == 0 {
		delete(r.notCreatedSince, gs.ID)
		return
	}
	since, ok := r.notCreatedSince[gs.ID]
	if !ok {
		since = r.appearedAt(u, gs.ID)
		r.notCreatedSince[gs.ID] = since
	}
	if u.now.Sub(since) > provision {
		u.act.DecreaseTarget[gs.ID] = -rd.NotCreated
		u.act.Failures = append(u.act.Failures, r.fail(gs.ID, cloudprovider.ClassOther, "provision-timeout",
			fmt.Sprintf("%d requested machines were not created within %s", rd.NotCreated, provision), u.now))
		delete(r.notCreatedSince, gs.ID)
	}
}

// forgetGone drops what the registry remembers of machines no longer
// listed and nodes no longer there.
func (r *Registry) forgetGone(seen map[string]bool, nodes []*apiv1.Node) {
	r.forgetMachines(seen)
	r.forgetNodes(nodes)
}

// forgetMachines drops what the registry remembers of machines not
// listed (seen).
func (r *Registry) forgetMachines(seen map[string]bool) {
	for id := range r.unregisteredSince {
		if !seen[id] {
			delete(r.unregisteredSince, id)
		}
	}
	for id := range r.handled {
		if !seen[id] {
			delete(r.handled, id)
			delete(r.retry, id)
		}
	}
	for id := range r.failedRunningCode {
		if !seen[id] {
			delete(r.failedRunningCode, id)
		}
	}
}

// forgetNodes drops the preflight state of nodes no longer there.
func (r *Registry) forgetNodes(nodes []*apiv1.Node) {
	present := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		present[n.Name] = true
	}
	for name := range r.preflightPending {
		if !present[name] {
			delete(r.preflightPending, name)
		}
	}
	for name := range r.preflightFailed {
		if !present[name] {
			delete(r.preflightFailed, name)
		}
	}
}

// preflightFailure lists a failed node for replacement and, the first time
// it is seen failed, counts it toward its group's preflight backoff.
func (r *Registry) preflightFailure(act *Actions, group string, n *apiv1.Node, why string, now time.Time) {
	res := NodeResult{Group: group, Node: n, Reason: why}
	act.PreflightFailed = append(act.PreflightFailed, res)
	delete(r.preflightPending, n.Name)
	if r.preflightFailed[n.Name] {
		return
	}
	r.preflightFailed[n.Name] = true
	act.PreflightNewFailures = append(act.PreflightNewFailures, res)
	limit, window := r.opts.PreflightFailuresBeforeBackoff, r.opts.PreflightFailureWindow
	if _, again := preflight.AgainAt(n, now); limit <= 0 || again {
		// A machine a repair sent through preflight again is a broken
		// machine, not a sign that the group's new machines are bad.
		return
	}
	recent := r.preflightFailures[group][:0]
	for _, t := range r.preflightFailures[group] {
		if now.Sub(t) < window {
			recent = append(recent, t)
		}
	}
	recent = append(recent, now)
	if len(recent) >= limit {
		act.Failures = append(act.Failures, r.fail(group, cloudprovider.ClassOther, "preflight",
			fmt.Sprintf("%d nodes failed preflight within %s (last: node %s: %s)", len(recent), window, n.Name, why), now))
		recent = recent[:0]
	}
	r.preflightFailures[group] = recent
}

func (r *Registry) fail(group string, class cloudprovider.ErrorClass, reason, msg string, now time.Time) Failure {
	r.backoff.Fail(group, class, msg, now)
	return Failure{Group: group, Class: class, Reason: reason, Message: msg}
}

// maxWarning says when a group's configured max is more than its cloud
// lets it hold.
func maxWarning(g cloudprovider.NodeGroup) string {
	sl, ok := g.(cloudprovider.SizeLimited)
	if !ok {
		return ""
	}
	configured, limit, why := sl.SizeLimit()
	if limit <= 0 || configured <= limit {
		return ""
	}
	return fmt.Sprintf("configured max %d is more than the node group can hold (%d: %s); max is %d", configured, limit, why, limit)
}

// instancesStale says how old a group's machines are when the cloud's
// last list of them failed ("" when it did not).
func instancesStale(g cloudprovider.NodeGroup, now time.Time) string {
	ia, ok := g.(cloudprovider.InstancesAged)
	if !ok {
		return ""
	}
	age, why := ia.InstancesAge(now)
	if why == "" {
		return ""
	}
	return fmt.Sprintf("machines as listed %s ago; the last list failed: %s", age.Truncate(time.Second), why)
}

func errorReason(c cloudprovider.ErrorClass) string {
	switch c {
	case cloudprovider.ClassQuota, cloudprovider.ClassOutOfCapacity:
		return c.String()
	default:
		return "instance-error"
	}
}

// isReady: the Ready condition is true and no taint says the node cannot
// take pods yet. Between the kubelet reporting Ready and the node lifecycle
// controller lifting node.kubernetes.io/not-ready, a node is not usable:
// treating it as ready would make the simulation find no room and ask for
// one node too many.
// maxStatusSettingDelay is how long after its creation a node may take to
// report its first Ready condition (CA's MaxStatusSettingDelayAfterCreation).
const maxStatusSettingDelay = 2 * time.Minute

// stillStarting reports whether a node that is not capacity may still be
// coming up, as CA decides it: its Ready condition is True (it waits on a
// startup taint, its GPUs or the not-ready taint's removal), missing, or
// went not-True within maxStatusSettingDelay of the node's creation. A node
// whose Ready condition went False or Unknown later has run and stopped
// (its kubelet stopped renewing its Lease, say): it is unready, never
// coming capacity, however young. Counting such nodes as upcoming would
// leave the pods they cannot take waiting on them.
func stillStarting(n *apiv1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type != apiv1.NodeReady {
			continue
		}
		if c.Status == apiv1.ConditionTrue {
			return true
		}
		return c.LastTransitionTime.Sub(n.CreationTimestamp.Time) < maxStatusSettingDelay
	}
	return true
}

func isReady(n *apiv1.Node) bool {
	for _, t := range n.Spec.Taints {
		switch t.Key {
		case apiv1.TaintNodeNotReady, apiv1.TaintNodeUnreachable, "node.cloudprovider.kubernetes.io/uninitialized":
			return false
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == apiv1.NodeReady {
			return c.Status == apiv1.ConditionTrue
		}
	}
	return false
}

// IsReady reports whether a node is ready to take pods: Ready condition
// true, and no not-ready, unreachable or uninitialized taint.
func IsReady(n *apiv1.Node) bool { return isReady(n) }

// StartingUp says why a Ready node is not capacity yet (a startup taint,
// GPUs not advertised), or "". group is the node's group ID, "" for an
// unmanaged node.
func (r *Registry) StartingUp(n *apiv1.Node, group string) string {
	gpu := false
	if gs := r.groups[group]; gs != nil {
		gpu = gs.GPU
	}
	return r.opts.Startup.Pending(n, gpu)
}

// RetryDelete asks for the given machines to be deleted again at the next
// Update (their deletion failed), without counting a new failure.
func (r *Registry) RetryDelete(providerIDs []string) {
	for _, id := range providerIDs {
		r.retry[id] = true
	}
}

// RegisterScaleUp records a successful IncreaseSize: the group's target and
// upcoming count grow at once, so the same pods are not planned twice
// before the next Update.
func (r *Registry) RegisterScaleUp(group string, delta int, now time.Time) {
	r.lastScaleUp[group] = now
	if gs := r.groups[group]; gs != nil {
		gs.LastScaleUp = now
		gs.Readiness.Target += delta
		gs.Readiness.Upcoming += delta
		gs.Readiness.NotCreated += delta
		gs.Readiness.LastKnownUpcoming += delta
	}
	r.lastUpcoming[group] += delta
}

// BackoffRecords are the groups' backoffs, for the safety state.
func (r *Registry) BackoffRecords(now time.Time) []BackoffRecord { return r.backoff.Records(now) }

// RestoreBackoffs takes an earlier leader's backoffs.
func (r *Registry) RestoreBackoffs(now time.Time, rs []BackoffRecord) { r.backoff.Restore(now, rs) }

// RegisterFailedScaleUp backs a group off after IncreaseSize failed.
func (r *Registry) RegisterFailedScaleUp(group string, class cloudprovider.ErrorClass, msg string, now time.Time) {
	r.backoff.Fail(group, class, msg, now)
	if gs := r.groups[group]; gs != nil {
		gs.Backoff = r.backoff.Status(group, now)
	}
}

// Deleting says whether the last Update saw the machine deleting: its
// deletion runs, and is not lost (however long it takes).
func (r *Registry) Deleting(providerID string) bool {
	return r.deleting[cloudprovider.ProviderIDKey(providerID)]
}

// Group returns a group's state, or nil.
func (r *Registry) Group(id string) *GroupState { return r.groups[id] }

// Groups returns every group's state, in provider order.
func (r *Registry) Groups() []*GroupState {
	out := make([]*GroupState, 0, len(r.order))
	for _, id := range r.order {
		out = append(out, r.groups[id])
	}
	return out
}
