package measure

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const sample = `# TYPE requests_total counter
requests_total{code="200",verb="GET"} 10
requests_total{code="429",verb="GET"} 2
requests_total{code="429",verb="PUT"} 3
# TYPE depth gauge
depth{queue="a"} 4
depth{queue="b"} 1.5
raw 7
# TYPE loop_seconds histogram
loop_seconds_bucket{le="+Inf"} 3
loop_seconds_sum 9
loop_seconds_count 3
`

func TestSum(t *testing.T) {
	fams, err := ParseMetrics(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"a counter's every series", "requests_total", nil, 15},
		{"a label", "requests_total", map[string]string{"code": "429"}, 5},
		{"two labels", "requests_total", map[string]string{"code": "429", "verb": "PUT"}, 3},
		{"a label no series carries", "requests_total", map[string]string{"code": "500"}, 0},
		{"a label no series has", "requests_total", map[string]string{"zone": "1"}, 0},
		{"a gauge", "depth", nil, 5.5},
		{"untyped", "raw", nil, 7},
		{"a histogram is no counter", "loop_seconds", nil, 0},
		{"missing", "nothing", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Sum(fams, tc.metric, tc.labels); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseMetricsError(t *testing.T) {
	if _, err := ParseMetrics(strings.NewReader("this is not { metrics\n")); err == nil || !strings.Contains(err.Error(), "parsing metrics") {
		t.Errorf("error %v, want a parse error", err)
	}
}

// wantedErr says whether a case wanted an error (want not ""), failing t
// unless err names it; an error not wanted stops t.
func wantedErr(t *testing.T, err error, want string) bool {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatal(err)
		}
		return false
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want one naming %q", err, want)
	}
	return true
}

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte(sample))
		case "/broken":
			_, _ = w.Write([]byte("{"))
		default:
			http.Error(w, "no", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name, path string
		want       float64
		wantErr    string
	}{
		{"metrics", "/metrics", 15, ""},
		{"not 200", "/other", 0, "503"},
		{"not metrics", "/broken", 0, "parsing metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fams, err := Scrape(context.Background(), srv.URL+tc.path)
			if wantedErr(t, err, tc.wantErr) {
				return
			}
			if got := Sum(fams, "requests_total", nil); got != tc.want {
				t.Errorf("requests_total %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAPIServerMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("# TYPE apiserver_request_total counter\napiserver_request_total{code=\"200\"} 41\napiserver_request_total{code=\"429\"} 1\n"))
	}))
	defer srv.Close()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	fams, err := APIServerMetrics(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if got := Sum(fams, "apiserver_request_total", nil); got != 42 {
		t.Errorf("apiserver_request_total %v, want 42", got)
	}
	srv.Close()
	if _, err := APIServerMetrics(context.Background(), c); err == nil {
		t.Error("no error from an API server that is gone")
	}
}
