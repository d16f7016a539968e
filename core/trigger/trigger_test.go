package trigger

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/utils/clock"
)

// The tests run in a synctest bubble: the driver's clock.RealClock reads
// the bubble's fake time, which moves only when every goroutine waits.

func defaultTiming() Timing {
	return Timing{Interval: 10 * time.Second, Events: true, MinGap: time.Second, BatchIdle: time.Second, BatchMax: 10 * time.Second}
}

type run struct {
	at time.Duration // since the bubble's start
	r  Reason
}

func (r run) String() string { return fmt.Sprintf("%v@%v", r.r, r.at) }

// harness runs a Driver whose loop records when it started and why, and
// how many loops ran at once.
type harness struct {
	t      *testing.T
	t0     time.Time
	d      *Driver
	timing atomic.Pointer[Timing]
	// loopTime is how long each loop takes.
	loopTime time.Duration
	// onLoop, when set, runs at the start of loop i (from 0).
	onLoop func(i int, r Reason)

	mu          sync.Mutex
	runs        []run
	inFlight    int
	maxInFlight int

	cancel context.CancelFunc
	done   chan struct{}
}

func newHarness(t *testing.T, tm Timing) *harness {
	h := &harness{t: t, t0: time.Now(), done: make(chan struct{})}
	h.timing.Store(&tm)
	h.d = New(clock.RealClock{}, func() Timing { return *h.timing.Load() })
	return h
}

func (h *harness) start() *harness {
	ctx, cancel := context.WithCancel(h.t.Context())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		h.d.Run(ctx, h.loop)
	}()
	return h
}

func (h *harness) loop(_ context.Context, r Reason) {
	h.mu.Lock()
	i := len(h.runs)
	h.runs = append(h.runs, run{time.Since(h.t0), r})
	h.inFlight++
	h.maxInFlight = max(h.maxInFlight, h.inFlight)
	h.mu.Unlock()
	if h.onLoop != nil {
		h.onLoop(i, r)
	}
	time.Sleep(h.loopTime)
	h.mu.Lock()
	h.inFlight--
	h.mu.Unlock()
}

func (h *harness) setTiming(f func(*Timing)) {
	tm := *h.timing.Load()
	f(&tm)
	h.timing.Store(&tm)
}

// until sleeps until offset since the bubble's start.
func (h *harness) until(offset time.Duration) {
	time.Sleep(time.Until(h.t0.Add(offset)))
}

// stop ends Run and returns the loops that ran.
func (h *harness) stop() []run {
	h.cancel()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]run(nil), h.runs...)
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func sameRuns(t *testing.T, got, want []run) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("loops\n got %v\nwant %v", got, want)
	}
}

// TestFloor: with no event, loops start every scan interval from the
// previous start; a loop longer than the interval is followed at once by
// the next, never overlapped.
func TestFloor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		loopTime time.Duration
		until    time.Duration
		want     []run
	}{
		{"instant loops", 0, ms(35000), []run{{0, Periodic}, {ms(10000), Periodic}, {ms(20000), Periodic}, {ms(30000), Periodic}}},
		{"loops of 2s", ms(2000), ms(35000), []run{{0, Periodic}, {ms(10000), Periodic}, {ms(20000), Periodic}, {ms(30000), Periodic}}},
		{"loops longer than the interval", ms(12000), ms(40000), []run{{0, Periodic}, {ms(12000), Periodic}, {ms(24000), Periodic}, {ms(36000), Periodic}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, defaultTiming())
				h.loopTime = tc.loopTime
				h.start()
				h.until(tc.until)
				sameRuns(t, h.stop(), tc.want)
				if h.maxInFlight != 1 {
					t.Fatalf("%d loops at once", h.maxInFlight)
				}
			})
		})
	}
}

// TestPodBatching: unschedulable pods wake a loop once they stop coming
// for the idle duration, or the max duration after the batch's first pod,
// whichever comes first; a loop that starts for any reason takes the
// batch (it sees those pods), and later pods open a new one.
func TestPodBatching(t *testing.T) {
	type pods struct{ from, every, to time.Duration }
	for _, tc := range []struct {
		name   string
		timing func(*Timing)
		pods   []pods
		until  time.Duration
		want   []run
	}{
		{
			// A gang's 20 pods 100 ms apart: one loop, 1 s after the last.
			name: "burst fires once after the quiet period",
			pods: []pods{{ms(1000), ms(100), ms(2900)}}, until: ms(15000),
			want: []run{{0, Periodic}, {ms(3900), Pods}, {ms(13900), Periodic}},
		},
		{
			name: "one pod",
			pods: []pods{{ms(1500), ms(100), ms(1500)}}, until: ms(5000),
			want: []run{{0, Periodic}, {ms(2500), Pods}},
		},
		{
			// Never quiet for 1 s: each batch closes 10 s after its first
			// pod; the pods after a loop's start open the next batch; the
			// last batch ends on its quiet second.
			name:   "steady trickle fires at the max duration",
			timing: func(tm *Timing) { tm.Interval = time.Minute },
			pods:   []pods{{ms(1100), ms(300), ms(39800)}}, until: ms(45000),
			want: []run{{0, Periodic}, {ms(11100), Pods}, {ms(21300), Pods}, {ms(31500), Pods}, {ms(40800), Pods}},
		},
		{
			name: "two bursts far apart",
			pods: []pods{{ms(1000), ms(200), ms(2000)}, {ms(6000), ms(200), ms(6400)}}, until: ms(9000),
			want: []run{{0, Periodic}, {ms(3000), Pods}, {ms(7400), Pods}},
		},
		{
			// The floor's loop at 10 s sees the pods of the batch opened
			// at 9.5 s: no second loop for them.
			name: "a loop for another reason takes the batch",
			pods: []pods{{ms(9500), ms(200), ms(9900)}}, until: ms(19000),
			want: []run{{0, Periodic}, {ms(10000), Periodic}},
		},
		{
			name:   "a shorter idle duration",
			timing: func(tm *Timing) { tm.BatchIdle = ms(300) },
			pods:   []pods{{ms(1000), ms(100), ms(2000)}, {ms(2500), ms(100), ms(2500)}}, until: ms(5000),
			want: []run{{0, Periodic}, {ms(2300), Pods}, {ms(3300), Pods}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tm := defaultTiming()
				if tc.timing != nil {
					tc.timing(&tm)
				}
				h := newHarness(t, tm).start()
				for _, p := range tc.pods {
					for at := p.from; at <= p.to; at += p.every {
						h.until(at)
						h.d.Wake(Pods)
					}
				}
				h.until(tc.until)
				sameRuns(t, h.stop(), tc.want)
			})
		})
	}
}

// TestStorm: a thousand triggers of every kind in a second never run two
// loops at once nor two loops less than the minimum gap apart, and none
// is lost: a loop starts after the last of them.
func TestStorm(t *testing.T) {
	for _, tc := range []struct {
		name     string
		loopTime time.Duration
		minGap   time.Duration
		maxLoops int // in the storm's second and the gap after it
	}{
		{"short loops", ms(300), time.Second, 2},
		{"loops longer than the gap", ms(2500), time.Second, 2},
		{"instant loops, gap of 250ms", 0, ms(250), 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tm := defaultTiming()
				tm.MinGap = tc.minGap
				h := newHarness(t, tm)
				h.loopTime = tc.loopTime
				h.start()
				h.until(ms(5000))
				storm := []Reason{NodeReady, Pods, CloudFailure, Config}
				stormStart := time.Since(h.t0)
				var last time.Duration
				for i := range 1000 {
					h.d.Wake(storm[i%len(storm)])
					last = time.Since(h.t0)
					time.Sleep(time.Millisecond)
				}
				h.until(stormStart + 8*time.Second) // before the floor
				runs := h.stop()
				if h.maxInFlight != 1 {
					t.Fatalf("%d loops at once", h.maxInFlight)
				}
				for i := 1; i < len(runs); i++ {
					if gap := runs[i].at - runs[i-1].at; gap < tc.minGap {
						t.Fatalf("loops %v and %v %v apart, under the minimum gap %v: %v", runs[i-1], runs[i], gap, tc.minGap, runs)
					}
				}
				inStorm := 0
				for _, r := range runs {
					if r.at >= stormStart {
						inStorm++
					}
				}
				if inStorm == 0 || inStorm > tc.maxLoops {
					t.Fatalf("%d loops for the storm, want 1 to %d: %v", inStorm, tc.maxLoops, runs)
				}
				if end := runs[len(runs)-1]; end.at < last {
					t.Fatalf("no loop after the last trigger at %v: %v", last, runs)
				}
				if first := runs[1]; first.at != stormStart || first.r != NodeReady {
					t.Fatalf("the storm's first loop is %v, want node-ready at once (%v): %v", first, stormStart, runs)
				}
			})
		})
	}
}

// TestWakeAfter: a loop's own request to run again starts a loop at the
// time asked (no sooner than the gap), the earliest of several wins, and
// a loop that starts for another reason drops it (that loop asks again if
// it needs to).
func TestWakeAfter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		onLoop func(h *harness, i int, r Reason)
		events []run // Wake(r) at
		until  time.Duration
		want   []run
	}{
		{
			name: "at the time asked",
			onLoop: func(h *harness, i int, _ Reason) {
				if i == 0 {
					h.d.WakeAfter(Queue, 3*time.Second)
				}
			},
			until: ms(14000),
			want:  []run{{0, Periodic}, {ms(3000), Queue}, {ms(13000), Periodic}},
		},
		{
			name: "no sooner than the gap",
			onLoop: func(h *harness, i int, _ Reason) {
				if i == 0 {
					h.d.WakeAfter(Queue, ms(100))
				}
			},
			until: ms(5000),
			want:  []run{{0, Periodic}, {ms(1000), Queue}},
		},
		{
			name: "the earliest wins",
			onLoop: func(h *harness, i int, _ Reason) {
				if i == 0 {
					h.d.WakeAfter(Queue, 6*time.Second)
					h.d.WakeAfter(Queue, 4*time.Second)
					h.d.WakeAfter(Queue, 5*time.Second)
				}
			},
			until: ms(9000),
			want:  []run{{0, Periodic}, {ms(4000), Queue}},
		},
		{
			name: "a loop for another reason drops it",
			onLoop: func(h *harness, i int, _ Reason) {
				if i == 0 {
					h.d.WakeAfter(Queue, 5*time.Second)
				}
			},
			events: []run{{ms(2000), Config}},
			until:  ms(11000),
			want:   []run{{0, Periodic}, {ms(2000), Config}},
		},
		{
			name: "asked again by each loop until done",
			onLoop: func(h *harness, i int, _ Reason) {
				if i < 3 {
					h.d.WakeAfter(Queue, 2*time.Second)
				}
			},
			until: ms(17000),
			want:  []run{{0, Periodic}, {ms(2000), Queue}, {ms(4000), Queue}, {ms(6000), Queue}, {ms(16000), Periodic}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, defaultTiming())
				h.onLoop = func(i int, r Reason) { tc.onLoop(h, i, r) }
				h.start()
				for _, e := range tc.events {
					h.until(e.at)
					h.d.Wake(e.r)
				}
				h.until(tc.until)
				sameRuns(t, h.stop(), tc.want)
			})
		})
	}
}

// TestCoalescing: triggers arriving during a loop and during the gap make
// one next loop, counted under the first of them; a trigger during the
// gap waits for its end.
func TestCoalescing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, defaultTiming())
		h.loopTime = ms(400)
		h.start()
		h.until(ms(200)) // during the first loop
		h.d.Wake(CloudFailure)
		h.d.Wake(Config)
		h.until(ms(700)) // during the gap
		h.d.Wake(NodeReady)
		h.until(ms(3000))
		h.d.Wake(Config) // after the gap: at once
		h.d.Wake(NodeReady)
		h.until(ms(3500))
		sameRuns(t, h.stop(), []run{{0, Periodic}, {ms(1000), CloudFailure}, {ms(3000), Config}})
	})
}

// TestScanIntervalLive: a new interval, read after each loop, moves the
// floor from the next loop on; a config trigger runs that loop at once.
func TestScanIntervalLive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, defaultTiming())
		h.onLoop = func(i int, r Reason) {
			// The loop applies reloaded options: loop 2 (woken by the
			// reload) shortens the interval, loop 5 lengthens it.
			switch i {
			case 2:
				h.setTiming(func(tm *Timing) { tm.Interval = 3 * time.Second })
			case 5:
				h.setTiming(func(tm *Timing) { tm.Interval = 30 * time.Second })
			}
		}
		h.start()
		h.until(ms(14000))
		h.d.Wake(Config)
		h.until(ms(60000))
		sameRuns(t, h.stop(), []run{
			{0, Periodic}, {ms(10000), Periodic}, {ms(14000), Config},
			{ms(17000), Periodic}, {ms(20000), Periodic}, {ms(23000), Periodic}, {ms(53000), Periodic},
		})
	})
}

// TestEventsOff: with events off, every trigger is ignored and loops run
// at the interval only; turned on live, they count again.
func TestEventsOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tm := defaultTiming()
		tm.Events = false
		h := newHarness(t, tm)
		h.onLoop = func(i int, _ Reason) {
			if i == 1 {
				h.setTiming(func(tm *Timing) { tm.Events = true })
			}
		}
		h.start()
		h.until(ms(2000))
		for _, r := range Reasons() {
			h.d.Wake(r)
			h.d.WakeAfter(r, ms(500))
		}
		h.until(ms(12000))
		h.d.Wake(Pods)
		h.until(ms(14000))
		sameRuns(t, h.stop(), []run{{0, Periodic}, {ms(10000), Periodic}, {ms(13000), Pods}})
	})
}

// TestWakeBeforeRun: what came before Run is seen by its first loop,
// which runs at once: no second loop for it.
func TestWakeBeforeRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, defaultTiming())
		h.d.Wake(Config)
		h.d.Wake(Pods)
		h.start()
		h.until(ms(9000))
		sameRuns(t, h.stop(), []run{{0, Periodic}})
	})
}

// TestStop: Run returns as soon as ctx ends while it waits (the floor, a
// batch, the gap), and after the loop in progress otherwise, starting no
// other.
func TestStop(t *testing.T) {
	for _, tc := range []struct {
		name     string
		loopTime time.Duration
		wake     Reason // at wakeAt, when set
		wakeAt   time.Duration
		at       time.Duration
		want     time.Duration // when Run returns
	}{
		{"waiting for the floor", 0, None, 0, ms(3000), ms(3000)},
		{"in a batch", 0, Pods, ms(1000), ms(1500), ms(1500)},
		{"in the gap", 0, Config, ms(500), ms(700), ms(700)},
		{"in a loop", ms(4000), Config, ms(1000), ms(1500), ms(4000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, defaultTiming())
				h.loopTime = tc.loopTime
				h.start()
				if tc.wake != None {
					h.until(tc.wakeAt)
					h.d.Wake(tc.wake)
				}
				h.until(tc.at)
				h.cancel()
				<-h.done
				if got := time.Since(h.t0); got != tc.want {
					t.Fatalf("Run returned at %v, want %v", got, tc.want)
				}
				h.mu.Lock()
				defer h.mu.Unlock()
				if len(h.runs) != 1 {
					t.Fatalf("loops %v, want only the first", h.runs)
				}
			})
		})
	}
}

func TestReasonLabels(t *testing.T) {
	want := []string{"periodic", "pods", "node-ready", "cloud-failure", "config", "queue"}
	for i, r := range Reasons() {
		if r.String() != want[i] {
			t.Fatalf("Reasons[%d] = %q, want %q", i, r, want[i])
		}
	}
}
