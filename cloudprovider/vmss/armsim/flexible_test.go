package armsim

import (
	"context"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// Azure's names of a Flexible scale set's VMs: "<set>_<8 hex digits>"
// and computer name "<set><6 of [0-9a-z]>".
var (
	flexVMName       = regexp.MustCompile(`^flex_[0-9a-f]{8}$`)
	flexComputerName = regexp.MustCompile(`^flex[0-9a-z]{6}$`)
)

func flexSpec(name string, capacity int) ScaleSetSpec {
	return ScaleSetSpec{ResourceGroup: testRG, Name: name, SKU: "Standard_ND96isr_H100_v5", Capacity: capacity, Flexible: true, Zones: []string{"1"}}
}

// scaleSetFilterOf is the filter the Virtual Machines List API takes for
// a scale set, as cloud-provider-azure and the CLI write it.
func scaleSetFilterOf(rg, name string) string {
	return "'virtualMachineScaleSet/id' eq '/subscriptions/" + testSub + "/resourceGroups/" + rg +
		"/providers/Microsoft.Compute/virtualMachineScaleSets/" + name + "'"
}

// listFlexible lists through the real client; it returns the VMs and the
// pages' last raw answer.
func (e *testEnv) listFlexible(ctx context.Context, t *testing.T, rg string, opts *armcompute.VirtualMachinesClientListOptions) ([]*armcompute.VirtualMachine, error) {
	t.Helper()
	var out []*armcompute.VirtualMachine
	pager := e.virtualMachines.NewListPager(rg, opts)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return out, err
		}
		out = append(out, page.Value...)
	}
	return out, nil
}

func instanceView() *armcompute.ExpandTypeForListVMs {
	return to.Ptr(armcompute.ExpandTypeForListVMsInstanceView)
}

// TestFlexibleScaleSetServedAsARMDoes: a Flexible scale set, its VMs as
// virtual machines of their own through the Virtual Machines API with the
// scale-set filter and the instance view.
func TestFlexibleScaleSetServedAsARMDoes(t *testing.T) {
	env := newTestEnv(t, Options{}, flexSpec("flex", 3))
	ctx := context.Background()
	env.srv.Advance(ctx)
	got, err := env.sets.Get(ctx, testRG, "flex", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Properties.OrchestrationMode == nil || *got.Properties.OrchestrationMode != armcompute.OrchestrationModeFlexible ||
		*got.SKU.Capacity != 3 || got.Properties.SinglePlacementGroup != nil || got.Properties.Overprovision != nil {
		t.Fatalf("scale set %+v: want orchestrationMode Flexible, capacity 3, no placement group or overprovisioning", got.Properties)
	}
	vms, err := env.listFlexible(ctx, t, testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf(testRG, "flex")), Expand: instanceView()})
	if err != nil {
		t.Fatal(err)
	}
	st := env.state(t, "flex")
	if len(vms) != 3 || len(st.VMs) != 3 {
		t.Fatalf("listed %d VMs, state has %d; want 3", len(vms), len(st.VMs))
	}
	for i, vm := range vms {
		name := *vm.Name
		wantID := "/subscriptions/" + testSub + "/resourceGroups/" + testRG + "/providers/Microsoft.Compute/virtualMachines/" + name
		switch {
		case !flexVMName.MatchString(name):
			t.Errorf("VM name %q, want flex_<8 hex digits>", name)
		case *vm.ID != wantID || "azure://"+*vm.ID != st.VMs[i].ProviderID || st.VMs[i].InstanceID != name:
			t.Errorf("VM %d: ID %s, state %+v; want %s named by its VM name", i, *vm.ID, st.VMs[i], wantID)
		case !flexComputerName.MatchString(*vm.Properties.OSProfile.ComputerName) || *vm.Properties.OSProfile.ComputerName != st.VMs[i].ComputerName:
			t.Errorf("computer name %q (state %q), want flex<6 of [0-9a-z]>", *vm.Properties.OSProfile.ComputerName, st.VMs[i].ComputerName)
		case !strings.HasSuffix(*vm.Properties.VirtualMachineScaleSet.ID, "/virtualMachineScaleSets/flex"):
			t.Errorf("VM %s belongs to %s", name, *vm.Properties.VirtualMachineScaleSet.ID)
		case *vm.Properties.ProvisioningState != "Succeeded" || vm.Properties.InstanceView == nil ||
			!slices.ContainsFunc(vm.Properties.InstanceView.Statuses, func(s *armcompute.InstanceViewStatus) bool { return *s.Code == "PowerState/running" }):
			t.Errorf("VM %s: provisioning %s, instance view %+v; want Succeeded and PowerState/running", name, *vm.Properties.ProvisioningState, vm.Properties.InstanceView)
		}
	}
	// Without $expand, no instance view.
	plain, err := env.listFlexible(ctx, t, testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf(testRG, "flex"))})
	if err != nil || len(plain) != 3 || plain[0].Properties.InstanceView != nil {
		t.Fatalf("list without $expand: %d VMs, %v; want 3 without instance view", len(plain), err)
	}
}

// TestFlexibleVirtualMachinesListRules: what ARM answers each form of the
// Virtual Machines List API, and the scale-set VM API refusing a Flexible
// scale set.
func TestFlexibleVirtualMachinesListRules(t *testing.T) {
	env := newTestEnv(t, Options{},
		flexSpec("flex", 2), flexSpec("flex2", 1),
		ScaleSetSpec{ResourceGroup: testRG, Name: "uniform", SKU: "Standard_D16s_v5", Capacity: 2},
		ScaleSetSpec{ResourceGroup: "other", Name: "flex3", SKU: "Standard_D16s_v5", Capacity: 1, Flexible: true},
	)
	ctx := context.Background()
	tests := []struct {
		name       string
		rg         string
		opts       *armcompute.VirtualMachinesClientListOptions
		wantVMs    int
		wantStatus int
		wantCode   string
		wantMsg    string
	}{
		{"one scale set with its instance view", testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf(testRG, "flex")), Expand: instanceView()}, 2, 0, "", ""},
		{"filter without quotes around the property", testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(strings.Replace(scaleSetFilterOf(testRG, "FLEX2"), "'virtualMachineScaleSet/id'", "virtualMachineScaleSet/id", 1))}, 1, 0, "", ""},
		{"every Flexible VM of the resource group", testRG, nil, 3, 0, "", ""},
		{"a Uniform scale set has no virtual machines of its own", testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf(testRG, "uniform")), Expand: instanceView()}, 0, 0, "", ""},
		{"a scale set of another resource group", testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf("other", "flex3"))}, 0, 0, "", ""},
		{"instance view without the filter", testRG, &armcompute.VirtualMachinesClientListOptions{Expand: instanceView()}, 0, http.StatusBadRequest, "InvalidParameter", "only be specified together with a valid '$filter'"},
		{"another expansion", testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf(testRG, "flex")), Expand: to.Ptr(armcompute.ExpandTypeForListVMs("userData"))}, 0, http.StatusBadRequest, "InvalidParameter", "'userData' of parameter '$expand'"},
		{"another filter", testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr("location eq 'eastus'")}, 0, http.StatusBadRequest, "InvalidParameter", "parameter '$filter' is not valid"},
		{"a filter naming no scale set", testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr("'virtualMachineScaleSet/id' eq '/subscriptions/x/resourceGroups/rg'")}, 0, http.StatusBadRequest, "InvalidParameter", "not a virtual machine scale set resource ID"},
		{"no such resource group", "nowhere", nil, 0, http.StatusNotFound, "ResourceGroupNotFound", "nowhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vms, err := env.listFlexible(ctx, t, tt.rg, tt.opts)
			if tt.wantStatus == 0 {
				if err != nil || len(vms) != tt.wantVMs {
					t.Fatalf("listed %d VMs, %v; want %d", len(vms), err, tt.wantVMs)
				}
				return
			}
			re := responseError(t, err)
			if re.StatusCode != tt.wantStatus || re.ErrorCode != tt.wantCode || !strings.Contains(re.Error(), tt.wantMsg) {
				t.Fatalf("got %d %s %v; want %d %s containing %q", re.StatusCode, re.ErrorCode, re, tt.wantStatus, tt.wantCode, tt.wantMsg)
			}
		})
	}

	// The scale-set VM API refuses a Flexible scale set, as ARM does.
	st := env.state(t, "flex")
	for name, call := range map[string]func() error{
		"list": func() error {
			_, err := env.vms.NewListPager(testRG, "flex", nil).NextPage(ctx)
			return err
		},
		"get": func() error {
			_, err := env.vms.Get(ctx, testRG, "flex", st.VMs[0].InstanceID, nil)
			return err
		},
	} {
		re := responseError(t, call())
		if re.StatusCode != http.StatusBadRequest || re.ErrorCode != "OperationNotAllowed" ||
			!strings.Contains(re.Error(), "Operation 'VirtualMachineScaleSets.virtualMachines.GET' is not allowed on Virtual Machine Scale Set 'flex'.") {
			t.Fatalf("scale-set VM %s of a Flexible scale set: %v; want 400 OperationNotAllowed", name, re)
		}
	}
}

// TestFlexibleScaleOutAndDeleteByName: capacity updates as for Uniform;
// DeleteInstances takes VM names (in any case), never instance numbers.
func TestFlexibleScaleOutAndDeleteByName(t *testing.T) {
	hook := newRecordingHook()
	env := newTestEnv(t, Options{Hook: hook, BootDelay: time.Minute}, flexSpec("flex", 1))
	ctx := context.Background()
	env.srv.Advance(ctx)
	if _, err := env.scaleTo(ctx, "flex", 4, nil); err != nil {
		t.Fatal(err)
	}
	st := env.state(t, "flex")
	if st.Capacity != 4 || len(st.VMs) != 4 {
		t.Fatalf("after scale-out: %+v, want 4 VMs", st)
	}
	names := map[string]bool{}
	for _, vm := range st.VMs {
		if names[vm.InstanceID] || !flexVMName.MatchString(vm.InstanceID) {
			t.Fatalf("VM names %v then %q: want distinct flex_<8 hex digits>", names, vm.InstanceID)
		}
		names[vm.InstanceID] = true
	}
	if states := vmStates(st); states[st.VMs[3].InstanceID] != StateCreating {
		t.Fatalf("new VM is %s, want Creating", states[st.VMs[3].InstanceID])
	}
	for _, bad := range []string{"0", "flex_00000000"} {
		_, err := env.sets.BeginDeleteInstances(ctx, testRG, "flex", armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr(bad)}}, nil)
		if re := responseError(t, err); re.StatusCode != http.StatusBadRequest || re.ErrorCode != "InvalidParameter" || !strings.Contains(re.Error(), bad) {
			t.Fatalf("deleting %q: %v; want 400 InvalidParameter naming it", bad, re)
		}
	}
	victim := st.VMs[0].InstanceID // the one that runs
	poller, err := env.sets.BeginDeleteInstances(ctx, testRG, "flex",
		armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr(strings.ToUpper(victim))}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := poller.PollUntilDone(ctx, pollOpts()); err != nil {
		t.Fatal(err)
	}
	if st := env.state(t, "flex"); st.Capacity != 3 || vmStates(st)[victim] != StateDeleting {
		t.Fatalf("after deleting %s: %+v; want capacity 3 and it Deleting", victim, st)
	}
	env.srv.Advance(ctx)
	if st := env.state(t, "flex"); len(st.VMs) != 3 || vmStates(st)[victim] != "" {
		t.Fatalf("after the deletion: %+v; want %s gone", st, victim)
	}
	running, deleted := hook.snapshot()
	if len(running) != 1 || len(deleted) != 1 || !strings.HasSuffix(deleted[0], "/providers/Microsoft.Compute/virtualMachines/"+victim) {
		t.Fatalf("hook: running %v, deleted %v; want the first VM running and %s deleted", running, deleted, victim)
	}
	// The others fail and are repaired by VM name.
	env.clock.Step(time.Minute)
	env.srv.Advance(ctx)
	left := env.state(t, "flex").VMs[0].InstanceID
	if err := env.srv.FailRunningVM(testRG, "flex", left, ""); err != nil {
		t.Fatalf("FailRunningVM by VM name: %v", err)
	}
	if err := env.srv.RepairVM(testRG, "flex", strings.ToUpper(left)); err != nil {
		t.Fatalf("RepairVM by VM name in upper case: %v", err)
	}
}

// TestFlexibleListThrottledAndFaultedAsOthers: the Virtual Machines list
// of a scale set is throttled like every read and suffers the scale set's
// faults; paging and the high-cost count work as for the scale-set VM
// list.
func TestFlexibleListThrottledAndFaultedAsOthers(t *testing.T) {
	ctx := context.Background()
	opts := &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf(testRG, "flex")), Expand: instanceView()}

	t.Run("paging and high cost", func(t *testing.T) {
		env := newTestEnv(t, Options{PageSize: 2}, flexSpec("flex", 5))
		pages := 0
		pager := env.virtualMachines.NewListPager(testRG, opts)
		var names []string
		for pager.More() {
			var raw *http.Response
			page, err := pager.NextPage(policy.WithCaptureResponse(ctx, &raw))
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if h := raw.Header.Values("x-ms-ratelimit-remaining-resource"); !slices.Equal(h, highCostHeaders(pages)) {
				t.Errorf("page %d: x-ms-ratelimit-remaining-resource %q, want %q", pages, h, highCostHeaders(pages))
			}
			for _, vm := range page.Value {
				names = append(names, *vm.Name)
			}
		}
		var want []string
		for _, vm := range env.state(t, "flex").VMs {
			want = append(want, vm.InstanceID)
		}
		if pages != 3 || !slices.Equal(names, want) {
			t.Fatalf("%d pages of %v; want 3 pages of %v", pages, names, want)
		}
		if c := env.srv.Calls(); c[OpListVirtualMachines] != 3 || c[OpListVMs] != 0 {
			t.Fatalf("calls %v, want 3 ListVirtualMachines", c)
		}
	})

	t.Run("throttled", func(t *testing.T) {
		env := newTestEnv(t, Options{}, flexSpec("flex", 1))
		env.srv.Throttle("read", 45*time.Second)
		_, err := env.listFlexible(ctx, t, testRG, opts)
		if re := responseError(t, err); re.StatusCode != http.StatusTooManyRequests || re.RawResponse.Header.Get("Retry-After") != "45" {
			t.Fatalf("list while reads are throttled: %v; want 429 with Retry-After 45", re)
		}
		if c := env.srv.Calls(); c[OpThrottled] != 1 || c[OpListVirtualMachines] != 0 {
			t.Fatalf("calls %v, want one Throttled and no ListVirtualMachines", c)
		}
	})

	t.Run("server error of the scale set", func(t *testing.T) {
		env := newTestEnv(t, Options{}, flexSpec("flex", 1))
		if err := env.srv.InjectFault(testRG, "flex", Fault{Kind: FaultServerError, Count: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.listFlexible(ctx, t, testRG, opts); responseError(t, err).StatusCode != http.StatusInternalServerError {
			t.Fatalf("list under FaultServerError: %v, want 500", err)
		}
		if vms, err := env.listFlexible(ctx, t, testRG, opts); err != nil || len(vms) != 1 {
			t.Fatalf("list after the fault: %d VMs, %v", len(vms), err)
		}
	})
}

// TestFlexibleLimitsAndSpecs: a Flexible scale set holds 1,000 VMs
// whatever its image, and is never a single placement group.
func TestFlexibleLimitsAndSpecs(t *testing.T) {
	srv, err := New(Options{SubscriptionID: testSub})
	if err != nil {
		t.Fatal(err)
	}
	managed := "/subscriptions/" + testSub + "/resourceGroups/img/providers/Microsoft.Compute/images/node"
	if err := srv.AddScaleSet(ScaleSetSpec{ResourceGroup: testRG, Name: "big", SKU: "Standard_D16s_v5", Capacity: 1000, Flexible: true, Image: managed}); err != nil {
		t.Fatalf("1,000 VMs from a managed image in a Flexible scale set: %v", err)
	}
	for _, spec := range []ScaleSetSpec{
		{ResourceGroup: testRG, Name: "spg", SKU: "Standard_D16s_v5", Flexible: true, SinglePlacementGroup: true},
		{ResourceGroup: testRG, Name: "over", SKU: "Standard_D16s_v5", Capacity: 1001, Flexible: true},
	} {
		if err := srv.AddScaleSet(spec); err == nil {
			t.Fatalf("AddScaleSet(%+v) accepted", spec)
		}
	}
}

// TestFlexibleNamesAreSeeded: the same seed gives the same VM names.
func TestFlexibleNamesAreSeeded(t *testing.T) {
	names := func(seed uint64) []string {
		srv, err := New(Options{SubscriptionID: testSub, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.AddScaleSet(flexSpec("flex", 4)); err != nil {
			t.Fatal(err)
		}
		st, _ := srv.ScaleSet(testRG, "flex")
		var out []string
		for _, vm := range st.VMs {
			out = append(out, vm.InstanceID+"/"+vm.ComputerName)
		}
		return out
	}
	if a, b, c := names(7), names(7), names(8); !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Fatalf("seed 7: %v and %v; seed 8: %v; want the same for one seed and others for another", a, b, c)
	}
}

// TestKubeNodeHookFlexibleNode: a Flexible VM's node is named by its
// computer name and carries the provider ID cloud-provider-azure writes:
// the VM's resource ID (no scale set in it) with the resource group
// lower-cased.
func TestKubeNodeHookFlexibleNode(t *testing.T) {
	client := fake.NewClientset()
	hook := &KubeNodeHook{Client: client, Realism: DefaultRealism()}
	env := newTestEnv(t, Options{Hook: hook}, ScaleSetSpec{ResourceGroup: "MC_Rg_Cluster", Name: "flex", SKU: "Standard_D16s_v5", Capacity: 1, Flexible: true})
	ctx := context.Background()
	env.srv.Advance(ctx)
	st, err := env.srv.ScaleSet("MC_Rg_Cluster", "flex")
	if err != nil {
		t.Fatal(err)
	}
	vm := st.VMs[0]
	node, err := client.CoreV1().Nodes().Get(ctx, strings.ToLower(vm.ComputerName), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node of %s: %v", vm.ComputerName, err)
	}
	want := "azure:///subscriptions/" + testSub + "/resourceGroups/mc_rg_cluster/providers/Microsoft.Compute/virtualMachines/" + vm.InstanceID
	if node.Spec.ProviderID != want || vm.ProviderID == want {
		t.Fatalf("node provider ID %s (ARM's %s), want %s", node.Spec.ProviderID, vm.ProviderID, want)
	}
	if node.Labels[NodeGroupLabel] != "flex" {
		t.Fatalf("node labels %v, want the node-group label flex", node.Labels)
	}
}
