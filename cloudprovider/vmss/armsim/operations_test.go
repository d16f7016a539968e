package armsim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
)

// opStatus reads an operation's Azure-AsyncOperation status body.
func (e *testEnv) opStatus(t *testing.T, asyncURL string) operationStatus {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, asyncURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer x")
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	var st operationStatus
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &st) != nil {
		t.Fatalf("operation status: %d %s", resp.StatusCode, raw)
	}
	return st
}

// write sends a capacity PATCH (capacity >= 0) or an instance deletion of
// ids through the real client and returns its Azure-AsyncOperation URL.
func (e *testEnv) write(t *testing.T, name string, capacity int64, ids ...string) string {
	t.Helper()
	var raw *http.Response
	ctx := policy.WithCaptureResponse(context.Background(), &raw)
	var err error
	if capacity >= 0 {
		_, err = e.scaleTo(ctx, name, capacity, nil)
	} else {
		_, err = e.sets.BeginDeleteInstances(ctx, testRG, name,
			armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: to.SliceOfPtrs(ids...)}, nil)
	}
	if err != nil {
		t.Fatalf("write to %s (capacity %d, delete %v): %v", name, capacity, ids, err)
	}
	return raw.Header.Get("Azure-AsyncOperation")
}

// TestOperationsLastAsLongAsTheirVMs: a scale-out's operation ends when
// its VMs are provisioned (boot and extensions), a deletion's when its
// VMs are gone; LRODuration is the least, FaultSlowLRO adds on top, and
// FixedOperations brings back the fixed duration.
func TestOperationsLastAsLongAsTheirVMs(t *testing.T) {
	h100 := SKU{Name: "Standard_ND96isr_H100_v5", Family: "standardNDSH100v5Family", VCPUs: 96, MemoryGB: 1900, GPUs: 8, Arch: ArchX64,
		ExtensionDelay: GPUExtensionDelay}
	d16 := SKU{Name: "Standard_D16s_v5", Family: "standardDSv5Family", VCPUs: 16, MemoryGB: 64, Arch: ArchX64}
	tests := []struct {
		name    string
		opts    Options
		sku     string
		fault   *Fault
		delete  bool
		wantEnd time.Duration
	}{
		{"scale-out ends when its VMs booted", Options{BootDelay: time.Minute, LRODuration: 10 * time.Second}, d16.Name, nil, false, time.Minute},
		{"GPU size: boot and its own extension delay", Options{BootDelay: time.Minute}, h100.Name, nil, false, time.Minute + GPUExtensionDelay},
		{"server extension delay", Options{BootDelay: time.Minute, ExtensionDelay: 2 * time.Minute}, d16.Name, nil, false, 3 * time.Minute},
		{"LRODuration is the least", Options{BootDelay: time.Minute, LRODuration: 2 * time.Minute}, d16.Name, nil, false, 2 * time.Minute},
		{"slow operation adds on top", Options{BootDelay: time.Minute}, d16.Name, &Fault{Kind: FaultSlowLRO, Duration: time.Minute}, false, 2 * time.Minute},
		{"fixed operations", Options{BootDelay: 5 * time.Minute, LRODuration: 10 * time.Second, FixedOperations: true}, d16.Name, nil, false, 10 * time.Second},
		{"deletion ends when its VMs are gone", Options{DeleteDelay: 30 * time.Second, LRODuration: 10 * time.Second}, d16.Name, nil, true, 30 * time.Second},
		{"fixed deletion", Options{DeleteDelay: 30 * time.Second, LRODuration: 10 * time.Second, FixedOperations: true}, d16.Name, nil, true, 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.SKUs = []SKU{h100, d16}
			env := newTestEnv(t, tt.opts, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: tt.sku, Capacity: 1})
			ctx := context.Background()
			if tt.fault != nil {
				if err := env.srv.InjectFault(testRG, "pool", *tt.fault); err != nil {
					t.Fatal(err)
				}
			}
			var asyncURL string
			if tt.delete {
				asyncURL = env.write(t, "pool", -1, "0")
			} else {
				asyncURL = env.write(t, "pool", 2)
			}
			env.clock.Step(tt.wantEnd - time.Second)
			env.srv.Advance(ctx)
			if st := env.opStatus(t, asyncURL); st.Status != "InProgress" {
				t.Fatalf("1s before %v: status %s, want InProgress", tt.wantEnd, st.Status)
			}
			if tt.sku == h100.Name || tt.opts.ExtensionDelay > 0 {
				// Booted, provisioning extensions: Creating, power state running.
				vm := env.state(t, "pool").VMs[1]
				if vm.State != StateCreating || vm.PowerState != "running" {
					t.Errorf("VM provisioning its extensions is %s, power state %q; want Creating, running", vm.State, vm.PowerState)
				}
			}
			env.clock.Step(time.Second)
			if st := env.opStatus(t, asyncURL); st.Status != "Succeeded" || st.EndTime == nil || !st.EndTime.Equal(st.StartTime.Add(tt.wantEnd)) {
				t.Fatalf("at %v: status %s, end %v; want Succeeded at start+%v", tt.wantEnd, st.Status, st.EndTime, tt.wantEnd)
			}
		})
	}
}

// TestPreemption: a capacity write or an instance deletion ends the
// operation in progress Canceled with OperationPreempted; a preempted
// deletion puts back the VMs it had not deleted; NoPreemption turns it
// off, and a tags-only PATCH does not preempt.
func TestPreemption(t *testing.T) {
	type write struct {
		capacity int64    // >= 0: a capacity PATCH
		ids      []string // else an instance deletion
	}
	tests := []struct {
		name         string
		noPreemption bool
		first, next  write
		wantFirst    string            // the first operation's status once the next is sent
		wantNext     string            // the next operation's status then
		wantVMs      map[string]string // VM states right after the next write
		wantCapacity int
	}{
		{"scale-out preempted by a scale-out", false, write{capacity: 3}, write{capacity: 4}, "Canceled", "InProgress",
			map[string]string{"0": StateRunning, "1": StateRunning, "2": StateCreating, "3": StateCreating}, 4},
		{"scale-out preempted by a deletion: its VMs go on booting", false, write{capacity: 4}, write{capacity: -1, ids: []string{"0"}}, "Canceled", "InProgress",
			map[string]string{"0": StateDeleting, "1": StateRunning, "2": StateCreating, "3": StateCreating}, 3},
		// The newer PATCH finds the capacity it asks for (VM 1 back):
		// it has no VMs to wait for.
		{"deletion preempted by a scale-out: its VM put back and counted", false, write{capacity: -1, ids: []string{"1"}}, write{capacity: 2}, "Canceled", "Succeeded",
			map[string]string{"0": StateRunning, "1": StateRunning}, 2},
		{"deletion preempted by a deletion", false, write{capacity: -1, ids: []string{"0"}}, write{capacity: -1, ids: []string{"1"}}, "Canceled", "InProgress",
			map[string]string{"0": StateRunning, "1": StateDeleting}, 1},
		{"no preemption", true, write{capacity: -1, ids: []string{"1"}}, write{capacity: 2}, "InProgress", "InProgress",
			map[string]string{"0": StateRunning, "1": StateDeleting, "2": StateCreating}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{BootDelay: time.Minute, DeleteDelay: time.Minute, NoPreemption: tt.noPreemption},
				ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
			ctx := context.Background()
			env.srv.Advance(ctx)
			send := func(w write) string { return env.write(t, "pool", w.capacity, w.ids...) }
			firstURL := send(tt.first)
			env.clock.Step(10 * time.Second)
			nextURL := send(tt.next)
			st := env.opStatus(t, firstURL)
			if st.Status != tt.wantFirst {
				t.Fatalf("first operation %s, want %s", st.Status, tt.wantFirst)
			}
			if tt.wantFirst == "Canceled" {
				if st.Error == nil || st.Error.Code == nil || *st.Error.Code != "OperationPreempted" ||
					!strings.Contains(*st.Error.Message, "preempted by a more recent operation") || st.EndTime == nil {
					t.Fatalf("preempted operation's status %+v, want Canceled with OperationPreempted", st)
				}
			}
			if next := env.opStatus(t, nextURL); next.Status != tt.wantNext {
				t.Errorf("the newer operation is %s, want %s", next.Status, tt.wantNext)
			}
			got := env.state(t, "pool")
			if !mapsEqual(vmStates(got), tt.wantVMs) || got.Capacity != tt.wantCapacity {
				t.Fatalf("VMs %v capacity %d, want %v and %d", vmStates(got), got.Capacity, tt.wantVMs, tt.wantCapacity)
			}
		})
	}

	t.Run("the real client reads a preemption as an error of code OperationPreempted", func(t *testing.T) {
		env := newTestEnv(t, Options{BootDelay: time.Minute}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 1})
		ctx := context.Background()
		poller, err := env.scaleTo(ctx, "pool", 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		env.write(t, "pool", 3)
		_, err = poller.PollUntilDone(ctx, pollOpts())
		if re := responseError(t, err); re.ErrorCode != "OperationPreempted" {
			t.Fatalf("PollUntilDone: %v, want OperationPreempted", err)
		}
	})

	t.Run("a tags-only PATCH does not preempt", func(t *testing.T) {
		env := newTestEnv(t, Options{BootDelay: time.Minute}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 1})
		ctx := context.Background()
		firstURL := env.write(t, "pool", 2)
		if _, err := env.sets.BeginUpdate(ctx, testRG, "pool", armcompute.VirtualMachineScaleSetUpdate{Tags: map[string]*string{"a": to.Ptr("b")}}, nil); err != nil {
			t.Fatal(err)
		}
		if st := env.opStatus(t, firstURL); st.Status != "InProgress" {
			t.Fatalf("scale-out is %s after a tags-only PATCH, want InProgress", st.Status)
		}
	})
}

// TestOverprovision: an overprovisioning Uniform scale set makes extra VMs
// on scale-out, listed under instance IDs of their own while Creating, not
// in sku.capacity nor in the quota, and deleted once the requested VMs are
// provisioned; they never run (no node).
func TestOverprovision(t *testing.T) {
	tests := []struct {
		name       string
		percent    int
		from, to   int64
		wantExtras int
	}{
		{"default 20%, 5 asked", 0, 1, 6, 1},
		{"default 20%, 6 asked: rounded up", 0, 0, 6, 2},
		{"50%, 3 asked", 50, 2, 5, 2},
		{"100%, 1 asked", 100, 0, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hook := newRecordingHook()
			env := newTestEnv(t, Options{BootDelay: time.Minute, OverprovisionPercent: tt.percent, Hook: hook},
				ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: int(tt.from), Overprovision: true})
			ctx := context.Background()
			env.srv.Advance(ctx)
			poller, err := env.scaleTo(ctx, "pool", tt.to, nil)
			if err != nil {
				t.Fatal(err)
			}
			page, err := env.vms.NewListPager(testRG, "pool", nil).NextPage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, vm := range page.Value {
				ids = append(ids, *vm.InstanceID)
			}
			if want := int(tt.to) + tt.wantExtras; len(ids) != want || len(slices.Compact(slices.Clone(ids))) != want {
				t.Fatalf("listed instance IDs %v, want %d distinct (%d extras)", ids, want, tt.wantExtras)
			}
			st := env.state(t, "pool")
			extras := 0
			for _, vm := range st.VMs {
				if vm.Overprovisioned {
					extras++
					if vm.State != StateCreating {
						t.Errorf("extra VM %s is %s, want Creating", vm.InstanceID, vm.State)
					}
				}
			}
			if extras != tt.wantExtras || st.Capacity != int(tt.to) {
				t.Fatalf("%d extras, capacity %d; want %d and %d", extras, st.Capacity, tt.wantExtras, tt.to)
			}
			got, err := env.sets.Get(ctx, testRG, "pool", nil)
			if err != nil {
				t.Fatal(err)
			}
			if *got.SKU.Capacity != tt.to || got.Properties.Overprovision == nil || !*got.Properties.Overprovision {
				t.Fatalf("sku.capacity %d, overprovision %v; want %d, true", *got.SKU.Capacity, got.Properties.Overprovision, tt.to)
			}
			// Extras are not in the quota: a quota refusal counts the
			// requested VMs only.
			if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultQuota, Count: 1}); err != nil {
				t.Fatal(err)
			}
			_, err = env.scaleTo(ctx, "pool", tt.to+1, nil)
			if re := responseError(t, err); !strings.Contains(re.Error(), "Current Usage: "+strconv.Itoa(16*int(tt.to))+",") {
				t.Errorf("quota refusal %v, want usage %d (extras not counted)", re, 16*tt.to)
			}

			env.clock.Step(time.Minute)
			if _, err := poller.PollUntilDone(ctx, pollOpts()); err != nil {
				t.Fatalf("PollUntilDone: %v", err)
			}
			env.srv.Advance(ctx) // requested VMs run; extras start deleting
			env.srv.Advance(ctx) // extras gone (no delete delay)
			final := env.state(t, "pool")
			if len(final.VMs) != int(tt.to) || final.Capacity != int(tt.to) {
				t.Fatalf("after boot: %d VMs, capacity %d; want %d", len(final.VMs), final.Capacity, tt.to)
			}
			for _, vm := range final.VMs {
				if vm.Overprovisioned || vm.State != StateRunning {
					t.Errorf("VM %s: %s, overprovisioned %v", vm.InstanceID, vm.State, vm.Overprovisioned)
				}
			}
			if running, deleted := hook.snapshot(); len(running) != int(tt.to) || len(deleted) != 0 {
				t.Errorf("hook: %d running, %d deleted; want %d and 0 (extras never run)", len(running), len(deleted), tt.to)
			}
		})
	}

	t.Run("off by default", func(t *testing.T) {
		env := newTestEnv(t, Options{BootDelay: time.Minute}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5"})
		if _, err := env.scaleTo(context.Background(), "pool", 5, nil); err != nil {
			t.Fatal(err)
		}
		if st := env.state(t, "pool"); len(st.VMs) != 5 {
			t.Fatalf("%d VMs, want 5: no extras", len(st.VMs))
		}
		got, err := env.sets.Get(context.Background(), testRG, "pool", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.Properties.Overprovision == nil || *got.Properties.Overprovision {
			t.Fatalf("overprovision %v, want false", got.Properties.Overprovision)
		}
	})

	t.Run("refused for a Flexible scale set", func(t *testing.T) {
		srv, err := New(Options{SubscriptionID: testSub})
		if err != nil {
			t.Fatal(err)
		}
		spec := flexSpec("flex", 0)
		spec.Overprovision = true
		if err := srv.AddScaleSet(spec); err == nil || !strings.Contains(err.Error(), "overprovision") {
			t.Fatalf("AddScaleSet = %v, want a refusal", err)
		}
	})
}

// TestDeletingWithoutIDs: FaultDeletingWithoutIDs lists Deleting VMs with
// an empty resource ID (and instance ID in a Uniform scale set), as
// cluster-autoscaler guards against; others, and Gets, are unaffected.
func TestDeletingWithoutIDs(t *testing.T) {
	ctx := context.Background()
	t.Run("uniform", func(t *testing.T) {
		env := newTestEnv(t, Options{DeleteDelay: time.Minute}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 3})
		env.write(t, "pool", -1, "1")
		if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultDeletingWithoutIDs, Count: 1}); err != nil {
			t.Fatal(err)
		}
		list := func() []string {
			page, err := env.vms.NewListPager(testRG, "pool", nil).NextPage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, vm := range page.Value {
				out = append(out, *vm.InstanceID+"|"+lastSegment(*vm.ID)+"|"+*vm.Properties.ProvisioningState)
			}
			return out
		}
		if got, want := list(), []string{"0|0|Succeeded", "||Deleting", "2|2|Succeeded"}; !slices.Equal(got, want) {
			t.Fatalf("with the fault: %v, want %v", got, want)
		}
		if got, want := list(), []string{"0|0|Succeeded", "1|1|Deleting", "2|2|Succeeded"}; !slices.Equal(got, want) {
			t.Fatalf("after the fault: %v, want %v", got, want)
		}
	})
	t.Run("flexible", func(t *testing.T) {
		env := newTestEnv(t, Options{DeleteDelay: time.Minute}, flexSpec("flex", 2))
		vms, err := env.listFlexible(ctx, t, testRG, nil)
		if err != nil {
			t.Fatal(err)
		}
		env.write(t, "flex", -1, *vms[0].Name)
		if err := env.srv.InjectFault(testRG, "flex", Fault{Kind: FaultDeletingWithoutIDs}); err != nil {
			t.Fatal(err)
		}
		vms, err = env.listFlexible(ctx, t, testRG, &armcompute.VirtualMachinesClientListOptions{Filter: to.Ptr(scaleSetFilterOf(testRG, "flex"))})
		if err != nil {
			t.Fatal(err)
		}
		if len(vms) != 2 || *vms[0].ID != "" || *vms[1].ID == "" {
			t.Fatalf("IDs %q and %q, want the deleting VM's empty", *vms[0].ID, *vms[1].ID)
		}
	})
}

func lastSegment(id string) string { return id[strings.LastIndex(id, "/")+1:] }

// TestForceDeleteRefused: force deletion on an isolated size, or under
// FaultForceDeleteRefused, is answered 409 OperationNotAllowed and changes
// nothing; a deletion without force goes through.
func TestForceDeleteRefused(t *testing.T) {
	skus := []SKU{
		{Name: "Standard_D16s_v5", Family: "standardDSv5Family", VCPUs: 16, MemoryGB: 64, Arch: ArchX64},
		{Name: "Standard_F72s_v2", Family: "standardFSv2Family", VCPUs: 72, MemoryGB: 144, Arch: ArchX64}, // in cluster-autoscaler's list
		{Name: "Standard_X8_isolated", Family: "standardXFamily", VCPUs: 8, MemoryGB: 32, Arch: ArchX64, Isolated: true},
	}
	tests := []struct {
		name    string
		sku     string
		fault   bool
		refused bool
	}{
		{"ordinary size", "Standard_D16s_v5", false, false},
		{"isolated size cluster-autoscaler lists", "Standard_F72s_v2", false, true},
		{"size marked isolated", "Standard_X8_isolated", false, true},
		{"fault", "Standard_D16s_v5", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{SKUs: skus, DeleteDelay: time.Minute}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: tt.sku, Capacity: 2})
			ctx := context.Background()
			if tt.fault {
				if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultForceDeleteRefused, Count: 1}); err != nil {
					t.Fatal(err)
				}
			}
			before := env.state(t, "pool")
			del := func(force bool) error {
				_, err := env.sets.BeginDeleteInstances(ctx, testRG, "pool",
					armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("0")}},
					&armcompute.VirtualMachineScaleSetsClientBeginDeleteInstancesOptions{ForceDeletion: to.Ptr(force)})
				return err
			}
			err := del(true)
			if !tt.refused {
				if err != nil {
					t.Fatalf("force deletion: %v", err)
				}
				return
			}
			re := responseError(t, err)
			if re.StatusCode != http.StatusConflict || re.ErrorCode != "OperationNotAllowed" || !strings.Contains(re.Error(), "Operation 'ForceDelete' is not allowed") {
				t.Fatalf("force deletion: %v, want 409 OperationNotAllowed", re)
			}
			if after := env.state(t, "pool"); after.ETag != before.ETag || after.Capacity != 2 {
				t.Fatalf("refused force deletion changed the scale set: %+v", after)
			}
			if err := del(false); err != nil {
				t.Fatalf("deletion without force: %v", err)
			}
			if st := env.state(t, "pool"); vmStates(st)["0"] != StateDeleting {
				t.Fatalf("after the deletion without force: %v", vmStates(st))
			}
		})
	}
}

// TestDeleteUnknownInstanceRefusesBatch: a batch naming an instance ARM
// does not have is refused whole, 400 InvalidParameter with target
// instanceIds, and nothing changes.
func TestDeleteUnknownInstanceRefusesBatch(t *testing.T) {
	env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
	before := env.state(t, "pool")
	var raw *http.Response
	_, err := env.sets.BeginDeleteInstances(policy.WithCaptureResponse(context.Background(), &raw), testRG, "pool",
		armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("0"), to.Ptr("7")}}, nil)
	re := responseError(t, err)
	if re.StatusCode != http.StatusBadRequest || re.ErrorCode != "InvalidParameter" {
		t.Fatalf("got %v, want 400 InvalidParameter", re)
	}
	var body struct {
		Error struct{ Code, Message, Target string } `json:"error"`
	}
	if err := json.NewDecoder(raw.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body.Error.Target != "instanceIds" || body.Error.Message != "The provided instanceId 7 is not an active Virtual Machine Scale Set VM instanceId." {
		t.Errorf("error body %+v", body.Error)
	}
	if after := env.state(t, "pool"); after.ETag != before.ETag || !mapsEqual(vmStates(after), vmStates(before)) {
		t.Fatalf("refused batch changed the scale set: %+v", after)
	}
}

// TestWriteRefusalFaults: under a deny assignment (AKS node resource group
// lockdown) writes are answered 403 DenyAssignmentAuthorizationFailed,
// under a management lock 409 ScopeLocked; reads go through and nothing
// changes.
func TestWriteRefusalFaults(t *testing.T) {
	tests := []struct {
		name       string
		kind       FaultKind
		wantStatus int
		wantCode   string
		wantMsg    string
	}{
		{"deny assignment", FaultDenyAssignment, http.StatusForbidden, "DenyAssignmentAuthorizationFailed", "the access is denied because of the deny assignment"},
		{"scope locked", FaultScopeLocked, http.StatusConflict, "ScopeLocked", "cannot perform write operation because following scope(s) are locked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
			ctx := context.Background()
			if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: tt.kind}); err != nil {
				t.Fatal(err)
			}
			before := env.state(t, "pool")
			_, patchErr := env.scaleTo(ctx, "pool", 3, nil)
			_, delErr := env.sets.BeginDeleteInstances(ctx, testRG, "pool",
				armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("0")}}, nil)
			for what, err := range map[string]error{"PATCH": patchErr, "delete": delErr} {
				re := responseError(t, err)
				if re.StatusCode != tt.wantStatus || re.ErrorCode != tt.wantCode || !strings.Contains(re.Error(), tt.wantMsg) {
					t.Errorf("%s: %v, want %d %s", what, re, tt.wantStatus, tt.wantCode)
				}
			}
			if _, err := env.sets.Get(ctx, testRG, "pool", nil); err != nil {
				t.Errorf("read refused: %v", err)
			}
			if after := env.state(t, "pool"); after.ETag != before.ETag || after.Capacity != 2 {
				t.Fatalf("refused writes changed the scale set: %+v", after)
			}
			if err := env.srv.ClearFaults(testRG, "pool"); err != nil {
				t.Fatal(err)
			}
			if _, err := env.scaleTo(ctx, "pool", 3, nil); err != nil {
				t.Fatalf("write after the fault cleared: %v", err)
			}
		})
	}
}

// TestSlowDeleteKeepsVMsDeletingAndItsOperationRunning: FaultSlowDelete
// keeps the VMs a deletion starts in Deleting for its Duration, and the
// deletion's operation (which lasts until its VMs are gone) in progress:
// long enough for a newer write to preempt it.
func TestSlowDeleteKeepsVMsDeletingAndItsOperationRunning(t *testing.T) {
	env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
	ctx := context.Background()
	env.srv.Advance(ctx)
	if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultSlowDelete, Count: 1, Duration: time.Minute}); err != nil {
		t.Fatal(err)
	}
	url := env.write(t, "pool", -1, "0")
	env.clock.Step(30 * time.Second)
	env.srv.Advance(ctx)
	if st := env.opStatus(t, url); st.Status != "InProgress" {
		t.Fatalf("deletion's operation %s after 30 s of a 1-minute slow delete, want InProgress", st.Status)
	}
	if got := vmStates(env.state(t, "pool")); got["0"] != StateDeleting {
		t.Fatalf("VMs %v, want VM 0 still Deleting", got)
	}
	env.clock.Step(31 * time.Second)
	env.srv.Advance(ctx)
	if st := env.opStatus(t, url); st.Status != "Succeeded" {
		t.Fatalf("deletion's operation %s once its VM is gone, want Succeeded", st.Status)
	}
	if got := vmStates(env.state(t, "pool")); len(got) != 1 || got["1"] != StateRunning {
		t.Fatalf("VMs %v, want only VM 1 Running", got)
	}
	// Count 1: the next deletion is not slowed.
	url = env.write(t, "pool", -1, "1")
	env.clock.Step(time.Second)
	env.srv.Advance(ctx)
	if st := env.opStatus(t, url); st.Status != "Succeeded" {
		t.Fatalf("second deletion's operation %s, want Succeeded (the fault was used up)", st.Status)
	}
}

// TestVanishBeforeDeleteRefusesTheBatch: FaultVanishBeforeDelete removes
// the first VM a deletion of two or more names, as a finished
// out-of-band deletion; ARM then refuses the whole batch for naming an
// instance it no longer has (400 InvalidParameter, nothing else
// changes), the capacity counts the vanished VM out, its node is told
// gone at the next Advance, and the fault is used up.
func TestVanishBeforeDeleteRefusesTheBatch(t *testing.T) {
	hook := newRecordingHook()
	env := newTestEnv(t, Options{Hook: hook}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 3})
	ctx := context.Background()
	env.srv.Advance(ctx)
	if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultVanishBeforeDelete, Count: 1}); err != nil {
		t.Fatal(err)
	}
	// A deletion of one VM takes no fault.
	url := env.write(t, "pool", -1, "2")
	env.clock.Step(time.Minute)
	env.srv.Advance(ctx)
	if st := env.opStatus(t, url); st.Status != "Succeeded" {
		t.Fatalf("single deletion's operation %s, want Succeeded", st.Status)
	}
	_, err := env.sets.BeginDeleteInstances(ctx, testRG, "pool",
		armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: to.SliceOfPtrs("0", "1")}, nil)
	var re *azcore.ResponseError
	if !errors.As(err, &re) || re.StatusCode != http.StatusBadRequest || re.ErrorCode != "InvalidParameter" {
		t.Fatalf("deletion naming a vanished VM: %v, want 400 InvalidParameter", err)
	}
	st := env.state(t, "pool")
	if got := vmStates(st); len(got) != 1 || got["1"] != StateRunning {
		t.Fatalf("VMs %v, want VM 0 gone and VM 1 Running (the batch refused)", got)
	}
	if st.Capacity != 1 {
		t.Fatalf("capacity %d, want 1", st.Capacity)
	}
	env.srv.Advance(ctx)
	if _, deleted := hook.snapshot(); len(deleted) != 2 {
		t.Fatalf("nodes told deleted %v, want VM 2's and the vanished VM 0's", deleted)
	}
	// Used up: the same batch, now of existing VMs, is accepted.
	env.write(t, "pool", -1, "1")
}
