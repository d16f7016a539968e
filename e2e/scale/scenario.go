package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	schedv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

const (
	subscription  = "5ca1e000-0000-0000-0000-000000000001"
	resourceGroup = "MC_scale_Cluster_eastus"
	namespace     = "scale"
	clusterTag    = "k8s.io_cluster-autoscaler_scale"
	// scaleSetLimit is what a Uniform scale set holds (Azure's limit, which
	// the simulator enforces).
	scaleSetLimit = 1000
	cpuSKU        = "Standard_D16s_v5"
	gpuSKU        = "Standard_ND96isr_H100_v5"
	// ARM's per-principal refill a minute (armsim.DefaultARMLimits: 25
	// reads and 10 writes a second), for the report. The simulator
	// throttles as Azure does by default; the Compute policies bind first
	// (a scale set's updates: 12, then 4 a minute: armsim.ComputePolicies).
	armReadsPerMinute  = 25 * 60
	armWritesPerMinute = 10 * 60
	// The least the simulator's long-running operations last (a
	// scale-out's lasts until its VMs are provisioned), and how long a
	// deletion takes.
	armLRODuration = 10 * time.Second
	armDeleteDelay = 30 * time.Second

	// Scale-down, compressed so that a run can watch it: a node is
	// unneeded after a minute, the brake's window is brakeWindow, and up
	// to emptyBulkDelete empty nodes go per loop (the default 10 would
	// never reach the brake). The brake's shares are the defaults.
	scaleDownUnneeded = time.Minute
	emptyBulkDelete   = 100
	brakeShare        = 0.5 // --scale-down-brake-cluster-share's default

	sampleEvery = 2 * time.Second
	// settle is how long capacity must stay what the pods need once they
	// all run.
	settle = 30 * time.Second
)

// smoothingBounds are the autoscaler's defaults the checks compare
// against: the adaptive rate's upper bound (--node-addition-rate-max),
// and the most the node-addition bucket holds, the burst
// (--node-addition-burst) or the rate over two loop periods
// (--scan-interval) when that is more.
func smoothingBounds() (maxRate, bucketMax int) {
	d := core.DefaultOptions()
	maxRate = int(d.NodeAdditionAdaptiveOptions.Max)
	return maxRate, max(d.NodeAdditionBurst, maxRate*int(2*d.ScanInterval/time.Second)/60)
}

var scenarioNames = []string{"burst", "burst-unsmoothed", "gangs"}

type scenario struct {
	name          string
	o             options
	bins          harness.Binaries
	autoscalerBin string
	dir           string

	smoothing, gangs, scaleDown bool
	brakeWindow                 time.Duration
}

// hookParallelism is how many nodes the simulator's hook registers at
// once (armsim.Options.HookParallelism).
const hookParallelism = 32

func newScenario(name string, o options, bins harness.Binaries, autoscalerBin string) *scenario {
	sc := &scenario{name: name, o: o, bins: bins, autoscalerBin: autoscalerBin, dir: filepath.Join(o.out, name), smoothing: true}
	switch name {
	case "burst":
		sc.scaleDown = o.sz.scaleDownFor > 0
	case "burst-unsmoothed":
		sc.smoothing = false
	case "gangs":
		sc.gangs = true
	}
	// About four brake windows in the time the scale-down is watched.
	sc.brakeWindow = (o.sz.scaleDownFor / 4).Round(time.Second)
	return sc
}

func (sc *scenario) describe() string {
	var parts []string
	if sc.gangs {
		parts = append(parts, fmt.Sprintf("%d gangs of %d pods x 8 GPUs (%s, one pod per node)", sc.o.sz.gangs, sc.o.sz.gangSize, gpuSKU))
	} else if sc.ib() {
		parts = append(parts, fmt.Sprintf("a Deployment of one 8-GPU pod a node for %d nodes of %s in %d InfiniBand scale sets of %d (singlePlacementGroup=true)",
			sc.o.sz.nodes, gpuSKU, ibSets(sc.o.sz.nodes), ibSetSize))
	} else {
		parts = append(parts, fmt.Sprintf("a Deployment for %d nodes of %s", sc.o.sz.nodes, cpuSKU))
	}
	if sc.o.sz.seed > 0 && !sc.gangs {
		parts = append(parts, fmt.Sprintf("%d of them running before the autoscaler starts", sc.o.sz.seed))
	}
	if sc.o.sz.extensions > 0 {
		parts = append(parts, fmt.Sprintf("VMs run extensions for %s after booting", sc.o.sz.extensions))
	}
	if sc.smoothing {
		parts = append(parts, "default smoothing")
	} else {
		parts = append(parts, "--node-addition-smoothing=false")
	}
	if sc.scaleDown {
		parts = append(parts, fmt.Sprintf("then scaled to 0 and watched for %s (brake window %s)", sc.o.sz.scaleDownFor, sc.brakeWindow))
	}
	return strings.Join(parts, ", ")
}

// ib says the burst runs on the InfiniBand layout.
func (sc *scenario) ib() bool { return sc.o.sz.layout == layoutIB && !sc.gangs }

// burstSKU is the burst's VM size.
func (sc *scenario) burstSKU() string {
	if sc.ib() {
		return gpuSKU
	}
	return cpuSKU
}

// burstResources is what a burst pod requests: a whole 8-GPU node on the
// InfiniBand layout, else podCPU.
func (sc *scenario) burstResources() apiv1.ResourceRequirements {
	if sc.ib() {
		return gangPod()
	}
	return burstPod(sc.o.sz.podCPU)
}

// ibSets is how many InfiniBand scale sets hold nodes.
func ibSets(nodes int) int { return (nodes + ibSetSize - 1) / ibSetSize }

// ibScaleSets are n InfiniBand scale sets of gpuSKU named ib-1..n: single
// placement groups of at most ibSetSize VMs in one zone, discovered by
// tags. The seed fills them in order: full sets first.
func ibScaleSets(n, seed int) []armsim.ScaleSetSpec {
	out := make([]armsim.ScaleSetSpec, 0, n)
	for i := 1; i <= n; i++ {
		c := min(ibSetSize, max(0, seed-(i-1)*ibSetSize))
		out = append(out, armsim.ScaleSetSpec{
			ResourceGroup: resourceGroup, Name: fmt.Sprintf("ib-%d", i), SKU: gpuSKU, Zones: []string{"1"},
			SinglePlacementGroup: true, Capacity: c,
			Tags: map[string]string{
				"k8s.io_cluster-autoscaler_enabled": "true",
				clusterTag:                          "owned",
				"min":                               "0",
				"max":                               fmt.Sprint(ibSetSize),
			},
		})
	}
	return out
}

// burstPod is one pod of the burst: cpu of it, so that a node holds the
// number its allocatable (after AKS's reservations) allows.
func burstPod(cpu resource.Quantity) apiv1.ResourceRequirements {
	return apiv1.ResourceRequirements{Requests: apiv1.ResourceList{
		apiv1.ResourceCPU: cpu, apiv1.ResourceMemory: resource.MustParse("1Gi")}}
}

// gangPod takes a whole 8-GPU node.
func gangPod() apiv1.ResourceRequirements {
	eight := *resource.NewQuantity(8, resource.DecimalSI)
	return apiv1.ResourceRequirements{
		Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("80"), apiv1.ResourceMemory: resource.MustParse("800Gi"), armsim.GPUResource: eight},
		Limits:   apiv1.ResourceList{armsim.GPUResource: eight},
	}
}

// scaleSets returns n scale sets of sku named prefix-1..n, each up to the
// platform's limit, discovered by tags.
func scaleSets(prefix, sku string, n int, zones []string) []armsim.ScaleSetSpec {
	out := make([]armsim.ScaleSetSpec, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, armsim.ScaleSetSpec{
			ResourceGroup: resourceGroup, Name: fmt.Sprintf("%s-%d", prefix, i), SKU: sku, Zones: zones,
			Tags: map[string]string{
				"k8s.io_cluster-autoscaler_enabled": "true",
				clusterTag:                          "owned",
				"min":                               "0",
				"max":                               fmt.Sprint(scaleSetLimit),
			},
		})
	}
	return out
}

// env is one scenario's running stack.
type env struct {
	cp  *harness.ControlPlane
	sim *armsim.Server
	as  *harness.Process
	// asStarted is when the autoscaler started.
	asStarted time.Time
	addr      string
	sets      []armsim.ScaleSetSpec
	client    kubernetes.Interface
	// caFile and tokenFile are the autoscaler's ARM credentials.
	caFile, tokenFile string
	// seeded is each scale set's capacity before the autoscaler started,
	// by lower-cased "resource group/name".
	seeded map[string]int
}

// start brings up the control plane, the simulator and the autoscaler. The
// returned stop tears all of it down.
func (sc *scenario) start(ctx context.Context) (_ *env, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if err := os.MkdirAll(sc.dir, 0o755); err != nil {
		return nil, stop, err
	}
	cp, err := harness.Start(ctx, sc.bins, harness.Options{Dir: sc.dir,
		KwokNodeLeaseSeconds: sc.o.sz.kwokLeaseSeconds, KwokNodeStatusInterval: sc.o.sz.kwokStatusInterval,
		NodeMonitorGracePeriod: sc.o.sz.nodeMonitorGracePeriod})
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, cp.Stop)
	e := &env{cp: cp, client: cp.Client, seeded: map[string]int{}}

	hook := armsim.NewKubeNodeHook(cp.Client)
	hook.Annotations = map[string]string{"kwok.x-k8s.io/node": "fake"}
	sim, err := armsim.New(armsim.Options{
		SubscriptionID: subscription, Location: "eastus",
		BootDelay: sc.o.bootDelay, BootJitter: sc.o.bootDelay / 2, Seed: 1,
		LRODuration: sc.o.sz.lro, ExtensionDelay: sc.o.sz.extensions, DeleteDelay: armDeleteDelay,
		// Kubelets register their nodes each on its own: 32 at once keeps
		// the API server, not the harness, the pace of a burst's joins
		// (one after the other, 2,000 nodes took 115 s to register on 2
		// cores, 17 a second).
		Hook: hook, HookParallelism: hookParallelism,
	})
	if err != nil {
		return nil, stop, err
	}
	if sc.gangs {
		perSet := scaleSetLimit / sc.o.sz.gangSize
		e.sets = scaleSets("gpu", gpuSKU, (sc.o.sz.gangs+perSet-1)/perSet, []string{"1"})
	} else if sc.ib() {
		e.sets = ibScaleSets(ibSets(sc.o.sz.nodes), sc.o.sz.seed)
		for _, s := range e.sets {
			e.seeded[strings.ToLower(resourceGroup+"/"+s.Name)] = s.Capacity
		}
	} else {
		e.sets = scaleSets("cpu", cpuSKU, sc.o.sz.nodes/scaleSetLimit+1, []string{"1", "2", "3"})
		// The seed, spread evenly: running VMs whose nodes the hook
		// registers at the simulator's first ticks.
		for i := range e.sets {
			n := sc.o.sz.seed / len(e.sets)
			if i < sc.o.sz.seed%len(e.sets) {
				n++
			}
			e.sets[i].Capacity = n
			e.seeded[strings.ToLower(resourceGroup+"/"+e.sets[i].Name)] = n
		}
	}
	for _, s := range e.sets {
		if err := sim.AddScaleSet(s); err != nil {
			return nil, stop, err
		}
	}
	if err := sim.Start(); err != nil {
		return nil, stop, err
	}
	stops = append(stops, sim.Close)
	simCtx, cancelSim := context.WithCancel(context.WithoutCancel(ctx))
	go sim.Run(simCtx)
	stops = append(stops, cancelSim)
	e.sim = sim

	e.caFile = filepath.Join(sc.dir, "armsim-ca.pem")
	e.tokenFile = filepath.Join(sc.dir, "arm-token")
	if err := os.WriteFile(e.caFile, sim.CACertPEM(), 0o600); err != nil {
		return nil, stop, err
	}
	if err := os.WriteFile(e.tokenFile, []byte("scale-token"), 0o600); err != nil {
		return nil, stop, err
	}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, stop, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	// The balloon namespace as the chart creates it: the binary refuses one
	// without Pod Security restricted, and kube-system or its own.
	balloonNS := &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: balloon.DefaultNamespace,
		Labels: map[string]string{balloon.PodSecurityEnforceLabel: balloon.PodSecurityRestricted}}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, balloonNS, metav1.CreateOptions{}); err != nil {
		return nil, stop, fmt.Errorf("creating namespace %s: %w", balloonNS.Name, err)
	}
	return e, stop, nil
}

// startAutoscaler starts the autoscaler binary; the control plane's Stop
// stops it.
func (sc *scenario) startAutoscaler(ctx context.Context, e *env) error {
	var err error
	if e.addr, err = harness.FreeAddr(); err != nil {
		return err
	}
	cp, sim, caFile, tokenFile := e.cp, e.sim, e.caFile, e.tokenFile
	// Every flag not named here is the autoscaler's default: scan
	// interval, cache TTL, smoothing (rate, burst, adaptive mode, in-flight
	// cap), client QPS, protobuf, leader election; and, when the run
	// watches no scale-down, the scale-down timings too.
	args := []string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--namespace=kube-system",
		"--address=" + e.addr,
		"--azure-subscription-id=" + subscription,
		"--azure-resource-groups=" + resourceGroup,
		"--node-group-auto-discovery=label:k8s.io_cluster-autoscaler_enabled," + clusterTag,
		"--azure-arm-endpoint=" + sim.URL(),
		"--azure-ca-file=" + caFile,
		"--azure-auth=token-file",
		"--azure-token-file=" + tokenFile,
		fmt.Sprintf("--node-addition-smoothing=%t", sc.smoothing),
		"--v=2",
	}
	if sc.o.sz.scaleDownFor > 0 {
		args = append(args,
			"--scale-down-unneeded-time="+scaleDownUnneeded.String(),
			"--scale-down-delay-after-add="+scaleDownUnneeded.String(),
			"--scale-down-brake-window="+sc.brakeWindow.String(),
			fmt.Sprintf("--max-empty-bulk-delete=%d", emptyBulkDelete))
	}
	args = append(args, sc.o.autoscalerFlags...)
	as, err := cp.StartProcess(ctx, "vmss-autoscaler", sc.autoscalerBin, args...)
	if err != nil {
		return err
	}
	e.as, e.asStarted = as, time.Now()
	return nil
}

// submit creates the scenario's workload and returns the number of pods
// and the nodes they need.
func (sc *scenario) submit(ctx context.Context, e *env, hook *armsim.KubeNodeHook) (pods, nodes int, err error) {
	c := e.client
	if !sc.gangs {
		per, err := measure.PodsPerNode(hook, sc.burstSKU(), sc.burstResources())
		if err != nil {
			return 0, 0, err
		}
		replicas := int32(sc.o.sz.nodes * per)
		if sc.o.sz.seed > 0 {
			// The seed's pods run already: the burst is the rest.
			if err := scaleDeployment(ctx, c, replicas); err != nil {
				return 0, 0, err
			}
			return int(replicas), sc.o.sz.nodes, nil
		}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "burst", Namespace: namespace},
			Spec: appsv1.DeploymentSpec{
				Replicas: &replicas,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "burst"}},
				Template: apiv1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "burst"}},
					Spec:       apiv1.PodSpec{Containers: []apiv1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10", Resources: sc.burstResources()}}},
				},
			},
		}
		if _, err := c.AppsV1().Deployments(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return 0, 0, fmt.Errorf("creating deployment burst: %w", err)
		}
		return int(replicas), sc.o.sz.nodes, nil
	}
	size := int32(sc.o.sz.gangSize)
	for g := range sc.o.sz.gangs {
		name := fmt.Sprintf("train-%d", g)
		pg := &schedv1alpha2.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
		pg.Spec.SchedulingPolicy.Gang = &schedv1alpha2.GangSchedulingPolicy{MinCount: size}
		if _, err := c.SchedulingV1alpha2().PodGroups(namespace).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
			return 0, 0, fmt.Errorf("creating PodGroup %s: %w", name, err)
		}
		group := name
		// A StatefulSet of trainers (as LeaderWorkerSet and MPI operators
		// run them), all pods at once: they run until deleted, where kwok
		// would complete a Job's pods at once.
		set := &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: appsv1.StatefulSetSpec{
				Replicas:            &size,
				PodManagementPolicy: appsv1.ParallelPodManagement,
				Selector:            &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				Template: apiv1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
					Spec: apiv1.PodSpec{
						SchedulingGroup: &apiv1.PodSchedulingGroup{PodGroupName: &group},
						Containers:      []apiv1.Container{{Name: "trainer", Image: "registry.k8s.io/pause:3.10", Resources: gangPod()}},
					},
				},
			},
		}
		if _, err := c.AppsV1().StatefulSets(namespace).Create(ctx, set, metav1.CreateOptions{}); err != nil {
			return 0, 0, fmt.Errorf("creating StatefulSet %s: %w", name, err)
		}
	}
	n := sc.o.sz.gangs * sc.o.sz.gangSize
	return n, n, nil
}

// capacity is the scale sets' total sku.capacity.
func (e *env) capacity() int {
	n := 0
	for _, s := range e.sets {
		if st, err := e.sim.ScaleSet(s.ResourceGroup, s.Name); err == nil {
			n += st.Capacity
		}
	}
	return n
}

// run runs the scenario and measures it. An error means the run broke;
// failed checks are in the result.
func (sc *scenario) run(ctx context.Context) (*result, error) {
	begin := time.Now()
	e, stop, err := sc.start(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	res := &result{Name: sc.name, Smoothing: sc.smoothing, Description: sc.describe(), LogDir: e.cp.LogDir}
	w, err := watch(ctx, e.cp.RESTConfig, namespace)
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	if err := sc.awaitSeed(ctx, e, w, res); err != nil {
		return nil, err
	}
	base := point{VMLists: vmListCalls(e.sim.Calls())}
	base.ComputeThrottled, base.ARMThrottled = throttledCounts(e.sim.Throttled())
	if err := sc.startAutoscaler(ctx, e); err != nil {
		return nil, err
	}
	s := newSampler(e, w)
	samplerCtx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	go s.run(samplerCtx)

	hook := armsim.NewKubeNodeHook(e.client)
	t0 := time.Now()
	s.mark(t0)
	pods, need, err := sc.submit(ctx, e, hook)
	if err != nil {
		return nil, err
	}
	res.Pods, res.NodesNeeded = pods, need
	say("  %d pods submitted, %d nodes needed", pods, need)

	// Scale-up: until every pod runs, with a line of progress a minute.
	deadline := t0.Add(sc.o.sz.timeout)
	lastSay := time.Now()
	for {
		running, pending := w.pods()
		if res.TimeToAllNodes == 0 && w.nodeCount() >= need {
			res.TimeToAllNodes = seconds(time.Since(t0))
		}
		if running >= pods {
			res.TimeToAllRunning = seconds(time.Since(t0))
			break
		}
		if time.Now().After(deadline) {
			res.fail("not all pods Running after %s: %d running, %d pending, %d nodes, capacity %d", sc.o.sz.timeout, running, pending, w.nodeCount(), e.capacity())
			break
		}
		if err := wait(ctx, e.as, sampleEvery); err != nil {
			res.fail("%v", err)
			break
		}
		if time.Since(lastSay) >= time.Minute {
			say("  %s: %d running, %d pending, %d nodes, capacity %d", time.Since(t0).Round(time.Second), running, pending, w.nodeCount(), e.capacity())
			lastSay = time.Now()
		}
	}
	if res.TimeToAllRunning > 0 {
		say("  all %d pods Running after %.0f s on %d nodes; holding %s", pods, res.TimeToAllRunning, w.nodeCount(), sc.o.sz.hold)
		// Capacity must be what the pods need, and stay so; the
		// autoscaler is measured at that size meanwhile.
		before := sc.readAutoscaler(ctx, e)
		holdStart := time.Now()
		end := holdStart.Add(sc.o.sz.hold)
		if minEnd := e.asStarted.Add(sc.o.sz.minRun); minEnd.After(end) {
			end = minEnd
			say("  holding until the autoscaler has run %s (%s more)", sc.o.sz.minRun, time.Until(end).Round(time.Second))
		}
		for lastSay := holdStart; time.Now().Before(end); {
			if time.Since(lastSay) >= 5*time.Minute {
				say("  holding: %s left", time.Until(end).Round(time.Second))
				lastSay = time.Now()
			}
			if c := e.capacity(); c != need {
				res.fail("capacity %d with all pods Running, want the %d nodes they need", c, need)
				break
			}
			if err := wait(ctx, e.as, sampleEvery); err != nil {
				res.fail("%v", err)
				break
			}
		}
		res.Steady = steadyOf(before, sc.readAutoscaler(ctx, e), w.nodeCount(), holdStart.Sub(t0).Seconds(), time.Since(t0).Seconds())
	}
	res.NodesAtEnd = w.nodeCount()
	res.CapacityAtEnd = e.capacity()
	res.ScaleUpWrites = requestedPerWindow(e.sim.Writes(), e.seeded, t0, time.Minute)
	// A gang larger than the burst is released whole and paid back, so
	// only the burst's requests are bounded per minute: a token bucket
	// releases at most its rate plus its size in any 60 s.
	if adaptiveMaxRate, bucketMax := smoothingBounds(); sc.smoothing && !sc.gangs && res.ScaleUpWrites.MaxPerMinute > adaptiveMaxRate+bucketMax {
		res.fail("%d nodes requested within 60 s with smoothing on, above the adaptive maximum %d/min plus the bucket's %d", res.ScaleUpWrites.MaxPerMinute, adaptiveMaxRate, bucketMax)
	}
	scaleUpEnd := time.Now()

	if sc.scaleDown && res.TimeToAllRunning > 0 {
		if err := sc.shrink(ctx, e, w, s, res); err != nil {
			return nil, err
		}
	}
	stopSampler()
	s.wait()
	// Measured also when interrupted (Ctrl-C): what ran until then.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	res.measure(mctx, e, w, s, t0, scaleUpEnd)
	sc.judgeAzure(e, res, base, t0, scaleUpEnd)
	select {
	case <-e.as.Exited():
		res.fail("the autoscaler exited: %v (log %s)", e.as.ExitErr(), e.as.LogFile)
	default:
	}
	res.Duration = time.Since(begin).Round(time.Second).String()
	return res, nil
}

// shrink scales the burst to 0 and watches the nodes go for scaleDownFor:
// no more than the brake's share of the cluster in any window.
func (sc *scenario) shrink(ctx context.Context, e *env, w *watcher, s *sampler, res *result) error {
	if err := scaleDeployment(ctx, e.client, 0); err != nil {
		return err
	}
	t0 := time.Now()
	start := w.nodeCount()
	say("  scaled to 0 pods; watching %d nodes go for %s", start, sc.o.sz.scaleDownFor)
	// The first nodes go about scaleDownUnneeded + a loop + the pause
	// after the taint + armDeleteDelay after t0 (108-110 s of the ci
	// size's 120), so a slower machine could end the watch with the
	// first deletions still in ARM: when nothing is gone by then, the
	// watch goes on until the first node is, for at most one more
	// deletion and a minute. "No node removed" then means a deletion
	// not sent or not done, never a deletion caught in flight.
	deadline := sc.o.sz.scaleDownFor + armDeleteDelay + time.Minute
	for w.nodeCount() > 0 {
		elapsed := time.Since(t0)
		if elapsed >= deadline || (elapsed >= sc.o.sz.scaleDownFor && !w.firstRemovalAfter(t0).IsZero()) {
			break
		}
		if err := wait(ctx, e.as, sampleEvery); err != nil {
			res.fail("%v", err)
			break
		}
	}
	sd := &scaleDownResult{StartNodes: start, EndNodes: w.nodeCount(), Window: sc.brakeWindow.String(), WatchedFor: seconds(time.Since(t0))}
	sd.Windows, sd.MaxShare = brakeWindows(w.nodeSeries(), t0, sc.brakeWindow)
	points, _ := s.series()
	sd.MostSent, sd.SentLimit = mostSent(points, t0.Sub(s.start()).Seconds(), sc.brakeWindow, brakeShare)
	if first := w.firstRemovalAfter(t0); !first.IsZero() {
		sd.FirstRemoval = seconds(first.Sub(t0))
	}
	res.ScaleDown = sd
	// The brake counts a deletion when it is sent, so the check is on the
	// deletions sent; the nodes go a deletion's duration later, and
	// windows seen from them (MaxShare, reported) can hold more.
	if sd.MostSent > sd.SentLimit {
		res.fail("%d deletions sent within one brake window (%s), above the brake's %.0f%% of the cluster (%d)", sd.MostSent, sc.brakeWindow, 100*brakeShare, sd.SentLimit)
	}
	if sd.EndNodes == start {
		res.fail("no node removed in %s of scale-down", time.Since(t0).Round(time.Second))
	}
	say("  %d -> %d nodes in %.0f s", start, sd.EndNodes, sd.WatchedFor)
	return nil
}

// scaleDeployment sets the burst Deployment's replicas, read again and
// written again when the Deployment controller's status update won the
// race (409 Conflict: the xl seeding once failed on it).
func scaleDeployment(ctx context.Context, c kubernetes.Interface, replicas int32) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := c.AppsV1().Deployments(namespace).Get(ctx, "burst", metav1.GetOptions{})
		if err != nil {
			return err
		}
		d.Spec.Replicas = &replicas
		_, err = c.AppsV1().Deployments(namespace).Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("scaling deployment burst to %d: %w", replicas, err)
	}
	return nil
}

// seedTimeout bounds the seed's registration.
const seedTimeout = 15 * time.Minute

// awaitSeed waits until the seeded VMs' nodes are Ready, before the
// autoscaler starts: a cluster of that size that it finds, not one it
// grows.
func (sc *scenario) awaitSeed(ctx context.Context, e *env, w *watcher, res *result) error {
	want := 0
	for _, n := range e.seeded {
		want += n
	}
	if want == 0 {
		return nil
	}
	begin := time.Now()
	lastSay := begin
	for w.readyCount() < want {
		if time.Since(begin) > seedTimeout {
			return fmt.Errorf("the %d seeded nodes not Ready after %s: %d nodes, %d Ready", want, seedTimeout, w.nodeCount(), w.readyCount())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(sampleEvery):
		}
		if time.Since(lastSay) >= time.Minute {
			say("  seeding: %d nodes, %d Ready of %d", w.nodeCount(), w.readyCount(), want)
			lastSay = time.Now()
		}
	}
	say("  %d seeded nodes Ready after %.0f s; their pods next", want, time.Since(begin).Seconds())
	// The seed's pods, as the cluster had them before the burst: the
	// burst Deployment at the seed's size.
	per, err := measure.PodsPerNode(armsim.NewKubeNodeHook(e.client), sc.burstSKU(), sc.burstResources())
	if err != nil {
		return err
	}
	zero := int32(0)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "burst", Namespace: namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "burst"}},
			Template: apiv1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "burst"}},
				Spec:       apiv1.PodSpec{Containers: []apiv1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10", Resources: sc.burstResources()}}},
			},
		},
	}
	if _, err := e.client.AppsV1().Deployments(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating deployment burst: %w", err)
	}
	pods := want * per
	if err := scaleDeployment(ctx, e.client, int32(pods)); err != nil {
		return err
	}
	for {
		running, pending := w.pods()
		if running >= pods {
			break
		}
		if time.Since(begin) > seedTimeout {
			return fmt.Errorf("the seed's %d pods not Running after %s: %d running, %d pending", pods, seedTimeout, running, pending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(sampleEvery):
		}
		if time.Since(lastSay) >= time.Minute {
			say("  seeding: %d of %d pods Running", running, pods)
			lastSay = time.Now()
		}
	}
	res.SeedNodes, res.SeedSeconds = want, seconds(time.Since(begin))
	say("  %d seeded nodes Ready and their %d pods Running after %.0f s; starting the autoscaler", want, pods, res.SeedSeconds)
	return nil
}

// autoscalerReading is the autoscaler's counters at one time.
type autoscalerReading struct {
	at           time.Time
	requests     float64
	statusWrites float64
	usage        measure.Usage
	ok           bool
}

// readAutoscaler reads the autoscaler's API request counters and /proc.
func (sc *scenario) readAutoscaler(ctx context.Context, e *env) autoscalerReading {
	r := autoscalerReading{at: time.Now()}
	fams, err := measure.Scrape(ctx, "http://"+e.addr+"/metrics")
	if err != nil {
		return r
	}
	u, err := measure.ProcUsage(e.as.Pid())
	if err != nil {
		return r
	}
	reqs := byLabels(fams, "rest_client_request_duration_seconds", "verb", "resource")
	for _, v := range reqs {
		r.requests += v
	}
	r.statusWrites = statusWrites(reqs)
	r.usage, r.ok = u, true
	return r
}

// steadyOf is the autoscaler at full size, between two readings.
func steadyOf(a, b autoscalerReading, nodes int, from, to float64) *steadyResult {
	st := &steadyResult{Nodes: nodes, From: from, To: to}
	mins := b.at.Sub(a.at).Minutes()
	if !a.ok || !b.ok || mins <= 0 {
		return st
	}
	st.RequestsPerMinute = (b.requests - a.requests) / mins
	st.StatusWritesPerMinute = (b.statusWrites - a.statusWrites) / mins
	st.CPUCores = (b.usage.CPUSeconds - a.usage.CPUSeconds) / (60 * mins)
	st.RSSMiB = b.usage.RSSMiB
	return st
}

// statusWrites are the autoscaler's writes of ConfigMaps: its status
// ConfigMap is the only one it writes.
func statusWrites(reqs map[string]float64) float64 {
	return reqs["PUT configmaps"] + reqs["POST configmaps"] + reqs["PATCH configmaps"]
}

// wait sleeps for d, or says why not to go on.
func wait(ctx context.Context, as *harness.Process, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-as.Exited():
		return fmt.Errorf("the autoscaler exited: %v (log %s)", as.ExitErr(), as.LogFile)
	case <-t.C:
		return nil
	}
}

func seconds(d time.Duration) float64 {
	return float64(d.Round(100*time.Millisecond)) / float64(time.Second)
}
