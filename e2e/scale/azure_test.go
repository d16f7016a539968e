package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

func TestMaxGrowthInWindow(t *testing.T) {
	mins := func(m float64) float64 { return m * 60 }
	for _, tc := range []struct {
		name   string
		series []countPoint
		window time.Duration
		want   int
	}{
		{"empty", nil, 30 * time.Minute, 0},
		{"one sample", []countPoint{{0, 5}}, 30 * time.Minute, 0},
		{"all within one window", []countPoint{{0, 0}, {mins(1), 10}, {mins(20), 50}}, 30 * time.Minute, 50},
		{"a window is at most 30 minutes", []countPoint{{0, 0}, {mins(1), 100}, {mins(31), 150}, {mins(32), 400}}, 30 * time.Minute, 250},
		{"exactly 30 minutes apart is one window", []countPoint{{0, 0}, {mins(30), 120}}, 30 * time.Minute, 120},
		{"a burst late in the run", []countPoint{{0, 0}, {mins(10), 10}, {mins(45), 20}, {mins(46), 320}}, 30 * time.Minute, 300},
		{"a baseline before submission", []countPoint{{-2, 3}, {0, 3}, {mins(5), 23}}, 30 * time.Minute, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := maxGrowthInWindow(tc.series, tc.window); got != tc.want {
				t.Errorf("maxGrowthInWindow = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestGrowthBetween(t *testing.T) {
	s := []countPoint{{-1, 2}, {0, 2}, {10, 5}, {20, 9}, {30, 9}}
	for _, tc := range []struct {
		from, to float64
		want     int
	}{
		{0, 30, 7}, {10, 30, 4}, {15, 25, 4}, {20, 30, 0}, {-5, 100, 7}, {31, 40, 0},
	} {
		if got := growthBetween(s, tc.from, tc.to); got != tc.want {
			t.Errorf("growthBetween(%v, %v) = %d, want %d", tc.from, tc.to, got, tc.want)
		}
	}
}

func TestLongestStall(t *testing.T) {
	pts := func(ps ...[3]int) []point { // seconds, pending, capacity
		out := make([]point, len(ps))
		for i, p := range ps {
			out[i] = point{At: float64(p[0]), Pending: p[1], Capacity: p[2]}
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		points      []point
		writes      []float64
		need        int
		want, ended float64
	}{
		{"nothing pending", pts([3]int{0, 0, 5}, [3]int{100, 0, 5}), nil, 10, 0, 0},
		{"pending with capacity covering them is not a stall", pts([3]int{0, 5, 10}, [3]int{300, 5, 10}), nil, 10, 0, 0},
		{"no write at all", pts([3]int{0, 5, 2}, [3]int{60, 5, 2}, [3]int{120, 5, 2}), nil, 10, 120, 120},
		{"writes break it", pts([3]int{0, 5, 2}, [3]int{60, 5, 4}, [3]int{120, 5, 6}, [3]int{300, 5, 6}), []float64{50, 110}, 10, 190, 300},
		{"a write before the stall starts does not shorten it", pts([3]int{0, 0, 2}, [3]int{10, 5, 2}, [3]int{100, 5, 2}), []float64{5}, 10, 90, 100},
		{"pods running again end it", pts([3]int{0, 5, 2}, [3]int{50, 0, 2}, [3]int{60, 5, 2}, [3]int{80, 5, 2}), nil, 10, 20, 80},
		{"unsorted writes", pts([3]int{0, 5, 2}, [3]int{100, 5, 2}, [3]int{200, 5, 2}), []float64{150, 20}, 10, 80, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ended := longestStall(tc.points, tc.writes, tc.need)
			if got != tc.want || ended != tc.ended {
				t.Errorf("longestStall = %v (ended %v), want %v (ended %v)", got, ended, tc.want, tc.ended)
			}
		})
	}
}

func TestLongestStretch(t *testing.T) {
	ps := []point{{At: 0}, {At: 2, HeldKinds: 1}, {At: 4, HeldKinds: 2}, {At: 10, HeldKinds: 1}, {At: 12}, {At: 14, HeldKinds: 1}}
	if got := longestStretch(ps, func(p point) bool { return p.HeldKinds > 0 }); got != 8 {
		t.Errorf("longestStretch = %v, want 8", got)
	}
	if got := longestStretch(nil, func(point) bool { return true }); got != 0 {
		t.Errorf("longestStretch(nil) = %v, want 0", got)
	}
}

func TestWriteBudgetBound(t *testing.T) {
	update, ok := armsim.ComputePolicy(armsim.PolicyUpdateVMScaleSetResource)
	if !ok {
		t.Fatal("the simulator has no Update policy for scale sets")
	}
	if update.Capacity != 12 || update.Refill != 4 || update.Period != time.Minute {
		t.Fatalf("Update policy %+v, want 12 tokens refilled 4 a minute (Compute throttling limits); the bound's tests assume it", update.Rate)
	}
	// An operation lasts until its slowest VM has booted (1 minute ±30 s)
	// and run its extensions (1 minute): 150 s.
	op := operationTime(10*time.Second, time.Minute, 30*time.Second, time.Minute)
	if op != 150*time.Second {
		t.Fatalf("operationTime = %v, want 2m30s", op)
	}
	if got := operationTime(5*time.Minute, time.Minute, 0, 0); got != 5*time.Minute {
		t.Errorf("operationTime with a longer least operation = %v, want 5m", got)
	}
	if got := freezeThreshold(op); got != 210*time.Second {
		t.Errorf("freezeThreshold = %v, want 3m30s", got)
	}
	for _, tc := range []struct {
		name   string
		writes int
		op     time.Duration
		wait   float64
		want   float64
	}{
		{"one write: an operation", 1, op, 0, 150},
		{"the bucket's 12 wait for nothing", 12, op, 0, 150},
		{"13 writes wait for a quarter of a minute", 13, op, 15, 165},
		{"52 writes wait 10 minutes", 52, time.Minute, 600, 660},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := writeBudgetBound(tc.writes, update, tc.op)
			if math.Abs(b.WriteWait-tc.wait) > 1e-9 || math.Abs(b.Seconds-tc.want) > 1e-9 {
				t.Errorf("bound %+v, want a write wait of %v s and %v s in all", b, tc.wait, tc.want)
			}
			if f := b.formula(); !strings.Contains(f, "max(0, W − 12) / 4 a minute") {
				t.Errorf("formula %q does not state the bucket", f)
			}
		})
	}
}

func TestWritesPerSetAndChanges(t *testing.T) {
	del := func(set string, s float64, status int) armsim.Write {
		return armsim.Write{At: at(s), Method: "POST", ResourceGroup: "rg", ScaleSet: set, Op: armsim.OpDeleteInstances, Status: status, Capacity: -1}
	}
	ws := []armsim.Write{
		update("A", -5, 10, 200), // before the window
		update("A", 1, 20, 200), update("a", 2, 30, 202), update("b", 3, 5, 429), update("b", 4, 5, 200),
		del("b", 5, 202), del("b", 6, 429), update("c", 100, 5, 200), // after the window
	}
	per := writesPerSet(ws, at(0), at(50))
	if len(per) != 2 || per["rg/a"] != 2 || per["rg/b"] != 1 {
		t.Errorf("writesPerSet = %v, want rg/a 2 and rg/b 1", per)
	}
	got := acceptedChanges(ws, t0)
	want := []float64{-5, 1, 2, 4, 5, 100}
	if len(got) != len(want) {
		t.Fatalf("acceptedChanges = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("acceptedChanges = %v, want %v", got, want)
		}
	}
}

func TestThrottledCounts(t *testing.T) {
	c, a := throttledCounts(map[string]int{
		armsim.PolicyHighCostGetVMScaleSet30Min: 3, armsim.PolicyUpdateVMScaleSetResource: 2,
		"arm/reads": 1, "arm/global-writes": 4,
	})
	if c != 5 || a != 5 {
		t.Errorf("throttledCounts = %d Compute, %d ARM; want 5 and 5", c, a)
	}
	if n := vmListCalls(map[string]int{armsim.OpListVMs: 7, armsim.OpListVirtualMachines: 2, armsim.OpGetScaleSet: 9}); n != 9 {
		t.Errorf("vmListCalls = %d, want 9", n)
	}
}

func TestIBScaleSets(t *testing.T) {
	sets := ibScaleSets(ibSets(7500), 5500)
	if len(sets) != 75 {
		t.Fatalf("%d scale sets for 7,500 nodes, want 75", len(sets))
	}
	full, empty := 0, 0
	for _, s := range sets {
		if !s.SinglePlacementGroup || s.SKU != gpuSKU || s.Tags["max"] != "100" {
			t.Fatalf("scale set %+v: want a single placement group of %s with max 100", s, gpuSKU)
		}
		switch s.Capacity {
		case ibSetSize:
			full++
		case 0:
			empty++
		}
	}
	if full != 55 || empty != 20 {
		t.Errorf("%d full and %d empty scale sets, want 55 and 20", full, empty)
	}
	if s := ibScaleSets(3, 150); s[0].Capacity != 100 || s[1].Capacity != 50 || s[2].Capacity != 0 {
		t.Errorf("a seed of 150 over 3 sets: %d, %d, %d; want 100, 50, 0", s[0].Capacity, s[1].Capacity, s[2].Capacity)
	}
}

func TestAzureJudge(t *testing.T) {
	update, _ := armsim.ComputePolicy(armsim.PolicyUpdateVMScaleSetResource)
	b := writeBudgetBound(5, update, 210*time.Second)
	good := azureResult{LongestStall: 60, FreezeThreshold: 270, VMListsPer30Min: 280, Windowed: true, ObservedMinutes: 31, Bound: &b}
	good.judge(260, true)
	if f := good.failed(); len(f) != 0 {
		t.Errorf("a run within every criterion failed: %v", f)
	}
	if good.Ratio < 1.23 || good.Ratio > 1.24 || good.InFlightRatio != good.Ratio {
		t.Errorf("ratios %v and %v, want 260/210 with no in-flight bound", good.Ratio, good.InFlightRatio)
	}
	// The in-flight cap's bound, when longer, is the one judged: 1,300 s
	// is 6.2x the write budgets' 210 s and 1.24x the cap's 1,050 s.
	f := newInFlightBound(2000, 300, 150*time.Second)
	capped := azureResult{FreezeThreshold: 270, VMListsPer30Min: 280, Windowed: true, ObservedMinutes: 31, Bound: &b, InFlight: &f}
	capped.judge(1300, true)
	if fl := capped.failed(); len(fl) != 0 || capped.InFlightRatio < 1.23 || capped.InFlightRatio > 1.24 {
		t.Errorf("a run within 1.3x the in-flight cap's bound: ratio %v, failed %v", capped.InFlightRatio, fl)
	}
	capped.judge(1400, true)
	if fl := capped.failed(); len(fl) != 1 {
		t.Errorf("a run at 1.33x the in-flight cap's bound failed %d criteria, want 1: %v", len(fl), fl)
	}
	// A run shorter than 30 minutes cannot judge its VM lists: not
	// judged, whatever its lists scaled to 30 minutes come to.
	short := azureResult{LongestStall: 60, FreezeThreshold: 270, VMLists: 90, VMListsPer30Min: 360, ObservedMinutes: 7.5, Bound: &b}
	short.judge(260, true)
	if f := short.failed(); len(f) != 0 || !short.Criteria[1].NotJudged || short.Criteria[1].Pass {
		t.Errorf("a 7.5-minute run: failed %v, VM-list criterion %+v; want it not judged, nothing failed", f, short.Criteria[1])
	}
	bad := azureResult{LongestStall: 300, Windowed: true, ObservedMinutes: 31, FreezeThreshold: 270, VMListsPer30Min: 301, SteadyARMThrottled: 1, Bound: &b}
	bad.judge(400, true)
	if f := bad.failed(); len(f) != 4 {
		t.Errorf("a run outside every criterion failed %d: %v", len(f), f)
	}
	never := azureResult{FreezeThreshold: 270, Bound: &b}
	never.judge(0, false)
	if f := never.failed(); len(f) != 2 {
		t.Errorf("a run that never got up failed %d criteria, want 2 (429s in steady state, the bound): %v", len(f), f)
	}
}

func TestInFlightBound(t *testing.T) {
	for _, c := range []struct {
		added, capacity int
		want            float64
	}{{2000, 300, 7 * 150}, {300, 300, 150}, {301, 300, 300}, {0, 300, 0}, {10, 0, 0}} {
		if got := newInFlightBound(c.added, c.capacity, 150*time.Second).Seconds; got != c.want {
			t.Errorf("newInFlightBound(%d, %d, 150 s) = %v s, want %v", c.added, c.capacity, got, c.want)
		}
	}
}
