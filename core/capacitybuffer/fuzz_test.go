package capacitybuffer

import (
	"context"
	"errors"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzResolve: a buffer is user input (the CRD's validation aside). Any
// spec resolves to chunks within [0, MaxChunks] or to an error, never a
// panic, and a NotReadyError names a spec field.
func FuzzResolve(f *testing.F) {
	f.Add(int32(2), int32(-1), int32(10), "nvidia.com/gpu", "16", "8", "64", true)
	f.Add(int32(-1), int32(25), int32(7), "cpu", "1E", "0", "1m", false)
	f.Add(int32(0), int32(0), int32(0), "memory", "-1", "1", "0", true)
	f.Add(int32(-1), int32(-1), int32(0), "nvidia.com/gpu", "1E", "1m", "1", true)
	f.Fuzz(func(t *testing.T, replicas, percentage, scalableReplicas int32, limitName, limit, gpus, cpu string, template bool) {
		q := func(s string) (resource.Quantity, bool) {
			v, err := resource.ParseQuantity(s)
			return v, err == nil
		}
		req := apiv1.ResourceList{}
		if v, ok := q(cpu); ok {
			req[apiv1.ResourceCPU] = v
		}
		if v, ok := q(gpus); ok {
			req["nvidia.com/gpu"] = v
		}
		pt := apiv1.PodTemplateSpec{Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Resources: apiv1.ResourceRequirements{Requests: req}}}}}
		api := &fakeAPI{
			templates: map[string]*apiv1.PodTemplate{"ns/t": {ObjectMeta: metav1.ObjectMeta{Name: "t"}, Template: pt}},
			scalables: map[string]scalable{"ns/Deployment/d": {t: &pt, r: scalableReplicas}},
		}
		spec := Spec{}
		if template {
			spec.PodTemplateRef = &LocalObjectRef{Name: "t"}
		} else {
			spec.ScalableRef = &ScalableRef{APIGroup: "apps", Kind: "Deployment", Name: "d"}
		}
		if replicas >= 0 {
			spec.Replicas = &replicas
		}
		if percentage >= 0 {
			spec.Percentage = &percentage
		}
		if v, ok := q(limit); ok && limitName != "" {
			spec.Limits = &ResourceList{limitName: v}
		}
		b := &CapacityBuffer{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}, Spec: spec}
		c, err := Resolve(context.Background(), api, b)
		if err != nil {
			var nr *NotReadyError
			if !errors.As(err, &nr) || nr.Reason == "" {
				t.Fatalf("error %v (%T) is no NotReadyError with a reason", err, err)
			}
			return
		}
		if c.Replicas < 0 || c.Replicas > MaxChunks {
			t.Fatalf("%d chunks out of [0, %d] for %+v", c.Replicas, MaxChunks, spec)
		}
		if got := len(Pods(b, c)); got != int(c.Replicas) {
			t.Fatalf("%d pods for %d chunks", got, c.Replicas)
		}
	})
}
