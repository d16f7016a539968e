package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// prometheus is Debian's Prometheus server (installed by .ci/deps), bound
// to 127.0.0.1, scraping the given targets every second as job
// "vmss-autoscaler".
type prometheus struct {
	url  string
	proc *harness.Process
}

func (sc *scenario) prometheus(targets ...string) *prometheus {
	sc.t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		sc.t.Fatalf("prometheus not found (make deps installs Debian's package): %v", err)
	}
	dir := sc.t.TempDir()
	quoted := make([]string, len(targets))
	for i, t := range targets {
		quoted[i] = fmt.Sprintf("%q", t)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
- job_name: vmss-autoscaler
  static_configs:
  - targets: [%s]
`, strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		sc.t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(sc.t))
	p, err := sc.s.cp.StartProcess(sc.ctx, sc.prefix+"-prometheus", bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--storage.tsdb.retention.time=1h")
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.track(p, addr)
	pr := &prometheus{url: "http://" + addr, proc: p}
	sc.eventually("Prometheus ready", time.Minute, func() (bool, string) {
		resp, err := http.Get(pr.url + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
	return pr
}

// seriesOver runs a range query over [from, now] and says how many series
// came back, or the error.
func (p *prometheus) seriesOver(ctx context.Context, expr string, from time.Time) (int, error) {
	q := url.Values{"query": {expr}, "start": {fmt.Sprint(from.Unix())}, "end": {fmt.Sprint(time.Now().Unix())}, "step": {"1"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/api/v1/query_range?"+q.Encode(), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, fmt.Errorf("decoding %q: %w", body, err)
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("query failed: %s", r.Error)
	}
	return len(r.Data.Result), nil
}

// panelQuery is one target of a dashboard panel.
type panelQuery struct {
	Dashboard, Panel, Expr string
}

// dashboardQueries reads every panel target of the chart's dashboards,
// with Grafana's variables replaced as a dashboard showing everything
// would: $job and $node_group match all, $__rate_interval is 1m.
func dashboardQueries(t *testing.T) []panelQuery {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "charts", "vmss-autoscaler", "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards found: %v", err)
	}
	vars := regexp.MustCompile(`\$\{?(__rate_interval|__interval|__range|[a-z_]+)\}?`)
	var out []panelQuery
	type panel struct {
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var walk func(dash string, ps []panel)
	walk = func(dash string, ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					continue
				}
				expr := vars.ReplaceAllStringFunc(tg.Expr, func(v string) string {
					switch strings.Trim(v, "${}") {
					case "__rate_interval", "__range":
						return "1m"
					case "__interval":
						return "5s"
					default:
						return ".*"
					}
				})
				out = append(out, panelQuery{Dashboard: dash, Panel: p.Title, Expr: expr})
			}
			walk(dash, p.Panels)
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []panel `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		walk(filepath.Base(f), d.Panels)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Dashboard < out[j].Dashboard })
	return out
}
