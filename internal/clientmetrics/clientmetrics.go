// Package clientmetrics exports the Kubernetes client's request metrics
// (client-go's k8s.io/client-go/tools/metrics hooks) under the names
// component-base gives them in Kubernetes components and the
// cluster-autoscaler, onto a registry of the caller's (never the global
// one):
//
//	rest_client_requests_total{code, method, host}
//	rest_client_request_duration_seconds{verb, host, resource}
//	rest_client_rate_limiter_duration_seconds{verb, host}
//	rest_client_request_retries_total{code, verb, host}
//	rest_client_request_size_bytes{verb, host}
//	rest_client_response_size_bytes{verb, host}
//
// The duration histogram has one label more than component-base's,
// resource (e.g. "pods", "nodes/status", "leases"), from the request's
// URL template: its _count is the requests by verb and resource. Watches
// are counted in rest_client_requests_total when they start; client-go
// times no stream, so they are not in the duration histogram.
package clientmetrics

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// Metrics are the client's request metrics.
type Metrics struct {
	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	rateLimiter  *prometheus.HistogramVec
	retries      *prometheus.CounterVec
	requestSize  *prometheus.HistogramVec
	responseSize *prometheus.HistogramVec
}

// New builds the metrics and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	// Latency buckets as component-base's; sizes from 64 B to 4 MiB.
	latencyBuckets := []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
	sizeBuckets := prometheus.ExponentialBuckets(64, 4, 9)
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_requests_total",
			Help: "Number of HTTP requests to the Kubernetes API server, partitioned by status code, method, and host."},
			[]string{"code", "method", "host"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_request_duration_seconds",
			Help: "Request latency in seconds. Broken down by verb, host and resource.", Buckets: latencyBuckets},
			[]string{"verb", "host", "resource"}),
		rateLimiter: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_rate_limiter_duration_seconds",
			Help: "Client side rate limiter latency in seconds. Broken down by verb, and host.", Buckets: latencyBuckets},
			[]string{"verb", "host"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_request_retries_total",
			Help: "Number of request retries, partitioned by status code, verb, and host."},
			[]string{"code", "verb", "host"}),
		requestSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_request_size_bytes",
			Help: "Request size in bytes. Broken down by verb and host.", Buckets: sizeBuckets},
			[]string{"verb", "host"}),
		responseSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_response_size_bytes",
			Help: "Response size in bytes. Broken down by verb and host.", Buckets: sizeBuckets},
			[]string{"verb", "host"}),
	}
	reg.MustRegister(m.requests, m.duration, m.rateLimiter, m.retries, m.requestSize, m.responseSize)
	return m
}

// Register makes client-go report to m. client-go keeps one set of
// adapters per process and the first Register wins, so a process calls
// this once, from main. It returns false when another set was registered
// first (m then stays empty).
func (m *Metrics) Register() bool {
	result := resultAdapter{m.requests}
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestLatency:     latencyAdapter{m.duration},
		RateLimiterLatency: rateLimiterAdapter{m.rateLimiter},
		RequestResult:      result,
		RequestRetry:       retryAdapter{m.retries},
		RequestSize:        sizeAdapter{m.requestSize},
		ResponseSize:       sizeAdapter{m.responseSize},
	})
	got, ok := clientmetrics.RequestResult.(resultAdapter)
	return ok && got == result
}

type resultAdapter struct{ v *prometheus.CounterVec }

func (a resultAdapter) Increment(_ context.Context, code, method, host string) {
	a.v.WithLabelValues(code, method, host).Inc()
}

type latencyAdapter struct{ v *prometheus.HistogramVec }

func (a latencyAdapter) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	a.v.WithLabelValues(verb, u.Host, Resource(u.Path)).Observe(latency.Seconds())
}

type rateLimiterAdapter struct{ v *prometheus.HistogramVec }

func (a rateLimiterAdapter) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	a.v.WithLabelValues(verb, u.Host).Observe(latency.Seconds())
}

type retryAdapter struct{ v *prometheus.CounterVec }

func (a retryAdapter) IncrementRetry(_ context.Context, code, verb, host string) {
	a.v.WithLabelValues(code, verb, host).Inc()
}

type sizeAdapter struct{ v *prometheus.HistogramVec }

func (a sizeAdapter) Observe(_ context.Context, verb, host string, size float64) {
	a.v.WithLabelValues(verb, host).Observe(size)
}

// Resource returns the resource (and subresource) a Kubernetes API path
// names: "/api/v1/namespaces/{namespace}/pods/{name}" → "pods",
// "/api/v1/nodes/{name}/status" → "nodes/status",
// "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}" →
// "leases", "/api/v1/namespaces/{name}" → "namespaces". Paths outside the
// resource API (discovery, /metrics, /version) give "" (a fixed, small set
// of label values whatever the path).
func Resource(path string) string {
	rest, ok := resourceAPIPath(strings.Split(strings.Trim(path, "/"), "/"))
	if !ok {
		return ""
	}
	rest = outsideNamespace(rest)
	switch len(rest) {
	case 0:
		return ""
	case 1, 2:
		return rest[0]
	default:
		return rest[0] + "/" + rest[2]
	}
}

// resourceAPIPath is the segments of a resource API path after its group
// and version (/api/v1, /apis/group/version); false for other paths.
func resourceAPIPath(segs []string) ([]string, bool) {
	switch {
	case len(segs) >= 3 && segs[0] == "api":
		return segs[2:], true
	case len(segs) >= 4 && segs[0] == "apis":
		return segs[3:], true
	}
	return nil, false
}

// outsideNamespace drops namespaces/{ns}/ before a namespaced resource;
// namespaces and namespaces/{name}[/status|finalize] are the namespace
// itself and stay.
func outsideNamespace(rest []string) []string {
	if len(rest) >= 3 && rest[0] == "namespaces" && !(len(rest) == 3 && (rest[2] == "status" || rest[2] == "finalize")) {
		return rest[2:]
	}
	return rest
}
