package main

import (
	"context"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// point is one sample of a scenario, At seconds after the workload was
// submitted.
type point struct {
	At       float64 `json:"t"`
	Nodes    int     `json:"nodes"`
	Capacity int     `json:"capacity"`
	Pending  int     `json:"pending"`
	Running  int     `json:"running"`
	// Rate is the node-addition rate in force (nodes a minute); 0 with
	// smoothing off.
	Rate float64 `json:"rate"`
	// Unschedulable is what the autoscaler's last loop saw: the pending
	// pods the scheduler has marked unschedulable. Pods it has not tried
	// yet are pending but not unschedulable.
	Unschedulable float64 `json:"unschedulable"`
	// ScaledDown is the autoscaler's scaled_down_nodes_total: nodes whose
	// deletion it sent, counted when sent, as the brake counts them.
	ScaledDown float64 `json:"scaledDown"`
	// The ARM simulator's counts so far: VM list pages answered, and 429s
	// by the Compute RP's policies and by ARM's own buckets.
	VMLists          int `json:"vmLists"`
	ComputeThrottled int `json:"computeThrottled"`
	ARMThrottled     int `json:"armThrottled"`
	// HeldKinds are the kinds of ARM call (read, write, delete) the
	// provider held back whole (vmss_autoscaler_arm_throttled_until_seconds
	// in the future).
	HeldKinds int `json:"heldKinds,omitempty"`
}

// loopPoint is one autoscaler loop's duration, from the change of its
// loop_duration_seconds histogram between two scrapes (the mean when a
// scrape saw more than one loop).
type loopPoint struct {
	At      float64 `json:"t"`
	Seconds float64 `json:"seconds"`
}

// sampler records points and loops every sampleEvery.
type sampler struct {
	e          *env
	w          *watcher
	metricsURL string
	done       chan struct{}

	mu      sync.Mutex
	t0      time.Time
	points  []point
	loops   []loopPoint
	lastSum float64
	lastN   uint64
	// The API server's intervals, and the last read they start from.
	api     []apiPoint
	lastAPI apiCounters
	apiAt   time.Time
}

func newSampler(e *env, w *watcher) *sampler {
	return &sampler{e: e, w: w, metricsURL: "http://" + e.addr + "/metrics", done: make(chan struct{})}
}

// mark sets the time points are measured from.
func (s *sampler) mark(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.t0 = t
}

func (s *sampler) run(ctx context.Context) {
	defer close(s.done)
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		s.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *sampler) wait() { <-s.done }

func (s *sampler) sample(ctx context.Context) {
	running, pending := s.w.pods()
	p := point{Nodes: s.w.nodeCount(), Capacity: s.e.capacity(), Pending: pending, Running: running}
	p.VMLists = vmListCalls(s.e.sim.Calls())
	p.ComputeThrottled, p.ARMThrottled = throttledCounts(s.e.sim.Throttled())
	fams, err := measure.Scrape(ctx, s.metricsURL)
	s.sampleAPI(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.t0.IsZero() {
		return
	}
	now := time.Since(s.t0).Seconds()
	p.At = now
	if err != nil {
		// The autoscaler is starting, or gone (the run notices): a point
		// without its figures.
		s.points = append(s.points, p)
		return
	}
	p.Rate = measure.Sum(fams, "vmss_autoscaler_node_addition_rate_nodes_per_minute", nil)
	p.Unschedulable = measure.Sum(fams, "vmss_autoscaler_unschedulable_pods", nil)
	p.ScaledDown = measure.Sum(fams, "vmss_autoscaler_scaled_down_nodes_total", nil)
	p.HeldKinds = heldKinds(fams, time.Now())
	s.points = append(s.points, p)
	sum, n := histogram(fams, "vmss_autoscaler_loop_duration_seconds")
	if n > s.lastN && s.lastN > 0 {
		s.loops = append(s.loops, loopPoint{At: now, Seconds: (sum - s.lastSum) / float64(n-s.lastN)})
	}
	s.lastSum, s.lastN = sum, n
}

// heldKinds counts the kinds of ARM call the provider holds back whole at
// now.
func heldKinds(fams map[string]*dto.MetricFamily, now time.Time) int {
	n := 0
	for _, m := range fams["vmss_autoscaler_arm_throttled_until_seconds"].GetMetric() {
		if m.GetGauge().GetValue() > float64(now.Unix()) {
			n++
		}
	}
	return n
}

// sampleAPI reads the API server's /metrics when apiEvery has passed since
// the last read, and records the interval. A failed read is skipped (the
// next interval is longer).
func (s *sampler) sampleAPI(ctx context.Context) {
	s.mu.Lock()
	due := time.Since(s.apiAt) >= apiEvery
	s.mu.Unlock()
	if !due {
		return
	}
	c, err := s.e.readAPI(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.apiAt.IsZero() && !s.t0.IsZero() {
		p := interval(s.lastAPI, c, now.Sub(s.apiAt).Seconds())
		p.At = now.Sub(s.t0).Seconds()
		s.api = append(s.api, p)
	}
	s.lastAPI, s.apiAt = c, now
}

// start is the time points are measured from.
func (s *sampler) start() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t0
}

func (s *sampler) series() ([]point, []loopPoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]point(nil), s.points...), append([]loopPoint(nil), s.loops...)
}

func (s *sampler) apiSeries() []apiPoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]apiPoint(nil), s.api...)
}

// histogram returns a histogram's sum and count over all its series.
func histogram(fams map[string]*dto.MetricFamily, name string) (sum float64, count uint64) {
	for _, m := range fams[name].GetMetric() {
		sum += m.GetHistogram().GetSampleSum()
		count += m.GetHistogram().GetSampleCount()
	}
	return sum, count
}

// byLabels sums a counter (or a histogram's counts) by the values of the
// labels named, joined with " ".
func byLabels(fams map[string]*dto.MetricFamily, name string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range fams[name].GetMetric() {
		vals := make([]string, len(labels))
		for i, want := range labels {
			for _, l := range m.GetLabel() {
				if l.GetName() == want {
					vals[i] = l.GetValue()
				}
			}
		}
		key := strings.Join(vals, " ")
		switch {
		case m.Counter != nil:
			out[key] += m.GetCounter().GetValue()
		case m.Histogram != nil:
			out[key] += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			out[key] += m.GetUntyped().GetValue()
		}
	}
	return out
}
