package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// steppingClock advances by the delay the server asked for, so latency is
// measured without sleeping.
type steppingClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *steppingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *steppingClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestObserverCountsWhatTheServerAnswered(t *testing.T) {
	clk := &steppingClock{now: t0}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			clk.step(2 * time.Second)
		case "/throttled":
			w.WriteHeader(http.StatusTooManyRequests)
		case "/broken":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/missing":
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	o := NewObserver(time.Second, clk.Now)
	client := &http.Client{Transport: o.Wrap(http.DefaultTransport)}
	for _, path := range []string{"/ok", "/slow", "/throttled", "/throttled", "/broken", "/missing", "/api/v1/pods?watch=true"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	// A server that does not answer at all is as bad as a 5xx. It hangs up
	// without a word (a closed server's port could be taken by another
	// test process before the request is sent).
	mute := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = conn.Close()
	}))
	defer mute.Close()
	if _, err := client.Get(mute.URL); err == nil {
		t.Fatal("request to a server that hung up succeeded")
	}
	got := o.Take()
	want := Signals{Requests: 7, Slow: 1, Throttled: 2, ServerErrors: 2}
	if got != want {
		t.Fatalf("signals %+v, want %+v (the watch not counted)", got, want)
	}
	if got := o.Take(); got != (Signals{}) {
		t.Fatalf("second Take %+v, want a fresh interval", got)
	}
}

func TestObserverRejectedDelta(t *testing.T) {
	o := NewObserver(time.Second, nil)
	if s := o.Take(); s.RejectedKnown {
		t.Fatal("rejections known before /metrics was read")
	}
	o.SetRejectedTotal(40, nil)
	if s := o.Take(); !s.RejectedKnown || s.Rejected != 0 {
		t.Fatalf("first reading %+v: a baseline, not a signal", s)
	}
	o.SetRejectedTotal(43, nil)
	if s := o.Take(); s.Rejected != 3 {
		t.Fatalf("rejected %v, want the increase 3", s.Rejected)
	}
	o.SetRejectedTotal(2, nil) // the API server restarted
	if s := o.Take(); !s.RejectedKnown || s.Rejected != 0 {
		t.Fatalf("after a counter reset %+v, want a new baseline", s)
	}
	o.SetRejectedTotal(0, http.ErrHandlerTimeout)
	if s := o.Take(); s.RejectedKnown {
		t.Fatalf("after a failed read %+v, want unknown", s)
	}
}

func TestParseRejected(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       float64
		err        string
	}{
		{"series summed", `# HELP apiserver_flowcontrol_rejected_requests_total [BETA] Number of requests rejected by API Priority and Fairness subsystem
# TYPE apiserver_flowcontrol_rejected_requests_total counter
apiserver_flowcontrol_rejected_requests_total{flow_schema="global-default",priority_level="global-default",reason="queue-full"} 4
apiserver_flowcontrol_rejected_requests_total{flow_schema="service-accounts",priority_level="workload-low",reason="time-out"} 1.5e1
apiserver_flowcontrol_rejected_requests_total_other 100
apiserver_flowcontrol_current_inqueue_requests{flow_schema="x"} 7
`, 19, ""},
		{"labels with braces in values", `apiserver_flowcontrol_rejected_requests_total{flow_schema="a}b",reason="x"} 2` + "\n", 2, ""},
		{"never rejected: no series", "apiserver_request_total{verb=\"GET\"} 100\n", 0, ""},
		{"unlabelled", "apiserver_flowcontrol_rejected_requests_total 6\n", 6, ""},
		{"garbage value", "apiserver_flowcontrol_rejected_requests_total{a=\"b\"} many\n", 0, `value "many"`},
		{"unterminated labels", "apiserver_flowcontrol_rejected_requests_total{a=\"b\" 1\n", 0, "unterminated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRejected(strings.NewReader(tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestParseRejectedRefusesNonCounts(t *testing.T) {
	for _, v := range []string{"NaN", "+Inf", "-Inf", "-1"} {
		body := RejectedMetric + `{flow_schema="a"} ` + v + "\n"
		if got, err := ParseRejected(strings.NewReader(body)); err == nil {
			t.Errorf("ParseRejected(%q) = %v, nil; want an error (a counter is finite and not negative)", body, got)
		}
	}
}
