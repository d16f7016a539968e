package provreq

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/podspec"
)

// uidPrefix starts the UID of every pod a request stands for. A real
// pod's UID is a UUID, so such a pod is never taken for a real one.
const uidPrefix = "provisioningrequest/"

// IsBooked says p is one of the pods a request stands for (booked or
// being checked), not a pod of the cluster: no event, eviction or count
// of real pods may name it.
func IsBooked(p *apiv1.Pod) bool { return strings.HasPrefix(string(p.UID), uidPrefix) }

// Consumes returns the name of the request a pod consumes (the
// consume-provisioning-request annotation, or its older key), in the
// pod's namespace.
func Consumes(p *apiv1.Pod) (string, bool) {
	if name, ok := p.Annotations[ConsumeAnnotation]; ok && name != "" {
		return name, true
	}
	if name, ok := p.Annotations[DeprecatedConsumeAnnotation]; ok && name != "" {
		return name, true
	}
	return "", false
}

// TemplateGetter reads a PodTemplate (from a cache).
type TemplateGetter func(namespace, name string) (*apiv1.PodTemplate, error)

// MaxPods bounds the pods of one request: a request asking for more fails
// (FailedToCreatePods) before any pod is made. A fixed bound, not one
// derived from the node groups' sizes, so a request's fate does not
// change with the groups' (reloadable) limits, and the cost of one
// request's simulation is known: 5,000 pods is 40,000 GPUs of 8-GPU
// machines, above any one workload of the clusters this autoscaler runs,
// while a typo in a count (5,000,000) would cost gigabytes and minutes of
// simulation on every loop.
const MaxPods = 5000

// TooManyPods says why a request asking for more than MaxPods pods is not
// simulated ("" when it is within the bound).
func TooManyPods(r *ProvisioningRequest) string {
	if n := Count(r); n > MaxPods {
		return fmt.Sprintf("%s %s asks for %d pods (the sum of spec.podSets[*].count), more than the %d pods per request this autoscaler simulates",
			Kind, Key(r), n, MaxPods)
	}
	return ""
}

// Count is the number of pods a request asks for.
func Count(r *ProvisioningRequest) int {
	n := 0
	for _, ps := range r.Spec.PodSets {
		n += int(ps.Count)
	}
	return n
}

// Shape is one pod set of a request as made once: its pod (the shared
// spec and metadata of every pod of the set) and its count. A request is
// kept between loops as its shapes, never as its pods: a 5,000-pod
// request costs one pod a set, not 5,000 (#40).
type Shape struct {
	Pod   *apiv1.Pod
	Count int
}

// Shapes returns the shapes of a request's pod sets: each made from its
// PodTemplate, in the request's namespace, controlled by the request and
// annotated as consuming it, as cluster-autoscaler makes its pods. A
// container's missing request is its limit (the API server defaults a
// pod so; a PodTemplate is not defaulted). The error names the pod set
// and the template, or the count above MaxPods.
func Shapes(r *ProvisioningRequest, get TemplateGetter) ([]Shape, error) {
	if len(r.Spec.PodSets) == 0 {
		return nil, fmt.Errorf("spec.podSets of %s %s: empty", Kind, Key(r))
	}
	if why := TooManyPods(r); why != "" {
		return nil, errors.New(why)
	}
	owner := metav1.OwnerReference{APIVersion: GroupVersion.String(), Kind: Kind, Name: r.Name, UID: r.UID, Controller: ptrTrue()}
	out := make([]Shape, 0, len(r.Spec.PodSets))
	for i, ps := range r.Spec.PodSets {
		if ps.Count < 1 {
			return nil, fmt.Errorf("spec.podSets[%d].count of %s %s: %d, must be at least 1", i, Kind, Key(r), ps.Count)
		}
		pt, err := get(r.Namespace, ps.PodTemplateRef.Name)
		if err != nil {
			return nil, fmt.Errorf("spec.podSets[%d].podTemplateRef.name of %s %s: PodTemplate %s/%s: %w",
				i, Kind, Key(r), r.Namespace, ps.PodTemplateRef.Name, err)
		}
		base := &apiv1.Pod{
			ObjectMeta: *pt.Template.ObjectMeta.DeepCopy(),
			Spec:       *pt.Template.Spec.DeepCopy(),
		}
		base.Namespace = r.Namespace
		base.OwnerReferences = []metav1.OwnerReference{owner}
		base.CreationTimestamp = r.CreationTimestamp
		if base.Annotations == nil {
			base.Annotations = map[string]string{}
		}
		base.Annotations[ConsumeAnnotation] = r.Name
		base.Annotations[ClassAnnotation] = r.Spec.ProvisioningClassName
		base.Status.Phase = apiv1.PodPending
		podspec.LimitsAsRequests(base.Spec.Containers)
		podspec.LimitsAsRequests(base.Spec.InitContainers)
		out = append(out, Shape{Pod: base, Count: int(ps.Count)})
	}
	return out, nil
}

// Expand makes the pods of a request's shapes, for one loop: each a
// shallow copy of its set's pod with its own name and UID (equal pods of
// a set are then simulated as one group). The pods of a set share their
// spec and metadata maps: they must not be changed.
func Expand(r *ProvisioningRequest, shapes []Shape) []*apiv1.Pod {
	n := 0
	for _, s := range shapes {
		n += s.Count
	}
	all := make([]apiv1.Pod, n) // one allocation for the loop's copies
	out := make([]*apiv1.Pod, 0, n)
	for i, s := range shapes {
		for j := 0; j < s.Count; j++ {
			p := &all[len(out)]
			*p = *s.Pod
			suffix := strconv.Itoa(i) + "-" + strconv.Itoa(j)
			p.Name = r.Name + "-" + suffix
			p.UID = types.UID(uidPrefix + r.Namespace + "/" + r.Name + "/" + string(r.UID) + "/" + suffix)
			out = append(out, p)
		}
	}
	return out
}

// Pods returns the pods a request stands for: Expand of its Shapes.
func Pods(r *ProvisioningRequest, get TemplateGetter) ([]*apiv1.Pod, error) {
	shapes, err := Shapes(r, get)
	if err != nil {
		return nil, err
	}
	return Expand(r, shapes), nil
}

func ptrTrue() *bool {
	t := true
	return &t
}
