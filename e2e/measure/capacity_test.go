package measure

import (
	"testing"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

func TestPodsPerNode(t *testing.T) {
	hook := &armsim.KubeNodeHook{Realism: armsim.DefaultRealism()}
	pod := func(cpu, memory string) apiv1.ResourceRequirements {
		return apiv1.ResourceRequirements{Requests: apiv1.ResourceList{
			apiv1.ResourceCPU: resource.MustParse(cpu), apiv1.ResourceMemory: resource.MustParse(memory)}}
	}
	// scale's gang pod: a whole 8-GPU node.
	eight := *resource.NewQuantity(8, resource.DecimalSI)
	trainer := apiv1.ResourceRequirements{
		Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("80"), apiv1.ResourceMemory: resource.MustParse("800Gi"), armsim.GPUResource: eight},
		Limits:   apiv1.ResourceList{armsim.GPUResource: eight},
	}
	gpuOnly := apiv1.ResourceRequirements{Requests: apiv1.ResourceList{armsim.GPUResource: eight}}
	for _, tc := range []struct {
		name     string
		sku      string
		res      apiv1.ResourceRequirements
		min, max int
		wantErr  string
	}{
		// 16 cores less AKS's kube-reserved hold fewer than 32 half-core pods.
		{"scale's ci burst pods", "Standard_D16s_v5", pod("500m", "1Gi"), 25, 31, ""},
		{"scale's full burst pods", "Standard_D16s_v5", pod("3500m", "1Gi"), 4, 4, ""},
		// GPUs are advertised after registration, yet a node holds one trainer.
		{"scale's trainers", "Standard_ND96isr_H100_v5", trainer, 1, 1, ""},
		// 64 cores less kube-reserved hold fewer than 32 pods of 2 cores.
		{"peer's pods", "Standard_D64s_v5", pod("2", "2Gi"), 25, 31, ""},
		{"no requests: max pods", "Standard_D16s_v5", apiv1.ResourceRequirements{}, 30, 250, ""},
		{"unknown SKU", "Standard_Nope", pod("500m", "1Gi"), 0, 0, "Standard_Nope"},
		{"GPUs a SKU has none of", "Standard_D16s_v5", gpuOnly, 0, 0, "has no nvidia.com/gpu"},
		{"too large", "Standard_D16s_v5", pod("17", "1Gi"), 0, 0, "does not fit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PodsPerNode(hook, tc.sku, tc.res)
			if wantedErr(t, err, tc.wantErr) {
				return
			}
			if got < tc.min || got > tc.max {
				t.Errorf("%d pods per %s node, want %d to %d", got, tc.sku, tc.min, tc.max)
			}
		})
	}
}
