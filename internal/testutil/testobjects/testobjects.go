// Package testobjects builds Kubernetes objects for tests with functional
// options: testobjects.Pod("p1", testobjects.Requests("2", "4Gi")).
package testobjects

import (
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// GPU is the GPU resource name the tests use.
const GPU apiv1.ResourceName = "nvidia.com/gpu"

// PodOption changes a pod under construction.
type PodOption func(*apiv1.Pod)

// Pod returns a pod in namespace "default" with one container and no requests.
func Pod(name string, opts ...PodOption) *apiv1.Pod {
	p := &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(time.Unix(0, 0))},
		Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{}}}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Requests sets the container's CPU and memory requests ("" leaves one unset).
func Requests(cpu, mem string) PodOption {
	return func(p *apiv1.Pod) {
		if cpu != "" {
			p.Spec.Containers[0].Resources.Requests[apiv1.ResourceCPU] = resource.MustParse(cpu)
		}
		if mem != "" {
			p.Spec.Containers[0].Resources.Requests[apiv1.ResourceMemory] = resource.MustParse(mem)
		}
	}
}

// GPUs sets the container's GPU request and limit.
func GPUs(n int64) PodOption {
	return func(p *apiv1.Pod) {
		q := *resource.NewQuantity(n, resource.DecimalSI)
		p.Spec.Containers[0].Resources.Requests[GPU] = q
		if p.Spec.Containers[0].Resources.Limits == nil {
			p.Spec.Containers[0].Resources.Limits = apiv1.ResourceList{}
		}
		p.Spec.Containers[0].Resources.Limits[GPU] = q
	}
}

// OnNode binds the pod to a node and marks it running.
func OnNode(node string) PodOption {
	return func(p *apiv1.Pod) {
		p.Spec.NodeName = node
		p.Status.Phase = apiv1.PodRunning
	}
}

// Unschedulable marks the pod as the scheduler does when no node fits.
func Unschedulable() PodOption {
	return func(p *apiv1.Pod) {
		p.Status.Phase = apiv1.PodPending
		p.Status.Conditions = append(p.Status.Conditions, apiv1.PodCondition{
			Type: apiv1.PodScheduled, Status: apiv1.ConditionFalse, Reason: apiv1.PodReasonUnschedulable,
		})
	}
}

// CreatedAt sets the pod's creation time.
func CreatedAt(t time.Time) PodOption {
	return func(p *apiv1.Pod) { p.CreationTimestamp = metav1.NewTime(t) }
}

// Namespace sets the pod's namespace.
func Namespace(ns string) PodOption { return func(p *apiv1.Pod) { p.Namespace = ns } }

// Labels adds labels.
func Labels(kv ...string) PodOption {
	return func(p *apiv1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Labels[kv[i]] = kv[i+1]
		}
	}
}

// ControlledBy sets a controller owner reference with the given UID.
func ControlledBy(kind, name string, uid types.UID) PodOption {
	return func(p *apiv1.Pod) {
		t := true
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{
			APIVersion: "apps/v1", Kind: kind, Name: name, UID: uid, Controller: &t,
		})
	}
}

// NodeSelector sets the pod's node selector.
func NodeSelector(kv ...string) PodOption {
	return func(p *apiv1.Pod) {
		p.Spec.NodeSelector = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Spec.NodeSelector[kv[i]] = kv[i+1]
		}
	}
}

// Tolerate adds a toleration for key=value with effect NoSchedule.
func Tolerate(key, value string) PodOption {
	return func(p *apiv1.Pod) {
		p.Spec.Tolerations = append(p.Spec.Tolerations, apiv1.Toleration{
			Key: key, Operator: apiv1.TolerationOpEqual, Value: value, Effect: apiv1.TaintEffectNoSchedule,
		})
	}
}

// HostPort adds a container port bound on the host.
func HostPort(port int32) PodOption {
	return func(p *apiv1.Pod) {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, apiv1.ContainerPort{ContainerPort: port, HostPort: port, Protocol: apiv1.ProtocolTCP})
	}
}

// AntiAffinity makes the pod refuse nodes (by hostname) holding pods with the label key=value.
func AntiAffinity(key, value string) PodOption {
	return func(p *apiv1.Pod) {
		if p.Spec.Affinity == nil {
			p.Spec.Affinity = &apiv1.Affinity{}
		}
		p.Spec.Affinity.PodAntiAffinity = &apiv1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []apiv1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{key: value}},
				TopologyKey:   apiv1.LabelHostname,
			}},
		}
	}
}

// SpreadByHostname adds a DoNotSchedule topology spread over hostnames for pods with key=value.
func SpreadByHostname(maxSkew int32, key, value string) PodOption {
	return func(p *apiv1.Pod) {
		p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, apiv1.TopologySpreadConstraint{
			MaxSkew: maxSkew, TopologyKey: apiv1.LabelHostname, WhenUnsatisfiable: apiv1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{key: value}},
		})
	}
}

// NodeOption changes a node under construction.
type NodeOption func(*apiv1.Node)

// Node returns a Ready node with the given CPU and memory allocatable, 110 pods.
func Node(name, cpu, mem string, opts ...NodeOption) *apiv1.Node {
	n := &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name),
			Labels:            map[string]string{apiv1.LabelHostname: name},
			CreationTimestamp: metav1.NewTime(time.Unix(0, 0))},
		Status: apiv1.NodeStatus{
			Allocatable: apiv1.ResourceList{
				apiv1.ResourceCPU:    resource.MustParse(cpu),
				apiv1.ResourceMemory: resource.MustParse(mem),
				apiv1.ResourcePods:   resource.MustParse("110"),
			},
			Conditions: []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(n)
	}
	n.Status.Capacity = n.Status.Allocatable.DeepCopy()
	return n
}

// NodeGPUs sets the node's GPU allocatable.
func NodeGPUs(count int64) NodeOption {
	return func(n *apiv1.Node) { n.Status.Allocatable[GPU] = *resource.NewQuantity(count, resource.DecimalSI) }
}

// ProviderID sets spec.providerID.
func ProviderID(id string) NodeOption { return func(n *apiv1.Node) { n.Spec.ProviderID = id } }

// NodeLabels adds labels.
func NodeLabels(kv ...string) NodeOption {
	return func(n *apiv1.Node) {
		for i := 0; i+1 < len(kv); i += 2 {
			n.Labels[kv[i]] = kv[i+1]
		}
	}
}

// Taint adds a NoSchedule taint.
func Taint(key, value string) NodeOption {
	return func(n *apiv1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: key, Value: value, Effect: apiv1.TaintEffectNoSchedule})
	}
}

// NotReady marks the node NotReady.
func NotReady() NodeOption {
	return func(n *apiv1.Node) {
		n.Status.Conditions = []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionFalse}}
	}
}

// LostSince marks the node as the node lifecycle controller marks a node
// whose kubelet stopped renewing its Lease: Ready Unknown since t, and the
// unreachable NoSchedule taint.
func LostSince(t time.Time) NodeOption {
	return func(n *apiv1.Node) {
		n.Status.Conditions = []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionUnknown,
			Reason: "NodeStatusUnknown", LastTransitionTime: metav1.NewTime(t)}}
		n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: apiv1.TaintNodeUnreachable, Effect: apiv1.TaintEffectNoSchedule})
	}
}

// NodeCreatedAt sets the node's creation time.
func NodeCreatedAt(t time.Time) NodeOption {
	return func(n *apiv1.Node) { n.CreationTimestamp = metav1.NewTime(t) }
}

// MaxPods sets the node's pod capacity.
func MaxPods(count int64) NodeOption {
	return func(n *apiv1.Node) {
		n.Status.Allocatable[apiv1.ResourcePods] = *resource.NewQuantity(count, resource.DecimalSI)
	}
}
