package snapshot

import (
	"fmt"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	fwk "k8s.io/kube-scheduler/framework"
	schedframework "k8s.io/kubernetes/pkg/scheduler/framework"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// frameworkResources is the framework's own answer for a pod.
func frameworkResources(p *apiv1.Pod) fwk.PodResource {
	pi, _ := schedframework.NewPodInfo(p)
	return pi.CalculateResource()
}

func sameResources(a, b fwk.PodResource) bool {
	ra, rb := a.Resource, b.Resource
	if ra.GetMilliCPU() != rb.GetMilliCPU() || ra.GetMemory() != rb.GetMemory() || ra.GetEphemeralStorage() != rb.GetEphemeralStorage() ||
		a.Non0CPU != b.Non0CPU || a.Non0Mem != b.Non0Mem || len(ra.GetScalarResources()) != len(rb.GetScalarResources()) {
		return false
	}
	for k, v := range ra.GetScalarResources() {
		if rb.GetScalarResources()[k] != v {
			return false
		}
	}
	return true
}

// replica is a pod of the ReplicaSet "web" with two containers, a sidecar
// and an init container, running with its resources actuated.
func replica(name string) *apiv1.Pod {
	p := to.Pod(name, to.Requests("1", "1Gi"), to.GPUs(1), to.OnNode("n1"), to.ControlledBy("ReplicaSet", "web", "web-uid"))
	p.Spec.Containers = append(p.Spec.Containers, apiv1.Container{Name: "log", Resources: apiv1.ResourceRequirements{
		Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("100m")}}})
	always := apiv1.ContainerRestartPolicyAlways
	p.Spec.InitContainers = []apiv1.Container{
		{Name: "proxy", RestartPolicy: &always, Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("200m")}}},
		{Name: "setup", Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceMemory: resource.MustParse("3Gi")}}},
	}
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, apiv1.ContainerStatus{Name: c.Name,
			Resources: &apiv1.ResourceRequirements{Requests: c.Resources.Requests.DeepCopy()}, AllocatedResources: c.Resources.Requests.DeepCopy()})
	}
	p.Status.InitContainerStatuses = []apiv1.ContainerStatus{{Name: "proxy",
		Resources: &apiv1.ResourceRequirements{Requests: p.Spec.InitContainers[0].Resources.Requests.DeepCopy()}}}
	return p
}

// resizedUp: the log container was resized up to 150m, allocated but not
// yet actuated: the framework counts the larger value, from the status.
func resizedUp(p *apiv1.Pod) {
	p.Status.ContainerStatuses[1].AllocatedResources[apiv1.ResourceCPU] = resource.MustParse("150m")
}

// TestSharedResourcesOnlyForEqualFields: a pod shares the resources the
// framework computed for another pod of its controller only when every
// field the framework reads is equal; each case changes one of them, and
// the snapshot's sums must still be the framework's.
func TestSharedResourcesOnlyForEqualFields(t *testing.T) {
	more := func(q string) apiv1.ResourceList { return apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse(q)} }
	cases := []struct {
		name string
		// both changes both pods, change only the second.
		both, change func(p *apiv1.Pod)
		// differs: the framework's answer differs from the first replica's
		// with the feature gates of this build (false where a gate is off
		// or the field only matters together with another).
		differs bool
	}{
		{"another replica", nil, func(p *apiv1.Pod) { p.Labels = map[string]string{"pod-template-hash": "x"} }, false},
		{"requests written another way", nil, func(p *apiv1.Pod) {
			p.Spec.Containers[1].Resources.Requests = more("0.1")
		}, false},
		{"a container's requests", nil, func(p *apiv1.Pod) {
			p.Spec.Containers[0].Resources.Requests[apiv1.ResourceCPU] = resource.MustParse("2")
		}, true},
		{"a container's name", resizedUp, func(p *apiv1.Pod) { p.Spec.Containers[1].Name = "log2" }, true},
		{"one more container", nil, func(p *apiv1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, apiv1.Container{Name: "x", Resources: apiv1.ResourceRequirements{Requests: more("1")}})
		}, true},
		{"an init container's requests", nil, func(p *apiv1.Pod) {
			p.Spec.InitContainers[1].Resources.Requests = apiv1.ResourceList{apiv1.ResourceMemory: resource.MustParse("9Gi")}
		}, true},
		{"an init container's restart policy", nil, func(p *apiv1.Pod) { p.Spec.InitContainers[0].RestartPolicy = nil }, true},
		{"pod-level resources", nil, func(p *apiv1.Pod) {
			p.Spec.Resources = &apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("8")}}
		}, true},
		{"overhead", nil, func(p *apiv1.Pod) { p.Spec.Overhead = more("250m") }, true},
		{"a container's actuated resources", nil, func(p *apiv1.Pod) {
			p.Status.ContainerStatuses[0].Resources.Requests[apiv1.ResourceCPU] = resource.MustParse("3")
		}, true},
		{"a container's allocated resources", nil, func(p *apiv1.Pod) {
			p.Status.ContainerStatuses[0].AllocatedResources[apiv1.ResourceCPU] = resource.MustParse("4")
		}, true},
		{"a sidecar's actuated resources", nil, func(p *apiv1.Pod) {
			p.Status.InitContainerStatuses[0].Resources.Requests = more("2")
		}, true},
		{"no container status yet", resizedUp, func(p *apiv1.Pod) { p.Status.ContainerStatuses = nil }, true},
		{"an infeasible resize", func(p *apiv1.Pod) {
			p.Spec.Containers[0].Resources.Requests[apiv1.ResourceCPU] = resource.MustParse("6")
		}, func(p *apiv1.Pod) {
			p.Status.Conditions = []apiv1.PodCondition{{Type: apiv1.PodResizePending, Reason: apiv1.PodReasonInfeasible}}
		}, true},
		{"a resize pending condition alone", nil, func(p *apiv1.Pod) {
			p.Status.Conditions = []apiv1.PodCondition{{Type: apiv1.PodResizePending, Reason: apiv1.PodReasonDeferred}}
		}, false},
		{"the pod's actuated resources", nil, func(p *apiv1.Pod) {
			p.Status.Resources = &apiv1.ResourceRequirements{Requests: more("5")}
		}, false},
		{"node allocatable claims", nil, func(p *apiv1.Pod) {
			p.Status.NodeAllocatableResourceClaimStatuses = []apiv1.NodeAllocatableResourceClaimStatus{{ResourceClaimName: "c", Resources: more("1")}}
		}, false},
		{"no controller", nil, func(p *apiv1.Pod) { p.OwnerReferences = nil }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			first, other := replica("web-1"), replica("web-2")
			other.UID = "web-2"
			if tc.both != nil {
				tc.both(first)
				tc.both(other)
			}
			tc.change(other)
			want := []fwk.PodResource{frameworkResources(first), frameworkResources(other)}
			if differs := !sameResources(want[0], want[1]); differs != tc.differs {
				t.Fatalf("the framework's answers differ: %v, the case says %v (%+v / %+v)", differs, tc.differs, want[0].Resource, want[1].Resource)
			}
			shared := sharedResources{}
			infos := []fwk.PodInfo{shared.podInfo(first), shared.podInfo(other)}
			for i, pi := range infos {
				if got := pi.CalculateResource(); !sameResources(got, want[i]) {
					t.Errorf("pod %d: resources %+v (non-zero %d/%d), the framework's %+v (%d/%d)", i,
						got.Resource, got.Non0CPU, got.Non0Mem, want[i].Resource, want[i].Non0CPU, want[i].Non0Mem)
				}
			}
			_, pooled := infos[1].(*pooledPodInfo)
			equal := resourceFieldsEqual(first, other) && other.OwnerReferences != nil
			if pooled != equal {
				t.Errorf("shared: %v, fields equal: %v", pooled, equal)
			}
			if tc.differs && pooled {
				t.Error("a pod the framework sums differently shares the first pod's resources")
			}
		})
	}
}

// TestSharedResourcesAcrossManyReplicas: the common case is shared.
func TestSharedResourcesAcrossManyReplicas(t *testing.T) {
	shared := sharedResources{}
	pooled := 0
	for i := 0; i < 100; i++ {
		p := replica(fmt.Sprintf("web-%d", i))
		if _, ok := shared.podInfo(p).(*pooledPodInfo); ok {
			pooled++
		}
	}
	if pooled != 99 {
		t.Fatalf("%d of 100 equal replicas shared the first one's resources, want 99", pooled)
	}
}
