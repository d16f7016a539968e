package armsim

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
)

// Repair actions on one scale-set VM, as Azure serves them (issue #42):
// POST .../virtualMachineScaleSets/{set}/virtualMachines/{instanceId}/
// restart, /reimage and /redeploy (the Virtual Machine Scale Set VMs REST
// API: "Restart", "Reimage", "Redeploy"), each answered 202 Accepted with
// Azure-AsyncOperation and Location, its operation InProgress until the
// action is done.
//
//   - restart reboots the VM's OS on the same host: the node stays, its
//     kubelet comes back; a fault a reboot clears is gone, and node-problem-
//     detector reports its condition False again.
//   - reimage puts the OS disk back to the scale set's model (a fresh
//     image, the extensions run again) on the same host: the node
//     registers again as a new one would (its registration taints, the
//     preflight taint among them, back).
//   - redeploy moves the VM to another host (VMState.Host changes),
//     keeping its disks, and it boots there: the node registers again.
//     Azure's "Redeploy" is what its own guidance suggests when a VM's
//     host is at fault ("Redeploy Linux virtual machine to new Azure
//     node").
//
// How long each takes is Options.RestartDuration, ReimageDuration and
// RedeployDuration (0: done at the next Advance). Azure publishes no
// duration; GPU VMs take minutes for each (a reimage re-runs the driver
// extension), so e2e scenarios set compressed ones.
//
// Throttling: the Compute RP charges the three to the "Update VMSS VMs"
// policy of the scale-set VM table in "Compute throttling limits" (Start,
// Restart, Reimage, Reimage All, Update, …: per VM 4 a minute refilling a
// bucket of 12, per subscription 500 refilling 1,500). Redeploy of a
// scale-set VM is not in that table; it is charged to the same policy
// here (ASSUMED: the Virtual Machines table lists Redeploy under "Update
// VM", of the same numbers).
//
// A Flexible scale set's VMs are virtual machines of their own: the same
// three actions are the Virtual Machines REST API's, POST
// .../resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/
// {vmName}/restart, /reimage and /redeploy ("Virtual Machines - Restart",
// "- Reimage", "- Redeploy"), answered the same way; the scale-set VM path
// on a Flexible set is refused as Azure refuses it. The Compute RP charges
// them to the Virtual Machines table's "Update VM" policy, whose REST APIs
// list Restart, Redeploy and Reimage (per VM 4 a minute refilling 12, per
// subscription 500 refilling 1,500: "Compute throttling limits").
//
// Faults: BreakVM marks a running VM broken with the least action that
// fixes it (a transient fault: restart; a corrupt OS: reimage; bad
// hardware: redeploy; "" for a fault nothing but a new machine fixes).
// When an action ends, a NodeHook that implements RepairWatcher is told
// which action ended and whether the VM is fixed.

// Operation names of the three actions, counted by Server.Calls.
const (
	OpRestartVM  = "RestartVM"
	OpReimageVM  = "ReimageVM"
	OpRedeployVM = "RedeployVM"
)

// Repair actions: RepairWatcher's action, BreakVM's fixedBy.
const (
	ActionRestart  = "restart"
	ActionReimage  = "reimage"
	ActionRedeploy = "redeploy"
)

// Operation names of the three actions on a Flexible set's VM (the
// Virtual Machines API), counted by Server.Calls.
const (
	OpRestartVirtualMachine  = "RestartVirtualMachine"
	OpReimageVirtualMachine  = "ReimageVirtualMachine"
	OpRedeployVirtualMachine = "RedeployVirtualMachine"
)

// Compute policies of the actions (the simulator's names of the "Update
// VMSS VMs" and "Update VM" buckets).
const (
	PolicyUpdateVMScaleSetVMResource     = "UpdateVMScaleSetVMResource"
	PolicyUpdateVMScaleSetVMSubscription = "UpdateVMScaleSetVMSubscription"
	PolicyUpdateVMResource               = "UpdateVMResource"
	PolicyUpdateVMSubscription           = "UpdateVMSubscription"
)

var actionOps = map[string]string{ActionRestart: OpRestartVM, ActionReimage: OpReimageVM, ActionRedeploy: OpRedeployVM}

// flexActionOps are the actions' operations on a Flexible set's VM.
var flexActionOps = map[string]string{ActionRestart: OpRestartVirtualMachine, ActionReimage: OpReimageVirtualMachine, ActionRedeploy: OpRedeployVirtualMachine}

// flexSetOfVM is the Flexible scale set of the resource group that has a
// VM of that name, nil when none. Callers hold s.mu.
func (s *Server) flexSetOfVM(rg, name string) *scaleSet {
	prefix := strings.ToLower(rg) + "/"
	for key, set := range s.sets {
		if !set.flexible || !strings.HasPrefix(key, prefix) {
			continue
		}
		if _, ok := set.vmByKey(name); ok {
			return set
		}
	}
	return nil
}

// flexVMAction answers a restart, reimage or redeploy of a Flexible set's
// VM through the Virtual Machines API. Callers hold s.mu.
func (s *Server) flexVMAction(r *http.Request, rt route, op string, now time.Time) response {
	set := s.flexSetOfVM(rt.rg, rt.instance)
	if set == nil {
		return errorResponse(http.StatusNotFound, "ResourceNotFound",
			"The Resource 'Microsoft.Compute/virtualMachines/%s' under resource group '%s' was not found.", rt.instance, rt.rg)
	}
	rt.name = set.name
	if _, errResp := s.resolveSet(rt, now); errResp != nil {
		return *errResp
	}
	return s.vmAction(r, set, rt.instance, actionOf(op), now)
}

// actionOf is the action of an operation name ("" for other operations).
func actionOf(op string) string {
	for a, o := range actionOps {
		if o == op || flexActionOps[a] == op {
			return a
		}
	}
	return ""
}

// actionRank orders the actions by how much they change: an action fixes
// a fault whose fixedBy ranks at most its own. A fault nothing fixes
// ranks above all.
func actionRank(action string) int {
	switch action {
	case ActionRestart:
		return 1
	case ActionReimage:
		return 2
	case ActionRedeploy:
		return 3
	}
	return 99
}

// RepairWatcher is an optional interface of a NodeHook: told, from
// Advance, when a repair action on a VM whose node the hook registered
// has ended, and whether the VM is fixed (it had no fault, or the action
// cleared it). A restart leaves the node; a reimage or a redeploy makes
// it register again (the hook re-registers it: VMRunning's work). A call
// that returns an error is retried at the next Advance.
type RepairWatcher interface {
	VMRepaired(ctx context.Context, vm VM, action string, fixed bool) error
}

// repairDone is an action that ended, waiting for the hook.
type repairDone struct {
	rec    *vmRecord
	action string
	fixed  bool
	vm     VM // as described when it ended
	tries  int
}

// BreakVM marks a running VM of a scale set broken: fixedBy is the least
// action that fixes it (ActionRestart, ActionReimage, ActionRedeploy), ""
// for one no action fixes. The hook's own signals (a node condition, fewer
// GPUs) are the test's to set; BreakVM only decides what the actions do.
func (s *Server) BreakVM(rg, name, instanceID, fixedBy string) error {
	if fixedBy != "" && actionOps[fixedBy] == "" {
		return fmt.Errorf("breaking VM %s: fixedBy %q: want %s, %s, %s or empty", instanceID, fixedBy, ActionRestart, ActionReimage, ActionRedeploy)
	}
	return s.changeVM(rg, name, instanceID, "breaking", func(vm *vmRecord) error {
		if vm.state != StateRunning && !vm.failedRunning {
			return fmt.Errorf("VM is %s, not %s", vm.state, StateRunning)
		}
		vm.broken, vm.fixedBy = true, fixedBy
		return nil
	})
}

// actionDuration is how long an action lasts.
func (s *Server) actionDuration(action string) time.Duration {
	switch action {
	case ActionRestart:
		return s.opts.RestartDuration
	case ActionReimage:
		return s.opts.ReimageDuration
	}
	return s.opts.RedeployDuration
}

// vmAction answers a restart, reimage or redeploy of a Uniform scale
// set's VM. Callers hold s.mu.
func (s *Server) vmAction(r *http.Request, set *scaleSet, instance, action string, now time.Time) response {
	vm, ok := set.vmByKey(instance)
	if !ok {
		return errorResponse(http.StatusNotFound, "ResourceNotFound",
			"The Resource 'Microsoft.Compute/virtualMachineScaleSets/%s/virtualMachines/%s' under resource group '%s' was not found.",
			set.name, instance, set.rg)
	}
	if vm.state != StateRunning && !(vm.state == StateFailed && vm.failedRunning) {
		return errorResponse(http.StatusConflict, "OperationNotAllowed",
			"Operation '%s' is not allowed on VM '%s_%s' since the VM is %s.", action, set.name, instance, strings.ToLower(vm.state))
	}
	if vm.action != "" {
		return errorResponse(http.StatusConflict, "OperationNotAllowed",
			"Operation '%s' is not allowed on VM '%s_%s' since another operation ('%s') is in progress on it.", action, set.name, instance, vm.action)
	}
	end := now.Add(s.actionDuration(action))
	op := &operation{id: newUUID(), set: set, start: now, end: end}
	s.ops[op.id] = op
	vm.action, vm.actionEnd = action, end
	set.etag++
	resp := response{status: http.StatusAccepted}
	resp.set("Location", s.operationURL(r, op.id, true))
	resp.set("Azure-AsyncOperation", s.operationURL(r, op.id, false))
	return resp
}

// endAction ends the VM's action, due at now: it is fixed when it had no
// fault or the action clears it. Callers hold s.mu.
func (s *Server) endAction(vm *vmRecord) {
	action := vm.action
	if vm.state != StateRunning && !vm.failedRunning {
		vm.action, vm.actionEnd = "", time.Time{} // deleted meanwhile
		return
	}
	fixed := !vm.broken || (vm.fixedBy != "" && actionRank(action) >= actionRank(vm.fixedBy))
	if fixed {
		vm.broken, vm.fixedBy = false, ""
		if vm.failedRunning && action != ActionRestart {
			// A reimage or a redeploy provisions the VM again.
			vm.state, vm.errorCode, vm.failedRunning = StateRunning, "", false
		}
	}
	if action == ActionRedeploy {
		vm.host++
	}
	vm.action, vm.actionEnd = "", time.Time{}
	vm.set.etag++
	if vm.notified {
		s.repaired = append(s.repaired, &repairDone{rec: vm, action: action, fixed: fixed, vm: s.hookVM(vm)})
	}
}

// tellRepaired calls the hook's VMRepaired for the actions that ended
// (and those whose call failed before). Called by Advance, holding
// s.hookMu and not s.mu.
func (s *Server) tellRepaired(ctx context.Context, done []*repairDone) (failed []*repairDone) {
	w, ok := s.hook.(RepairWatcher)
	if !ok {
		return nil
	}
	for _, d := range done {
		err := w.VMRepaired(ctx, d.vm, d.action, d.fixed)
		switch {
		case err == nil:
		case apierrors.IsNotFound(err):
			// The node is gone (its VM deleted meanwhile): nothing to tell.
		case d.tries+1 >= maxRepairHookTries:
			klog.ErrorS(err, "Node hook failed to take a repair; giving up", "call", "VMRepaired",
				"scaleSet", d.vm.ScaleSet, "instanceID", d.vm.InstanceID, "action", d.action, "tries", d.tries+1)
		default:
			if d.tries%50 == 0 {
				klog.ErrorS(err, "Node hook failed; retrying at the next Advance", "call", "VMRepaired",
					"scaleSet", d.vm.ScaleSet, "instanceID", d.vm.InstanceID, "action", d.action, "tries", d.tries+1)
			}
			d.tries++
			failed = append(failed, d)
		}
	}
	return failed
}

// maxRepairHookTries bounds the VMRepaired calls for one action.
const maxRepairHookTries = 500
