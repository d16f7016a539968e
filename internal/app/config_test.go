package app

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

// commandLineOnlyKeys are the flags a flags file may not set, with the
// reason each refusal gives: the keys SECURITY.md calls privileged.
var commandLineOnlyKeys = map[string]string{
	"azure-arm-endpoint":           "it decides where the Azure credential is sent",
	"azure-authority-host":         "it decides where the federated token or client secret is sent for an Azure token",
	"azure-token-audience":         "it decides which resource the Azure token is requested for",
	"azure-ca-file":                "it decides which servers are trusted with the Azure credential",
	"azure-token-file":             "it decides which file is sent as the Azure bearer token",
	"azure-client-secret-file":     "it decides which file is sent as the Azure client secret",
	"azure-auth":                   "it decides which Azure credential is used",
	"azure-tenant-id":              "it decides which Azure identity is used",
	"azure-client-id":              "it decides which Azure identity is used",
	"azure-subscription-id":        "it decides which subscription the Azure credential acts on",
	"kubeconfig":                   "it decides where the Kubernetes credential is sent, and which one",
	"balloon-image":                "it decides what code runs in the balloon pods on the nodes",
	"balloon-max-replicas":         "it decides how many balloons a Deployment may hold, which the chart's admission policy is rendered from",
	"leader-elect":                 "it decides whether a replica acts without holding the Lease: two such replicas both write to the cloud",
	"leader-elect-lease-duration":  "it decides how long a leader's Lease holds unrenewed: replicas that disagree can both lead",
	"leader-elect-renew-deadline":  "it decides how long a leader acts without renewing its Lease: replicas that disagree can both lead",
	"leader-elect-retry-period":    "it decides how often a standby tries the Lease: replicas that disagree can both lead",
	"leader-elect-resource-name":   "it decides which Lease fences the replicas: two names, two leaders",
	"enable-provisioning-requests": "it decides which APIs are watched, which needs the RBAC the chart grants with it",
	"enable-capacity-buffers":      "it decides which APIs are watched, which needs the RBAC the chart grants with it",
	"log_dir":                      "it decides where the logs are written",
	"log_file":                     "it decides where the logs are written",
	"log_file_max_size":            "it decides where the logs are written (when a log file is cut)",
	"logtostderr":                  "it decides where the logs are written",
	"alsologtostderr":              "it decides where the logs are written",
	"one_output":                   "it decides where the logs are written",
	"stderrthreshold":              "it decides which logs reach the container's output",
}

// withProvider registers the provider's flags, as the binary does.
func withProvider(fs *pflag.FlagSet) {
	var p providerFlags
	p.register(fs)
}

func refusal(key string) string {
	return "--" + key + ": may be set on the command line only (" + commandLineOnlyKeys[key] + ")"
}

// commandLineOnlyCases: each key alone, then the forms an edit may take.
func commandLineOnlyCases() []struct {
	name, content, cmdline string
	want                   []string
} {
	type tc = struct {
		name, content, cmdline string
		want                   []string
	}
	var out []tc
	for _, key := range slices.Sorted(maps.Keys(commandLineOnlyKeys)) {
		out = append(out, tc{key, "node-addition-rate: 60\n" + key + ": https://attacker.example\n", "", []string{refusal(key)}})
	}
	return append(out,
		tc{"written --azure-authority-host", "node-addition-rate: 60\n--azure-authority-host: https://attacker.example\n", "", []string{refusal("azure-authority-host")}},
		tc{"azure-arm-endpoint also on the command line", "azure-arm-endpoint: https://attacker.example\n", "--azure-arm-endpoint=https://management.example", []string{refusal("azure-arm-endpoint")}},
		tc{"azure-arm-endpoint empty", "node-addition-rate: 60\nazure-arm-endpoint:\n", "", []string{refusal("azure-arm-endpoint")}},
		tc{"two keys, both named", "azure-token-file: /var/run/secrets/kubernetes.io/serviceaccount/token\nazure-arm-endpoint: https://attacker.example\n", "",
			[]string{refusal("azure-arm-endpoint") + "; " + refusal("azure-token-file")}},
		tc{"with a bad value elsewhere: the key is named", "node-addition-burst: 0\nballoon-image: attacker.example/miner:1\n", "", []string{refusal("balloon-image")}},
		tc{"leader election off: two unfenced leaders", "node-addition-rate: 60\nleader-elect: false\n", "", []string{refusal("leader-elect")}},
		tc{"logs to a file on the pod's disk", "log_file: /tmp/x.log\nlogtostderr: false\n", "", []string{refusal("log_file") + "; " + refusal("logtostderr")}},
	)
}

// TestCommandLineOnlyKeysRefusedInConfigFile: a --config file naming a
// command-line-only flag is refused whole, with the key and the reason.
func TestCommandLineOnlyKeysRefusedInConfigFile(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range commandLineOnlyCases() {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "flags"+string(rune('a'+i))+".yaml")
			if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"--nodes=0:10:gpu", "--config=" + p}
			if tc.cmdline != "" {
				args = append(args, tc.cmdline)
			}
			_, err := parseConfig(args, withProvider)
			if err == nil {
				t.Fatalf("--config file accepted:\n%s", tc.content)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), "--config="+p+": "+w) {
					t.Fatalf("err = %v\nwant one containing %q", err, "--config="+p+": "+w)
				}
			}
		})
	}
}

// TestCommandLineOnlyKeysRefusedLive: an edit of the flags ConfigMap naming
// a command-line-only flag is refused whole (its live keys are not applied
// either), with a ConfigRejected event naming the key; nothing is reported
// as waiting for a restart, and the last good configuration stays.
func TestCommandLineOnlyKeysRefusedLive(t *testing.T) {
	for _, tc := range commandLineOnlyCases() {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--config-map=flags", "--namespace=kube-system", "--nodes=0:10:gpu"}
			if tc.cmdline != "" {
				args = append(args, tc.cmdline)
			}
			c, fs, err := parseConfigFrom(args, withProvider, nil, "")
			if err != nil {
				t.Fatal(err)
			}
			var applied []core.Options
			var stored []string
			rec := record.NewFakeRecorder(100)
			m := core.NewMetrics(prometheus.NewRegistry())
			r := newReloader(args, withProvider, fs, c, func(o core.Options) error { applied = append(applied, o); return nil }, rec, m, nil)
			r.persist = func(_ context.Context, data string) error { stored = append(stored, data); return nil }
			cm := func(data string) *apiv1.ConfigMap {
				return &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flags", Namespace: "kube-system"}, Data: map[string]string{"config.yaml": data}}
			}
			ctx := context.Background()
			const good = "node-addition-rate: 50\n"
			r.reload(ctx, cm(good))
			if len(applied) != 1 || len(stored) != 1 {
				t.Fatalf("the good edit: applied %d stored %d", len(applied), len(stored))
			}
			<-rec.Events // ConfigApplied
			before := map[string]string{}
			for k := range commandLineOnlyKeys {
				before[k] = r.values[k]
			}

			r.reload(ctx, cm(tc.content))
			var evs []string
			for len(rec.Events) > 0 {
				evs = append(evs, <-rec.Events)
			}
			all := strings.Join(evs, "\n")
			for _, w := range tc.want {
				want := "Warning ConfigRejected refused, the last good configuration stays: ConfigMap kube-system/flags key config.yaml: " + w
				if !strings.Contains(all, want) {
					t.Fatalf("events:\n%s\nwant one containing %q", all, want)
				}
			}
			if len(evs) != 1 {
				t.Fatalf("events %q, want the ConfigRejected alone (no ConfigApplied, no ConfigRestartRequired)", evs)
			}
			if len(applied) != 1 {
				t.Fatalf("options applied %d times, want once (the good edit): the refused edit's live keys must not apply", len(applied))
			}
			if got := testutil.ToFloat64(m.ConfigReloads.WithLabelValues("rejected")); got != 1 {
				t.Fatalf("rejected reloads %v, want 1", got)
			}
			if got := testutil.ToFloat64(m.ConfigRestartRequired); got != 0 {
				t.Fatalf("config_restart_required %v, want 0", got)
			}
			if len(stored) != 1 || stored[0] != good || r.good != good {
				t.Fatalf("last good stored %q (in force %q), want only %q", stored, r.good, good)
			}
			for k, v := range before {
				if r.values[k] != v {
					t.Fatalf("--%s in force %q, want %q", k, r.values[k], v)
				}
			}
		})
	}
}

// TestCommandLineOnlyKeysRefusedAtStart: a mounted --config file naming a
// command-line-only flag is refused; the binary starts on the last good
// configuration, unless that names one too (one stored by an older
// version): then on the command line alone. The key's value never applies.
func TestCommandLineOnlyKeysRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range commandLineOnlyCases() {
		for _, lg := range []struct {
			name, content string
			wantRate      float64
			wantFallback  string
		}{
			{"clean last good", "node-addition-rate: 70\n", 70, "running on the last good configuration (ConfigMap kube-system/vmss-autoscaler-status key lastGoodConfig)"},
			{"last good naming it too", tc.content, 100,
				"the last good configuration (ConfigMap kube-system/vmss-autoscaler-status key lastGoodConfig) refused too (the last good configuration (ConfigMap kube-system/vmss-autoscaler-status key lastGoodConfig): " +
					tc.want[0] + "): running on the command line alone"},
		} {
			t.Run(tc.name+"/"+lg.name, func(t *testing.T) {
				p := filepath.Join(dir, "start"+string(rune('a'+i))+".yaml")
				if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
				args := []string{"--namespace=kube-system", "--nodes=0:10:gpu", "--config=" + p}
				if tc.cmdline != "" {
					args = append(args, tc.cmdline)
				}
				lastGood := func(context.Context, *config) (string, error) { return lg.content, nil }
				c, fs, fallback, err := startConfig(context.Background(), args, withProvider, lastGood)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(fallback, "--config="+p+": "+tc.want[0]) || !strings.Contains(fallback, lg.wantFallback) {
					t.Fatalf("fallback %q\nwant one containing %q and %q", fallback, "--config="+p+": "+tc.want[0], lg.wantFallback)
				}
				if c.core.NodeAdditionRate != lg.wantRate {
					t.Fatalf("rate %v, want %v", c.core.NodeAdditionRate, lg.wantRate)
				}
				for k := range commandLineOnlyKeys {
					if f := fs.Lookup(k); f != nil && strings.Contains(f.Value.String(), "attacker") {
						t.Fatalf("--%s=%s in force: the refused file's value", k, f.Value)
					}
				}
			})
		}
	}
}

// TestLoopTriggerFlags: the loop's trigger flags (frequent loops, the
// minimum gap, the pod batching window) and --new-pod-scale-up-delay have
// their defaults, are live, reach core.Options and are checked.
func TestLoopTriggerFlags(t *testing.T) {
	c, fs, err := parseConfigFrom([]string{"--nodes=0:10:gpu"}, withProvider, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"frequent-loops-enabled":  "true",
		"min-loop-interval":       "1s",
		"pod-batch-idle-duration": "500ms",
		"pod-batch-max-duration":  "1s",
		// A group's scale-set writes at least 5 s apart (its Update policy refills 4 a minute, 12 at most).
		"node-group-write-interval": "5s",
		// Pods a ReplicaSet is about to create are planned with its first.
		"scale-up-for-expected-pods": "true",
		// cluster-autoscaler's default: the batching window waits for a
		// burst to end instead.
		"new-pod-scale-up-delay": "0s",
		"scan-interval":          "10s",
	}
	for name, def := range want {
		f := fs.Lookup(name)
		if f == nil {
			t.Fatalf("--%s: not defined", name)
		}
		if f.DefValue != def {
			t.Errorf("--%s default %s, want %s", name, f.DefValue, def)
		}
		if !isLive(f) {
			t.Errorf("--%s: not live", name)
		}
	}
	o := c.core
	if !o.FrequentLoops || o.MinLoopInterval != time.Second || o.PodBatchIdleDuration != 500*time.Millisecond ||
		o.PodBatchMaxDuration != time.Second || o.NewPodScaleUpDelay != 0 || !o.ScaleUpForExpectedPods ||
		o.NodeGroupWriteInterval != 5*time.Second {
		t.Fatalf("defaults in core.Options: %+v", []any{o.FrequentLoops, o.MinLoopInterval, o.PodBatchIdleDuration, o.PodBatchMaxDuration, o.NewPodScaleUpDelay, o.ScaleUpForExpectedPods, o.NodeGroupWriteInterval})
	}
	c, err = parseConfig([]string{"--nodes=0:10:gpu", "--frequent-loops-enabled=false", "--min-loop-interval=3s",
		"--pod-batch-idle-duration=2s", "--pod-batch-max-duration=30s", "--new-pod-scale-up-delay=5s",
		"--node-group-write-interval=0s"}, withProvider)
	if err != nil {
		t.Fatal(err)
	}
	o = c.core
	if o.FrequentLoops || o.MinLoopInterval != 3*time.Second || o.PodBatchIdleDuration != 2*time.Second ||
		o.PodBatchMaxDuration != 30*time.Second || o.NewPodScaleUpDelay != 5*time.Second || o.NodeGroupWriteInterval != 0 {
		t.Fatalf("set values in core.Options: %+v", []any{o.FrequentLoops, o.MinLoopInterval, o.PodBatchIdleDuration, o.PodBatchMaxDuration, o.NewPodScaleUpDelay, o.NodeGroupWriteInterval})
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--min-loop-interval=-1s"}, "--min-loop-interval=-1s: must be between 0s and 1h0m0s"},
		{[]string{"--min-loop-interval=2h"}, "--min-loop-interval=2h0m0s: must be between 0s and 1h0m0s"},
		{[]string{"--pod-batch-idle-duration=-1s"}, "--pod-batch-idle-duration=-1s: must be between 0s and 1h0m0s"},
		{[]string{"--pod-batch-max-duration=2h", "--pod-batch-idle-duration=2h"}, "--pod-batch-idle-duration=2h0m0s: must be between 0s and 1h0m0s"},
		{[]string{"--pod-batch-idle-duration=20s"}, "--pod-batch-idle-duration 20s: longer than --pod-batch-max-duration 1s"},
		{[]string{"--node-group-write-interval=-1s"}, "--node-group-write-interval=-1s: must be between 0s and 10m0s"},
		{[]string{"--node-group-write-interval=5h"}, "--node-group-write-interval=5h0m0s: must be between 0s and 10m0s"},
	} {
		_, err := parseConfig(append([]string{"--nodes=0:10:gpu"}, tc.args...), withProvider)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}
