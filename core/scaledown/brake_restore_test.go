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
