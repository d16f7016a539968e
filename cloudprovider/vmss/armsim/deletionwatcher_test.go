package armsim

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
)

// watchingHook is a NodeHook and DeletionWatcher recording VMsDeleting
// calls. Each call also reads the server's state, which only works when the
// server has released its lock, and checks that the VMs are Deleting by then.
type watchingHook struct {
	hookFunc
	srv *Server

	mu    sync.Mutex
	calls [][]string // per call: "set/instanceID/computerName"
	errs  []string
}

func (h *watchingHook) VMsDeleting(_ context.Context, vms []VM) {
	var call []string
	var errs []string
	for _, vm := range vms {
		call = append(call, vm.ScaleSet+"/"+vm.InstanceID+"/"+vm.ComputerName)
		st, err := h.srv.ScaleSet(vm.ResourceGroup, vm.ScaleSet) // deadlocks if the lock is held
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		if s := vmStates(st)[vm.InstanceID]; s != StateDeleting {
			errs = append(errs, fmt.Sprintf("VM %s/%s is %q when the watcher is told, want Deleting", vm.ScaleSet, vm.InstanceID, s))
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, call)
	h.errs = append(h.errs, errs...)
}

func (h *watchingHook) snapshot() ([][]string, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls), slices.Clone(h.errs)
}

// TestDeletionWatcherToldWhenRequestsStartDeletions checks that a hook that
// is a DeletionWatcher is told, before the answer, of exactly the VMs an
// accepted request started deleting, and of nothing for requests that
// deleted nothing, were refused, or were not requests (SetCapacity).
func TestDeletionWatcherToldWhenRequestsStartDeletions(t *testing.T) {
	ctx := context.Background()
	deleteIDs := func(ids ...string) func(*testing.T, *testEnv) error {
		return func(t *testing.T, env *testEnv) error {
			_, err := env.sets.BeginDeleteInstances(ctx, testRG, "pool",
				armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: to.SliceOfPtrs(ids...)}, nil)
			return err
		}
	}
	scale := func(n int64, ifMatch *string) func(*testing.T, *testEnv) error {
		return func(t *testing.T, env *testEnv) error {
			_, err := env.scaleTo(ctx, "pool", n, ifMatch)
			return err
		}
	}
	tests := []struct {
		name string
		// before runs first, unwatched calls excepted: its calls are dropped.
		before  func(*testing.T, *testEnv)
		do      func(*testing.T, *testEnv) error
		wantErr string
		want    [][]string
	}{
		{name: "delete instances", do: deleteIDs("2", "0"),
			want: [][]string{{"pool/0/pool000000", "pool/2/pool000002"}}},
		{name: "capacity decrease deletes the newest", do: scale(2, nil),
			want: [][]string{{"pool/2/pool000002", "pool/3/pool000003"}}},
		{name: "already deleting is not told again",
			before: func(t *testing.T, env *testEnv) {
				if err := deleteIDs("1")(t, env); err != nil {
					t.Fatal(err)
				}
			},
			do: deleteIDs("1", "3"), want: [][]string{{"pool/3/pool000003"}}},
		{name: "capacity decrease takes VMs still creating first",
			before: func(t *testing.T, env *testEnv) {
				if err := scale(5, nil)(t, env); err != nil { // VM 4 boots in a minute
					t.Fatal(err)
				}
			},
			do: scale(3, nil), want: [][]string{{"pool/3/pool000003", "pool/4/pool000004"}}},
		{name: "committed but answered 500",
			before: func(t *testing.T, env *testEnv) {
				if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultCommitThenServerError, Count: 1}); err != nil {
					t.Fatal(err)
				}
			},
			do: scale(3, nil), wantErr: "InternalServerError", want: [][]string{{"pool/3/pool000003"}}},
		{name: "capacity increase", do: scale(6, nil)},
		{name: "capacity unchanged", do: scale(4, nil)},
		{name: "refused: unknown instance", do: deleteIDs("1", "9"), wantErr: "InvalidParameter"},
		{name: "refused: stale ETag", do: scale(1, to.Ptr(`"999"`)), wantErr: "PreconditionFailed"},
		{name: "refused: server error",
			before: func(t *testing.T, env *testEnv) {
				if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultServerError, Count: 1}); err != nil {
					t.Fatal(err)
				}
			},
			do: deleteIDs("1"), wantErr: "InternalServerError"},
		{name: "Go call, not a request", do: func(t *testing.T, env *testEnv) error {
			return env.srv.SetCapacity(testRG, "pool", 1)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hook := &watchingHook{}
			env := newTestEnv(t, Options{Hook: hook, BootDelay: time.Minute},
				ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 4})
			hook.srv = env.srv
			if tt.before != nil {
				tt.before(t, env)
			}
			hook.mu.Lock()
			hook.calls = nil
			hook.mu.Unlock()

			wantError(t, tt.name, tt.do(t, env), tt.wantErr)
			calls, errs := hook.snapshot()
			if len(errs) > 0 {
				t.Errorf("watcher saw: %v", errs)
			}
			if !slices.EqualFunc(calls, tt.want, slices.Equal[[]string]) {
				t.Errorf("VMsDeleting calls = %q, want %q", calls, tt.want)
			}
		})
	}
}

// TestNoDeletionWatcherNoRecording checks that a hook that is not a
// DeletionWatcher leaves the server recording nothing.
func TestNoDeletionWatcherNoRecording(t *testing.T) {
	env := newTestEnv(t, Options{Hook: newRecordingHook()},
		ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
	if _, err := env.scaleTo(context.Background(), "pool", 0, nil); err != nil {
		t.Fatal(err)
	}
	env.srv.mu.Lock()
	defer env.srv.mu.Unlock()
	if env.srv.watcher != nil || env.srv.recordDeleting || len(env.srv.deleting) > 0 {
		t.Fatalf("server without a watcher: watcher %v, recording %v, %d VMs recorded", env.srv.watcher, env.srv.recordDeleting, len(env.srv.deleting))
	}
}

// blockingWatcher holds VMsDeleting until released.
type blockingWatcher struct {
	hookFunc
	entered, release chan struct{}
}

func (w *blockingWatcher) VMsDeleting(context.Context, []VM) {
	close(w.entered)
	<-w.release
}

// TestDeletionWatcherCalledBeforeTheAnswer checks that the caller of a
// deletion gets no answer while the watcher runs.
func TestDeletionWatcherCalledBeforeTheAnswer(t *testing.T) {
	w := &blockingWatcher{entered: make(chan struct{}), release: make(chan struct{})}
	env := newTestEnv(t, Options{Hook: w},
		ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 2})
	answered := make(chan error, 1)
	go func() {
		_, err := env.scaleTo(context.Background(), "pool", 1, nil)
		answered <- err
	}()
	<-w.entered
	select {
	case err := <-answered:
		close(w.release)
		t.Fatalf("the PATCH was answered (err %v) while the watcher ran", err)
	case <-time.After(100 * time.Millisecond): // a window for a wrong answer to show, not synchronisation
	}
	close(w.release)
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
}
