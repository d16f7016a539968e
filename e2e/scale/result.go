package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// result is what one scenario measured.
type result struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Smoothing   bool   `json:"smoothing"`
	Duration    string `json:"duration"`
	LogDir      string `json:"logDir"`

	Pods        int `json:"pods"`
	NodesNeeded int `json:"nodesNeeded"`
	// SeedNodes were Ready, and their pods Running, SeedSeconds after the
	// control plane started, before the autoscaler started and the burst
	// (the rest of the pods) was submitted.
	SeedNodes   int     `json:"seedNodes,omitempty"`
	SeedSeconds float64 `json:"seedSeconds,omitempty"`
	// TimeToAllNodes is seconds from submission to NodesNeeded nodes
	// registered, TimeToAllRunning to every pod Running; 0 when never.
	TimeToAllNodes   float64 `json:"timeToAllNodesSeconds"`
	TimeToAllRunning float64 `json:"timeToAllRunningSeconds"`
	NodesAtEnd       int     `json:"nodesAtEnd"`
	CapacityAtEnd    int     `json:"capacityAtEnd"`
	// MaxJoinedIn60s is the most nodes that registered within any 60 s.
	MaxJoinedIn60s int `json:"maxJoinedIn60s"`
	// ScaleUpWrites is what the autoscaler asked ARM for.
	ScaleUpWrites requested `json:"scaleUpWrites"`

	Loops      loopStats     `json:"loops"`
	Autoscaler measure.Usage `json:"autoscaler"`
	// Steady is the autoscaler at full size, every pod Running.
	Steady *steadyResult `json:"steady,omitempty"`
	// Components are the control plane's processes; "harness" is this
	// process (etcd, the ARM simulator, the observers run in it).
	Components map[string]measure.Usage `json:"components"`

	// AutoscalerRequests are the autoscaler's own Kubernetes API requests
	// by "verb resource".
	AutoscalerRequests      map[string]float64 `json:"autoscalerRequests"`
	AutoscalerRequestsTotal float64            `json:"autoscalerRequestsTotal"`
	// AutoscalerMinutes is how long the autoscaler ran when they were
	// read.
	AutoscalerMinutes float64 `json:"autoscalerMinutes"`
	// StatusWrites are its writes of the status ConfigMap (the only
	// ConfigMap it writes).
	StatusWrites float64 `json:"statusWrites"`
	// APIDuringJoins is the API server from submission until every pod
	// ran (or the timeout).
	APIDuringJoins apiSummary `json:"apiDuringJoins"`
	// APIServerRequestsTotal is every request the API server served
	// (apiserver_request_total): kwok, the controllers, the scheduler, the
	// harness's observers and the autoscaler.
	APIServerRequestsTotal float64 `json:"apiServerRequestsTotal"`
	// ARMCalls are the autoscaler's ARM requests by SDK operation.
	ARMCalls           map[string]float64 `json:"armCalls"`
	ARMCallsTotal      float64            `json:"armCallsTotal"`
	ARMThrottled       float64            `json:"armThrottled"`
	Refreshes          float64            `json:"refreshes"`
	ARMCallsPerRefresh float64            `json:"armCallsPerRefresh"`

	ScaleDown *scaleDownResult `json:"scaleDown,omitempty"`
	// Azure is what Azure would have charged, from the ARM simulator's
	// records, and on the InfiniBand layout issue #38's criteria.
	Azure *azureResult `json:"azure,omitempty"`

	Series     []point     `json:"series"`
	LoopSeries []loopPoint `json:"loopSeries"`
	APISeries  []apiPoint  `json:"apiSeries"`
	Joins      []float64   `json:"joins"` // seconds after submission
	Failures   []string    `json:"failures,omitempty"`
}

func (r *result) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.Failures = append(r.Failures, msg)
	say("  CHECK FAILED: %s", msg)
}

// requested is the capacity the autoscaler's accepted scale-set updates
// added.
type requested struct {
	Nodes        int `json:"nodes"`
	Writes       int `json:"writes"`
	MaxPerMinute int `json:"maxPerMinute"`
}

// steadyResult is the autoscaler at full size, between From and To
// seconds after submission.
type steadyResult struct {
	Nodes    int       `json:"nodes"`
	From     float64   `json:"from"`
	To       float64   `json:"to"`
	Loops    loopStats `json:"loops"`
	RSSMiB   float64   `json:"rssMiB"`
	CPUCores float64   `json:"cpuCores"`
	// Its Kubernetes API requests and status ConfigMap writes.
	RequestsPerMinute     float64 `json:"requestsPerMinute"`
	StatusWritesPerMinute float64 `json:"statusWritesPerMinute"`
}

// requestedPerWindow adds up the capacity accepted scale-set updates added
// after t0 to the scale sets' base (their capacity at creation, by
// lower-cased "resource group/name"), and the most added within any
// window.
func requestedPerWindow(writes []armsim.Write, base map[string]int, t0 time.Time, window time.Duration) requested {
	last := maps.Clone(base)
	if last == nil {
		last = map[string]int{}
	}
	var at []time.Time
	var adds []int
	var r requested
	for _, w := range writes {
		if w.Op != "UpdateScaleSet" || w.Status/100 != 2 || w.Capacity < 0 {
			continue
		}
		key := strings.ToLower(w.ResourceGroup + "/" + w.ScaleSet)
		add := w.Capacity - last[key]
		last[key] = w.Capacity
		if add <= 0 || w.At.Before(t0) {
			continue
		}
		r.Writes++
		r.Nodes += add
		at = append(at, w.At)
		adds = append(adds, add)
	}
	sum, j := 0, 0
	for i := range at {
		sum += adds[i]
		for at[i].Sub(at[j]) >= window {
			sum -= adds[j]
			j++
		}
		r.MaxPerMinute = max(r.MaxPerMinute, sum)
	}
	return r
}

// maxInWindow is the most times within any window.
func maxInWindow(ts []time.Time, window time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= window {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// loopStats summarises loop durations, in seconds.
type loopStats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

func summarise(loops []loopPoint) loopStats {
	if len(loops) == 0 {
		return loopStats{}
	}
	d := make([]float64, len(loops))
	for i, l := range loops {
		d[i] = l.Seconds
	}
	slices.Sort(d)
	q := func(p float64) float64 { return d[int(math.Ceil(p*float64(len(d))))-1] }
	return loopStats{Count: len(d), P50: q(0.5), P99: q(0.99), Max: d[len(d)-1]}
}

// scaleDownResult is what the scale-down under the brake did.
type scaleDownResult struct {
	StartNodes int    `json:"startNodes"`
	EndNodes   int    `json:"endNodes"`
	Window     string `json:"brakeWindow"`
	// WatchedFor and FirstRemoval are seconds after the workload went.
	WatchedFor   float64       `json:"watchedForSeconds"`
	FirstRemoval float64       `json:"firstRemovalSeconds"`
	Windows      []brakeWindow `json:"windows"`
	// MaxShare is the largest share of the cluster removed within any
	// window, of the nodes at the window's start, as seen from the nodes.
	MaxShare float64 `json:"maxShare"`
	// MostSent is the most deletions the autoscaler sent within any
	// window (less than a window apart between two samples), and
	// SentLimit what the brake allowed for it: the brake's share of the
	// nodes at that window's start, at least one.
	MostSent  int `json:"mostSent"`
	SentLimit int `json:"sentLimit"`
}

// brakeWindow is one of the consecutive windows after the workload went.
type brakeWindow struct {
	Start   float64 `json:"start"`
	Nodes   int     `json:"nodes"`
	Removed int     `json:"removed"`
}

// brakeWindows cuts the node count after t0 into consecutive windows, and
// finds the largest share removed within any window (starting at a
// removal).
func brakeWindows(series []nodePoint, t0 time.Time, window time.Duration) ([]brakeWindow, float64) {
	var after []nodePoint
	before := 0
	for _, p := range series {
		if p.At.After(t0) {
			after = append(after, p)
		} else {
			before = p.N
		}
	}
	countAt := func(t time.Time) int { // nodes just before t
		n := before
		for _, p := range after {
			if !p.At.Before(t) {
				break
			}
			n = p.N
		}
		return n
	}
	var windows []brakeWindow
	if len(after) > 0 {
		end := after[len(after)-1].At
		for s := t0; !s.After(end); s = s.Add(window) {
			start, stop := countAt(s), countAt(s.Add(window))
			windows = append(windows, brakeWindow{Start: seconds(s.Sub(t0)), Nodes: start, Removed: max(0, start-stop)})
		}
	}
	share := 0.0
	for i, p := range after {
		prev := before
		if i > 0 {
			prev = after[i-1].N
		}
		if p.N >= prev || prev == 0 {
			continue
		}
		low := p.N
		for _, q := range after[i:] {
			if q.At.Sub(p.At) >= window {
				break
			}
			low = min(low, q.N)
		}
		share = max(share, float64(prev-low)/float64(prev))
	}
	return windows, share
}

// mostSent finds, among the samples after t0, the window (two samples less
// than window apart) in which the most deletions were sent, and what the
// brake allowed then: share of the nodes at its start (nodes still
// deleting are counted, which only raises the allowance), at least one.
// It returns the window that exceeds its allowance most, or else the one
// that sent most.
func mostSent(series []point, t0 float64, window time.Duration, share float64) (sent, limit int) {
	var after []point
	for _, p := range series {
		if p.At >= t0 {
			after = append(after, p)
		}
	}
	worst := math.Inf(-1)
	for i, a := range after {
		allowed := max(1, int(math.Floor(share*float64(a.Nodes))))
		for _, b := range after[i+1:] {
			if b.At-a.At >= window.Seconds() {
				break
			}
			n := int(b.ScaledDown - a.ScaledDown)
			over := float64(n - allowed)
			if over > worst || (over == worst && n > sent) {
				worst, sent, limit = over, n, allowed
			}
		}
	}
	return sent, limit
}

// measure fills in the figures read at the end of a scenario, while its
// processes still run.
func (r *result) measure(ctx context.Context, e *env, w *watcher, s *sampler, t0, scaleUpEnd time.Time) {
	r.Series, r.LoopSeries = s.series()
	r.Loops = summarise(r.LoopSeries)
	r.APISeries = s.apiSeries()
	upEnd := seconds(scaleUpEnd.Sub(t0))
	if r.TimeToAllRunning > 0 {
		upEnd = r.TimeToAllRunning
	}
	r.APIDuringJoins = summariseAPI(r.APISeries, 0, upEnd)
	if st := r.Steady; st != nil {
		var in []loopPoint
		for _, l := range r.LoopSeries {
			if l.At > st.From && l.At <= st.To {
				in = append(in, l)
			}
		}
		st.Loops = summarise(in)
	}
	r.AutoscalerMinutes = time.Since(e.asStarted).Minutes()
	var upJoins []time.Time
	for _, j := range w.joinTimes() {
		if !j.Before(t0) {
			r.Joins = append(r.Joins, seconds(j.Sub(t0)))
			if j.Before(scaleUpEnd) {
				upJoins = append(upJoins, j)
			}
		}
	}
	r.MaxJoinedIn60s = maxInWindow(upJoins, time.Minute)

	r.Components = map[string]measure.Usage{}
	for name, p := range e.cp.Components() {
		u, err := measure.ProcUsage(p.Pid())
		if err != nil {
			r.fail("reading /proc for %s: %v", name, err)
			continue
		}
		if p == e.as {
			r.Autoscaler = u
		}
		r.Components[name] = u
	}
	if u, err := measure.ProcUsage(os.Getpid()); err == nil {
		r.Components["harness"] = u
	}

	fams, err := measure.Scrape(ctx, "http://"+e.addr+"/metrics")
	if err != nil {
		r.fail("reading the autoscaler's metrics: %v", err)
	} else {
		r.AutoscalerRequests = byLabels(fams, "rest_client_request_duration_seconds", "verb", "resource")
		for _, v := range r.AutoscalerRequests {
			r.AutoscalerRequestsTotal += v
		}
		r.StatusWrites = statusWrites(r.AutoscalerRequests)
		r.ARMCalls = byLabels(fams, "vmss_autoscaler_arm_requests_total", "operation")
		for _, v := range r.ARMCalls {
			r.ARMCallsTotal += v
		}
		r.ARMThrottled = measure.Sum(fams, "vmss_autoscaler_arm_requests_total", map[string]string{"code": "429"})
		// A refresh lists the resource group's scale sets once.
		for op, v := range r.ARMCalls {
			if strings.HasPrefix(op, "VirtualMachineScaleSetsClient.") && strings.Contains(op, "List") {
				r.Refreshes += v
			}
		}
		if r.Refreshes > 0 {
			r.ARMCallsPerRefresh = r.ARMCallsTotal / r.Refreshes
		}
	}
	if fams, err := measure.APIServerMetrics(ctx, e.client); err == nil {
		r.APIServerRequestsTotal = measure.Sum(fams, "apiserver_request_total", nil)
	} else {
		r.fail("reading the API server's metrics: %v", err)
	}
}

// topRequests returns the n largest request counts, largest first.
func topRequests(m map[string]float64, n int) []struct {
	Key   string
	Count float64
} {
	type kv = struct {
		Key   string
		Count float64
	}
	out := make([]kv, 0, len(m))
	for k, v := range m {
		out = append(out, kv{k, v})
	}
	slices.SortFunc(out, func(a, b kv) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
