package app

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

func TestReloadFlagsConfigMap(t *testing.T) {
	args := []string{"--config-map=flags", "--namespace=kube-system", "--nodes=0:10:gpu", "--scan-interval=7s"}
	c, fs, err := parseConfigFrom(args, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	var applied []core.Options
	rec := record.NewFakeRecorder(100)
	m := core.NewMetrics(prometheus.NewRegistry())
	r := newReloader(args, nil, fs, c, func(o core.Options) error { applied = append(applied, o); return nil }, rec, m, nil)
	cm := func(data string) *apiv1.ConfigMap {
		return &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flags", Namespace: "kube-system"}, Data: map[string]string{"config.yaml": data}}
	}
	event := func() string {
		select {
		case e := <-rec.Events:
			return e
		default:
			return ""
		}
	}
	ctx := context.Background()
	for _, step := range []struct {
		name, data   string
		wantApplied  int
		wantEvent    string
		wantRejected float64
		check        func(t *testing.T)
	}{
		{"a live key applies", "node-addition-rate: 50\nscale-down-unneeded-time: 2m\n", 1, "ConfigApplied in force from the next loop: node-addition-rate=50, scale-down-unneeded-time=2m0s", 0,
			func(t *testing.T) {
				if o := applied[0]; o.NodeAdditionRate != 50 || o.ScaleDownUnneededTime.Minutes() != 2 {
					t.Fatalf("applied rate %v unneeded %v", o.NodeAdditionRate, o.ScaleDownUnneededTime)
				}
			}},
		{"the same content again: nothing", "node-addition-rate: 50\nscale-down-unneeded-time: 2m\n", 1, "", 0, nil},
		{"a bad value is refused whole, naming key and value", "node-addition-rate: 60\nnode-addition-burst: 0\n", 1,
			"ConfigRejected refused, the last good configuration stays: --node-addition-burst: must be at least 1, got 0", 1, nil},
		{"an unknown key is refused", "node-addition-rat: 60\n", 1, `unknown key "node-addition-rat"`, 2, nil},
		{"the command line wins", "node-addition-rate: 50\nscale-down-unneeded-time: 2m\nscan-interval: 1s\n", 1, "", 2, nil},
		{"a restart-only key is reported and not applied", "node-addition-rate: 40\nscale-down-unneeded-time: 2m\nballoon-namespace: other\n", 2,
			"ConfigRestartRequired these keys take effect only after a restart: balloon-namespace=other", 2,
			func(t *testing.T) {
				if o := applied[1]; o.Balloons.Namespace != "vmss-autoscaler-balloons" || o.NodeAdditionRate != 40 {
					t.Fatalf("applied balloon namespace %q rate %v: the namespace needs a restart", o.Balloons.Namespace, o.NodeAdditionRate)
				}
				if got := testutil.ToFloat64(m.ConfigRestartRequired); got != 1 {
					t.Fatalf("config_restart_required %v", got)
				}
			}},
	} {
		t.Run(step.name, func(t *testing.T) {
			r.reload(ctx, cm(step.data))
			if len(applied) != step.wantApplied {
				t.Fatalf("applied %d times, want %d", len(applied), step.wantApplied)
			}
			var evs []string
			for e := event(); e != ""; e = event() {
				evs = append(evs, e)
			}
			all := strings.Join(evs, "\n")
			if step.wantEvent == "" && step.name != "a restart-only key is reported and not applied" && len(evs) > 0 {
				t.Fatalf("events %v, want none", evs)
			}
			if !strings.Contains(all, step.wantEvent) {
				t.Fatalf("events %q, want one containing %q", all, step.wantEvent)
			}
			if got := testutil.ToFloat64(m.ConfigReloads.WithLabelValues("rejected")); got != step.wantRejected {
				t.Fatalf("rejected reloads %v, want %v", got, step.wantRejected)
			}
			if step.check != nil {
				step.check(t)
			}
		})
	}
}

// TestKlogFlagsApplyOnlyOnceAccepted: -v in a refused ConfigMap changes
// nothing; in an accepted one it takes effect, with no options reload.
func TestKlogFlagsApplyOnlyOnceAccepted(t *testing.T) {
	kf := newKlogFlags()
	args := []string{"--config-map=flags", "--namespace=kube-system", "--nodes=0:10:gpu"}
	c, fs, err := parseConfigFrom(args, kf.addReal, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kf.apply("v", "0") })
	applied := 0
	m := core.NewMetrics(prometheus.NewRegistry())
	r := newReloader(args, kf.addShadows, fs, c, func(core.Options) error { applied++; return nil }, nil, m, nil)
	r.klog = kf.apply
	cm := func(data string) *apiv1.ConfigMap {
		return &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flags", Namespace: "kube-system"}, Data: map[string]string{"config.yaml": data}}
	}
	ctx := context.Background()
	for _, step := range []struct {
		name, data   string
		wantV7       bool
		wantRejected float64
		wantApplied  int
	}{
		{"a live key", "node-addition-rate: 50\n", false, 0, 1},
		{"refused with a bad value elsewhere", "node-addition-rate: 50\nv: 7\nnode-addition-burst: 0\n", false, 1, 1},
		{"refused with a bad level", "node-addition-rate: 50\nv: loud\n", false, 2, 1},
		{"accepted, no options reload for a klog flag alone", "node-addition-rate: 50\nv: 7\n", true, 2, 1},
		{"back", "node-addition-rate: 50\nv: 0\n", false, 2, 1},
	} {
		t.Run(step.name, func(t *testing.T) {
			r.reload(ctx, cm(step.data))
			if got := bool(klog.V(7).Enabled()); got != step.wantV7 {
				t.Fatalf("klog.V(7).Enabled() = %v, want %v", got, step.wantV7)
			}
			if got := testutil.ToFloat64(m.ConfigReloads.WithLabelValues("rejected")); got != step.wantRejected {
				t.Fatalf("rejected reloads %v, want %v", got, step.wantRejected)
			}
			if applied != step.wantApplied {
				t.Fatalf("options reloaded %d times, want %d", applied, step.wantApplied)
			}
		})
	}
}

// TestKlogShortFlagOnTheCommandLine: -v=2 (pflag's short form of klog's
// -v) parses on the reload path as at start.
func TestKlogShortFlagOnTheCommandLine(t *testing.T) {
	kf := newKlogFlags()
	args := []string{"--config-map=flags", "--namespace=kube-system", "--nodes=0:10:gpu", "-v=2"}
	c, fs, err := parseConfigFrom(args, kf.addShadows, nil, "")
	if err != nil {
		t.Fatalf("parsing %v with shadow klog flags: %v", args, err)
	}
	m := core.NewMetrics(prometheus.NewRegistry())
	applied := 0
	r := newReloader(args, kf.addShadows, fs, c, func(core.Options) error { applied++; return nil }, nil, m, nil)
	r.reload(context.Background(), &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flags", Namespace: "kube-system"},
		Data: map[string]string{"config.yaml": "node-addition-rate: 50\n"}})
	if got := testutil.ToFloat64(m.ConfigReloads.WithLabelValues("rejected")); got != 0 || applied != 1 {
		t.Fatalf("rejected %v applied %d, want the edit applied", got, applied)
	}
}

// TestFlagsDeclareLiveOrRestart: the reload path's two lists come from the
// flags' definitions; these are the ones an operator relies on.
func TestFlagsDeclareLiveOrRestart(t *testing.T) {
	var prov providerFlags
	c, fs, err := parseConfigFrom([]string{"--nodes=0:10:gpu"}, func(fs *pflag.FlagSet) {
		prov.register(fs)
		newKlogFlags().addShadows(fs)
	}, nil, "")
	if err != nil || c == nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flag string
		live bool
	}{
		{"scan-interval", true}, {"node-addition-rate", true}, {"max-nodes-in-flight", true}, {"scale-down-unneeded-time", true},
		{"warm-pool", true}, {"balloon-aware", true}, {"preflight-taint", true}, {"max-preflight-time", true}, {"expander", true},
		{"status-taint", true}, {"gang-allow-split", true}, {"v", true},
		{"spot-eviction-backoff-count", true}, {"spot-eviction-window", true},
		{"namespace", false}, {"kubeconfig", false}, {"config-map", false}, {"address", false}, {"leader-elect", false},
		{"balloon-namespace", false}, {"balloon-label", false}, {"gpu-resource-name", false}, {"status-config-map-name", false},
		{"cloud-provider", false}, {"kube-client-qps", false}, {"vmodule", false}, {"azure-subscription-id", false},
	} {
		f := fs.Lookup(tc.flag)
		if f == nil {
			t.Errorf("--%s: not defined", tc.flag)
			continue
		}
		if isLive(f) != tc.live {
			t.Errorf("--%s: live %v, want %v", tc.flag, isLive(f), tc.live)
		}
	}
}
