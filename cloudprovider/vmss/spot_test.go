package vmss

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// spotSet is a Spot scale set of H100 VMs with the eviction policy.
func spotSet(name string, capacity int, policy string, flexible bool) armsim.ScaleSetSpec {
	s := gpuSet(name, capacity, nil)
	s.Spot, s.EvictionPolicy, s.Flexible = true, policy, flexible
	return s
}

// evict evicts the scale set's VMs at the given indexes at once.
func (f *fixture) evict(name string, idx ...int) {
	f.t.Helper()
	st, err := f.sim.ScaleSet("rg", name)
	if err != nil {
		f.t.Fatal(err)
	}
	var keys []string
	for _, i := range idx {
		keys = append(keys, st.VMs[i].InstanceID)
	}
	if err := f.sim.EvictSpotVMs("rg", name, 0, keys...); err != nil {
		f.t.Fatal(err)
	}
	f.sim.Advance(f.ctx)
}

// TestSpotSizeReadFreshBeforeActing: Azure evicted 3 of a Spot scale
// set's 6 VMs (policy Delete: its capacity is 3) since the cache read 6.
// A scale-up by 2 asks for 5, not 8; a deletion that the fresh size puts
// below the min is refused; a regular scale set is not read again.
func TestSpotSizeReadFreshBeforeActing(t *testing.T) {
	for _, flexible := range []bool{false, true} {
		t.Run(fmt.Sprintf("flexible=%v", flexible), func(t *testing.T) {
			f := newFixture(t, []armsim.ScaleSetSpec{spotSet("spot", 6, armsim.EvictionDelete, flexible), gpuSet("regular", 1, nil)},
				withNodes("3:10:spot", "0:10:regular"), withOperationsInProgress())
			f.refresh()
			g := f.group("spot")
			ins, _ := g.Instances()
			f.evict("spot", 0, 1, 2)
			if n, _ := g.TargetSize(); n != 6 {
				t.Fatalf("cached size %d, want 6 (the cache is older than the eviction)", n)
			}
			f.sim.ResetCalls()
			if err := g.DeleteNodes(f.ctx, []string{ins[5].ProviderID}); !errors.Is(err, cloudprovider.ErrNotSent) || !strings.Contains(err.Error(), "below its min 3 (size 3)") {
				t.Fatalf("deleting 1 of 3 with min 3: %v, want refused on the fresh size", err)
			}
			if err := g.IncreaseSize(f.ctx, 2); err != nil {
				t.Fatal(err)
			}
			if st, _ := f.sim.ScaleSet("rg", "spot"); st.Capacity != 5 {
				t.Fatalf("capacity %d after a scale-up by 2, want 5 (3 left after the eviction + 2)", st.Capacity)
			}
			if c := f.sim.Calls(); c[armsim.OpGetScaleSet] != 2 {
				t.Fatalf("calls %v, want one GET before each action", c)
			}
			f.sim.ResetCalls()
			if err := f.group("regular").IncreaseSize(f.ctx, 1); err != nil {
				t.Fatal(err)
			}
			if c := f.sim.Calls(); c[armsim.OpGetScaleSet] != 0 {
				t.Fatalf("a regular scale set was read before its scale-up: %v", c)
			}
			// A fresh read that fails: no action, nothing written.
			f.sim.ResetCalls()
			f.sim.Throttle("read", time.Minute)
			if err := g.IncreaseSize(f.ctx, 1); err == nil || !strings.Contains(err.Error(), "reading the capacity of Spot scale set spot") {
				t.Fatalf("scale-up with the fresh read throttled: %v", err)
			}
			if w := f.sim.Writes(); len(w) != 0 {
				t.Fatalf("wrote %+v after a failed fresh read", w)
			}
		})
	}
}

// TestSpotDeallocatedVMsReportedForDeletion: VMs evicted under policy
// Deallocate stay in the capacity, run nothing and hold quota: they are
// failed instances (evicted), which the core deletes. Evicted before the
// provider's first list, they are no evictions of its to report.
func TestSpotDeallocatedVMsReportedForDeletion(t *testing.T) {
	for _, flexible := range []bool{false, true} {
		t.Run(fmt.Sprintf("flexible=%v", flexible), func(t *testing.T) {
			f := newFixture(t, []armsim.ScaleSetSpec{spotSet("spot", 4, armsim.EvictionDeallocate, flexible)}, withNodes("0:10:spot"))
			f.evict("spot", 1, 3)
			f.refresh()
			g := f.group("spot")
			if n, _ := g.TargetSize(); n != 4 {
				t.Fatalf("target %d, want 4 (deallocated VMs stay in the capacity)", n)
			}
			if ev := f.p.Evictions(); len(ev) != 0 {
				t.Fatalf("evictions %+v at the first list, want none: they happened before this process looked", ev)
			}
			ins, _ := g.Instances()
			var evicted []string
			for _, in := range ins {
				if in.Error != nil {
					if in.Error.Code != CodeSpotEvicted || in.Error.Class != cloudprovider.ClassEvicted || in.State != cloudprovider.InstanceRunning {
						t.Fatalf("evicted instance %+v, want a %s evicted error on a live instance", in, CodeSpotEvicted)
					}
					evicted = append(evicted, in.ProviderID)
				}
			}
			st, _ := f.sim.ScaleSet("rg", "spot")
			if want := []string{st.VMs[1].ProviderID, st.VMs[3].ProviderID}; !slices.Equal(evicted, want) {
				t.Fatalf("instances in error %v, want the evicted %v", evicted, want)
			}
			if err := g.DeleteNodes(f.ctx, evicted); err != nil {
				t.Fatal(err)
			}
			if st, _ := f.sim.ScaleSet("rg", "spot"); st.Capacity != 2 {
				t.Fatalf("capacity %d after deleting the deallocated VMs, want 2", st.Capacity)
			}
		})
	}
}

// TestSpotTemplate: a Spot group's template carries AKS's Spot label and
// taint (once, when a tag states the taint too); a regular group's does
// not.
func TestSpotTemplate(t *testing.T) {
	spot := spotSet("spot", 0, armsim.EvictionDelete, false)
	tagged := spotSet("tagged", 0, armsim.EvictionDeallocate, true)
	tagged.Tags = map[string]string{tagTaintPrefix + "kubernetes.azure.com__scalesetpriority": "spot:NoSchedule"}
	f := newFixture(t, []armsim.ScaleSetSpec{spot, tagged, gpuSet("regular", 0, nil)}, withNodes("0:5:spot", "0:5:tagged", "0:5:regular"))
	f.refresh()
	want := apiv1.Taint{Key: SpotLabel, Value: SpotValue, Effect: apiv1.TaintEffectNoSchedule}
	for name, wantSpot := range map[string]bool{"spot": true, "tagged": true, "regular": false} {
		n, err := f.group(name).TemplateNode()
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for _, taint := range n.Spec.Taints {
			if taint == want {
				count++
			}
		}
		if (n.Labels[SpotLabel] == SpotValue) != wantSpot || count != map[bool]int{true: 1, false: 0}[wantSpot] {
			t.Fatalf("%s: labels %v, taints %v; want the Spot label and taint: %v", name, n.Labels, n.Spec.Taints, wantSpot)
		}
	}
}

// vmsOf returns the scale set's VMs, in the simulator's order.
func (f *fixture) vmsOf(name string) []armsim.VMState {
	f.t.Helper()
	st, err := f.sim.ScaleSet("rg", name)
	if err != nil {
		f.t.Fatal(err)
	}
	return st.VMs
}

// evictVMs evicts the given VMs at once.
func (f *fixture) evictVMs(name string, vms ...armsim.VMState) {
	f.t.Helper()
	var keys []string
	for _, vm := range vms {
		keys = append(keys, vm.InstanceID)
	}
	if err := f.sim.EvictSpotVMs("rg", name, 0, keys...); err != nil {
		f.t.Fatal(err)
	}
	f.sim.Advance(f.ctx)
}

// takeEvictions refreshes past the cache TTL and returns the evictions
// reported since the last call, as "provider ID/group/deallocated".
func (f *fixture) takeEvictions() []string {
	f.t.Helper()
	f.expire()
	f.refresh()
	var out []string
	for _, e := range f.p.Evictions() {
		out = append(out, fmt.Sprintf("%s/%s/%v", e.ProviderID, e.Group, e.Deallocated))
	}
	slices.Sort(out)
	return out
}

// TestSpotEvictionsReported: a Spot scale set's VMs that Azure evicts are
// reported once each, by the refresh that first sees them gone, deleting
// or deallocated without a deletion of ours: under policy Delete whether
// the list shows them deleting or no longer has them; never the VMs this
// process deleted, never a regular scale set's, never twice.
func TestSpotEvictionsReported(t *testing.T) {
	for _, policy := range []string{armsim.EvictionDelete, armsim.EvictionDeallocate} {
		for _, flexible := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/flexible=%v", policy, flexible), func(t *testing.T) {
				f := newFixture(t, []armsim.ScaleSetSpec{spotSet("spot", 6, policy, flexible), gpuSet("regular", 2, nil)},
					withNodes("0:10:spot", "0:10:regular"))
				f.refresh()
				if ev := f.p.Evictions(); len(ev) != 0 {
					t.Fatalf("evictions %+v at the first list", ev)
				}
				vms := f.vmsOf("spot")
				deallocated := policy == armsim.EvictionDeallocate
				want := func(idx ...int) []string {
					var out []string
					for _, i := range idx {
						out = append(out, fmt.Sprintf("%s/spot/%v", vms[i].ProviderID, deallocated))
					}
					slices.Sort(out)
					return out
				}

				f.evictVMs("spot", vms[0], vms[1]) // listed deleting (Delete) or deallocated
				if got := f.takeEvictions(); !slices.Equal(got, want(0, 1)) {
					t.Fatalf("evictions %v, want %v", got, want(0, 1))
				}
				f.sim.Advance(f.ctx) // policy Delete: the two VMs are gone now
				if got := f.takeEvictions(); len(got) != 0 {
					t.Fatalf("evictions %v reported again", got)
				}

				f.evictVMs("spot", vms[2])
				f.sim.Advance(f.ctx) // policy Delete: gone before the provider looks
				if got := f.takeEvictions(); !slices.Equal(got, want(2)) {
					t.Fatalf("evictions %v, want %v", got, want(2))
				}

				// Deletions of ours are none: the deallocated VMs, a running one.
				g := f.group("spot")
				ours := []string{vms[3].ProviderID}
				if deallocated {
					ours = append(ours, vms[0].ProviderID, vms[1].ProviderID, vms[2].ProviderID)
				}
				if err := g.DeleteNodes(f.ctx, ours); err != nil {
					t.Fatal(err)
				}
				if got := f.takeEvictions(); len(got) != 0 {
					t.Fatalf("our deletion reported as evictions %v (VMs deleting)", got)
				}
				f.sim.Advance(f.ctx)
				if got := f.takeEvictions(); len(got) != 0 {
					t.Fatalf("our deletion reported as evictions %v (VMs gone)", got)
				}

				// A regular scale set's VM that goes is no eviction.
				if err := f.sim.SetCapacity("rg", "regular", 1); err != nil {
					t.Fatal(err)
				}
				f.sim.Advance(f.ctx)
				if got := f.takeEvictions(); len(got) != 0 {
					t.Fatalf("a regular scale set's VM reported evicted: %v", got)
				}
			})
		}
	}
}
