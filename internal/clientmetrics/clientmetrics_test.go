package clientmetrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestResource(t *testing.T) {
	tests := []struct{ path, want string }{
		{"/api/v1/pods", "pods"},
		{"/api/v1/namespaces/{namespace}/pods", "pods"},
		{"/api/v1/namespaces/{namespace}/pods/{name}", "pods"},
		{"/api/v1/namespaces/{namespace}/pods/{name}/eviction", "pods/eviction"},
		{"/api/v1/namespaces/kube-system/configmaps/status", "configmaps"},
		{"/api/v1/nodes/{name}", "nodes"},
		{"/api/v1/nodes/{name}/status", "nodes/status"},
		{"/api/v1/namespaces", "namespaces"},
		{"/api/v1/namespaces/{name}", "namespaces"},
		{"/api/v1/namespaces/{name}/status", "namespaces/status"},
		{"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", "leases"},
		{"/apis/apps/v1/daemonsets", "daemonsets"},
		{"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups", "podgroups"},
		{"/prefix/api/v1/pods", ""},
		{"/api/v1", ""},
		{"/apis/apps/v1", ""},
		{"/apis", ""},
		{"/metrics", ""},
		{"/version", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := Resource(tt.path); got != tt.want {
			t.Errorf("Resource(%q) = %q, want %q", tt.path, got, tt.want)
		}
	}
}

// TestClientRequestsAreCounted: requests of a real clientset to an API
// server are counted by code, method and host, and timed by verb and
// resource, on the registry given, not the global one (client-go's
// adapters are registered once per process: this is the package's only
// test that registers).
func TestClientRequestsAreCounted(t *testing.T) {
	// httptest binds 127.0.0.1.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes":
			_, _ = w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[]}`))
		case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/kube-system/configmaps/"):
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	}))
	defer srv.Close()

	reg := prometheus.NewRegistry()
	m := New(reg)
	if !m.Register() {
		t.Fatal("client-go's metrics were registered before this test")
	}
	if New(prometheus.NewRegistry()).Register() {
		t.Fatal("a second Register took effect")
	}
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 3 {
		if _, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.CoreV1().ConfigMaps("kube-system").Get(ctx, "status", metav1.GetOptions{}); err == nil {
		t.Fatal("Get of a missing ConfigMap succeeded")
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	tests := []struct {
		name   string
		metric string
		labels map[string]string
		want   uint64
	}{
		{"requests GET 200", "rest_client_requests_total", map[string]string{"code": "200", "method": "GET", "host": host}, 3},
		{"requests GET 404", "rest_client_requests_total", map[string]string{"code": "404", "method": "GET", "host": host}, 1},
		{"duration GET nodes", "rest_client_request_duration_seconds", map[string]string{"verb": "GET", "resource": "nodes", "host": host}, 3},
		{"duration GET configmaps", "rest_client_request_duration_seconds", map[string]string{"verb": "GET", "resource": "configmaps"}, 1},
		{"response sizes", "rest_client_response_size_bytes", map[string]string{"verb": "GET"}, 4},
		{"rate limiter", "rest_client_rate_limiter_duration_seconds", map[string]string{"verb": "GET"}, 4},
	}
	for _, tt := range tests {
		if got := count(t, reg, tt.metric, tt.labels); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
	global, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range global {
		if strings.HasPrefix(mf.GetName(), "rest_client_") {
			t.Errorf("%s is on the global registry", mf.GetName())
		}
	}
}

// count sums the counter values or histogram sample counts of the series
// of a metric that carry the given labels.
func count(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			if h := m.GetHistogram(); h != nil {
				n += h.GetSampleCount()
			} else {
				n += uint64(m.GetCounter().GetValue())
			}
		}
	}
	return n
}
