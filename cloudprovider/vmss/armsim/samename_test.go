package armsim

import (
	"context"
	"strings"
	"testing"
)

// TestComputerNamePrefix: two scale sets named gpu in two resource groups
// get the computer names (and node names) of their prefixes, as AKS gives
// each node pool's scale set a prefix of its own; the scale set serves its
// prefix as ARM does; without one, it is the scale set's name; a prefix
// ARM refuses is refused.
func TestComputerNamePrefix(t *testing.T) {
	hook := newRecordingHook()
	env := newTestEnv(t, Options{Hook: hook},
		ScaleSetSpec{ResourceGroup: "rg-a", Name: "gpu", SKU: "Standard_D16s_v5", Capacity: 1, ComputerNamePrefix: "aks-gpu-1234-vmss"},
		ScaleSetSpec{ResourceGroup: "rg-b", Name: "gpu", SKU: "Standard_D16s_v5", Capacity: 1, ComputerNamePrefix: "aks-gpu-5678-vmss", Flexible: true},
		ScaleSetSpec{ResourceGroup: "rg-b", Name: "cpu", SKU: "Standard_D16s_v5", Capacity: 1})
	ctx := context.Background()
	env.srv.Advance(ctx)
	for _, tc := range []struct{ rg, name, prefix string }{
		{"rg-a", "gpu", "aks-gpu-1234-vmss"}, {"rg-b", "gpu", "aks-gpu-5678-vmss"}, {"rg-b", "cpu", "cpu"},
	} {
		st, err := env.srv.ScaleSet(tc.rg, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.VMs[0].ComputerName; len(got) != len(tc.prefix)+6 || !strings.HasPrefix(got, tc.prefix) {
			t.Errorf("%s/%s: computer name %q, want %s and 6 characters", tc.rg, tc.name, got, tc.prefix)
		}
		set, err := env.sets.Get(ctx, tc.rg, tc.name, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := *set.Properties.VirtualMachineProfile.OSProfile.ComputerNamePrefix; got != tc.prefix {
			t.Errorf("%s/%s: computerNamePrefix %q, want %q", tc.rg, tc.name, got, tc.prefix)
		}
	}
	running, _ := hook.snapshot()
	if len(running) != 3 {
		t.Fatalf("nodes registered for %v, want 3", running)
	}
	if st, _ := env.srv.ScaleSet("rg-a", "gpu"); st.VMs[0].ComputerName != "aks-gpu-1234-vmss000000" {
		t.Errorf("Uniform computer name %q, want aks-gpu-1234-vmss000000 (the instance ID in base 36)", st.VMs[0].ComputerName)
	}
	for _, bad := range []string{"-gpu", "gpu-", "gpu_a", strings.Repeat("a", 59)} {
		err := env.srv.AddScaleSet(ScaleSetSpec{ResourceGroup: "rg-c", Name: "x", SKU: "Standard_D16s_v5", ComputerNamePrefix: bad})
		if err == nil || !strings.Contains(err.Error(), "computer name prefix") {
			t.Errorf("prefix %q: %v, want it refused", bad, err)
		}
	}
}
