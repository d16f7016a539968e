package snapshot

import (
	"testing"

	apiv1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testobjects"
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
