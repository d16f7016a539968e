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

// concurrentHook records how many of its calls ran at once; each call
// waits until want calls have been in at once (enough), or freed.
type concurrentHook struct {
	*recordingHook
	mu            sync.Mutex
	now, maxSeen  int
	want          int
	enough, freed chan struct{}
	closed        bool
}

func (h *concurrentHook) VMRunning(ctx context.Context, vm VM) error {
	h.mu.Lock()
	h.now++
	h.maxSeen = max(h.maxSeen, h.now)
	if h.now == h.want && !h.closed {
		close(h.enough)
		h.closed = true
	}
	h.mu.Unlock()
	select {
	case <-h.enough:
	case <-h.freed:
	}
	h.mu.Lock()
	h.now--
	h.mu.Unlock()
	return h.recordingHook.VMRunning(ctx, vm)
}

// TestHookParallelism: with HookParallelism 8, an Advance registers a
// burst's nodes 8 at once (as kubelets register, each on its own), every
// VM once; a failed call is retried at the next Advance as before.
// Serial, the 8th call would never start while the first waits: the test
// would time out (the hook frees its calls after 10 s).
func TestHookParallelism(t *testing.T) {
	inner := newRecordingHook()
	hook := &concurrentHook{recordingHook: inner, want: 8, enough: make(chan struct{}), freed: make(chan struct{})}
	timer := time.AfterFunc(10*time.Second, func() { close(hook.freed) })
	defer timer.Stop()
	env := newTestEnv(t, Options{Hook: hook, HookParallelism: 8},
		ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 40})
	st := env.state(t, "pool")
	inner.failNext[st.VMs[3].ProviderID] = 1
	env.srv.Advance(context.Background())
	hook.mu.Lock()
	maxSeen := hook.maxSeen
	hook.mu.Unlock()
	if maxSeen != 8 {
		t.Fatalf("at most %d hook calls at once, want 8", maxSeen)
	}
	if running, _ := inner.snapshot(); len(running) != 39 {
		t.Fatalf("%d nodes registered, want 39 (one call failed)", len(running))
	}
	env.srv.Advance(context.Background())
	running, _ := inner.snapshot()
	if len(slices.Compact(slices.Sorted(slices.Values(running)))) != 40 || len(running) != 40 {
		t.Fatalf("registered %d (%d distinct), want each of the 40 once", len(running), len(slices.Compact(slices.Sorted(slices.Values(running)))))
	}
}
