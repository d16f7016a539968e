package vmss

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// flexSet is a Flexible scale set of H100 VMs in resource group rg.
func flexSet(name string, capacity int, tags map[string]string) armsim.ScaleSetSpec {
	s := gpuSet(name, capacity, tags)
	s.Flexible = true
	return s
}

// node is a Node with the provider ID.
func node(providerID string) *apiv1.Node {
	return &apiv1.Node{Spec: apiv1.NodeSpec{ProviderID: providerID}}
}

// TestFlexibleScaleSetIsANodeGroup: a discovered Flexible scale set is a
// node group beside a Uniform one, listed at the same cost (one VM list
// each), its nodes found through the cache in every spelling of their
// provider ID and never from the ID alone.
func TestFlexibleScaleSetIsANodeGroup(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{
		flexSet("flex", 3, discoveredTags(0, 20)),
		gpuSet("uniform", 2, discoveredTags(0, 20)),
	}, withDiscovery(discoverySpec))
	f.sim.ResetCalls()
	f.refresh()
	if c := nonZero(f.sim.Calls()); c[armsim.OpListVirtualMachines] != 1 || c[armsim.OpListVMs] != 1 || c[armsim.OpListScaleSets] != 1 ||
		c[armsim.OpGetScaleSet]+c[armsim.OpGetVM] != 0 {
		t.Fatalf("refresh made %v; want one scale-set list and one VM list per scale set, no GETs", c)
	}
	g := f.group("flex")
	if n, err := g.TargetSize(); err != nil || n != 3 {
		t.Fatalf("TargetSize = %d, %v; want 3", n, err)
	}
	st, err := f.sim.ScaleSet("rg", "flex")
	if err != nil {
		t.Fatal(err)
	}
	ins, _ := g.Instances()
	if len(ins) != 3 {
		t.Fatalf("instances %+v, want 3", ins)
	}
	for i, in := range ins {
		if in.ProviderID != st.VMs[i].ProviderID || in.State != cloudprovider.InstanceRunning ||
			!strings.Contains(in.ProviderID, "/providers/Microsoft.Compute/virtualMachines/flex_") {
			t.Fatalf("instance %+v, want %s running", in, st.VMs[i].ProviderID)
		}
		for _, spelling := range []string{
			in.ProviderID,                         // as ARM lists it
			armsim.AzureProviderID(in.ProviderID), // as cloud-provider-azure writes it
			strings.Replace(in.ProviderID, "azure:///", "azure://", 1), // two slashes
			strings.ToUpper(in.ProviderID[:9]) + in.ProviderID[9:],
		} {
			if got, err := f.p.NodeGroupForNode(node(spelling)); err != nil || got == nil || got.ID() != "flex" {
				t.Fatalf("NodeGroupForNode(%s) = %v, %v; want flex", spelling, got, err)
			}
		}
	}
	for _, pid := range []string{
		// A VM the cache has not listed: no group until a refresh lists it.
		"azure:///subscriptions/" + sub + "/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/flex_00000000",
		// A Uniform-form ID naming the Flexible scale set is none of its VMs.
		"azure:///subscriptions/" + sub + "/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/flex/virtualMachines/3",
	} {
		if got, _ := f.p.NodeGroupForNode(node(pid)); got != nil {
			t.Fatalf("NodeGroupForNode(%s) = %s, want none", pid, got.ID())
		}
	}
	// A VM created since is found once a refresh lists it.
	if err := f.sim.SetCapacity("rg", "flex", 4); err != nil {
		t.Fatal(err)
	}
	st, _ = f.sim.ScaleSet("rg", "flex")
	added := st.VMs[3].ProviderID
	if got, _ := f.p.NodeGroupForNode(node(added)); got != nil {
		t.Fatalf("a VM not listed yet has group %s", got.ID())
	}
	f.expire()
	f.refresh()
	if got, _ := f.p.NodeGroupForNode(node(armsim.AzureProviderID(added))); got == nil || got.ID() != "flex" {
		t.Fatalf("NodeGroupForNode(%s) after the refresh = %v, want flex", added, got)
	}
}

// TestFlexibleScaleUpAndDeleteByName: scale-up is the same capacity
// update; deletion is one DeleteInstances call with the VMs' names; a VM
// the group's list does not have is refused before anything is sent.
func TestFlexibleScaleUpAndDeleteByName(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{flexSet("flex", 2, nil), flexSet("other", 1, nil)}, withNodes("1:10:flex", "0:5:other"))
	f.refresh()
	g := f.group("flex")
	if err := g.IncreaseSize(f.ctx, 3); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.sim.ScaleSet("rg", "flex"); st.Capacity != 5 {
		t.Fatalf("ARM capacity %d, want 5", st.Capacity)
	}
	f.sim.Advance(f.ctx)
	f.expire()
	f.refresh()
	ins, _ := g.Instances()
	if len(ins) != 5 {
		t.Fatalf("instances %+v, want 5", ins)
	}
	otherIns, _ := f.group("other").Instances()
	refused := map[string]string{
		"another Flexible scale set's VM": otherIns[0].ProviderID,
		"a VM the list does not have":     "azure:///subscriptions/" + sub + "/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/flex_ffffffff",
		"a Uniform-form ID":               "azure:///subscriptions/" + sub + "/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/flex/virtualMachines/0",
	}
	f.sim.ResetCalls()
	for what, pid := range refused {
		if err := g.DeleteNodes(f.ctx, []string{ins[0].ProviderID, pid}); !errors.Is(err, cloudprovider.ErrNotSent) || !strings.Contains(err.Error(), "does not belong") {
			t.Fatalf("deleting %s: %v; want refused, not sent", what, err)
		}
	}
	if w := f.sim.Writes(); len(w) != 0 {
		t.Fatalf("refused deletions wrote %+v", w)
	}
	// The node's spelling of the provider ID is enough.
	victims := []string{armsim.AzureProviderID(ins[0].ProviderID), ins[1].ProviderID}
	if err := g.DeleteNodes(f.ctx, victims); err != nil {
		t.Fatal(err)
	}
	if c := f.sim.Calls(); c[armsim.OpDeleteInstances] != 1 {
		t.Fatalf("calls %v, want one DeleteInstances", c)
	}
	st, _ := f.sim.ScaleSet("rg", "flex")
	deletingARM := map[string]bool{}
	for _, vm := range st.VMs {
		if vm.State == armsim.StateDeleting {
			deletingARM[vm.ProviderID] = true
		}
	}
	if len(deletingARM) != 2 || !deletingARM[ins[0].ProviderID] || !deletingARM[ins[1].ProviderID] {
		t.Fatalf("ARM deleting %v, want %s and %s", deletingARM, ins[0].ProviderID, ins[1].ProviderID)
	}
	after, _ := g.Instances()
	for _, in := range after[:2] {
		if in.State != cloudprovider.InstanceDeleting {
			t.Fatalf("instance %+v not deleting at once", in)
		}
	}
	if n, _ := g.TargetSize(); n != 3 {
		t.Fatalf("target after delete %d, want 3", n)
	}
	if err := g.DeleteNodes(f.ctx, []string{after[2].ProviderID, after[3].ProviderID, after[4].ProviderID}); !errors.Is(err, cloudprovider.ErrNotSent) ||
		!strings.Contains(err.Error(), "below its min") {
		t.Fatalf("delete below min: %v", err)
	}
}

// TestFlexibleFailedStates: a Flexible VM's failure is read from its
// provisioning state and power state as a Uniform one's: failed to come
// up is an instance error; failed while it runs is not.
func TestFlexibleFailedStates(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{flexSet("flex", 1, nil)}, withNodes("0:10:flex"))
	f.refresh()
	if err := f.sim.InjectFault("rg", "flex", armsim.Fault{Kind: armsim.FaultAllocation}); err != nil {
		t.Fatal(err)
	}
	g := f.group("flex")
	if err := g.IncreaseSize(f.ctx, 2); err != nil {
		t.Fatal(err)
	}
	f.sim.Advance(f.ctx)
	st, _ := f.sim.ScaleSet("rg", "flex")
	if err := f.sim.FailRunningVM("rg", "flex", st.VMs[0].InstanceID, ""); err != nil {
		t.Fatal(err)
	}
	f.expire()
	f.refresh()
	ins, _ := g.Instances()
	failed, failedRunning := 0, 0
	for _, in := range ins {
		switch {
		case in.Error != nil && in.Error.Code == armsim.CodeAllocationFailed && in.Error.Class == cloudprovider.ClassOutOfCapacity:
			failed++
		case in.FailedRunning != nil && in.FailedRunning.Code == armsim.CodeVMExtensionProvisioningError && in.State == cloudprovider.InstanceRunning && in.Error == nil:
			failedRunning++
		}
	}
	if failed != 2 || failedRunning != 1 {
		t.Fatalf("instances %+v: want 2 failed to allocate and 1 failed while running", ins)
	}
	eventually(t, "the failed operation to be counted", func() bool {
		return testutil.ToFloat64(f.p.metrics.lroFailures.WithLabelValues("flex", armsim.CodeAllocationFailed)) == 1
	})
}

// TestThrottledVMListKeepsSizesOfEitherMode: a 429 on a VM list with a
// 20-minute Retry-After (HighCostGetVMScaleSet30Min) holds back VM lists
// only: the size stays known from the scale-set list, the instances are
// the last list's (InstancesAge names why), and a scale-up goes out.
// Before, any 429 held every read and left every size unknown.
func TestThrottledVMListKeepsSizesOfEitherMode(t *testing.T) {
	for _, mode := range []struct {
		name string
		spec armsim.ScaleSetSpec
	}{
		{"uniform", gpuSet("gpu", 2, nil)},
		{"flexible", flexSet("gpu", 2, nil)},
	} {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t, []armsim.ScaleSetSpec{mode.spec}, withNodes("0:10:gpu"))
			f.refresh()
			f.sim.ThrottlePolicy(armsim.PolicyHighCostGetVMScaleSet30Min, "", 20*time.Minute)
			f.clock.Step(6 * time.Minute) // the VM list is due again
			f.refresh()
			f.clock.Step(6 * time.Minute)
			f.refresh()
			g := f.group("gpu")
			size, err := g.TargetSize()
			if err != nil || size != 2 {
				t.Fatalf("TargetSize after a throttled VM list: %d, %v; want 2 from the scale-set list", size, err)
			}
			if ins, _ := g.Instances(); len(ins) != 2 {
				t.Fatalf("instances %v, want the last list's 2", ins)
			}
			if _, why := g.(cloudprovider.InstancesAged).InstancesAge(f.clock.Now()); why == "" {
				t.Fatal("InstancesAge names no failed list")
			}
			if err := g.IncreaseSize(f.ctx, 1); err != nil {
				t.Fatalf("scale-up while VM lists are throttled: %v", err)
			}
		})
	}
}

// TestDeleteOfAVMNewerThanTheThrottledListIsSent: a VM that joined after
// the scale set's last VM list, while VM lists are throttled for 20
// minutes, is read by a GET of its own and deleted; one ARM does not have
// (404) is dropped as gone, and nothing is refused. Before, the call was
// refused unsent ("not in its last VM list yet") until a list came, up
// to 30 minutes, leaving a broken 8-GPU node undeletable.
func TestDeleteOfAVMNewerThanTheThrottledListIsSent(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("0:10:gpu"))
	f.sim.Advance(f.ctx)
	f.refresh()
	g := f.p.groups[setKey("rg", "gpu")]
	if err := f.sim.SetCapacity("rg", "gpu", 3); err != nil { // a VM the list has not seen
		t.Fatal(err)
	}
	f.sim.Advance(f.ctx)
	f.sim.ThrottlePolicy(armsim.PolicyHighCostGetVMScaleSet30Min, "", 20*time.Minute)
	f.clock.Step(6 * time.Minute) // the VM list is due again: throttled
	f.sim.Advance(f.ctx)
	f.refresh()
	if ins, _ := g.Instances(); len(ins) != 2 {
		t.Fatalf("instances %v, want the last list's 2", ins)
	}
	st, _ := f.sim.ScaleSet("rg", "gpu")
	newest := ""
	for _, vm := range st.VMs {
		if vm.InstanceID == "2" {
			newest = vm.ProviderID
		}
	}
	if newest == "" {
		t.Fatalf("no VM 2 in %+v", st.VMs)
	}
	never := strings.TrimSuffix(newest, "/2") + "/7" // newer than the list; ARM has none
	if err := g.DeleteNodes(f.ctx, []string{newest, never}); err != nil {
		t.Fatalf("DeleteNodes of a VM newer than a throttled list: %v", err)
	}
	if got, want := f.providerDeletes(), []string{"[2]:202"}; !slices.Equal(got, want) {
		t.Fatalf("deletions sent %v, want %v", got, want)
	}
	if s := states(t, g)["2"]; s != "deleting" {
		t.Fatalf("VM 2 %q after its deletion, want deleting", s)
	}
	if n, err := g.TargetSize(); err != nil || n != 2 {
		t.Fatalf("TargetSize after deleting 1 of 3: %d, %v; want 2", n, err)
	}
	if c := f.sim.Calls()[armsim.OpGetVM]; c != 2 {
		t.Fatalf("%d VM GETs, want 2 (one per VM the list lacks)", c)
	}
}
