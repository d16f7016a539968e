package core

import (
	"context"
	"fmt"
	"sort"
	"time"

	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// APIServerSignals gives the API server's latency and errors as the
// autoscaler's own requests saw them since the last call
// (ratelimit.Observer): the adaptive node-addition rate's input, not the
// nodes' health nor /healthz.
type APIServerSignals interface {
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
	apiServer    APIServerSignals
	// lastQueued is the previous loop's queue, to count cancellations.
	lastQueued map[string]map[ratelimit.Class]int
	reason     string
	// lastRelease is, per group, when the queue last released nodes to
	// it (decidePaced).
	lastRelease map[string]time.Time
	// gap is --node-group-write-interval: single-node demand of a group
	// released to less than gap ago waits (decidePaced); 0 paces nothing.
	gap time.Duration
	// pacedUntil is when the first pace that held demand back in the
	// decisions at pacedAt ends (zero: none held).
	pacedAt, pacedUntil time.Time
	// seeded: the queue was told the nodes that joined in the minute
	// before this leader's first loop (ratelimit.Queue.Seed).
	seeded bool
	// writing is, this loop, the groups whose previous capacity write
	// still runs (scaleUpRunner): their single-node demand waits.
	writing map[string]bool
}

// scaleUpRunner is a node group that says whether its previous capacity
// write still runs, so that a scale-up sent now would be refused unsent
// (the vmss provider: one capacity write in flight per scale set).
type scaleUpRunner interface {
	ScaleUpInFlight() bool
}

// writingGroups are the groups whose previous capacity write still runs.
func writingGroups(groups []cloudprovider.NodeGroup) map[string]bool {
	var out map[string]bool
	for _, g := range groups {
		if r, ok := g.(scaleUpRunner); ok && r.ScaleUpInFlight() {
			if out == nil {
				out = map[string]bool{}
			}
			out[g.ID()] = true
		}
	}
	return out
}

// paceWait is how long until a group whose demand the last loop's
// decisions held for the pace may be released to again: measured from
// that group's last release, refused writes included (a write the cloud
// throttled paces its group like one it took).
func (na *nodeAddition) paceWait(now time.Time) time.Duration {
	if na.pacedUntil.IsZero() {
		return 0
	}
	return max(0, na.pacedUntil.Sub(now))
}

func newNodeAddition(o Options, apiServer APIServerSignals) (*nodeAddition, error) {
	na := &nodeAddition{enabled: o.NodeAdditionSmoothing, apiServer: apiServer, reason: ratelimit.ReasonConfigured, baseRate: o.NodeAdditionRate, gap: o.NodeGroupWriteInterval}
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

// refillWait is how long until the queue's bucket holds held nodes, or a
// write's worth (ratelimit.Queue.Chunk) when that is fewer.
func (na *nodeAddition) refillWait(held int) time.Duration {
	return na.queue.RefillTime(min(held, na.queue.Chunk()))
}

// additionReport is what the loop tells the status and the pods.
type additionReport struct {
	InFlight  int
	Limit     ratelimit.Limit
	HeldGangs map[string]ratelimit.HeldGang
	Released  map[string]map[ratelimit.Class]int
	Queued    map[string]map[ratelimit.Class]int
}

// Decide asks the queue what to release now, or releases everything when
// smoothing is off (scaleup.Queue).
func (na *nodeAddition) Decide(now time.Time, demands []ratelimit.Demand, inFlight int) ratelimit.Decision {
	if na.enabled {
		return na.decidePaced(now, demands, inFlight)
	}
	d := ratelimit.Decision{ReleaseClass: map[string]map[ratelimit.Class]int{}, Queued: map[string]map[ratelimit.Class]int{}}
	for _, x := range demands {
		if x.Count <= 0 {
			continue
		}
		if d.ReleaseClass[x.Group] == nil {
			d.ReleaseClass[x.Group] = map[ratelimit.Class]int{}
		}
		d.ReleaseClass[x.Group][x.Class] += x.Count
	}
	return d
}

// decidePaced is the queue's decision, with single-node demand for a
// group released to less than --node-group-write-interval ago (in an
// earlier loop) held back whole, as queued with the limit LimitPaced,
// and for a group whose previous capacity write still runs held with
// LimitWriting: the cloud would refuse it unsent, and the tokens and room
// it took would wait for the operation's end (minutes for GPU VMs) while
// groups that can take a write now go without. Each release is a
// scale-set write, and a loop a second releasing the tokens of a second
// each emptied the scale set's Update policy, 12 writes refilled 4 a
// minute per scale set (Microsoft, "Compute throttling limits"; the peer
// benchmark at 5,000 pods: 1 to 4 nodes a write, then 429s). A gang's
// demand is never held for it (a gang goes whole, across groups), and a
// release with a gang in it starts no pace: a stream of gangs must not
// hold a group's other demand back for good. While workload is paced,
// balloons wait too: they must not take the tokens and room it waits for.
func (na *nodeAddition) decidePaced(now time.Time, demands []ratelimit.Demand, inFlight int) ratelimit.Decision {
	na.expirePaces(now)
	held, workloadPaced, why := na.holdBack(now, demands)
	kept, paced, gangIn := splitHeld(demands, held, workloadPaced)
	d := na.queue.Decide(now, kept, inFlight)
	na.startPaces(now, d, gangIn)
	queueHeld(&d, paced, why)
	return d
}

// pacedGroup says group g was released to less than the gap before now,
// in an earlier loop.
func (na *nodeAddition) pacedGroup(now time.Time, g string) bool {
	last, ok := na.lastRelease[g]
	return ok && last.Before(now) && now.Sub(last) < na.gap
}

// expirePaces forgets the groups whose pace is over, and at a new loop's
// first decision, the pace that held demand back in the last loop.
func (na *nodeAddition) expirePaces(now time.Time) {
	for g, last := range na.lastRelease { // a group's pace over: forget it
		if now.Sub(last) >= na.gap {
			delete(na.lastRelease, g)
		}
	}
	if !na.pacedAt.Equal(now) { // a new loop's first decision
		na.pacedAt, na.pacedUntil = now, time.Time{}
	}
}

// holdBack marks the demands held back by their group's pace or running
// write; workloadPaced says workload was held by a pace, and why is the
// first hold's limit.
func (na *nodeAddition) holdBack(now time.Time, demands []ratelimit.Demand) (held []bool, workloadPaced bool, why ratelimit.Limit) {
	held = make([]bool, len(demands))
	why = ratelimit.NotLimited
	for i, x := range demands {
		limit := na.heldBy(now, x)
		if limit == ratelimit.NotLimited {
			continue
		}
		if why == ratelimit.NotLimited {
			why = limit
		}
		held[i] = true
		// Balloons wait behind paced workload (seconds); a group whose
		// write runs (minutes) spends no tokens or room they would take.
		workloadPaced = workloadPaced || (x.Class == ratelimit.Workload && na.pacedGroup(now, x.Group))
	}
	return held, workloadPaced, why
}

// heldBy is what holds demand x back: its group's pace (which then may end
// the loop's pacedUntil sooner) or its group's running write; NotLimited
// for a gang's demand, an empty one, and one nothing holds.
func (na *nodeAddition) heldBy(now time.Time, x ratelimit.Demand) ratelimit.Limit {
	if x.Gang != "" || x.Count <= 0 {
		return ratelimit.NotLimited
	}
	switch {
	case na.pacedGroup(now, x.Group):
		if end := na.lastRelease[x.Group].Add(na.gap); na.pacedUntil.IsZero() || end.Before(na.pacedUntil) {
			na.pacedUntil = end
		}
		return ratelimit.LimitPaced
	case na.writing[x.Group]:
		return ratelimit.LimitWriting
	}
	return ratelimit.NotLimited
}

// splitHeld parts the demands into those handed to the queue and those
// held (balloons too, behind paced workload); gangIn are the groups with a
// gang's demand handed to the queue. With nothing held, every demand goes.
func splitHeld(demands []ratelimit.Demand, held []bool, workloadPaced bool) (kept, paced []ratelimit.Demand, gangIn map[string]bool) {
	gangIn = map[string]bool{}
	for i, x := range demands {
		if held[i] || (workloadPaced && x.Gang == "" && x.Count > 0 && x.Class == ratelimit.Balloon) {
			paced = append(paced, x)
			continue
		}
		if x.Gang != "" {
			gangIn[x.Group] = true
		}
		kept = append(kept, x)
	}
	if len(paced) == 0 {
		kept = demands
	}
	return kept, paced, gangIn
}

// startPaces starts the pace of each group the decision released nodes
// of, but of a group with a gang in its release.
func (na *nodeAddition) startPaces(now time.Time, d ratelimit.Decision, gangIn map[string]bool) {
	for g, byClass := range d.ReleaseClass {
		for _, n := range byClass {
			if n > 0 && !gangIn[g] {
				if na.lastRelease == nil {
					na.lastRelease = map[string]time.Time{}
				}
				na.lastRelease[g] = now
			}
		}
	}
}

// queueHeld adds the held demands to the decision's queued ones, with the
// limit why when the queue named none.
func queueHeld(d *ratelimit.Decision, paced []ratelimit.Demand, why ratelimit.Limit) {
	for _, x := range paced {
		if d.Queued[x.Group] == nil {
			d.Queued[x.Group] = map[ratelimit.Class]int{}
		}
		d.Queued[x.Group][x.Class] += x.Count
		if d.Limit == ratelimit.NotLimited {
			d.Limit = why
		}
	}
}

// Refund returns the tokens of nodes the cloud refused (scaleup.Queue).
func (na *nodeAddition) Refund(n int) { na.queue.Refund(n) }

// Defer keeps nodes the cloud deferred unsent for the group's next
// release (scaleup.Queue); with smoothing off every demand is released
// each loop anyway.
func (na *nodeAddition) Defer(group string, n int, now time.Time) {
	if na.enabled {
		na.queue.Defer(group, n, now)
	}
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
	a.countCancelled(ctx, rep)
	na.lastQueued = rep.Queued
	if na.enabled && na.adaptive != nil {
		a.adaptRate(ctx, l, rep)
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

// countCancelled counts the demand queued last loop and neither released
// nor queued now: cancelled, its pods deleted, scheduled elsewhere, or
// fitting now.
func (a *Autoscaler) countCancelled(ctx context.Context, rep additionReport) {
	for g, byClass := range a.nodeAdd.lastQueued {
		for c, n := range byClass {
			still := rep.Queued[g][c] + rep.Released[g][c]
			if gone := n - still; gone > 0 {
				a.metrics.NodesCancelled.WithLabelValues(g, c.String()).Add(float64(gone))
				klog.FromContext(ctx).V(2).Info("Queued node demand cancelled", "nodeGroup", g, "class", c.String(), "nodes", gone)
			}
		}
	}
}

// adaptRate lets the adaptive controller move the node-addition rate on
// the API server's signals and whether the rate held demand back.
func (a *Autoscaler) adaptRate(ctx context.Context, l *loop, rep additionReport) {
	na := a.nodeAdd
	take := func() ratelimit.Signals {
		if na.apiServer == nil {
			return ratelimit.Signals{}
		}
		return na.apiServer.Take()
	}
	c, ok := na.adaptive.Update(l.now, rep.Limit == ratelimit.LimitRate, take)
	if !ok {
		return
	}
	if c.To != c.From {
		o := na.queue.Options()
		o.NodesPerMinute = c.To
		if err := na.queue.SetOptions(o); err != nil {
			klog.FromContext(ctx).Error(err, "Setting the adaptive node-addition rate")
		}
		a.metrics.RateChanges.WithLabelValues(c.Reason).Inc()
		klog.FromContext(ctx).Info("Node-addition rate changed", "from", c.From, "to", c.To, "reason", c.Reason,
			"requests", c.Signals.Requests, "slow", c.Signals.Slow, "throttled", c.Signals.Throttled,
			"serverErrors", c.Signals.ServerErrors, "flowControlRejected", c.Signals.Rejected, "flowControlKnown", c.Signals.RejectedKnown)
	}
	na.reason = c.Reason
}

// queueStatus is the queue in the status ConfigMap.
func (a *Autoscaler) queueStatus(rep additionReport) NodeAdditionStatus {
	o := a.nodeAdd.queue.Options()
	st := NodeAdditionStatus{Smoothing: a.nodeAdd.enabled, RateNodesPerMinute: o.NodesPerMinute, RateReason: a.nodeAdd.reason,
		Burst: o.Burst, BucketNodes: int(a.nodeAdd.queue.Capacity()), MaxInFlight: o.MaxInFlight, InFlight: rep.InFlight, HeldBy: string(rep.Limit)}
	for g, byClass := range rep.Queued {
		for c, n := range byClass {
			st.Queued = append(st.Queued, QueuedNodes{NodeGroup: g, Class: c.String(), Nodes: n})
		}
	}
	for g, h := range rep.HeldGangs {
		st.HeldGangs = append(st.HeldGangs, HeldGang{Gang: g, Nodes: h.Nodes, HeldBy: string(h.Limit)})
	}
	sort.Slice(st.HeldGangs, func(i, j int) bool { return st.HeldGangs[i].Gang < st.HeldGangs[j].Gang })
	sort.Slice(st.Queued, func(i, j int) bool {
		if st.Queued[i].NodeGroup != st.Queued[j].NodeGroup {
			return st.Queued[i].NodeGroup < st.Queued[j].NodeGroup
		}
		return st.Queued[i].Class < st.Queued[j].Class
	})
	return st
}

// queueOptions are the queue's bounds from the options.
func (o Options) queueOptions() ratelimit.Options {
	return ratelimit.Options{NodesPerMinute: o.NodeAdditionRate, Burst: o.NodeAdditionBurst, MaxInFlight: o.MaxNodesInFlight, Interval: o.ScanInterval}
}

// queuedMessage is the event of a pod whose nodes wait in the queue. It
// names no counts that change from loop to loop, so it is not rewritten as
// nodes trickle out.
func queuedMessage(group string, limit ratelimit.Limit, gang string, held ratelimit.HeldGang, heldOK bool) string {
	why := func(l ratelimit.Limit) string {
		switch l {
		case ratelimit.LimitInFlight:
			return "the cap on nodes in flight (--max-nodes-in-flight)"
		case ratelimit.LimitPaced:
			return "the pace of scale-set writes (--node-group-write-interval)"
		case ratelimit.LimitWriting:
			return "the group's previous scale-set write, still running (one at a time per scale set)"
		}
		return "the node-addition rate"
	}
	if gang != "" && heldOK {
		return fmt.Sprintf("pod's gang %s waits for its %d nodes, released together under %s to protect the API server; a gang larger than the cap goes alone once nothing else is in flight",
			gang, held.Nodes, why(held.Limit))
	}
	return fmt.Sprintf("pod is waiting for nodes of group %s, added gradually under %s to protect the API server", group, why(limit))
}
