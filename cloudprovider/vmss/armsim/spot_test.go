package armsim

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	v1 "k8s.io/api/core/v1"
)

// spotWatchingHook is a recordingHook that is also a DeletionWatcher.
type spotWatchingHook struct {
	*recordingHook
	mu       sync.Mutex
	deleting []VM
}

func (h *spotWatchingHook) VMsDeleting(_ context.Context, vms []VM) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deleting = append(h.deleting, vms...)
}

func spotSpec(name string, capacity int, policy string, flexible bool) ScaleSetSpec {
	return ScaleSetSpec{ResourceGroup: testRG, Name: name, SKU: "Standard_ND96isr_H100_v5", Capacity: capacity,
		Spot: true, EvictionPolicy: policy, Flexible: flexible}
}

// TestSpotScaleSetServedAsARMDoes: priority Spot, the eviction policy
// (Deallocate when none is given, as ARM), maxPrice -1; the specs ARM
// refuses.
func TestSpotScaleSetServedAsARMDoes(t *testing.T) {
	env := newTestEnv(t, Options{}, spotSpec("spot", 1, "", false), spotSpec("flex", 1, EvictionDelete, true))
	ctx := context.Background()
	for name, want := range map[string]armcompute.VirtualMachineEvictionPolicyTypes{"spot": "Deallocate", "flex": "Delete"} {
		got, err := env.sets.Get(ctx, testRG, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		vp := got.Properties.VirtualMachineProfile
		if vp.Priority == nil || *vp.Priority != armcompute.VirtualMachinePriorityTypesSpot || vp.EvictionPolicy == nil || *vp.EvictionPolicy != want ||
			vp.BillingProfile == nil || *vp.BillingProfile.MaxPrice != -1 {
			t.Fatalf("%s: priority %v, eviction policy %v, billing %+v; want Spot, %s, maxPrice -1", name, vp.Priority, vp.EvictionPolicy, vp.BillingProfile, want)
		}
	}
	vms, err := env.listFlexible(ctx, t, testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf(testRG, "flex"))})
	if err != nil || len(vms) != 1 || *vms[0].Properties.Priority != armcompute.VirtualMachinePriorityTypesSpot {
		t.Fatalf("Flexible Spot VMs %v, %v; want one of priority Spot", vms, err)
	}
	for _, spec := range []ScaleSetSpec{
		{ResourceGroup: testRG, Name: "regular", SKU: "Standard_D16s_v5", EvictionPolicy: EvictionDelete},
		{ResourceGroup: testRG, Name: "bad", SKU: "Standard_D16s_v5", Spot: true, EvictionPolicy: "Hibernate"},
	} {
		if err := env.srv.AddScaleSet(spec); err == nil || !strings.Contains(err.Error(), "eviction policy") {
			t.Fatalf("AddScaleSet(%+v): %v, want the eviction policy refused", spec, err)
		}
	}
}

// TestSpotEviction: evicted VMs, after their notice, are deleted (the
// capacity drops by itself) or deallocated (they stay in the capacity),
// their nodes go either way, no DeletionWatcher hears of it, and a
// deallocated VM deleted later is not reported gone twice.
func TestSpotEviction(t *testing.T) {
	for _, tc := range []struct {
		policy       string
		flexible     bool
		wantCapacity int
		wantState    string
	}{
		{EvictionDelete, false, 2, StateDeleting},
		{EvictionDelete, true, 2, StateDeleting},
		{EvictionDeallocate, false, 4, StateDeallocated},
		{EvictionDeallocate, true, 4, StateDeallocated},
	} {
		t.Run(tc.policy+map[bool]string{true: "/flexible", false: "/uniform"}[tc.flexible], func(t *testing.T) {
			hook := &spotWatchingHook{recordingHook: newRecordingHook()}
			env := newTestEnv(t, Options{Hook: hook, DeleteDelay: time.Minute}, spotSpec("spot", 4, tc.policy, tc.flexible))
			ctx := context.Background()
			env.srv.Advance(ctx)
			before := env.state(t, "spot")
			victims := []string{before.VMs[1].InstanceID, before.VMs[3].InstanceID}
			if err := env.srv.EvictSpotVMs(testRG, "spot", 30*time.Second, victims...); err != nil {
				t.Fatal(err)
			}
			if err := env.srv.EvictSpotVMs(testRG, "spot", 0, victims[0]); err == nil {
				t.Fatal("a VM given notice twice")
			}
			env.clock.Step(29 * time.Second)
			env.srv.Advance(ctx)
			st := env.state(t, "spot")
			if st.Capacity != 4 || vmStates(st)[victims[0]] != StateRunning || st.VMs[1].EvictAt.IsZero() {
				t.Fatalf("before the notice is over: %+v; want all 4 running, the victims with EvictAt", st)
			}
			env.clock.Step(time.Second)
			env.srv.Advance(ctx)
			st = env.state(t, "spot")
			states := vmStates(st)
			if st.Capacity != tc.wantCapacity || st.ETag == before.ETag || states[victims[0]] != tc.wantState || states[victims[1]] != tc.wantState ||
				states[before.VMs[0].InstanceID] != StateRunning {
				t.Fatalf("after the eviction: %+v; want capacity %d, the victims %s", st, tc.wantCapacity, tc.wantState)
			}
			_, deleted := hook.snapshot()
			if tc.policy == EvictionDeallocate {
				if len(deleted) != 2 || st.VMs[1].PowerState != "deallocated" {
					t.Fatalf("deallocated: nodes removed %v, power state %q; want both nodes gone at once and deallocated", deleted, st.VMs[1].PowerState)
				}
				// Deleting a deallocated VM later: its node is not removed again.
				if _, err := env.sets.BeginDeleteInstances(ctx, testRG, "spot",
					armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: to.SliceOfPtrs(victims...)}, nil); err != nil {
					t.Fatal(err)
				}
			} else if len(deleted) != 0 {
				t.Fatalf("nodes removed before the VMs are gone: %v", deleted)
			}
			env.clock.Step(time.Minute)
			env.srv.Advance(ctx)
			st = env.state(t, "spot")
			if len(st.VMs) != 2 || st.Capacity != 2 {
				t.Fatalf("in the end: %+v; want the 2 others", st)
			}
			if _, deleted := hook.snapshot(); len(deleted) != 2 {
				t.Fatalf("nodes removed %v, want each victim's once", deleted)
			}
			hook.mu.Lock()
			defer hook.mu.Unlock()
			if tc.policy == EvictionDelete && len(hook.deleting) != 0 {
				t.Fatalf("the DeletionWatcher heard of an eviction: %+v", hook.deleting)
			}
			if tc.policy == EvictionDeallocate {
				// The deletion of the deallocated VMs is a request the
				// watcher hears of, told that nothing ran on them.
				if len(hook.deleting) != 2 || !hook.deleting[0].Deallocated || !hook.deleting[1].Deallocated {
					t.Fatalf("the DeletionWatcher heard %+v, want the 2 deallocated VMs, said deallocated", hook.deleting)
				}
				w := env.srv.Writes()
				if len(w) != 1 || w[0].Op != OpDeleteInstances || !slices.Equal(w[0].InstanceIDs, victims) {
					t.Fatalf("writes %+v, want one DeleteInstances naming %v", w, victims)
				}
			}
		})
	}
}

// TestEvictSpotVMsRefuses: no eviction of a regular scale set's VMs, of
// VMs that do not run, or with a negative notice.
func TestEvictSpotVMsRefuses(t *testing.T) {
	env := newTestEnv(t, Options{BootDelay: time.Minute},
		spotSpec("spot", 0, EvictionDelete, false), ScaleSetSpec{ResourceGroup: testRG, Name: "regular", SKU: "Standard_D16s_v5", Capacity: 1})
	if _, err := env.scaleTo(context.Background(), "spot", 1, nil); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"a regular scale set": env.srv.EvictSpotVMs(testRG, "regular", 0, "0"),
		"a VM still creating": env.srv.EvictSpotVMs(testRG, "spot", 0, "0"),
		"no such VM":          env.srv.EvictSpotVMs(testRG, "spot", 0, "7"),
		"a negative notice":   env.srv.EvictSpotVMs(testRG, "spot", -time.Second, "0"),
	} {
		if err == nil {
			t.Errorf("evicting %s accepted", what)
		}
	}
}

// TestKubeNodeHookSpotNode: a Spot VM's node carries AKS's Spot label and
// taint.
func TestKubeNodeHookSpotNode(t *testing.T) {
	hook := &KubeNodeHook{}
	vm := VM{ResourceGroup: "rg", ScaleSet: "spot", ComputerName: "spot000000", SKU: DefaultSKUs()[0], Location: "eastus", Spot: true,
		ProviderID: "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/spot/virtualMachines/0"}
	n := hook.Node(vm)
	want := v1.Taint{Key: "kubernetes.azure.com/scalesetpriority", Value: "spot", Effect: v1.TaintEffectNoSchedule}
	if n.Labels["kubernetes.azure.com/scalesetpriority"] != "spot" || !slices.Contains(n.Spec.Taints, want) {
		t.Fatalf("Spot node labels %v, taints %v; want the scalesetpriority=spot label and taint", n.Labels, n.Spec.Taints)
	}
	vm.Spot = false
	if n := hook.Node(vm); n.Labels["kubernetes.azure.com/scalesetpriority"] != "" || len(n.Spec.Taints) != 0 {
		t.Fatalf("regular node labels %v, taints %v", n.Labels, n.Spec.Taints)
	}
}
