package scaleup

import (
	"testing"

	apiv1 "k8s.io/api/core/v1"
	schedframework "k8s.io/kubernetes/pkg/scheduler/framework"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// TestTemplateNodeCopies: the estimator's copies of a template are named
// and labelled per index, independent of each other and of the template,
// built once per template, and rebuilt when the template changes.
func TestTemplateNodeCopies(t *testing.T) {
	e := &Estimator{}
	tmpl := tmplInfo(to.Node("template-cpu", "16", "64Gi"))
	a, b := e.templateNode(tmpl, "cpu", 0), e.templateNode(tmpl, "cpu", 1)
	again := e.templateNode(tmpl, "cpu", 0)
	tests := []struct {
		name string
		ok   bool
	}{
		{"names per index", a.Node().Name == "template-cpu-0" && b.Node().Name == "template-cpu-1"},
		{"hostnames per index", a.Node().Labels[apiv1.LabelHostname] == "template-cpu-0" && b.Node().Labels[apiv1.LabelHostname] == "template-cpu-1"},
		{"the template keeps its name", tmpl.Node().Name == "template-cpu" && tmpl.Node().Labels[apiv1.LabelHostname] != "template-cpu-0"},
		{"node built once", again.Node() == a.Node()},
		{"each call a new NodeInfo", again != a},
		{"allocatable of the template", a.GetAllocatable().GetMilliCPU() == tmpl.GetAllocatable().GetMilliCPU()},
	}
	for _, tt := range tests {
		if !tt.ok {
			t.Errorf("%s: no", tt.name)
		}
	}
	pi, err := schedframework.NewPodInfo(to.Pod("p", to.Requests("4", "1Gi")))
	if err != nil {
		t.Fatal(err)
	}
	a.AddPodInfo(pi)
	if len(again.GetPods()) != 0 || len(e.templateNode(tmpl, "cpu", 0).GetPods()) != 0 || len(tmpl.GetPods()) != 0 {
		t.Fatal("a pod placed on one copy shows on another")
	}
	other := tmplInfo(to.Node("template-cpu", "32", "64Gi"))
	if c := e.templateNode(other, "cpu", 0); c.Node() == a.Node() || c.GetAllocatable().GetMilliCPU() != 32000 {
		t.Fatal("a changed template still gives the old copies")
	}
}
