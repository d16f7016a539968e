package armsim

import (
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
)

// errorEnvelope is ARM's error response body.
type errorEnvelope struct {
	Error *armcompute.APIError `json:"error"`
}

func envelope(code, message string) errorEnvelope {
	return errorEnvelope{Error: &armcompute.APIError{Code: to.Ptr(code), Message: to.Ptr(message)}}
}

// operationStatus is the body ARM answers on an Azure-AsyncOperation URL.
type operationStatus struct {
	Name      string               `json:"name"`
	Status    string               `json:"status"`
	StartTime time.Time            `json:"startTime"`
	EndTime   *time.Time           `json:"endTime,omitempty"`
	Error     *armcompute.APIError `json:"error,omitempty"`
}

// statusBody is the operation's status: a preempted one is
// {"status":"Canceled","error":{"code":"OperationPreempted",...}}.
func (o *operation) statusBody(now time.Time) operationStatus {
	st := operationStatus{Name: o.id, Status: o.status(now), StartTime: o.start.UTC()}
	if o.done(now) {
		end := o.end.UTC()
		st.EndTime = &end
		if o.errCode != "" {
			st.Error = &armcompute.APIError{Code: to.Ptr(o.errCode), Message: to.Ptr(o.errMessage)}
		}
	}
	return st
}

func ptrTags(tags map[string]string) map[string]*string {
	if len(tags) == 0 {
		return nil
	}
	out := make(map[string]*string, len(tags))
	for k, v := range tags {
		out[k] = to.Ptr(v)
	}
	return out
}

func ptrStrings(ss []string) []*string {
	if len(ss) == 0 {
		return nil
	}
	out := make([]*string, len(ss))
	for i, s := range ss {
		out[i] = to.Ptr(s)
	}
	return out
}

// scaleSetModel renders a scale set as ARM does, with the given provisioning
// state. Callers hold s.mu.
func (s *Server) scaleSetModel(set *scaleSet, provisioningState string) *armcompute.VirtualMachineScaleSet {
	m := &armcompute.VirtualMachineScaleSet{
		ID:       to.Ptr(s.scaleSetResourceID(set)),
		Name:     to.Ptr(set.name),
		Type:     to.Ptr("Microsoft.Compute/virtualMachineScaleSets"),
		Location: to.Ptr(s.opts.Location),
		Tags:     ptrTags(set.tags),
		Zones:    ptrStrings(set.zones),
		Etag:     to.Ptr(set.etagString()),
		SKU: &armcompute.SKU{
			Name:     to.Ptr(set.sku.Name),
			Tier:     to.Ptr("Standard"),
			Capacity: to.Ptr(int64(set.capacity())),
		},
		Properties: &armcompute.VirtualMachineScaleSetProperties{
			ProvisioningState:    to.Ptr(provisioningState),
			OrchestrationMode:    to.Ptr(armcompute.OrchestrationModeUniform),
			Overprovision:        to.Ptr(set.overprovision),
			SinglePlacementGroup: to.Ptr(set.singlePlacementGroup),
			UniqueID:             to.Ptr(set.uniqueID),
			TimeCreated:          to.Ptr(set.created.UTC()),
			UpgradePolicy:        &armcompute.UpgradePolicy{Mode: to.Ptr(armcompute.UpgradeModeManual)},
			VirtualMachineProfile: &armcompute.VirtualMachineScaleSetVMProfile{
				OSProfile: &armcompute.VirtualMachineScaleSetOSProfile{
					ComputerNamePrefix: to.Ptr(set.computerPrefix),
					AdminUsername:      to.Ptr("azureuser"),
				},
				StorageProfile: &armcompute.VirtualMachineScaleSetStorageProfile{ImageReference: imageReference(set.image)},
			},
		},
	}
	if set.spot {
		vp := m.Properties.VirtualMachineProfile
		vp.Priority, vp.EvictionPolicy, vp.BillingProfile = spotProfile(set)
	}
	if set.flexible {
		// Neither overprovisioning nor placement groups exist in Flexible
		// orchestration: ARM leaves them out.
		m.Properties.OrchestrationMode = to.Ptr(armcompute.OrchestrationModeFlexible)
		m.Properties.Overprovision, m.Properties.SinglePlacementGroup = nil, nil
		m.Properties.PlatformFaultDomainCount = to.Ptr[int32](1)
	}
	return m
}

// imageReference is the scale set's image: a resource ID, or a platform
// image when none was given.
func imageReference(id string) *armcompute.ImageReference {
	if id != "" {
		return &armcompute.ImageReference{ID: to.Ptr(id)}
	}
	return &armcompute.ImageReference{Publisher: to.Ptr("Canonical"), Offer: to.Ptr("ubuntu-24_04-lts"),
		SKU: to.Ptr("server"), Version: to.Ptr("latest")}
}

// spotProfile is a Spot scale set's priority, eviction policy and billing
// profile (maxPrice -1: pay up to the regular price, never evicted for
// price).
func spotProfile(set *scaleSet) (*armcompute.VirtualMachinePriorityTypes, *armcompute.VirtualMachineEvictionPolicyTypes, *armcompute.BillingProfile) {
	return to.Ptr(armcompute.VirtualMachinePriorityTypesSpot), to.Ptr(armcompute.VirtualMachineEvictionPolicyTypes(set.evictionPolicy)),
		&armcompute.BillingProfile{MaxPrice: to.Ptr[float64](-1)}
}

// vmProvisioningState maps a VM state to ARM's provisioning state.
func vmProvisioningState(rec *vmRecord) string {
	if rec.action != "" {
		return "Updating" // a repair action in progress (repair.go)
	}
	switch rec.state {
	case StateRunning, StateDeallocated:
		return "Succeeded"
	case StateFailed:
		return "Failed"
	}
	return rec.state // Creating, Deleting
}

// vmModel renders a scale set VM as ARM does, with its instance view if
// expand is set. Callers hold s.mu.
func (s *Server) vmModel(rec *vmRecord, expand bool) *armcompute.VirtualMachineScaleSetVM {
	set := rec.set
	vm := &armcompute.VirtualMachineScaleSetVM{
		ID:         to.Ptr(s.vmResourceID(rec)),
		Name:       to.Ptr(set.name + "_" + strconv.Itoa(rec.instanceID)),
		Type:       to.Ptr("Microsoft.Compute/virtualMachineScaleSets/virtualMachines"),
		InstanceID: to.Ptr(strconv.Itoa(rec.instanceID)),
		Location:   to.Ptr(s.opts.Location),
		Tags:       ptrTags(set.tags),
		SKU:        &armcompute.SKU{Name: to.Ptr(set.sku.Name), Tier: to.Ptr("Standard")},
		Properties: &armcompute.VirtualMachineScaleSetVMProperties{
			ProvisioningState:  to.Ptr(vmProvisioningState(rec)),
			LatestModelApplied: to.Ptr(true),
			VMID:               to.Ptr(rec.vmID),
			TimeCreated:        to.Ptr(rec.created.UTC()),
			HardwareProfile:    &armcompute.HardwareProfile{VMSize: to.Ptr(armcompute.VirtualMachineSizeTypes(set.sku.Name))},
			OSProfile: &armcompute.OSProfile{
				ComputerName:  to.Ptr(rec.computerName()),
				AdminUsername: to.Ptr("azureuser"),
			},
		},
	}
	if rec.zone != "" {
		vm.Zones = []*string{to.Ptr(rec.zone)}
	}
	if expand {
		vm.Properties.InstanceView = &armcompute.VirtualMachineScaleSetVMInstanceView{
			ComputerName: to.Ptr(rec.computerName()),
			OSName:       to.Ptr("ubuntu"),
			Statuses:     instanceViewStatuses(rec),
		}
	}
	return vm
}

// virtualMachineModel renders a Flexible scale set's VM as the Virtual
// Machines API does, with its instance view if expand is set. Callers
// hold s.mu.
func (s *Server) virtualMachineModel(rec *vmRecord, expand bool) *armcompute.VirtualMachine {
	set := rec.set
	vm := &armcompute.VirtualMachine{
		ID:       to.Ptr(s.vmResourceID(rec)),
		Name:     to.Ptr(rec.name),
		Type:     to.Ptr("Microsoft.Compute/virtualMachines"),
		Location: to.Ptr(s.opts.Location),
		Tags:     ptrTags(set.tags),
		Properties: &armcompute.VirtualMachineProperties{
			ProvisioningState:      to.Ptr(vmProvisioningState(rec)),
			VMID:                   to.Ptr(rec.vmID),
			TimeCreated:            to.Ptr(rec.created.UTC()),
			HardwareProfile:        &armcompute.HardwareProfile{VMSize: to.Ptr(armcompute.VirtualMachineSizeTypes(set.sku.Name))},
			OSProfile:              &armcompute.OSProfile{ComputerName: to.Ptr(rec.computerName()), AdminUsername: to.Ptr("azureuser")},
			VirtualMachineScaleSet: &armcompute.SubResource{ID: to.Ptr(s.scaleSetResourceID(set))},
		},
	}
	if rec.zone != "" {
		vm.Zones = []*string{to.Ptr(rec.zone)}
	}
	if set.spot {
		vm.Properties.Priority, vm.Properties.EvictionPolicy, vm.Properties.BillingProfile = spotProfile(set)
	}
	if expand {
		vm.Properties.InstanceView = &armcompute.VirtualMachineInstanceView{
			ComputerName: to.Ptr(rec.computerName()),
			OSName:       to.Ptr("ubuntu"),
			Statuses:     instanceViewStatuses(rec),
		}
	}
	return vm
}

func instanceViewStatuses(rec *vmRecord) []*armcompute.InstanceViewStatus {
	status := func(code, display string, level armcompute.StatusLevelTypes, t *time.Time) *armcompute.InstanceViewStatus {
		return &armcompute.InstanceViewStatus{Code: to.Ptr(code), DisplayStatus: to.Ptr(display), Level: to.Ptr(level), Time: t}
	}
	info := armcompute.StatusLevelTypesInfo
	switch rec.state {
	case StateRunning:
		return []*armcompute.InstanceViewStatus{
			status("ProvisioningState/succeeded", "Provisioning succeeded", info, to.Ptr(rec.readyAt.UTC())),
			status("PowerState/running", "VM running", info, nil),
		}
	case StateCreating:
		if rec.booted {
			// Up, provisioning its extensions.
			return []*armcompute.InstanceViewStatus{
				status("ProvisioningState/creating", "Creating", info, nil),
				status("PowerState/running", "VM running", info, nil),
			}
		}
		return []*armcompute.InstanceViewStatus{
			status("ProvisioningState/creating", "Creating", info, nil),
			status("PowerState/starting", "VM starting", info, nil),
		}
	case StateFailed:
		st := status("ProvisioningState/failed/"+rec.errorCode, "Provisioning failed", armcompute.StatusLevelTypesError, to.Ptr(rec.readyAt.UTC()))
		st.Message = to.Ptr(failureMessage(rec.errorCode))
		if rec.failedRunning {
			// Failed after it started: it still runs.
			return []*armcompute.InstanceViewStatus{st, status("PowerState/running", "VM running", info, nil)}
		}
		return []*armcompute.InstanceViewStatus{st}
	case StateDeleting:
		return []*armcompute.InstanceViewStatus{status("ProvisioningState/deleting", "Deleting", info, nil)}
	case StateDeallocated:
		return []*armcompute.InstanceViewStatus{
			status("ProvisioningState/succeeded", "Provisioning succeeded", info, to.Ptr(rec.readyAt.UTC())),
			status("PowerState/deallocated", "VM deallocated", info, nil),
		}
	}
	return nil
}

func failureMessage(code string) string {
	switch code {
	case CodeAllocationFailed:
		return allocationFailedMessage
	case CodeVMExtensionProvisioningError:
		return "VM has reported a failure when processing extension 'gpu-driver'. Error message: \"Enable failed: exit status 1\"."
	}
	return "Provisioning failed with error code " + code + "."
}
