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
}

// Readiness counts a group's machines by stage.
type Readiness struct {
	// Target is the size the cloud was asked for; valid when TargetKnown.
	Target      int
	TargetKnown bool
	// Registered nodes have a Node object; Ready, Unready and NotStarted split them.
	Registered, Ready, Unready, NotStarted int
	// Unregistered machines exist in the cloud without a Node object, within
	// the provision time; LongUnregistered ones are past it.
	Unregistered, LongUnregistered int
	// InError machines are ones the cloud reported as failed.
	InError int
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
}

// GroupState is one group as of the last Update.
type GroupState struct {
	ID          string
	Min, Max    int
	Readiness   Readiness
	SizeError   error
	Backoff     BackoffStatus
	LastScaleUp time.Time
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
	opts              Options
	backoff           *Backoff
	groups            map[string]*GroupState
	order             []string
	unregisteredSince map[string]time.Time
	notCreatedSince   map[string]time.Time
	// handled machines were already counted as failures; retry holds the
	// ones whose deletion must be asked again without a new failure.
	handled     map[string]bool
	retry       map[string]bool
	lastScaleUp map[string]time.Time
	// preflightPending are nodes seen pending (name → group);
	// preflightFailed nodes already counted as failures; preflightFailures
	// the recent failure times per group, for the backoff.
	preflightPending  map[string]string
	preflightFailed   map[string]bool
	preflightFailures map[string][]time.Time
	// prevUpdate is the time of the previous Update: a machine or a target
	// first seen now appeared after it.
	prevUpdate time.Time
}

// NewRegistry returns an empty registry.
func NewRegistry(opts Options) *Registry {
	return &Registry{
		opts:              opts,
		backoff:           NewBackoff(opts.Backoff),
		groups:            map[string]*GroupState{},
		unregisteredSince: map[string]time.Time{},
		notCreatedSince:   map[string]time.Time{},
		handled:           map[string]bool{},
		retry:             map[string]bool{},
		lastScaleUp:       map[string]time.Time{},
		preflightPending:  map[string]string{},
		preflightFailed:   map[string]bool{},
		preflightFailures: map[string][]time.Time{},
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
// provider's cached instances, and returns the actions to take.
func (r *Registry) Update(now time.Time, groups []cloudprovider.NodeGroup, nodes []*apiv1.Node, groupOf NodeGroupForNode) Actions {
	act := Actions{Delete: map[string][]string{}, DecreaseTarget: map[string]int{}}
	nodeByID := make(map[string]*apiv1.Node, len(nodes))
	perGroup := map[string][]*apiv1.Node{}
	for _, n := range nodes {
		g := groupOf(n)
		if g == nil {
			continue
		}
		nodeByID[n.Spec.ProviderID] = n
		perGroup[g.ID()] = append(perGroup[g.ID()], n)
	}
	seen := map[string]bool{}
	prev := r.prevUpdate
	r.prevUpdate = now
	// appearedAt is the earliest time a machine or target first seen now
	// can date from: after the previous update, and not before the group's
	// last scale-up. After a restart there is no previous update, and age
	// counts from now.
	appearedAt := func(group string) time.Time {
		if prev.IsZero() {
			return now
		}
		t := prev
		if su := r.lastScaleUp[group]; su.After(t) && !su.After(now) {
			t = su
		}
		return t
	}
	r.groups = make(map[string]*GroupState, len(groups))
	r.order = r.order[:0]
	for _, g := range groups {
		gs := &GroupState{ID: g.ID(), Min: g.MinSize(), Max: g.MaxSize(), LastScaleUp: r.lastScaleUp[g.ID()]}
		r.groups[g.ID()] = gs
		r.order = append(r.order, g.ID())
		opts := g.Options(r.opts.GroupDefaults)
		provision := opts.MaxNodeProvisionTime
		if provision <= 0 {
			provision = r.opts.MaxNodeProvisionTime
		}
		rd := &gs.Readiness
		for _, n := range perGroup[g.ID()] {
			rd.Registered++
			pf, why := r.opts.Preflight.Classify(n, now)
			if pf == preflight.Passed && r.preflightPending[n.Name] != "" {
				delete(r.preflightPending, n.Name)
				act.PreflightPassed = append(act.PreflightPassed, NodeResult{Group: g.ID(), Node: n})
			}
			switch {
			case pf == preflight.Failed:
				rd.PreflightFailed++
				r.preflightFailure(&act, g.ID(), n, why, now)
			case pf == preflight.Pending:
				rd.Preflight++
				r.preflightPending[n.Name] = g.ID()
			case isReady(n):
				rd.Ready++
			case now.Sub(n.CreationTimestamp.Time) < r.opts.MaxNodeStartupTime:
				rd.NotStarted++
			default:
				rd.Unready++
			}
		}
		target, err := g.TargetSize()
		if err != nil {
			gs.SizeError = err
		} else {
			rd.Target, rd.TargetKnown = target, true
		}
		instances, ierr := g.Instances()
		if ierr != nil && gs.SizeError == nil {
			gs.SizeError = cloudprovider.ErrSizeUnknown(g.ID(), fmt.Errorf("listing instances: %w", ierr))
			rd.TargetKnown = false
		}
		if gs.SizeError != nil {
			// Nothing is decided on a group whose cloud view is unknown or
			// stale (CA #3240: a throttled read once led to deleting 197 of
			// 200 nodes): its machines are neither counted nor acted on.
			for _, in := range instances {
				seen[in.ProviderID] = true
			}
			gs.Backoff = r.backoff.Status(g.ID(), now)
			continue
		}
		live := 0
		for _, in := range instances {
			id := in.ProviderID
			seen[id] = true
			if in.State == cloudprovider.InstanceDeleting {
				rd.Deleting++
				continue
			}
			live++
			if in.Error != nil {
				rd.InError++
				switch {
				case !r.handled[id]:
					r.handled[id] = true
					act.Delete[g.ID()] = append(act.Delete[g.ID()], id)
					act.Failures = append(act.Failures, r.fail(g.ID(), in.Error.Class, errorReason(in.Error.Class),
						fmt.Sprintf("instance %s failed: %s %s", id, in.Error.Code, in.Error.Message), now))
				case r.retry[id]:
					delete(r.retry, id)
					act.Delete[g.ID()] = append(act.Delete[g.ID()], id)
				}
				continue
			}
			if _, ok := nodeByID[id]; ok {
				delete(r.unregisteredSince, id)
				continue
			}
			since, ok := r.unregisteredSince[id]
			if !ok {
				since = appearedAt(g.ID())
				r.unregisteredSince[id] = since
			}
			if now.Sub(since) <= provision {
				rd.Unregistered++
				continue
			}
			rd.LongUnregistered++
			switch {
			case !r.handled[id]:
				r.handled[id] = true
				act.Delete[g.ID()] = append(act.Delete[g.ID()], id)
				act.Failures = append(act.Failures, r.fail(g.ID(), cloudprovider.ClassOther, "provision-timeout",
					fmt.Sprintf("instance %s did not register as a node within %s", id, provision), now))
			case r.retry[id]:
				delete(r.retry, id)
				act.Delete[g.ID()] = append(act.Delete[g.ID()], id)
			}
		}
		if rd.TargetKnown {
			rd.NotCreated = rd.Target - live
			if rd.NotCreated < 0 {
				rd.NotCreated = 0
			}
			if rd.NotCreated > 0 {
				since, ok := r.notCreatedSince[g.ID()]
				if !ok {
					since = appearedAt(g.ID())
					r.notCreatedSince[g.ID()] = since
				}
				if now.Sub(since) > provision {
					act.DecreaseTarget[g.ID()] = -rd.NotCreated
					act.Failures = append(act.Failures, r.fail(g.ID(), cloudprovider.ClassOther, "provision-timeout",
						fmt.Sprintf("%d requested machines were not created within %s", rd.NotCreated, provision), now))
					delete(r.notCreatedSince, g.ID())
				}
			} else {
				delete(r.notCreatedSince, g.ID())
			}
			rd.Upcoming = rd.Target - rd.Ready - rd.Unready - rd.LongUnregistered - rd.InError - rd.PreflightFailed
			if rd.Upcoming < 0 {
				rd.Upcoming = 0
			}
		}
		gs.Backoff = r.backoff.Status(g.ID(), now)
	}
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
	return act
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
	if limit <= 0 {
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
	}
}

// RegisterFailedScaleUp backs a group off after IncreaseSize failed.
func (r *Registry) RegisterFailedScaleUp(group string, class cloudprovider.ErrorClass, msg string, now time.Time) {
	r.backoff.Fail(group, class, msg, now)
	if gs := r.groups[group]; gs != nil {
		gs.Backoff = r.backoff.Status(group, now)
	}
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
