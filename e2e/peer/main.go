// Command peer is a side-by-side benchmark (make peer): the same real
// control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, kwok) and the same pods, scaled once by this autoscaler
// (with its default flags, smoothing on, against the ARM simulator) and
// once by Karpenter's kwok provider (sigs.k8s.io/karpenter's kwok main,
// built from the module proxy), and the floor: the same pods on nodes that
// already exist, what the control plane alone costs.
//
// Every run is on a fresh control plane. Pods are a Deployment of pause
// pods of 2 CPU / 2 Gi; nodes have 64 cores on both sides (ours
// Standard_D64s_v5, registered as AKS registers them; Karpenter's
// c-64x-amd64-linux), so about 30 pods fit a node.
//
// It writes report.md, report.json and a plot per size (running-<pods>.svg
// and .png) to --report-dir and prints the table. It exits 1 when a run
// broke (not when a goal is missed: the report says so).
//
//	go run ./e2e/peer --sizes=1000,5000 --runs=ours,karpenter,floor
package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

const (
	subscription  = "5ca1e000-0000-0000-0000-000000000002"
	resourceGroup = "MC_peer_Cluster_eastus"
	scaleSet      = "d64"
	ourSKU        = "Standard_D64s_v5"
	namespace     = "peer"
	// scaleSetLimit is what a Uniform scale set holds.
	scaleSetLimit = 1000
	// The simulator's long-running operations' duration with --arm-limits.
	armLRODuration = 10 * time.Second

	// sampleEvery is how often the series is sampled (the time to all
	// Running is the informer's event's, not a sample's).
	sampleEvery = 500 * time.Millisecond
)

var (
	podCPU    = resource.MustParse("2")
	podMemory = resource.MustParse("2Gi")
)

type options struct {
	sizes     []int
	runs      []string
	reportDir string
	bootDelay time.Duration
	timeout   time.Duration
	// ourArgs are flags added to ours (to split a gap: smoothing off, say);
	// the report's command lines show them.
	ourArgs []string
	// repeat is how many rounds of each run, interleaved; the report
	// shows each run's median.
	repeat int
	// armLimits: the simulator throttles as Azure does (its default) and
	// its long-running operations take armLRODuration; off, neither.
	armLimits bool
}

func main() {
	var o options
	fs := pflag.NewFlagSet("peer", pflag.ContinueOnError)
	fs.IntSliceVar(&o.sizes, "sizes", []int{1000, 5000}, "pods per run (a Deployment of 2 CPU / 2 Gi pause pods)")
	fs.StringSliceVar(&o.runs, "runs", runNames, "runs per size: ours, karpenter, floor")
	fs.StringVar(&o.reportDir, "report-dir", "", "where report.md, report.json, the plots and each run's logs go (default .cache/peer)")
	fs.DurationVar(&o.bootDelay, "boot-delay", 0, "time from a node's request to its registration, the same on both sides (ARM simulator boot delay, no jitter; KWOKNodeClass nodeRegistrationDelay)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "how long a run may take to get every pod Running")
	fs.StringArrayVar(&o.ourArgs, "ours-flag", nil, "a flag added to this autoscaler's command line, e.g. --ours-flag=--node-addition-smoothing=false (repeatable; default none: its defaults)")
	fs.IntVar(&o.repeat, "repeat", 1, "rounds of each run per size, interleaved (ours, karpenter, floor, then again); the report shows each run's median round and every round's time")
	fs.BoolVar(&o.armLimits, "arm-limits", true, "the ARM simulator throttles as Azure does (its default: ARM's buckets per principal, the Compute policies per scale set and subscription) and its long-running operations take 10 s; false: neither (Karpenter's kwok provider has no such limits)")
	measure.ParseFlags(fs, os.Args[1:])
	for _, n := range o.sizes {
		if n <= 0 {
			fmt.Fprintf(os.Stderr, "peer: --sizes: %d is not a positive number of pods\n", n)
			os.Exit(2)
		}
	}
	for _, r := range o.runs {
		if !slices.Contains(runNames, r) {
			fmt.Fprintf(os.Stderr, "peer: --runs: %q is not one of %s\n", r, strings.Join(runNames, ", "))
			os.Exit(2)
		}
	}
	if o.repeat < 1 || o.repeat > 20 {
		fmt.Fprintf(os.Stderr, "peer: --repeat: %d is not between 1 and 20\n", o.repeat)
		os.Exit(2)
	}
	if o.bootDelay < 0 || o.timeout <= 0 {
		fmt.Fprintln(os.Stderr, "peer: --boot-delay must not be negative and --timeout must be positive")
		os.Exit(2)
	}
	// Components log to files; the harness prints progress and the table.
	measure.Main("peer", func(ctx context.Context) error { return run(ctx, o) })
}

func say(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// tools are the built binaries.
type tools struct {
	bins               harness.Binaries
	ours               string
	karpenter          string
	karpenterModuleDir string
}

func run(ctx context.Context, o options) error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	if o.reportDir == "" {
		o.reportDir = filepath.Join(root, ".cache", "peer")
	}
	if o.reportDir, err = filepath.Abs(o.reportDir); err != nil {
		return err
	}
	if err := os.MkdirAll(o.reportDir, 0o755); err != nil {
		return err
	}
	say("peer benchmark: sizes %v, runs %v, boot delay %s; report in %s", o.sizes, o.runs, o.bootDelay, o.reportDir)
	var t tools
	say("building the control plane and the autoscaler ...")
	if t.bins, err = harness.BuildBinaries(ctx); err != nil {
		return err
	}
	if t.ours, err = harness.BuildGoBinary(ctx, "./cmd/vmss-autoscaler", "vmss-autoscaler"); err != nil {
		return err
	}
	if slices.Contains(o.runs, runKarpenter) {
		if t.karpenterModuleDir, err = karpenterModuleDir(ctx); err != nil {
			return err
		}
		if t.karpenter, err = buildKarpenter(ctx, root); err != nil {
			return err
		}
	}
	rep := &report{
		Machine: machine(), Started: time.Now().UTC(), BootDelay: o.bootDelay.String(), ARMLimits: o.armLimits,
		PodCPU: podCPU.String(), PodMemory: podMemory.String(), OurSKU: ourSKU,
		KarpenterT: karpenterInstanceType, Karpenter: karpenterMain + "@" + karpenterVersion, Sizes: o.sizes, Repeat: o.repeat,
	}
	var broke error
	for _, n := range o.sizes {
		for round := 1; round <= o.repeat; round++ {
			for _, name := range o.runs {
				if ctx.Err() != nil {
					break
				}
				if err := runRound(ctx, o, t, rep, name, n, round); err != nil {
					broke = errors.Join(broke, err)
				}
			}
		}
	}
	rep.Finished = time.Now().UTC()
	if err := rep.write(o.reportDir); err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(rep.markdown())
	fmt.Println()
	say("report: %s, %s; plots: %s", filepath.Join(o.reportDir, "report.md"), filepath.Join(o.reportDir, "report.json"), filepath.Join(o.reportDir, "running-<pods>.svg|png"))
	if ctx.Err() != nil {
		return errors.Join(broke, ctx.Err())
	}
	return broke
}

// runRound runs one round of run name at n pods into rep; an error is a
// run that broke (its logs named), not a slow one.
func runRound(ctx context.Context, o options, t tools, rep *report, name string, n, round int) error {
	dir := filepath.Join(o.reportDir, fmt.Sprintf("%d-%s", n, name))
	label := name
	if o.repeat > 1 {
		dir += fmt.Sprintf("-r%d", round)
		label += fmt.Sprintf(" round %d/%d", round, o.repeat)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	say("%s, %d pods (logs in %s)", label, n, dir)
	res, err := runOne(ctx, o, t, name, n, dir)
	if err != nil {
		say("  BROKE: %v", err)
		err = fmt.Errorf("%s %d: %w (logs in %s)", label, n, err, dir)
		rep.Broken = append(rep.Broken, err.Error())
		return err
	}
	res.Round = round
	rep.Results = append(rep.Results, res)
	if res.AllRunning != nil {
		say("  all %d pods Running after %.1f s on %d nodes", n, *res.AllRunning, res.Nodes)
	}
	return nil
}

// stack is one run's running parts.
type stack struct {
	opts   options
	cp     *harness.ControlPlane
	sim    *armsim.Server
	as     *harness.Process
	fig    *autoscalerFigures
	metric string // the autoscaler's /metrics URL
	stops  []func()
}

func (s *stack) stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

// runOne runs one autoscaler (or the floor) at one size on a fresh
// control plane. An error means the run broke; a run that only missed its
// timeout is a result with a failure.
func runOne(ctx context.Context, o options, t tools, name string, pods int, dir string) (*result, error) {
	begin := time.Now()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &stack{opts: o}
	defer s.stop()
	cp, err := harness.Start(ctx, t.bins, harness.Options{Dir: dir})
	if err != nil {
		return nil, err
	}
	s.cp = cp
	s.stops = append(s.stops, cp.Stop)
	res := &result{Run: name, Pods: pods, LogDir: cp.LogDir}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	// How many pods fit one of our nodes, from the node the simulator's
	// hook registers (AKS's reservations).
	per, err := measure.PodsPerNode(armsim.NewKubeNodeHook(cp.Client), ourSKU, podSpec().Containers[0].Resources)
	if err != nil {
		return nil, err
	}
	res.PodsPerNode = per
	switch name {
	case runOurs:
		err = s.startOurs(ctx, dir, o.bootDelay, t.ours, 0)
	case runFloor:
		res.Nodes = (pods + per - 1) / per
		err = s.startFloor(ctx, dir, res.Nodes)
	case runKarpenter:
		err = s.startKarpenter(ctx, o.bootDelay, t)
	}
	if err != nil {
		return nil, err
	}

	w, err := watch(ctx, cp.RESTConfig, namespace, name == runKarpenter)
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	// Figures at submission, to count from.
	var base autoscalerFigures
	if s.as != nil {
		u, err := measure.ProcUsage(s.as.Pid())
		if err != nil {
			return nil, err
		}
		base.CPUSeconds = u.CPUSeconds
		if base.Requests, err = clientRequests(ctx, s.metric); err != nil {
			return nil, err
		}
	}
	baseAll, err := apiServerRequests(ctx, cp.Client)
	if err != nil {
		return nil, err
	}

	self0, err := measure.ProcUsage(os.Getpid())
	if err != nil {
		return nil, err
	}
	w.expect(pods)
	t0 := time.Now()
	if err := submit(ctx, cp, pods); err != nil {
		return nil, err
	}
	deadline := t0.Add(o.timeout)
	lastSay := time.Now()
	for {
		running, nodes := w.counts()
		res.Series = append(res.Series, point{At: seconds(time.Since(t0)), Running: running, Nodes: nodes})
		if at := w.allRunning(); !at.IsZero() {
			v := seconds(at.Sub(t0))
			res.AllRunning = &v
			res.Series = append(res.Series[:len(res.Series)-1], point{At: v, Running: running, Nodes: nodes})
			break
		}
		if time.Now().After(deadline) {
			res.fail("not all pods Running after %s: %d of %d, %d nodes", o.timeout, running, pods, nodes)
			break
		}
		if s.as != nil {
			select {
			case <-s.as.Exited():
				return nil, fmt.Errorf("%s exited: %v (log %s)", s.as.Name, s.as.ExitErr(), s.as.LogFile)
			default:
			}
		}
		if time.Since(lastSay) >= 30*time.Second {
			say("  %s: %d of %d pods Running, %d nodes", time.Since(t0).Round(time.Second), running, pods, nodes)
			lastSay = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(sampleEvery):
		}
	}

	// Figures at the end.
	all, err := apiServerRequests(ctx, cp.Client)
	if err != nil {
		return nil, err
	}
	res.AllRequests = all - baseAll
	_, res.Registered = w.counts()
	if s.as != nil {
		f := s.fig
		u, err := measure.ProcUsage(s.as.Pid())
		if err != nil {
			return nil, err
		}
		f.CPUSeconds = u.CPUSeconds - base.CPUSeconds
		f.CPUSecondsTotal, f.PeakRSSMiB = u.CPUSeconds, u.PeakRSSMiB
		if f.RequestsTotal, err = clientRequests(ctx, s.metric); err != nil {
			return nil, err
		}
		f.Requests = f.RequestsTotal - base.Requests
		res.Autoscaler = f
	}
	switch name {
	case runOurs:
		if first, ok := firstScaleUp(s.sim.Writes(), t0); ok {
			v := seconds(first.Sub(t0))
			res.FirstNodeRequest = &v
		}
		if st, err := s.sim.ScaleSet(resourceGroup, scaleSet); err == nil {
			res.Nodes = st.Capacity
		}
	case runKarpenter:
		n, first := w.claims()
		res.Nodes = n
		if n > 0 {
			v := seconds(first.Sub(t0))
			res.FirstNodeRequest = &v
		}
	}
	res.Components = map[string]usage{}
	for cname, p := range cp.Components() {
		if u, err := measure.ProcUsage(p.Pid()); err == nil {
			res.Components[cname] = usageOf(u)
		}
	}
	// This process (etcd, the ARM simulator and its node hook, the
	// watch), CPU from submission: it lives across runs.
	if u, err := measure.ProcUsage(os.Getpid()); err == nil {
		u.CPUSeconds -= self0.CPUSeconds
		res.Components["harness"] = usageOf(u)
	}
	res.Duration = time.Since(begin).Round(time.Second).String()
	return res, nil
}

// firstScaleUp is the first scale-set update after t0 that asked for more
// capacity than the one before it.
func firstScaleUp(writes []armsim.Write, t0 time.Time) (time.Time, bool) {
	last := 0
	for _, w := range writes {
		if w.Op != "UpdateScaleSet" || w.Capacity < 0 {
			continue
		}
		up := w.Capacity > last
		if w.Status/100 == 2 {
			last = w.Capacity
		}
		if up && !w.At.Before(t0) {
			return w.At, true
		}
	}
	return time.Time{}, false
}

func seconds(d time.Duration) float64 {
	return math.Round(d.Seconds()*10) / 10
}

// podSpec is one pod of the workload.
func podSpec() apiv1.PodSpec {
	return apiv1.PodSpec{Containers: []apiv1.Container{{
		Name: "pause", Image: "registry.k8s.io/pause:3.10",
		Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: podCPU, apiv1.ResourceMemory: podMemory}},
	}}}
}

// submit creates the Deployment of pods pause pods.
func submit(ctx context.Context, cp *harness.ControlPlane, pods int) error {
	replicas := int32(pods)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "pause", Namespace: namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "pause"}},
			Template: apiv1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "pause"}},
				Spec:       podSpec(),
			},
		},
	}
	if _, err := cp.Client.AppsV1().Deployments(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the Deployment: %w", err)
	}
	return nil
}

// startSim starts the ARM simulator with one scale set of capacity VMs
// whose nodes register as AKS registers them, managed by kwok.
func (s *stack) startSim(ctx context.Context, dir string, bootDelay time.Duration, capacity int) error {
	hook := armsim.NewKubeNodeHook(s.cp.Client)
	hook.Annotations = map[string]string{"kwok.x-k8s.io/node": "fake"}
	simOpts := armsim.Options{
		SubscriptionID: subscription, Location: "eastus",
		BootDelay: bootDelay, Seed: 1,
		Hook: hook,
	}
	if s.opts.armLimits {
		simOpts.LRODuration = armLRODuration
	} else {
		simOpts.Throttling.Disabled = true
	}
	sim, err := armsim.New(simOpts)
	if err != nil {
		return err
	}
	if err := sim.AddScaleSet(armsim.ScaleSetSpec{
		ResourceGroup: resourceGroup, Name: scaleSet, SKU: ourSKU, Zones: []string{"1", "2", "3"}, Capacity: capacity,
	}); err != nil {
		return err
	}
	if err := sim.Start(); err != nil {
		return err
	}
	s.stops = append(s.stops, sim.Close)
	simCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go sim.Run(simCtx)
	s.stops = append(s.stops, cancel)
	s.sim = sim
	return nil
}

// startOurs starts the simulator and the autoscaler with its default
// flags but those a deployment must give: the kubeconfig, the node group,
// the ARM endpoint, subscription and credential, and the metrics address.
func (s *stack) startOurs(ctx context.Context, dir string, bootDelay time.Duration, bin string, capacity int) error {
	if err := s.startSim(ctx, dir, bootDelay, capacity); err != nil {
		return err
	}
	caFile := filepath.Join(dir, "armsim-ca.pem")
	tokenFile := filepath.Join(dir, "arm-token")
	if err := os.WriteFile(caFile, s.sim.CACertPEM(), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(tokenFile, []byte("peer-token"), 0o600); err != nil {
		return err
	}
	// The balloon namespace as the chart creates it: the binary refuses
	// one without Pod Security restricted.
	balloonNS := &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: balloon.DefaultNamespace,
		Labels: map[string]string{balloon.PodSecurityEnforceLabel: balloon.PodSecurityRestricted}}}
	if _, err := s.cp.Client.CoreV1().Namespaces().Create(ctx, balloonNS, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", balloonNS.Name, err)
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + s.cp.Kubeconfig,
		"--namespace=kube-system",
		"--address=" + addr,
		fmt.Sprintf("--nodes=0:%d:%s", scaleSetLimit, scaleSet),
		"--azure-subscription-id=" + subscription,
		"--azure-resource-groups=" + resourceGroup,
		"--azure-arm-endpoint=" + s.sim.URL(),
		"--azure-ca-file=" + caFile,
		"--azure-auth=token-file",
		"--azure-token-file=" + tokenFile,
	}
	args = append(args, s.opts.ourArgs...)
	as, err := s.cp.StartProcess(ctx, "vmss-autoscaler", bin, args...)
	if err != nil {
		return err
	}
	s.as = as
	s.fig = &autoscalerFigures{Command: append([]string{"vmss-autoscaler"}, args...)}
	s.metric = "http://" + addr + "/metrics"
	// Ready: serving /metrics with its client's counter (its informers
	// have started).
	return poll(ctx, 2*time.Minute, "the autoscaler's /metrics", func() (bool, error) {
		select {
		case <-as.Exited():
			return false, fmt.Errorf("the autoscaler exited: %v (log %s)", as.ExitErr(), as.LogFile)
		default:
		}
		_, err := clientRequests(ctx, s.metric)
		return err == nil, nil
	})
}

// startFloor makes nodes nodes beforehand (the simulator's scale set at
// that capacity, no autoscaler) and waits until all are Ready and free of
// taints.
func (s *stack) startFloor(ctx context.Context, dir string, nodes int) error {
	if err := s.startSim(ctx, dir, 0, nodes); err != nil {
		return err
	}
	return poll(ctx, 5*time.Minute, fmt.Sprintf("%d Ready untainted nodes", nodes), func() (bool, error) {
		list, err := s.cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, n := range list.Items {
			if len(n.Spec.Taints) > 0 {
				continue
			}
			for _, c := range n.Status.Conditions {
				if c.Type == apiv1.NodeReady && c.Status == apiv1.ConditionTrue {
					ready++
				}
			}
		}
		return ready >= nodes, nil
	})
}

// startKarpenter installs Karpenter's CRDs, NodePool and KWOKNodeClass
// and starts it.
func (s *stack) startKarpenter(ctx context.Context, bootDelay time.Duration, t tools) error {
	if err := setupKarpenter(ctx, s.cp.RESTConfig, t.karpenterModuleDir, bootDelay); err != nil {
		return err
	}
	ports := make([]int, 2)
	for i := range ports {
		addr, err := harness.FreeAddr()
		if err != nil {
			return err
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return err
		}
		if ports[i], err = strconv.Atoi(port); err != nil {
			return fmt.Errorf("reading the port of %s: %w", addr, err)
		}
	}
	args := karpenterArgs(ports[0], ports[1])
	env := []string{"KUBECONFIG=" + s.cp.Kubeconfig}
	as, err := startKarpenter(ctx, s.cp, t.karpenter, env, args, ports[1])
	if as != nil {
		s.as = as
	}
	if err != nil {
		return err
	}
	s.fig = &autoscalerFigures{Command: append([]string{"karpenter"}, args...), Env: env}
	s.metric = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0])
	return nil
}
