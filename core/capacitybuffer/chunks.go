package capacitybuffer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/podspec"
)

// MaxChunks bounds the chunks of one buffer, as MaxPods bounds a
// ProvisioningRequest: a buffer asking for more is not ready (a typo's
// 1,000,000 would cost gigabytes and minutes of simulation every loop).
const MaxChunks = 5000

// Chunks is what a buffer stands for: Replicas pods of Template.
type Chunks struct {
	Template *apiv1.PodTemplateSpec
	// TemplateRef and TemplateGeneration are the PodTemplate used (a
	// podTemplateRef buffer); empty for a scalableRef buffer, whose pods
	// take the scalable object's template (no PodTemplate is written for
	// it: the autoscaler writes no objects in users' namespaces).
	TemplateRef        string
	TemplateGeneration int64
	Replicas           int32
	// Source says where the shape and the count come from, for the
	// condition's message.
	Source string
}

// NotReadyError says why a buffer cannot be turned into chunks: Reason is
// its ReadyForProvisioning=False reason.
type NotReadyError struct {
	Reason string
	Err    error
}

func (e *NotReadyError) Error() string { return e.Err.Error() }
func (e *NotReadyError) Unwrap() error { return e.Err }

func notReady(reason, format string, args ...any) error {
	return &NotReadyError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Resolve turns a buffer's spec into its chunks, by the API's rules:
// exactly one of podTemplateRef and scalableRef; percentage only with a
// scalableRef, of its replicas, rounded up to at least 1; with both
// replicas and percentage, the larger; limits cap the chunks by their
// total requests, and alone say "as many as fit". A failed read of a
// scalable object (not its absence) is returned as is: the caller keeps
// the buffer's last status.
func Resolve(ctx context.Context, api API, b *CapacityBuffer) (Chunks, error) {
	s := b.Spec
	c, scalableReplicas, err := chunkSource(ctx, api, b)
	if err != nil {
		return c, err
	}
	want, err := replicasWanted(s, scalableReplicas)
	if err != nil {
		return c, err
	}
	if s.Limits != nil {
		fit, why, err := chunksWithin(*s.Limits, c.Template)
		if err != nil {
			return c, err
		}
		if want == nil || fit < *want {
			want = &fit
			c.Source += ", " + why
		}
	}
	if want == nil {
		return c, notReady(ReasonInvalidSpec, "none of spec.replicas, spec.percentage and spec.limits is set: the number of chunks is unknown")
	}
	if *want > MaxChunks {
		return c, notReady(ReasonInvalidSpec, "the buffer asks for %d chunks, more than the %d per buffer this autoscaler simulates", *want, MaxChunks)
	}
	c.Replicas = *want
	return c, nil
}

// chunkSource reads the chunks' template from exactly one of
// podTemplateRef and scalableRef, and the scalable object's replicas
// (nil for a podTemplateRef).
func chunkSource(ctx context.Context, api API, b *CapacityBuffer) (Chunks, *int32, error) {
	s := b.Spec
	switch {
	case s.PodTemplateRef != nil && s.ScalableRef != nil:
		return Chunks{}, nil, notReady(ReasonInvalidSpec, "spec.podTemplateRef (%q) and spec.scalableRef (%s %q) are both set: set one", s.PodTemplateRef.Name, s.ScalableRef.Kind, s.ScalableRef.Name)
	case s.PodTemplateRef != nil:
		c, err := fromPodTemplate(api, b)
		return c, nil, err
	case s.ScalableRef != nil:
		return fromScalable(ctx, api, b)
	}
	return Chunks{}, nil, notReady(ReasonInvalidSpec, "neither spec.podTemplateRef nor spec.scalableRef is set: set one")
}

// fromPodTemplate takes the chunks' template from the PodTemplate
// podTemplateRef names (no percentage then: it is one of a scalable
// object's replicas).
func fromPodTemplate(api API, b *CapacityBuffer) (Chunks, error) {
	s := b.Spec
	var c Chunks
	if err := validName("spec.podTemplateRef.name", s.PodTemplateRef.Name); err != nil {
		return c, err
	}
	if s.Percentage != nil {
		return c, notReady(ReasonInvalidSpec, "spec.percentage (%d) needs spec.scalableRef: it is a percentage of its replicas", *s.Percentage)
	}
	pt, err := api.PodTemplate(b.Namespace, s.PodTemplateRef.Name)
	if err != nil {
		return c, notReady(ReasonPodTemplateNotFound, "spec.podTemplateRef.name: PodTemplate %s/%s: %v", b.Namespace, s.PodTemplateRef.Name, err)
	}
	c.Template, c.TemplateRef, c.TemplateGeneration = &pt.Template, pt.Name, pt.Generation
	c.Source = "PodTemplate " + pt.Name
	return c, nil
}

// fromScalable takes the chunks' template, and its replicas, from the
// object scalableRef names.
func fromScalable(ctx context.Context, api API, b *CapacityBuffer) (Chunks, *int32, error) {
	s := b.Spec
	var c Chunks
	if err := validScalableRef(*s.ScalableRef); err != nil {
		return c, nil, err
	}
	t, r, err := api.Scalable(ctx, b.Namespace, *s.ScalableRef)
	var unsupported *UnsupportedScalableError
	var missing *ScalableNotFoundError
	switch {
	case errors.As(err, &unsupported):
		return c, nil, &NotReadyError{Reason: ReasonScalableRefUnsupported, Err: err}
	case errors.As(err, &missing):
		return c, nil, &NotReadyError{Reason: ReasonScalableRefNotFound, Err: err}
	case err != nil:
		return c, nil, err
	}
	c.Template = t
	// Not its replicas: the status would be rewritten each time the
	// workload is scaled.
	c.Source = fmt.Sprintf("the pod template of %s %s", s.ScalableRef.Kind, s.ScalableRef.Name)
	return c, &r, nil
}

// replicasWanted is the chunks replicas and percentage (of
// scalableReplicas, rounded up to at least 1) ask for: the larger when
// both are set, nil when neither is.
func replicasWanted(s Spec, scalableReplicas *int32) (*int32, error) {
	var want *int32
	if s.Replicas != nil {
		if *s.Replicas < 0 {
			return nil, notReady(ReasonInvalidSpec, "spec.replicas: %d, must not be negative", *s.Replicas)
		}
		want = s.Replicas
	}
	if s.Percentage != nil {
		p := *s.Percentage
		if p < 0 {
			return nil, notReady(ReasonInvalidSpec, "spec.percentage: %d, must not be negative", p)
		}
		n := int32(0)
		if p > 0 {
			n = max(1, int32(math.Ceil(float64(p)*float64(*scalableReplicas)/100)))
		}
		if want == nil || n > *want {
			want = &n
		}
	}
	return want, nil
}

// kindPattern is an API kind: a CamelCase identifier.
var kindPattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,62}$`)

// validName checks an object name as the API defines it (a DNS
// subdomain, at most 253 characters): the CRD says so, but a buffer
// written before it did, or through an older CRD, is user text all the
// same; its value is quoted cut, never whole, in the error.
func validName(field, name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return notReady(ReasonInvalidSpec, "%s: %s: not an object name: %s", field, quoteCut(name), errs[0])
	}
	return nil
}

// validScalableRef checks a scalableRef's API group, kind and name.
func validScalableRef(r ScalableRef) error {
	if r.APIGroup != "" {
		if errs := validation.IsDNS1123Subdomain(r.APIGroup); len(errs) > 0 {
			return notReady(ReasonInvalidSpec, "spec.scalableRef.apiGroup: %s: not an API group: %s", quoteCut(r.APIGroup), errs[0])
		}
	}
	if !kindPattern.MatchString(r.Kind) {
		return notReady(ReasonInvalidSpec, "spec.scalableRef.kind: %s: not a kind (a CamelCase identifier of at most 63 characters)", quoteCut(r.Kind))
	}
	return validName("spec.scalableRef.name", r.Name)
}

// quoteCut quotes at most the first 64 bytes of s (a valid cut: whole
// runes), saying how long it was when it was longer.
func quoteCut(s string) string {
	const n = 64
	if len(s) <= n {
		return strconv.Quote(s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// chunksWithin is the number of chunks whose total requests fit the
// limits, and which limit binds.
func chunksWithin(limits ResourceList, t *apiv1.PodTemplateSpec) (int32, string, error) {
	req := podRequests(t)
	names := make([]string, 0, len(limits))
	for n := range limits {
		names = append(names, n)
	}
	sort.Strings(names)
	best, binding := int64(math.MaxInt64), ""
	for _, n := range names {
		lim := limits[n]
		per, ok := req[apiv1.ResourceName(n)]
		if !ok || per.IsZero() {
			continue
		}
		k, err := chunksOf(n, lim, per)
		if err != nil {
			return 0, "", err
		}
		if k < best {
			best, binding = k, fmt.Sprintf("limited by spec.limits.%s %s at %s a chunk", n, lim.String(), per.String())
		}
	}
	if binding == "" {
		return 0, "", notReady(ReasonInvalidSpec, "spec.limits (%s) bounds nothing: one chunk requests none of these resources", strings.Join(names, ", "))
	}
	return int32(max(0, min(best, MaxChunks+1))), binding, nil
}

// chunksOf is how many chunks requesting per of resource n fit its
// limit lim (at most MaxChunks+1 when not exact).
func chunksOf(n string, lim, per resource.Quantity) (int64, error) {
	if lim.Sign() < 0 {
		return 0, notReady(ReasonInvalidSpec, "spec.limits.%s: %s, must not be negative", n, lim.String())
	}
	if per.Sign() < 0 {
		// The API server refuses a negative request in a pod; a
		// template is not validated as one.
		return 0, notReady(ReasonInvalidSpec, "a chunk requests %s %s: a request must not be negative", per.String(), n)
	}
	if lim.CmpInt64(1<<40) < 0 && per.MilliValue() > 0 {
		// Exact in thousandths (300m over 100m is 3, not 2.9999).
		return lim.MilliValue() / per.MilliValue(), nil
	}
	// Clamped before the conversion: a ratio past int64 (1E over
	// 1m) would turn negative.
	return int64(math.Min(math.Floor(lim.AsApproximateFloat64()/per.AsApproximateFloat64()), MaxChunks+1)), nil
}

// podRequests is what one chunk requests (limits standing for missing
// requests, as the API server defaults a pod).
func podRequests(t *apiv1.PodTemplateSpec) apiv1.ResourceList {
	p := &apiv1.Pod{Spec: *t.Spec.DeepCopy()}
	podspec.LimitsAsRequests(p.Spec.Containers)
	podspec.LimitsAsRequests(p.Spec.InitContainers)
	return resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
}

// uidPrefix starts the UID of every pod a buffer stands for. A real
// pod's UID is a UUID, so such a pod is never taken for a real one.
const uidPrefix = "capacitybuffer/"

// IsBufferPod says p is one of the pods a buffer stands for, not a pod
// of the cluster: no event, eviction or count of real pods may name it.
func IsBufferPod(p *apiv1.Pod) bool { return strings.HasPrefix(string(p.UID), uidPrefix) }

// BufferOf is the UID of the buffer a buffer pod stands for.
func BufferOf(p *apiv1.Pod) types.UID {
	if ref := metav1.GetControllerOf(p); ref != nil {
		return ref.UID
	}
	return ""
}

// Pods returns the chunks' pods: Replicas pods of the template in the
// buffer's namespace, controlled by the buffer (equal pods are simulated
// as one group), at the lowest priority (real pods always come first).
// They share their spec and metadata maps: they must not be changed.
func Pods(b *CapacityBuffer, c Chunks) []*apiv1.Pod {
	if c.Replicas <= 0 {
		return nil
	}
	ctrl := true
	base := &apiv1.Pod{ObjectMeta: *c.Template.ObjectMeta.DeepCopy(), Spec: *c.Template.Spec.DeepCopy()}
	base.Namespace = b.Namespace
	base.OwnerReferences = []metav1.OwnerReference{{APIVersion: GroupVersion.String(), Kind: Kind, Name: b.Name, UID: b.UID, Controller: &ctrl}}
	base.CreationTimestamp = b.CreationTimestamp
	base.Spec.NodeName = ""
	lowest := int32(math.MinInt32)
	base.Spec.Priority = &lowest
	base.Status.Phase = apiv1.PodPending
	podspec.LimitsAsRequests(base.Spec.Containers)
	podspec.LimitsAsRequests(base.Spec.InitContainers)
	out := make([]*apiv1.Pod, c.Replicas)
	for i := range out {
		cp := *base
		cp.Name = "capacity-buffer-" + b.Name + "-" + strconv.Itoa(i)
		cp.UID = types.UID(uidPrefix + b.Namespace + "/" + b.Name + "/" + string(b.UID) + "/" + strconv.Itoa(i))
		out[i] = &cp
	}
	return out
}
