package app

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
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
		// Range checks at the upper end: a wrong unit is refused with the flag and the value.
		{"nodes a typo", []string{"--nodes=0:5000000:gpu"}, `--nodes="0:5000000:gpu": max 5000000 is above 100000`},
		{"scan interval an hour", []string{"--scan-interval=2h"}, "--scan-interval=2h0m0s: must be between 1ms and 1h0m0s"},
		{"provision time a year", []string{"--max-node-provision-time=8760h"}, "--max-node-provision-time=8760h0m0s: must be between"},
		{"unneeded time in the config file", []string{"--config=" + write("unneeded.yaml", "scale-down-unneeded-time: 1000h\n")}, "--scale-down-unneeded-time=1000h0m0s: must be between 0s and 168h0m0s"},
		{"pod event interval negative", []string{"--pod-event-interval=-1s"}, "--pod-event-interval=-1s: must be between 0s and 168h0m0s"},
		{"soft taints negative", []string{"--max-soft-taints-per-loop=-1"}, "--max-soft-taints-per-loop=-1: must be between 0 and 100000"},
		{"burst a typo", []string{"--node-addition-burst=2000000"}, "--node-addition-burst=2000000: must be between 1 and 100000"},
		{"in flight a typo", []string{"--max-nodes-in-flight=3000000"}, "--max-nodes-in-flight=3000000: must be between 1 and 100000"},
		{"graceful termination a week", []string{"--max-graceful-termination-sec=604800"}, "--max-graceful-termination-sec=604800: must be between 0 and 86400"},
		{"preflight time a month", []string{"--max-preflight-time=720h"}, "--max-preflight-time=720h0m0s: must be between"},
		{"brake window a month", []string{"--replacement-brake-window=720h"}, "--replacement-brake-window=720h0m0s: must be between"},
		{"max nodes total", []string{"--max-nodes-total=1000000"}, "--max-nodes-total=1000000: must be between 0 and 100000"},
		{"kube client qps zero", []string{"--kube-client-qps=0"}, "--kube-client-qps=0: must be between 0.1 and 100000"},
		{"kube client burst zero", []string{"--kube-client-burst=0"}, "--kube-client-burst=0: must be between 1 and 100000"},
		{"apiserver metrics interval negative", []string{"--apiserver-metrics-interval=-1s"}, "--apiserver-metrics-interval=-1s: must be between 0s and 24h0m0s"},
		{"max inactivity a month", []string{"--max-inactivity=720h"}, "--max-inactivity=720h0m0s: must be between 1s and 168h0m0s"},
		{"lease a day", []string{"--leader-elect-lease-duration=24h"}, "--leader-elect-lease-duration=24h0m0s: must be between"},
		{"content type", []string{"--kube-api-content-type=application/yaml"}, `--kube-api-content-type="application/yaml": want application/vnd.kubernetes.protobuf or application/json`},
		{"standby informers", []string{"--standby-informers=lukewarm"}, `--standby-informers="lukewarm": want on-lead or warm`},
		// A share that is not a number is no share: NaN compares false
		// both ways, so a range check written as "v < 0 || v > 1" let it
		// through (a brake with a NaN share).
		{"share not a number", []string{"--scale-down-brake-cluster-share=NaN"}, "--scale-down-brake-cluster-share: must be between 0 and 1, got NaN"},
		// The balloon namespace gets the Deployment rights: never kube-system or the autoscaler's own.
		{"balloons in kube-system", []string{"--namespace=ops", "--balloon-namespace=kube-system"}, `--balloon-namespace: "kube-system" is refused`},
		{"balloons in the autoscaler's namespace", []string{"--namespace=ops", "--balloon-namespace=ops"}, `--balloon-namespace: "ops" is the autoscaler's own namespace (--namespace)`},
		{"balloons in the default --namespace", []string{"--balloon-namespace=kube-system"}, `--balloon-namespace: "kube-system" is refused`},
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
	h := newLiveness(10*time.Minute, 15*time.Minute, func() time.Time { return lastSuccess }, func() time.Time { return lastRun })
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

// TestCommandLineOnlyFlagsClassified: commandLineOnly is the list the
// refusals, the --help marks, the chart and SECURITY.md's table follow.
// Every flag whose name says identity, endpoint, credential or image is in
// it, or named here as not privileged, with why: a new such flag must be
// classified.
func TestCommandLineOnlyFlagsClassified(t *testing.T) {
	notPrivileged := map[string]string{
		"azure-resource-groups":              "which scale sets are managed, within what the identity's role assignment allows: cost and disruption",
		"azure-cache-ttl":                    "how often ARM is read",
		"azure-vm-list-interval":             "how often ARM is read",
		"azure-vm-list-active-interval":      "how often ARM is read",
		"azure-vm-list-budget":               "how often ARM is read",
		"azure-vm-list-parallelism":          "how many ARM reads are in flight",
		"azure-allow-aks-managed-scale-sets": "which scale sets are managed, within what the identity's role assignment allows: cost and disruption",
		"azure-force-delete":                 "how instances are deleted",
		"azure-concurrent-scale-ups":         "how often a scale set is written",
		"azure-operation-poll-interval":      "how often ARM operations are polled",
	}
	looksPrivileged := func(name string) bool {
		for _, s := range []string{"azure-", "image", "kubeconfig", "token", "endpoint", "secret", "ca-file", "authority", "tenant", "client-id"} {
			if strings.Contains(name, s) {
				return true
			}
		}
		return false
	}
	var prov providerFlags
	kf := newKlogFlags()
	_, fs, err := parseConfigFrom([]string{"--nodes=0:10:gpu"}, func(fs *pflag.FlagSet) {
		prov.register(fs)
		kf.addShadows(fs)
	}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, why := range commandLineOnly {
		f := fs.Lookup(name)
		switch {
		case f == nil:
			t.Errorf("commandLineOnly names --%s: not a flag", name)
		case !strings.HasPrefix(why, "it decides "):
			t.Errorf("--%s: reason %q, want one saying what it decides", name, why)
		case isLive(f):
			t.Errorf("--%s: command line only and live", name)
		case !strings.HasSuffix(f.Usage, " (command line only: "+why+")"):
			t.Errorf("--%s: help %q does not say it is command line only, and why", name, f.Usage)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if looksPrivileged(f.Name) && commandLineOnly[f.Name] == "" && notPrivileged[f.Name] == "" {
			t.Errorf("--%s: add it to commandLineOnly (config.go) with what it decides, or to notPrivileged here with why not", f.Name)
		}
		if commandLineOnly[f.Name] != "" && notPrivileged[f.Name] != "" {
			t.Errorf("--%s: both command line only and not privileged", f.Name)
		}
	})
	// The behaviour's tests (config_test.go) cover every key of the list.
	if len(commandLineOnlyKeys) != len(commandLineOnly) {
		t.Errorf("config_test.go tests %d command-line-only keys, commandLineOnly has %d", len(commandLineOnlyKeys), len(commandLineOnly))
	}
	for name, why := range commandLineOnly {
		if commandLineOnlyKeys[name] != why {
			t.Errorf("--%s: config_test.go's reason %q, commandLineOnly's %q", name, commandLineOnlyKeys[name], why)
		}
	}
}
