package vmss

import (
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
)

// TestRefusedScaleSetSettings: settings whose behaviour the provider does
// not model refuse the scale set with a reason naming them; an AKS node
// pool's scale set is recognised by AKS's tags (the resource group's name,
// MC_* by default, is no sign and is not read).
func TestRefusedScaleSetSettings(t *testing.T) {
	for _, tc := range []struct {
		name       string
		set        armcompute.VirtualMachineScaleSet
		allowAKS   bool
		wantReason string // "" when managed
	}{
		{name: "plain", set: armcompute.VirtualMachineScaleSet{}},
		{name: "AKS pool tag", set: armcompute.VirtualMachineScaleSet{Tags: map[string]*string{"aks-managed-poolName": to.Ptr("gpu")}},
			wantReason: "aks-managed"},
		{name: "AKS tag in another case", set: armcompute.VirtualMachineScaleSet{Tags: map[string]*string{"AKS-Managed-createOperationID": to.Ptr("x")}},
			wantReason: "aks-managed"},
		{name: "AKS pool with the flag", allowAKS: true, set: armcompute.VirtualMachineScaleSet{Tags: map[string]*string{"aks-managed-poolName": to.Ptr("gpu")}}},
		{name: "Spot restore", set: armcompute.VirtualMachineScaleSet{Properties: &armcompute.VirtualMachineScaleSetProperties{
			SpotRestorePolicy: &armcompute.SpotRestorePolicy{Enabled: to.Ptr(true)}}}, wantReason: "spotRestorePolicy"},
		{name: "Spot restore off", set: armcompute.VirtualMachineScaleSet{Properties: &armcompute.VirtualMachineScaleSetProperties{
			SpotRestorePolicy: &armcompute.SpotRestorePolicy{Enabled: to.Ptr(false)}}}},
		{name: "priority mix", set: armcompute.VirtualMachineScaleSet{Properties: &armcompute.VirtualMachineScaleSetProperties{
			PriorityMixPolicy: &armcompute.PriorityMixPolicy{BaseRegularPriorityCount: to.Ptr[int32](1)}}}, wantReason: "priorityMixPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Provider{cfg: Config{AllowAKSManaged: tc.allowAKS}}
			got := p.refusal(&tc.set)
			if tc.wantReason == "" && got != "" {
				t.Fatalf("refused: %s; want managed", got)
			}
			if tc.wantReason != "" && !strings.Contains(got, tc.wantReason) {
				t.Fatalf("refusal %q; want one naming %q", got, tc.wantReason)
			}
		})
	}
}
