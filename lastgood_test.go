package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStartConfigFallsBackToTheLastGood(t *testing.T) {
	dir := t.TempDir()
	file := func(content string) string {
		p := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".yaml")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stored := func(data string, err error) func(context.Context, *config) (string, error) {
		return func(context.Context, *config) (string, error) { return data, err }
	}
	for _, tc := range []struct {
		name         string
		cmdline      string // extra command-line flag
		content      string // the --config file
		lastGood     func(context.Context, *config) (string, error)
		wantErr      string
		wantRate     float64
		wantFallback string
	}{
		{"a good file", "", "node-addition-rate: 50\n", stored("node-addition-rate: 70\n", nil), "", 50, ""},
		{"a refused file: the last good", "", "node-addition-burst: -3\n", stored("node-addition-rate: 70\n", nil), "", 70,
			"--node-addition-burst: must be at least 1, got -3: running on the last good configuration"},
		{"a refused file, nothing stored: the command line", "", "node-addition-burst: -3\n", stored("", nil), "", 100,
			"no last good configuration stored"},
		{"a refused file, the store unreadable: the command line", "", "node-addition-burst: -3\n", stored("", errors.New("forbidden")), "", 100,
			"could not be read (forbidden)"},
		{"a refused file and a refused last good: the command line", "", "node-addition-burst: -3\n", stored("node-addition-rate: -1\n", nil), "", 100,
			"refused too"},
		{"a bad command line stops the binary", "--scan-interval=-1s", "node-addition-rate: 50\n", stored("", nil), "--scan-interval", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--nodes=0:10:gpu", "--config=" + file(tc.content)}
			if tc.cmdline != "" {
				args = append(args, tc.cmdline)
			}
			c, fs, fallback, err := startConfig(context.Background(), args, nil, tc.lastGood)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.core.NodeAdditionRate != tc.wantRate || fs.Lookup("node-addition-rate").Value.String() != strconv.FormatFloat(tc.wantRate, 'g', -1, 64) {
				t.Fatalf("rate %v (flag %s), want %v; fallback %q", c.core.NodeAdditionRate, fs.Lookup("node-addition-rate").Value.String(), tc.wantRate, fallback)
			}
			if (fallback == "") != (tc.wantFallback == "") || !strings.Contains(fallback, tc.wantFallback) {
				t.Fatalf("fallback %q, want one containing %q", fallback, tc.wantFallback)
			}
		})
	}
}

func TestReloadStoresTheLastGood(t *testing.T) {
	args := []string{"--config-map=flags", "--namespace=kube-system", "--nodes=0:10:gpu"}
	c, fs, err := parseConfigFrom(args, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	m := core.NewMetrics(prometheus.NewRegistry())
	m.ConfigFallback.Set(1)
	var stored []string
	r := newReloader(args, nil, fs, c, func(core.Options) error { return nil }, nil, m, nil)
	r.persist = func(_ context.Context, data string) error { stored = append(stored, data); return nil }
	r.accepted = func() { m.ConfigFallback.Set(0) }
	cm := func(data string) *apiv1.ConfigMap {
		return &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flags", Namespace: "kube-system"}, Data: map[string]string{"config.yaml": data}}
	}
	r.reload(context.Background(), cm("node-addition-burst: -3\n"))
	if len(stored) != 0 || testutil.ToFloat64(m.ConfigFallback) != 1 {
		t.Fatalf("stored %q (fallback %v) for a refused edit", stored, testutil.ToFloat64(m.ConfigFallback))
	}
	r.reload(context.Background(), cm("node-addition-rate: 50\n"))
	if len(stored) != 1 || stored[0] != "node-addition-rate: 50\n" || testutil.ToFloat64(m.ConfigFallback) != 0 {
		t.Fatalf("stored %q (fallback %v), want the accepted content and the fallback cleared", stored, testutil.ToFloat64(m.ConfigFallback))
	}
}
