package simulator

import (
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingapi "k8s.io/api/scheduling/v1alpha2"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
)

// noDRA is the framework's SharedDRAManager for a simulation without
// dynamic resource allocation: no device classes, claims or slices. The
// NodeResourcesFit plugin asks it whether an extended resource (such as
// nvidia.com/gpu) is backed by a device class; the answer is always no, so
// extended resources are matched against node allocatable as before DRA.
type noDRA struct{}

var _ fwk.SharedDRAManager = noDRA{}

func (noDRA) ResourceClaims() fwk.ResourceClaimTracker     { return noClaims{} }
func (noDRA) ResourceSlices() fwk.ResourceSliceLister      { return noSlices{} }
func (noDRA) DeviceClasses() fwk.DeviceClassLister         { return noClasses{} }
func (noDRA) DeviceClassResolver() fwk.DeviceClassResolver { return noClasses{} }
func (noDRA) PodGroups() fwk.PodGroupLister                { return noPodGroups{} }

type noClaims struct{}

func (noClaims) List() ([]*resourceapi.ResourceClaim, error) { return nil, nil }
func (noClaims) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	return nil, fmt.Errorf("resource claim %s/%s: dynamic resource allocation is not simulated", namespace, name)
}
func (noClaims) ListAllAllocatedDevices() (sets.Set[structured.DeviceID], error) { return nil, nil }
func (noClaims) GatherAllocatedState() (*structured.AllocatedState, error) {
	return &structured.AllocatedState{}, nil
}
func (noClaims) SignalClaimPendingAllocation(types.UID, *resourceapi.ResourceClaim) error {
	return nil
}
func (noClaims) GetPendingAllocation(types.UID) *resourceapi.AllocationResult { return nil }
func (noClaims) MaybeRemoveClaimPendingAllocation(types.UID, bool) bool       { return false }
func (noClaims) AssumeClaimAfterAPICall(*resourceapi.ResourceClaim) error     { return nil }
func (noClaims) AssumedClaimRestore(string, string)                           {}

type noSlices struct{}

func (noSlices) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) { return nil, nil }

type noClasses struct{}

func (noClasses) List() ([]*resourceapi.DeviceClass, error) { return nil, nil }
func (noClasses) Get(name string) (*resourceapi.DeviceClass, error) {
	return nil, fmt.Errorf("device class %s: dynamic resource allocation is not simulated", name)
}
func (noClasses) GetDeviceClass(apiv1.ResourceName) *resourceapi.DeviceClass { return nil }

type noPodGroups struct{}

func (noPodGroups) Get(namespace, name string) (*schedulingapi.PodGroup, error) {
	return nil, fmt.Errorf("pod group %s/%s: not known to the simulation", namespace, name)
}
