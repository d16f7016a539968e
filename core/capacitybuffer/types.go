// Package capacitybuffer speaks the CapacityBuffer API
// (autoscaling.x-k8s.io/v1beta1), with which a user asks the autoscaler
// to keep spare room for pods of a given shape: the types, a client over
// an informer, and the translation of a buffer into its chunks (how many
// pods of which template) and its status.
//
// The types are this project's own, written from the API's published
// field list (cluster-autoscaler's apis/capacitybuffer v1beta1, its
// storage version since CA 1.36): the module pin the proxy serves
// (k8s.io/autoscaler/cluster-autoscaler/apis
// v0.0.0-20240830133931-adfbe7e45277) predates the API, and its type
// packages blank-import ginkgo, gomega and code-generator.
//
// A buffer is turned into room booked in the loop's snapshot (virtual
// pods, as cluster-autoscaler does), not into balloon pods: see core's
// capacity-buffers phase.
package capacitybuffer

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The API's group, version, resource and kind.
const (
	Group    = "autoscaling.x-k8s.io"
	Version  = "v1beta1"
	Resource = "capacitybuffers"
	Kind     = "CapacityBuffer"
)

// GroupVersion is autoscaling.x-k8s.io/v1beta1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// ActiveCapacity is the provisioning strategy this autoscaler serves (the
// API's default): the buffer's chunks take room that new pods may use at
// once. A buffer of another strategy is left to whatever serves it.
const ActiveCapacity = "buffer.x-k8s.io/active-capacity"

// Condition types, as cluster-autoscaler writes them.
const (
	// ReadyForProvisioning: the buffer's spec was turned into a pod
	// template and a number of chunks (status.podTemplateRef,
	// status.replicas), or why not.
	ReadyForProvisioning = "ReadyForProvisioning"
	// ConditionLimitedByQuotas says a buffer has fewer chunks than it
	// asks for because of its namespace's ResourceQuotas (the
	// cluster-autoscaler design's LimitedByQuotas).
	ConditionLimitedByQuotas = "LimitedByQuotas"
	// Provisioning: the chunks are placed (room held on ready nodes,
	// bought, or queued to be bought), or why not.
	Provisioning = "Provisioning"
)

// Condition reasons: cluster-autoscaler's where the meaning is the same.
const (
	ReasonAttributesSet          = "AttributesSetSuccessfully"
	ReasonInvalidSpec            = "InvalidSpec"
	ReasonPodTemplateNotFound    = "PodTemplateNotFound"
	ReasonScalableRefUnsupported = "ScalableRefNotSupported"
	ReasonScalableRefNotFound    = "ScalableRefNotFound"
	ReasonFakePodsInjected       = "FakePodsInjected"
	ReasonNotReady               = "NotReadyForProvisioning"
	ReasonBufferIsEmpty          = "BufferIsEmpty"
	ReasonScalableRefUnreadable  = "ScalableRefUnreadable"
	ReasonQuotaLimited           = "QuotaLimitsBuffer"
	ReasonQuotaNotLimited        = "QuotaDoesNotLimitBuffer"
	// ReasonLimitReached: left out by --max-capacity-buffers(-per-namespace).
	ReasonLimitReached = "BufferLimitReached"
)

// CapacityBuffer asks for spare room for chunks of a pod's shape.
type CapacityBuffer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// CapacityBufferList is a list of buffers.
type CapacityBufferList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CapacityBuffer `json:"items"`
}

// LocalObjectRef names an object in the buffer's namespace.
type LocalObjectRef struct {
	Name string `json:"name"`
}

// ScalableRef names an object with a scale subresource in the buffer's
// namespace.
type ScalableRef struct {
	APIGroup string `json:"apiGroup,omitempty"`
	Kind     string `json:"kind"`
	Name     string `json:"name"`
}

// ResourceList is a set of resource quantities (the API mirrors
// core/v1's).
type ResourceList map[string]resource.Quantity

// Spec is the buffer's wish: the shape of one chunk (a PodTemplate, or
// the pods of a scalable object) and how many chunks (replicas, a
// percentage of the scalable object's replicas, within limits).
type Spec struct {
	ProvisioningStrategy *string         `json:"provisioningStrategy,omitempty"`
	PodTemplateRef       *LocalObjectRef `json:"podTemplateRef,omitempty"`
	ScalableRef          *ScalableRef    `json:"scalableRef,omitempty"`
	Replicas             *int32          `json:"replicas,omitempty"`
	Percentage           *int32          `json:"percentage,omitempty"`
	Limits               *ResourceList   `json:"limits,omitempty"`
}

// Status is what the autoscaler made of the buffer.
type Status struct {
	PodTemplateRef        *LocalObjectRef    `json:"podTemplateRef,omitempty"`
	Replicas              *int32             `json:"replicas,omitempty"`
	PodTemplateGeneration *int64             `json:"podTemplateGeneration,omitempty"`
	Conditions            []metav1.Condition `json:"conditions,omitempty"`
	ProvisioningStrategy  *string            `json:"provisioningStrategy,omitempty"`
}

// Strategy is the buffer's provisioning strategy, the default when unset.
func (b *CapacityBuffer) Strategy() string {
	if s := b.Spec.ProvisioningStrategy; s != nil && *s != "" {
		return *s
	}
	return ActiveCapacity
}

// Key is a buffer's namespace/name.
func Key(b *CapacityBuffer) string { return b.Namespace + "/" + b.Name }

// DeepCopyInto copies b into out.
func (b *CapacityBuffer) DeepCopyInto(out *CapacityBuffer) {
	*out = *b
	b.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	s := &out.Spec
	s.ProvisioningStrategy = copyPtr(b.Spec.ProvisioningStrategy)
	s.PodTemplateRef = copyPtr(b.Spec.PodTemplateRef)
	s.ScalableRef = copyPtr(b.Spec.ScalableRef)
	s.Replicas = copyPtr(b.Spec.Replicas)
	s.Percentage = copyPtr(b.Spec.Percentage)
	if b.Spec.Limits != nil {
		l := make(ResourceList, len(*b.Spec.Limits))
		for k, v := range *b.Spec.Limits {
			l[k] = v.DeepCopy()
		}
		s.Limits = &l
	}
	st := &out.Status
	st.PodTemplateRef = copyPtr(b.Status.PodTemplateRef)
	st.Replicas = copyPtr(b.Status.Replicas)
	st.PodTemplateGeneration = copyPtr(b.Status.PodTemplateGeneration)
	st.ProvisioningStrategy = copyPtr(b.Status.ProvisioningStrategy)
	if b.Status.Conditions != nil {
		st.Conditions = make([]metav1.Condition, len(b.Status.Conditions))
		for i := range b.Status.Conditions {
			b.Status.Conditions[i].DeepCopyInto(&st.Conditions[i])
		}
	}
}

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// DeepCopy returns a copy of b.
func (b *CapacityBuffer) DeepCopy() *CapacityBuffer {
	if b == nil {
		return nil
	}
	out := new(CapacityBuffer)
	b.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (b *CapacityBuffer) DeepCopyObject() runtime.Object { return b.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *CapacityBufferList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &CapacityBufferList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]CapacityBuffer, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &CapacityBuffer{}, &CapacityBufferList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
