package e2e

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authentication/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/vmss-autoscaler/vmss-autoscaler/charts"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// The Helm chart, rendered by Helm's Go packages, is server-side applied to
// the real API server; the autoscaler then runs with exactly the rendered
// flags ConfigMap and arguments, authenticated as the chart's
// ServiceAccount (so the chart's RBAC is what it has), and scales up. A live
// key changed in the applied ConfigMap changes its behaviour without a
// restart, and a bad value is refused with an event.
func TestChartAppliesAndRuns(t *testing.T) {
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	const release = "e2e-chart"
	values := map[string]any{
		"image":        map[string]any{"repository": "example.invalid/vmss-autoscaler"},
		"nodeSelector": map[string]any{"e2e.vmss-autoscaler.io/no-such-node": "true"}, // the pods never run here: the binary runs below
		"azure":        map[string]any{"subscriptionID": subscription},
		"config": sc.chartSimConfig(map[string]any{
			"nodes":                       []any{"0:20:" + cpu},
			"leader-elect-lease-duration": "4s",
			"leader-elect-renew-deadline": "3s",
			"leader-elect-retry-period":   "500ms",
			"node-addition-rate":          6,
			"node-addition-burst":         1,
			"node-addition-adaptive":      false,
			"balloon-namespace":           sc.ns + "-balloons", // created by the chart
		}),
		"balloons":  map[string]any{"enabled": true},
		"preflight": map[string]any{"enabled": true},
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := charts.Render(filepath.Join(root, "charts", "vmss-autoscaler"), values, release, sc.ns)
	if err != nil {
		t.Fatal(err)
	}
	applied := sc.applyAll(objs)
	t.Logf("applied %d objects: %s", len(objs), strings.Join(applied, ", "))
	t.Cleanup(func() { sc.deleteClusterScoped(objs) })

	// The autoscaler as the chart runs it: the Deployment's arguments and
	// environment, the flags ConfigMap's file, the ServiceAccount's token.
	var dep *appsv1.Deployment
	var cm *apiv1.ConfigMap
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			dep = &appsv1.Deployment{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, dep))
		case "ConfigMap":
			if strings.HasSuffix(o.GetName(), "-config") {
				cm = &apiv1.ConfigMap{}
				must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cm))
			}
		}
	}
	if dep == nil || cm == nil {
		t.Fatalf("rendered no Deployment or flags ConfigMap: %s", strings.Join(applied, ", "))
	}
	dir := t.TempDir()
	configFile := filepath.Join(dir, "config.yaml")
	must(t, os.WriteFile(configFile, []byte(cm.Data["config.yaml"]), 0o600))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	secureAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := dep.Spec.Template.Spec.Containers[0]
	args, env := sc.chartCommand(dir, dep, configFile, addr, secureAddr)
	t.Logf("running the autoscaler with the chart's arguments %v and environment %v", c.Args, env)
	p, err := sc.s.cp.StartProcessEnv(sc.ctx, sc.prefix+"-chart", sc.s.autoscaler, env, append(args, "-v=2")...)
	if err != nil {
		t.Fatal(err)
	}
	sc.track(p, addr)
	sc.workload("web", 6, "9", 0, cpu)
	sc.eventually("the first node at the ConfigMap's 6 nodes/min", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c >= 1, fmt.Sprintf("capacity %d", c)
	})
	if c := sc.capacity(cpu); c > 2 {
		t.Fatalf("capacity %d: the rendered ConfigMap's rate (6/min, burst 1) is not in force", c)
	}
	// The chart's TLS listener: the API server decides who reads /metrics.
	sc.checkSecureMetrics(secureAddr, release+"-vmss-autoscaler")
	cms := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns)
	edit := func(change func(string) string) {
		t.Helper()
		cur, err := cms.Get(sc.ctx, cm.Name, metav1.GetOptions{})
		must(t, err)
		cur.Data["config.yaml"] = change(cur.Data["config.yaml"])
		_, err = cms.Update(sc.ctx, cur, metav1.UpdateOptions{})
		must(t, err)
	}
	edit(func(s string) string {
		s = strings.Replace(s, "node-addition-rate: 6", "node-addition-rate: 600", 1)
		return strings.Replace(s, "node-addition-burst: 1", "node-addition-burst: 50", 1)
	})
	sc.eventually("6 pods Running after the live edit", time.Minute, allRunning(sc, 6))
	edit(func(s string) string {
		return strings.Replace(s, "node-addition-burst: 50", "node-addition-burst: -3", 1)
	})
	sc.eventually("the bad value refused with an event", 30*time.Second, func() (bool, string) {
		n := sc.eventsWith("ConfigRejected", "--node-addition-burst: must be at least 1, got -3")
		return n > 0, fmt.Sprintf("%d events", n)
	})
	_, body := sc.get(p, "/metrics")
	if got := metricValue(body, "vmss_autoscaler_node_addition_rate_nodes_per_minute"); got != 600 {
		t.Fatalf("rate %v after the refused edit, want the last good 600", got)
	}
	// The kubelet refreshes the mounted file with the bad edit, and every
	// replica is killed (a node drain, a rollout): both come back on the
	// last good configuration instead of crash-looping on their flags file.
	cur, err := cms.Get(sc.ctx, cm.Name, metav1.GetOptions{})
	must(t, err)
	must(t, os.WriteFile(configFile, []byte(cur.Data["config.yaml"]), 0o600))
	must(t, p.Kill())
	<-p.Exited()
	var replicas []*harness.Process
	for i := range 2 {
		a := addr
		if i > 0 {
			a = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		}
		rargs := make([]string, 0, len(args)+1)
		for _, x := range args {
			switch {
			case strings.HasPrefix(x, "--address="):
				x = "--address=" + a
			case strings.HasPrefix(x, "--secure-address=") && i > 0:
				x = fmt.Sprintf("--secure-address=127.0.0.1:%d", freePort(t))
			}
			rargs = append(rargs, x)
		}
		r, err := sc.s.cp.StartProcessEnv(sc.ctx, fmt.Sprintf("%s-chart-restarted-%d", sc.prefix, i), sc.s.autoscaler, env, append(rargs, "-v=2")...)
		must(t, err)
		sc.track(r, a)
		replicas = append(replicas, r)
	}
	sc.eventually("both replicas up on the last good configuration, one leading at its rate", time.Minute, func() (bool, string) {
		leading, state := 0, ""
		for _, r := range replicas {
			select {
			case <-r.Exited():
				t.Fatalf("a restarted replica exited on its refused flags file: see %s", r.LogFile)
			default:
			}
			_, body := sc.get(r, "/metrics")
			rate, fb := metricValue(body, "vmss_autoscaler_node_addition_rate_nodes_per_minute"), metricValue(body, "vmss_autoscaler_config_fallback")
			if fb != 1 {
				return false, fmt.Sprintf("%s: config_fallback %v", r.Name, fb)
			}
			if rate == 600 { // the rate is published by the leader's loops
				leading++
			}
			state += fmt.Sprintf("%s: rate %v; ", r.Name, rate)
		}
		return leading == 1, state
	})
	// One of them leads and scales on the last good rate.
	sc.scaleDeployment("web", 9)
	sc.eventually("9 pods Running on the restarted replicas", 2*time.Minute, allRunning(sc, 9))
	sc.eventually("a ConfigFallback event on the flags ConfigMap", 30*time.Second, func() (bool, string) {
		n := sc.eventsWith("ConfigFallback", "running on the last good configuration")
		return n > 0, fmt.Sprintf("%d events", n)
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// applyAll server-side applies objects (namespaced ones without a
// namespace into the scenario's) and names what it applied.
func (sc *scenario) applyAll(objs []*unstructured.Unstructured) []string {
	sc.t.Helper()
	dc, err := dynamic.NewForConfig(sc.s.cp.RESTConfig)
	must(sc.t, err)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(sc.s.cp.Client.Discovery()))
	var names []string
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			sc.t.Fatalf("%s %s: %v", gvk.Kind, o.GetName(), err)
		}
		ri := dynamic.ResourceInterface(dc.Resource(m.Resource))
		if m.Scope.Name() == "namespace" {
			ns := o.GetNamespace()
			if ns == "" {
				ns = sc.ns
			}
			ri = dc.Resource(m.Resource).Namespace(ns)
		}
		if _, err := ri.Apply(sc.ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "e2e-helm", Force: true}); err != nil {
			sc.t.Fatalf("applying %s %s: %v", gvk.Kind, o.GetName(), err)
		}
		names = append(names, gvk.Kind+"/"+o.GetName())
	}
	return names
}

// deleteClusterScoped removes the chart's cluster-scoped objects (the
// namespace takes the rest), except the shared balloon PriorityClass.
func (sc *scenario) deleteClusterScoped(objs []*unstructured.Unstructured) {
	dc, err := dynamic.NewForConfig(sc.s.cp.RESTConfig)
	if err != nil {
		return
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(sc.s.cp.Client.Discovery()))
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil || m.Scope.Name() == "namespace" || gvk.Kind == "PriorityClass" {
			continue
		}
		_ = dc.Resource(m.Resource).Delete(sc.ctx, o.GetName(), metav1.DeleteOptions{})
	}
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates as a
// ServiceAccount of the scenario's namespace, with a token from the
// TokenRequest API.
func (sc *scenario) serviceAccountKubeconfig(dir, sa string) string {
	sc.t.Helper()
	exp := int64(3600)
	tok, err := sc.s.cp.Client.CoreV1().ServiceAccounts(sc.ns).CreateToken(sc.ctx, sa,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	must(sc.t, err)
	rc := sc.s.cp.RESTConfig
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData, CertificateAuthority: rc.CAFile}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: sa, Namespace: sc.ns}
	cfg.CurrentContext = "e2e"
	path := filepath.Join(dir, "sa.kubeconfig")
	must(sc.t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// chartCommand is the chart's autoscaler container as a local process: its
// arguments, with the ServiceAccount's kubeconfig and the config file and
// listen addresses given, and its literal environment.
func (sc *scenario) chartCommand(dir string, dep *appsv1.Deployment, configFile, addr, secureAddr string) (args, env []string) {
	c := dep.Spec.Template.Spec.Containers[0]
	args = []string{"--kubeconfig=" + sc.serviceAccountKubeconfig(dir, dep.Spec.Template.Spec.ServiceAccountName)}
	for _, a := range c.Args {
		switch {
		case strings.HasPrefix(a, "--config="):
			a = "--config=" + configFile
		case strings.HasPrefix(a, "--address="):
			a = "--address=" + addr
		case strings.HasPrefix(a, "--secure-address="):
			a = "--secure-address=" + secureAddr
		}
		args = append(args, a)
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	return args, env
}

// applyChart renders the chart and applies every object but its workloads
// (the DaemonSets and the Deployment would only wait for nodes; tests play
// them), and returns what it applied.
func (sc *scenario) applyChart(values map[string]any, release string) []*unstructured.Unstructured {
	sc.t.Helper()
	root, err := harness.RepoRoot()
	must(sc.t, err)
	objs, err := charts.Render(filepath.Join(root, "charts", "vmss-autoscaler"), values, release, sc.ns)
	must(sc.t, err)
	var keep []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" && o.GetKind() != "Deployment" {
			keep = append(keep, o)
		}
	}
	applied := sc.applyAll(keep)
	sc.t.Logf("applied %s", strings.Join(applied, ", "))
	return keep
}

// chartSimConfig is the chart's `config` for a scenario: the keys that point
// the binary at the ARM simulator and compress its timings, plus extra.
func (sc *scenario) chartSimConfig(extra map[string]any) map[string]any {
	cfg := map[string]any{
		"azure-resource-groups":         sc.rg,
		"azure-arm-endpoint":            sc.s.sim.URL(),
		"azure-ca-file":                 sc.s.caFile,
		"azure-auth":                    "token-file",
		"azure-token-file":              sc.s.tokenFile,
		"azure-cache-ttl":               "1s",
		"azure-vm-list-interval":        "5s",
		"azure-vm-list-active-interval": "1s",
		"azure-vm-list-budget":          10000,
		"azure-operation-poll-interval": "1s",
		"scan-interval":                 "1s",
		"node-group-write-interval":     "1s",
		"new-pod-scale-up-delay":        "0s",
	}
	maps.Copy(cfg, extra)
	return cfg
}
