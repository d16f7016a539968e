// Package ratelimit is the node-addition queue between the scale-up
// planner and the cloud: each loop the planner states the demand (group,
// count, class, age, gang) and the queue answers what may be requested now,
// within a token bucket in nodes per minute and a cap on nodes in flight.
//
// The queue decides and the core acts: it never calls the cloud. It keeps
// no demand between loops — demand is restated every loop from the pending
// pods, so demand that disappears (pods deleted, scheduled elsewhere) is
// cancelled by not being restated, and a restart loses nothing but the
// bucket's fill. The bucket starts full less the nodes already in flight,
// so an autoscaler restarted in the middle of a scale-up does not add a
// fresh burst on top of the one its predecessor just spent.
package ratelimit

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Class orders demand: workload before balloon.
type Class int

const (
	// Workload is demand for real pods.
	Workload Class = iota
	// Balloon is demand for warm-pool placeholder pods.
	Balloon
)

func (c Class) String() string {
	if c == Balloon {
		return "balloon"
	}
	return "workload"
}

// Demand is nodes the planner wants for one group.
type Demand struct {
	Group string
	Count int
	Class Class
	// Since is when the oldest pod behind the demand was created: older
	// demand goes first.
	Since time.Time
	// Gang, when set, names a gang whose nodes are released together or not
	// at all: a gang waiting half-provisioned is the worst case.
	Gang string
}

// Options bound the queue.
type Options struct {
	// NodesPerMinute is the token bucket's rate.
	NodesPerMinute float64
	// Burst is the bucket's size after a quiet period.
	Burst int
	// Interval is the loop's period (--scan-interval). The bucket holds at
	// least the rate's worth of the time since the previous loop (counted
	// as at least Interval and at most twice it), so the rate is reachable
	// whatever the period: a bucket of Burst alone would cap the rate at
	// Burst per loop (20 every 10 s is 120/min, whatever the rate). Zero
	// means the bucket holds Burst only.
	Interval time.Duration
	// MaxInFlight caps nodes requested but not yet ready.
	MaxInFlight int
}

// Validate names the flag at fault.
func (o Options) Validate() error {
	switch {
	case o.NodesPerMinute <= 0:
		return fmt.Errorf("--node-addition-rate: must be positive, got %v", o.NodesPerMinute)
	case o.Burst < 1:
		return fmt.Errorf("--node-addition-burst: must be at least 1, got %d", o.Burst)
	case o.MaxInFlight < 1:
		return fmt.Errorf("--max-nodes-in-flight: must be at least 1, got %d", o.MaxInFlight)
	case o.Interval < 0:
		return fmt.Errorf("--scan-interval: must not be negative, got %v", o.Interval)
	}
	return nil
}

// capacity is the bucket's size for a loop that comes period after the
// previous one.
func (o Options) capacity(period time.Duration) float64 {
	if o.Interval <= 0 {
		return float64(o.Burst)
	}
	period = min(max(period, o.Interval), 2*o.Interval)
	return math.Max(float64(o.Burst), o.NodesPerMinute*period.Minutes())
}

// Queue is the token bucket and the fairness cursor. Not safe for
// concurrent use: the loop owns it.
type Queue struct {
	opts   Options
	tokens float64
	last   time.Time
	// period is the time between the last two Decides (Interval before
	// the second).
	period time.Duration
	// cursor is the group that goes first in the next round-robin.
	cursor string
}

// New returns a queue with a full bucket.
func New(o Options) (*Queue, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Queue{opts: o, tokens: float64(o.Burst), period: o.Interval}, nil
}

// SetOptions changes the bounds (a live reload or the adaptive controller);
// the bucket keeps its fill, capped at its new size.
func (q *Queue) SetOptions(o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	q.opts = o
	q.tokens = math.Min(q.tokens, q.Capacity())
	return nil
}

// Capacity is what the bucket holds at most now: Burst, or the rate's
// worth of the last loop's period when that is more.
func (q *Queue) Capacity() float64 { return q.opts.capacity(q.period) }

// Options returns the current bounds.
func (q *Queue) Options() Options { return q.opts }

// Limit names what held demand back in a loop.
type Limit string

// What can hold demand back.
const (
	// NotLimited: everything demanded was released.
	NotLimited Limit = ""
	// LimitRate: the token bucket was empty.
	LimitRate Limit = "rate"
	// LimitInFlight: the cap on nodes in flight was reached.
	LimitInFlight Limit = "in-flight"
)

// Decision is what the queue answers for one loop.
type Decision struct {
	// ReleaseClass is, per group and class, the nodes to request now (one
	// request per group for all its classes).
	ReleaseClass map[string]map[Class]int
	// Queued is, per group and class, the demand held back; the cluster
	// state counts it as upcoming so the planner does not ask twice.
	Queued map[string]map[Class]int
	// Tokens is the bucket's fill after the release (negative while a gang
	// larger than the burst is being paid back).
	Tokens float64
	// Limit says what held demand back first.
	Limit Limit
	// HeldGangs says, per gang held back whole, its nodes and why.
	HeldGangs map[string]HeldGang
}

// HeldGang is a gang the queue holds back whole.
type HeldGang struct {
	Nodes int
	Limit Limit
}

func (d *Decision) hold(gang string, nodes int, why Limit) {
	if d.HeldGangs == nil {
		d.HeldGangs = map[string]HeldGang{}
	}
	d.HeldGangs[gang] = HeldGang{Nodes: nodes, Limit: why}
}

// Release is, per group, the nodes to request now: ReleaseClass summed
// over classes.
func (d Decision) Release() map[string]int {
	out := make(map[string]int, len(d.ReleaseClass))
	for g, byClass := range d.ReleaseClass {
		for _, n := range byClass {
			out[g] += n
		}
	}
	return out
}

// Released is the total number of nodes released.
func (d Decision) Released() int {
	n := 0
	for _, c := range d.Release() {
		n += c
	}
	return n
}

// Decide refills the bucket to now and releases demand: workload before
// balloon, older before newer, one node per group per round so a big group
// cannot starve the others, and a gang's nodes all at once. inFlight is the
// number of nodes requested and not yet ready.
func (q *Queue) Decide(now time.Time, demands []Demand, inFlight int) Decision {
	if q.last.IsZero() {
		q.tokens = math.Max(0, math.Min(q.tokens, float64(q.opts.Burst-inFlight)))
	}
	q.refill(now)
	d := Decision{ReleaseClass: map[string]map[Class]int{}, Queued: map[string]map[Class]int{}}
	room := q.opts.MaxInFlight - inFlight
	if room < 0 {
		room = 0
	}
	ds := make([]Demand, 0, len(demands))
	for _, x := range demands {
		if x.Count > 0 {
			ds = append(ds, x)
		}
	}
	sort.SliceStable(ds, func(i, j int) bool {
		if ds[i].Class != ds[j].Class {
			return ds[i].Class < ds[j].Class
		}
		if !ds[i].Since.Equal(ds[j].Since) {
			return ds[i].Since.Before(ds[j].Since)
		}
		return ds[i].Group < ds[j].Group
	})
	left := make([]int, len(ds))
	for i := range ds {
		left[i] = ds[i].Count
	}
	limit := func(why Limit) {
		if d.Limit == NotLimited {
			d.Limit = why
		}
	}
	for _, class := range []Class{Workload, Balloon} {
		// Gangs first within their class, oldest first: all or nothing,
		// across every group the gang's nodes come from.
		seen := map[string]bool{}
		for i, x := range ds {
			if x.Class != class || x.Gang == "" || seen[x.Gang] {
				continue
			}
			seen[x.Gang] = true
			var members []int
			need := 0
			for j := i; j < len(ds); j++ {
				if ds[j].Class == class && ds[j].Gang == x.Gang && left[j] > 0 {
					members = append(members, j)
					need += left[j]
				}
			}
			switch {
			case need == 0:
				continue
			case need > room && !(need > q.opts.MaxInFlight && inFlight == 0 && room == q.opts.MaxInFlight):
				// A gang larger than the whole cap could never fit under it:
				// it goes alone, when nothing is in flight and nothing was
				// released before it, and the cap is paid back (nothing more
				// goes until its nodes are up).
				limit(LimitInFlight)
				d.hold(x.Gang, need, LimitInFlight)
				continue
			case float64(need) > q.tokens && q.tokens < float64(min(need, q.opts.Burst)):
				// A gang larger than the burst goes when the bucket is full
				// and is paid back afterwards (tokens go negative).
				limit(LimitRate)
				d.hold(x.Gang, need, LimitRate)
				continue
			}
			q.tokens -= float64(need)
			room = max(0, room-need)
			for _, j := range members {
				d.release(ds[j], left[j])
				left[j] = 0
			}
		}
		// Then one node per group per round, starting after the last
		// round's first group.
		var order []int
		for i, x := range ds {
			if x.Class == class && x.Gang == "" && left[i] > 0 {
				order = append(order, i)
			}
		}
		order = rotate(ds, order, q.cursor)
		for len(order) > 0 {
			if room == 0 {
				limit(LimitInFlight)
				break
			}
			if q.tokens < 1 {
				limit(LimitRate)
				break
			}
			next := order[:0:0]
			for _, i := range order {
				if room == 0 || q.tokens < 1 {
					next = append(next, i)
					continue
				}
				q.tokens--
				room--
				left[i]--
				d.release(ds[i], 1)
				q.cursor = ds[i].Group
				if left[i] > 0 {
					next = append(next, i)
				}
			}
			order = next
		}
	}
	for i, x := range ds {
		if left[i] > 0 {
			if d.Queued[x.Group] == nil {
				d.Queued[x.Group] = map[Class]int{}
			}
			d.Queued[x.Group][x.Class] += left[i]
		}
	}
	d.Tokens = q.tokens
	return d
}

// Refund returns the tokens of n released nodes the cloud refused, so a
// failed request does not cost the rate.
func (q *Queue) Refund(n int) {
	q.tokens = math.Min(q.Capacity(), q.tokens+float64(n))
}

// Tokens is the bucket's fill as of the last Decide.
func (q *Queue) Tokens() float64 { return q.tokens }

func (d *Decision) release(x Demand, n int) {
	if d.ReleaseClass[x.Group] == nil {
		d.ReleaseClass[x.Group] = map[Class]int{}
	}
	d.ReleaseClass[x.Group][x.Class] += n
}

// rotate orders demand indexes so the group after cursor comes first,
// keeping age order otherwise.
func rotate(ds []Demand, order []int, cursor string) []int {
	if cursor == "" || len(order) < 2 {
		return order
	}
	for k, i := range order {
		if ds[i].Group == cursor {
			return append(append([]int(nil), order[k+1:]...), order[:k+1]...)
		}
	}
	return order
}

func (q *Queue) refill(now time.Time) {
	if q.last.IsZero() {
		q.last = now
		return
	}
	if dt := now.Sub(q.last); dt > 0 {
		q.period = dt
		q.tokens = math.Min(q.Capacity(), q.tokens+q.opts.NodesPerMinute*dt.Minutes())
		q.last = now
	}
}
