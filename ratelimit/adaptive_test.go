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
		rate       float64
		limited    bool
		s          Signals
		want       float64
		wantReason string
	}{
		{"healthy and the rate holds demand back: additive increase", 100, true, Signals{Requests: 50, RejectedKnown: true}, 110, ReasonHealthy},
		{"healthy but idle: unchanged", 100, false, Signals{Requests: 50}, 100, ReasonSteady},
		{"healthy at the upper bound", 200, true, Signals{Requests: 50}, 200, ReasonAtMax},
		{"increase stops at the upper bound", 195, true, Signals{Requests: 50}, 200, ReasonHealthy},
		{"a 429 halves the rate", 100, true, Signals{Requests: 50, Throttled: 1}, 50, Reason429},
		{"flow-control rejections halve it", 100, true, Signals{Requests: 50, Rejected: 3, RejectedKnown: true}, 50, ReasonRejected},
		{"rejections unknown are not trouble", 100, true, Signals{Requests: 50, Rejected: 3}, 110, ReasonHealthy},
		{"5xx halves it", 100, false, Signals{Requests: 50, ServerErrors: 2}, 50, Reason5xx},
		{"more than 10% slow halves it", 100, true, Signals{Requests: 50, Slow: 6}, 50, ReasonLatency},
		{"10% slow exactly is still healthy", 100, true, Signals{Requests: 50, Slow: 5}, 110, ReasonHealthy},
		{"too few requests to judge latency", 100, true, Signals{Requests: 4, Slow: 4}, 110, ReasonHealthy},
		{"the cut stops at the lower bound", 15, true, Signals{Requests: 50, Throttled: 9}, 10, Reason429},
		{"429 wins over the other signs", 100, true, Signals{Requests: 50, Throttled: 1, ServerErrors: 5, Slow: 40}, 50, Reason429},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAdaptive(t, tc.rate)
			if _, ok := a.Update(t0, false, signals(Signals{})); ok {
				t.Fatal("the first update only starts the interval")
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
		})
	}
}

func TestAdaptiveOncePerIntervalAndSignalsAccumulate(t *testing.T) {
	a := newAdaptive(t, 100)
	taken := 0
	take := func() Signals { taken++; return Signals{Requests: 10} }
	a.Update(t0, false, take)
	for i := 1; i < 3; i++ { // 10 s loops inside the 30 s interval
		if _, ok := a.Update(t0.Add(time.Duration(i)*10*time.Second), i == 1, take); ok {
			t.Fatalf("decision %d s into the interval", i*10)
		}
	}
	if taken != 1 {
		t.Fatalf("signals taken %d times inside the interval, want once at the start", taken)
	}
	// The rate held demand back in one loop of the interval: that counts.
	c, ok := a.Update(t0.Add(30*time.Second), false, take)
	if !ok || c.To != 110 {
		t.Fatalf("change %+v ok=%v, want an increase to 110", c, ok)
	}
	// The next interval starts with no memory of the last one being limited.
	if c, _ := a.Update(t0.Add(60*time.Second), false, take); c.To != 110 || c.Reason != ReasonSteady {
		t.Fatalf("change %+v, want steady at 110", c)
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
		{"--node-addition-rate:", func(*AdaptiveOptions) {}, 500},
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
