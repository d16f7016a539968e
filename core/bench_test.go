package core

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/heaptest"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// bigCluster is the synthetic 7,500-node, 200,000-pod cluster of the
// benchmarks: 10 GPU groups (8-GPU nodes, each running one whole-node
// training pod and 3 DaemonSet pods) and 10 CPU groups (64-CPU nodes with
// ~47 small pods each), 375 nodes per group.
func bigCluster(b *testing.B) (*env, []*inmemory.Group) { return bigClusterWith(b, 0) }

// bigClusterWith builds the cluster with the first lowUtil CPU nodes
// running 5 small pods instead of 47 (removable by scale-down).
func bigClusterWith(b *testing.B, lowUtil int) (*env, []*inmemory.Group) {
	b.Helper()
	e := newEnv(b, withOptions(func(o *Options) { o.MaxPodEventsPerLoop = 200 }), withScaleDown(&fakeActions{}))
	e.rec = &record.FakeRecorder{} // drop events
	const perGroup = 375
	var groups []*inmemory.Group
	pods := 0
	for gi := 0; gi < 20; gi++ {
		gpu := gi < 10
		name := fmt.Sprintf("cpu-%02d", gi-10)
		tmpl := to.Node(name, "64", "256Gi", to.NodeLabels("pool", name), to.MaxPods(110))
		if gpu {
			name = fmt.Sprintf("gpu-%02d", gi)
			tmpl = to.Node(name, "96", "900Gi", to.NodeGPUs(8), to.NodeLabels("pool", name), to.MaxPods(110))
		}
		g := e.provider.AddGroup(name, 0, 1000, tmpl, inmemory.WithTarget(perGroup))
		groups = append(groups, g)
		for i, id := range g.ProviderIDs() {
			n := tmpl.DeepCopy()
			n.Name = fmt.Sprintf("%s-%d", name, i)
			n.UID = types.UID(n.Name)
			n.Labels[apiv1.LabelHostname] = n.Name
			n.Spec.ProviderID = id
			e.add(n)
			for d := 0; d < 3; d++ {
				e.add(to.Pod(fmt.Sprintf("ds%d-%s", d, n.Name), to.Requests("100m", "128Mi"), to.OnNode(n.Name), to.Namespace("kube-system"),
					to.ControlledBy("DaemonSet", fmt.Sprintf("ds%d", d), types.UID(fmt.Sprintf("ds%d", d)))))
				pods++
			}
			if gpu {
				e.add(to.Pod("train-"+n.Name, to.Requests("90", "800Gi"), to.GPUs(8), to.OnNode(n.Name),
					to.ControlledBy("Job", "train-"+name, types.UID("train-"+name))))
				pods++
				continue
			}
			perNode := 47
			if lowUtil > 0 {
				perNode = 5
				lowUtil--
			}
			for k := 0; k < perNode; k++ {
				e.add(to.Pod(fmt.Sprintf("web-%s-%d", n.Name, k), to.Requests("1", "4Gi"), to.OnNode(n.Name),
					to.ControlledBy("ReplicaSet", fmt.Sprintf("web-%d", k%50), types.UID(fmt.Sprintf("web-%d", k%50)))))
				pods++
			}
		}
	}
	if pods < 200000-42*300 {
		b.Fatalf("built %d pods, want 200,000", pods)
	}
	e.start()
	return e, groups
}

// startTimer starts the measured part: the garbage of building the cluster
// is collected first, so the loops pay for their own garbage only.
func startTimer(b *testing.B) {
	b.Helper()
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
}

// BenchmarkSteadyLoop: no pending pods, nothing changes; the cost of
// reading the caches, refreshing the cluster state, the scale-down pass
// (no node is unneeded) and writing nothing.
func BenchmarkSteadyLoop(b *testing.B) {
	klog.SetLogger(klog.Background().V(10)) // keep the loop's logs out of the figures
	e, _ := bigCluster(b)
	e.run() // the first loop builds the snapshot from scratch
	startTimer(b)
	for i := 0; i < b.N; i++ {
		e.run()
	}
	b.StopTimer()
	reportLiveHeap(b, e)
}

// reportLiveHeap reports the heap still reachable after the loops (two
// collections, so nothing of theirs is left unswept): the informer caches
// of 7,500 nodes and 200,000 pods, the snapshot, the cluster state and
// the autoscaler. The goal is at most 1.5 GiB.
func reportLiveHeap(b *testing.B, keep ...any) {
	b.Helper()
	live := heaptest.Live()
	runtime.KeepAlive(keep)
	b.ReportMetric(float64(live)/(1<<20), "MiB-live-heap")
}

// BenchmarkColdSnapshotLoop: the first loop after start, building the
// scheduler view of all 200,000 pods.
func BenchmarkColdSnapshotLoop(b *testing.B) {
	klog.SetLogger(klog.Background().V(10))
	e, _ := bigCluster(b)
	startTimer(b)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e.a.builder = snapshot.NewBuilder(e.a.opts.GPUResourceName)
		b.StartTimer()
		e.run()
	}
}

// BenchmarkScaleUp10kPending: 10,000 pending pods of mixed shapes (2,000
// whole-node 8-GPU pods, 2,000 half-node 4-GPU pods, 6,000 small CPU pods,
// in 200 controllers) on the full 7,500-node cluster. Each iteration replays
// the same loop: the groups' targets and the cluster state are reset.
func BenchmarkScaleUp10kPending(b *testing.B) {
	klog.SetLogger(klog.Background().V(10))
	e, groups := bigCluster(b)
	// The planning is measured, not the node-addition queue: each replayed
	// loop would otherwise find the bucket spent by the one before.
	e.a.nodeAdd.enabled = false
	rnd := rand.New(rand.NewPCG(3, 3))
	for c := 0; c < 200; c++ {
		var opts []to.PodOption
		switch {
		case c < 40:
			opts = wholeGPU()
		case c < 80:
			opts = []to.PodOption{to.Requests("40", "400Gi"), to.GPUs(4)}
		default:
			opts = []to.PodOption{to.Requests(fmt.Sprintf("%d", 1+rnd.IntN(4)), "2Gi")}
		}
		e.add(pendingPods(50, fmt.Sprintf("job%03d", c), opts...))
	}
	e.run() // warm the snapshot with the pending pods in it
	startTimer(b)
	var scaled int
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for _, g := range groups {
			g.Reset()
		}
		e.a.registry = clusterstate.NewRegistry(e.a.registry.Options())
		b.StartTimer()
		e.run()
		scaled = 0
		for _, g := range groups {
			for _, d := range g.Increases() {
				scaled += d
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(scaled), "nodes-requested")
	if scaled == 0 {
		b.Fatal("no scale-up")
	}
	reportLiveHeap(b, e)
}

// BenchmarkScaleDownEvaluation: the scale-down pass (eligibility of 7,500
// nodes, drain simulation of 300 removable ones) on the 200,000-pod cluster.
func BenchmarkScaleDownEvaluation(b *testing.B) {
	klog.SetLogger(klog.Background().V(10))
	e, _ := bigClusterWith(b, 300)
	e.run()
	l := &loop{now: e.clock.Now()}
	nodes, err := e.a.listers.Nodes.List(labels.Everything())
	if err != nil {
		b.Fatal(err)
	}
	pods, _ := e.a.listers.Pods.List(labels.Everything())
	l.snap, _, _ = e.a.builder.Build(nodes, pods)
	groups := map[string]*scaledown.Group{}
	for _, g := range e.provider.NodeGroups() {
		groups[g.ID()] = &scaledown.Group{Min: 0, Target: 375, Healthy: true}
	}
	var in []scaledown.Node
	for i := 0; i < l.snap.Len(); i++ {
		ni := l.snap.NodeInfo(i)
		g, _ := e.provider.NodeGroupForNode(ni.Node())
		req := ni.GetRequested()
		n := scaledown.Node{Node: ni.Node(), Group: g.ID(), Ready: true, UtilizationThreshold: 0.5, GPUUtilizationThreshold: 0.5,
			Requested: &scaledown.Requested{MilliCPU: req.GetMilliCPU(), Memory: req.GetMemory(), GPU: req.GetScalarResources()[to.GPU]}}
		for _, pi := range ni.GetPods() {
			n.Pods = append(n.Pods, pi.GetPod())
		}
		in = append(in, n)
	}
	startTimer(b)
	removed := 0
	for i := 0; i < b.N; i++ {
		p := scaledown.NewPlanner(scaledown.Options{MaxParallelism: 1000, MaxEmptyBulkDelete: 1000, GPU: to.GPU,
			Rules: scaledown.Rules{SkipNodesWithSystemPods: false}}, e.a.sim,
			scaledown.NewBrake(scaledown.BrakeOptions{ClusterShare: 1, GroupShare: 1, Window: time.Minute}))
		d := p.Plan(e.ctx, l.now, l.snap, in, groups, scaledown.NewPDBs(nil), 0)
		removed = len(d.Drain) + len(d.Empty)
	}
	b.ReportMetric(float64(removed), "nodes-removable")
	if removed == 0 {
		b.Fatal("nothing removable")
	}
}
