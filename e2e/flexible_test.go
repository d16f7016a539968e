package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// A Flexible scale set of 8-GPU machines goes from 0 to 8 for the demo's
// training gang (8 pods of 8 GPUs, PodGroup minCount 8) and back to 0
// once the gang is gone. Its VMs are virtual machines of their own, listed
// through the Virtual Machines API; their nodes carry the provider IDs
// cloud-provider-azure writes (.../virtualMachines/<name>, no scale set,
// resource group lower-cased), found through the provider's cache.
func TestFlexibleScaleFromZeroAndBack(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	gpu := sc.prefix + "-gpu"
	if err := sc.s.sim.AddScaleSet(armsim.ScaleSetSpec{ResourceGroup: sc.rg, Name: gpu, SKU: "Standard_ND96isr_H100_v5",
		Zones: []string{"1"}, Flexible: true}); err != nil {
		t.Fatal(err)
	}
	sc.sets = append(sc.sets, gpu)
	as := sc.autoscaler("autoscaler", fastScaleDown("--nodes=0:8:"+gpu,
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	sc.gang("train", 8, gpu)
	sc.eventually("8 gang pods Running", 3*time.Minute, allRunning(sc, 8))
	if got := sc.capacity(gpu); got != 8 {
		t.Fatalf("capacity %d, want 8", got)
	}
	wantPrefix := "azure:///subscriptions/" + subscription + "/resourceGroups/" + strings.ToLower(sc.rg) +
		"/providers/Microsoft.Compute/virtualMachines/" + gpu + "_"
	for _, n := range sc.nodeList(gpu) {
		if !strings.HasPrefix(n.Spec.ProviderID, wantPrefix) {
			t.Fatalf("node %s has provider ID %s, want one starting %s", n.Name, n.Spec.ProviderID, wantPrefix)
		}
	}
	sc.exported(as,
		`vmss_autoscaler_nodes{node_group="`+gpu+`",state="ready"} 8`,
		`vmss_autoscaler_arm_requests_total{code="200",operation="VirtualMachinesClient.NewListPager"}`)
	_, body := sc.get(as, "/metrics")
	if strings.Contains(body, `code="400",operation="VirtualMachineScaleSetVMsClient.NewListPager"`) {
		t.Fatal("the scale-set VM API was asked for a Flexible scale set's VMs")
	}

	if err := sc.s.cp.Client.AppsV1().Deployments(sc.ns).Delete(sc.ctx, "train", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sc.eventually("scale-down to 0", 3*time.Minute, func() (bool, string) {
		c := sc.capacity(gpu)
		return c == 0, fmt.Sprintf("capacity %d", c)
	})
	sc.registered(gpu, 0)
	sc.exported(as, `vmss_autoscaler_scaled_down_nodes_total{node_group="`+gpu+`",reason="empty"} 8`)
}
