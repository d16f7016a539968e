package core

import (
	"context"
	"fmt"
	"sort"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// HealthSource gives the API server's health as the autoscaler saw it
// since the last call (ratelimit.Observer).
type HealthSource interface {
	Take() ratelimit.Signals
}

// nodeAddition is the smoothing stage between the planner and the cloud:
// the planner states demand, the ratelimit queue decides what is released
// now, and only what is released is requested from the cloud. It holds no
// demand between loops: demand is restated from the pending pods every
// loop, so vanished demand is cancelled and a restart loses nothing.
type nodeAddition struct {
	enabled  bool
	queue    *ratelimit.Queue
	adaptive *ratelimit.Adaptive // nil: fixed rate
	// adaptiveOpts are the bounds adaptive was built with, baseRate the
	// configured rate.
	adaptiveOpts ratelimit.AdaptiveOptions
	baseRate     float64
	health       HealthSource
	// lastQueued is the previous loop's queue, to count cancellations.
	lastQueued map[string]map[ratelimit.Class]int
	reason     string
}

func newNodeAddition(o Options, health HealthSource) (*nodeAddition, error) {
	na := &nodeAddition{enabled: o.NodeAdditionSmoothing, health: health, reason: ratelimit.ReasonConfigured, baseRate: o.NodeAdditionRate}
	q, err := ratelimit.New(o.queueOptions())
	if err != nil {
		return nil, err
	}
	na.queue = q
	if o.NodeAdditionAdaptive {
		ad, err := ratelimit.NewAdaptive(o.NodeAdditionRate, o.NodeAdditionAdaptiveOptions)
		if err != nil {
			return nil, err
		}
		na.adaptive, na.adaptiveOpts = ad, o.NodeAdditionAdaptiveOptions
	}
	return na, nil
}

// additionReport is what the loop tells the status and the pods.
type additionReport struct {
	InFlight int
	Limit    string
	Released map[string]map[ratelimit.Class]int
	Queued   map[string]map[ratelimit.Class]int
}

// addNodes sends the plan through the queue and requests what it releases.
// A group the cloud refuses (quota, capacity) is backed off by the
// increaser; its pods are planned again at once on the other groups, up to
// once per group.
func (a *Autoscaler) addNodes(ctx context.Context, l *loop, res scaleup.Result, cands []scaleup.Candidate, maxNew int) scaleup.Result {
	inFlight := 0
	for _, g := range l.groups {
		if gs := a.registry.Group(g.ID()); gs != nil && gs.Readiness.TargetKnown {
			inFlight += gs.Readiness.Upcoming
		}
	}
	rep := additionReport{InFlight: inFlight, Released: map[string]map[ratelimit.Class]int{}, Queued: map[string]map[ratelimit.Class]int{}}
	out := scaleup.Result{Fork: res.Fork, NoScale: res.NoScale}
	inc := increaser{a: a, l: l}
	for round := 0; ; round++ {
		dec := a.decide(l.now, res.ScaleUps, rep.InFlight)
		if rep.Limit == "" {
			rep.Limit = dec.Limit
		}
		var retry []*apiv1.Pod
		failed := map[string]bool{}
		// One request per group, for all its released nodes, whatever
		// their class; each scale-up then gets its class's share.
		var order []string
		byGroup := map[string][]scaleup.ScaleUp{}
		for _, su := range res.ScaleUps {
			if byGroup[su.Group] == nil {
				order = append(order, su.Group)
			}
			byGroup[su.Group] = append(byGroup[su.Group], su)
		}
		for _, g := range order {
			n := dec.Release[g]
			if n > 0 {
				if err := inc.IncreaseSize(ctx, g, n); err != nil {
					a.nodeAdd.queue.Refund(n)
					var pods []*apiv1.Pod
					for _, su := range byGroup[g] {
						pods = append(pods, su.Pods...)
					}
					out.Failed = append(out.Failed, scaleup.Failed{Group: g, Delta: n, Err: err, Pods: pods})
					if c := cloudprovider.ClassOf(err); c != cloudprovider.ClassThrottled && c != cloudprovider.ClassConflict {
						failed[g] = true
						for _, su := range byGroup[g] {
							// A gang is planned again whole by the next loop,
							// with this group backed off.
							if su.Gang == "" {
								retry = append(retry, su.Pods...)
							}
						}
					}
					continue
				}
				rep.InFlight += n
			}
			for _, su := range byGroup[g] {
				class := classOf(su)
				r := 0
				if byClass := dec.ReleaseClass[g]; byClass != nil && n > 0 {
					r = byClass[class]
					byClass[class] = 0
				}
				if r > 0 {
					if rep.Released[g] == nil {
						rep.Released[g] = map[ratelimit.Class]int{}
					}
					rep.Released[g][class] += r
					a.metrics.NodesReleased.WithLabelValues(g, class.String()).Add(float64(r))
				}
				out.ScaleUps = append(out.ScaleUps, scaleup.ScaleUp{Group: g, Delta: r, Pods: su.Pods, Queued: su.Delta - r, Balloon: su.Balloon, Gang: su.Gang})
			}
		}
		for g, byClass := range dec.Queued {
			if failed[g] {
				continue
			}
			for c, n := range byClass {
				if rep.Queued[g] == nil {
					rep.Queued[g] = map[ratelimit.Class]int{}
				}
				rep.Queued[g][c] += n
			}
		}
		if len(retry) == 0 || round >= len(cands) {
			break
		}
		// Plan the refused group's pods again on the groups left.
		for i := range cands {
			if failed[cands[i].Group] {
				cands[i].Skip = "scale-up failed in this loop"
			}
		}
		left := maxNew
		for _, m := range []map[string]map[ratelimit.Class]int{rep.Released, rep.Queued} {
			for _, byClass := range m {
				for _, n := range byClass {
					left -= n
				}
			}
		}
		var wl, bl []*apiv1.Pod
		for _, p := range retry {
			if a.opts.isBalloon(p) {
				bl = append(bl, p)
			} else {
				wl = append(wl, p)
			}
		}
		next := a.planner.Plan(ctx, res.Fork, pendingOf(simulator.GroupPods(wl, a.opts.GPUResourceName)), cands, left, planOnly{})
		if len(bl) > 0 {
			b := a.planner.Plan(ctx, next.Fork, pendingOf(simulator.GroupPods(bl, a.opts.GPUResourceName)), cands, left-planned(next), planOnly{})
			markBalloon(b.ScaleUps)
			next.ScaleUps = append(next.ScaleUps, b.ScaleUps...)
			next.NoScale = append(next.NoScale, b.NoScale...)
			next.Fork = b.Fork
		}
		res = next
		out.Fork = res.Fork
		out.NoScale = append(out.NoScale, res.NoScale...)
	}
	a.reportQueue(ctx, l, rep)
	l.addition = rep
	return out
}

func pendingOf(groups []*simulator.Group) []scaleup.Pending {
	out := make([]scaleup.Pending, 0, len(groups))
	for _, g := range groups {
		out = append(out, scaleup.Pending{G: g})
	}
	return out
}

// planned is the number of nodes a plan asks for.
func planned(r scaleup.Result) int {
	n := 0
	for _, su := range r.ScaleUps {
		n += su.Delta
	}
	return n
}

func markBalloon(sus []scaleup.ScaleUp) {
	for i := range sus {
		sus[i].Balloon = true
	}
}

func classOf(su scaleup.ScaleUp) ratelimit.Class {
	if su.Balloon {
		return ratelimit.Balloon
	}
	return ratelimit.Workload
}

// decide asks the queue, or releases everything when smoothing is off.
func (a *Autoscaler) decide(now time.Time, sus []scaleup.ScaleUp, inFlight int) ratelimit.Decision {
	demands := make([]ratelimit.Demand, 0, len(sus))
	for _, su := range sus {
		demands = append(demands, ratelimit.Demand{Group: su.Group, Count: su.Delta, Class: classOf(su), Since: oldest(su.Pods), Gang: su.Gang})
	}
	if !a.nodeAdd.enabled {
		d := ratelimit.Decision{Release: map[string]int{}, ReleaseClass: map[string]map[ratelimit.Class]int{}, Queued: map[string]map[ratelimit.Class]int{}}
		for _, x := range demands {
			d.Release[x.Group] += x.Count
			if d.ReleaseClass[x.Group] == nil {
				d.ReleaseClass[x.Group] = map[ratelimit.Class]int{}
			}
			d.ReleaseClass[x.Group][x.Class] += x.Count
		}
		return d
	}
	return a.nodeAdd.queue.Decide(now, demands, inFlight)
}

func oldest(pods []*apiv1.Pod) time.Time {
	var t time.Time
	for _, p := range pods {
		if c := p.CreationTimestamp.Time; t.IsZero() || c.Before(t) {
			t = c
		}
	}
	return t
}

// reportQueue updates the queue's metrics, counts cancelled demand and lets
// the adaptive controller move the rate.
func (a *Autoscaler) reportQueue(ctx context.Context, l *loop, rep additionReport) {
	na := a.nodeAdd
	m := a.metrics
	m.NodesInFlight.Set(float64(rep.InFlight))
	m.QueueDepth.Reset()
	for g, byClass := range rep.Queued {
		for c, n := range byClass {
			m.QueueDepth.WithLabelValues(g, c.String()).Set(float64(n))
		}
	}
	// Demand queued last loop and neither released nor queued now was
	// cancelled: its pods were deleted, scheduled elsewhere, or fit now.
	for g, byClass := range na.lastQueued {
		for c, n := range byClass {
			still := rep.Queued[g][c] + rep.Released[g][c]
			if gone := n - still; gone > 0 {
				m.NodesCancelled.WithLabelValues(g, c.String()).Add(float64(gone))
				klog.FromContext(ctx).V(2).Info("Queued node demand cancelled", "nodeGroup", g, "class", c.String(), "nodes", gone)
			}
		}
	}
	na.lastQueued = rep.Queued
	if na.enabled && na.adaptive != nil {
		take := func() ratelimit.Signals {
			if na.health == nil {
				return ratelimit.Signals{}
			}
			return na.health.Take()
		}
		if c, ok := na.adaptive.Update(l.now, rep.Limit == "rate", take); ok {
			if c.To != c.From {
				o := na.queue.Options()
				o.NodesPerMinute = c.To
				if err := na.queue.SetOptions(o); err != nil {
					klog.FromContext(ctx).Error(err, "Setting the adaptive node-addition rate")
				}
				m.RateChanges.WithLabelValues(c.Reason).Inc()
				klog.FromContext(ctx).Info("Node-addition rate changed", "from", c.From, "to", c.To, "reason", c.Reason,
					"requests", c.Signals.Requests, "slow", c.Signals.Slow, "throttled", c.Signals.Throttled,
					"serverErrors", c.Signals.ServerErrors, "flowControlRejected", c.Signals.Rejected, "flowControlKnown", c.Signals.RejectedKnown)
			}
			na.reason = c.Reason
		}
	}
	rate := na.queue.Options().NodesPerMinute
	m.AdditionRate.Set(rate)
	m.AdditionTokens.Set(na.queue.Tokens())
	for _, r := range ratelimit.Reasons() {
		v := 0.0
		if r == na.reason {
			v = 1
		}
		m.AdditionRateReason.WithLabelValues(r).Set(v)
	}
}

// queueStatus is the queue in the status ConfigMap.
func (a *Autoscaler) queueStatus(rep additionReport) NodeAdditionStatus {
	o := a.nodeAdd.queue.Options()
	st := NodeAdditionStatus{Smoothing: a.nodeAdd.enabled, RateNodesPerMinute: o.NodesPerMinute, RateReason: a.nodeAdd.reason,
		Burst: o.Burst, MaxInFlight: o.MaxInFlight, InFlight: rep.InFlight, HeldBy: rep.Limit}
	for g, byClass := range rep.Queued {
		for c, n := range byClass {
			st.Queued = append(st.Queued, QueuedNodes{NodeGroup: g, Class: c.String(), Nodes: n})
		}
	}
	sort.Slice(st.Queued, func(i, j int) bool {
		if st.Queued[i].NodeGroup != st.Queued[j].NodeGroup {
			return st.Queued[i].NodeGroup < st.Queued[j].NodeGroup
		}
		return st.Queued[i].Class < st.Queued[j].Class
	})
	return st
}

// planOnly accepts every scale-up: the planner's output is demand for the
// queue, not a cloud request.
type planOnly struct{}

func (planOnly) IncreaseSize(context.Context, string, int) error { return nil }

// queueOptions are the queue's bounds from the options.
func (o Options) queueOptions() ratelimit.Options {
	return ratelimit.Options{NodesPerMinute: o.NodeAdditionRate, Burst: o.NodeAdditionBurst, MaxInFlight: o.MaxNodesInFlight}
}

// queuedMessage is the event of a pod whose nodes wait in the queue. It
// names no counts, so it does not change from loop to loop.
func queuedMessage(group, limit string) string {
	why := "the node-addition rate"
	if limit == "in-flight" {
		why = "the cap on nodes in flight"
	}
	return fmt.Sprintf("pod is waiting for nodes of group %s, added gradually under %s to protect the API server", group, why)
}
