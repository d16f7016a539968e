package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseConfigRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"min greater than max", []string{"--nodes=5:2:gpu"}, `--nodes="5:2:gpu": min 5 is greater than max 2`},
		{"malformed nodes", []string{"--nodes=gpu"}, `--nodes="gpu": want min:max:name`},
		{"unknown expander", []string{"--expander=priority,cheapest"}, `--expander: unknown expander "cheapest"`},
		{"unreadable config", []string{"--config=" + filepath.Join(dir, "missing.yaml")}, "--config=" + filepath.Join(dir, "missing.yaml")},
		{"config not yaml", []string{"--config=" + write("bad.yaml", "- a\n- b\n")}, "not a YAML map"},
		{"config unknown key", []string{"--config=" + write("unknown.yaml", "scan-intervall: 10s\n")}, `unknown key "scan-intervall"`},
		{"config bad value", []string{"--config=" + write("value.yaml", "scan-interval: soon\n")}, `key "scan-interval" value "soon"`},
		{"config list for scalar", []string{"--config=" + write("list.yaml", "scan-interval: [1s, 2s]\n")}, `key "scan-interval" takes one value`},
		{"negative duration", []string{"--max-node-provision-time=-1m"}, "--max-node-provision-time: must be positive"},
		{"backoff order", []string{"--initial-node-group-backoff-duration=1h"}, "--max-node-group-backoff-duration: 30m0s is shorter"},
		{"leader timings", []string{"--leader-elect-renew-deadline=1m"}, "want lease > renew > retry > 0"},
		{"content type", []string{"--kube-api-content-type=application/yaml"}, `--kube-api-content-type="application/yaml": want application/vnd.kubernetes.protobuf or application/json`},
		{"standby informers", []string{"--standby-informers=lukewarm"}, `--standby-informers="lukewarm": want on-lead or warm`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans several lines: %q", err)
			}
		})
	}
}

func TestConfigFileAndFlagPrecedence(t *testing.T) {
	p := filepath.Join(t.TempDir(), "flags.yaml")
	body := "scan-interval: 30s\nmax-nodes-total: 7500\nnodes:\n  - 0:100:gpu-a\n  - 0:50:cpu\nexpander: priority,least-waste\nwrite-status-configmap: false\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig([]string{"--config=" + p, "--scan-interval=5s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.core.ScanInterval != 5*time.Second {
		t.Errorf("scan interval %s: the command line must win", c.core.ScanInterval)
	}
	if c.core.MaxNodesTotal != 7500 || c.core.WriteStatusConfigMap {
		t.Errorf("config file values not applied: %+v", c.core)
	}
	if len(c.nodeGroupSpecs) != 2 || c.nodeGroupSpecs[0].Name != "gpu-a" || c.nodeGroupSpecs[0].Max != 100 {
		t.Errorf("node groups %+v", c.nodeGroupSpecs)
	}
	if strings.Join(c.core.Expanders, ",") != "priority,least-waste" {
		t.Errorf("expanders %v", c.core.Expanders)
	}
}

func TestHealth(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var lastSuccess, lastRun time.Time
	h := newHealth(10*time.Minute, 15*time.Minute, func() time.Time { return lastSuccess }, func() time.Time { return lastRun })
	h.now = func() time.Time { return now }
	code := func() int {
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rr.Code
	}
	if code() != 200 {
		t.Fatal("standby unhealthy")
	}
	h.setLeader(true)
	now = now.Add(5 * time.Minute)
	if code() != 200 {
		t.Fatal("new leader unhealthy before its first deadline")
	}
	now = now.Add(6 * time.Minute) // 11m without any loop
	if code() != 500 {
		t.Fatal("leader healthy with no loop for longer than --max-inactivity")
	}
	lastRun = now // loops run but fail
	now = now.Add(5 * time.Minute)
	lastRun = now
	if code() != 500 {
		t.Fatal("leader healthy with no successful loop for longer than --max-failing-time")
	}
	lastSuccess = now
	if code() != 200 {
		t.Fatal("leader unhealthy right after a successful loop")
	}
}
