package armsim

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestHookCalledOncePerVMAndRetried(t *testing.T) {
	hook := newRecordingHook()
	env := newTestEnv(t, Options{BootDelay: time.Minute, Hook: hook},
		ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
	ctx := context.Background()
	st := env.state(t, "pool")
	flaky := st.VMs[1].ProviderID
	hook.failNext[flaky] = 2

	steps := []struct {
		name        string
		do          func()
		wantRunning int // successful VMRunning calls so far
	}{
		{"initial VMs; one call fails", func() { env.srv.Advance(ctx) }, 1},
		{"failed call retried and fails again", func() { env.srv.Advance(ctx) }, 1},
		{"retry succeeds", func() { env.srv.Advance(ctx) }, 2},
		{"no repeats", func() { env.srv.Advance(ctx) }, 2},
		{"scale-out, VMs still booting", func() {
			if _, err := env.scaleTo(ctx, "pool", 4, nil); err != nil {
				t.Fatal(err)
			}
			env.srv.Advance(ctx)
		}, 2},
		{"booted", func() { env.clock.Step(time.Minute); env.srv.Advance(ctx) }, 4},
		{"no repeats after boot", func() { env.srv.Advance(ctx) }, 4},
	}
	for _, step := range steps {
		step.do()
		running, _ := hook.snapshot()
		if len(running) != step.wantRunning {
			t.Fatalf("%s: %d VMRunning calls succeeded (%v), want %d", step.name, len(running), running, step.wantRunning)
		}
	}
	running, _ := hook.snapshot()
	sorted := slices.Sorted(slices.Values(running))
	if len(slices.Compact(sorted)) != 4 {
		t.Fatalf("VMRunning repeated for a VM: %v", running)
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if hook.attempts[flaky] != 3 {
		t.Fatalf("flaky VM got %d attempts, want 3", hook.attempts[flaky])
	}
}

func TestHookVMDescription(t *testing.T) {
	hook := newRecordingHook()
	var got []VM
	var mu sync.Mutex
	capture := hookFunc{running: func(vm VM) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, vm)
		return hook.VMRunning(context.Background(), vm)
	}}
	env := newTestEnv(t, Options{Hook: capture, Location: "westus3"},
		ScaleSetSpec{ResourceGroup: testRG, Name: "gpu", SKU: "Standard_ND96asr_v4", Capacity: 1,
			Tags: map[string]string{"k": "v"}, Zones: []string{"3"}})
	env.srv.Advance(context.Background())
	if len(got) != 1 {
		t.Fatalf("got %d VMRunning calls, want 1", len(got))
	}
	vm := got[0]
	want := VM{
		ResourceGroup: testRG, ScaleSet: "gpu", InstanceID: "0", ComputerName: "gpu000000",
		ProviderID: "azure:///subscriptions/" + testSub + "/resourceGroups/" + testRG +
			"/providers/Microsoft.Compute/virtualMachineScaleSets/gpu/virtualMachines/0",
		Location: "westus3", Zone: "3",
	}
	if vm.ResourceGroup != want.ResourceGroup || vm.ScaleSet != want.ScaleSet || vm.InstanceID != want.InstanceID ||
		vm.ComputerName != want.ComputerName || vm.ProviderID != want.ProviderID || vm.Location != want.Location ||
		vm.Zone != want.Zone || vm.SKU.Name != "Standard_ND96asr_v4" || vm.SKU.GPUs != 8 || vm.Tags["k"] != "v" {
		t.Fatalf("VM %+v, want %+v with the ND96asr_v4 SKU and tag k=v", vm, want)
	}
	if st := env.state(t, "gpu"); st.VMs[0].ProviderID != want.ProviderID {
		t.Fatalf("ScaleSet provider ID %s, want %s", st.VMs[0].ProviderID, want.ProviderID)
	}
}

func TestComputerNameBase36(t *testing.T) {
	set := &scaleSet{name: "pool", computerPrefix: "pool"}
	tests := []struct {
		id   int
		want string
	}{
		{0, "pool000000"},
		{35, "pool00000z"},
		{36, "pool000010"},
		{1295, "pool0000zz"},
	}
	for _, tt := range tests {
		if got := (&vmRecord{set: set, instanceID: tt.id}).computerName(); got != tt.want {
			t.Errorf("instance %d: computer name %s, want %s", tt.id, got, tt.want)
		}
	}
}

func TestRunAdvancesWithoutRequests(t *testing.T) {
	hook := newRecordingHook()
	env := newTestEnv(t, Options{Hook: hook},
		ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 3})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		env.srv.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	// Concurrent API traffic while Run advances.
	if _, err := env.scaleTo(context.Background(), "pool", 5, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "VMRunning for all 5 VMs", func() bool {
		running, _ := hook.snapshot()
		return len(running) == 5
	})
	eventually(t, "all VMs Running", func() bool {
		for _, vm := range env.state(t, "pool").VMs {
			if vm.State != StateRunning {
				return false
			}
		}
		return true
	})
}

// hookFunc adapts functions to NodeHook.
type hookFunc struct {
	running, deleted func(VM) error
}

func (h hookFunc) VMRunning(_ context.Context, vm VM) error {
	if h.running == nil {
		return nil
	}
	return h.running(vm)
}

func (h hookFunc) VMDeleted(_ context.Context, vm VM) error {
	if h.deleted == nil {
		return nil
	}
	return h.deleted(vm)
}
