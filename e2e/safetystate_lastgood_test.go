package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/vmss-autoscaler/vmss-autoscaler/charts"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// A fresh install of the chart, no edit of its flags ConfigMap ever
// accepted: the leader stores the chart's configuration as the last good
// at its first successful loop (though each replica first read that
// ConfigMap as a standby). A bad first edit, then both replicas killed:
// both come back on the chart's configuration, said loudly, instead of
// crash-looping on the command line alone (which, with the chart, names
// no resource group and no node group); one leads and scales.
//
// Serial (no t.Parallel), as TestChartAppliesAndRuns: the chart's
// preflight DaemonSet selects every pending node.
func TestSafetyStateLastGoodSavedOnFreshInstall(t *testing.T) {
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	const rate = 30 // the chart's; the command line's default is 100
	run := sc.installChart("e2e-lastgood", sc.chartSimConfig(map[string]any{
		"nodes":                       []any{"0:20:" + cpu},
		"leader-elect-lease-duration": "4s",
		"leader-elect-renew-deadline": "3s",
		"leader-elect-retry-period":   "500ms",
		"node-addition-rate":          rate,
		"node-addition-burst":         3,
		"node-addition-adaptive":      false,
		"balloon-namespace":           sc.ns + "-balloons", // created by the chart
	}))

	// The Deployment's replicas start together; no edit is made.
	first := run.startReplicas("fresh")
	run.awaitLastGoodStored(first)
	// A bad first edit, refused; the kubelet refreshes the mounted file
	// with it, and both replicas are killed (a node drain, a rollout).
	run.refusedEdit("node-addition-burst: 3", "node-addition-burst: -3", "--node-addition-burst: must be at least 1, got -3")
	for _, p := range first {
		must(t, p.Kill())
	}
	again := run.startReplicas("restarted")
	run.awaitOneLeaderOnTheLastGood(again, rate)
	sc.workload("web", 2, "9", 0, cpu)
	sc.eventually("2 pods Running on the restarted replicas", 2*time.Minute, allRunning(sc, 2))
	for _, p := range again {
		if hasExited(p) {
			t.Fatalf("%s exited: see %s", p.Name, p.LogFile)
		}
	}
}

// awaitLastGoodStored waits for the leader's first successful loop, then
// for the flags as rendered stored as the last good configuration.
func (run *chartRun) awaitLastGoodStored(procs []*harness.Process) {
	sc := run.sc
	sc.t.Helper()
	sc.eventually("the leader's first successful loop", time.Minute, func() (bool, string) {
		for _, p := range procs {
			if _, body := sc.get(p, "/metrics"); metricValue(body, "vmss_autoscaler_last_successful_loop_timestamp_seconds") > 0 {
				return true, ""
			}
		}
		return false, "no replica has completed a loop"
	})
	sc.eventually("the chart's configuration stored as the last good", 30*time.Second, func() (bool, string) {
		st, err := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns).Get(sc.ctx, "vmss-autoscaler-status", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got, ok := st.Data["lastGoodConfig"]
		return got == run.flags, fmt.Sprintf("lastGoodConfig present %v: %q", ok, got)
	})
}

// refusedEdit replaces old with bad in the flags ConfigMap, waits for the
// leader to refuse it with an event naming why, and refreshes the mounted
// file with it as the kubelet does.
func (run *chartRun) refusedEdit(old, bad, why string) {
	sc := run.sc
	sc.t.Helper()
	cms := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns)
	cur, err := cms.Get(sc.ctx, run.configMap, metav1.GetOptions{})
	must(sc.t, err)
	if !strings.Contains(cur.Data["config.yaml"], old) {
		sc.t.Fatalf("flags ConfigMap without %q:\n%s", old, cur.Data["config.yaml"])
	}
	cur.Data["config.yaml"] = strings.Replace(cur.Data["config.yaml"], old, bad, 1)
	_, err = cms.Update(sc.ctx, cur, metav1.UpdateOptions{})
	must(sc.t, err)
	sc.eventually("the bad edit refused with an event", 30*time.Second, func() (bool, string) {
		n := sc.eventsWith("ConfigRejected", why)
		return n > 0, fmt.Sprintf("%d events", n)
	})
	must(sc.t, os.WriteFile(run.configFile, []byte(cur.Data["config.yaml"]), 0o600))
}

// awaitOneLeaderOnTheLastGood waits for every replica to run on the
// fallback, one of them leading at the chart's rate, and for the
// ConfigFallback event to name the last good configuration (not the
// command line alone). A replica that exits fails the test.
func (run *chartRun) awaitOneLeaderOnTheLastGood(procs []*harness.Process, rate float64) {
	sc := run.sc
	sc.t.Helper()
	sc.eventually("every replica up on the chart's configuration, one leading at its rate", time.Minute, func() (bool, string) {
		leading, state := 0, ""
		for _, p := range procs {
			if hasExited(p) {
				sc.t.Fatalf("%s exited on its refused flags file: see %s", p.Name, p.LogFile)
			}
			_, body := sc.get(p, "/metrics")
			r, fb := metricValue(body, "vmss_autoscaler_node_addition_rate_nodes_per_minute"), metricValue(body, "vmss_autoscaler_config_fallback")
			if fb != 1 {
				return false, fmt.Sprintf("%s: config_fallback %v", p.Name, fb)
			}
			if r == rate { // published by the leader's loops
				leading++
			}
			state += fmt.Sprintf("%s: rate %v; ", p.Name, r)
		}
		return leading == 1, state
	})
	sc.eventually("a ConfigFallback event naming the last good configuration", 30*time.Second, func() (bool, string) {
		n := sc.eventsWith("ConfigFallback", "running on the last good configuration")
		return n > 0, fmt.Sprintf("%d events", n)
	})
}

func hasExited(p *harness.Process) bool {
	select {
	case <-p.Exited():
		return true
	default:
		return false
	}
}

// chartRun is the autoscaler as an applied chart's Deployment runs it: its
// arguments and environment, the flags ConfigMap's file, the
// ServiceAccount's token.
type chartRun struct {
	sc         *scenario
	replicas   int
	args       []string // --address and --secure-address are set per process
	env        []string
	configMap  string // the flags ConfigMap's name
	flags      string // its rendered content
	configFile string // the mounted file (the kubelet's copy)
}

// installChart renders the chart with config as its flags, server-side
// applies it, and returns how its Deployment runs the autoscaler.
func (sc *scenario) installChart(release string, config map[string]any) *chartRun {
	t := sc.t
	t.Helper()
	values := map[string]any{
		"image":        map[string]any{"repository": "example.invalid/vmss-autoscaler"},
		"nodeSelector": map[string]any{"e2e.vmss-autoscaler.io/no-such-node": "true"}, // the pods never run here: the binary runs below
		"azure":        map[string]any{"subscriptionID": subscription},
		"config":       config,
	}
	root, err := harness.RepoRoot()
	must(t, err)
	objs, err := charts.Render(filepath.Join(root, "charts", "vmss-autoscaler"), values, release, sc.ns)
	must(t, err)
	applied := sc.applyAll(objs)
	t.Logf("applied %d objects: %s", len(objs), strings.Join(applied, ", "))
	t.Cleanup(func() { sc.deleteClusterScoped(objs) })
	var dep *appsv1.Deployment
	var cm *apiv1.ConfigMap
	for _, o := range objs {
		switch {
		case o.GetKind() == "Deployment":
			dep = &appsv1.Deployment{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, dep))
		case o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-config"):
			cm = &apiv1.ConfigMap{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cm))
		}
	}
	if dep == nil || cm == nil || dep.Spec.Replicas == nil {
		t.Fatalf("rendered no Deployment with replicas or no flags ConfigMap: %s", strings.Join(applied, ", "))
	}
	dir := t.TempDir()
	run := &chartRun{sc: sc, replicas: int(*dep.Spec.Replicas), configMap: cm.Name, flags: cm.Data["config.yaml"],
		configFile: filepath.Join(dir, "config.yaml")}
	must(t, os.WriteFile(run.configFile, []byte(run.flags), 0o600))
	c := dep.Spec.Template.Spec.Containers[0]
	run.args = []string{"--kubeconfig=" + sc.serviceAccountKubeconfig(dir, dep.Spec.Template.Spec.ServiceAccountName), "-v=2"}
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--config=") {
			a = "--config=" + run.configFile
		}
		run.args = append(run.args, a)
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			run.env = append(run.env, e.Name+"="+e.Value)
		}
	}
	t.Logf("the chart runs %d replicas with arguments %v and environment %v", run.replicas, c.Args, run.env)
	return run
}

// startReplicas starts the Deployment's replicas, each on ports of its own.
func (run *chartRun) startReplicas(name string) []*harness.Process {
	sc := run.sc
	sc.t.Helper()
	var procs []*harness.Process
	for i := range run.replicas {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(sc.t))
		args := make([]string, 0, len(run.args))
		for _, a := range run.args {
			switch {
			case strings.HasPrefix(a, "--address="):
				a = "--address=" + addr
			case strings.HasPrefix(a, "--secure-address="):
				a = fmt.Sprintf("--secure-address=127.0.0.1:%d", freePort(sc.t))
			}
			args = append(args, a)
		}
		p, err := sc.s.cp.StartProcessEnv(sc.ctx, fmt.Sprintf("%s-%s-%d", sc.prefix, name, i), sc.s.autoscaler, run.env, args...)
		must(sc.t, err)
		sc.track(p, addr)
		procs = append(procs, p)
	}
	return procs
}
