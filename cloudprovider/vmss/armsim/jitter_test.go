package armsim

import (
	"context"
	"slices"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// bootTimes scales a fresh scale set from 0 to n VMs and steps a fake clock
// a second at a time, returning how long each VM (by instance ID) took to
// become Running.
func bootTimes(t *testing.T, opts Options, n int) []time.Duration {
	t.Helper()
	fc := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	opts.SubscriptionID, opts.Clock = testSub, fc
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := srv.AddScaleSet(ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5"}); err != nil {
		t.Fatalf("AddScaleSet: %v", err)
	}
	if err := srv.SetCapacity(testRG, "pool", n); err != nil {
		t.Fatalf("SetCapacity: %v", err)
	}
	got := make([]time.Duration, n)
	limit := opts.BootDelay + opts.BootJitter + time.Second
	for elapsed := time.Duration(0); elapsed <= limit; elapsed += time.Second {
		srv.Advance(context.Background())
		st, err := srv.ScaleSet(testRG, "pool")
		if err != nil {
			t.Fatalf("ScaleSet: %v", err)
		}
		for i, vm := range st.VMs {
			if vm.State == StateRunning && got[i] == 0 {
				got[i] = elapsed + 1 // +1ns: a VM running at once is told apart from one not yet running
			}
		}
		fc.Step(time.Second)
	}
	for i, d := range got {
		if d == 0 {
			t.Fatalf("VM %d still not running after %v", i, limit)
		}
		got[i] = d - 1
	}
	return got
}

func TestBootJitter(t *testing.T) {
	const n = 40
	tests := []struct {
		name         string
		opts         Options
		min, max     time.Duration
		wantDistinct int  // at least this many distinct boot times
		wantAtOnce   bool // some VMs run at the first Advance
	}{
		{"no jitter: every VM takes the boot delay", Options{BootDelay: time.Minute}, time.Minute, time.Minute, 1, false},
		{"jitter spreads boots over delay±jitter", Options{BootDelay: time.Minute, BootJitter: 20 * time.Second, Seed: 7}, 40 * time.Second, 80 * time.Second, 10, false},
		{"jitter larger than the delay: some boot at once", Options{BootDelay: 5 * time.Second, BootJitter: 20 * time.Second, Seed: 7}, 0, 25 * time.Second, 5, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := bootTimes(t, tt.opts, n)
			lo, hi := slices.Min(got), slices.Max(got)
			if lo < tt.min || hi > tt.max {
				t.Errorf("boot times span [%v, %v], want within [%v, %v]: %v", lo, hi, tt.min, tt.max, got)
			}
			distinct := slices.Compact(slices.Sorted(slices.Values(got)))
			if len(distinct) < tt.wantDistinct {
				t.Errorf("%d distinct boot times, want at least %d: %v", len(distinct), tt.wantDistinct, got)
			}
			if tt.wantAtOnce != (lo == 0) {
				t.Errorf("earliest boot %v, want some at once: %v", lo, tt.wantAtOnce)
			}
		})
	}
}

func TestBootJitterIsSeeded(t *testing.T) {
	opts := Options{BootDelay: time.Minute, BootJitter: 30 * time.Second, Seed: 42}
	first, again := bootTimes(t, opts, 20), bootTimes(t, opts, 20)
	if !slices.Equal(first, again) {
		t.Fatalf("same seed, different boot times:\n%v\n%v", first, again)
	}
	opts.Seed = 43
	if other := bootTimes(t, opts, 20); slices.Equal(first, other) {
		t.Fatalf("seeds 42 and 43 gave the same boot times %v", first)
	}
}
