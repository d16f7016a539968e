package snapshot

import (
	"testing"

	apiv1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

func TestRemovePodsIsCopyOnWrite(t *testing.T) {
	node := to.Node("n1", "16", "64Gi")
	keep := to.Pod("web", to.Requests("2", "4Gi"), to.OnNode("n1"))
	balloon := to.Pod("balloon", to.Requests("12", "50Gi"), to.OnNode("n1"), to.Labels("vmss-autoscaler.io/balloon", "cpu"))
	s := New([]fwk.NodeInfo{NewNodeInfo(node, keep, balloon)}, "")
	f := s.Fork()
	before := f.Free(0).MilliCPU
	n := f.RemovePods(0, func(p *apiv1.Pod) bool { return p.Labels["vmss-autoscaler.io/balloon"] != "" })
	if n != 1 || len(f.NodeInfo(0).GetPods()) != 1 || f.Free(0).MilliCPU != before+12000 {
		t.Fatalf("removed %d, pods %d, free %d (was %d)", n, len(f.NodeInfo(0).GetPods()), f.Free(0).MilliCPU, before)
	}
	if len(s.NodeInfo(0).GetPods()) != 2 {
		t.Fatal("the snapshot under the fork changed")
	}
	if f.RemovePods(0, func(*apiv1.Pod) bool { return false }) != 0 {
		t.Fatal("removed pods matching nothing")
	}
}

func TestFreezeKeepsWhatTheForkPlaced(t *testing.T) {
	nodes := []*apiv1.Node{to.Node("n1", "16", "64Gi"), to.Node("n2", "16", "64Gi")}
	web := to.Pod("web", to.Requests("2", "4Gi"), to.OnNode("n2"))
	s, _, _ := NewBuilder("").Build(nodes, []*apiv1.Pod{web})
	f := s.Fork()
	booked := to.Pod("booked", to.Requests("10", "8Gi"))
	pi, err := PodInfoLike(booked, nil)
	if err != nil {
		t.Fatal(err)
	}
	i, _ := s.Index("n1")
	f.AddPod(i, pi)
	frozen, err := f.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	if got := frozen.Pods(i); len(got) != 1 || got[0].Name != "booked" {
		t.Fatalf("frozen pods of n1 %v, want the booked pod", got)
	}
	if got := frozen.free[i].MilliCPU; got != 6000 {
		t.Fatalf("frozen free CPU of n1 %d, want 6000", got)
	}
	if len(s.Pods(i)) != 0 || s.free[i].MilliCPU != 16000 {
		t.Fatal("the snapshot under the fork changed")
	}
	j, _ := s.Index("n2")
	if &frozen.Pods(j)[0] != &s.Pods(j)[0] {
		t.Fatal("an unchanged node's pods were copied, not shared")
	}
	// A fork of the frozen snapshot sees the booked pod.
	if got := frozen.Fork().Free(i).MilliCPU; got != 6000 {
		t.Fatalf("fork of the frozen snapshot: free CPU %d, want 6000", got)
	}
	g := s.Fork()
	if _, err := g.AddNode(NewNodeInfo(to.Node("template", "16", "64Gi"))); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Freeze(); err == nil {
		t.Fatal("a fork with a template node was frozen")
	}
}
