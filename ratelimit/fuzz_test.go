package ratelimit

import (
	"bytes"
	"math"
	"testing"
)

// The API server's /metrics text feeds the adaptive node-addition rate: a
// counter the parser accepts must be a count (finite, not negative).
func FuzzParseRejected(f *testing.F) {
	f.Add([]byte("# TYPE apiserver_flowcontrol_rejected_requests_total counter\napiserver_flowcontrol_rejected_requests_total{flow_schema=\"a\",priority_level=\"b\",reason=\"queue-full\"} 3\n"))
	f.Add([]byte("apiserver_flowcontrol_rejected_requests_total 1e3\napiserver_flowcontrol_rejected_requests_total_other 5\n"))
	f.Add([]byte("apiserver_flowcontrol_rejected_requests_total{a=\"}\"} 2 1700000000\n"))
	f.Add([]byte("apiserver_flowcontrol_rejected_requests_total NaN\n"))
	f.Add([]byte("apiserver_flowcontrol_rejected_requests_total{x=\"y\" 4\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		total, err := ParseRejected(bytes.NewReader(body))
		if err != nil {
			return
		}
		if math.IsNaN(total) || math.IsInf(total, 0) || total < 0 {
			t.Fatalf("ParseRejected(%q) = %v: not a count", body, total)
		}
	})
}
