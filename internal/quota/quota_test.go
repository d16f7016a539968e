package quota

import (
	"strings"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestQuotaLedger: chunks counted as the pods they stand for would be, by
// every quota covering such a pod (its scopes), in turn.
func TestQuotaLedger(t *testing.T) {
	q := func(name string, hard, used apiv1.ResourceList, sel ...apiv1.ScopedResourceSelectorRequirement) *apiv1.ResourceQuota {
		rq := &apiv1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: apiv1.ResourceQuotaSpec{Hard: hard}, Status: apiv1.ResourceQuotaStatus{Used: used}}
		if len(sel) > 0 {
			rq.Spec.ScopeSelector = &apiv1.ScopeSelector{MatchExpressions: sel}
		}
		return rq
	}
	list := func(kv ...string) apiv1.ResourceList {
		out := apiv1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[apiv1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	tmpl := func(pc string, requests, limits apiv1.ResourceList) *apiv1.PodSpec {
		return &apiv1.PodSpec{PriorityClassName: pc, Containers: []apiv1.Container{{Name: "c",
			Resources: apiv1.ResourceRequirements{Requests: requests, Limits: limits}}}}
	}
	gpu := tmpl("", list("cpu", "90", "nvidia.com/gpu", "8"), nil)
	for _, tc := range []struct {
		name   string
		quotas []*apiv1.ResourceQuota
		t      *apiv1.PodSpec
		want   []int32 // chunks granted to successive asks of 5
		whyHas string
	}{
		{"no quota", nil, gpu, []int32{5, 5}, ""},
		{"GPUs", []*apiv1.ResourceQuota{q("gpus", list("requests.nvidia.com/gpu", "24"), list("requests.nvidia.com/gpu", "8"))}, gpu, []int32{2, 0}, "of requests.nvidia.com/gpu, 8 a pod"},
		{"pods", []*apiv1.ResourceQuota{q("count", list("pods", "10"), list("pods", "7"))}, gpu, []int32{3, 0}, "of pods"},
		{"cpu (the request's short name)", []*apiv1.ResourceQuota{q("cpu", list("cpu", "200"), nil)}, gpu, []int32{2, 0}, "of cpu"},
		{"a limit the pod does not set counts as its request", []*apiv1.ResourceQuota{q("limits", list("limits.cpu", "500"), nil)}, gpu, []int32{5, 0}, "of limits.cpu"},
		{"an init container's request counts (the pod's maximum)", []*apiv1.ResourceQuota{q("gpus", list("requests.nvidia.com/gpu", "16"), nil)},
			&apiv1.PodSpec{InitContainers: []apiv1.Container{{Name: "i", Resources: apiv1.ResourceRequirements{Requests: list("nvidia.com/gpu", "8")}}},
				Containers: []apiv1.Container{{Name: "c"}}}, []int32{2, 0}, "of requests.nvidia.com/gpu, 8 a pod"},
		{"a GPU-only pod is BestEffort (cpu and memory make the QoS class)", []*apiv1.ResourceQuota{{ObjectMeta: metav1.ObjectMeta{Name: "be"},
			Spec: apiv1.ResourceQuotaSpec{Hard: list("pods", "1"), Scopes: []apiv1.ResourceQuotaScope{apiv1.ResourceQuotaScopeBestEffort}}}},
			tmpl("", list("nvidia.com/gpu", "8"), nil), []int32{1, 0}, "ResourceQuota be"},
		{"a limit a chunk sets", []*apiv1.ResourceQuota{q("limits", list("limits.cpu", "300"), nil)}, tmpl("", list("cpu", "90"), list("cpu", "100")), []int32{3, 0}, "of limits.cpu"},
		{"a quota of another priority class", []*apiv1.ResourceQuota{q("high", list("pods", "0"), nil,
			apiv1.ScopedResourceSelectorRequirement{ScopeName: apiv1.ResourceQuotaScopePriorityClass, Operator: apiv1.ScopeSelectorOpIn, Values: []string{"high"}})}, gpu, []int32{5, 5}, ""},
		{"a quota of the chunk's priority class", []*apiv1.ResourceQuota{q("high", list("pods", "1"), nil,
			apiv1.ScopedResourceSelectorRequirement{ScopeName: apiv1.ResourceQuotaScopePriorityClass, Operator: apiv1.ScopeSelectorOpIn, Values: []string{"high"}})},
			tmpl("high", list("cpu", "1"), nil), []int32{1, 0}, "ResourceQuota high"},
		{"a BestEffort quota does not count a chunk with requests", []*apiv1.ResourceQuota{{ObjectMeta: metav1.ObjectMeta{Name: "be"},
			Spec: apiv1.ResourceQuotaSpec{Hard: list("pods", "0"), Scopes: []apiv1.ResourceQuotaScope{apiv1.ResourceQuotaScopeBestEffort}}}}, gpu, []int32{5, 5}, ""},
		{"already over", []*apiv1.ResourceQuota{q("gpus", list("requests.nvidia.com/gpu", "8"), list("requests.nvidia.com/gpu", "16"))}, gpu, []int32{0, 0}, "leaves -8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.quotas)
			for i, want := range tc.want {
				got, why := l.Take(tc.t, 5)
				if got != want || (got < 5 && !strings.Contains(why, tc.whyHas)) || (got == 5 && why != "") {
					t.Fatalf("ask %d: %d chunks (%q), want %d (with %q)", i+1, got, why, want, tc.whyHas)
				}
			}
		})
	}
}

// TestTakeAllIsAllOrNothing: a request's pods fit whole or spend nothing.
func TestTakeAllIsAllOrNothing(t *testing.T) {
	gpu := &apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Resources: apiv1.ResourceRequirements{
		Requests: apiv1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}}}}}
	l := New([]*apiv1.ResourceQuota{{ObjectMeta: metav1.ObjectMeta{Name: "gpus"},
		Spec: apiv1.ResourceQuotaSpec{Hard: apiv1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse("32")}}}})
	five := []*apiv1.PodSpec{gpu, gpu, gpu, gpu, gpu}
	if ok, why := l.TakeAll(five); ok || !strings.Contains(why, "4 of 5 pods fit: ResourceQuota gpus") {
		t.Fatalf("5 pods of 8 GPUs in a quota of 32: %v %q, want refused naming the quota", ok, why)
	}
	if ok, why := l.TakeAll(five[:4]); !ok {
		t.Fatalf("4 pods after a refused 5 (nothing spent): refused %q", why)
	}
	if ok, _ := l.TakeAll(five[:1]); ok {
		t.Fatal("a fifth pod once 4 were taken: fits")
	}
}
