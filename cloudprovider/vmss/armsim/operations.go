package armsim

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// How long operations last, preemption, overprovisioning and force
// deletion, as Azure does them (issue #38).
//
// Operations last as long as their VMs. A capacity PATCH of a scale set is
// answered at once, and its operation (Azure-AsyncOperation) stays
// InProgress until the VMs it creates are provisioned, extensions included
// (Options.ExtensionDelay, SKU.ExtensionDelay: a VM's provisioningState
// stays Creating until its extensions have run, and AKS installs the
// NVIDIA GPU driver "at node provisioning": "Create a fully managed GPU
// node pool on AKS"), or, for a scale-in, until the VMs it deletes are
// gone; an instance deletion's until its VMs are gone. cluster-autoscaler
// follows these operations for up to 30 minutes (asyncContextTimeout in
// cluster-autoscaler/cloudprovider/azure/azure_scale_set.go,
// waitForCreateOrUpdateInstances and waitForDeleteInstances), since they
// take minutes. An operation lasts at least Options.LRODuration;
// FaultSlowLRO adds its Duration on top; Options.FixedOperations brings
// back the old model (every operation lasts LRODuration).
//
// Preemption. A capacity write (a PATCH naming sku.capacity) or an
// instance deletion sent while an earlier operation on the scale set is
// InProgress makes ARM resolve the scale set to the newest goal state:
// the earlier operation ends at once with status Canceled and error code
// OperationPreempted ("Operation execution has been preempted by a more
// recent operation": kubernetes-sigs/cloud-provider-azure
// pkg/consts/consts.go, OperationPreemptedErrorMessage; "the older request
// will be pre-empted", kubernetes/autoscaler issue 3018;
// cluster-autoscaler's waitForDeleteInstances sends a preempted deletion
// again, once: azure_scale_set.go, isOperationPreempted). The VMs a
// preempted scale-out creates go on booting (the newest goal state counts
// them). A preempted instance deletion puts back the VMs of its batch
// that are not gone yet, as they were before it (Running, Failed,
// Deallocated or Creating), since the simulator cannot tell how far
// Azure's fan-out had got and the client must handle that case: they
// are listed again under their own instance IDs, count in sku.capacity
// again (before the newer write applies its goal state), and a client
// sends their deletion again. A VM already gone stays gone. A
// capacity-lowering PATCH's VMs are not put back. Options.NoPreemption
// turns preemption off (every operation runs to its own end).

// codePreempted is ARM's error code of an operation a later write
// superseded, and preemptedMessage its message.
const (
	codePreempted    = "OperationPreempted"
	preemptedMessage = "Operation execution has been preempted by a more recent operation."
)

// defaultOverprovisionPercent is how many extra VMs, in percent of the
// requested ones (rounded up), an overprovisioning scale set creates on a
// scale-out. Azure does not publish the number; its advice to allow "an
// address space 20% greater than the number of VMs you plan to scale to"
// because "by default a scale set overprovisions" ("Virtual Machine Scale
// Sets and placement groups", checklist) is the assumption.
const defaultOverprovisionPercent = 20

// isolatedVMSizes are the VM sizes whose scale sets refuse force deletion,
// as cluster-autoscaler lists them (isolatedVMSizes in
// cluster-autoscaler/cloudprovider/azure/azure_force_delete_scale_set.go,
// after "Isolation for VMs in Azure"); SKU.Isolated marks others.
var isolatedVMSizes = map[string]bool{
	"standard_e80ids_v4": true, "standard_e80is_v4": true,
	"standard_e104i_v5": true, "standard_e104is_v5": true, "standard_e104id_v5": true, "standard_e104ids_v5": true,
	"standard_m192is_v2": true, "standard_m192ims_v2": true, "standard_m192ids_v2": true, "standard_m192idms_v2": true,
	"standard_f72s_v2": true, "standard_m128ms": true,
}

// isolated reports whether the SKU is an isolated size.
func (k SKU) isolated() bool { return k.Isolated || isolatedVMSizes[strings.ToLower(k.Name)] }

// extensionTime is how long a new VM of the SKU provisions its extensions
// once booted. Callers hold s.mu.
func (s *Server) extensionTime(sku SKU) time.Duration {
	if sku.ExtensionDelay > 0 {
		return sku.ExtensionDelay
	}
	return s.opts.ExtensionDelay
}

// operationEnd is when an operation started at now ends whose VMs are
// done at vmsDone (zero: it has none). Callers hold s.mu.
func (s *Server) operationEnd(now, vmsDone time.Time) time.Time {
	end := now.Add(s.opts.LRODuration)
	if !s.opts.FixedOperations && vmsDone.After(end) {
		end = vmsDone
	}
	return end
}

// vmsDone is when the last of created is provisioned (or fails to be) and
// the last of deleting still Deleting is gone (or, under FaultDeleteFails,
// back); zero when there are none.
func vmsDone(created, deleting []*vmRecord) time.Time {
	var done time.Time
	for _, vm := range created {
		if vm.readyAt.After(done) {
			done = vm.readyAt
		}
	}
	for _, vm := range deleting {
		if vm.state == StateDeleting && vm.deleteAt.After(done) {
			done = vm.deleteAt
		}
	}
	return done
}

// inProgress returns the set's operations still in progress at now.
func (set *scaleSet) inProgress(now time.Time) []*operation {
	var ops []*operation
	for _, op := range set.active {
		if !op.done(now) {
			ops = append(ops, op)
		}
	}
	return ops
}

// pruneActive forgets the set's operations that have ended.
func (set *scaleSet) pruneActive(now time.Time) {
	set.active = slices.DeleteFunc(set.active, func(op *operation) bool { return op.done(now) })
}

// putBack returns the VMs that preempting op would put back: those of its
// instance deletion still deleting for it.
func (set *scaleSet) putBack(op *operation) []*vmRecord {
	var vms []*vmRecord
	for _, vm := range op.deleting {
		if vm.deletedBy == op && vm.state == StateDeleting && set.vms[vm.instanceID] == vm {
			vms = append(vms, vm)
		}
	}
	return vms
}

// preemptedDeletions counts the VMs, not overprovisioned extras, that a
// preemption at now would put back into sku.capacity. Callers hold s.mu.
func (s *Server) preemptedDeletions(set *scaleSet, now time.Time) int {
	if s.opts.NoPreemption {
		return 0
	}
	n := 0
	for _, op := range set.inProgress(now) {
		for _, vm := range set.putBack(op) {
			if !vm.extra {
				n++
			}
		}
	}
	return n
}

// preempt ends the set's operations in progress at now, Canceled with
// OperationPreempted, and puts back the VMs of a preempted instance
// deletion that are not gone yet; nothing when Options.NoPreemption.
// Callers hold s.mu.
func (s *Server) preempt(set *scaleSet, now time.Time) {
	if s.opts.NoPreemption {
		return
	}
	for _, op := range set.inProgress(now) {
		op.canceled, op.end = true, now
		op.errCode, op.errMessage = codePreempted, preemptedMessage
		back := set.putBack(op)
		for _, vm := range back {
			vm.state, vm.errorCode, vm.failedRunning, vm.evictAt = vm.before.state, vm.before.errorCode, vm.before.failedRunning, vm.before.evictAt
			vm.deleteAt, vm.deleteFails, vm.wasDeallocated, vm.deletedBy = time.Time{}, false, false, nil
		}
		klog.V(2).InfoS("Operation preempted by a later write", "resourceGroup", set.rg, "name", set.name, "operation", op.id,
			"putBack", len(back))
	}
	set.pruneActive(now)
}

// overprovision creates an overprovisioning scale set's extra VMs for the
// requested ones a scale-out created. Callers hold s.mu.
func (s *Server) overprovision(set *scaleSet, requested []*vmRecord, failWith string, now time.Time) {
	if !set.overprovision || set.flexible {
		return
	}
	pct := s.opts.OverprovisionPercent
	if pct == 0 {
		pct = defaultOverprovisionPercent
	}
	extras := (len(requested)*pct + 99) / 100
	for range extras {
		vm := s.newVM(set, now)
		vm.extra, vm.failWith, vm.requested = true, failWith, requested
	}
	klog.V(2).InfoS("Overprovisioned a scale-out", "resourceGroup", set.rg, "name", set.name, "requested", len(requested), "extras", extras)
}

// dropExtras starts deleting the overprovisioned extras whose requested
// VMs are all provisioned (or failed, or deleting, or gone), as Azure
// deletes them "once the requested number of VMs are successfully
// provisioned". No DeletionWatcher is told: no request made it, and an
// extra never ran as the scale set's VM. Callers hold s.mu.
func (s *Server) dropExtras(set *scaleSet, now time.Time) {
	for _, vm := range set.vms {
		if !vm.extra || vm.state != StateCreating {
			continue
		}
		done := true
		for _, r := range vm.requested {
			if r.state == StateCreating && set.vms[r.instanceID] == r {
				done = false
				break
			}
		}
		if done {
			s.startDeletingQuietly(vm, now)
			vm.requested = nil
			set.etag++
		}
	}
}

// refuseForceDeletion answers a force deletion of the set's instances 409
// OperationNotAllowed when its size is isolated or FaultForceDeleteRefused
// is active; the message is the one cluster-autoscaler quotes
// (azure_force_delete_scale_set.go). Callers hold s.mu.
func (s *Server) refuseForceDeletion(set *scaleSet) *armError {
	if !set.sku.isolated() {
		if _, ok := set.takeFault(FaultForceDeleteRefused); !ok {
			return nil
		}
	}
	return &armError{status: http.StatusConflict, code: "OperationNotAllowed", message: fmt.Sprintf(
		"Operation 'ForceDelete' is not allowed on resource '%s' since it manages updates using maintenance control.", set.name)}
}

// refuseWrite answers a write to the set as ARM does under a deny
// assignment (FaultDenyAssignment: AKS's node resource group lockdown) or
// a management lock (FaultScopeLocked); nil when neither is active.
// Callers hold s.mu.
func (s *Server) refuseWrite(set *scaleSet, op, caller string) *response {
	action := "Microsoft.Compute/virtualMachineScaleSets/write"
	if op == OpDeleteInstances {
		action = "Microsoft.Compute/virtualMachineScaleSets/delete/action"
	}
	setID := s.scaleSetResourceID(set)
	groupID := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s", s.opts.SubscriptionID, set.rg)
	if _, ok := set.takeFault(FaultDenyAssignment); ok {
		resp := errorResponse(http.StatusForbidden, "DenyAssignmentAuthorizationFailed",
			"The client '%s' with object id '%s' has permission to perform action '%s' on scope '%s'; however, the access is denied "+
				"because of the deny assignment with name 'AKS node resource group lockdown' and Id '%s' at scope '%s'.",
			caller, caller, action, setID, strings.ReplaceAll(newUUID(), "-", ""), groupID)
		return &resp
	}
	if _, ok := set.takeFault(FaultScopeLocked); ok {
		resp := errorResponse(http.StatusConflict, "ScopeLocked",
			"The scope '%s' cannot perform write operation because following scope(s) are locked: '%s'. Please remove the lock and try again.",
			setID, groupID)
		return &resp
	}
	return nil
}
