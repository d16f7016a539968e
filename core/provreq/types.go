// Package provreq speaks the ProvisioningRequest API
// (autoscaling.x-k8s.io/v1), with which a workload asks the autoscaler for
// capacity before it creates its pods (Kueue's ProvisioningRequest
// admission check does): the types, a client and informer, the pods a
// request stands for, its conditions, and the rules of its life cycle
// (which requests to check, to scale up for, to book, to expire, to
// retry, to delete). The simulation and the cloud writes stay in core.
//
// The types are this project's own, field for field the API's v1 as
// published in k8s.io/autoscaler/cluster-autoscaler/apis: that module's
// type package blank-imports ginkgo, gomega and code-generator (which
// would end up in the binary, ginkgo registering its flags), and its
// generated clientset is not needed for one resource.
package provreq

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The API's group, version and resource.
const (
	Group    = "autoscaling.x-k8s.io"
	Version  = "v1"
	Resource = "provisioningrequests"
	Kind     = "ProvisioningRequest"
)

// GroupVersion is autoscaling.x-k8s.io/v1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// The provisioning classes this autoscaler serves.
const (
	// ClassCheckCapacity: do the pods fit on the cluster as it is?
	ClassCheckCapacity = "check-capacity.autoscaling.x-k8s.io"
	// ClassBestEffortAtomic: buy every node the pods need at once, or none.
	ClassBestEffortAtomic = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
)

// Pod annotations naming the request a pod consumes (Kueue sets them on
// the pods of an admitted workload), and the older key of the same
// meaning cluster-autoscaler still honours.
const (
	ConsumeAnnotation           = "autoscaling.x-k8s.io/consume-provisioning-request"
	DeprecatedConsumeAnnotation = "cluster-autoscaler.kubernetes.io/consume-provisioning-request"
	ClassAnnotation             = "autoscaling.x-k8s.io/provisioning-class-name"
)

// Parameters read from spec.parameters.
const (
	// NoRetryParameter "true": a check-capacity request that does not fit
	// fails (Failed=True) instead of being retried.
	NoRetryParameter = "noRetry"
	// ProcessorInstanceParameter names the cluster-autoscaler instance
	// meant to check a check-capacity request; one that names any instance
	// is not this autoscaler's (CA without --check-capacity-processor-instance
	// skips them too).
	ProcessorInstanceParameter = "processorInstance"
)

// Condition types.
const (
	Accepted        = "Accepted"
	Provisioned     = "Provisioned"
	Failed          = "Failed"
	BookingExpired  = "BookingExpired"
	CapacityRevoked = "CapacityRevoked"
)

// ProvisioningRequest asks for capacity for a set of pods.
type ProvisioningRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ProvisioningRequestSpec   `json:"spec"`
	Status            ProvisioningRequestStatus `json:"status,omitempty"`
}

// ProvisioningRequestList is a list of requests.
type ProvisioningRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []ProvisioningRequest `json:"items"`
}

// ProvisioningRequestSpec is what is asked for: 1–32 pod sets, a class
// and its parameters. The API server keeps it immutable.
type ProvisioningRequestSpec struct {
	PodSets               []PodSet             `json:"podSets"`
	ProvisioningClassName string               `json:"provisioningClassName"`
	Parameters            map[string]Parameter `json:"parameters,omitempty"`
}

// Parameter is a class parameter (at most 255 characters).
type Parameter string

// PodSet is count pods of a PodTemplate in the request's namespace.
type PodSet struct {
	PodTemplateRef Reference `json:"podTemplateRef"`
	Count          int32     `json:"count"`
}

// Reference names an object in the request's namespace.
type Reference struct {
	Name string `json:"name,omitempty"`
}

// ProvisioningRequestStatus is the autoscaler's answer.
type ProvisioningRequestStatus struct {
	Conditions               []metav1.Condition `json:"conditions,omitempty"`
	ProvisioningClassDetails map[string]Detail  `json:"provisioningClassDetails,omitempty"`
}

// Detail is a class-specific detail of the status.
type Detail string

// DeepCopyInto copies r into out.
func (r *ProvisioningRequest) DeepCopyInto(out *ProvisioningRequest) {
	*out = *r
	out.TypeMeta = r.TypeMeta
	r.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.PodSets = append([]PodSet(nil), r.Spec.PodSets...)
	if r.Spec.Parameters != nil {
		out.Spec.Parameters = make(map[string]Parameter, len(r.Spec.Parameters))
		for k, v := range r.Spec.Parameters {
			out.Spec.Parameters[k] = v
		}
	}
	if r.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(r.Status.Conditions))
		for i := range r.Status.Conditions {
			r.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
	if r.Status.ProvisioningClassDetails != nil {
		out.Status.ProvisioningClassDetails = make(map[string]Detail, len(r.Status.ProvisioningClassDetails))
		for k, v := range r.Status.ProvisioningClassDetails {
			out.Status.ProvisioningClassDetails[k] = v
		}
	}
}

// DeepCopy returns a copy of r.
func (r *ProvisioningRequest) DeepCopy() *ProvisioningRequest {
	if r == nil {
		return nil
	}
	out := new(ProvisioningRequest)
	r.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (r *ProvisioningRequest) DeepCopyObject() runtime.Object { return r.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *ProvisioningRequestList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &ProvisioningRequestList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]ProvisioningRequest, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}

// addKnownTypes registers the types in a scheme.
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ProvisioningRequest{}, &ProvisioningRequestList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Key is a request's namespace/name.
func Key(r *ProvisioningRequest) string { return r.Namespace + "/" + r.Name }
