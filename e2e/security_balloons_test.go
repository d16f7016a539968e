package e2e

import (
	"fmt"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
)

// restrictedNamespace creates a namespace whose Pod Security admission
// enforces "restricted", as the chart creates the balloon namespace: the
// binary refuses to start on a balloon namespace without it, and writes no
// balloon Deployment until it is there. Deleted when the test ends.
func (sc *scenario) restrictedNamespace(prefix string) string {
	sc.t.Helper()
	ns, err := sc.s.cp.NewNamespace(sc.ctx, prefix)
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.t.Cleanup(func() { _ = sc.s.cp.Client.CoreV1().Namespaces().Delete(sc.ctx, ns, metav1.DeleteOptions{}) })
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, balloon.PodSecurityEnforceLabel, balloon.PodSecurityRestricted)
	if _, err := sc.s.cp.Client.CoreV1().Namespaces().Patch(sc.ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		sc.t.Fatalf("labelling namespace %s restricted: %v", ns, err)
	}
	return ns
}

// A tenant dresses its own pod as a balloon (the balloon label naming the
// group, the controller's managed-by label) in its own namespace, at the
// default priority 0. Its node is not free room: a pending pod of the same
// priority that needs that room gets a new node (the scheduler would never
// preempt the lookalike for it). On the old code, where the balloon label
// alone made a balloon, the lookalike's room counted as free, no node was
// bought, and the pending pod starved.
func TestSecurityBalloonLookalikeIsNotFreeRoom(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, nil)
	sc.autoscaler("autoscaler", "--nodes=0:4:"+gpu, "--node-addition-adaptive=false")

	// The tenant's pod, a whole node, runs first as what it is.
	sc.workload("tenant", 1, "90", 8, gpu)
	sc.eventually("the tenant's pod Running on the one node bought for it", 2*time.Minute, func() (bool, string) {
		return sc.podPhases()[apiv1.PodRunning] == 1 && sc.capacity(gpu) == 1,
			fmt.Sprintf("pods %v, capacity %d", sc.podPhases(), sc.capacity(gpu))
	})
	// Then it is labelled as a balloon, as any tenant may label its pods.
	// The Deployment's selector is "app" alone: its ReplicaSet keeps the pod.
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=tenant"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("tenant pods: %d, %v", len(pods.Items), err)
	}
	o := balloon.DefaultOptions()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q,%q:%q}}}`, o.Label, gpu, o.ManagedByLabel, o.ManagedByValue)
	lookalike, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Patch(sc.ctx, pods.Items[0].Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("labelling the tenant's pod as a balloon: %v", err)
	}
	if p := lookalike.Spec.Priority; p != nil && *p != 0 {
		t.Fatalf("the lookalike's priority is %d, want 0 (no PriorityClass): the scheduler must not preempt it", *p)
	}

	// Another tenant's pod needs that room: a node is bought for it.
	sc.workload("victim", 1, "90", 8, gpu)
	sc.eventually("a node bought for the pending pod (the lookalike's room is not free) and both pods Running", 90*time.Second, func() (bool, string) {
		ph, c := sc.podPhases(), sc.capacity(gpu)
		return ph[apiv1.PodRunning] == 2 && c == 2, fmt.Sprintf("pods %v, capacity %d", ph, c)
	})
	// The lookalike was never evicted or displaced: it is the same pod.
	if p, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, lookalike.Name, metav1.GetOptions{}); err != nil || p.UID != lookalike.UID || p.DeletionTimestamp != nil {
		t.Fatalf("the lookalike %s: %v (deleting %v)", lookalike.Name, err, p != nil && p.DeletionTimestamp != nil)
	}
}
