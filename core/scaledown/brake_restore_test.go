package scaledown

import (
	"testing"
	"time"
)

// TestBrakeRestore: deletions an earlier leader recorded count in the
// same window for a new brake; those out of the window, or in the future,
// do not.
func TestBrakeRestore(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := BrakeOptions{ClusterShare: 0.02, GroupShare: 1, Window: 10 * time.Minute, Min: 3}
	old := NewBrake(o)
	old.Record(t0, "g")
	old.Record(t0, "g") // two in one loop: one time
	old.Record(t0.Add(time.Minute), "g")
	now := t0.Add(5 * time.Minute)
	recs := append(old.Records(now), Record{At: t0.Add(-20 * time.Minute), Group: "g"}, Record{At: now.Add(time.Minute), Group: "g"})
	b := NewBrake(o)
	b.Restore(now, recs)
	if got := b.Recent(now); got != 3 {
		t.Fatalf("%d deletions in the window after the restore, want the 3 recorded", got)
	}
	if b.Allow(now, "g", 100, 100) {
		t.Fatal("a fourth deletion allowed in the window: the restored ones were not counted")
	}
	if !b.Allow(t0.Add(10*time.Minute+time.Second), "g", 100, 100) {
		t.Fatal("the first deletion left the window: one more must be allowed")
	}
}

// TestBrakeCountsFromTheSending: a removal decided at t0 and sent later
// (a drain, the pause after the taint) counts a window from its sending,
// so the deletions sent within any window stay within the shares. Counted
// from the decision only, a removal decided a window later was let go and
// sent within the same window as the first (the scale harness: 45 sent
// within 30 s under a brake of 30).
func TestBrakeCountsFromTheSending(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := 30 * time.Second
	b := NewBrake(BrakeOptions{ClusterShare: 0.5, GroupShare: 1, Window: w, MaxPending: 10 * time.Minute})
	if !b.Allow(t0, "g", 2, 2) {
		t.Fatal("the first removal of two nodes held")
	}
	b.Reserve(t0, "g", "a")
	if b.Allow(t0, "g", 1, 1) {
		t.Fatal("a second removal of two nodes allowed in the same window")
	}
	// a's drain outlasts the window: it is still reserved.
	if b.Allow(t0.Add(w+time.Second), "g", 1, 1) {
		t.Fatal("a removal allowed while the first, decided a window ago, is not sent yet")
	}
	sent := t0.Add(50 * time.Second)
	b.Sent(sent, "g", "a")
	if b.Allow(sent.Add(w-time.Second), "g", 1, 1) {
		t.Fatal("a removal allowed within a window of the first one's sending")
	}
	if !b.Allow(sent.Add(w), "g", 1, 1) {
		t.Fatal("held a window after the first one's sending")
	}

	// A removal given up counts from its decision, as a deletion would.
	b2 := NewBrake(BrakeOptions{ClusterShare: 0.5, GroupShare: 1, Window: w, MaxPending: 10 * time.Minute})
	b2.Reserve(t0, "g", "a")
	b2.Dropped("a")
	if !b2.Allow(t0.Add(w), "g", 1, 1) {
		t.Fatal("a removal given up still counts after its window")
	}
	// One never sent nor given up (a bug's loss) stops counting after
	// MaxPending.
	b3 := NewBrake(BrakeOptions{ClusterShare: 0.5, GroupShare: 1, Window: w, MaxPending: time.Minute})
	b3.Reserve(t0, "g", "a")
	if b3.Allow(t0.Add(w+time.Minute-time.Second), "g", 1, 1) {
		t.Fatal("a reservation stopped counting before MaxPending")
	}
	if !b3.Allow(t0.Add(w+time.Minute), "g", 1, 1) {
		t.Fatal("a lost reservation counts for ever")
	}
	// The same deletion sent again within the window (a lost deletion
	// asked again), or planned twice before it was sent, counts once; a
	// plan not carried out counts for nothing.
	b6 := NewBrake(BrakeOptions{ClusterShare: 1, GroupShare: 1, Window: w, MaxPending: 10 * time.Minute})
	b6.Reserve(t0, "g", "a")
	b6.Reserve(t0.Add(time.Second), "g", "a")
	b6.Sent(t0.Add(2*time.Second), "g", "a")
	b6.Sent(t0.Add(20*time.Second), "g", "a")
	b6.Sent(t0.Add(3*time.Second), "g", "m") // a machine never reserved
	b6.Sent(t0.Add(4*time.Second), "g", "m")
	b6.Reserve(t0, "g", "x")
	b6.Unreserve("x")
	if got := b6.Recent(t0.Add(25 * time.Second)); got != 2 {
		t.Fatalf("%d deletions counted, want 2 (a and m, once each)", got)
	}
	// A new leader cannot know whether a reserved removal was sent: it is
	// kept as sent at the save (rounded down to a tenth of the window, not
	// before its decision).
	b4 := NewBrake(BrakeOptions{ClusterShare: 0.5, GroupShare: 1, Window: w, MaxPending: 10 * time.Minute})
	b4.Reserve(t0, "g", "a")
	saved := t0.Add(45 * time.Second)
	b5 := NewBrake(BrakeOptions{ClusterShare: 0.5, GroupShare: 1, Window: w, MaxPending: 10 * time.Minute})
	b5.Restore(saved, b4.Records(saved))
	if b5.Allow(saved.Add(w-w/10-time.Second), "g", 1, 1) {
		t.Fatal("a new leader forgot a removal reserved and perhaps sent")
	}
}
