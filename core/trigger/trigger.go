// Package trigger decides when the autoscaler's loop runs: at the scan
// interval (the floor), and sooner when something happens that a loop
// should act on — new unschedulable pods (after a batching window), a node
// turning usable, a failed cloud operation, a configuration change — or
// when a loop asked to run again at a time of its choosing (the
// node-addition queue's bucket refilled).
//
// It guarantees, whatever arrives and however fast:
//   - at most one loop in flight (the loop runs on Run's goroutine);
//   - at least the minimum gap between loop starts (--min-loop-interval,
//     or the scan interval when that is shorter);
//   - at most the scan interval between loop starts, while loops take less;
//   - triggers arriving during a loop or during the gap coalesce into one
//     next loop, counted under the first of them.
//
// Wake never blocks and does O(1) work (atomics and a non-blocking send):
// it is called from informer event handlers.
package trigger

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Reason says why a loop ran.
type Reason int32

// The reasons, in the order of Reasons.
const (
	// None is no reason: no loop is due but the periodic one.
	None Reason = iota
	// Periodic: the scan interval passed (the floor), or the first loop.
	Periodic
	// Pods: new unschedulable pods, after the batching window.
	Pods
	// NodeReady: a node turned usable (Ready, past preflight and startup
	// taints): the node-addition queue may release more.
	NodeReady
	// CloudFailure: a cloud operation failed (a scale-up was refused):
	// its pods are planned again on the other groups.
	CloudFailure
	// Config: a live reload of the flags was accepted.
	Config
	// Queue: the node-addition queue held nodes for its rate, and its
	// bucket has refilled (WakeAfter).
	Queue
)

// Reasons are every reason, for metrics created at zero.
func Reasons() []Reason { return []Reason{Periodic, Pods, NodeReady, CloudFailure, Config, Queue} }

// String is the reason's metric label.
func (r Reason) String() string {
	switch r {
	case Periodic:
		return "periodic"
	case Pods:
		return "pods"
	case NodeReady:
		return "node-ready"
	case CloudFailure:
		return "cloud-failure"
	case Config:
		return "config"
	case Queue:
		return "queue"
	default:
		return "none"
	}
}

// Timing is the driver's configuration, read again after every loop (a
// live reload changes it).
type Timing struct {
	// Interval is the floor: a loop starts at most this long after the
	// previous one started (--scan-interval). Must be positive.
	Interval time.Duration
	// Events turns the event triggers on (--frequent-loops-enabled); off,
	// loops run at Interval only and Wake does nothing.
	Events bool
	// MinGap is the least time between two loop starts
	// (--min-loop-interval); an Interval shorter than it wins.
	MinGap time.Duration
	// BatchIdle and BatchMax are the pods' batching window: a batch
	// closes once no new pod came for BatchIdle, or BatchMax after its
	// first pod, whichever comes first (--pod-batch-idle-duration,
	// --pod-batch-max-duration).
	BatchIdle, BatchMax time.Duration
}

func (t Timing) gap() time.Duration { return min(t.MinGap, t.Interval) }

// Driver runs the loop. Wake may be called from any goroutine, before,
// during or after Run.
type Driver struct {
	clock  clock.Clock
	timing func() Timing
	// signal tells Run that something changed; one token is enough.
	signal chan struct{}
	// pending is the first reason since the last loop started (None: no
	// loop is due but the periodic one).
	pending atomic.Int32
	// podFirst and podLast are the batch's first and latest pod, in Unix
	// nanoseconds on the driver's clock; podFirst 0: no batch open.
	podFirst, podLast atomic.Int64
	// events mirrors Timing.Events for Wake.
	events atomic.Bool
	// timed is the wake asked for by WakeAfter (zero at: none).
	timedMu sync.Mutex
	timed   timedWake
}

type timedWake struct {
	at time.Time
	r  Reason
}

// New returns a driver reading its timing from timing (called on Run's
// goroutine only, and once here) and the time from c.
func New(c clock.Clock, timing func() Timing) *Driver {
	d := &Driver{clock: c, timing: timing, signal: make(chan struct{}, 1)}
	d.events.Store(timing().Events)
	return d
}

// Wake asks for a loop for reason r: at once (after the minimum gap) for
// every reason but Pods, which opens or extends the batching window.
// It never blocks; with events off it does nothing.
func (d *Driver) Wake(r Reason) {
	if !d.events.Load() || r <= None || r > Queue {
		return
	}
	if r == Pods {
		now := d.clock.Now().UnixNano()
		d.podLast.Store(now)
		// Only the pod that opens a batch wakes Run: the others move the
		// batch's end, which Run reads when its timer fires.
		if d.podFirst.CompareAndSwap(0, now) {
			d.poke()
		}
		return
	}
	if d.pending.CompareAndSwap(int32(None), int32(r)) {
		d.poke()
	}
}

// WakeAfter asks for a loop for reason r after delay (still no sooner
// than the minimum gap after the previous loop's start): a loop's own
// request to run again, or an event's that must not come sooner (a
// follow-up). A loop that starts for any reason takes it — it sees what
// the wake was for, and a loop asks again if it still needs to. The
// earliest of several wins. It never blocks; with events off it does
// nothing (the periodic loop remains).
func (d *Driver) WakeAfter(r Reason, delay time.Duration) {
	if !d.events.Load() || r <= None || r > Queue {
		return
	}
	at := d.clock.Now().Add(max(delay, 0))
	d.timedMu.Lock()
	if d.timed.at.IsZero() || at.Before(d.timed.at) {
		d.timed = timedWake{at: at, r: r}
	}
	d.timedMu.Unlock()
	d.poke()
}

// Timed is the timed wake asked for and not yet taken (a zero at: none).
func (d *Driver) Timed() (r Reason, at time.Time) {
	d.timedMu.Lock()
	defer d.timedMu.Unlock()
	return d.timed.r, d.timed.at
}

// takeTimed returns the timed wake, clearing it when it is due at now or
// when clear is set; ok false: none.
func (d *Driver) takeTimed(now time.Time, clear bool) (w timedWake, ok bool) {
	d.timedMu.Lock()
	defer d.timedMu.Unlock()
	w = d.timed
	if w.at.IsZero() {
		return w, false
	}
	if clear || !now.Before(w.at) {
		d.timed = timedWake{}
	}
	return w, true
}

// Pending says what the next loop would be counted under now (None: only
// the periodic loop is due) and whether a batch of pods is open.
func (d *Driver) Pending() (r Reason, podsBatched bool) {
	return Reason(d.pending.Load()), d.podFirst.Load() != 0
}

func (d *Driver) poke() {
	select {
	case d.signal <- struct{}{}:
	default:
	}
}

// batchDue says when the open pod batch closes; ok false: none is open.
func (d *Driver) batchDue(t Timing) (due time.Time, ok bool) {
	first := d.podFirst.Load()
	if first == 0 {
		return time.Time{}, false
	}
	// The latest pod may have been stored by a Wake whose batch is not
	// this one yet: a batch ends no sooner than idle after its first pod.
	last := max(d.podLast.Load(), first)
	return time.Unix(0, min(last+int64(t.BatchIdle), first+int64(t.BatchMax))), true
}

// Run calls loop, on this goroutine, whenever a loop is due, until ctx
// ends: at once (Periodic), then as Timing and the triggers say. A loop
// in progress is never interrupted; Run returns after it when ctx ends.
func (d *Driver) Run(ctx context.Context, loop func(context.Context, Reason)) {
	// What came before the first loop is in the first loop.
	d.pending.Store(int32(Periodic))
	d.podFirst.Store(0)
	var last time.Time // start of the previous loop; zero before the first
	for ctx.Err() == nil {
		t := d.timing()
		d.events.Store(t.Events)
		now := d.clock.Now()
		var wake time.Time // when to look again; zero: only on a signal
		if !last.IsZero() {
			wake = d.due(t, now, last)
		}
		if Reason(d.pending.Load()) != None {
			if gapEnd := last.Add(t.gap()); !last.IsZero() && now.Before(gapEnd) {
				wake = gapEnd // nothing else matters until then
			} else {
				r := Reason(d.pending.Swap(int32(None)))
				// The loop sees the batch's pods: later ones open another.
				// It also decides afresh whether to ask for a timed wake.
				d.podFirst.Store(0)
				d.takeTimed(now, true)
				last = now
				loop(ctx, r)
				continue
			}
		}
		d.wait(ctx, now, wake)
	}
}

// due records in pending what is due at now (the pods' batch closed, the
// timed wake, the floor after the previous loop's start at last) and
// returns when to look again for what is not yet (zero: only on a
// signal).
func (d *Driver) due(t Timing, now, last time.Time) time.Time {
	var wake time.Time
	if at, ok := d.checkBatch(t, now); ok {
		wake = earlier(wake, at)
	}
	if at, ok := d.checkTimed(t, now); ok {
		wake = earlier(wake, at)
	}
	if floor := last.Add(t.Interval); now.Before(floor) {
		wake = earlier(wake, floor)
	} else {
		d.pending.CompareAndSwap(int32(None), int32(Periodic))
	}
	return wake
}

// checkBatch closes the open pod batch when it is due (a Pods loop is
// then pending) or when the events were turned off live (the batch is
// dropped); else it returns when the open batch closes.
func (d *Driver) checkBatch(t Timing, now time.Time) (time.Time, bool) {
	due, open := d.batchDue(t)
	switch {
	case open && !t.Events:
		d.podFirst.Store(0) // turned off live: the batch is dropped
	case open && now.Before(due):
		return due, true
	case open:
		d.podFirst.Store(0)
		d.pending.CompareAndSwap(int32(None), int32(Pods))
	}
	return time.Time{}, false
}

// checkTimed takes the timed wake when it is due (its loop is then
// pending), or clears it when the events are off; else it returns when
// it is due.
func (d *Driver) checkTimed(t Timing, now time.Time) (time.Time, bool) {
	w, ok := d.takeTimed(now, !t.Events)
	if !ok || !t.Events {
		return time.Time{}, false
	}
	if now.Before(w.at) {
		return w.at, true
	}
	d.pending.CompareAndSwap(int32(None), int32(w.r))
	return time.Time{}, false
}

// earlier is at when it comes before wake or wake is zero, else wake.
func earlier(wake, at time.Time) time.Time {
	if wake.IsZero() || at.Before(wake) {
		return at
	}
	return wake
}

// wait returns at until, on a signal, or when ctx ends. A timer of its
// own each time: a fake clock's timer whose fire was not read would block
// the next fire.
func (d *Driver) wait(ctx context.Context, now, until time.Time) {
	timer := d.clock.NewTimer(until.Sub(now))
	defer timer.Stop()
	// A fake clock stepped to until or past it since now was read would
	// have armed the timer from the new time: look again at once.
	if !d.clock.Now().Before(until) {
		return
	}
	select {
	case <-ctx.Done():
	case <-timer.C():
	case <-d.signal:
	}
}
