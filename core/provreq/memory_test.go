package provreq

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/heaptest"
)

// BenchmarkTrackerMemoryPerRequest (#40) is what the tracker keeps per
// ProvisioningRequest between loops: 100 requests of 5,000 whole-GPU
// pods each, backing off (the cluster had no room), as a tenant may
// leave them. Kept as its pod sets' shapes, a request costs a few KiB,
// whatever its pod count; before, the tracker kept its 5,000 pods,
// ~6.5 MiB each (1,500 such requests would fill a 12 GiB leader). The
// figure in docs/concepts/provisioning-requests.md comes from here.
func BenchmarkTrackerMemoryPerRequest(b *testing.B) {
	const n, pods = 100, MaxPods
	pt := gpuTemplate("train")
	get := templates(pt)
	now := time.Unix(1000, 0)
	var reqs []*ProvisioningRequest
	for i := range n {
		r := req(ClassBestEffortAtomic, PodSet{PodTemplateRef: Reference{Name: "train"}, Count: pods})
		r.Name, r.UID = fmt.Sprintf("job-%d", i), types.UID(fmt.Sprintf("u-%d", i))
		r.CreationTimestamp = metav1.NewTime(now.Add(-time.Minute))
		reqs = append(reqs, r)
	}
	var perRequest float64
	for b.Loop() {
		base := heaptest.Live()
		t := NewTracker(DefaultOptions())
		p := t.Plan(now, reqs, nil, nil, get, nil)
		if len(p.ScaleUp) != n || len(p.ScaleUp[0].Pods) != pods {
			b.Fatalf("planned %d requests, want %d of %d pods", len(p.ScaleUp), n, pods)
		}
		for _, at := range p.ScaleUp {
			t.NotProvisioned(at.Req, "no room", now)
		}
		p = Plan{} // the loop ends: its pods are garbage
		p = t.Plan(now.Add(time.Second), reqs, nil, nil, get, nil)
		if len(p.Waiting) != n {
			b.Fatalf("%d requests backing off, want %d", len(p.Waiting), n)
		}
		kept := heaptest.Live()
		runtime.KeepAlive(t)
		perRequest = float64(kept-base) / n
	}
	b.ReportMetric(perRequest/1024, "KiB-kept-per-request")
}
