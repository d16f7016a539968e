package simulator

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	schedframework "k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

func newSim(t testing.TB) *Simulator {
	t.Helper()
	ctx := context.Background()
	factory := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	s, err := New(ctx, factory, to.GPU)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func snap(nodes []*apiv1.Node, pods ...*apiv1.Pod) *snapshot.Snapshot {
	infos := make([]fwk.NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		var on []*apiv1.Pod
		for _, p := range pods {
			if p.Spec.NodeName == n.Name {
				on = append(on, p)
			}
		}
		infos = append(infos, snapshot.NewNodeInfo(n, on...))
	}
	return snapshot.New(infos, to.GPU)
}

func pods(n int, prefix string, opts ...to.PodOption) []*apiv1.Pod {
	out := make([]*apiv1.Pod, n)
	for i := range out {
		o := append([]to.PodOption{to.ControlledBy("ReplicaSet", prefix, types.UID("rs-"+prefix)), to.Labels("app", prefix)}, opts...)
		out[i] = to.Pod(prefix+"-"+string(rune('a'+i)), o...)
	}
	return out
}

func TestFitOnNodes(t *testing.T) {
	sim := newSim(t)
	tests := []struct {
		name    string
		nodes   []*apiv1.Node
		bound   []*apiv1.Pod
		pending []*apiv1.Pod
		want    int
		wantWhy string // reason from CheckPod on node 0 when want == 0
	}{
		{name: "fits by resources", nodes: []*apiv1.Node{to.Node("n1", "4", "8Gi")},
			pending: pods(3, "web", to.Requests("1", "1Gi")), want: 3},
		{name: "partially fits", nodes: []*apiv1.Node{to.Node("n1", "4", "8Gi")},
			bound:   []*apiv1.Pod{to.Pod("old", to.Requests("3", "1Gi"), to.OnNode("n1"))},
			pending: pods(3, "web", to.Requests("1", "1Gi")), want: 1},
		{name: "gpu pod on cpu node", nodes: []*apiv1.Node{to.Node("n1", "64", "256Gi")},
			pending: pods(1, "train", to.Requests("1", "1Gi"), to.GPUs(8)), want: 0, wantWhy: "Insufficient nvidia.com/gpu"},
		{name: "gpu pods fill gpu nodes", nodes: []*apiv1.Node{to.Node("g1", "96", "900Gi", to.NodeGPUs(8)), to.Node("g2", "96", "900Gi", to.NodeGPUs(8))},
			pending: pods(3, "train", to.Requests("90", "800Gi"), to.GPUs(8)), want: 2},
		{name: "untolerated taint", nodes: []*apiv1.Node{to.Node("n1", "4", "8Gi", to.Taint("openai.com/team", "a"))},
			pending: pods(1, "web", to.Requests("1", "1Gi")), want: 0, wantWhy: "untolerated taint"},
		{name: "tolerated taint", nodes: []*apiv1.Node{to.Node("n1", "4", "8Gi", to.Taint("openai.com/team", "a"))},
			pending: pods(2, "web", to.Requests("1", "1Gi"), to.Tolerate("openai.com/team", "a")), want: 2},
		{name: "node selector", nodes: []*apiv1.Node{to.Node("n1", "4", "8Gi")},
			pending: pods(1, "web", to.NodeSelector("pool", "gpu")), want: 0, wantWhy: "affinity/selector"},
		{name: "host port conflict", nodes: []*apiv1.Node{to.Node("n1", "4", "8Gi"), to.Node("n2", "4", "8Gi")},
			pending: pods(3, "web", to.HostPort(8080)), want: 2},
		{name: "anti-affinity one per node", nodes: []*apiv1.Node{to.Node("n1", "8", "8Gi"), to.Node("n2", "8", "8Gi")},
			pending: pods(3, "mpi", to.Requests("1", "1Gi"), to.AntiAffinity("app", "mpi")), want: 2},
		{name: "topology spread", nodes: []*apiv1.Node{to.Node("n1", "8", "8Gi"), to.Node("n2", "8", "8Gi", to.MaxPods(2))},
			pending: pods(6, "spread", to.Requests("100m", "1Mi"), to.SpreadByHostname(1, "app", "spread")), want: 5},
		{name: "too many pods", nodes: []*apiv1.Node{to.Node("n1", "8", "8Gi", to.MaxPods(2))},
			pending: pods(3, "web"), want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := snap(tc.nodes, tc.bound...)
			fork := s.Fork()
			groups := GroupPods(tc.pending, to.GPU)
			if len(groups) != 1 {
				t.Fatalf("got %d equivalence groups, want 1", len(groups))
			}
			cands := make([]int, fork.Len())
			for i := range cands {
				cands[i] = i
			}
			got := sim.FitOnNodes(ctx, fork, groups[0], 0, cands, nil)
			if got != tc.want {
				t.Fatalf("placed %d pods, want %d", got, tc.want)
			}
			if tc.wantWhy != "" {
				st := sim.CheckPod(ctx, s.Fork(), tc.pending[0], 0)
				if st == nil || !strings.Contains(strings.Join(st.Reasons(), ";"), tc.wantWhy) {
					t.Fatalf("CheckPod reasons = %v, want one containing %q", st, tc.wantWhy)
				}
			}
			// The base snapshot must not see the fork's pods.
			if n := len(s.NodeInfo(0).GetPods()); n != countOn(tc.bound, tc.nodes[0].Name) {
				t.Fatalf("base snapshot changed: node 0 has %d pods", n)
			}
		})
	}
}

func countOn(pods []*apiv1.Pod, node string) int {
	c := 0
	for _, p := range pods {
		if p.Spec.NodeName == node {
			c++
		}
	}
	return c
}

func TestPreCheckNeverStricterThanFramework(t *testing.T) {
	sim := newSim(t)
	ctx := context.Background()
	// Pods with init containers, overhead and zero requests: the pre-check must
	// agree with NodeResourcesFit on each.
	initPod := to.Pod("init", to.Requests("1", "1Gi"))
	initPod.Spec.InitContainers = []apiv1.Container{{Name: "i", Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{}}}}
	to.Requests("3", "")(initPod) // the app container now asks 3 CPUs
	overhead := to.Pod("ovh", to.Requests("1", "1Gi"))
	overhead.Spec.Overhead = apiv1.ResourceList{apiv1.ResourceCPU: mustQ("2")}
	cases := []*apiv1.Pod{initPod, overhead, to.Pod("zero"), to.Pod("big", to.Requests("5", "1Gi")), to.Pod("g", to.GPUs(1))}
	nodes := []*apiv1.Node{to.Node("n1", "3", "4Gi"), to.Node("n2", "4", "4Gi", to.NodeGPUs(1))}
	s := snap(nodes)
	for _, p := range cases {
		for i := range nodes {
			req := RequestOf(p, to.GPU)
			pre := req.Fits(s.Fork().Free(i))
			full := sim.CheckPod(ctx, s.Fork(), p, i) == nil
			if full && !pre {
				t.Errorf("pod %s on %s: pre-check rejects a node the framework accepts", p.Name, nodes[i].Name)
			}
			if pre != full {
				t.Logf("pod %s on %s: pre-check %v, framework %v", p.Name, nodes[i].Name, pre, full)
			}
		}
	}
}

func TestGroupPods(t *testing.T) {
	rs := to.ControlledBy("ReplicaSet", "a", "rs-a")
	tests := []struct {
		name  string
		pods  []*apiv1.Pod
		sizes []int
	}{
		{name: "same controller and spec", pods: []*apiv1.Pod{to.Pod("a", rs, to.Requests("1", "")), to.Pod("b", rs, to.Requests("1", ""))}, sizes: []int{2}},
		{name: "same controller, different requests", pods: []*apiv1.Pod{to.Pod("a", rs, to.Requests("1", "")), to.Pod("b", rs, to.Requests("2", ""))}, sizes: []int{1, 1}},
		{name: "no controller", pods: []*apiv1.Pod{to.Pod("a", to.Requests("1", "")), to.Pod("b", to.Requests("1", ""))}, sizes: []int{1, 1}},
		{name: "different namespace", pods: []*apiv1.Pod{to.Pod("a", rs), to.Pod("b", rs, to.Namespace("x"))}, sizes: []int{1, 1}},
		{name: "statefulset pod-name label ignored", pods: []*apiv1.Pod{
			to.Pod("a", rs, to.Labels("statefulset.kubernetes.io/pod-name", "a")),
			to.Pod("b", rs, to.Labels("statefulset.kubernetes.io/pod-name", "b"))}, sizes: []int{2}},
		{name: "different tolerations", pods: []*apiv1.Pod{to.Pod("a", rs, to.Tolerate("k", "v")), to.Pod("b", rs)}, sizes: []int{1, 1}},
		{name: "largest request first", pods: []*apiv1.Pod{to.Pod("small", to.Requests("1", "")), to.Pod("gpu", to.GPUs(8)), to.Pod("mid", to.Requests("4", ""))}, sizes: []int{1, 1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			groups := GroupPods(tc.pods, to.GPU)
			var sizes []int
			for _, g := range groups {
				sizes = append(sizes, len(g.Pods))
			}
			if len(sizes) != len(tc.sizes) {
				t.Fatalf("group sizes %v, want %v", sizes, tc.sizes)
			}
			for i := range sizes {
				if sizes[i] != tc.sizes[i] {
					t.Fatalf("group sizes %v, want %v", sizes, tc.sizes)
				}
			}
		})
	}
	groups := GroupPods([]*apiv1.Pod{to.Pod("small", to.Requests("1", "")), to.Pod("gpu", to.GPUs(8)), to.Pod("mid", to.Requests("4", ""))}, to.GPU)
	if got := []string{groups[0].Rep().Name, groups[1].Rep().Name, groups[2].Rep().Name}; got[0] != "gpu" || got[1] != "mid" || got[2] != "small" {
		t.Fatalf("order %v, want [gpu mid small]", got)
	}
}

func mustQ(s string) resource.Quantity { return resource.MustParse(s) }

// TestGroupPodInfosShareTheFrameworksSums: the pods of an equivalence group
// after the first share its resource sums, which are the framework's own.
func TestGroupPodInfosShareTheFrameworksSums(t *testing.T) {
	var pods []*apiv1.Pod
	for i := 0; i < 20; i++ {
		pods = append(pods, to.Pod(fmt.Sprintf("t-%d", i), to.Requests("40", "400Gi"), to.GPUs(4), to.ControlledBy("Job", "t", "t")))
	}
	groups := GroupPods(pods, to.GPU)
	if len(groups) != 1 {
		t.Fatalf("%d groups, want 1", len(groups))
	}
	for i := range groups[0].Pods {
		pi := groups[0].PodInfo(i)
		direct, _ := schedframework.NewPodInfo(groups[0].Pods[i])
		got, want := pi.CalculateResource(), direct.CalculateResource()
		if got.Resource.GetMilliCPU() != want.Resource.GetMilliCPU() || got.Resource.GetMemory() != want.Resource.GetMemory() ||
			got.Resource.GetScalarResources()[to.GPU] != want.Resource.GetScalarResources()[to.GPU] || got.Non0CPU != want.Non0CPU || got.Non0Mem != want.Non0Mem {
			t.Fatalf("pod %d: %+v, the framework's %+v", i, got.Resource, want.Resource)
		}
		if shared := fmt.Sprintf("%T", pi) != fmt.Sprintf("%T", direct); shared != (i > 0) {
			t.Fatalf("pod %d: PodInfo %T, shared %v", i, pi, shared)
		}
	}
}
