package core

import (
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/trigger"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// Loops woken by events (package trigger): the informers' handlers below
// and the loop's own failures call Wake; Run's driver decides when the
// next loop starts.

// Wake asks for a loop soon for reason r (see package trigger: after the
// minimum gap; pods after their batching window). It never blocks and may
// be called from any goroutine. A node turning usable wakes a loop only
// when the last loop left nodes queued: otherwise the queue has nothing to
// release and the periodic loop is soon enough; and that loop is a
// follow-up (followUp).
func (a *Autoscaler) Wake(r trigger.Reason) {
	if r == trigger.NodeReady {
		if a.additionQueued.Load() {
			a.driver.WakeAfter(r, a.followUp())
		}
		return
	}
	a.driver.Wake(r)
}

// The follow-up pace (--node-group-write-interval, 5 s by default) is
// the least time between a loop that asked the cloud for nodes and a
// follow-up loop: one woken by a node turning usable, the node-addition
// bucket refilling, or the scheduler's new verdict on a pod a loop left to
// coming nodes. Each follow-up that releases nodes is a scale-set write
// per group it releases to, charged to the scale set's Update policy
// (12 writes refilled 4 a minute per scale set, beside the
// subscription's 1,500: "Compute throttling limits"): at a loop a second, a cap
// freeing nodes one by one sent 91 writes a minute (the 2,000-node scale
// run, 140 of them refused with 429). It is read by the informers'
// handlers, hence atomic (writeGap), set at each loop's start.

// followUp is how long a follow-up loop waits: what is left of the pace
// since the last loop that asked for nodes.
func (a *Autoscaler) followUp() time.Duration {
	last := a.lastRelease.Load()
	if last == 0 {
		return 0
	}
	return max(0, time.Unix(0, last).Add(time.Duration(a.writeGap.Load())).Sub(a.clock.Now()))
}

// remarked is how long a loop for a pod the scheduler marked
// unschedulable again waits: a follow-up, and at least the pace after
// the last loop's start. While pods wait for coming nodes the scheduler
// re-marks every pending pod on each join (its verdict names the node
// count), those no node can help included: at most a loop per pace for
// all of them.
func (a *Autoscaler) remarked() time.Duration {
	since := a.followUp()
	if last := a.lastStart.Load(); last != 0 {
		since = max(since, time.Unix(0, last).Add(time.Duration(a.writeGap.Load())).Sub(a.clock.Now()))
	}
	return since
}

// triggerTiming is the driver's view of the options in force. Called on
// the loop's goroutine only (the driver runs the loop on its own), where
// a.opts is read without the lock.
func (a *Autoscaler) triggerTiming() trigger.Timing {
	o := a.opts
	return trigger.Timing{Interval: o.ScanInterval, Events: o.FrequentLoops, MinGap: o.MinLoopInterval,
		BatchIdle: o.PodBatchIdleDuration, BatchMax: o.PodBatchMaxDuration}
}

// nodeRules are what the node handler needs of the options: swapped whole
// on a reload, read with one atomic load per event.
type nodeRules struct {
	preflight preflight.Options
	startup   clusterstate.StartupOptions
}

func (o Options) nodeRules() *nodeRules {
	return &nodeRules{preflight: o.Preflight, startup: o.startupOptions()}
}

// usable is the loop's rule for a node that can take pods (Autoscaler.usable):
// ready (Ready condition, no not-ready, unreachable or uninitialized
// taint), past preflight, no startup taint, GPUs advertised when its GPU
// label says it has some. The node's group is not looked up here: a node
// of a GPU group without the label counts as usable once the rest holds,
// and again when its GPUs appear (turnedUsable).
func (r *nodeRules) usable(n *apiv1.Node) bool {
	if !clusterstate.IsReady(n) {
		return false
	}
	// The time tells only a pending node from a timed-out one, neither
	// of which has passed.
	if st, _ := r.preflight.Classify(n, time.Time{}); st != preflight.Passed {
		return false
	}
	return r.startup.Pending(n, false) == ""
}

func (r *nodeRules) hasGPUs(n *apiv1.Node) bool {
	if r.startup.GPUResource == "" {
		return false
	}
	q, ok := n.Status.Allocatable[r.startup.GPUResource]
	return ok && !q.IsZero()
}

// turnedUsable says n is usable and old (nil: none) was not, or n's GPUs
// just appeared.
func (r *nodeRules) turnedUsable(old, n *apiv1.Node) bool {
	if !r.usable(n) {
		return false
	}
	return old == nil || !r.usable(old) || (!r.hasGPUs(old) && r.hasGPUs(n))
}

// turnedUnschedulable says p is unbound and marked unschedulable by the
// scheduler, and old (nil: none) was not.
func turnedUnschedulable(old, p *apiv1.Pod) bool {
	if p.Spec.NodeName != "" || p.DeletionTimestamp != nil || !isUnschedulable(p) {
		return false
	}
	return old == nil || !isUnschedulable(old)
}

// markedAgain says p and old are both unbound and unschedulable and the
// scheduler wrote its verdict again with another message: it tried p
// against a changed cluster ("0/33 nodes are available: ...") and p still
// fits nowhere.
func markedAgain(old, p *apiv1.Pod) bool {
	if p.Spec.NodeName != "" || p.DeletionTimestamp != nil || !isUnschedulable(p) || old == nil || !isUnschedulable(old) {
		return false
	}
	oc, nc := scheduledCondition(old), scheduledCondition(p)
	return oc.Message != nc.Message || !oc.LastTransitionTime.Equal(&nc.LastTransitionTime)
}

func scheduledCondition(p *apiv1.Pod) *apiv1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == apiv1.PodScheduled {
			return &p.Status.Conditions[i]
		}
	}
	return &apiv1.PodCondition{}
}

// PodHandler is the pod informer's handler: a pod the scheduler just
// marked unschedulable wakes a loop (after the batching window), and so
// does a pod it marked so again while the last loop left pending pods to
// usable or coming nodes: that loop's bet that the scheduler would place
// them failed for this one (it came up short by a node, or raced a
// binding), and the periodic loop is up to a scan interval away; such a
// loop comes at least the follow-up pace after the last (remarked). O(1) per
// event, never blocks, logs nothing; the initial list is skipped (the
// first loop sees it).
func (a *Autoscaler) PodHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if p, ok := obj.(*apiv1.Pod); ok && !initial && turnedUnschedulable(nil, p) {
				a.Wake(trigger.Pods)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*apiv1.Pod)
			p, ok2 := obj.(*apiv1.Pod)
			if !ok1 || !ok2 {
				return
			}
			switch {
			case turnedUnschedulable(old, p):
				a.Wake(trigger.Pods)
			case a.expecting.Load() && markedAgain(old, p):
				a.driver.WakeAfter(trigger.Pods, a.remarked())
			}
		},
	}
}

// NodeHandler is the node informer's handler: a node turning usable wakes
// a loop (when nodes wait in the queue). O(1) per event, never blocks,
// logs nothing; the initial list is skipped.
func (a *Autoscaler) NodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if n, ok := obj.(*apiv1.Node); ok && !initial && a.nodeRules.Load().turnedUsable(nil, n) {
				a.Wake(trigger.NodeReady)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*apiv1.Node)
			n, ok2 := obj.(*apiv1.Node)
			if ok1 && ok2 && a.nodeRules.Load().turnedUsable(old, n) {
				a.Wake(trigger.NodeReady)
			}
		},
	}
}

// releasedNodes counts the nodes the queue released in a loop.
func releasedNodes(r additionReport) int { return nodeCount(r.Released) }

// queuedNodes counts the nodes the queue held back in a loop.
func queuedNodes(r additionReport) int { return nodeCount(r.Queued) }

func nodeCount(byGroup map[string]map[ratelimit.Class]int) int {
	n := 0
	for _, byClass := range byGroup {
		for _, c := range byClass {
			n += c
		}
	}
	return n
}
