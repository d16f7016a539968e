package main

import (
	"context"
	"math"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// apiEvery is how often the sampler reads the API server's /metrics (a few
// MB at thousands of nodes: not every sample).
const apiEvery = 10 * time.Second

// apiPoint is the API server over the interval that ended At seconds after
// the workload was submitted, from its /metrics.
type apiPoint struct {
	At float64 `json:"t"`
	// Requests a second that are not long-running (watches, exec).
	RequestsPerSecond float64 `json:"requestsPerSecond"`
	// P50 and P99 of those requests' latency, in milliseconds, as
	// histogram_quantile estimates it from apiserver_request_duration_seconds
	// (APF's queueing included); 0 when the interval saw none.
	P50 float64 `json:"p50ms"`
	P99 float64 `json:"p99ms"`
	// Rejected is apiserver_flowcontrol_rejected_requests_total and
	// Throttled the 429s in apiserver_request_total, both since the API
	// server started.
	Rejected  float64 `json:"rejected"`
	Throttled float64 `json:"throttled"`
}

// apiCounters is what one read of the API server's /metrics holds that the
// intervals are computed from.
type apiCounters struct {
	// buckets are the cumulative counts by upper bound of
	// apiserver_request_duration_seconds for requests that are not
	// long-running, summed over verbs and resources.
	buckets   map[float64]float64
	count     float64
	rejected  float64
	throttled float64
}

// longRunning are the verbs whose duration is a connection's, not a
// request's.
var longRunning = []string{"WATCH", "WATCHLIST", "CONNECT"}

func apiCountersOf(fams map[string]*dto.MetricFamily) apiCounters {
	c := apiCounters{buckets: map[float64]float64{}}
	for _, m := range fams["apiserver_request_duration_seconds"].GetMetric() {
		verb := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "verb" {
				verb = l.GetValue()
			}
		}
		if slices.Contains(longRunning, verb) {
			continue
		}
		h := m.GetHistogram()
		c.count += float64(h.GetSampleCount())
		for _, b := range h.GetBucket() {
			c.buckets[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
	}
	c.rejected = measure.Sum(fams, "apiserver_flowcontrol_rejected_requests_total", nil)
	c.throttled = measure.Sum(fams, "apiserver_request_total", map[string]string{"code": "429"})
	return c
}

// interval is the API server between two reads, dt seconds apart.
func interval(prev, cur apiCounters, dt float64) apiPoint {
	p := apiPoint{Rejected: cur.rejected, Throttled: cur.throttled}
	n := cur.count - prev.count
	if n <= 0 || dt <= 0 {
		return p
	}
	p.RequestsPerSecond = n / dt
	bounds := make([]float64, 0, len(cur.buckets))
	for b := range cur.buckets {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	delta := make([]float64, len(bounds))
	for i, b := range bounds {
		delta[i] = cur.buckets[b] - prev.buckets[b]
	}
	p.P50 = 1000 * quantile(0.5, bounds, delta, n)
	p.P99 = 1000 * quantile(0.99, bounds, delta, n)
	return p
}

// quantile is Prometheus' histogram_quantile over cumulative bucket counts
// (upper bounds sorted) of n observations: linear within the bucket, the
// largest finite bound when the quantile falls in the +Inf bucket.
func quantile(q float64, bounds, cumulative []float64, n float64) float64 {
	rank := q * n
	lower, below := 0.0, 0.0
	for i, b := range bounds {
		if cumulative[i] >= rank {
			if math.IsInf(b, 1) {
				return lower
			}
			in := cumulative[i] - below
			if in <= 0 {
				return b
			}
			return lower + (b-lower)*(rank-below)/in
		}
		lower, below = b, cumulative[i]
	}
	return lower
}

// apiSummary is the API server while nodes joined (the scale-up).
type apiSummary struct {
	// Intervals is the number of apiEvery intervals read.
	Intervals int `json:"intervals"`
	// MedianP99 and WorstP99 are the median and the largest of the
	// intervals' p99 latencies, in milliseconds; WorstP50 the largest p50.
	MedianP99 float64 `json:"medianP99ms"`
	WorstP99  float64 `json:"worstP99ms"`
	WorstP50  float64 `json:"worstP50ms"`
	// RequestsPerSecond is the mean over the scale-up.
	RequestsPerSecond float64 `json:"requestsPerSecond"`
	// Rejected (APF) and Throttled (429s) during the scale-up.
	Rejected  float64 `json:"rejected"`
	Throttled float64 `json:"throttled"`
}

// summariseAPI sums up the intervals that ended in (from, to], in seconds
// after submission.
func summariseAPI(points []apiPoint, from, to float64) apiSummary {
	var s apiSummary
	var p99s []float64
	var first, last *apiPoint
	total := 0.0
	for i := range points {
		p := &points[i]
		if p.At <= from {
			first = p
			continue
		}
		if p.At > to {
			break
		}
		last = p
		s.Intervals++
		total += p.RequestsPerSecond
		p99s = append(p99s, p.P99)
		s.WorstP99 = max(s.WorstP99, p.P99)
		s.WorstP50 = max(s.WorstP50, p.P50)
	}
	if s.Intervals == 0 {
		return s
	}
	slices.Sort(p99s)
	s.MedianP99 = p99s[(len(p99s)-1)/2]
	s.RequestsPerSecond = total / float64(s.Intervals)
	if first != nil {
		s.Rejected = last.Rejected - first.Rejected
		s.Throttled = last.Throttled - first.Throttled
	} else {
		s.Rejected, s.Throttled = last.Rejected, last.Throttled
	}
	return s
}

// readAPI reads the API server's counters.
func (e *env) readAPI(ctx context.Context) (apiCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, apiEvery)
	defer cancel()
	fams, err := measure.APIServerMetrics(ctx, e.client)
	if err != nil {
		return apiCounters{}, err
	}
	return apiCountersOf(fams), nil
}
