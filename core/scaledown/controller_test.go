package scaledown

import (
	"reflect"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// TestControllerOfMatchesGetControllerOf: the copy-free lookup finds the
// reference metav1.GetControllerOf finds, in the pod itself.
func TestControllerOfMatchesGetControllerOf(t *testing.T) {
	yes, no := true, false
	ref := func(kind, name string, controller *bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID(name), Controller: controller}
	}
	tests := []struct {
		name   string
		refs   []metav1.OwnerReference
		daemon bool
	}{
		{"none", nil, false},
		{"DaemonSet controller", []metav1.OwnerReference{ref("DaemonSet", "ds", &yes)}, true},
		{"ReplicaSet controller", []metav1.OwnerReference{ref("ReplicaSet", "rs", &yes)}, false},
		{"owner that is not the controller", []metav1.OwnerReference{ref("DaemonSet", "ds", &no)}, false},
		{"controller flag unset", []metav1.OwnerReference{ref("DaemonSet", "ds", nil)}, false},
		{"controller second", []metav1.OwnerReference{ref("ConfigMap", "cm", nil), ref("DaemonSet", "ds", &yes)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &apiv1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", OwnerReferences: tt.refs}}
			got, want := controllerOf(p), metav1.GetControllerOf(p)
			if (got == nil) != (want == nil) || (got != nil && !reflect.DeepEqual(*got, *want)) {
				t.Fatalf("controllerOf = %v, GetControllerOf = %v", got, want)
			}
			if got != nil && got != &p.OwnerReferences[len(p.OwnerReferences)-1] && got != &p.OwnerReferences[0] {
				t.Fatal("controllerOf returned a copy")
			}
			if IsDaemonSetPod(p) != tt.daemon {
				t.Fatalf("IsDaemonSetPod = %v, want %v", !tt.daemon, tt.daemon)
			}
		})
	}
}

// TestPlannerRemembersRequestsPerPass: the planner's utilisation equals
// UtilizationOf, computes a pod's requests once, and forgets pods a pass
// did not see.
func TestPlannerRemembersRequestsPerPass(t *testing.T) {
	n := to.Node("n", "10", "10Gi")
	ds := to.Pod("ds", to.ControlledBy("DaemonSet", "x", "ds"), to.Requests("5", "5Gi"))
	ds2 := to.Pod("ds2", to.ControlledBy("DaemonSet", "x", "ds"), to.Requests("1", "1Gi"))
	web := to.Pod("a", rs, to.Requests("2", "1Gi"))
	p := NewPlanner(Options{GPU: to.GPU}, nil, nil)
	pass := func(pods ...*apiv1.Pod) Utilization {
		p.pass++
		defer p.forget()
		agg := snapshot.NewNodeInfo(n, pods...).GetRequested()
		total := &Requested{MilliCPU: agg.GetMilliCPU(), Memory: agg.GetMemory()}
		got := utilizationOf(n, pods, to.GPU, Rules{}, total, p.podRequests)
		if want := UtilizationOf(n, pods, to.GPU, Rules{}, total); got != want {
			t.Fatalf("planner utilization %+v, UtilizationOf %+v", got, want)
		}
		return got
	}
	if u := pass(web, ds); u.CPU != 0.2 {
		t.Fatalf("cpu %v, want 0.2 (the DaemonSet pod taken off)", u.CPU)
	}
	if _, ok := p.requests[ds]; !ok || len(p.requests) != 1 {
		t.Fatalf("remembered %d pods, want the DaemonSet pod only", len(p.requests))
	}
	pass(web, ds2)
	if _, ok := p.requests[ds]; ok || len(p.requests) != 1 {
		t.Fatalf("the DaemonSet pod of the last pass is still remembered (%d pods)", len(p.requests))
	}
}
