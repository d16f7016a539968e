package vmss

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// TestRepairInPlace: each repair action is one POST on the VM through the
// real client, followed until ARM says it ended; the machine stays (no
// deletion, the capacity unchanged), RepairState says the action and that
// it succeeded, and a redeploy moves the VM to another host. A machine
// not listed, one being deleted and a second action while one runs are
// refused unsent; a fenced process asks nothing. A Flexible set's VM is
// repaired the same way through the Virtual Machines API.
func TestRepairInPlace(t *testing.T) {
	for _, flexible := range []bool{false, true} {
		for _, action := range []cloudprovider.RepairAction{cloudprovider.RepairReboot, cloudprovider.RepairReimage, cloudprovider.RepairRedeploy} {
			t.Run(fmt.Sprintf("flexible=%t/%s", flexible, action), func(t *testing.T) {
				d := 3 * time.Minute
				spec, ops := gpuSet("gpu", 2, nil), []string{armsim.OpRestartVM, armsim.OpReimageVM, armsim.OpRedeployVM}
				if flexible {
					spec, ops = flexSet("gpu", 2, nil), []string{armsim.OpRestartVirtualMachine, armsim.OpReimageVirtualMachine, armsim.OpRedeployVirtualMachine}
				}
				f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:10:gpu"),
					withSim(func(o *armsim.Options) { o.RestartDuration, o.ReimageDuration, o.RedeployDuration = d, d, d }))
				f.sim.Advance(f.ctx)
				f.refresh()
				g := f.p.groups[setKey("rg", "gpu")]
				st, _ := f.sim.ScaleSet("rg", "gpu")
				pid, instance := st.VMs[1].ProviderID, st.VMs[1].InstanceID
				if err := f.sim.BreakVM("rg", "gpu", instance, armsim.ActionRestart); err != nil {
					t.Fatal(err)
				}
				if !g.CanRepair() {
					t.Fatal("CanRepair false")
				}
				if err := g.Repair(f.ctx, pid, action); err != nil {
					t.Fatalf("Repair: %v", err)
				}
				if err := g.Repair(f.ctx, pid, action); !errors.Is(err, cloudprovider.ErrNotSent) {
					t.Fatalf("a second repair while one runs: %v, want refused unsent", err)
				}
				if s, ok := g.RepairState(pid); !ok || s.Action != action || s.Done {
					t.Fatalf("RepairState right after: %+v %v; want %s, not done", s, ok, action)
				}
				f.advanceUntil("the repair to end", 30*time.Second, func() bool {
					s, _ := g.RepairState(pid)
					return s.Done
				})
				if s, _ := g.RepairState(pid); s.Err != nil {
					t.Fatalf("repair ended with %v", s.Err)
				}
				vm := vmStateOf(t, f, "gpu", instance)
				if vm.Broken || vm.State != armsim.StateRunning || (vm.Host != 0) != (action == cloudprovider.RepairRedeploy) {
					t.Fatalf("VM after the %s: %+v", action, vm)
				}
				after, _ := f.sim.ScaleSet("rg", "gpu")
				if after.Capacity != 2 || len(after.VMs) != 2 || f.sim.Calls()[armsim.OpDeleteInstances] != 0 {
					t.Fatalf("capacity %d, %d VMs, %d deletions after an in-place repair", after.Capacity, len(after.VMs), f.sim.Calls()[armsim.OpDeleteInstances])
				}
				sent := 0
				for _, op := range ops {
					sent += f.sim.Calls()[op]
				}
				if sent != 1 {
					t.Fatalf("%d of %v sent, want the one", sent, ops)
				}
			})
		}
	}
	t.Run("refused", func(t *testing.T) {
		f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 3, nil)}, withNodes("0:10:gpu"))
		f.sim.Advance(f.ctx)
		f.refresh()
		g := f.p.groups[setKey("rg", "gpu")]
		st, _ := f.sim.ScaleSet("rg", "gpu")
		if err := g.DeleteNodes(f.ctx, []string{st.VMs[2].ProviderID}); err != nil {
			t.Fatal(err)
		}
		for name, call := range map[string]func() error{
			"deleting": func() error { return g.Repair(f.ctx, st.VMs[2].ProviderID, cloudprovider.RepairReboot) },
			"unlisted": func() error {
				return g.Repair(f.ctx, st.VMs[0].ProviderID[:len(st.VMs[0].ProviderID)-1]+"9", cloudprovider.RepairReboot)
			},
			"bad action": func() error { return g.Repair(f.ctx, st.VMs[0].ProviderID, "reinstall") },
			"fenced": func() error {
				fenced := cloudprovider.WithFence(f.p, func() error { return errors.New("not the leader") })
				for _, fg := range fenced.NodeGroups() {
					if fg.ID() == g.ID() {
						return fg.(cloudprovider.Repairer).Repair(f.ctx, st.VMs[0].ProviderID, cloudprovider.RepairReboot)
					}
				}
				return nil
			},
		} {
			if err := call(); err == nil || (name != "fenced" && !errors.Is(err, cloudprovider.ErrNotSent)) || (name == "fenced" && cloudprovider.ClassOf(err) != cloudprovider.ClassFenced) {
				t.Errorf("%s: %v, want refused unsent", name, err)
			}
		}
		for _, op := range []string{armsim.OpRestartVM, armsim.OpReimageVM, armsim.OpRedeployVM} {
			if n := f.sim.Calls()[op]; n != 0 {
				t.Errorf("%d %s sent by refused repairs", n, op)
			}
		}
	})
}

func vmStateOf(t *testing.T, f *fixture, set, instance string) armsim.VMState {
	t.Helper()
	st, err := f.sim.ScaleSet("rg", set)
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range st.VMs {
		if vm.InstanceID == instance {
			return vm
		}
	}
	t.Fatalf("no VM %s in %s", instance, set)
	return armsim.VMState{}
}
