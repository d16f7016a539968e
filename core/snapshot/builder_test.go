package snapshot

import (
	"fmt"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

func TestBuilderRebuildsOnlyWhatChanged(t *testing.T) {
	b := NewBuilder(to.GPU)
	n1, n2 := to.Node("n1", "4", "4Gi"), to.Node("n2", "4", "4Gi")
	p1 := to.Pod("p1", to.Requests("1", ""), to.OnNode("n1"))
	p2 := to.Pod("p2", to.Requests("1", ""), to.OnNode("n2"))
	pend := to.Pod("pend", to.Unschedulable())
	done := to.Pod("done", to.OnNode("n1"))
	done.Status.Phase = apiv1.PodSucceeded

	s, unbound, st := b.Build([]*apiv1.Node{n1, n2}, []*apiv1.Pod{p1, p2, pend, done})
	if st.RebuiltNodes != 2 || len(unbound) != 1 || s.Len() != 2 {
		t.Fatalf("first build: %+v, %d unbound, %d nodes", st, len(unbound), s.Len())
	}
	if got := len(s.NodeInfo(0).GetPods()); got != 1 {
		t.Fatalf("n1 has %d pods, want 1 (terminated pods hold nothing)", got)
	}
	first := s.NodeInfo(1)

	_, _, st = b.Build([]*apiv1.Node{n1, n2}, []*apiv1.Pod{p1, p2, pend, done})
	if st.RebuiltNodes != 0 {
		t.Fatalf("unchanged build rebuilt %d nodes", st.RebuiltNodes)
	}

	p1b := p1.DeepCopy()
	p1b.Spec.NodeName = "n2" // moved (a new object, as an informer update)
	s, _, st = b.Build([]*apiv1.Node{n1, n2}, []*apiv1.Pod{p1b, p2})
	if st.RebuiltNodes != 2 {
		t.Fatalf("moved pod rebuilt %d nodes, want 2", st.RebuiltNodes)
	}
	if len(s.NodeInfo(0).GetPods()) != 0 || len(s.NodeInfo(1).GetPods()) != 2 {
		t.Fatalf("after move: n1 %d pods, n2 %d pods", len(s.NodeInfo(0).GetPods()), len(s.NodeInfo(1).GetPods()))
	}
	if len(first.GetPods()) != 1 {
		t.Fatal("an earlier snapshot's NodeInfo changed")
	}

	s, _, _ = b.Build([]*apiv1.Node{n2}, []*apiv1.Pod{p1b, p2})
	if s.Len() != 1 {
		t.Fatalf("deleted node still in snapshot: %d nodes", s.Len())
	}
	// A pod bound to a node not yet in the cache joins it when it appears.
	n3 := to.Node("n3", "4", "4Gi")
	p3 := to.Pod("p3", to.OnNode("n3"))
	s, _, _ = b.Build([]*apiv1.Node{n2}, []*apiv1.Pod{p1b, p2, p3})
	if s.Len() != 1 {
		t.Fatalf("node without object in snapshot")
	}
	s, _, _ = b.Build([]*apiv1.Node{n2, n3}, []*apiv1.Pod{p1b, p2, p3})
	i, ok := s.Index("n3")
	if !ok || len(s.NodeInfo(i).GetPods()) != 1 {
		t.Fatal("n3 did not start with its pod")
	}
}

func TestForkIsCopyOnWrite(t *testing.T) {
	n1 := to.Node("n1", "4", "4Gi")
	s := New([]fwk.NodeInfo{NewNodeInfo(n1)}, to.GPU)
	f := s.Fork()
	p := to.Pod("p", to.Requests("1", ""))
	pi := NewNodeInfo(n1, p).GetPods()[0]
	f.AddPod(0, pi)
	if len(s.NodeInfo(0).GetPods()) != 0 {
		t.Fatal("fork wrote into the snapshot")
	}
	child := f.Fork()
	if _, err := child.AddNode(NewNodeInfo(to.Node("t1", "4", "4Gi"))); err != nil {
		t.Fatal(err)
	}
	if f.Len() != 1 || child.Len() != 2 {
		t.Fatalf("lens parent %d child %d", f.Len(), child.Len())
	}
	if _, err := child.AddNode(NewNodeInfo(to.Node("n1", "4", "4Gi"))); err == nil {
		t.Fatal("duplicate node accepted")
	}
	if got := f.Free(0).MilliCPU; got != 3000 {
		t.Fatalf("free cpu %d, want 3000", got)
	}
	list, _ := child.NodeInfos().List()
	if len(list) != 2 {
		t.Fatalf("lister sees %d nodes", len(list))
	}
	child.RemoveLastNode()
	if _, err := child.NodeInfos().Get("t1"); err == nil {
		t.Fatal("removed node still listed")
	}
}

// TestBuilderManyNodesMatchTheFramework: a first build large enough to run
// on several goroutines, then churn (pods deleted, added, moved, replaced
// by updates; slots reused): every NodeInfo sums what the framework's own
// NodeInfo of the same node and pods sums, and Pods lists the same pods.
func TestBuilderManyNodesMatchTheFramework(t *testing.T) {
	const nodes, perNode = 3 * parallelMin, 6
	var ns []*apiv1.Node
	var ps []*apiv1.Pod
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("n%04d", i)
		ns = append(ns, to.Node(name, "16", "64Gi"))
		for k := 0; k < perNode; k++ {
			ps = append(ps, to.Pod(fmt.Sprintf("p%04d-%d", i, k), to.Requests(fmt.Sprintf("%dm", 100+k), "1Gi"), to.OnNode(name),
				to.ControlledBy("ReplicaSet", fmt.Sprintf("rs%d", k%3), types.UID(fmt.Sprintf("rs%d", k%3)))))
		}
	}
	b := NewBuilder(to.GPU)
	check := func(step string, s *Snapshot, pods []*apiv1.Pod) {
		t.Helper()
		byNode := map[string][]*apiv1.Pod{}
		for _, p := range pods {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
		if s.Len() != nodes {
			t.Fatalf("%s: %d nodes, want %d", step, s.Len(), nodes)
		}
		for i := 0; i < s.Len(); i++ {
			ni := s.NodeInfo(i)
			want := NewNodeInfo(ni.Node(), byNode[ni.Node().Name]...)
			g, w := ni.GetRequested(), want.GetRequested()
			if g.GetMilliCPU() != w.GetMilliCPU() || g.GetMemory() != w.GetMemory() || len(ni.GetPods()) != len(want.GetPods()) ||
				ni.GetNonZeroRequested().GetMilliCPU() != want.GetNonZeroRequested().GetMilliCPU() {
				t.Fatalf("%s: node %s requests %d m / %d B with %d pods, the framework's %d m / %d B with %d pods", step, ni.Node().Name,
					g.GetMilliCPU(), g.GetMemory(), len(ni.GetPods()), w.GetMilliCPU(), w.GetMemory(), len(want.GetPods()))
			}
			listed := map[*apiv1.Pod]bool{}
			for _, p := range s.Pods(i) {
				listed[p] = true
			}
			for _, p := range byNode[ni.Node().Name] {
				if !listed[p] || len(listed) != len(byNode[ni.Node().Name]) {
					t.Fatalf("%s: Pods(%d) lists %d pods, not the node's %d", step, i, len(listed), len(byNode[ni.Node().Name]))
				}
			}
		}
	}
	s, _, st := b.Build(ns, ps)
	if st.RebuiltNodes != nodes || st.Pods != nodes*perNode {
		t.Fatalf("first build: %+v", st)
	}
	check("first build", s, ps)

	// Churn: drop every 7th pod, replace every 5th by an update (a new
	// object) on the next node, add new pods.
	var next []*apiv1.Pod
	for i, p := range ps {
		switch {
		case i%7 == 0:
		case i%5 == 0:
			u := p.DeepCopy()
			u.Spec.NodeName = ns[(i/perNode+1)%nodes].Name
			u.Spec.Containers[0].Resources.Requests[apiv1.ResourceCPU] = resource.MustParse("900m")
			next = append(next, u)
		default:
			next = append(next, p)
		}
	}
	for i := 0; i < nodes; i += 3 {
		next = append(next, to.Pod(fmt.Sprintf("new-%d", i), to.Requests("2", "2Gi"), to.OnNode(ns[i].Name)))
	}
	s, _, _ = b.Build(ns, next)
	check("after churn", s, next)
	if got, want := len(b.index), len(next); got != want {
		t.Fatalf("%d pods indexed, want %d (the gone ones forgotten)", got, want)
	}
	// Pods that went away free their slots at the end of a build; new pods
	// of the next build take them.
	slots := len(b.pods)
	for i := 0; i < nodes; i += 2 {
		next = append(next, to.Pod(fmt.Sprintf("newer-%d", i), to.Requests("1", "1Gi"), to.OnNode(ns[i].Name)))
	}
	s, _, _ = b.Build(ns, next)
	check("after more pods", s, next)
	if len(b.pods) != slots {
		t.Fatalf("%d slots after adding %d pods, want the %d there were: the freed ones are not reused", len(b.pods), nodes/2, slots)
	}
}

// TestBuilderKeepsUnchangedPodInfos: a node rebuilt for one new pod keeps
// the PodInfo (and the framework's sums in it) of the pods it already had.
func TestBuilderKeepsUnchangedPodInfos(t *testing.T) {
	b := NewBuilder(to.GPU)
	n := to.Node("n1", "8", "8Gi")
	p1, p2 := to.Pod("p1", to.OnNode("n1")), to.Pod("p2", to.OnNode("n1"))
	s, _, _ := b.Build([]*apiv1.Node{n}, []*apiv1.Pod{p1})
	before := s.NodeInfo(0).GetPods()[0]
	s, _, st := b.Build([]*apiv1.Node{n}, []*apiv1.Pod{p1, p2})
	if st.RebuiltNodes != 1 || len(s.NodeInfo(0).GetPods()) != 2 {
		t.Fatalf("%+v, %d pods", st, len(s.NodeInfo(0).GetPods()))
	}
	kept := false
	for _, pi := range s.NodeInfo(0).GetPods() {
		kept = kept || pi == before
	}
	if !kept {
		t.Fatal("p1's PodInfo was built again")
	}
}
