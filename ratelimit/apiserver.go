package ratelimit

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Observer watches the API server's health from the autoscaler's side: it
// wraps the Kubernetes client's transport and counts requests, slow ones,
// 429s and 5xx; and it keeps the API server's own count of requests that
// API Priority and Fairness rejected, when /metrics can be read. Safe for
// concurrent use.
type Observer struct {
	threshold time.Duration
	now       func() time.Time

	mu             sync.Mutex
	cur            Signals
	rejected       float64 // last total read from /metrics
	rejectedKnown  bool
	rejectedTaken  float64 // total at the last Take
	rejectedBase   bool    // rejectedTaken is set
	rejectedFailed bool
}

// NewObserver counts requests slower than threshold as slow. now is the
// clock (nil: time.Now).
func NewObserver(threshold time.Duration, now func() time.Time) *Observer {
	if now == nil {
		now = time.Now
	}
	return &Observer{threshold: threshold, now: now}
}

// Wrap returns a transport that reports to the observer. Watches are not
// counted: they are long by design.
func (o *Observer) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Query().Get("watch") == "true" {
			return rt.RoundTrip(req)
		}
		start := o.now()
		resp, err := rt.RoundTrip(req)
		o.record(o.now().Sub(start), resp, err)
		return resp, err
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (o *Observer) record(d time.Duration, resp *http.Response, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cur.Requests++
	if d > o.threshold {
		o.cur.Slow++
	}
	switch {
	case err != nil:
		// A transport error (connection refused, reset, timeout) is the
		// server not answering: as bad as a 5xx.
		o.cur.ServerErrors++
	case resp.StatusCode == http.StatusTooManyRequests:
		o.cur.Throttled++
	case resp.StatusCode >= 500:
		o.cur.ServerErrors++
	}
}

// SetRejectedTotal records the API server's
// apiserver_flowcontrol_rejected_requests_total as just read from
// /metrics; err says it could not be read (the signal is then unknown).
func (o *Observer) SetRejectedTotal(total float64, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.rejectedKnown = false
		o.rejectedFailed = true
		return
	}
	o.rejected, o.rejectedKnown, o.rejectedFailed = total, true, false
}

// Take returns the signals since the last Take and starts a new interval.
func (o *Observer) Take() Signals {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.cur
	o.cur = Signals{}
	if o.rejectedKnown {
		switch {
		case !o.rejectedBase || o.rejected < o.rejectedTaken:
			// First reading, or the counter restarted with the API server:
			// a baseline, not a signal.
			s.RejectedKnown = true
		default:
			s.Rejected, s.RejectedKnown = o.rejected-o.rejectedTaken, true
		}
		o.rejectedTaken, o.rejectedBase = o.rejected, true
	}
	return s
}

// RejectedMetric is the API server's count of requests rejected by API
// Priority and Fairness.
const RejectedMetric = "apiserver_flowcontrol_rejected_requests_total"

// ParseRejected sums every series of RejectedMetric in a Prometheus text
// exposition (the API server's /metrics). A scan of lines, not a full
// parse: the API server's /metrics is megabytes at 7,500 nodes. A metric
// with no series yet (nothing ever rejected) sums to zero; a body that
// cannot be read is an error, so the caller reports the signal as unknown.
func ParseRejected(r io.Reader) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	name := []byte(RejectedMetric)
	var total float64
	for sc.Scan() {
		line := sc.Bytes()
		rest, ok := rejectedSeries(line, name)
		if !ok {
			continue
		}
		v, err := sampleValue(line, rest)
		if err != nil {
			return 0, err
		}
		total += v
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading metrics: %w", err)
	}
	return total, nil
}

// rejectedSeries says whether line is a sample of the metric name (not
// of a longer name with the same prefix), and returns what follows the
// name.
func rejectedSeries(line, name []byte) (rest []byte, ok bool) {
	if !bytes.HasPrefix(line, name) || len(line) == len(name) {
		return nil, false
	}
	if c := line[len(name)]; c != '{' && c != ' ' {
		return nil, false // a longer name with the same prefix
	}
	return line[len(name):], true
}

// sampleValue is the value of a sample of RejectedMetric, rest being the
// line after the name: its labels, if any, are skipped.
func sampleValue(line, rest []byte) (float64, error) {
	if rest[0] == '{' {
		end := bytes.LastIndexByte(rest, '}')
		if end < 0 {
			return 0, fmt.Errorf("parsing %s: unterminated labels in %q", RejectedMetric, line)
		}
		rest = rest[end+1:]
	}
	fields := bytes.Fields(rest)
	if len(fields) == 0 {
		return 0, fmt.Errorf("parsing %s: no value in %q", RejectedMetric, line)
	}
	return counterValue(fields[0])
}

// counterValue parses a counter's value: a finite, non-negative number.
func counterValue(field []byte) (float64, error) {
	v, err := strconv.ParseFloat(string(field), 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s value %q: %w", RejectedMetric, field, err)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("parsing %s value %q: a counter must be a finite, non-negative number", RejectedMetric, field)
	}
	return v, nil
}
