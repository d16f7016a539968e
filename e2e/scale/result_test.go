package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func update(set string, s float64, capacity, status int) armsim.Write {
	return armsim.Write{At: at(s), Method: "PATCH", ResourceGroup: "rg", ScaleSet: set, Op: "UpdateScaleSet", Status: status, Capacity: capacity}
}

func TestRequestedPerWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []armsim.Write
		want   requested
	}{
		{"none", nil, requested{}},
		{"increases add up per set", []armsim.Write{
			update("a", 1, 20, 200), update("b", 2, 10, 200), update("a", 30, 50, 200),
		}, requested{Nodes: 60, Writes: 3, MaxPerMinute: 60}},
		{"a window holds at most 60 s", []armsim.Write{
			update("a", 0, 20, 200), update("a", 59, 40, 200), update("a", 60, 140, 200),
		}, requested{Nodes: 140, Writes: 3, MaxPerMinute: 120}},
		{"refused and throttled writes add nothing", []armsim.Write{
			update("a", 1, 20, 429), update("a", 2, 20, 200), update("a", 3, 90, 412),
		}, requested{Nodes: 20, Writes: 1, MaxPerMinute: 20}},
		{"a repeated capacity adds nothing", []armsim.Write{
			update("a", 1, 20, 200), update("a", 2, 20, 200),
		}, requested{Nodes: 20, Writes: 1, MaxPerMinute: 20}},
		{"deletions are not requests", []armsim.Write{
			update("a", 1, 20, 200), {At: at(2), Op: "DeleteInstances", ResourceGroup: "rg", ScaleSet: "a", Status: 202, Capacity: -1},
		}, requested{Nodes: 20, Writes: 1, MaxPerMinute: 20}},
		{"writes before the start set the base only", []armsim.Write{
			update("a", -10, 20, 200), update("a", 1, 25, 200),
		}, requested{Nodes: 5, Writes: 1, MaxPerMinute: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := requestedPerWindow(tc.writes, nil, t0, time.Minute); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestMaxInWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		ts   []float64
		want int
	}{
		{"none", nil, 0},
		{"one", []float64{5}, 1},
		{"all within", []float64{0, 10, 59.9}, 3},
		{"60 s apart is two windows", []float64{0, 60}, 1},
		{"densest stretch", []float64{0, 100, 101, 102, 159, 170}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ts []time.Time
			for _, s := range tc.ts {
				ts = append(ts, at(s))
			}
			if got := maxInWindow(ts, time.Minute); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestBrakeWindows(t *testing.T) {
	series := []nodePoint{
		{at(-5), 100},
		{at(10), 80}, {at(20), 50}, // 50 of 100 in the first window
		{at(70), 40}, {at(80), 25}, // 25 of 50 in the second
	}
	windows, share := brakeWindows(series, t0, time.Minute)
	want := []brakeWindow{{Start: 0, Nodes: 100, Removed: 50}, {Start: 60, Nodes: 50, Removed: 25}}
	if len(windows) != len(want) {
		t.Fatalf("windows %+v, want %+v", windows, want)
	}
	for i := range want {
		if windows[i] != want[i] {
			t.Errorf("window %d: %+v, want %+v", i, windows[i], want[i])
		}
	}
	if share != 0.5 {
		t.Errorf("max share %v, want 0.5", share)
	}
	// A window sliding across two consecutive ones sees more than either.
	series = []nodePoint{{at(-5), 100}, {at(50), 80}, {at(55), 40}, {at(100), 20}}
	if _, share := brakeWindows(series, t0, time.Minute); share != 0.8 {
		t.Errorf("sliding max share %v, want 0.8 (100 -> 20 within 50 s)", share)
	}
}

func TestSummarise(t *testing.T) {
	var loops []loopPoint
	for i := 1; i <= 100; i++ {
		loops = append(loops, loopPoint{At: float64(i), Seconds: float64(i) / 100})
	}
	got := summarise(loops)
	want := loopStats{Count: 100, P50: 0.5, P99: 0.99, Max: 1}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := summarise(nil); got != (loopStats{}) {
		t.Errorf("no loops: %+v", got)
	}
}

func TestMostSent(t *testing.T) {
	pts := func(vals ...[3]float64) []point { // at, nodes, scaled down
		var out []point
		for _, v := range vals {
			out = append(out, point{At: v[0], Nodes: int(v[1]), ScaledDown: v[2]})
		}
		return out
	}
	for _, tc := range []struct {
		name             string
		series           []point
		wantSent, wantOK int
	}{
		{"nothing sent", pts([3]float64{0, 100, 0}, [3]float64{10, 100, 0}), 0, 50},
		{"half in a window", pts([3]float64{0, 100, 0}, [3]float64{10, 100, 50}, [3]float64{70, 100, 50}), 50, 50},
		{"two windows apart are not added", pts([3]float64{0, 100, 0}, [3]float64{2, 100, 50}, [3]float64{62, 60, 50}, [3]float64{64, 60, 80}), 50, 50},
		{"too many within a window is the one reported", pts([3]float64{0, 100, 0}, [3]float64{2, 100, 40}, [3]float64{40, 100, 70}), 70, 50},
		{"samples before the start are left out", pts([3]float64{-10, 100, 0}, [3]float64{-5, 100, 90}, [3]float64{1, 100, 90}, [3]float64{5, 100, 95}), 5, 50},
		{"a small cluster may lose one", pts([3]float64{0, 1, 0}, [3]float64{5, 1, 1}), 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent, limit := mostSent(tc.series, 0, time.Minute, 0.5)
			if sent != tc.wantSent || limit != tc.wantOK {
				t.Errorf("got %d sent against %d allowed, want %d against %d", sent, limit, tc.wantSent, tc.wantOK)
			}
		})
	}
}

func TestRequestedPerWindowFromSeed(t *testing.T) {
	writes := []armsim.Write{update("a", 1, 700, 200), update("b", 2, 720, 200)}
	base := map[string]int{"rg/a": 687, "rg/b": 687}
	want := requested{Nodes: 46, Writes: 2, MaxPerMinute: 46}
	if got := requestedPerWindow(writes, base, t0, time.Minute); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if base["rg/a"] != 687 {
		t.Errorf("the base was changed: %v", base)
	}
}

func TestQuantile(t *testing.T) {
	inf := math.Inf(1)
	bounds := []float64{0.1, 0.2, 0.4, inf}
	for _, tc := range []struct {
		name       string
		cumulative []float64
		q, want    float64
	}{
		{"in the first bucket", []float64{100, 100, 100, 100}, 0.5, 0.05},
		{"interpolated in a bucket", []float64{50, 50, 100, 100}, 0.99, 0.396},
		{"in +Inf: the largest finite bound", []float64{0, 0, 0, 10}, 0.99, 0.4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.cumulative[len(tc.cumulative)-1]
			if got := quantile(tc.q, bounds, tc.cumulative, n); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAPIIntervals(t *testing.T) {
	text := func(fast, slow, watch, rejected, throttled int) string {
		return fmt.Sprintf(`# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{verb="GET",resource="nodes",le="0.1"} %d
apiserver_request_duration_seconds_bucket{verb="GET",resource="nodes",le="1"} %d
apiserver_request_duration_seconds_bucket{verb="GET",resource="nodes",le="+Inf"} %d
apiserver_request_duration_seconds_sum{verb="GET",resource="nodes"} 1
apiserver_request_duration_seconds_count{verb="GET",resource="nodes"} %d
apiserver_request_duration_seconds_bucket{verb="WATCH",resource="nodes",le="0.1"} 0
apiserver_request_duration_seconds_bucket{verb="WATCH",resource="nodes",le="1"} 0
apiserver_request_duration_seconds_bucket{verb="WATCH",resource="nodes",le="+Inf"} %d
apiserver_request_duration_seconds_sum{verb="WATCH",resource="nodes"} 1000
apiserver_request_duration_seconds_count{verb="WATCH",resource="nodes"} %d
# TYPE apiserver_flowcontrol_rejected_requests_total counter
apiserver_flowcontrol_rejected_requests_total{flow_schema="a",priority_level="b",reason="queue-full"} %d
# TYPE apiserver_request_total counter
apiserver_request_total{verb="GET",resource="nodes",code="200"} 5
apiserver_request_total{verb="GET",resource="nodes",code="429"} %d
`, fast, fast+slow, fast+slow, fast+slow, watch, watch, rejected, throttled)
	}
	read := func(s string) apiCounters {
		fams, err := measure.ParseMetrics(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return apiCountersOf(fams)
	}
	a, b := read(text(100, 0, 3, 1, 2)), read(text(190, 10, 50, 4, 2))
	p := interval(a, b, 10)
	if p.RequestsPerSecond != 10 {
		t.Errorf("requests a second: got %v, want 10 (watches left out)", p.RequestsPerSecond)
	}
	if math.Abs(p.P50-50*100/90.0) > 1e-6 {
		t.Errorf("p50: got %v ms", p.P50)
	}
	if want := 100 + 900*(99-90)/10.0; math.Abs(p.P99-want) > 1e-6 {
		t.Errorf("p99: got %v ms, want %v", p.P99, want)
	}
	if p.Rejected != 4 || p.Throttled != 2 {
		t.Errorf("rejected, throttled: got %v, %v", p.Rejected, p.Throttled)
	}
	s := summariseAPI([]apiPoint{
		{At: -5, Rejected: 1}, {At: 10, P99: 30, Rejected: 1, RequestsPerSecond: 10}, {At: 20, P99: 90, Rejected: 4, Throttled: 2, RequestsPerSecond: 30}, {At: 30, P99: 500, Rejected: 9},
	}, 0, 25)
	want := apiSummary{Intervals: 2, MedianP99: 30, WorstP99: 90, RequestsPerSecond: 20, Rejected: 3, Throttled: 2}
	if s != want {
		t.Errorf("summary: got %+v, want %+v", s, want)
	}
}
