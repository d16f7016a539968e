package snapshot

import (
	"testing"

	apiv1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testobjects"
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
