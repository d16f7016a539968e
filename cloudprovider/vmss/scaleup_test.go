package vmss

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// TestScaleUpWritesAnAbsoluteTarget: a scale-up from 2 by 3 writes the
// capacity 5, computed once from the size the loop decided on. Whatever
// ARM answers (a 5xx that did or did not commit, a commit that lands after
// the read-back, a 412 because another writer changed the scale set), every
// write asks for 5, never for a fresh size plus 3; a scale set found at or
// above 5 is not written again (when another writer raised it, or a failed
// deletion restored its machines, the call says nothing was sent, so the
// core plans the demand again from the fresh size rather than count it
// released); and the fence is checked before each write, not only when
// the call starts.
func TestScaleUpWritesAnAbsoluteTarget(t *testing.T) {
	const from, delta, target = 2, 3, 5
	inject := func(fault armsim.Fault) func(*testing.T, *fixture) {
		return func(t *testing.T, f *fixture) {
			if err := f.sim.InjectFault("rg", "gpu", fault); err != nil {
				t.Fatal(err)
			}
		}
	}
	otherWriterSets := func(n int) func(*testing.T, *fixture) {
		return func(t *testing.T, f *fixture) {
			if err := f.sim.SetCapacity("rg", "gpu", n); err != nil {
				t.Fatal(err)
			}
		}
	}
	const (
		ok = http.StatusOK
		e5 = http.StatusInternalServerError
		pf = http.StatusPreconditionFailed
	)
	tests := []struct {
		name string
		// setup runs after the provider read the scale set at capacity 2.
		setup func(*testing.T, *fixture)
		// fenceAfter closes the fence once ARM answered this many writes
		// (0: it stays open).
		fenceAfter int
		// wantWrites are the statuses of the writes sent, in order; every
		// one must ask for the target.
		wantWrites []int
		// wantReads is the number of GETs of the scale set (read-backs).
		wantReads int
		// wantCapacity is ARM's capacity once every late commit landed.
		wantCapacity int
		// wantClass is the class of the error, or -1 for success.
		wantClass cloudprovider.ErrorClass
	}{
		{"a commit visible at once is not written again",
			inject(armsim.Fault{Kind: armsim.FaultCommitThenServerError, Count: 1}), 0, []int{e5}, 1, target, -1},
		{"a 5xx without a commit: the same target once more",
			inject(armsim.Fault{Kind: armsim.FaultServerError, Count: 1}), 0, []int{e5, ok}, 1, target, -1},
		{"a commit that lands after the read-back ends at the target, not the delta twice",
			inject(armsim.Fault{Kind: armsim.FaultCommitLate, Count: 1}), 0, []int{e5, pf}, 2, target, -1},
		{"412, another writer raised it above the target: no write, not sent",
			otherWriterSets(6), 0, []int{pf}, 1, 6, cloudprovider.ClassThrottled},
		{"412, another writer raised it to the target: no write, not sent",
			otherWriterSets(target), 0, []int{pf}, 1, target, cloudprovider.ClassThrottled},
		{"412, another writer raised it short of the target: the target",
			otherWriterSets(3), 0, []int{pf, ok}, 1, target, -1},
		{"412, another writer lowered it: the target",
			otherWriterSets(1), 0, []int{pf, ok}, 1, target, -1},
		{"412, another writer changed something else: the target",
			func(t *testing.T, f *fixture) {
				if err := f.sim.FailRunningVM("rg", "gpu", "0", ""); err != nil {
					t.Fatal(err)
				}
			}, 0, []int{pf, ok}, 1, target, -1},
		// None lands before Advance (Lag 5): three writes, all answered
		// 500, then an error (the outcome is unknown); all three land.
		{"three late commits: three writes of the target, an error, and the target once they land",
			inject(armsim.Fault{Kind: armsim.FaultCommitLate, Count: 3, Lag: 5}), 0, []int{e5, e5, e5}, 2, target, cloudprovider.ClassOther},
		{"the fence closes after a 5xx: no second write",
			inject(armsim.Fault{Kind: armsim.FaultServerError, Count: 1}), 1, []int{e5}, 1, from, cloudprovider.ClassFenced},
		{"the fence closes after a 412: no second write",
			otherWriterSets(3), 1, []int{pf}, 1, 3, cloudprovider.ClassFenced},
		{"the fence closes after a 5xx that committed: nothing to write, done",
			inject(armsim.Fault{Kind: armsim.FaultCommitThenServerError, Count: 1}), 1, []int{e5}, 1, target, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", from, nil)}, withNodes("0:10:gpu"), withOperationsInProgress())
			f.refresh()
			tc.setup(t, f)
			f.sim.ResetCalls()
			fence := func() error {
				if tc.fenceAfter > 0 && len(f.sim.Writes()) >= tc.fenceAfter {
					return errors.New("lease not renewed")
				}
				return nil
			}
			var g cloudprovider.NodeGroup
			for _, fg := range cloudprovider.WithFence(f.p, fence).NodeGroups() {
				if fg.ID() == "gpu" {
					g = fg
				}
			}

			err := g.IncreaseSize(f.ctx, delta)

			if tc.wantClass < 0 && err != nil {
				t.Errorf("IncreaseSize: %v, want success", err)
			}
			if tc.wantClass >= 0 && (err == nil || cloudprovider.ClassOf(err) != tc.wantClass) {
				t.Errorf("IncreaseSize: %v (class %v), want a %v error", err, cloudprovider.ClassOf(err), tc.wantClass)
			}
			if tc.wantClass == cloudprovider.ClassThrottled && !errors.Is(err, cloudprovider.ErrNotSent) {
				t.Errorf("IncreaseSize: %v, want it marked not sent (the core plans the demand again)", err)
			}
			var statuses []int
			for _, w := range f.sim.Writes() {
				if w.Op != armsim.OpUpdateScaleSet || w.Capacity != target {
					t.Errorf("write %+v: want an update of the capacity to %d", w, target)
				}
				statuses = append(statuses, w.Status)
			}
			if !slices.Equal(statuses, tc.wantWrites) {
				t.Errorf("writes answered %v, want %v", statuses, tc.wantWrites)
			}
			if got := f.sim.Calls()[armsim.OpGetScaleSet]; got != tc.wantReads {
				t.Errorf("%d reads of the scale set, want %d", got, tc.wantReads)
			}
			f.sim.Advance(f.ctx) // lands what is still late
			if st, _ := f.sim.ScaleSet("rg", "gpu"); st.Capacity != tc.wantCapacity {
				t.Errorf("capacity %d, want %d", st.Capacity, tc.wantCapacity)
			}
			if err == nil {
				if n, _ := g.TargetSize(); n != tc.wantCapacity {
					t.Errorf("target size %d, want %d", n, tc.wantCapacity)
				}
			}
		})
	}
}

// TestEveryWriteChecksTheFenceRightBeforeItIsSent: a fence that passes the
// check at the call and closes before the request stops the request: the
// provider checks the guards again right before each write it sends.
func TestEveryWriteChecksTheFenceRightBeforeItIsSent(t *testing.T) {
	tests := []struct {
		name  string
		write func(context.Context, cloudprovider.NodeGroup) error
	}{
		{"IncreaseSize", func(ctx context.Context, g cloudprovider.NodeGroup) error { return g.IncreaseSize(ctx, 1) }},
		{"DecreaseTargetSize", func(ctx context.Context, g cloudprovider.NodeGroup) error { return g.DecreaseTargetSize(ctx, -1) }},
		{"DeleteNodes", func(ctx context.Context, g cloudprovider.NodeGroup) error {
			ins, err := g.Instances()
			if err != nil || len(ins) == 0 {
				return fmt.Errorf("no instance to delete: %v", err)
			}
			return g.DeleteNodes(ctx, []string{ins[0].ProviderID})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("0:10:gpu"), withOperationsInProgress())
			f.refresh()
			// One VM asked for and not listed yet: room for a decrease.
			if err := f.group("gpu").IncreaseSize(f.ctx, 1); err != nil {
				t.Fatal(err)
			}
			f.sim.ResetCalls()
			checks := 0
			fence := func() error { // passes the check at the call only
				if checks++; checks > 1 {
					return errors.New("lease not renewed")
				}
				return nil
			}
			g := cloudprovider.WithFence(f.p, fence).NodeGroups()[0]
			err := tc.write(f.ctx, g)
			if cloudprovider.ClassOf(err) != cloudprovider.ClassFenced {
				t.Errorf("%s: %v (class %v), want a fenced error", tc.name, err, cloudprovider.ClassOf(err))
			}
			if w := f.sim.Writes(); len(w) != 0 {
				t.Errorf("writes sent past a closed fence: %+v", w)
			}
		})
	}
}
