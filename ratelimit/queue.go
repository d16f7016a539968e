// Package ratelimit is the node-addition queue between the scale-up
// planner and the cloud: each loop the planner states the demand (group,
// count, class, age, gang) and the queue answers what may be requested now,
// within a token bucket in nodes per minute and a cap on nodes in flight.
//
// The queue decides and the core acts: it never calls the cloud. It keeps
// no demand between loops — demand is restated every loop from the pending
// pods, so demand that disappears (pods deleted, scheduled elsewhere) is
// cancelled by not being restated, and a restart loses nothing but the
// bucket's fill and the gangs' places in line. The bucket starts full less
// the nodes already in flight, so an autoscaler restarted in the middle of
// a scale-up does not add a fresh burst on top of the one its predecessor
// just spent.
//
// The queue keeps its order: a gang that cannot be released whole holds
// its place, and nothing after it in the order (later gangs, single-node
// demand of its class, every lower class) is released until it is. That
// is the only backfill that never delays it: a node requested now comes
// up no sooner than the ones already in flight, so any node released
// behind the gang is one more that must come up before the gang fits, or
// a token it waits for. So the first held gang — the head — is released
// within max(L, (min(N, Burst) − τ)/rate) + one loop of becoming the head,
// where L is the longest a requested node stays in flight, N the gang's
// nodes and τ the bucket's fill then: everything in flight then is up
// within L and nothing else is spent meanwhile. A gang larger than the cap
// needs nothing in flight, which takes at most L once nothing else goes.
// To keep that place, the queue remembers when it first saw each gang
// (gangs are ordered by it, then by age) and forgets a gang once it is
// released or a later loop does not restate it.
package ratelimit

import (
	"fmt"
	"math"
	"slices"
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

// Queue is the token bucket, the fairness cursor and the gangs' places in
// line. Not safe for concurrent use: the loop owns it.
type Queue struct {
	opts   Options
	tokens float64
	last   time.Time
	// period is the time between the last two Decides (Interval before
	// the second).
	period time.Duration
	// cursor is the group that goes first in the next round-robin.
	cursor string
	// seen is, per gang, when the queue first and last saw its demand.
	seen map[gangKey]gangSeen
	// credit is, per group, nodes released and paid for whose request the
	// cloud deferred unsent (Defer): they go in the group's next release
	// without paying again.
	credit map[string]credit
	// waitingSince is, per group whose single-node demand waits for its
	// write's worth, when it began to wait (chunkPatience).
	waitingSince map[string]time.Time
	// head is the gang that held the order in the last Decide. Another
	// Decide at the same time (a retry round of the same loop, which
	// restates only the demand it plans again) keeps it held even when
	// it is not restated.
	head *gangLine
}

// credit is a group's deferred nodes and when they were last deferred.
type credit struct {
	n  int
	at time.Time
}

// chunkPatience bounds how long a group's single-node demand waits for
// its write's worth (Chunk): past it, the group takes what the bucket and
// the in-flight cap hold. At the default rate a burst's worth refills in
// 30 s.
const chunkPatience = 30 * time.Second

// creditTTL is how long a group's deferred nodes wait for its demand to
// be stated again (the group may be paced, or its pods planned
// elsewhere for a loop) before their tokens go back to the bucket.
const creditTTL = time.Minute

// gangKey names a gang within its class (a gang is all or nothing per
// class).
type gangKey struct {
	class Class
	name  string
}

type gangSeen struct{ first, last time.Time }

// gangLine is a gang's place in the order of one Decide.
type gangLine struct {
	key   gangKey
	first time.Time // when the queue first saw it
	since time.Time // its oldest member's age
	// members are its demand indexes; none for a head remembered from an
	// earlier Decide at the same time.
	members []int
	// nodes, limit and at, for a head: its nodes, why it waits, and the
	// Decide that held it.
	nodes int
	limit Limit
	at    time.Time
}

func (a *gangLine) before(b *gangLine) bool {
	switch {
	case a.key.class != b.key.class:
		return a.key.class < b.key.class
	case !a.first.Equal(b.first):
		return a.first.Before(b.first)
	case !a.since.Equal(b.since):
		return a.since.Before(b.since)
	}
	return a.key.name < b.key.name
}

// New returns a queue with a full bucket.
func New(o Options) (*Queue, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Queue{opts: o, tokens: float64(o.Burst), period: o.Interval, waitingSince: map[string]time.Time{}}, nil
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
	// LimitPaced: the group was released to a few seconds ago; the next
	// release to it waits (the core paces scale-set writes).
	LimitPaced Limit = "paced"
	// LimitWriting: the group's previous capacity write still runs (a
	// scale set takes one at a time); its demand waits for the end.
	LimitWriting Limit = "write-in-flight"
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
	// HeldGangs says, per gang held back whole, its nodes and why: a gang
	// waiting behind the head while it would fit itself gives the head's
	// reason.
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
// balloon, gangs before single-node demand within a class (gangs in the
// order the queue first saw them, then older first), a write's worth per
// group per round (min(its demand, the burst), or nothing) so a big group
// cannot starve the others and no scale set is kept busy by a thin
// write, and a gang's nodes
// all at once. The first gang that cannot be released holds everything
// after it (see the package doc). inFlight is the number of nodes
// requested and not yet ready.
func (q *Queue) Decide(now time.Time, demands []Demand, inFlight int) Decision {
	if q.last.IsZero() {
		q.tokens = math.Max(0, math.Min(q.tokens, float64(q.opts.Burst-inFlight)))
	}
	q.refill(now)
	st := &deciding{
		q:        q,
		now:      now,
		inFlight: inFlight,
		d:        Decision{ReleaseClass: map[string]map[Class]int{}, Queued: map[string]map[Class]int{}},
		room:     max(0, q.opts.MaxInFlight-inFlight),
		ds:       stated(demands),
	}
	st.left = make([]int, len(st.ds))
	for i := range st.ds {
		st.left[i] = st.ds[i].Count
	}
	gangs := q.line(now, st.ds)
	for _, class := range []Class{Workload, Balloon} {
		st.releaseGangs(class, gangs)
		st.releaseSingles(class)
	}
	q.head = st.head
	st.recordQueued()
	q.settleCredit(now, st.ds, st.left)
	q.forgetWaiting(st.ds, st.left)
	st.d.Tokens = q.tokens
	return st.d
}

// deciding is one Decide's working state.
type deciding struct {
	q        *Queue
	now      time.Time
	inFlight int
	d        Decision
	// room is what the in-flight cap still holds.
	room int
	// ds is the demand stated, in order; left is what of each is not
	// released yet.
	ds   []Demand
	left []int
	// held is the head's reason once a gang (or a group's write's worth)
	// could not be released: nothing after it goes.
	held Limit
	// head is the gang that holds the order, for the next Decide.
	head *gangLine
}

// stated is the demand for at least one node, by class, then age, then
// group.
func stated(demands []Demand) []Demand {
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
	return ds
}

// limit records why demand was held back, the first reason only.
func (st *deciding) limit(why Limit) {
	if st.d.Limit == NotLimited {
		st.d.Limit = why
	}
}

// releaseGangs releases the gangs of class, in line: all or nothing,
// across every group the gang's nodes come from.
func (st *deciding) releaseGangs(class Class, gangs []*gangLine) {
	for _, g := range gangs {
		if g.key.class == class {
			st.releaseGang(g)
		}
	}
}

// releaseGang releases a gang's nodes all at once, or holds it whole.
func (st *deciding) releaseGang(g *gangLine) {
	if g.members == nil {
		// The head of an earlier round of this loop, not restated.
		if st.held == NotLimited {
			st.held, st.head = g.limit, g
			st.limit(st.held)
		}
		return
	}
	need := 0
	for _, j := range g.members {
		need += st.left[j]
	}
	if need == 0 {
		return
	}
	if why := st.gangLimit(need); why != NotLimited {
		st.holdGang(g, need, why)
		return
	}
	st.q.tokens -= float64(need)
	st.room = max(0, st.room-need)
	for _, j := range g.members {
		st.d.release(st.ds[j], st.left[j])
		st.left[j] = 0
	}
	// Released demand leaves the line: if it comes back (the cloud
	// refused it), it is new demand.
	delete(st.q.seen, g.key)
}

// gangLimit is what holds back a gang of need nodes, if anything.
func (st *deciding) gangLimit(need int) Limit {
	q := st.q
	switch {
	case need > st.room && !(need > q.opts.MaxInFlight && st.inFlight == 0 && st.room == q.opts.MaxInFlight):
		// A gang larger than the whole cap could never fit under it:
		// it goes alone, when nothing is in flight and nothing was
		// released before it, and the cap is paid back (nothing more
		// goes until its nodes are up).
		return LimitInFlight
	case float64(need) > q.tokens && q.tokens < float64(min(need, q.opts.Burst)):
		// A gang larger than the burst goes when the bucket is full
		// and is paid back afterwards (tokens go negative).
		return LimitRate
	case st.held != NotLimited:
		// It would fit, but the head waits for this room.
		return st.held
	}
	return NotLimited
}

// holdGang holds a gang of need nodes back whole; the first held is the
// head.
func (st *deciding) holdGang(g *gangLine, need int, why Limit) {
	st.limit(why)
	st.d.hold(g.key.name, need, why)
	if st.held == NotLimited {
		st.held = why
		st.head = &gangLine{key: g.key, first: g.first, since: g.since, nodes: need, limit: why, at: st.now}
	}
}

// releaseSingles releases the single-node demand of class: a group's
// deferred nodes first, then a write's worth per group per round,
// starting after the last round's first group.
func (st *deciding) releaseSingles(class Class) {
	var order []int
	for i, x := range st.ds {
		if x.Class == class && x.Gang == "" && st.left[i] > 0 {
			order = append(order, i)
		}
	}
	if st.held != NotLimited {
		// Behind a held gang: nothing goes.
		if len(order) > 0 {
			st.limit(st.held)
		}
		return
	}
	st.releaseCredit(order)
	order = slices.DeleteFunc(order, func(i int) bool { return st.left[i] == 0 })
	order = rotate(st.ds, order, st.q.cursor)
	st.releaseChunks(order)
}

// releaseCredit releases a group's deferred nodes, already paid for: the
// request the cloud deferred goes again, merged with what the group gets
// now, as one write.
func (st *deciding) releaseCredit(order []int) {
	q := st.q
	for _, i := range order {
		c := q.credit[st.ds[i].Group]
		n := min(c.n, st.left[i], st.room)
		if n <= 0 {
			continue
		}
		c.n -= n
		q.credit[st.ds[i].Group] = c
		st.room -= n
		st.left[i] -= n
		st.d.release(st.ds[i], n)
	}
}

// releaseChunks releases a write's worth per group per round: min(its
// demand, the burst) or nothing. Each group's release is one capacity
// write, and a scale set takes one at a time for a whole operation
// (until its VMs have booted and run their extensions: minutes for GPU
// VMs; Microsoft, "Virtual Machine Scale Sets" REST reference: the
// operation's status stays InProgress until the instances are
// provisioned), so a release of a node or two a loop spread over many
// groups left every scale set busy with a thin write while the in-flight
// cap had room (issue #38's xl run: 200 of 300 in flight on average). A
// group whose chunk does not fit the bucket or the cap holds what comes
// after it, as a held gang does, so the tokens and room it waits for are
// not spent by smaller demand first; the next round starts after the
// last group released to.
func (st *deciding) releaseChunks(order []int) {
	chunk := st.q.Chunk()
	for len(order) > 0 && st.held == NotLimited {
		next := order[:0:0]
		for _, i := range order {
			if st.releaseChunk(i, chunk) {
				next = append(next, i)
			}
		}
		order = next
	}
}

// releaseChunk releases demand i's write's worth, or holds it (and what
// comes after it); it says whether i has demand left for the next round.
func (st *deciding) releaseChunk(i, chunk int) (again bool) {
	if st.held != NotLimited {
		return true
	}
	n, why := st.chunkOf(i, chunk)
	if why != NotLimited {
		fit, ok := st.outwaited(i)
		if !ok {
			st.held = why
			st.limit(why)
			return true
		}
		n = fit
	}
	q := st.q
	delete(q.waitingSince, st.ds[i].Group)
	q.tokens -= float64(n)
	st.room -= n
	st.left[i] -= n
	st.d.release(st.ds[i], n)
	q.cursor = st.ds[i].Group
	return st.left[i] > 0
}

// chunkOf is demand i's next write: min(its demand, chunk), or what the
// bucket holds when waiting would spill it; and what holds it back when
// it does not fit.
func (st *deciding) chunkOf(i, chunk int) (int, Limit) {
	q := st.q
	n := min(st.left[i], chunk)
	switch {
	case n > st.room:
		return n, LimitInFlight
	case float64(n) > q.tokens && q.overflows() && q.tokens >= 1:
		// Waiting would spill the bucket: what it holds goes.
		return int(q.tokens), NotLimited
	case float64(n) > q.tokens:
		return n, LimitRate
	}
	return n, NotLimited
}

// outwaited says whether demand i's group waited chunkPatience for its
// write's worth, and what fits now: gangs released first every round
// could keep the room or the bucket just short of it for as long as they
// keep coming. A group that starts waiting is remembered.
func (st *deciding) outwaited(i int) (fit int, ok bool) {
	q := st.q
	since, waiting := q.waitingSince[st.ds[i].Group]
	if fit := min(st.left[i], st.room, int(math.Floor(q.tokens))); waiting && st.now.Sub(since) >= chunkPatience && fit >= 1 {
		return fit, true
	}
	if !waiting {
		q.waitingSince[st.ds[i].Group] = st.now
	}
	return 0, false
}

// recordQueued records, per group and class, the demand held back.
func (st *deciding) recordQueued() {
	for i, x := range st.ds {
		if st.left[i] > 0 {
			if st.d.Queued[x.Group] == nil {
				st.d.Queued[x.Group] = map[Class]int{}
			}
			st.d.Queued[x.Group][x.Class] += st.left[i]
		}
	}
}

// forgetWaiting forgets the groups whose single-node demand no longer
// waits.
func (q *Queue) forgetWaiting(ds []Demand, left []int) {
	if len(q.waitingSince) == 0 {
		return
	}
	still := map[string]bool{}
	for i, x := range ds {
		if x.Gang == "" && left[i] > 0 {
			still[x.Group] = true
		}
	}
	for g := range q.waitingSince {
		if !still[g] {
			delete(q.waitingSince, g)
		}
	}
}

// Seed tells a queue that has not decided yet that recent nodes were
// added in the last minute by someone it cannot see (a previous leader):
// its first bucket is the burst less them (never below 0), so a new
// leader's first releases and the old one's last do not make one minute
// of more than the rate. It does nothing once the queue has decided.
func (q *Queue) Seed(recent int) {
	if !q.last.IsZero() || recent <= 0 {
		return
	}
	q.tokens = math.Max(0, math.Min(q.tokens, float64(q.opts.Burst-recent)))
}

// Defer takes back n released nodes of group that the cloud deferred
// unsent (the scale set's previous write still runs, or its throttling
// budget is held back): unlike a refund, their tokens stay spent and the
// nodes go in the group's next release, beyond the burst, so a scale set
// that takes one write at a time gets, in that write, what the rate
// released for it meanwhile. The rate over time is unchanged: only nodes
// already paid for are merged.
func (q *Queue) Defer(group string, n int, now time.Time) {
	if n <= 0 {
		return
	}
	if q.credit == nil {
		q.credit = map[string]credit{}
	}
	c := q.credit[group]
	q.credit[group] = credit{n: c.n + n, at: now}
}

// Deferred is the number of deferred nodes the queue holds for group.
func (q *Queue) Deferred(group string) int { return q.credit[group].n }

// settleCredit drops the credit that cannot be spent, its tokens back to
// the bucket (up to its capacity): a group whose single-node demand was
// stated and is all released (its pods went elsewhere, or fit now), and
// a group whose credit waited creditTTL without being spent. Credit of a
// group whose demand is still queued (the in-flight cap held it) waits.
func (q *Queue) settleCredit(now time.Time, ds []Demand, left []int) {
	stated, queued := map[string]bool{}, map[string]bool{}
	for i, x := range ds {
		if x.Gang == "" {
			stated[x.Group] = true
			queued[x.Group] = queued[x.Group] || left[i] > 0
		}
	}
	for g, c := range q.credit {
		if c.n > 0 && (!stated[g] || queued[g]) && now.Sub(c.at) < creditTTL {
			continue
		}
		q.Refund(c.n)
		delete(q.credit, g)
	}
}

// line records the gangs demanded now, forgets the ones a later loop did
// not restate, and orders them: by class, then when the queue first saw
// them, then age. The head of an earlier Decide at the same time that is
// not restated keeps its place.
func (q *Queue) line(now time.Time, ds []Demand) []*gangLine {
	if q.seen == nil {
		q.seen = map[gangKey]gangSeen{}
	}
	byKey := map[gangKey]*gangLine{}
	var out []*gangLine
	for i, x := range ds {
		if x.Gang == "" {
			continue
		}
		k := gangKey{x.Class, x.Gang}
		g := byKey[k]
		if g == nil {
			g = &gangLine{key: k, first: q.saw(k, now), since: x.Since}
			byKey[k] = g
			out = append(out, g)
		}
		// ds is sorted by age within a class: the first member is the oldest.
		g.members = append(g.members, i)
	}
	q.forgetUnstated(now)
	if h := q.head; h != nil && h.at.Equal(now) && byKey[h.key] == nil {
		out = append(out, &gangLine{key: h.key, first: h.first, since: h.since, nodes: h.nodes, limit: h.limit, at: h.at})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].before(out[j]) })
	return out
}

// saw records that gang k is demanded now and returns when the queue
// first saw it.
func (q *Queue) saw(k gangKey, now time.Time) time.Time {
	s, ok := q.seen[k]
	if !ok {
		s.first = now
	}
	s.last = now
	q.seen[k] = s
	return s.first
}

// forgetUnstated forgets the gangs not demanded now.
func (q *Queue) forgetUnstated(now time.Time) {
	for k, s := range q.seen {
		if s.last.Before(now) {
			delete(q.seen, k)
		}
	}
}

// Refund returns the tokens of n released nodes the cloud refused, so a
// failed request does not cost the rate.
func (q *Queue) Refund(n int) {
	q.tokens = math.Min(q.Capacity(), q.tokens+float64(n))
}

// RefillTime is how long after the last Decide the bucket holds n tokens
// (at most its capacity) at the current rate: 0 when it already does.
func (q *Queue) RefillTime(n int) time.Duration {
	target := math.Min(float64(n), q.Capacity())
	if q.tokens >= target {
		return 0
	}
	return time.Duration((target - q.tokens) / q.opts.NodesPerMinute * float64(time.Minute))
}

// Chunk is a write's worth: what a group's single-node demand waits for
// before it is released (min(its demand, Chunk)), the burst within the
// in-flight cap.
func (q *Queue) Chunk() int { return min(q.opts.Burst, q.opts.MaxInFlight) }

// overflows says whether the bucket would spill by the next loop (a
// loop period away) if nothing were spent now: a group that waits for
// its chunk then takes what the bucket holds instead, or the rate would
// be out of reach when a loop's refill is close to the bucket's size (a
// chunk of 20 with a bucket of 20 and 17 tokens a loop: 60 a minute
// released of 100).
func (q *Queue) overflows() bool {
	return q.tokens+q.opts.NodesPerMinute*q.period.Minutes() > q.Capacity()
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
