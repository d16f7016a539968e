// Command demo runs the autoscaler on its embedded default: a real local
// control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler with native gang scheduling, kwok), the ARM simulator with a
// small fleet (a CPU scale set, an 8-GPU scale set with a warm node, a
// team-tainted 8-GPU scale set; GPU nodes join behind the preflight taint and
// the real preflight agent passes them), the autoscaler binary with a
// node-addition rate limit, and a sample workload (a training gang, web pods,
// team pods), with live progress in the terminal.
//
//	go run ./e2e/demo          # run the workload, print a summary, exit 0
//	go run ./e2e/demo --keep   # playground: the stack with no workload, until Ctrl-C
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	apiv1 "k8s.io/api/core/v1"
	schedv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

const (
	subscription  = "de300000-0000-0000-0000-000000000001"
	resourceGroup = "MC_demo_Cluster_eastus"
	namespace     = "demo"
	teamTaintKey  = "openai.com/team"
	preflightKey  = "vmss-autoscaler.io/preflight"
	warmNodes     = 1
	// demoChecks stand for nvidia-smi and dcgmi: a couple of seconds of
	// "burn-in" that passes.
	demoChecks = `deadline: 1m
checks:
- name: burn-in
  command: ["sh", "-c", "sleep 2; echo GPU burn-in ok"]
  timeout: 30s
  match: 'ok$'
`
)

type options struct {
	keep      bool
	bootDelay time.Duration
	timeout   time.Duration
	dir       string
}

func main() {
	var o options
	fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
	fs.BoolVar(&o.keep, "keep", false, "playground: start the stack with the sample fleet and no workload, and keep it running until interrupted")
	fs.DurationVar(&o.bootDelay, "boot-delay", 3*time.Second, "time a simulated VM takes to boot")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up when the workload is not running after this long")
	fs.StringVar(&o.dir, "dir", "", "where certificates, kubeconfig and logs go (default: a new folder under .cache/demo)")
	measure.ParseFlags(fs, os.Args[1:])
	// The demo's own output is the progress table; components log to files.
	measure.Main("demo", func(ctx context.Context) error { return run(ctx, o) })
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func run(ctx context.Context, o options) error {
	start := time.Now()
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	if o.dir == "" {
		o.dir = filepath.Join(root, ".cache", "demo", time.Now().Format("20060102-150405"))
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", o.dir, err)
	}
	say("vmss-autoscaler demo — working folder %s", o.dir)
	say("building the control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kwok) from Go modules; the first build takes ~10 minutes on 2 cores, later ones seconds ...")
	t := time.Now()
	bins, err := harness.BuildBinaries(ctx)
	if err != nil {
		return err
	}
	autoscalerBin, err := harness.BuildGoBinary(ctx, "./cmd/vmss-autoscaler", "vmss-autoscaler")
	if err != nil {
		return err
	}
	say("built in %s", time.Since(t).Round(time.Second))

	t = time.Now()
	cp, err := harness.Start(ctx, bins, harness.Options{Dir: o.dir})
	if err != nil {
		return err
	}
	defer cp.Stop()
	say("control plane up in %s; logs in %s", time.Since(t).Round(100*time.Millisecond), cp.LogDir)

	// Nodes join as AKS kubelets do: allocatable below the VM size,
	// providerIDs with the resource group lower-cased, GPUs advertised by
	// the device plugin 20 s after registration; VMs boot with jitter.
	hook := armsim.NewKubeNodeHook(cp.Client)
	hook.Annotations = map[string]string{"kwok.x-k8s.io/node": "fake"}
	sim, err := armsim.New(armsim.Options{
		SubscriptionID: subscription, Location: "eastus", BootDelay: o.bootDelay, BootJitter: o.bootDelay / 2, Seed: 1,
		Hook: hook,
	})
	if err != nil {
		return err
	}
	fleet := []armsim.ScaleSetSpec{
		{ResourceGroup: resourceGroup, Name: "cpu", SKU: "Standard_D16s_v5", Tags: discoveryTags(0, 20)},
		{ResourceGroup: resourceGroup, Name: "gpu-h100", SKU: "Standard_ND96isr_H100_v5", Zones: []string{"1"}, Tags: withPreflight(discoveryTags(0, 16))},
		{ResourceGroup: resourceGroup, Name: "gpu-team-rl", SKU: "Standard_ND96isr_H100_v5", Zones: []string{"1"}, Tags: withPreflight(withTeam(discoveryTags(0, 8), "rl"))},
	}
	for _, s := range fleet {
		if err := sim.AddScaleSet(s); err != nil {
			return err
		}
	}
	if err := sim.Start(); err != nil {
		return err
	}
	defer sim.Close()
	go sim.Run(ctx)
	caFile := filepath.Join(o.dir, "armsim-ca.pem")
	tokenFile := filepath.Join(o.dir, "arm-token")
	if err := os.WriteFile(caFile, sim.CACertPEM(), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(tokenFile, []byte("demo-token"), 0o600); err != nil {
		return err
	}
	say("ARM simulator at %s with scale sets cpu (Standard_D16s_v5, 0-20), gpu-h100 (8x H100, 0-16, 1 warm node), gpu-team-rl (8x H100, tainted %s=rl, 0-8);", sim.URL(), teamTaintKey)
	say("GPU nodes join tainted %s=pending until the preflight agent (this binary's preflight subcommand) passes them", preflightKey)

	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	// The balloon namespace as the chart creates it: the binary refuses one
	// without Pod Security restricted, and kube-system or its own.
	balloonNS := &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: balloon.DefaultNamespace,
		Labels: map[string]string{balloon.PodSecurityEnforceLabel: balloon.PodSecurityRestricted}}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, balloonNS, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", balloonNS.Name, err)
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	// Timings compressed through the flags a user would set.
	args := []string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--namespace=kube-system",
		"--address=" + addr,
		"--azure-subscription-id=" + subscription,
		"--azure-resource-groups=" + resourceGroup,
		"--node-group-auto-discovery=label:k8s.io_cluster-autoscaler_enabled,k8s.io_cluster-autoscaler_demo",
		"--azure-arm-endpoint=" + sim.URL(),
		"--azure-ca-file=" + caFile,
		"--azure-auth=token-file",
		"--azure-token-file=" + tokenFile,
		"--azure-cache-ttl=2s",
		"--azure-vm-list-interval=10s", "--azure-vm-list-active-interval=2s", "--azure-vm-list-budget=10000",
		"--azure-operation-poll-interval=1s",
		"--scan-interval=2s",
		"--new-pod-scale-up-delay=1s",
		"--max-node-provision-time=2m",
		"--expander=least-waste",
		"--scale-down-unneeded-time=10s",
		"--scale-down-delay-after-add=5s",
		"--scale-down-brake-window=20s",
		"--node-addition-rate=120", "--node-addition-burst=6", "--node-addition-adaptive=false",
		"--warm-pool=gpu-h100:1",
		"-v=2",
	}
	as, err := cp.StartProcess(ctx, "vmss-autoscaler", autoscalerBin, args...)
	if err != nil {
		return err
	}
	say("autoscaler running (pid %d): metrics and health on http://%s, log %s", as.Pid(), addr, as.LogFile)
	say("  %s %s", autoscalerBin, strings.Join(args, " "))
	checks := filepath.Join(o.dir, "preflight-checks.yaml")
	if err := os.WriteFile(checks, []byte(demoChecks), 0o600); err != nil {
		return err
	}
	// The preflight DaemonSet: the real agent for every node that joins pending.
	go cp.RunPreflightAgents(ctx, autoscalerBin, preflightKey+"=pending", func(*apiv1.Node) string { return checks },
		func(_ *harness.Process, err error) {
			if err != nil {
				say("starting a preflight agent: %v", err)
			}
		})
	metricsURL := "http://" + addr + "/metrics"

	if o.keep {
		say("")
		say("playground ready. In another terminal:")
		say("  export KUBECONFIG=%s", cp.Kubeconfig)
		say("  kubectl apply -f <your workload>   (nodes come from the scale sets cpu, gpu-h100, gpu-team-rl)")
		say("  (no kubectl? from this folder: go run k8s.io/kubernetes/cmd/kubectl get nodes)")
		say("ARM simulator: %s (CA %s, any bearer token)", sim.URL(), caFile)
		say("Ctrl-C stops everything.")
		progress(ctx, cp.Client, sim, as, metricsURL, nil, time.Duration(1<<62))
		return nil
	}

	say("")
	say("submitting the sample workload: a training gang (PodGroup minCount 8) of 8 pods x 8 GPUs, 20 web pods x 2 CPUs, 2 team pods x 8 GPUs tolerating %s=rl", teamTaintKey)
	if err := submit(ctx, cp.Client); err != nil {
		return err
	}
	want := 30
	t = time.Now()
	if err := progress(ctx, cp.Client, sim, as, metricsURL, &want, o.timeout); err != nil {
		return fmt.Errorf("%w (autoscaler log: %s; control plane logs: %s)", err, as.LogFile, cp.LogDir)
	}
	took := time.Since(t)
	summary(ctx, cp.Client, sim, addr, took)
	say("")
	say("deleting the workload: the nodes become unneeded, and after --scale-down-unneeded-time (10s here) the autoscaler removes them,")
	say("at most half the cluster per --scale-down-brake-window (20s here): the safety brake")
	if err := cleanup(ctx, cp.Client); err != nil {
		return err
	}
	t = time.Now()
	if err := shrink(ctx, cp.Client, sim, as, metricsURL, o.timeout); err != nil {
		return fmt.Errorf("%w (autoscaler log: %s)", err, as.LogFile)
	}
	say("all scale sets back to 0 but the warm gpu-h100 node, %s after the workload was deleted", time.Since(t).Round(time.Second))
	say("demo done in %s; logs kept in %s", time.Since(start).Round(time.Second), cp.LogDir)
	return nil
}

func discoveryTags(minSize, maxSize int) map[string]string {
	return map[string]string{
		"k8s.io_cluster-autoscaler_enabled": "true",
		"k8s.io_cluster-autoscaler_demo":    "owned",
		"min":                               fmt.Sprint(minSize),
		"max":                               fmt.Sprint(maxSize),
	}
}

func withTeam(tags map[string]string, team string) map[string]string {
	tags["k8s.io_cluster-autoscaler_node-template_taint_openai.com__team"] = team + ":NoSchedule"
	tags["k8s.io_cluster-autoscaler_node-template_label_openai.com__team"] = team
	return tags
}

func requests(cpu string, gpus int64) apiv1.ResourceRequirements {
	r := apiv1.ResourceRequirements{Requests: apiv1.ResourceList{
		apiv1.ResourceCPU: resource.MustParse(cpu), apiv1.ResourceMemory: resource.MustParse("4Gi")}}
	if gpus > 0 {
		q := *resource.NewQuantity(gpus, resource.DecimalSI)
		r.Requests[armsim.GPUResource] = q
		r.Limits = apiv1.ResourceList{armsim.GPUResource: q}
	}
	return r
}

func submit(ctx context.Context, c kubernetes.Interface) error {
	eight := int32(8)
	pg := &schedv1alpha2.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: namespace}}
	pg.Spec.SchedulingPolicy.Gang = &schedv1alpha2.GangSchedulingPolicy{MinCount: eight}
	if _, err := c.SchedulingV1alpha2().PodGroups(namespace).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating PodGroup train: %w", err)
	}
	gangName := "train"
	train := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: namespace},
		Spec: batchv1.JobSpec{
			Parallelism: &eight, Completions: &eight,
			Template: apiv1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "train"}},
				Spec: apiv1.PodSpec{
					SchedulingGroup: &apiv1.PodSchedulingGroup{PodGroupName: &gangName},
					RestartPolicy:   apiv1.RestartPolicyNever,
					Containers:      []apiv1.Container{{Name: "trainer", Image: "registry.k8s.io/pause:3.10", Resources: requests("80", 8)}},
				},
			},
		},
	}
	if _, err := c.BatchV1().Jobs(namespace).Create(ctx, train, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating job train: %w", err)
	}
	web := deployment("web", 20, requests("2", 0), nil, nil)
	team := deployment("rl-eval", 2, requests("80", 8),
		map[string]string{"openai.com/team": "rl"},
		[]apiv1.Toleration{{Key: teamTaintKey, Operator: apiv1.TolerationOpEqual, Value: "rl", Effect: apiv1.TaintEffectNoSchedule}})
	for _, d := range []*appsv1.Deployment{web, team} {
		if _, err := c.AppsV1().Deployments(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating deployment %s: %w", d.Name, err)
		}
	}
	return nil
}

func deployment(name string, replicas int32, res apiv1.ResourceRequirements, selector map[string]string, tol []apiv1.Toleration) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: apiv1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: apiv1.PodSpec{
					NodeSelector: selector,
					Tolerations:  tol,
					Containers:   []apiv1.Container{{Name: name, Image: "registry.k8s.io/pause:3.10", Resources: res}},
				},
			},
		},
	}
}

// progress prints one line per group every 2 s until want pods run in the
// demo namespace (nil: until ctx ends).
func progress(ctx context.Context, c kubernetes.Interface, sim *armsim.Server, as *harness.Process, metricsURL string, want *int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	start := time.Now()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	last := ""
	for {
		running, done, pending, line := snapshot(ctx, c, sim)
		state := fmt.Sprintf("pods: %3d running %3d done %3d pending  |  %s  |  %s", running, done, pending, line, autoscalerLine(metricsURL))
		// The playground prints only changes; the demo prints every tick.
		if want != nil || state != last {
			say("%6s  %s", time.Since(start).Round(time.Second), state)
		}
		last = state
		// Training pods run to completion (kwok completes pods that never restart).
		if want != nil && running+done >= *want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workload not running after %s", timeout)
		}
		if err := next(ctx, as, tick); err != nil {
			return err
		}
	}
}

// next waits for the next tick, or says why not to go on.
func next(ctx context.Context, as *harness.Process, tick *time.Ticker) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-as.Exited():
		return fmt.Errorf("the autoscaler exited: %v", as.ExitErr())
	case <-tick.C:
		return nil
	}
}

func snapshot(ctx context.Context, c kubernetes.Interface, sim *armsim.Server) (running, done, pending int, line string) {
	running, done, pending = podPhases(ctx, c)
	ready := readyNodes(ctx, c)
	var parts []string
	for _, name := range []string{"cpu", "gpu-h100", "gpu-team-rl"} {
		st, err := sim.ScaleSet(resourceGroup, name)
		if err != nil {
			continue
		}
		booting := 0
		for _, vm := range st.VMs {
			if vm.State == armsim.StateCreating {
				booting++
			}
		}
		parts = append(parts, fmt.Sprintf("%s: requested %d, booting %d, ready %d", name, st.Capacity, booting, ready[name]))
	}
	return running, done, pending, strings.Join(parts, "  |  ")
}

// podPhases counts the demo's pods Running, Succeeded and Pending (none
// when they cannot be listed).
func podPhases(ctx context.Context, c kubernetes.Interface) (running, done, pending int) {
	pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, 0
	}
	for _, p := range pods.Items {
		switch p.Status.Phase {
		case apiv1.PodRunning:
			running++
		case apiv1.PodSucceeded:
			done++
		case apiv1.PodPending:
			pending++
		}
	}
	return running, done, pending
}

// readyNodes counts the Ready nodes by node group (none when they cannot
// be listed).
func readyNodes(ctx context.Context, c kubernetes.Interface) map[string]int {
	ready := map[string]int{}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return ready
	}
	for _, n := range nodes.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type == apiv1.NodeReady && cond.Status == apiv1.ConditionTrue {
				ready[n.Labels[armsim.NodeGroupLabel]]++
			}
		}
	}
	return ready
}

func summary(ctx context.Context, c kubernetes.Interface, sim *armsim.Server, addr string, took time.Duration) {
	say("")
	say("all 30 pods placed (running, or for the training gang run to completion) %s after submission", took.Round(time.Second))
	calls := sim.Calls()
	var ops []string
	for k, v := range calls {
		if v > 0 {
			ops = append(ops, fmt.Sprintf("%s=%d", k, v))
		}
	}
	sort.Strings(ops)
	say("ARM calls made by the autoscaler: %s", strings.Join(ops, " "))
	if evs, err := c.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{}); err == nil {
		n := 0
		for _, e := range evs.Items {
			if e.Reason == "TriggeredScaleUp" {
				n++
			}
		}
		say("TriggeredScaleUp events on the pods: %d", n)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		for _, p := range []string{"vmss_autoscaler_scaled_up_nodes_total", "vmss_autoscaler_loop_duration_seconds_sum",
			"vmss_autoscaler_loop_duration_seconds_count", "vmss_autoscaler_node_addition_released_nodes_total",
			"vmss_autoscaler_node_addition_cancelled_nodes_total", "vmss_autoscaler_preflight_results_total"} {
			if strings.HasPrefix(l, p) {
				say("  %s", l)
			}
		}
	}
}

// shrink shows progress until every scale set is back to zero.
func shrink(ctx context.Context, c kubernetes.Interface, sim *armsim.Server, as *harness.Process, metricsURL string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	start := time.Now()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		_, _, _, line := snapshot(ctx, c, sim)
		say("%6s  %s  |  %s", time.Since(start).Round(time.Second), line, autoscalerLine(metricsURL))
		total := 0
		for _, name := range []string{"cpu", "gpu-h100", "gpu-team-rl"} {
			if st, err := sim.ScaleSet(resourceGroup, name); err == nil {
				total += st.Capacity
			}
		}
		// The warm pool keeps one gpu-h100 node, held by a balloon.
		if total == warmNodes {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d machines left after %s", total, timeout)
		}
		if err := next(ctx, as, tick); err != nil {
			return err
		}
	}
}

func cleanup(ctx context.Context, c kubernetes.Interface) error {
	bg := metav1.DeletePropagationBackground
	if err := c.BatchV1().Jobs(namespace).Delete(ctx, "train", metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		return fmt.Errorf("deleting job train: %w", err)
	}
	for _, d := range []string{"web", "rl-eval"} {
		if err := c.AppsV1().Deployments(namespace).Delete(ctx, d, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("deleting deployment %s: %w", d, err)
		}
	}
	return nil
}

func withPreflight(tags map[string]string) map[string]string {
	k := strings.ReplaceAll(preflightKey, "/", "__")
	tags["k8s.io_cluster-autoscaler_node-template_taint_"+k] = "pending:NoSchedule"
	tags["k8s.io_cluster-autoscaler_node-template_label_"+k] = "pending"
	return tags
}

// autoscalerLine is what the autoscaler says of its queue, preflight and
// warm pool on /metrics.
func autoscalerLine(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return "autoscaler metrics unavailable"
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	sums := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		for _, name := range []string{"vmss_autoscaler_node_addition_queue_depth", "vmss_autoscaler_preflight_pending_nodes",
			"vmss_autoscaler_warm_pool_ready_nodes", "vmss_autoscaler_nodes_in_flight"} {
			if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
				var v float64
				if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err == nil {
					sums[name] += v
				}
			}
		}
	}
	return fmt.Sprintf("queued %d, in flight %d, preflight pending %d, warm %d",
		int(sums["vmss_autoscaler_node_addition_queue_depth"]), int(sums["vmss_autoscaler_nodes_in_flight"]),
		int(sums["vmss_autoscaler_preflight_pending_nodes"]), int(sums["vmss_autoscaler_warm_pool_ready_nodes"]))
}
