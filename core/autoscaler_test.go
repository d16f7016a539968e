package core

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// env is an autoscaler over informer indexers fed directly by the test and
// the in-memory provider.
type env struct {
	t         testing.TB
	ctx       context.Context
	clock     *clocktesting.FakeClock
	provider  *inmemory.Provider
	nodes     cache.Indexer
	pods      cache.Indexer
	dss       cache.Indexer
	cms       cache.Indexer
	rss       cache.Indexer
	rec       *record.FakeRecorder
	status    *memStatus
	reg       *prometheus.Registry
	a         *Autoscaler
	opts      Options
	actions   actuation.NodeActions
	apiServer APIServerSignals
	balloons  BalloonController
	gangs     gang.MinCounts
	provreq   provreq.API
	buffers   capacitybuffer.API
	fence     cloudprovider.Fence
	// safety is the safety store new leaders share (nil: none).
	safety SafetyStore
	// late are pods only the API server has: bound after the informer's
	// view, seen by the Remover's fresh read alone.
	late []*apiv1.Pod
}

// envPods is the env's PodReader: the pod indexer for the cache, and the
// indexer plus the late pods for the API server.
type envPods struct{ e *env }

func (p envPods) Cached(node string) []*apiv1.Pod {
	var out []*apiv1.Pod
	for _, o := range p.e.pods.List() {
		if pod := o.(*apiv1.Pod); pod.Spec.NodeName == node {
			out = append(out, pod)
		}
	}
	return out
}

func (p envPods) Fresh(_ context.Context, node string) ([]*apiv1.Pod, error) {
	out := p.Cached(node)
	for _, pod := range p.e.late {
		if pod.Spec.NodeName == node {
			out = append(out, pod)
		}
	}
	return out, nil
}

type memStatus struct {
	writes []string
	// fail, when set, fails every write (nothing kept).
	fail error
}

func (m *memStatus) WriteStatus(_ context.Context, s string) error {
	if m.fail != nil {
		return m.fail
	}
	m.writes = append(m.writes, s)
	return nil
}

type envOption func(*env)

func withOptions(f func(*Options)) envOption { return func(e *env) { f(&e.opts) } }

// combine applies opts in order, as one option.
func combine(opts ...envOption) envOption {
	return func(e *env) {
		for _, o := range opts {
			o(e)
		}
	}
}

// writeGap is the follow-up pace in force (--node-group-write-interval).
func (e *env) writeGap() time.Duration { return e.a.opts.NodeGroupWriteInterval }

// actOnFailuresAtOnce sets --preflight-failure-settle to 0, for tests whose
// subject is what is done to a failed node, not when.
func actOnFailuresAtOnce() envOption {
	return withOptions(func(o *Options) { o.PreflightFailureSettle = 0 })
}

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	e := &env{
		t: t, ctx: context.Background(),
		clock:    clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		provider: inmemory.New(),
		nodes:    cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		pods:     cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		dss:      cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		cms:      cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		rss:      cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		rec:      record.NewFakeRecorder(100000),
		status:   &memStatus{},
		reg:      prometheus.NewRegistry(),
		opts:     DefaultOptions(),
	}
	e.opts.GPUResourceName = to.GPU
	// Scale-down deletes in the loop that decides; the delay after the
	// taint has tests of its own.
	e.opts.NodeDeleteDelayAfterTaint = 0
	for _, o := range opts {
		o(e)
	}
	return e
}

func (e *env) start() *env {
	e.t.Helper()
	factory := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	sim, err := simulator.New(e.ctx, factory, e.opts.GPUResourceName)
	if err != nil {
		e.t.Fatal(err)
	}
	factory.Start(e.ctx.Done())
	factory.WaitForCacheSync(e.ctx.Done())
	e.t.Cleanup(func() { _ = sim.Close() })
	a, err := New(Deps{
		Options:  e.opts,
		Provider: e.provider,
		Listers: Listers{
			Nodes:       corelisters.NewNodeLister(e.nodes),
			Pods:        corelisters.NewPodLister(e.pods),
			DaemonSets:  appslisters.NewDaemonSetLister(e.dss),
			ConfigMaps:  corelisters.NewConfigMapLister(e.cms).ConfigMaps(e.opts.Namespace),
			ReplicaSets: appslisters.NewReplicaSetLister(e.rss),
		},
		Simulator: sim,
		Recorder:  e.rec,
		Status:    e.status,
		Metrics:   NewMetrics(e.reg),
		Clock:     e.clock,
		Rand:      rand.New(rand.NewPCG(1, 2)),
		Actions:   e.actions,
		Pods:      envPods{e},
		Safety:    e.safety,
		APIServer: e.apiServer,
		Balloons:  e.balloons,
		Gangs:     e.gangs,
		Fence:     e.fence,

		ProvisioningRequests: e.provreq,
		CapacityBuffers:      e.buffers,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.a = a
	return e
}

func (e *env) run() {
	e.t.Helper()
	if err := e.a.RunOnce(e.ctx); err != nil {
		e.t.Fatalf("RunOnce: %v", err)
	}
}

func (e *env) add(objs ...any) {
	e.t.Helper()
	for _, o := range objs {
		var err error
		switch v := o.(type) {
		case *apiv1.Node:
			err = e.nodes.Add(v)
		case *apiv1.Pod:
			err = e.pods.Add(v)
		case []*apiv1.Pod:
			for _, p := range v {
				if err = e.pods.Add(p); err != nil {
					break
				}
			}
		default:
			err = fmt.Errorf("unknown object %T", o)
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

// register turns a group's running or creating instances without a node
// into Ready nodes built from the group's template.
func (e *env) register(g *inmemory.Group, opts ...to.NodeOption) {
	e.t.Helper()
	tmpl, err := g.TemplateNode()
	if err != nil {
		e.t.Fatal(err)
	}
	insts, _ := g.Instances()
	for _, in := range insts {
		name := strings.NewReplacer("://", "-", "/", "-").Replace(in.ProviderID)
		if _, ok, _ := e.nodes.GetByKey(name); ok || in.Error != nil {
			continue
		}
		n := tmpl.DeepCopy()
		n.Name, n.UID = name, types.UID(name)
		n.Labels[apiv1.LabelHostname] = name
		n.Spec.ProviderID = in.ProviderID
		n.CreationTimestamp.Time = e.clock.Now()
		n.Status.Conditions = []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionTrue}}
		for _, o := range opts {
			o(n)
		}
		e.add(n)
	}
}

func (e *env) events(reason string) []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			if strings.Contains(ev, " "+reason+" ") {
				out = append(out, ev)
			}
		default:
			return out
		}
	}
}

// gpuTemplate and cpuTemplate are a group's template; the nodes built from
// them carry the node-group label, as a scale set's custom data sets it.
func gpuTemplate(name string) *apiv1.Node {
	return to.Node(name, "96", "900Gi", to.NodeGPUs(8), to.NodeLabels("pool", name, balloon.DefaultNodeGroupLabel, name))
}

func cpuTemplate(name string) *apiv1.Node {
	return to.Node(name, "16", "64Gi", to.NodeLabels("pool", name, balloon.DefaultNodeGroupLabel, name))
}

func pendingPods(n int, prefix string, opts ...to.PodOption) []*apiv1.Pod {
	out := make([]*apiv1.Pod, n)
	for i := range out {
		o := append([]to.PodOption{to.ControlledBy("Job", prefix, types.UID("job-"+prefix)), to.Unschedulable()}, opts...)
		out[i] = to.Pod(fmt.Sprintf("%s-%d", prefix, i), o...)
	}
	return out
}

func wholeGPU() []to.PodOption { return []to.PodOption{to.Requests("90", "800Gi"), to.GPUs(8)} }

func TestScaleUpFromZero(t *testing.T) {
	e := newEnv(t)
	gpu := e.provider.AddGroup("gpu-a100", 0, 50, gpuTemplate("gpu-a100"))
	cpu := e.provider.AddGroup("cpu", 0, 50, cpuTemplate("cpu"))
	e.start()
	e.add(pendingPods(5, "train", wholeGPU()...))
	e.add(pendingPods(10, "web", to.Requests("4", "8Gi")))
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 5 {
		t.Fatalf("gpu increases = %v, want [5]", got)
	}
	// 10 pods of 4 CPUs on 16-CPU nodes: 3 nodes (4+4+2... binpacked 4 per node).
	if got := cpu.Increases(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("cpu increases = %v, want [3]", got)
	}
	if got := len(e.events(EventTriggeredScaleUp)); got != 15 {
		t.Fatalf("TriggeredScaleUp events = %d, want 15", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.ScaledUpNodes.WithLabelValues("gpu-a100")); got != 5 {
		t.Fatalf("scaled_up_nodes_total{gpu-a100} = %v, want 5", got)
	}
	if len(e.status.writes) != 1 || !strings.Contains(e.status.writes[0], "name: gpu-a100") {
		t.Fatalf("status writes = %v", e.status.writes)
	}
}

func TestNoScaleUpWhenPodsFitExistingNodes(t *testing.T) {
	e := newEnv(t)
	cpu := e.provider.AddGroup("cpu", 0, 50, cpuTemplate("cpu"), inmemory.WithTarget(2))
	e.start()
	e.register(cpu)
	e.add(pendingPods(6, "web", to.Requests("4", "8Gi"))) // 8 slots on 2 nodes
	e.run()
	if got := cpu.Increases(); len(got) != 0 {
		t.Fatalf("increases = %v, want none", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.UnschedulablePods); got != 6 {
		t.Fatalf("unschedulable_pods = %v, want 6", got)
	}
}

func TestNoSecondScaleUpForUpcomingNodes(t *testing.T) {
	e := newEnv(t)
	gpu := e.provider.AddGroup("gpu", 0, 50, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(4, "train", wholeGPU()...))
	e.run()
	e.clock.Step(30 * time.Second)
	e.run() // the machines are still being created
	e.clock.Step(30 * time.Second)
	gpu.MarkRunning()
	e.run() // running but not registered
	if got := gpu.Increases(); len(got) != 1 || got[0] != 4 {
		t.Fatalf("increases = %v, want [4]", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.PodsAwaitingNodes); got != 4 {
		t.Fatalf("pods_awaiting_upcoming_nodes = %v, want 4", got)
	}
	// More pods arrive: only the difference is requested.
	e.add(pendingPods(2, "train2", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 2 {
		t.Fatalf("increases = %v, want [4 2]", got)
	}
}

func TestMaxNodesTotal(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.MaxNodesTotal = 5 }))
	gpu := e.provider.AddGroup("gpu", 0, 50, gpuTemplate("gpu"), inmemory.WithTarget(3))
	e.start()
	e.register(gpu)
	e.add(pendingPods(3, "busy", append(wholeGPU(), to.OnNode(""))...))
	for i, p := range pendingPods(3, "running", wholeGPU()...) {
		p.Spec.NodeName = "inmemory-gpu-" + fmt.Sprint(i+1)
		p.Status = apiv1.PodStatus{Phase: apiv1.PodRunning}
		e.add(p)
	}
	e.add(pendingPods(10, "train", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("increases = %v, want [2]", got)
	}
	ev := e.events(EventNotTriggerScaleUp)
	if len(ev) == 0 || !strings.Contains(ev[0], "max-nodes-total reached") {
		t.Fatalf("NotTriggerScaleUp events = %v, want max-nodes-total reason", ev)
	}
}

func TestBackoffAfterCreationErrorFallsBackToNextGroup(t *testing.T) {
	e := newEnv(t)
	a := e.provider.AddGroup("gpu-a", 0, 50, gpuTemplate("gpu-a"))
	b := e.provider.AddGroup("gpu-b", 0, 50, gpuTemplate("gpu-b"))
	e.start()
	a.FailNextCreation(cloudprovider.ClassQuota, "QuotaExceeded", "Operation could not be completed as it results in exceeding approved standardNDSv5Family Cores quota")
	e.add(pendingPods(3, "train", wholeGPU()...))
	e.run()
	if got := a.Increases(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("gpu-a increases = %v, want [3] (least-waste tie goes to the lower ID)", got)
	}
	e.clock.Step(10 * time.Second)
	e.run() // the instances report the quota error: back off gpu-a, delete them, use gpu-b now
	if got := a.Deleted(); len(got) != 3 {
		t.Fatalf("gpu-a deleted %v, want its 3 failed instances", got)
	}
	if got := b.Increases(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("gpu-b increases = %v, want [3] in the same loop", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.Backoff.WithLabelValues("gpu-a")); got != 1 {
		t.Fatalf("backoff{gpu-a} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedScaleUps.WithLabelValues("gpu-a", "quota")); got != 3 {
		t.Fatalf("failed_scale_ups_total{gpu-a,quota} = %v, want 3", got)
	}
	if len(e.events(EventFailedScaleUp)) == 0 {
		t.Fatal("no FailedScaleUp event")
	}
}

func TestIncreaseErrorFallsBackInSameLoop(t *testing.T) {
	e := newEnv(t)
	a := e.provider.AddGroup("gpu-a", 0, 50, gpuTemplate("gpu-a"))
	b := e.provider.AddGroup("gpu-b", 0, 50, gpuTemplate("gpu-b"))
	e.start()
	a.SetIncreaseError(cloudprovider.NewError(cloudprovider.ClassOutOfCapacity, "ZonalAllocationFailed", "no capacity", nil))
	e.add(pendingPods(2, "train", wholeGPU()...))
	e.run()
	if got := b.Increases(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("gpu-b increases = %v, want [2]", got)
	}
	st := e.a.registry.Group("gpu-a").Backoff
	if !st.Active || st.Class != cloudprovider.ClassOutOfCapacity {
		t.Fatalf("gpu-a backoff = %+v, want active out-of-capacity", st)
	}
}

func TestProvisionTimeout(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.MaxNodeProvisionTime = 15 * time.Minute }))
	a := e.provider.AddGroup("gpu-a", 0, 50, gpuTemplate("gpu-a"))
	b := e.provider.AddGroup("gpu-b", 0, 50, gpuTemplate("gpu-b"))
	e.start()
	e.add(pendingPods(2, "train", wholeGPU()...))
	e.run()
	a.MarkRunning()
	for i := 0; i < 10; i++ { // 14 minutes of machines that never register
		e.clock.Step(84 * time.Second)
		e.run()
	}
	if got := len(a.Deleted()) + len(b.Increases()); got != 0 {
		t.Fatalf("acted before the provision timeout: deleted %v, gpu-b increases %v", a.Deleted(), b.Increases())
	}
	e.clock.Step(2 * time.Minute)
	e.run()
	if got := a.Deleted(); len(got) != 2 {
		t.Fatalf("gpu-a deleted %v, want its 2 unregistered instances", got)
	}
	if got := b.Increases(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("gpu-b increases = %v, want [2]", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedScaleUps.WithLabelValues("gpu-a", "provision-timeout")); got != 2 {
		t.Fatalf("failed_scale_ups_total{provision-timeout} = %v, want 2", got)
	}
}

func TestTargetNeverCreatedIsLowered(t *testing.T) {
	e := newEnv(t)
	a := e.provider.AddGroup("gpu-a", 0, 50, gpuTemplate("gpu-a"))
	e.start()
	a.SetNoInstances(true)
	e.add(pendingPods(2, "train", wholeGPU()...))
	e.run()
	e.clock.Step(16 * time.Minute)
	e.run()
	if got, _ := a.TargetSize(); got != 0 {
		t.Fatalf("target = %d, want 0 after lowering the never-created machines", got)
	}
	if !e.a.registry.Group("gpu-a").Backoff.Active {
		t.Fatal("gpu-a not backed off")
	}
}

func TestSizeUnknownGroupIsSkipped(t *testing.T) {
	e := newEnv(t)
	a := e.provider.AddGroup("gpu-a", 0, 50, gpuTemplate("gpu-a"))
	b := e.provider.AddGroup("gpu-b", 0, 50, gpuTemplate("gpu-b"))
	e.start()
	a.SetSizeUnknown(true)
	e.add(pendingPods(1, "train", wholeGPU()...))
	e.run()
	if len(a.Increases()) != 0 || len(b.Increases()) != 1 {
		t.Fatalf("increases a=%v b=%v, want only gpu-b", a.Increases(), b.Increases())
	}
	if got := testutil.ToFloat64(e.a.metrics.SizeUnknown.WithLabelValues("gpu-a")); got != 1 {
		t.Fatalf("node_group_size_unknown_total{gpu-a} = %v, want 1", got)
	}
}

func TestNotTriggerScaleUpSaysWhyPerGroup(t *testing.T) {
	e := newEnv(t)
	e.provider.AddGroup("cpu-a", 0, 50, cpuTemplate("cpu-a"))
	e.provider.AddGroup("cpu-b", 0, 50, cpuTemplate("cpu-b"))
	e.provider.AddGroup("team", 0, 50, to.Node("team", "96", "900Gi", to.NodeGPUs(8), to.Taint("openai.com/team", "rl")))
	e.start()
	e.add(pendingPods(1, "train", wholeGPU()...))
	e.run()
	ev := e.events(EventNotTriggerScaleUp)
	if len(ev) != 1 {
		t.Fatalf("NotTriggerScaleUp events = %v, want 1", ev)
	}
	for _, want := range []string{"2 node groups: Insufficient", "1 node group: node(s) had untolerated taint"} {
		if !strings.Contains(ev[0], want) {
			t.Errorf("event %q does not contain %q", ev[0], want)
		}
	}
}

func TestNewPodScaleUpDelay(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.NewPodScaleUpDelay = time.Minute }))
	g := e.provider.AddGroup("gpu", 0, 50, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(1, "train", append(wholeGPU(), to.CreatedAt(e.clock.Now().Add(-30*time.Second)))...))
	e.run()
	if len(g.Increases()) != 0 {
		t.Fatal("scaled up for a pod younger than the delay")
	}
	e.clock.Step(31 * time.Second)
	e.run()
	if len(g.Increases()) != 1 {
		t.Fatal("no scale-up once the pod is older than the delay")
	}
}

func TestStatusWrittenOnlyOnChange(t *testing.T) {
	// The adaptive rate's first decision changes the status (its reason):
	// not what this test is about.
	e := newEnv(t, withOptions(func(o *Options) { o.NodeAdditionAdaptive = false }))
	e.provider.AddGroup("cpu", 0, 50, cpuTemplate("cpu"))
	e.start()
	e.run()
	e.clock.Step(10 * time.Second)
	e.run()
	if len(e.status.writes) != 1 {
		t.Fatalf("status written %d times for two identical loops, want 1", len(e.status.writes))
	}
	e.add(pendingPods(1, "web", to.Requests("1", "1Gi")))
	e.run()
	if len(e.status.writes) != 2 {
		t.Fatalf("status written %d times, want 2 after a change", len(e.status.writes))
	}
}

func TestPriorityExpanderConfigMap(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.Expanders = []string{"priority", "least-waste"} }))
	a := e.provider.AddGroup("gpu-a", 0, 50, gpuTemplate("gpu-a"))
	b := e.provider.AddGroup("gpu-b", 0, 50, gpuTemplate("gpu-b"))
	e.start()
	cm := &apiv1.ConfigMap{}
	cm.Name, cm.Namespace, cm.ResourceVersion = e.opts.PriorityConfigMapName, e.opts.Namespace, "1"
	cm.Data = map[string]string{"priorities": "10:\n  - gpu-a\n50:\n  - gpu-b\n"}
	if err := e.cms.Add(cm); err != nil {
		t.Fatal(err)
	}
	e.add(pendingPods(1, "train", wholeGPU()...))
	e.run()
	if len(b.Increases()) != 1 || len(a.Increases()) != 0 {
		t.Fatalf("increases a=%v b=%v, want gpu-b (priority 50)", a.Increases(), b.Increases())
	}
	// A broken ConfigMap keeps the last good priorities.
	bad := cm.DeepCopy()
	bad.ResourceVersion, bad.Data["priorities"] = "2", "ten: [gpu-a]"
	if err := e.cms.Update(bad); err != nil {
		t.Fatal(err)
	}
	e.add(pendingPods(1, "train2", wholeGPU()...))
	e.run()
	if len(b.Increases()) != 2 {
		t.Fatalf("gpu-b increases = %v, want a second one with the last good priorities", b.Increases())
	}
	if ev := e.events("InvalidPriorities"); len(ev) != 1 {
		t.Fatalf("InvalidPriorities events = %v, want 1", ev)
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
