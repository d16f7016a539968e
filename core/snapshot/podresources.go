package snapshot

import (
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	schedframework "k8s.io/kubernetes/pkg/scheduler/framework"
)

// The framework's PodInfo.CalculateResource sums a pod's requests through
// component-helpers' PodRequests, twice (with and without the scheduler's
// defaults for missing requests), allocating a few kilobytes of resource
// lists per pod: for the 200,000 pods of a first loop after a failover,
// about 1 s of CPU and 600 MB of garbage on two cores. Pods of one
// controller almost always have equal resource fields, and then the
// framework's answer for one is its answer for all: sharedResources keeps
// one answer per controller and shares it with every pod whose resource
// fields are equal to that pod's (resourceFieldsEqual lists every field
// PodRequests reads). A pod that differs (a VPA-adjusted pod, a resize in
// progress) gets its own answer from the framework, as does a pod without a
// controller.

// pooledPodInfo is the framework's PodInfo with its resources computed
// already.
type pooledPodInfo struct {
	*schedframework.PodInfo
	res fwk.PodResource
}

// CalculateResource returns the resources computed for an equal pod.
func (p *pooledPodInfo) CalculateResource() fwk.PodResource { return p.res }

// PodInfoLike returns the framework's PodInfo of pod. When like is set
// and its pod's resource fields are all equal to pod's, the PodInfo shares
// the resources the framework computed for like instead of computing them
// again. The error is NewPodInfo's (an affinity term it cannot parse); the
// PodInfo is usable without those terms.
func PodInfoLike(pod *apiv1.Pod, like fwk.PodInfo) (fwk.PodInfo, error) {
	pi, err := schedframework.NewPodInfo(pod)
	if like != nil && resourceFieldsEqual(like.GetPod(), pod) {
		return &pooledPodInfo{PodInfo: pi, res: like.CalculateResource()}, err
	}
	return pi, err
}

// sharedResources is one build's first PodInfo by controller. Not safe for
// concurrent use: each building goroutine has its own.
type sharedResources map[types.UID]fwk.PodInfo

// podInfo returns the PodInfo of pod with its resources, computed by the
// framework or shared with an equal pod of its controller.
func (s sharedResources) podInfo(pod *apiv1.Pod) fwk.PodInfo {
	owner := controllerUID(pod)
	first := s[owner]
	// As NodeInfo.AddPod: an affinity term the API server let through but
	// the framework cannot parse is no reason to drop the pod.
	pi, _ := PodInfoLike(pod, first)
	if owner != "" && first == nil {
		s[owner] = pi
	}
	return pi
}

func controllerUID(pod *apiv1.Pod) types.UID {
	if ref := metav1.GetControllerOfNoCopy(pod); ref != nil {
		return ref.UID
	}
	return ""
}

// resourceFieldsEqual reports whether two pods have equal values in every
// field component-helpers' PodRequests (as the framework calls it) reads:
// the containers' and init containers' names and requests, the init
// containers' restart policies, the pod-level resources and overhead, and
// the status of resizes (the containers' and the pod's actuated and
// allocated resources, the PodResizePending condition) and of node
// allocatable resource claims. Lists must be in the same order.
func resourceFieldsEqual(a, b *apiv1.Pod) bool {
	return specResourcesEqual(&a.Spec, &b.Spec) && statusResourcesEqual(a, b)
}

// specResourcesEqual compares what PodRequests reads of the specs: the
// containers, the init containers, the pod-level resources and overhead.
func specResourcesEqual(as, bs *apiv1.PodSpec) bool {
	return containersEqual(as.Containers, bs.Containers) && initContainersEqual(as.InitContainers, bs.InitContainers) &&
		requirementsEqual(as.Resources, bs.Resources) && listsEqual(as.Overhead, bs.Overhead)
}

// statusResourcesEqual compares what PodRequests reads of the statuses:
// the resizes' actuated and allocated resources and pending condition,
// and the node allocatable resource claims.
func statusResourcesEqual(a, b *apiv1.Pod) bool {
	st, sb := &a.Status, &b.Status
	return statusesEqual(st.ContainerStatuses, sb.ContainerStatuses) && statusesEqual(st.InitContainerStatuses, sb.InitContainerStatuses) &&
		requirementsEqual(st.Resources, sb.Resources) && listsEqual(st.AllocatedResources, sb.AllocatedResources) &&
		resizePending(a) == resizePending(b) &&
		claimStatusesEqual(st.NodeAllocatableResourceClaimStatuses, sb.NodeAllocatableResourceClaimStatuses)
}

// containersEqual compares containers' names and requests.
func containersEqual(a, b []apiv1.Container) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		ca, cb := &a[i], &b[i]
		if ca.Name != cb.Name || !listsEqual(ca.Resources.Requests, cb.Resources.Requests) {
			return false
		}
	}
	return true
}

// initContainersEqual compares init containers' names, requests and
// restart policies.
func initContainersEqual(a, b []apiv1.Container) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		ca, cb := &a[i], &b[i]
		if ca.Name != cb.Name || !listsEqual(ca.Resources.Requests, cb.Resources.Requests) || !restartPoliciesEqual(ca.RestartPolicy, cb.RestartPolicy) {
			return false
		}
	}
	return true
}

// claimStatusesEqual compares node allocatable resource claims'
// resources.
func claimStatusesEqual(a, b []apiv1.NodeAllocatableResourceClaimStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !listsEqual(a[i].Resources, b[i].Resources) {
			return false
		}
	}
	return true
}

func listsEqual(a, b apiv1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb, ok := b[k]
		if !ok || va.Cmp(vb) != 0 {
			return false
		}
	}
	return true
}

func requirementsEqual(a, b *apiv1.ResourceRequirements) bool {
	if a == nil || b == nil {
		return a == b
	}
	return listsEqual(a.Requests, b.Requests) && listsEqual(a.Limits, b.Limits)
}

func restartPoliciesEqual(a, b *apiv1.ContainerRestartPolicy) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func statusesEqual(a, b []apiv1.ContainerStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !requirementsEqual(a[i].Resources, b[i].Resources) || !listsEqual(a[i].AllocatedResources, b[i].AllocatedResources) {
			return false
		}
	}
	return true
}

// resizePending is the reason of the PodResizePending condition, or "".
func resizePending(p *apiv1.Pod) string {
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == apiv1.PodResizePending {
			return "pending:" + c.Reason
		}
	}
	return ""
}
