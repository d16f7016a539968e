package armsim

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
)

// repairHook records VMRepaired calls besides the node hook's others.
type repairHook struct {
	*recordingHook
	mu       sync.Mutex
	repaired []string // "<instance> <action> fixed=<bool>"
}

func (h *repairHook) VMRepaired(_ context.Context, vm VM, action string, fixed bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.repaired = append(h.repaired, fmt.Sprintf("%s %s fixed=%t", vm.InstanceID, action, fixed))
	return nil
}

func (h *repairHook) calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.repaired...)
}

// beginAction starts a repair action on a VM through the real client.
func (e *testEnv) beginAction(ctx context.Context, set, instance, action string) error {
	var err error
	switch action {
	case ActionRestart:
		_, err = e.vms.BeginRestart(ctx, testRG, set, instance, nil)
	case ActionReimage:
		_, err = e.vms.BeginReimage(ctx, testRG, set, instance, nil)
	case ActionRedeploy:
		_, err = e.vms.BeginRedeploy(ctx, testRG, set, instance, nil)
	default:
		err = fmt.Errorf("no action %q", action)
	}
	return err
}

func vmStateOf(t *testing.T, srv *Server, set, instance string) VMState {
	t.Helper()
	st, err := srv.ScaleSet(testRG, set)
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range st.VMs {
		if vm.InstanceID == instance {
			return vm
		}
	}
	t.Fatalf("no VM %s in %s", instance, set)
	return VMState{}
}

// TestRepairActionsAsAzureServesThem: restart, reimage and redeploy of a
// scale-set VM through the real armcompute client: 202 and an operation
// InProgress for the action's duration (the VM Updating, its power state
// starting), then Succeeded; a fault is cleared by an action that ranks
// at least the one it needs (a reboot does not fix a corrupt OS; a
// redeploy moves the VM to another host), and the hook is told which
// action ended and whether the VM is fixed.
func TestRepairActionsAsAzureServesThem(t *testing.T) {
	tests := []struct {
		action, fixedBy string
		broken, fixed   bool
		hostMoves       bool
	}{
		{action: ActionRestart, fixed: true},
		{action: ActionRestart, broken: true, fixedBy: ActionRestart, fixed: true},
		{action: ActionRestart, broken: true, fixedBy: ActionReimage},
		{action: ActionReimage, broken: true, fixedBy: ActionReimage, fixed: true},
		{action: ActionReimage, broken: true, fixedBy: ActionRedeploy},
		{action: ActionRedeploy, broken: true, fixedBy: ActionReimage, fixed: true, hostMoves: true},
		{action: ActionRedeploy, broken: true, fixedBy: "", hostMoves: true},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/broken=%t,fixedBy=%q", tc.action, tc.broken, tc.fixedBy), func(t *testing.T) {
			hook := &repairHook{recordingHook: newRecordingHook()}
			d := 3 * time.Minute
			e := newTestEnv(t, Options{Hook: hook, RestartDuration: d, ReimageDuration: d, RedeployDuration: d},
				ScaleSetSpec{ResourceGroup: testRG, Name: "gpu", SKU: "Standard_D16s_v5", Capacity: 2})
			ctx := context.Background()
			e.srv.Advance(ctx) // the VMs run; their nodes are registered
			if tc.broken {
				if err := e.srv.BreakVM(testRG, "gpu", "1", tc.fixedBy); err != nil {
					t.Fatal(err)
				}
			}
			var raw *http.Response
			if err := e.beginAction(policy.WithCaptureResponse(ctx, &raw), "gpu", "1", tc.action); err != nil {
				t.Fatalf("%s: %v", tc.action, err)
			}
			if raw.StatusCode != http.StatusAccepted || raw.Header.Get("Azure-AsyncOperation") == "" {
				t.Fatalf("%s answered %d, Azure-AsyncOperation %q; want 202 with one", tc.action, raw.StatusCode, raw.Header.Get("Azure-AsyncOperation"))
			}
			if got := raw.Header.Get(headerRemainingResource); !strings.Contains(got, PolicyUpdateVMScaleSetVMResource) {
				t.Fatalf("%s: %s %q names no %s", tc.action, headerRemainingResource, got, PolicyUpdateVMScaleSetVMResource)
			}
			async := raw.Header.Get("Azure-AsyncOperation")
			if st := e.opStatus(t, async); st.Status != "InProgress" {
				t.Fatalf("operation %s right after the %s, want InProgress", st.Status, tc.action)
			}
			if vm := vmStateOf(t, e.srv, "gpu", "1"); vm.Action != tc.action || vm.PowerState != "starting" {
				t.Fatalf("VM during the %s: action %q, power %q", tc.action, vm.Action, vm.PowerState)
			}
			vm, err := e.vms.Get(ctx, testRG, "gpu", "1", nil)
			if err != nil || *vm.Properties.ProvisioningState != "Updating" {
				t.Fatalf("GET during the %s: %v, %v; want Updating", tc.action, err, vm.Properties)
			}
			e.clock.Step(d)
			e.srv.Advance(ctx)
			if st := e.opStatus(t, async); st.Status != "Succeeded" {
				t.Fatalf("operation %s after the %s's duration, want Succeeded", st.Status, tc.action)
			}
			got := vmStateOf(t, e.srv, "gpu", "1")
			if got.Action != "" || got.Broken == tc.fixed || got.State != StateRunning || (got.Host != 0) != tc.hostMoves {
				t.Fatalf("VM after the %s: %+v; want fixed %t, host moved %t", tc.action, got, tc.fixed, tc.hostMoves)
			}
			if want := fmt.Sprintf("1 %s fixed=%t", tc.action, tc.fixed); len(hook.calls()) != 1 || hook.calls()[0] != want {
				t.Fatalf("hook told %v, want [%s]", hook.calls(), want)
			}
			if other := vmStateOf(t, e.srv, "gpu", "0"); other.Action != "" || other.Host != 0 {
				t.Fatalf("the other VM changed: %+v", other)
			}
		})
	}
}

// TestRepairActionsRefused: an action on a VM ARM does not have is 404;
// on a VM being deleted, or one with an action in progress, 409
// OperationNotAllowed; on a Flexible scale set's VM through the
// scale-set VM API, 400; the 13th restart of one VM within a minute is
// throttled by its per-VM policy (a bucket of 12), another VM's is not.
func TestRepairActionsRefused(t *testing.T) {
	e := newTestEnv(t, Options{ReimageDuration: time.Minute},
		ScaleSetSpec{ResourceGroup: testRG, Name: "gpu", SKU: "Standard_D16s_v5", Capacity: 4},
		ScaleSetSpec{ResourceGroup: testRG, Name: "flex", SKU: "Standard_D16s_v5", Capacity: 1, Flexible: true})
	ctx := context.Background()
	e.srv.Advance(ctx)
	status := func(err error) (int, string) {
		if err == nil {
			return 0, ""
		}
		re := responseError(t, err)
		return re.StatusCode, re.ErrorCode
	}
	if c, code := status(e.beginAction(ctx, "gpu", "9", ActionRestart)); c != http.StatusNotFound {
		t.Fatalf("restart of a VM ARM does not have: %d %s, want 404", c, code)
	}
	if _, err := e.sets.BeginDeleteInstances(ctx, testRG, "gpu",
		armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{to.Ptr("2")}}, nil); err != nil {
		t.Fatal(err)
	}
	if c, code := status(e.beginAction(ctx, "gpu", "2", ActionReimage)); c != http.StatusConflict || code != "OperationNotAllowed" {
		t.Fatalf("reimage of a VM being deleted: %d %s, want 409 OperationNotAllowed", c, code)
	}
	if err := e.beginAction(ctx, "gpu", "1", ActionReimage); err != nil {
		t.Fatal(err)
	}
	if c, code := status(e.beginAction(ctx, "gpu", "1", ActionRedeploy)); c != http.StatusConflict || code != "OperationNotAllowed" {
		t.Fatalf("redeploy during a reimage: %d %s, want 409 OperationNotAllowed", c, code)
	}
	st, _ := e.srv.ScaleSet(testRG, "flex")
	if c, _ := status(e.beginAction(ctx, "flex", st.VMs[0].InstanceID, ActionRestart)); c != http.StatusBadRequest {
		t.Fatalf("restart of a Flexible VM through the scale-set VM API: %d, want 400", c)
	}
	// Restarts end at the next Advance (RestartDuration 0): 12 of VM 0
	// within the same instant empty its bucket.
	for i := range 12 {
		if err := e.beginAction(ctx, "gpu", "0", ActionRestart); err != nil {
			t.Fatalf("restart %d of VM 0: %v", i+1, err)
		}
		e.srv.Advance(ctx)
	}
	if c, code := status(e.beginAction(ctx, "gpu", "0", ActionRestart)); c != http.StatusTooManyRequests {
		t.Fatalf("13th restart of VM 0 within a minute: %d %s, want 429", c, code)
	}
	if got := e.srv.Throttled()[PolicyUpdateVMScaleSetVMResource]; got != 1 {
		t.Fatalf("%s refused %d, want 1", PolicyUpdateVMScaleSetVMResource, got)
	}
	if err := e.beginAction(ctx, "gpu", "3", ActionRestart); err != nil {
		t.Fatalf("VM 3's restart after VM 0's bucket emptied: %v", err)
	}
}

// TestRepairActionsOnAFlexibleVM: a Flexible scale set's VM is restarted,
// reimaged and redeployed through the Virtual Machines API (the real
// client's VirtualMachinesClient), served like a scale-set VM's action —
// 202, an operation InProgress for the action's duration, then
// Succeeded, the fault cleared, the hook told — and charged to the "Update
// VM" policy of that VM; an unknown VM name is 404.
func TestRepairActionsOnAFlexibleVM(t *testing.T) {
	for _, action := range []string{ActionRestart, ActionReimage, ActionRedeploy} {
		t.Run(action, func(t *testing.T) {
			hook := &repairHook{recordingHook: newRecordingHook()}
			d := 3 * time.Minute
			e := newTestEnv(t, Options{Hook: hook, RestartDuration: d, ReimageDuration: d, RedeployDuration: d},
				ScaleSetSpec{ResourceGroup: testRG, Name: "flex", SKU: "Standard_D16s_v5", Capacity: 2, Flexible: true})
			ctx := context.Background()
			e.srv.Advance(ctx)
			st, _ := e.srv.ScaleSet(testRG, "flex")
			name := st.VMs[1].InstanceID
			if err := e.srv.BreakVM(testRG, "flex", name, ActionRestart); err != nil {
				t.Fatal(err)
			}
			var raw *http.Response
			cctx := policy.WithCaptureResponse(ctx, &raw)
			var err error
			switch action {
			case ActionRestart:
				_, err = e.virtualMachines.BeginRestart(cctx, testRG, name, nil)
			case ActionReimage:
				_, err = e.virtualMachines.BeginReimage(cctx, testRG, name, nil)
			case ActionRedeploy:
				_, err = e.virtualMachines.BeginRedeploy(cctx, testRG, name, nil)
			}
			if err != nil {
				t.Fatalf("%s of %s: %v", action, name, err)
			}
			if raw.StatusCode != http.StatusAccepted || !strings.Contains(raw.Header.Get(headerRemainingResource), PolicyUpdateVMResource) {
				t.Fatalf("%s answered %d, %s %q; want 202 charged to %s", action, raw.StatusCode, headerRemainingResource,
					raw.Header.Get(headerRemainingResource), PolicyUpdateVMResource)
			}
			async := raw.Header.Get("Azure-AsyncOperation")
			if op := e.opStatus(t, async); op.Status != "InProgress" {
				t.Fatalf("operation %s right after the %s, want InProgress", op.Status, action)
			}
			e.clock.Step(d)
			e.srv.Advance(ctx)
			if op := e.opStatus(t, async); op.Status != "Succeeded" {
				t.Fatalf("operation %s after the %s's duration, want Succeeded", op.Status, action)
			}
			if got := vmStateOf(t, e.srv, "flex", name); got.Broken || got.Action != "" || (got.Host != 0) != (action == ActionRedeploy) {
				t.Fatalf("VM after the %s: %+v", action, got)
			}
			if want := fmt.Sprintf("%s %s fixed=true", name, action); len(hook.calls()) != 1 || hook.calls()[0] != want {
				t.Fatalf("hook told %v, want [%s]", hook.calls(), want)
			}
			w := e.srv.Writes()[len(e.srv.Writes())-1]
			if w.ScaleSet != "flex" || len(w.InstanceIDs) != 1 || w.InstanceIDs[0] != name || actionOf(w.Op) != action {
				t.Fatalf("write logged %+v, want the %s of %s in flex", w, action, name)
			}
		})
	}
	t.Run("unknown VM", func(t *testing.T) {
		e := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "flex", SKU: "Standard_D16s_v5", Capacity: 1, Flexible: true})
		_, err := e.virtualMachines.BeginRestart(context.Background(), testRG, "flex_00000000", nil)
		if re := responseError(t, err); re.StatusCode != http.StatusNotFound {
			t.Fatalf("restart of an unknown VM: %d %s, want 404", re.StatusCode, re.ErrorCode)
		}
	})
}
