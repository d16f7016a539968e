package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// The defaults: 100 nodes a minute, a burst of 20, 300 nodes in flight,
// 10 s loops.
var defaults = Options{NodesPerMinute: 100, Burst: 20, MaxInFlight: 300, Interval: 10 * time.Second}

// headWait is the longest the head — the first gang in line that cannot be
// released — waits from the Decide that first held it to the Decide that
// releases it: everything in flight then is up within ready, nothing is
// released behind it meanwhile, so in flight reaches 0 and the bucket
// fills from tokens to the min(nodes, burst) the gang needs; the first
// loop after that releases it.
//
//	W = max(L, (min(N, B) − τ) / R) + P
func headWait(o Options, ready, period time.Duration, nodes int, tokens float64) time.Duration {
	fill := time.Duration(math.Ceil((float64(min(nodes, o.Burst)) - tokens) / o.NodesPerMinute * float64(time.Minute)))
	return max(ready, fill) + period
}

// headWaitAfter is headWait in the worst case for the bucket: it is empty,
// or owes what a gang of prev nodes larger than the burst, released just
// before, took beyond it (τ ≥ −max(0, prev − B)).
//
//	W = max(L, max(B, N_prev) / R) + P   (N_prev = 0 if none)
func headWaitAfter(o Options, ready, period time.Duration, nodes, prev int) time.Duration {
	return headWait(o, ready, period, nodes, -float64(max(0, prev-o.Burst)))
}

// simGang is a gang demanded from at until it is released, from its own
// group.
type simGang struct {
	name  string
	nodes int
	at    time.Duration
}

func (g simGang) group() string { return "gpu-" + g.name }

// simulation runs the queue the way the loop does: every period it states
// the demand (the pending single-node pods, one group, and each gang not
// released yet) and the nodes in flight, and nodes released come up after
// ready (or inFlightFor, when set).
type simulation struct {
	opts   Options
	period time.Duration
	ready  time.Duration
	// inFlightFor, when set, is how long a release stays in flight (at
	// most ready); ready otherwise.
	inFlightFor func() time.Duration
	// singleEvery is the time between single-node pods; 0: none.
	singleEvery time.Duration
	gangs       []simGang
	until       time.Duration
}

// gangRun is what became of one gang.
type gangRun struct {
	simGang
	// head is the loop that first held it as the head, with the bucket's
	// fill after that Decide; released is its release (-1: never).
	head       time.Duration
	headTokens float64
	released   time.Duration
}

type simResult struct {
	gangs map[string]*gangRun
	// overtaken are the releases behind a held head.
	overtaken []string
	// singles is the single-node demand released per loop, by time.
	singles map[time.Duration]int
	// singleWait is the longest a single-node pod waited.
	singleWait time.Duration
	maxFlight  int
}

func (s simulation) run(t *testing.T) simResult {
	t.Helper()
	q, err := New(s.opts)
	if err != nil {
		t.Fatal(err)
	}
	gangs := append([]simGang(nil), s.gangs...)
	sort.SliceStable(gangs, func(i, j int) bool {
		if gangs[i].at != gangs[j].at {
			return gangs[i].at < gangs[j].at
		}
		return gangs[i].name < gangs[j].name
	})
	res := simResult{gangs: map[string]*gangRun{}, singles: map[time.Duration]int{}}
	for _, g := range gangs {
		res.gangs[g.name] = &gangRun{simGang: g, head: -1, released: -1}
	}
	type batch struct {
		up time.Duration
		n  int
	}
	var flight []batch
	singlesOut := 0
	for at := time.Duration(0); at <= s.until; at += s.period {
		inFlight := 0
		kept := flight[:0]
		for _, b := range flight {
			if b.up > at {
				inFlight += b.n
				kept = append(kept, b)
			}
		}
		flight = kept
		var ds []Demand
		arrived := 0
		if s.singleEvery > 0 {
			arrived = int(at / s.singleEvery)
		}
		if pending := arrived - singlesOut; pending > 0 {
			// The oldest pending pod is the first not released.
			ds = append(ds, Demand{Group: "cpu", Count: pending, Since: t0.Add(time.Duration(singlesOut+1) * s.singleEvery)})
		}
		var waiting []*gangRun
		for _, g := range gangs {
			if r := res.gangs[g.name]; g.at <= at && r.released < 0 {
				ds = append(ds, Demand{Group: g.group(), Count: g.nodes, Gang: g.name, Since: t0.Add(g.at)})
				waiting = append(waiting, r)
			}
		}
		d := q.Decide(t0.Add(at), ds, inFlight)
		rel := d.Release()
		released := d.Released()
		var head *gangRun
		for _, r := range waiting {
			switch n := rel[r.group()]; {
			case n == 0 && head == nil:
				head = r
				if r.head < 0 {
					r.head, r.headTokens = at, d.Tokens
				}
				if _, ok := d.HeldGangs[r.name]; !ok {
					t.Errorf("at %v: gang %s neither released nor held", at, r.name)
				}
			case n == 0:
			case n != r.nodes:
				t.Errorf("at %v: gang %s released %d of its %d nodes", at, r.name, n, r.nodes)
			case head != nil:
				res.overtaken = append(res.overtaken, fmt.Sprintf("at %v gang %s (%d nodes) released while gang %s waits", at, r.name, n, head.name))
				fallthrough
			default:
				r.released = at
				if r.head < 0 {
					r.head = at
				}
			}
		}
		if n := rel["cpu"]; n > 0 {
			if head != nil {
				res.overtaken = append(res.overtaken, fmt.Sprintf("at %v %d single nodes released while gang %s waits", at, n, head.name))
			}
			// The oldest pending pod, which arrived at (singlesOut+1)·every,
			// goes first.
			res.singleWait = max(res.singleWait, at-time.Duration(singlesOut+1)*s.singleEvery)
			singlesOut += n
			res.singles[at] = n
		}
		if released > 0 {
			if inFlight+released > s.opts.MaxInFlight && (inFlight > 0 || len(rel) > 1) {
				t.Errorf("at %v: %d released with %d in flight, above the cap of %d and not one gang alone", at, released, inFlight, s.opts.MaxInFlight)
			}
			up := s.ready
			if s.inFlightFor != nil {
				up = s.inFlightFor()
			}
			flight = append(flight, batch{at + up, released})
		}
		res.maxFlight = max(res.maxFlight, inFlight+released)
	}
	return res
}

// checkHeads asserts that each gang was released, and within headWait of
// becoming the head with the bucket it then found.
func (s simulation) checkHeads(t *testing.T, res simResult) {
	t.Helper()
	for _, g := range s.gangs {
		r := res.gangs[g.name]
		if r.released < 0 {
			t.Errorf("gang %s (%d nodes, from %v) not released in %v", g.name, g.nodes, g.at, s.until)
			continue
		}
		if w := headWait(s.opts, s.ready, s.period, g.nodes, r.headTokens); r.released-r.head > w {
			t.Errorf("gang %s released %v after becoming the head with %.1f tokens, above the bound %v", g.name, r.released-r.head, r.headTokens, w)
		}
	}
}

// TestGangsAreNotStarvedBySingles: gangs in competition with a steady
// stream of single-node demand (the tracker's cases, nodes up 100 s after
// they are requested) are released in their turn, within the bound, and
// nothing is released behind a held gang.
func TestGangsAreNotStarvedBySingles(t *testing.T) {
	const ready, period = 100 * time.Second, 10 * time.Second
	w := func(nodes, prev int) time.Duration { return headWaitAfter(defaults, ready, period, nodes, prev) }
	warm := 5 * time.Minute // singles run alone first, to a steady state
	for _, tc := range []struct {
		name        string
		singleEvery time.Duration
		gangs       []simGang
		// within is, per gang, the bound on its wait from its arrival to
		// its release: the waits of the heads before it and its own.
		within map[string]time.Duration
	}{
		{
			// Singles at 100/min keep ~167 nodes in flight: 133 free, never
			// the 200 the gang needs unless they wait. W = max(100 s, 20/100
			// min) + 10 s = 110 s.
			name:        "a: 200-node gang, 300 cap, singles at 100 nodes/min",
			singleEvery: 600 * time.Millisecond,
			gangs:       []simGang{{"train", 200, warm}},
			within:      map[string]time.Duration{"train": w(200, 0)},
		},
		{
			// Larger than the cap: it needs nothing in flight, which one
			// node every 10 s never leaves; waiting behind it, the singles
			// drain in 100 s. W = 110 s.
			name:        "b: 400-node gang above the 300 cap, singles one node every 10 s",
			singleEvery: 10 * time.Second,
			gangs:       []simGang{{"train", 400, warm}},
			within:      map[string]time.Duration{"train": w(400, 0)},
		},
		{
			// Each needs more than half the cap: never both in flight. The
			// second waits for the first's 200 nodes and for the 180 tokens
			// it owes: 110 s, then max(100 s, 200/100 min) + 10 s = 130 s.
			name:        "c: two gangs over half the cap, singles at 100 nodes/min",
			singleEvery: 600 * time.Millisecond,
			gangs:       []simGang{{"first", 200, warm}, {"second", 200, warm + period}},
			within:      map[string]time.Duration{"first": w(200, 0), "second": w(200, 0) + w(200, 200)},
		},
		{
			name:  "c: two gangs over half the cap, nothing else",
			gangs: []simGang{{"first", 250, warm}, {"second", 160, warm}},
			// The first goes at once: 0; the second after its 250 nodes.
			within: map[string]time.Duration{"first": 0, "second": w(160, 250)},
		},
		{
			// Three in line, the middle one above the cap.
			name:        "c: three gangs over half the cap, one above it, singles one node every 10 s",
			singleEvery: 10 * time.Second,
			gangs:       []simGang{{"a", 180, warm}, {"b", 350, warm + period}, {"c", 160, warm + 2*period}},
			within: map[string]time.Duration{
				"a": 0,
				"b": w(350, 180),
				"c": w(350, 180) + w(160, 350),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := simulation{opts: defaults, period: period, ready: ready, singleEvery: tc.singleEvery, gangs: tc.gangs, until: time.Hour}
			res := s.run(t)
			s.checkHeads(t, res)
			for _, g := range tc.gangs {
				r := res.gangs[g.name]
				if r.released < 0 {
					continue // reported by checkHeads
				}
				t.Logf("gang %s (%d nodes): arrived %v, head %v with %.1f tokens, released %v", g.name, g.nodes, g.at, r.head, r.headTokens, r.released)
				if wait := r.released - g.at; wait > tc.within[g.name] {
					t.Errorf("gang %s (%d nodes) waited %v, above the bound %v", g.name, g.nodes, wait, tc.within[g.name])
				}
			}
			if len(res.overtaken) > 0 {
				t.Errorf("%d releases behind a held gang, first: %s", len(res.overtaken), res.overtaken[0])
			}
			// Oldest first.
			for i := 1; i < len(tc.gangs); i++ {
				a, b := res.gangs[tc.gangs[i-1].name], res.gangs[tc.gangs[i].name]
				if a.released >= 0 && b.released >= 0 && b.released < a.released {
					t.Errorf("gang %s released at %v before the older %s at %v", b.name, b.released, a.name, a.released)
				}
			}
		})
	}
}

// TestGangsNeverWaitBeyondTheBound: random gangs (some above the burst,
// some above the cap) in random single-node traffic, nodes up after a
// random time of at most 100 s: every gang is released, each within the
// bound of becoming the head, and nothing behind a held head is released.
func TestGangsNeverWaitBeyondTheBound(t *testing.T) {
	const ready, period = 100 * time.Second, 10 * time.Second
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 7))
			s := simulation{opts: defaults, period: period, ready: ready, until: 3 * time.Hour,
				singleEvery: []time.Duration{0, 400 * time.Millisecond, 600 * time.Millisecond, 3 * time.Second, 10 * time.Second}[rnd.IntN(5)],
				inFlightFor: func() time.Duration { return ready/2 + time.Duration(rnd.Int64N(int64(ready/2)+1)) }}
			for i := range 2 + rnd.IntN(7) {
				s.gangs = append(s.gangs, simGang{name: fmt.Sprint("g", i), nodes: 2 + rnd.IntN(450), at: time.Duration(rnd.Int64N(int64(30 * time.Minute)))})
			}
			res := s.run(t)
			s.checkHeads(t, res)
			if len(res.overtaken) > 0 {
				t.Errorf("%d releases behind a held gang, first: %s", len(res.overtaken), res.overtaken[0])
			}
		})
	}
}

// TestSinglesAloneAtTheRate: with no gang, single-node demand goes as
// before: at the rate when it comes faster, within a loop when slower.
func TestSinglesAloneAtTheRate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		singleEvery time.Duration
		perMinute   int           // steady release over the last 20 minutes
		maxWait     time.Duration // the longest a pod waits; 0: unbounded
	}{
		{"300 nodes/min, above the rate", 200 * time.Millisecond, 100, 0},
		{"100 nodes/min, the rate", 600 * time.Millisecond, 100, 10 * time.Second},
		{"60 nodes/min, below the rate", time.Second, 60, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := simulation{opts: defaults, period: 10 * time.Second, ready: 100 * time.Second, singleEvery: tc.singleEvery, until: 30 * time.Minute}
			res := s.run(t)
			n := 0
			for at, k := range res.singles {
				if at > 10*time.Minute {
					n += k
				}
			}
			if got := n / 20; got < tc.perMinute-1 || got > tc.perMinute+1 {
				t.Errorf("released %d/min, want %d/min", got, tc.perMinute)
			}
			if tc.maxWait > 0 && res.singleWait > tc.maxWait {
				t.Errorf("a pod waited %v, want at most %v", res.singleWait, tc.maxWait)
			}
			if res.maxFlight > defaults.MaxInFlight {
				t.Errorf("%d in flight, above the cap", res.maxFlight)
			}
		})
	}
}

// TestHeadOfTheLine: what a held gang holds back, and what keeps its place.
func TestHeadOfTheLine(t *testing.T) {
	gang := func(name string, n int, since time.Time) Demand {
		return Demand{Group: "gpu-" + name, Count: n, Gang: name, Since: since}
	}
	cpu := Demand{Group: "cpu", Count: 10, Since: t0.Add(-time.Hour)}
	warm := Demand{Group: "warm", Count: 10, Class: Balloon, Since: t0.Add(-time.Hour)}
	type step struct {
		at       time.Duration
		demands  []Demand
		inFlight int
		refund   int // refused by the cloud after the step
		release  map[string]int
		held     map[string]HeldGang
		limit    Limit
	}
	for _, tc := range []struct {
		name  string
		opts  Options // zero: a large bucket, 300 in flight
		steps []step
	}{
		{"single-node demand, even older, waits behind a held gang, then goes after it", Options{}, []step{
			{0, []Demand{gang("a", 200, t0), cpu}, 150, 0, map[string]int{}, map[string]HeldGang{"a": {200, LimitInFlight}}, LimitInFlight},
			{10 * time.Second, []Demand{gang("a", 200, t0), cpu}, 90, 0, map[string]int{"gpu-a": 200, "cpu": 10}, nil, NotLimited},
		}},
		{"a later gang that would fit waits behind the head, held for the head's reason", Options{}, []step{
			{0, []Demand{gang("a", 200, t0), gang("b", 50, t0.Add(time.Second))}, 150, 0, map[string]int{},
				map[string]HeldGang{"a": {200, LimitInFlight}, "b": {50, LimitInFlight}}, LimitInFlight},
		}},
		{"a head held by the rate holds single-node demand too", Options{NodesPerMinute: 60, Burst: 20, MaxInFlight: 300}, []step{
			// 20 tokens: 5 + 14, one left; a second later, 2 of the 5 the
			// next gang needs.
			{0, []Demand{gang("a", 5, t0), {Group: "cpu", Count: 14, Since: t0}}, 0, 0, map[string]int{"gpu-a": 5, "cpu": 14}, nil, NotLimited},
			{time.Second, []Demand{gang("b", 5, t0), cpu}, 19, 0, map[string]int{}, map[string]HeldGang{"b": {5, LimitRate}}, LimitRate},
			{4 * time.Second, []Demand{gang("b", 5, t0), cpu}, 19, 0, map[string]int{"gpu-b": 5}, nil, LimitRate},
		}},
		{"a gang first seen later does not overtake the head, whatever its pods' age", Options{}, []step{
			{0, []Demand{gang("a", 200, t0)}, 150, 0, map[string]int{}, map[string]HeldGang{"a": {200, LimitInFlight}}, LimitInFlight},
			{10 * time.Second, []Demand{gang("a", 200, t0), gang("b", 100, t0.Add(-time.Hour))}, 150, 0, map[string]int{},
				map[string]HeldGang{"a": {200, LimitInFlight}, "b": {100, LimitInFlight}}, LimitInFlight},
			{20 * time.Second, []Demand{gang("a", 200, t0), gang("b", 100, t0.Add(-time.Hour))}, 100, 0, map[string]int{"gpu-a": 200},
				map[string]HeldGang{"b": {100, LimitInFlight}}, LimitInFlight},
		}},
		{"a retry round of the same loop keeps the head held; a later loop that does not restate it cancels it", Options{}, []step{
			{0, []Demand{gang("a", 200, t0), cpu}, 150, 0, map[string]int{}, map[string]HeldGang{"a": {200, LimitInFlight}}, LimitInFlight},
			{0, []Demand{cpu}, 150, 0, map[string]int{}, nil, LimitInFlight},
			{10 * time.Second, []Demand{cpu}, 150, 0, map[string]int{"cpu": 10}, nil, NotLimited},
		}},
		{"a released gang the cloud refused comes back as new demand, behind the head", Options{}, []step{
			{0, []Demand{gang("a", 100, t0.Add(-time.Hour)), gang("b", 250, t0)}, 0, 100, map[string]int{"gpu-a": 100},
				map[string]HeldGang{"b": {250, LimitInFlight}}, LimitInFlight},
			{10 * time.Second, []Demand{gang("a", 100, t0.Add(-time.Hour)), gang("b", 250, t0)}, 0, 0, map[string]int{"gpu-b": 250},
				map[string]HeldGang{"a": {100, LimitInFlight}}, LimitInFlight},
		}},
		{"workload goes before a held balloon gang; balloons wait behind a held workload gang", Options{}, []step{
			{0, []Demand{{Group: "gpu-w", Count: 200, Gang: "w", Class: Balloon, Since: t0}, cpu}, 150, 0, map[string]int{"cpu": 10},
				map[string]HeldGang{"w": {200, LimitInFlight}}, LimitInFlight},
			{10 * time.Second, []Demand{gang("a", 200, t0), warm}, 150, 0, map[string]int{}, map[string]HeldGang{"a": {200, LimitInFlight}}, LimitInFlight},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			if o == (Options{}) {
				o = Options{NodesPerMinute: 100, Burst: 1000, MaxInFlight: 300}
			}
			q, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				d := q.Decide(t0.Add(s.at), s.demands, s.inFlight)
				if got := d.Release(); !sameMap(got, s.release) {
					t.Errorf("step %d: released %v, want %v", i, got, s.release)
				}
				if !sameMap(d.HeldGangs, s.held) {
					t.Errorf("step %d: held %v, want %v", i, d.HeldGangs, s.held)
				}
				if d.Limit != s.limit {
					t.Errorf("step %d: limit %q, want %q", i, d.Limit, s.limit)
				}
				queued := 0
				for _, byClass := range d.Queued {
					for _, n := range byClass {
						queued += n
					}
				}
				want := -d.Released()
				for _, x := range s.demands {
					want += x.Count
				}
				if queued != want {
					t.Errorf("step %d: queued %v, want everything not released (%d)", i, d.Queued, want)
				}
				q.Refund(s.refund)
			}
		})
	}
}

func sameMap[K, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
