package armsim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
)

func TestNewValidatesOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"no subscription", Options{}, "subscription ID is required"},
		{"negative delay", Options{SubscriptionID: testSub, BootDelay: -time.Second}, "boot delay"},
		{"negative jitter", Options{SubscriptionID: testSub, BootJitter: -time.Second}, "boot jitter must not be negative"},
		{"negative ARM reads", Options{SubscriptionID: testSub, Throttling: Throttling{ARM: ARMLimits{Reads: Rate{Capacity: -1, Refill: 1, Period: time.Second}}}}, "ARM reads"},
		{"policy without operations", Options{SubscriptionID: testSub, Throttling: Throttling{Compute: []Policy{{Name: "P", Rate: Rate{Capacity: 1, Refill: 1, Period: time.Minute}}}}}, "charges no operation"},
		{"policy twice", Options{SubscriptionID: testSub, Throttling: Throttling{Compute: append(ComputePolicies(), ComputePolicies()[0])}}, "listed twice"},
		{"window without period", Options{SubscriptionID: testSub, Throttling: Throttling{Compute: WithPolicy(ComputePolicies(),
			Policy{Name: PolicyHighCostGetVMScaleSet30Min, Ops: []string{OpListVMs}, FixedWindow: true, Rate: Rate{Capacity: 9}})}}, "fixed window"},
		{"public address", Options{SubscriptionID: testSub, Addr: "0.0.0.0:0"}, "loopback"},
		{"bad SKU", Options{SubscriptionID: testSub, SKUs: []SKU{{Name: "x", Family: "f", VCPUs: 1, MemoryGB: 1, Arch: "sparc"}}}, "architecture"},
		{"duplicate SKU", Options{SubscriptionID: testSub, SKUs: []SKU{DefaultSKUs()[0], DefaultSKUs()[0]}}, "twice"},
		{"defaults", Options{SubscriptionID: testSub}, ""},
		{"localhost", Options{SubscriptionID: testSub, Addr: "localhost:0"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			wantError(t, "New", err, tt.wantErr)
		})
	}
}

func TestAddScaleSetValidates(t *testing.T) {
	srv, err := New(Options{SubscriptionID: testSub})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddScaleSet(ScaleSetSpec{ResourceGroup: testRG, Name: "a", SKU: "Standard_D16s_v5"}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec ScaleSetSpec
	}{
		{"unknown SKU", ScaleSetSpec{ResourceGroup: testRG, Name: "b", SKU: "Standard_Nope"}},
		{"duplicate (case-insensitive)", ScaleSetSpec{ResourceGroup: strings.ToUpper(testRG), Name: "A", SKU: "Standard_D16s_v5"}},
		{"negative capacity", ScaleSetSpec{ResourceGroup: testRG, Name: "c", SKU: "Standard_D16s_v5", Capacity: -1}},
		{"no name", ScaleSetSpec{ResourceGroup: testRG, SKU: "Standard_D16s_v5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := srv.AddScaleSet(tt.spec); err == nil {
				t.Fatalf("AddScaleSet(%+v) succeeded, want an error", tt.spec)
			}
		})
	}
}

func TestListAndGetScaleSets(t *testing.T) {
	env := newTestEnv(t, Options{},
		ScaleSetSpec{ResourceGroup: testRG, Name: "gpu", SKU: "Standard_ND96isr_H100_v5", Capacity: 2,
			Tags: map[string]string{"team": "ml"}, Zones: []string{"1", "2"}},
		ScaleSetSpec{ResourceGroup: testRG, Name: "cpu", SKU: "Standard_D16s_v5", Capacity: 0},
		ScaleSetSpec{ResourceGroup: "other", Name: "cpu", SKU: "Standard_D16s_v5", Capacity: 1},
	)
	ctx := context.Background()

	t.Run("list", func(t *testing.T) {
		var names []string
		pager := env.sets.NewListPager(testRG, nil)
		for pager.More() {
			page, err := pager.NextPage(ctx)
			if err != nil {
				t.Fatalf("NextPage: %v", err)
			}
			for _, s := range page.Value {
				names = append(names, *s.Name)
			}
		}
		if want := []string{"cpu", "gpu"}; !slices.Equal(names, want) {
			t.Fatalf("listed %v, want %v", names, want)
		}
	})

	t.Run("get", func(t *testing.T) {
		got, err := env.sets.Get(ctx, testRG, "gpu", nil)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		st := env.state(t, "gpu")
		wantID := "/subscriptions/" + testSub + "/resourceGroups/" + testRG + "/providers/Microsoft.Compute/virtualMachineScaleSets/gpu"
		checks := []struct {
			field     string
			got, want any
		}{
			{"id", *got.ID, wantID},
			{"sku.name", *got.SKU.Name, "Standard_ND96isr_H100_v5"},
			{"sku.capacity", *got.SKU.Capacity, int64(2)},
			{"etag", *got.Etag, st.ETag},
			{"location", *got.Location, "eastus"},
			{"tags.team", *got.Tags["team"], "ml"},
			{"zones", len(got.Zones), 2},
			{"provisioningState", *got.Properties.ProvisioningState, "Succeeded"},
			{"orchestrationMode", *got.Properties.OrchestrationMode, armcompute.OrchestrationModeUniform},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("%s = %v, want %v", c.field, c.got, c.want)
			}
		}
	})

	notFound := []struct {
		name     string
		call     func() error
		wantCode string
	}{
		{"get unknown scale set", func() error { _, err := env.sets.Get(ctx, testRG, "nope", nil); return err }, "ResourceNotFound"},
		{"get in unknown group", func() error { _, err := env.sets.Get(ctx, "nogroup", "gpu", nil); return err }, "ResourceGroupNotFound"},
		{"list unknown group", func() error {
			_, err := env.sets.NewListPager("nogroup", nil).NextPage(ctx)
			return err
		}, "ResourceGroupNotFound"},
	}
	for _, tt := range notFound {
		t.Run(tt.name, func(t *testing.T) {
			re := responseError(t, tt.call())
			if re.StatusCode != http.StatusNotFound || re.ErrorCode != tt.wantCode {
				t.Fatalf("got %d %s, want 404 %s", re.StatusCode, re.ErrorCode, tt.wantCode)
			}
		})
	}

	calls := env.srv.Calls()
	if calls[OpListScaleSets] != 2 || calls[OpGetScaleSet] != 3 {
		t.Errorf("calls = %v, want 2 ListScaleSets and 3 GetScaleSet", calls)
	}
}

func TestScaleOut(t *testing.T) {
	tests := []struct {
		name        string
		lroDuration time.Duration
		bootDelay   time.Duration
	}{
		{"immediate", 0, 0},
		{"slow operation and boot", 2 * time.Minute, 5 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hook := newRecordingHook()
			env := newTestEnv(t, Options{LRODuration: tt.lroDuration, BootDelay: tt.bootDelay, Hook: hook},
				ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2, Zones: []string{"1", "2", "3"}})
			ctx := context.Background()
			before := env.state(t, "pool")

			poller, err := env.scaleTo(ctx, "pool", 5, to.Ptr(before.ETag))
			if err != nil {
				t.Fatalf("BeginUpdate: %v", err)
			}
			after := env.state(t, "pool")
			if after.Capacity != 5 || after.ETag == before.ETag {
				t.Fatalf("after PATCH: capacity %d etag %s, want 5 and an etag other than %s", after.Capacity, after.ETag, before.ETag)
			}
			wantStates := map[string]string{"0": StateRunning, "1": StateRunning, "2": StateCreating, "3": StateCreating, "4": StateCreating}
			if got := vmStates(after); !mapsEqual(got, wantStates) {
				t.Fatalf("VM states %v, want %v", got, wantStates)
			}

			// The operation lasts LRODuration at least, and until its
			// VMs are provisioned.
			if opEnd := max(tt.lroDuration, tt.bootDelay); opEnd > 0 {
				for _, step := range []time.Duration{0, opEnd - time.Second} {
					env.clock.Step(step)
					if _, err := poller.Poll(ctx); err != nil {
						t.Fatalf("Poll: %v", err)
					}
					if poller.Done() {
						t.Fatalf("operation done %v after it started, before its VMs booted (%v)", step, opEnd)
					}
				}
				env.srv.Advance(ctx)
				if got := vmStates(env.state(t, "pool"))["4"]; got != StateCreating {
					t.Fatalf("VM 4 is %s before its boot delay ended, want Creating", got)
				}
				env.clock.Step(time.Second)
			}
			res, err := poller.PollUntilDone(ctx, pollOpts())
			if err != nil {
				t.Fatalf("PollUntilDone: %v", err)
			}
			if *res.SKU.Capacity != 5 {
				t.Fatalf("final capacity %d, want 5", *res.SKU.Capacity)
			}
			env.srv.Advance(ctx)
			final := env.state(t, "pool")
			for _, vm := range final.VMs {
				if vm.State != StateRunning {
					t.Errorf("VM %s is %s, want Running", vm.InstanceID, vm.State)
				}
			}
			if running, _ := hook.snapshot(); len(running) != 5 {
				t.Errorf("VMRunning called for %d VMs, want 5", len(running))
			}

			// The VM list agrees, with instance views and Azure computer names.
			page, err := env.vms.NewListPager(testRG, "pool", &armcompute.VirtualMachineScaleSetVMsClientListOptions{Expand: to.Ptr("instanceView")}).NextPage(ctx)
			if err != nil {
				t.Fatalf("listing VMs: %v", err)
			}
			if len(page.Value) != 5 {
				t.Fatalf("listed %d VMs, want 5", len(page.Value))
			}
			vm := page.Value[4]
			if got := *vm.Properties.OSProfile.ComputerName; got != "pool000004" {
				t.Errorf("computer name %s, want pool000004", got)
			}
			if got := *vm.Properties.ProvisioningState; got != "Succeeded" {
				t.Errorf("provisioningState %s, want Succeeded", got)
			}
			if codes := statusCodes(vm); !slices.Equal(codes, []string{"ProvisioningState/succeeded", "PowerState/running"}) {
				t.Errorf("instance view statuses %v", codes)
			}
			if got := *vm.Zones[0]; got != "2" {
				t.Errorf("VM 4 in zone %s, want 2 (round-robin)", got)
			}
		})
	}
}

func statusCodes(vm *armcompute.VirtualMachineScaleSetVM) []string {
	var codes []string
	if vm.Properties == nil || vm.Properties.InstanceView == nil {
		return nil
	}
	for _, s := range vm.Properties.InstanceView.Statuses {
		codes = append(codes, *s.Code)
	}
	return codes
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func TestUpdateIfMatch(t *testing.T) {
	tests := []struct {
		name       string
		ifMatch    func(current string) *string
		wantStatus int // 0: success
	}{
		{"current etag", func(cur string) *string { return &cur }, 0},
		{"unquoted current etag", func(cur string) *string { return to.Ptr(strings.Trim(cur, `"`)) }, 0},
		{"wildcard", func(string) *string { return to.Ptr("*") }, 0},
		{"no If-Match", func(string) *string { return nil }, 0},
		{"stale etag", func(string) *string { return to.Ptr(`"0"`) }, http.StatusPreconditionFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 1})
			before := env.state(t, "pool")
			_, err := env.scaleTo(context.Background(), "pool", 3, tt.ifMatch(before.ETag))
			after := env.state(t, "pool")
			if tt.wantStatus == 0 {
				if err != nil {
					t.Fatalf("BeginUpdate: %v", err)
				}
				if after.Capacity != 3 {
					t.Fatalf("capacity %d, want 3", after.Capacity)
				}
				return
			}
			re := responseError(t, err)
			if re.StatusCode != tt.wantStatus || re.ErrorCode != "PreconditionFailed" {
				t.Fatalf("got %d %s, want %d PreconditionFailed", re.StatusCode, re.ErrorCode, tt.wantStatus)
			}
			if after.Capacity != 1 || after.ETag != before.ETag {
				t.Fatalf("rejected update changed the scale set: %+v", after)
			}
		})
	}
}

func TestUpdateTagsAndScaleIn(t *testing.T) {
	env := newTestEnv(t, Options{BootDelay: time.Minute, DeleteDelay: time.Minute},
		ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 3, Tags: map[string]string{"a": "1"}})
	ctx := context.Background()
	// 3 Running (0-2), then 2 Creating (3, 4).
	if _, err := env.scaleTo(ctx, "pool", 5, nil); err != nil {
		t.Fatal(err)
	}
	poller, err := env.sets.BeginUpdate(ctx, testRG, "pool", armcompute.VirtualMachineScaleSetUpdate{
		SKU:  &armcompute.SKU{Capacity: to.Ptr[int64](2)},
		Tags: map[string]*string{"b": to.Ptr("2")},
	}, nil)
	if err != nil {
		t.Fatalf("BeginUpdate: %v", err)
	}
	// Scale-in removes the Creating VMs first, then the newest.
	want := map[string]string{"0": StateRunning, "1": StateRunning, "2": StateDeleting, "3": StateDeleting, "4": StateDeleting}
	st := env.state(t, "pool")
	if got := vmStates(st); !mapsEqual(got, want) || st.Capacity != 2 {
		t.Fatalf("after scale-in: capacity %d, VMs %v; want 2 and %v", st.Capacity, got, want)
	}
	// Its operation ends when the VMs are gone.
	env.clock.Step(time.Minute)
	res, err := poller.PollUntilDone(ctx, pollOpts())
	if err != nil {
		t.Fatalf("PollUntilDone: %v", err)
	}
	if len(res.Tags) != 1 || res.Tags["b"] == nil || *res.Tags["b"] != "2" {
		t.Errorf("tags after PATCH = %v, want only b=2", res.Tags)
	}
	env.srv.Advance(ctx)
	if got := vmStates(env.state(t, "pool")); !mapsEqual(got, map[string]string{"0": StateRunning, "1": StateRunning}) {
		t.Fatalf("after delete delay: VMs %v", got)
	}
	// Instance IDs are never reused.
	if _, err := env.scaleTo(ctx, "pool", 3, nil); err != nil {
		t.Fatal(err)
	}
	if got := vmStates(env.state(t, "pool")); got["5"] != StateCreating {
		t.Fatalf("new VM did not get instance ID 5: %v", got)
	}
}

func TestQuotaFault(t *testing.T) {
	env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "h100", SKU: "Standard_ND96isr_H100_v5", Capacity: 0})
	ctx := context.Background()
	if err := env.srv.InjectFault(testRG, "h100", Fault{Kind: FaultQuota, Count: 1}); err != nil {
		t.Fatal(err)
	}
	before := env.state(t, "h100")
	_, err := env.scaleTo(ctx, "h100", 1, to.Ptr(before.ETag))
	re := responseError(t, err)
	if re.StatusCode != http.StatusConflict || re.ErrorCode != "OperationNotAllowed" {
		t.Fatalf("got %d %s, want 409 OperationNotAllowed", re.StatusCode, re.ErrorCode)
	}
	for _, want := range []string{"standardNDSH100v5Family Cores quota", "Location: eastus", "Current Limit: 0", "Additional Required: 96"} {
		if !strings.Contains(re.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, re)
		}
	}
	if after := env.state(t, "h100"); after.Capacity != 0 || after.ETag != before.ETag || len(after.VMs) != 0 {
		t.Fatalf("quota rejection changed the scale set: %+v", after)
	}
	// The fault applied once; the retry goes through.
	if _, err := env.scaleTo(ctx, "h100", 1, nil); err != nil {
		t.Fatalf("second BeginUpdate: %v", err)
	}
}

func TestOperationFaults(t *testing.T) {
	tests := []struct {
		name         string
		fault        Fault
		wantCode     string        // LRO error code, "" for success
		wantVMState  string        // state of the new VMs after Advance
		inProgressAt time.Duration // clock step at which the LRO must still be running
	}{
		{"allocation", Fault{Kind: FaultAllocation}, CodeAllocationFailed, StateFailed, 0},
		{"lro fail", Fault{Kind: FaultLROFail}, CodeInternalExecutionError, StateRunning, 0},
		{"slow lro", Fault{Kind: FaultSlowLRO, Duration: time.Minute}, "", StateRunning, time.Minute - time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_ND96asr_v4", Capacity: 1})
			ctx := context.Background()
			if err := env.srv.InjectFault(testRG, "pool", tt.fault); err != nil {
				t.Fatal(err)
			}
			poller, err := env.scaleTo(ctx, "pool", 3, nil)
			if err != nil {
				t.Fatalf("BeginUpdate: %v", err)
			}
			if tt.inProgressAt > 0 {
				env.clock.Step(tt.inProgressAt)
				if _, err := poller.Poll(ctx); err != nil || poller.Done() {
					t.Fatalf("slow operation: Poll err %v, done %v; want still in progress", err, poller.Done())
				}
				env.clock.Step(time.Second)
			}
			_, err = poller.PollUntilDone(ctx, pollOpts())
			if tt.wantCode == "" {
				if err != nil {
					t.Fatalf("PollUntilDone: %v", err)
				}
			} else if re := responseError(t, err); re.ErrorCode != tt.wantCode {
				t.Fatalf("operation error code %s, want %s", re.ErrorCode, tt.wantCode)
			}

			env.srv.Advance(ctx)
			st := env.state(t, "pool")
			for _, vm := range st.VMs[1:] {
				if vm.State != tt.wantVMState {
					t.Errorf("VM %s is %s, want %s", vm.InstanceID, vm.State, tt.wantVMState)
				}
				if tt.wantVMState == StateFailed && vm.ErrorCode != CodeAllocationFailed {
					t.Errorf("VM %s error code %q, want %s", vm.InstanceID, vm.ErrorCode, CodeAllocationFailed)
				}
			}
			if tt.wantVMState != StateFailed {
				return
			}
			vm, err := env.vms.Get(ctx, testRG, "pool", "2", &armcompute.VirtualMachineScaleSetVMsClientGetOptions{Expand: to.Ptr(armcompute.InstanceViewTypesInstanceView)})
			if err != nil {
				t.Fatalf("getting VM: %v", err)
			}
			if codes := statusCodes(&vm.VirtualMachineScaleSetVM); !slices.Equal(codes, []string{"ProvisioningState/failed/AllocationFailed"}) {
				t.Errorf("instance view statuses %v", codes)
			}
			if lvl := vm.Properties.InstanceView.Statuses[0].Level; lvl == nil || *lvl != armcompute.StatusLevelTypesError {
				t.Errorf("failed status level %v, want Error", lvl)
			}
			if got := *vm.Properties.ProvisioningState; got != "Failed" {
				t.Errorf("VM provisioningState %s, want Failed", got)
			}
			got, err := env.sets.Get(ctx, testRG, "pool", nil)
			if err != nil {
				t.Fatal(err)
			}
			if ps := *got.Properties.ProvisioningState; ps != "Failed" {
				t.Errorf("scale set provisioningState %s, want Failed", ps)
			}
		})
	}
}

func TestServerErrorFault(t *testing.T) {
	env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 1})
	ctx := context.Background()
	if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultServerError, Count: 2}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{500, 500, 200} {
		_, err := env.sets.Get(ctx, testRG, "pool", nil)
		got := 200
		if err != nil {
			re := responseError(t, err)
			got = re.StatusCode
			if re.ErrorCode != "InternalServerError" {
				t.Errorf("request %d: code %s", i, re.ErrorCode)
			}
		}
		if got != want {
			t.Fatalf("request %d: status %d, want %d", i, got, want)
		}
	}
}

func TestDeleteInstances(t *testing.T) {
	hook := newRecordingHook()
	env := newTestEnv(t, Options{DeleteDelay: 30 * time.Second, Hook: hook},
		ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 3})
	ctx := context.Background()
	env.srv.Advance(ctx) // VMRunning for the initial VMs
	before := env.state(t, "pool")

	t.Run("unknown instance", func(t *testing.T) {
		_, err := env.sets.BeginDeleteInstances(ctx, testRG, "pool",
			armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("1"), to.Ptr("42")}}, nil)
		re := responseError(t, err)
		if re.StatusCode != http.StatusBadRequest || re.ErrorCode != "InvalidParameter" || !strings.Contains(re.Error(), "42") {
			t.Fatalf("got %v, want 400 InvalidParameter naming 42", re)
		}
		if after := env.state(t, "pool"); after.Capacity != 3 || after.ETag != before.ETag {
			t.Fatalf("rejected delete changed the scale set: %+v", after)
		}
	})

	t.Run("delete", func(t *testing.T) {
		var initial *http.Response
		poller, err := env.sets.BeginDeleteInstances(policy.WithCaptureResponse(ctx, &initial), testRG, "pool",
			armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("1")}},
			&armcompute.VirtualMachineScaleSetsClientBeginDeleteInstancesOptions{ForceDeletion: to.Ptr(true)})
		if err != nil {
			t.Fatalf("BeginDeleteInstances: %v", err)
		}
		if initial.StatusCode != http.StatusAccepted || !strings.Contains(initial.Header.Get("Location"), "monitor=true") ||
			initial.Header.Get("Azure-AsyncOperation") == "" {
			t.Errorf("initial answer %d with Location %q, Azure-AsyncOperation %q", initial.StatusCode,
				initial.Header.Get("Location"), initial.Header.Get("Azure-AsyncOperation"))
		}
		st := env.state(t, "pool")
		if st.Capacity != 2 || st.ETag == before.ETag || vmStates(st)["1"] != StateDeleting {
			t.Fatalf("after delete request: %+v; want capacity 2, new etag, VM 1 Deleting", st)
		}
		// The operation lasts until the VM is gone.
		if _, err := poller.Poll(ctx); err != nil || poller.Done() {
			t.Fatalf("Poll: err %v, done %v; want in progress until the VM is gone", err, poller.Done())
		}
		env.srv.Advance(ctx)
		if got := vmStates(env.state(t, "pool"))["1"]; got != StateDeleting {
			t.Fatalf("VM 1 is %q before the delete delay, want Deleting", got)
		}
		if _, deleted := hook.snapshot(); len(deleted) != 0 {
			t.Fatalf("VMDeleted called early: %v", deleted)
		}
		env.clock.Step(30 * time.Second)
		if _, err := poller.PollUntilDone(ctx, pollOpts()); err != nil {
			t.Fatalf("PollUntilDone: %v", err)
		}
		env.srv.Advance(ctx)
		if got := vmStates(env.state(t, "pool")); !mapsEqual(got, map[string]string{"0": StateRunning, "2": StateRunning}) {
			t.Fatalf("after delete delay: VMs %v", got)
		}
		_, deleted := hook.snapshot()
		if len(deleted) != 1 || !strings.HasSuffix(deleted[0], "/virtualMachineScaleSets/pool/virtualMachines/1") {
			t.Fatalf("VMDeleted calls %v, want VM 1", deleted)
		}
		if _, err := env.vms.Get(ctx, testRG, "pool", "1", nil); responseError(t, err).StatusCode != http.StatusNotFound {
			t.Fatalf("deleted VM still readable")
		}
	})

	t.Run("failed operation", func(t *testing.T) {
		if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultLROFail, Count: 1}); err != nil {
			t.Fatal(err)
		}
		env.srv.ResetCalls()
		poller, err := env.sets.BeginDeleteInstances(ctx, testRG, "pool",
			armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("2")}}, nil)
		if err != nil {
			t.Fatalf("BeginDeleteInstances: %v", err)
		}
		env.clock.Step(30 * time.Second) // the operation ends when the VM is gone
		_, err = poller.PollUntilDone(ctx, pollOpts())
		if re := responseError(t, err); re.ErrorCode != CodeInternalExecutionError {
			t.Fatalf("operation error code %s, want %s", re.ErrorCode, CodeInternalExecutionError)
		}
		if calls := env.srv.Calls(); calls[OpDeleteInstances] != 1 || calls[OpPollOperation] != 1 {
			t.Errorf("calls %v, want 1 DeleteInstances and 1 PollOperation", calls)
		}
		// The VM goes regardless, as in ARM when only the operation's
		// bookkeeping failed.
		env.srv.Advance(ctx)
		if got := vmStates(env.state(t, "pool")); !mapsEqual(got, map[string]string{"0": StateRunning}) {
			t.Fatalf("VMs %v, want only 0", got)
		}
	})

	t.Run("failed deletion", func(t *testing.T) {
		if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultDeleteFails, Count: 1}); err != nil {
			t.Fatal(err)
		}
		poller, err := env.sets.BeginDeleteInstances(ctx, testRG, "pool",
			armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("0")}}, nil)
		if err != nil {
			t.Fatalf("BeginDeleteInstances: %v", err)
		}
		if st := env.state(t, "pool"); vmStates(st)["0"] != StateDeleting || st.Capacity != 0 {
			t.Fatalf("after the accepted delete: %+v, want VM 0 Deleting", st)
		}
		env.clock.Step(30 * time.Second)
		_, err = poller.PollUntilDone(ctx, pollOpts())
		if re := responseError(t, err); re.ErrorCode != CodeInternalExecutionError {
			t.Fatalf("operation error code %s, want %s", re.ErrorCode, CodeInternalExecutionError)
		}
		env.srv.Advance(ctx)
		if st := env.state(t, "pool"); !mapsEqual(vmStates(st), map[string]string{"0": StateRunning}) || st.Capacity != 1 {
			t.Fatalf("after the failed delete: %+v, want VM 0 Running again", st)
		}
		if _, deleted := hook.snapshot(); len(deleted) != 2 {
			t.Fatalf("VMDeleted calls %v: a VM whose deletion failed was reported deleted", deleted)
		}
	})
}

func TestListVMsPaging(t *testing.T) {
	env := newTestEnv(t, Options{PageSize: 10}, ScaleSetSpec{ResourceGroup: testRG, Name: "big", SKU: "Standard_D16s_v5", Capacity: 25})
	ctx := context.Background()
	var ids []string
	pages := 0
	pager := env.vms.NewListPager(testRG, "big", &armcompute.VirtualMachineScaleSetVMsClientListOptions{Expand: to.Ptr("instanceView")})
	for pager.More() {
		var raw *http.Response
		page, err := pager.NextPage(policy.WithCaptureResponse(ctx, &raw))
		if err != nil {
			t.Fatalf("NextPage: %v", err)
		}
		pages++
		if h := raw.Header.Values("x-ms-ratelimit-remaining-resource"); !slices.Equal(h, highCostHeaders(pages)) {
			t.Errorf("page %d: x-ms-ratelimit-remaining-resource %q, want %q", pages, h, highCostHeaders(pages))
		}
		for _, vm := range page.Value {
			ids = append(ids, *vm.InstanceID)
			if vm.Properties.InstanceView == nil {
				t.Errorf("VM %s has no instance view", *vm.InstanceID)
			}
		}
	}
	if pages != 3 || len(ids) != 25 || ids[0] != "0" || ids[24] != "24" {
		t.Fatalf("got %d pages, VMs %v; want 3 pages of VMs 0..24", pages, ids)
	}
	if got := env.srv.Calls()[OpListVMs]; got != 3 {
		t.Fatalf("ListVMs counted %d, want 3", got)
	}
	if got := env.srv.Calls()[OpGetVM]; got != 0 {
		t.Fatalf("GetVM counted %d, want 0", got)
	}
}

func TestThrottling(t *testing.T) {
	ctx := context.Background()
	spec := ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 1}

	t.Run("read bucket", func(t *testing.T) {
		// ARM's read bucket of the principal: 3 tokens, one more every 20 s.
		env := newTestEnv(t, Options{Throttling: Throttling{ARM: ARMLimits{Reads: Rate{Capacity: 3, Refill: 1, Period: 20 * time.Second}}}}, spec)
		for i := range 3 {
			var raw *http.Response
			if _, err := env.sets.Get(policy.WithCaptureResponse(ctx, &raw), testRG, "pool", nil); err != nil {
				t.Fatalf("read %d: %v", i, err)
			}
			if got, want := raw.Header.Get("x-ms-ratelimit-remaining-subscription-reads"), strconv.Itoa(2-i); got != want {
				t.Errorf("read %d: remaining reads %q, want %s", i, got, want)
			}
		}
		_, err := env.sets.Get(ctx, testRG, "pool", nil)
		re := responseError(t, err)
		if re.StatusCode != http.StatusTooManyRequests || re.ErrorCode != "TooManyRequests" {
			t.Fatalf("4th read: %d %s, want 429 TooManyRequests", re.StatusCode, re.ErrorCode)
		}
		// One token refills every 20s.
		if got := re.RawResponse.Header.Get("Retry-After"); got != "20" {
			t.Errorf("Retry-After %q, want 20", got)
		}
		if !strings.Contains(re.Error(), "Number of 'read' requests for subscription '"+testSub+"' actor '"+CallerOf("static-test-token")+"' exceeded") {
			t.Errorf("429 is not ARM's: %v", re)
		}
		// Writes have their own bucket.
		if _, err := env.scaleTo(ctx, "pool", 2, nil); err != nil {
			t.Fatalf("write while reads are throttled: %v", err)
		}
		env.clock.Step(10 * time.Second)
		if _, err := env.sets.Get(ctx, testRG, "pool", nil); responseError(t, err).RawResponse.Header.Get("Retry-After") != "10" {
			t.Fatalf("after 10s: %v, want 429 with Retry-After 10", err)
		}
		env.clock.Step(10 * time.Second)
		if _, err := env.sets.Get(ctx, testRG, "pool", nil); err != nil {
			t.Fatalf("read after refill: %v", err)
		}
		calls := env.srv.Calls()
		if calls[OpThrottled] != 2 || calls[OpGetScaleSet] != 4 {
			t.Fatalf("calls %v, want 2 Throttled and 4 GetScaleSet", calls)
		}
		env.srv.ResetCalls()
		if calls := env.srv.Calls(); len(calls) != 0 {
			t.Fatalf("calls after reset: %v", calls)
		}
	})

	t.Run("throttle writes", func(t *testing.T) {
		env := newTestEnv(t, Options{}, spec)
		env.srv.Throttle("write", 90*time.Second)
		_, err := env.scaleTo(ctx, "pool", 2, nil)
		re := responseError(t, err)
		if re.StatusCode != http.StatusTooManyRequests || re.RawResponse.Header.Get("Retry-After") != "90" {
			t.Fatalf("write: %d Retry-After %q, want 429 and 90", re.StatusCode, re.RawResponse.Header.Get("Retry-After"))
		}
		if _, err := env.sets.Get(ctx, testRG, "pool", nil); err != nil {
			t.Fatalf("read during write throttling: %v", err)
		}
		env.clock.Step(90 * time.Second)
		if _, err := env.scaleTo(ctx, "pool", 2, nil); err != nil {
			t.Fatalf("write after throttling: %v", err)
		}
		if st := env.state(t, "pool"); st.Capacity != 2 {
			t.Fatalf("capacity %d, want 2", st.Capacity)
		}
		// The write log has every attempt: the throttled ones and the last.
		ws := env.srv.Writes()
		if len(ws) < 2 {
			t.Fatalf("write log %+v, want the throttled write and the accepted one", ws)
		}
		for i, w := range ws {
			wantStatus := http.StatusTooManyRequests
			if i == len(ws)-1 {
				wantStatus = http.StatusOK
			}
			if w.Op != OpUpdateScaleSet || w.ScaleSet != "pool" || w.Capacity != 2 || w.Status != wantStatus || w.Method != http.MethodPatch {
				t.Fatalf("write %d: %+v, want a PATCH of pool to capacity 2 answered %d", i, w, wantStatus)
			}
			if w.Caller != CallerOf("static-test-token") || w.Caller == CallerOf("another-token") {
				t.Fatalf("write %d: caller %q, want the fingerprint of the client's token", i, w.Caller)
			}
		}
	})

	t.Run("throttle one caller", func(t *testing.T) {
		env := newTestEnv(t, Options{}, spec)
		me := CallerOf("static-test-token")
		// Another principal throttled: this client is served.
		env.srv.ThrottleCaller(CallerOf("another-token"), "read", time.Minute)
		if _, err := env.sets.Get(ctx, testRG, "pool", nil); err != nil {
			t.Fatalf("read while another caller is throttled: %v", err)
		}
		env.srv.ThrottleCaller(me, "read", 40*time.Second)
		_, err := env.sets.Get(ctx, testRG, "pool", nil)
		if re := responseError(t, err); re.StatusCode != http.StatusTooManyRequests || re.RawResponse.Header.Get("Retry-After") != "40" {
			t.Fatalf("read: %d Retry-After %q, want 429 and 40", re.StatusCode, re.RawResponse.Header.Get("Retry-After"))
		}
		// Its writes are not throttled, and a longer subscription-wide
		// throttle wins over the caller's shorter one.
		if _, err := env.scaleTo(ctx, "pool", 2, nil); err != nil {
			t.Fatalf("write while only reads are throttled: %v", err)
		}
		env.srv.Throttle("read", 70*time.Second)
		_, err = env.sets.Get(ctx, testRG, "pool", nil)
		if re := responseError(t, err); re.RawResponse.Header.Get("Retry-After") != "70" {
			t.Fatalf("read under both throttles: Retry-After %q, want 70", re.RawResponse.Header.Get("Retry-After"))
		}
		env.clock.Step(70 * time.Second)
		if _, err := env.sets.Get(ctx, testRG, "pool", nil); err != nil {
			t.Fatalf("read after both throttles: %v", err)
		}
		if got := env.srv.ThrottleCaller(me, "list", time.Minute); !got.IsZero() {
			t.Fatalf("unknown kind throttled until %v, want the zero time", got)
		}
	})
}

func TestRequestValidation(t *testing.T) {
	env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 1})
	setPath := "/subscriptions/" + testSub + "/resourceGroups/" + testRG + "/providers/Microsoft.Compute/virtualMachineScaleSets/pool"
	tests := []struct {
		name       string
		method     string
		path       string
		auth       bool
		body       string
		wantStatus int
		wantCode   string
	}{
		{"no api-version", http.MethodGet, setPath, true, "", http.StatusBadRequest, "MissingApiVersionParameter"},
		{"no bearer token", http.MethodGet, setPath + "?api-version=2025-04-01", false, "", http.StatusUnauthorized, "AuthenticationFailed"},
		{"unknown path", http.MethodGet, "/subscriptions/" + testSub + "/nothing?api-version=1", true, "", http.StatusNotFound, "NotFound"},
		{"wrong subscription", http.MethodGet, strings.Replace(setPath, testSub, "other", 1) + "?api-version=1", true, "", http.StatusNotFound, "SubscriptionNotFound"},
		{"wrong method", http.MethodDelete, setPath + "?api-version=1", true, "", http.StatusMethodNotAllowed, "MethodNotAllowed"},
		{"bad body", http.MethodPatch, setPath + "?api-version=1", true, "{", http.StatusBadRequest, "InvalidRequestContent"},
		{"capacity out of range", http.MethodPatch, setPath + "?api-version=1", true, `{"sku":{"capacity":5000}}`, http.StatusBadRequest, "InvalidParameter"},
		{"case-insensitive path", http.MethodGet, strings.ToLower(setPath) + "?api-version=1", true, "", http.StatusOK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, env.srv.URL()+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.auth {
				req.Header.Set("Authorization", "Bearer x")
			}
			resp, err := env.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tt.wantStatus, body)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q", ct)
			}
			if resp.Header.Get("x-ms-request-id") == "" || resp.Header.Get("x-ms-ratelimit-remaining-subscription-"+kindOf(tt.method)+"s") == "" {
				t.Errorf("missing ARM headers: %v", resp.Header)
			}
			if tt.wantCode == "" {
				return
			}
			var env errorEnvelope
			if err := json.Unmarshal(body, &env); err != nil || env.Error == nil || *env.Error.Code != tt.wantCode {
				t.Fatalf("body %s, want error code %s", body, tt.wantCode)
			}
		})
	}
}

func TestListSKUs(t *testing.T) {
	env := newTestEnv(t, Options{})
	ctx := context.Background()
	tests := []struct {
		name    string
		filter  *string
		wantLen int
	}{
		{"no filter", nil, len(DefaultSKUs())},
		{"our location", to.Ptr("location eq 'eastus'"), len(DefaultSKUs())},
		{"location case", to.Ptr("Location eq 'EastUS'"), len(DefaultSKUs())},
		{"other location", to.Ptr("location eq 'westeurope'"), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var skus []*armcompute.ResourceSKU
			pager := env.skus.NewListPager(&armcompute.ResourceSKUsClientListOptions{Filter: tt.filter})
			for pager.More() {
				page, err := pager.NextPage(ctx)
				if err != nil {
					t.Fatalf("NextPage: %v", err)
				}
				skus = append(skus, page.Value...)
			}
			if len(skus) != tt.wantLen {
				t.Fatalf("got %d SKUs, want %d", len(skus), tt.wantLen)
			}
			for _, sku := range skus {
				if *sku.ResourceType != "virtualMachines" || *sku.Locations[0] != "eastus" || len(sku.LocationInfo[0].Zones) != 3 {
					t.Errorf("SKU %s: unexpected shape", *sku.Name)
				}
			}
		})
	}

	pager := env.skus.NewListPager(nil)
	page, err := pager.NextPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caps := map[string]map[string]string{}
	for _, sku := range page.Value {
		m := map[string]string{"family": *sku.Family, "size": *sku.Size}
		for _, c := range sku.Capabilities {
			m[*c.Name] = *c.Value
		}
		caps[*sku.Name] = m
	}
	capTests := []struct {
		sku, capability, want string
	}{
		{"Standard_ND96isr_H100_v5", "vCPUs", "96"},
		{"Standard_ND96isr_H100_v5", "MemoryGB", "1900"},
		{"Standard_ND96isr_H100_v5", "GPUs", "8"},
		{"Standard_ND96isr_H100_v5", "family", "standardNDSH100v5Family"},
		{"Standard_ND96isr_H100_v5", "size", "ND96isr_H100_v5"},
		{"Standard_NC24ads_A100_v4", "GPUs", "1"},
		{"Standard_D16ps_v5", "CpuArchitectureType", "Arm64"},
		{"Standard_D16s_v5", "CpuArchitectureType", "x64"},
		{"Standard_D16s_v5", "GPUs", ""},
	}
	for _, tt := range capTests {
		if got := caps[tt.sku][tt.capability]; got != tt.want {
			t.Errorf("%s %s = %q, want %q", tt.sku, tt.capability, got, tt.want)
		}
	}
}

func TestSetCapacity(t *testing.T) {
	env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
	before := env.state(t, "pool")
	if err := env.srv.SetCapacity(testRG, "pool", 4); err != nil {
		t.Fatal(err)
	}
	st := env.state(t, "pool")
	if st.Capacity != 4 || st.ETag == before.ETag || vmStates(st)["3"] != StateCreating {
		t.Fatalf("after SetCapacity(4): %+v", st)
	}
	if err := env.srv.SetCapacity(testRG, "nope", 1); err == nil {
		t.Fatal("SetCapacity of an unknown scale set succeeded")
	}
	if _, err := env.srv.ScaleSet(testRG, "nope"); err == nil {
		t.Fatal("ScaleSet of an unknown scale set succeeded")
	}
}

func TestPollOperationForms(t *testing.T) {
	tests := []struct {
		name        string
		fault       *Fault
		wantStatus  string // final status on the Azure-AsyncOperation URL
		wantMonitor int    // final HTTP status on the Location (monitor) URL
	}{
		{"succeeds", nil, "Succeeded", http.StatusOK},
		{"fails", &Fault{Kind: FaultLROFail}, "Failed", http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{LRODuration: time.Minute},
				ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
			ctx := context.Background()
			if tt.fault != nil {
				if err := env.srv.InjectFault(testRG, "pool", *tt.fault); err != nil {
					t.Fatal(err)
				}
			}
			var initial *http.Response
			if _, err := env.sets.BeginDeleteInstances(policy.WithCaptureResponse(ctx, &initial), testRG, "pool",
				armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("0")}}, nil); err != nil {
				t.Fatalf("BeginDeleteInstances: %v", err)
			}
			asyncURL, monitorURL := initial.Header.Get("Azure-AsyncOperation"), initial.Header.Get("Location")
			if !strings.HasPrefix(asyncURL, env.srv.URL()+"/subscriptions/"+testSub+"/providers/Microsoft.Compute/locations/eastus/operations/") ||
				!strings.HasSuffix(monitorURL, "?monitor=true&api-version=2025-04-01") {
				t.Fatalf("operation URLs %q and %q", asyncURL, monitorURL)
			}
			get := func(u string) (int, http.Header, map[string]any) {
				req, err := http.NewRequest(http.MethodGet, u, nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer x")
				resp, err := env.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = resp.Body.Close() }()
				raw, _ := io.ReadAll(resp.Body)
				var body map[string]any
				if len(raw) > 0 {
					if err := json.Unmarshal(raw, &body); err != nil {
						t.Fatalf("body %s: %v", raw, err)
					}
				}
				return resp.StatusCode, resp.Header, body
			}

			if code, _, body := get(asyncURL); code != http.StatusOK || body["status"] != "InProgress" || body["endTime"] != nil {
				t.Fatalf("async form in progress: %d %v", code, body)
			}
			if code, h, _ := get(monitorURL); code != http.StatusAccepted || h.Get("Location") != monitorURL {
				t.Fatalf("monitor form in progress: %d, Location %q", code, h.Get("Location"))
			}
			env.clock.Step(time.Minute)
			code, _, body := get(asyncURL)
			if code != http.StatusOK || body["status"] != tt.wantStatus || body["endTime"] == nil || body["startTime"] == nil {
				t.Fatalf("async form done: %d %v, want status %s", code, body, tt.wantStatus)
			}
			if tt.wantStatus == "Failed" {
				if e, _ := body["error"].(map[string]any); e["code"] != CodeInternalExecutionError {
					t.Errorf("async form error %v", body["error"])
				}
			}
			if code, _, _ := get(monitorURL); code != tt.wantMonitor {
				t.Fatalf("monitor form done: %d, want %d", code, tt.wantMonitor)
			}
			if got := env.srv.Calls()[OpPollOperation]; got != 4 {
				t.Errorf("PollOperation counted %d, want 4", got)
			}
		})
	}
}

// A running VM whose extension fails turns Failed and keeps running, as ARM
// reports it (provisioningState Failed, PowerState/running), and a repaired
// model brings it back to Succeeded.
func TestFailRunningVMAndRepair(t *testing.T) {
	env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
	ctx := context.Background()
	getVM := func() *armcompute.VirtualMachineScaleSetVM {
		t.Helper()
		r, err := env.vms.Get(ctx, testRG, "pool", "1", &armcompute.VirtualMachineScaleSetVMsClientGetOptions{Expand: to.Ptr(armcompute.InstanceViewTypesInstanceView)})
		if err != nil {
			t.Fatalf("getting VM 1: %v", err)
		}
		return &r.VirtualMachineScaleSetVM
	}
	if err := env.srv.FailRunningVM(testRG, "pool", "1", ""); err != nil {
		t.Fatalf("FailRunningVM: %v", err)
	}
	vm := getVM()
	if got := *vm.Properties.ProvisioningState; got != "Failed" {
		t.Errorf("provisioningState %s, want Failed", got)
	}
	if codes := statusCodes(vm); !slices.Equal(codes, []string{"ProvisioningState/failed/" + CodeVMExtensionProvisioningError, "PowerState/running"}) {
		t.Errorf("instance view statuses %v, want the failure and PowerState/running", codes)
	}
	st := env.state(t, "pool")
	if v := st.VMs[1]; v.State != StateFailed || v.ErrorCode != CodeVMExtensionProvisioningError || v.PowerState != "running" || st.Capacity != 2 {
		t.Errorf("after the failure: %+v (capacity %d), want VM 1 Failed and running, capacity 2", v, st.Capacity)
	}
	if err := env.srv.FailRunningVM(testRG, "pool", "1", ""); err == nil || !strings.Contains(err.Error(), "not Running") {
		t.Errorf("failing a Failed VM again: %v, want an error saying it is not Running", err)
	}
	if err := env.srv.RepairVM(testRG, "pool", "0"); err == nil || !strings.Contains(err.Error(), "VM 0") {
		t.Errorf("repairing a VM that did not fail: %v, want an error naming VM 0", err)
	}
	if err := env.srv.FailRunningVM(testRG, "pool", "7", ""); err == nil || !strings.Contains(err.Error(), "no such instance") {
		t.Errorf("failing an unknown VM: %v, want 'no such instance'", err)
	}
	if err := env.srv.RepairVM(testRG, "pool", "1"); err != nil {
		t.Fatalf("RepairVM: %v", err)
	}
	vm = getVM()
	if got := *vm.Properties.ProvisioningState; got != "Succeeded" {
		t.Errorf("provisioningState after the repair %s, want Succeeded", got)
	}
	if codes := statusCodes(vm); !slices.Equal(codes, []string{"ProvisioningState/succeeded", "PowerState/running"}) {
		t.Errorf("instance view statuses after the repair %v", codes)
	}
}
