package ratelimit

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newQueue(t *testing.T, rate float64, burst, inFlight int) *Queue {
	t.Helper()
	q, err := New(Options{NodesPerMinute: rate, Burst: burst, MaxInFlight: inFlight})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestRateAndBurst(t *testing.T) {
	q := newQueue(t, 120, 20, 10000)
	demand := []Demand{{Group: "gpu", Count: 300, Since: t0}}
	released := 0
	// 10 s loops for 2 minutes: the burst, then 20 nodes per 10 s.
	perLoop := []int{}
	for i := 0; i <= 12; i++ {
		d := q.Decide(t0.Add(time.Duration(i)*10*time.Second), []Demand{{Group: "gpu", Count: demand[0].Count - released, Since: t0}}, 0)
		released += d.Released()
		perLoop = append(perLoop, d.Released())
		if i > 0 && d.Limit != LimitRate {
			t.Fatalf("loop %d: limit %q, want rate", i, d.Limit)
		}
	}
	if perLoop[0] != 20 || perLoop[1] != 20 || perLoop[12] != 20 {
		t.Fatalf("released per loop %v, want the burst of 20 and then 20 per 10 s", perLoop)
	}
	// Over any 60 s window at most rate + burst.
	if released != 20+240 {
		t.Fatalf("released %d in 2 minutes, want 260", released)
	}
}

func TestInFlightCap(t *testing.T) {
	q := newQueue(t, 1000, 1000, 50)
	// A write's worth is the cap here (50): with room for 20 the group
	// waits for it, rather than keeping its scale set busy with 20.
	d := q.Decide(t0, []Demand{{Group: "gpu", Count: 100, Since: t0}}, 30)
	if d.Released() != 0 || d.Limit != LimitInFlight || d.Queued["gpu"][Workload] != 100 {
		t.Fatalf("released %d limit %q queued %v; want nothing under the in-flight cap (room 20 of a write's 50) and 100 queued", d.Released(), d.Limit, d.Queued)
	}
	d = q.Decide(t0.Add(time.Second), []Demand{{Group: "gpu", Count: 100, Since: t0}}, 0)
	if d.Released() != 50 || d.Limit != LimitInFlight || d.Queued["gpu"][Workload] != 50 {
		t.Fatalf("released %d limit %q queued %v; want the cap's 50 and 50 queued", d.Released(), d.Limit, d.Queued)
	}
	if d := q.Decide(t0.Add(2*time.Second), []Demand{{Group: "gpu", Count: 50, Since: t0}}, 50); d.Released() != 0 {
		t.Fatalf("released %d with the cap reached", d.Released())
	}
	// Demand smaller than a write's worth goes as far as the room allows.
	if d := q.Decide(t0.Add(3*time.Second), []Demand{{Group: "cpu", Count: 5, Since: t0}}, 45); d.Released() != 5 {
		t.Fatalf("released %d of 5 with room for 5", d.Released())
	}
}

func TestWorkloadBeforeBalloonAndOlderFirst(t *testing.T) {
	q := newQueue(t, 60, 3, 100)
	d := q.Decide(t0, []Demand{
		{Group: "warm", Count: 5, Class: Balloon, Since: t0.Add(-time.Hour)},
		{Group: "new", Count: 5, Since: t0},
		{Group: "old", Count: 1, Since: t0.Add(-time.Minute)},
	}, 0)
	// new's write of 3 (the burst) does not fit the 2 tokens left: it
	// waits, and the balloons behind it too.
	if d.Release()["old"] != 1 || d.Release()["new"] != 0 || d.Release()["warm"] != 0 || d.Limit != LimitRate {
		t.Fatalf("released %v limit %q; want old's 1, new's write held by the rate, balloons last", d.Release(), d.Limit)
	}
	if d.Queued["warm"][Balloon] != 5 || d.Queued["new"][Workload] != 5 {
		t.Fatalf("queued %v", d.Queued)
	}
	d = q.Decide(t0.Add(time.Minute), []Demand{
		{Group: "warm", Count: 5, Class: Balloon, Since: t0.Add(-time.Hour)},
		{Group: "new", Count: 5, Since: t0},
	}, 0)
	if d.Release()["new"] != 3 || d.Release()["warm"] != 0 {
		t.Fatalf("released %v; want new's write of 3 (the burst) first", d.Release())
	}
}

// TestRoundRobinBetweenGroups: a write's worth per group per round, the
// next round after the last group served, so one big group cannot
// starve the rest and no group gets a thin write.
func TestRoundRobinBetweenGroups(t *testing.T) {
	q := newQueue(t, 60, 6, 100)
	demands := []Demand{
		{Group: "big", Count: 1000, Since: t0.Add(-time.Hour)},
		{Group: "a", Count: 10, Since: t0},
		{Group: "b", Count: 10, Since: t0},
	}
	var got []string
	for i := range 20 {
		d := q.Decide(t0.Add(time.Duration(i)*time.Second), demands, 0)
		for g, n := range d.Release() {
			// A write's worth: the burst, 6 tokens (6 s at 60 a minute).
			if n != 6 || len(d.Release()) != 1 || i%6 != 0 {
				t.Fatalf("loop %d released %v; want one group's write of 6 every 6 s", i, d.Release())
			}
			got = append(got, g)
			for k := range demands {
				if demands[k].Group == g {
					demands[k].Count -= n
				}
			}
		}
	}
	if want := []string{"big", "a", "b", "big"}; !slices.Equal(got, want) {
		t.Fatalf("groups released to in order %v, want %v", got, want)
	}
}

func TestGangReleasedTogether(t *testing.T) {
	q := newQueue(t, 60, 10, 100)
	// 8 of 10 tokens are used by older demand; the 4-node gang waits whole.
	d := q.Decide(t0, []Demand{
		{Group: "cpu", Count: 8, Since: t0.Add(-time.Hour)},
		{Group: "gpu", Count: 4, Since: t0, Gang: "train-7"},
	}, 0)
	if d.Release()["gpu"] != 4 || d.Release()["cpu"] != 0 || d.Limit != LimitRate {
		t.Fatalf("released %v limit %q; want the gang's 4 at once (gangs go first in their class), cpu's write of 8 waiting for the rate", d.Release(), d.Limit)
	}
	q2 := newQueue(t, 60, 10, 100)
	q2.Decide(t0, []Demand{{Group: "cpu", Count: 7, Since: t0}}, 0)
	d = q2.Decide(t0, []Demand{{Group: "gpu", Count: 4, Gang: "g"}}, 0)
	if d.Released() != 0 || d.Queued["gpu"][Workload] != 4 {
		t.Fatalf("released %v queued %v; want the gang held whole with 3 tokens", d.Release(), d.Queued)
	}
	d = q2.Decide(t0.Add(time.Minute), []Demand{{Group: "gpu", Count: 4, Gang: "g"}}, 0)
	if d.Release()["gpu"] != 4 {
		t.Fatalf("released %v; want the whole gang once tokens allow", d.Release())
	}
}

func TestGangLargerThanBurstIsPaidBack(t *testing.T) {
	q := newQueue(t, 60, 10, 1000)
	d := q.Decide(t0, []Demand{{Group: "gpu", Count: 64, Gang: "big"}}, 0)
	if d.Release()["gpu"] != 64 || d.Tokens != -54 {
		t.Fatalf("released %v tokens %v; want the 64-node gang at a full bucket and 54 tokens owed", d.Release(), d.Tokens)
	}
	// Nothing else until the debt is paid: 54 tokens at 60/min.
	if d := q.Decide(t0.Add(50*time.Second), []Demand{{Group: "cpu", Count: 1}}, 0); d.Released() != 0 {
		t.Fatalf("released %v while paying back", d.Release())
	}
	if d := q.Decide(t0.Add(56*time.Second), []Demand{{Group: "cpu", Count: 1}}, 0); d.Released() != 1 {
		t.Fatalf("released %v after the debt", d.Release())
	}
}

func TestCancelledDemandIsNeverReleased(t *testing.T) {
	q := newQueue(t, 60, 5, 100)
	d := q.Decide(t0, []Demand{{Group: "gpu", Count: 20}}, 0)
	if d.Released() != 5 {
		t.Fatalf("released %d", d.Released())
	}
	// The pods were deleted: the next loops state no demand.
	for i := 1; i <= 30; i++ {
		if d := q.Decide(t0.Add(time.Duration(i)*10*time.Second), nil, 5); d.Released() != 0 {
			t.Fatalf("released %v with no demand", d.Release())
		}
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, o := range []Options{
		{NodesPerMinute: 0, Burst: 1, MaxInFlight: 1}, {NodesPerMinute: 1, Burst: 0, MaxInFlight: 1},
		{NodesPerMinute: 1, Burst: 1, MaxInFlight: 0}, {NodesPerMinute: 1, Burst: 1, MaxInFlight: 1, Interval: -time.Second},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	q := newQueue(t, 60, 100, 100)
	if err := q.SetOptions(Options{NodesPerMinute: 10, Burst: 5, MaxInFlight: 10}); err != nil {
		t.Fatal(err)
	}
	if d := q.Decide(t0, []Demand{{Group: "g", Count: 50}}, 0); d.Released() != 5 {
		t.Fatalf("released %d after lowering the burst to 5", d.Released())
	}
}

func TestRestartCountsInFlightAgainstTheBurst(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight int
		want     int
	}{
		{"fresh start, nothing in flight: the whole burst", 0, 20},
		{"restart mid-scale-up: the predecessor's burst is spent", 15, 5},
		{"more in flight than the burst: nothing at once", 40, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newQueue(t, 60, 20, 1000)
			// The first bucket: released now (a whole write's worth) or
			// kept for the next write.
			d := q.Decide(t0, []Demand{{Group: "g", Count: 100}}, tc.inFlight)
			if d.Released()+int(d.Tokens) != tc.want {
				t.Fatalf("released %d and kept %v at start with %d in flight, want %d in all", d.Released(), d.Tokens, tc.inFlight, tc.want)
			}
			// Refills at the rate from there: 10 s at 60/min is 10 nodes.
			kept := int(d.Tokens)
			if d := q.Decide(t0.Add(10*time.Second), []Demand{{Group: "g", Count: 100}}, tc.inFlight); d.Released()+int(d.Tokens) != kept+10 {
				t.Fatalf("released %d and kept %v after 10 s, want %d in all", d.Released(), d.Tokens, kept+10)
			}
		})
	}
}

func TestRefundGivesBackRefusedNodes(t *testing.T) {
	q := newQueue(t, 60, 10, 1000)
	if d := q.Decide(t0, []Demand{{Group: "g", Count: 10}}, 0); d.Released() != 10 {
		t.Fatalf("released %d", d.Released())
	}
	q.Refund(10) // the cloud refused them
	if d := q.Decide(t0, []Demand{{Group: "h", Count: 10}}, 0); d.Released() != 10 {
		t.Fatalf("released %d after a refund, want 10", d.Released())
	}
	q.Refund(1000)
	if q.Tokens() != 10 {
		t.Fatalf("tokens %v after a large refund, want the burst 10", q.Tokens())
	}
}

func TestGangAcrossGroupsReleasedTogether(t *testing.T) {
	q := newQueue(t, 60, 10, 1000)
	gang := []Demand{
		{Group: "gpu-a", Count: 6, Gang: "ns/train", Since: t0},
		{Group: "gpu-b", Count: 6, Gang: "ns/train", Since: t0},
	}
	// 12 nodes with a bucket of 10: the gang waits for a full bucket and
	// then goes whole, from both groups, paid back afterwards.
	d := q.Decide(t0, gang, 0)
	if d.Release()["gpu-a"] != 6 || d.Release()["gpu-b"] != 6 {
		t.Fatalf("released %v, want the whole gang: 6 + 6", d.Release())
	}
	if d.Tokens != -2 {
		t.Fatalf("tokens %v, want -2 (paid back)", d.Tokens)
	}
	// Not enough room in flight for the whole gang while something is in
	// flight: none of it goes, and the decision says why.
	q2 := newQueue(t, 60, 100, 10)
	if d := q2.Decide(t0, gang, 1); d.Released() != 0 || d.Limit != LimitInFlight || d.HeldGangs["ns/train"] != (HeldGang{Nodes: 12, Limit: LimitInFlight}) {
		t.Fatalf("released %v (limit %q, held %v) with room for 9 of 12", d.Release(), d.Limit, d.HeldGangs)
	}
}

// TestGangLargerThanTheInFlightCap: a 400-node training job under the
// default cap of 300 goes whole once nothing is in flight, and nothing
// else goes until its nodes are up (the cap is paid back).
func TestGangLargerThanTheInFlightCap(t *testing.T) {
	q := newQueue(t, 100, 20, 300)
	job := []Demand{{Group: "gpu-a", Count: 250, Gang: "ml/train", Since: t0}, {Group: "gpu-b", Count: 150, Gang: "ml/train", Since: t0}}
	other := Demand{Group: "cpu", Count: 5, Since: t0.Add(time.Minute)}
	// Older demand is in flight: the gang waits, and says why.
	d := q.Decide(t0, append(job, other), 20)
	if d.Release()["gpu-a"] != 0 || d.HeldGangs["ml/train"].Limit != LimitInFlight {
		t.Fatalf("released %v held %v with 20 in flight, want the gang held by the in-flight cap", d.Release(), d.HeldGangs)
	}
	// Nothing in flight, a full bucket: the whole gang, and nothing else.
	d = q.Decide(t0.Add(time.Minute), append(job, other), 0)
	if d.Release()["gpu-a"] != 250 || d.Release()["gpu-b"] != 150 || d.Release()["cpu"] != 0 {
		t.Fatalf("released %v, want the 400-node gang whole and nothing after it", d.Release())
	}
	if d.HeldGangs != nil {
		t.Fatalf("held %v after the release", d.HeldGangs)
	}
	// Its nodes are in flight (400 > 300): nothing goes until they are up.
	if d := q.Decide(t0.Add(10*time.Minute), []Demand{other}, 400); d.Released() != 0 || d.Limit != LimitInFlight {
		t.Fatalf("released %v (limit %q) while the gang's 400 nodes are in flight", d.Release(), d.Limit)
	}
}

// TestThousandNodeGangWithDefaults: with the defaults (100 nodes/min, a
// burst of 20, 300 in flight) a 1,000-node job goes whole, and the bucket
// and the cap are paid back before anything else goes.
func TestThousandNodeGangWithDefaults(t *testing.T) {
	q := newQueue(t, 100, 20, 300)
	job := []Demand{{Group: "gpu", Count: 1000, Gang: "ml/pretrain", Since: t0}}
	d := q.Decide(t0, job, 0)
	if d.Release()["gpu"] != 1000 || d.Tokens != -980 {
		t.Fatalf("released %v tokens %v, want the 1,000 nodes at once and 980 owed", d.Release(), d.Tokens)
	}
	web := []Demand{{Group: "cpu", Count: 5, Since: t0}}
	// 9 minutes later the debt is not paid back, and 250 nodes are still in flight.
	if d := q.Decide(t0.Add(9*time.Minute), web, 250); d.Released() != 0 {
		t.Fatalf("released %v while the gang is paid back", d.Release())
	}
	// Paid back (9.8 min at 100/min) and the gang's nodes up: the rest goes.
	if d := q.Decide(t0.Add(11*time.Minute), web, 0); d.Release()["cpu"] != 5 {
		t.Fatalf("released %v after the debt, want the 5 cpu nodes", d.Release())
	}
}

// The bucket holds at least a loop period's worth of the rate, so the
// configured rate is reached whatever the period; a stalled loop releases
// at most two periods' worth, and a quiet spell only the bucket's size.
func TestRateReachableWhateverTheLoopPeriod(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration // Options.Interval
		period   time.Duration // time between Decides
		// perMinute is the steady release per minute, maxLoop the most
		// released by one loop.
		perMinute, maxLoop int
	}{
		// Burst alone caps 10 s loops at 20 per loop: 120/min at a rate of 200.
		{"bucket of the burst only", 0, 10 * time.Second, 120, 20},
		{"10 s loops", 10 * time.Second, 10 * time.Second, 200, 34},
		{"loops slowed to 20 s", 10 * time.Second, 20 * time.Second, 200, 67},
		// Beyond twice the interval the bucket stops growing: 67 per 40 s.
		{"loops stalled to 40 s", 10 * time.Second, 40 * time.Second, 100, 67},
		{"2 s loops, the burst bounds", 2 * time.Second, 2 * time.Second, 200, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := New(Options{NodesPerMinute: 200, Burst: 20, MaxInFlight: 100000, Interval: tc.interval})
			if err != nil {
				t.Fatal(err)
			}
			type release struct {
				at time.Duration
				n  int
			}
			var rels []release
			maxLoop := 0
			for at := time.Duration(0); at <= 10*time.Minute; at += tc.period {
				d := q.Decide(t0.Add(at), []Demand{{Group: "cpu", Count: 100000, Since: t0}}, 0)
				rels = append(rels, release{at, d.Released()})
				maxLoop = max(maxLoop, d.Released())
				if d.Released() > int(q.Capacity())+1 {
					t.Fatalf("at %v released %d, more than the bucket's %v", at, d.Released(), q.Capacity())
				}
			}
			// After 5 minutes the release is steady: what the loops since
			// then released over the time they cover (the first window
			// holds the starting burst).
			steady, from := 0, time.Duration(0)
			for _, r := range rels {
				if r.at <= 5*time.Minute {
					from = r.at
					continue
				}
				steady += r.n
			}
			span := rels[len(rels)-1].at - from
			if got := int(float64(steady) / span.Minutes()); got < tc.perMinute-2 || got > tc.perMinute+2 {
				t.Errorf("steady release %d/min, want %d/min", got, tc.perMinute)
			}
			if maxLoop > tc.maxLoop || maxLoop < tc.maxLoop-1 {
				t.Errorf("most released by one loop %d, want %d", maxLoop, tc.maxLoop)
			}
			// No 60 s window holds more than the rate plus the bucket.
			for i, r := range rels {
				sum := 0
				for _, s := range rels[i:] {
					if s.at-r.at >= time.Minute {
						break
					}
					sum += s.n
				}
				if limit := 200 + int(2*200*tc.interval.Minutes()) + 20; sum > limit {
					t.Fatalf("%d released in the 60 s from %v, above %d", sum, r.at, limit)
				}
			}
		})
	}
	// After a quiet hour of 10 s loops the bucket holds a period's worth,
	// not an hour's.
	q, err := New(Options{NodesPerMinute: 200, Burst: 20, MaxInFlight: 100000, Interval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for at := time.Duration(0); at < time.Hour; at += 10 * time.Second {
		q.Decide(t0.Add(at), nil, 0)
	}
	if d := q.Decide(t0.Add(time.Hour), []Demand{{Group: "cpu", Count: 1000, Since: t0}}, 0); d.Released() != 33 {
		t.Fatalf("released %d after a quiet hour, want 33 (10 s of 200/min)", d.Released())
	}
}

// TestDeferredNodesGoInTheGroupsNextRelease: nodes the cloud deferred
// unsent (a scale set takes one capacity write at a time) keep their
// tokens spent and go, beyond the burst, in the group's next release,
// merged with what the rate gives it meanwhile: a scale set whose
// operation lasts 10 s still gets the rate's 120 nodes a minute in
// writes of 20, not the burst's 5 a write. Credit that its group's
// demand no longer wants goes back to the bucket.
func TestDeferredNodesGoInTheGroupsNextRelease(t *testing.T) {
	q := newQueue(t, 120, 5, 1000)
	demand := []Demand{{Group: "g", Count: 300}}
	now := t0
	d := q.Decide(now, demand, 0)
	sent := d.Released()
	// Operation in flight: each loop a second's release is deferred.
	for range 10 {
		now = now.Add(time.Second)
		d = q.Decide(now, demand, 0)
		q.Defer("g", d.Released(), now)
	}
	now = now.Add(time.Second)
	d = q.Decide(now, demand, 0)
	if got := d.Released(); got < 20 || got > 24 {
		t.Fatalf("released %d once the write is taken again, want the 22 nodes of 11 s at 120/min (not the burst 5)", got)
	}
	sent += d.Released()
	if total, most := sent, 5+int(120*now.Sub(t0).Minutes()); total > most {
		t.Fatalf("%d nodes released in %v, over the burst plus the rate (%d)", total, now.Sub(t0), most)
	}
	// Credit a group no longer wants goes back to the bucket, capped.
	q.Defer("g", 50, now)
	now = now.Add(time.Second)
	if d := q.Decide(now, []Demand{{Group: "g", Count: 3}}, 0); d.Released() != 3 {
		t.Fatalf("released %d of a demand of 3", d.Released())
	}
	if q.Deferred("g") != 0 || q.Tokens() > 5 {
		t.Fatalf("credit %d, tokens %v after the demand shrank: want 0 credit, tokens within the burst", q.Deferred("g"), q.Tokens())
	}
	// Credit of a group not stated waits, then expires.
	q.Defer("h", 10, now)
	if d := q.Decide(now.Add(30*time.Second), []Demand{{Group: "g", Count: 1}}, 0); d.Release()["h"] != 0 || q.Deferred("h") != 10 {
		t.Fatalf("credit of an unstated group: released %d, kept %d; want 0 and 10", d.Release()["h"], q.Deferred("h"))
	}
	if q.Decide(now.Add(2*time.Minute), nil, 0); q.Deferred("h") != 0 {
		t.Fatalf("credit %d after %v unstated, want 0", q.Deferred("h"), 2*time.Minute)
	}
}

// TestSeedTakesThePredecessorsMinuteFromTheFirstBucket: a new leader's
// first bucket is the burst less the nodes that joined in the minute
// before (its predecessor's releases): the two leaders' releases around
// a failover make no minute of more than the rate and the burst. Seed
// does nothing once the queue has decided.
func TestSeedTakesThePredecessorsMinuteFromTheFirstBucket(t *testing.T) {
	for _, c := range []struct {
		recent, want int
	}{{0, 5}, {2, 3}, {120, 0}} {
		q := newQueue(t, 120, 5, 1000)
		q.Seed(c.recent)
		if d := q.Decide(t0, []Demand{{Group: "g", Count: 100}}, 0); d.Released()+int(d.Tokens) != c.want {
			t.Errorf("%d nodes joined in the last minute: released %d and kept %v at once, want %d in all", c.recent, d.Released(), d.Tokens, c.want)
		}
	}
	q := newQueue(t, 120, 5, 1000)
	q.Decide(t0, nil, 0)
	q.Seed(120)
	if d := q.Decide(t0, []Demand{{Group: "g", Count: 100}}, 0); d.Released() != 5 {
		t.Errorf("Seed after the first Decide changed the bucket: released %d, want 5", d.Released())
	}
}

// TestSinglesNotStarvedByAStreamOfGangs: gangs go first every round, and a
// stream of them could keep the bucket just short of a single-node
// group's write's worth for good; after chunkPatience the group takes
// what fits.
func TestSinglesNotStarvedByAStreamOfGangs(t *testing.T) {
	q := newQueue(t, 60, 10, 1000)
	released := 0
	for i := range 60 {
		now := t0.Add(time.Duration(i) * time.Second)
		d := q.Decide(now, []Demand{
			{Group: "gang", Count: 1, Gang: fmt.Sprint("g", i), Since: now},
			{Group: "cpu", Count: 100, Since: t0},
		}, 0)
		released += d.Release()["cpu"]
	}
	if released == 0 {
		t.Fatal("single-node demand never released behind a stream of one-node gangs")
	}
}
