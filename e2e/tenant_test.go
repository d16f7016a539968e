package e2e

import (
	"fmt"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
)

// The tenant's side of the capacity APIs (#40), on the real API server and
// its quota controller. These run as subtests of
// TestProvisioningRequestsAndTestKueueAndTestTenant: an autoscaler with
// --enable-provisioning-requests handles every request of the cluster, so
// such scenarios run one at a time (see provreqSuite).

// tenantRequestOverQuota: a tenant's namespace may request 16 GPUs (a
// ResourceQuota, kept by the real kube-controller-manager); its
// best-effort-atomic request for 4 whole-GPU pods (32 GPUs) buys nothing
// and is refused with the quota named, in the words a Kueue user reads
// (Provisioned=False, ExceedsResourceQuota); a request for 2 pods of the
// same namespace is provisioned. Before, a request bought nodes past
// every quota: no pod is created for it, so no quota saw it.
func tenantRequestOverQuota(t *testing.T) {
	sc := provreqScenario(t)
	gpu, as := sc.provreqAutoscaler(0)
	q := &apiv1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "team-gpus", Namespace: sc.ns},
		Spec: apiv1.ResourceQuotaSpec{Hard: apiv1.ResourceList{"requests." + armsim.GPUResource: resource.MustParse("16")}}}
	if _, err := sc.s.cp.Client.CoreV1().ResourceQuotas(sc.ns).Create(sc.ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc.eventually("the quota's status kept by the quota controller", 30*time.Second, func() (bool, string) {
		got, err := sc.s.cp.Client.CoreV1().ResourceQuotas(sc.ns).Get(sc.ctx, q.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		_, ok := got.Status.Hard["requests."+armsim.GPUResource]
		return ok, fmt.Sprintf("status %+v", got.Status)
	})
	sc.podTemplate("train", gpu)
	sc.createRequest("too-big", provreq.ClassBestEffortAtomic, "train", 4, nil)
	c := sc.condition("too-big", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonExceedsQuota,
		"ResourceQuota team-gpus leaves 16 of requests."+string(armsim.GPUResource)+", 8 a pod", time.Minute)
	t.Logf("Provisioned=False message: %s", c.Message)
	sc.stays(gpu, 0, as, 3)
	sc.createRequest("fits", provreq.ClassBestEffortAtomic, "train", 2, nil)
	sc.condition("fits", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "2 new nodes", time.Minute)
	if got := sc.capacity(gpu); got != 2 {
		t.Fatalf("capacity %d, want 2: the request within the quota's", got)
	}
	if n := sc.eventsWith(provreq.ReasonExceedsQuota, "ResourceQuota team-gpus"); n < 1 {
		t.Fatal("no ExceedsResourceQuota event on the refused request")
	}
}

// tenantCheckCapacityBuysNothing: a check-capacity request books the 2
// ready nodes; the scheduler, which does not see bookings, gives them to
// 2 ordinary pods at once; 2 more ordinary pods then buy exactly 2 nodes.
// The booking, having lost its room, ends (BookingExpired,
// CapacityBookingLost) and never holds the nodes coming for the ordinary
// pods. Before, its pods moved onto those coming nodes and the pods
// waiting for them bought 2 more (capacity 6, not 4).
func tenantCheckCapacityBuysNothing(t *testing.T) {
	sc := provreqScenario(t)
	gpu, as := sc.provreqAutoscaler(2)
	sc.podTemplate("train", gpu)
	sc.eventually("2 ready nodes advertising their GPUs", 2*time.Minute, readyGPUNodes(sc, gpu, 2))
	sc.createRequest("check", provreq.ClassCheckCapacity, "train", 2, nil)
	sc.condition("check", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "its 2 pods fit on ready nodes", 2*time.Minute)
	for i := 0; i < 4; i++ {
		p := &apiv1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%d", i), Namespace: sc.ns}, Spec: gpuPodSpec(gpu)}
		if _, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Create(sc.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sc.eventually("the 4 ordinary pods Running", 4*time.Minute, allRunning(sc, 4))
	sc.stays(gpu, 4, as, 5)
	sc.condition("check", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonBookingLost, "fit on no ready node", time.Minute)
}

// readyGPUNodes says n nodes of set are ready capacity: their GPUs
// advertised, no taint but PreferNoSchedule.
func readyGPUNodes(sc *scenario, set string, n int) func() (bool, string) {
	return func() (bool, string) {
		ready := 0
		var state []string
		for _, node := range sc.nodeList(set) {
			q := node.Status.Allocatable[armsim.GPUResource]
			blocked := false
			for _, taint := range node.Spec.Taints {
				blocked = blocked || taint.Effect != apiv1.TaintEffectPreferNoSchedule
			}
			if q.Value() == 8 && !blocked {
				ready++
			}
			state = append(state, fmt.Sprintf("%s: %d GPUs, taints %v", node.Name, q.Value(), node.Spec.Taints))
		}
		return ready == n, fmt.Sprint(state)
	}
}
