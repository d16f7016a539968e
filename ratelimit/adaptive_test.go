package ratelimit

import (
	"strings"
	"testing"
	"time"
)

func newAdaptive(t *testing.T, rate float64) *Adaptive {
	t.Helper()
	o := DefaultAdaptiveOptions()
	o.Min, o.Max, o.IncreaseStep, o.Interval = 10, 200, 10, 30*time.Second
	a, err := NewAdaptive(rate, o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func signals(s Signals) func() Signals { return func() Signals { return s } }

func TestAdaptiveDecisions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		slowStart  bool
		rate       float64
		limited    bool
		s          Signals
		want       float64
		wantReason string
	}{
		{"healthy and the rate holds demand back: additive increase", false, 100, true, Signals{Requests: 50, RejectedKnown: true}, 110, ReasonHealthy},
		{"healthy but idle: unchanged", false, 100, false, Signals{Requests: 50}, 100, ReasonSteady},
		{"healthy at the upper bound", false, 200, true, Signals{Requests: 50}, 200, ReasonAtMax},
		{"increase stops at the upper bound", false, 195, true, Signals{Requests: 50}, 200, ReasonHealthy},
		{"a 429 halves the rate", false, 100, true, Signals{Requests: 50, Throttled: 1}, 50, Reason429},
		{"flow-control rejections halve it", false, 100, true, Signals{Requests: 50, Rejected: 3, RejectedKnown: true}, 50, ReasonRejected},
		{"rejections unknown are not trouble", false, 100, true, Signals{Requests: 50, Rejected: 3}, 110, ReasonHealthy},
		{"5xx halves it", false, 100, false, Signals{Requests: 50, ServerErrors: 2}, 50, Reason5xx},
		{"more than 10% slow halves it", false, 100, true, Signals{Requests: 50, Slow: 6}, 50, ReasonLatency},
		{"10% slow exactly is still healthy", false, 100, true, Signals{Requests: 50, Slow: 5}, 110, ReasonHealthy},
		{"too few requests to judge latency", false, 100, true, Signals{Requests: 4, Slow: 4}, 110, ReasonHealthy},
		{"the cut stops at the lower bound", false, 15, true, Signals{Requests: 50, Throttled: 9}, 10, Reason429},
		{"429 wins over the other signs", false, 100, true, Signals{Requests: 50, Throttled: 1, ServerErrors: 5, Slow: 40}, 50, Reason429},
		{"slow start: healthy and limited doubles", true, 40, true, Signals{Requests: 50}, 80, ReasonHealthy},
		{"slow start: doubling stops at the upper bound", true, 150, true, Signals{Requests: 50}, 200, ReasonHealthy},
		{"slow start: idle is unchanged", true, 100, false, Signals{Requests: 50}, 100, ReasonSteady},
		{"slow start: latency halves it", true, 100, true, Signals{Requests: 50, Slow: 6}, 50, ReasonLatency},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAdaptive(t, tc.rate)
			a.slowStart = tc.slowStart
			if _, ok := a.Update(t0, false, signals(Signals{})); ok {
				t.Fatal("the first update only starts the period")
			}
			c, ok := a.Update(t0.Add(30*time.Second), tc.limited, signals(tc.s))
			if !ok {
				t.Fatal("no decision after a full interval")
			}
			if c.From != tc.rate || c.To != tc.want || c.Reason != tc.wantReason {
				t.Fatalf("change %+v, want %v -> %v (%s)", c, tc.rate, tc.want, tc.wantReason)
			}
			if r, why := a.Rate(); r != tc.want || why != tc.wantReason {
				t.Fatalf("Rate() = %v %q", r, why)
			}
			if tc.wantReason != ReasonHealthy && tc.wantReason != ReasonSteady && tc.wantReason != ReasonAtMax && a.SlowStart() {
				t.Fatal("slow start outlived trouble")
			}
		})
	}
}

func TestAdaptiveOncePerIntervalAndSignalsAccumulate(t *testing.T) {
	a := newAdaptive(t, 100)
	a.slowStart = false
	take := func() Signals { return Signals{Requests: 10} }
	a.Update(t0, false, take)
	for i := 1; i < 3; i++ { // 10 s loops inside the 30 s interval
		if _, ok := a.Update(t0.Add(time.Duration(i)*10*time.Second), i == 1, take); ok {
			t.Fatalf("decision %d s into the interval", i*10)
		}
	}
	// The rate held demand back in one loop of the interval: that counts;
	// the interval's signals add up (three loops after the first).
	c, ok := a.Update(t0.Add(30*time.Second), false, take)
	if !ok || c.To != 110 || c.Signals.Requests != 30 {
		t.Fatalf("change %+v ok=%v, want an increase to 110 on 30 requests", c, ok)
	}
	// The next interval starts with no memory of the last one being limited.
	if c, _ := a.Update(t0.Add(60*time.Second), false, take); c.To != 110 || c.Reason != ReasonSteady {
		t.Fatalf("change %+v, want steady at 110", c)
	}
}

// A burst on a healthy API server: with 1 s loops, the rate held back all
// along and no trouble, the rate doubles every 5 s (a sixth of the 30 s
// interval) from the first loop's period on, and reaches its upper bound
// within the first 15 s (additive steps of 10 every 30 s would take 9
// minutes from 20).
func TestAdaptiveSlowStartReachesMaxWithinAMinute(t *testing.T) {
	for _, tc := range []struct {
		start float64
		want  map[int]float64 // seconds after the first loop: the rate
	}{
		{20, map[int]float64{4: 20, 5: 40, 9: 40, 10: 80, 15: 160, 19: 160, 20: 200, 60: 200}},
		{100, map[int]float64{4: 100, 5: 200, 9: 200, 10: 200, 60: 200}},
	} {
		a := newAdaptive(t, tc.start)
		for s := 0; s <= 60; s++ {
			a.Update(t0.Add(time.Duration(s)*time.Second), true, signals(Signals{Requests: 5}))
			if want, ok := tc.want[s]; ok {
				if r, _ := a.Rate(); r != want {
					t.Fatalf("from %v: rate %v after %d s, want %v", tc.start, r, s, want)
				}
			}
		}
	}
}

// Trouble the API server states outright cuts the rate in the loop that
// sees it, once per burst (a third of the interval), and ends slow start.
func TestAdaptiveCutsAtOnce(t *testing.T) {
	a := newAdaptive(t, 100)
	a.Update(t0, true, signals(Signals{}))
	steps := []struct {
		at      time.Duration
		s       Signals
		ok      bool
		rate    float64
		comment string
	}{
		{2 * time.Second, Signals{Requests: 5, Throttled: 1}, true, 50, "a 429 two seconds in: cut now"},
		{3 * time.Second, Signals{Requests: 5, Throttled: 2}, false, 50, "the same burst a second later: no second cut"},
		{9 * time.Second, Signals{Requests: 5}, false, 50, "healthy, inside the interval"},
		{14 * time.Second, Signals{Requests: 5, ServerErrors: 1}, true, 25, "5xx after the cooldown: cut again"},
		{44 * time.Second, Signals{Requests: 5}, true, 35, "a healthy interval after: +10, no more doubling"},
	}
	for _, st := range steps {
		c, ok := a.Update(t0.Add(st.at), true, signals(st.s))
		if r, _ := a.Rate(); ok != st.ok || r != st.rate {
			t.Fatalf("%s: change %+v ok=%v rate %v, want ok=%v rate %v", st.comment, c, ok, r, st.ok, st.rate)
		}
	}
	if a.SlowStart() {
		t.Fatal("still in slow start after trouble")
	}
}

func TestAdaptiveRecoversAfterTrouble(t *testing.T) {
	a := newAdaptive(t, 160)
	now := t0
	a.Update(now, false, signals(Signals{}))
	var rates []float64
	for i, s := range []Signals{{Throttled: 1}, {Throttled: 1}, {}, {}, {}} {
		now = now.Add(30 * time.Second)
		c, ok := a.Update(now, true, signals(s))
		if !ok {
			t.Fatalf("interval %d: no decision", i)
		}
		rates = append(rates, c.To)
	}
	want := []float64{80, 40, 50, 60, 70}
	for i := range want {
		if rates[i] != want[i] {
			t.Fatalf("rates %v, want %v (halved twice, then +10 per healthy interval)", rates, want)
		}
	}
}

func TestAdaptiveOptionsValidation(t *testing.T) {
	base := DefaultAdaptiveOptions()
	for _, tc := range []struct {
		flag string
		mut  func(*AdaptiveOptions)
		rate float64
	}{
		{"--node-addition-rate-min", func(o *AdaptiveOptions) { o.Min = 0 }, 100},
		{"--node-addition-rate-max", func(o *AdaptiveOptions) { o.Max = 5 }, 100},
		{"--node-addition-rate:", func(*AdaptiveOptions) {}, 5000},
		{"--node-addition-rate-decrease-factor", func(o *AdaptiveOptions) { o.DecreaseFactor = 1 }, 100},
		{"--node-addition-rate-increase-step", func(o *AdaptiveOptions) { o.IncreaseStep = 0 }, 100},
		{"--node-addition-adaptive-interval", func(o *AdaptiveOptions) { o.Interval = 0 }, 100},
		{"--node-addition-latency-threshold", func(o *AdaptiveOptions) { o.LatencyThreshold = -time.Second }, 100},
	} {
		o := base
		tc.mut(&o)
		_, err := NewAdaptive(tc.rate, o)
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: error %v, want one naming the flag", tc.flag, err)
		}
	}
	if _, err := NewAdaptive(100, base); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
}
