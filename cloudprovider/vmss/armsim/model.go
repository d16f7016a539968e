package armsim

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// VM states as reported in VMState.State.
const (
	StateCreating = "Creating"
	StateRunning  = "Running"
	StateFailed   = "Failed"
	StateDeleting = "Deleting"
	// StateDeallocated is a Spot VM evicted under eviction policy
	// Deallocate: stopped, holding its place in sku.capacity and its cores
	// in the quota, running nothing.
	StateDeallocated = "Deallocated"
)

// Spot eviction policies (virtualMachineProfile.evictionPolicy).
const (
	EvictionDelete     = "Delete"
	EvictionDeallocate = "Deallocate"
)

// Error codes the simulator reports for failed operations and VMs.
const (
	CodeAllocationFailed       = "AllocationFailed"
	CodeInternalExecutionError = "InternalExecutionError"
)

// Capacity limits of a Uniform scale set, as Azure documents them
// ("Virtual Machine Scale Sets and placement groups"): 1,000 VMs when it
// may span several placement groups (singlePlacementGroup false) and
// boots a platform or Azure Compute Gallery image; 600 when it boots a
// managed custom image (Microsoft.Compute/images); 100 when it is a single
// placement group ("When set to the default value of true, a scale set is
// composed of a single placement group, and has a range of 0-100 VMs"),
// which Azure raises to 300 for a scale set on request
// (ScaleSetSpec.PlacementGroupLimit; azure-cli issue 9630, "the limit is
// now 300", for InfiniBand sizes whose VMs must share a placement group).
const (
	maxCapacity                   = 1000
	maxCapacityManagedImage       = 600
	maxCapacitySinglePlacement    = 100
	maxCapacitySinglePlacementMax = 300
)

// ErrNotFound is wrapped by errors about scale sets that do not exist.
var ErrNotFound = errors.New("not found")

// FaultKind is a kind of fault InjectFault can make a scale set suffer.
type FaultKind int

const (
	// FaultQuota rejects capacity increases synchronously with 409
	// OperationNotAllowed (cores quota exceeded); nothing changes.
	FaultQuota FaultKind = iota + 1
	// FaultAllocation lets capacity increases through, but the new VMs end
	// Failed (AllocationFailed) when they would have booted, and the
	// operation fails with AllocationFailed.
	FaultAllocation
	// FaultLROFail makes asynchronous operations end Failed with
	// InternalExecutionError; VMs change as normal.
	FaultLROFail
	// FaultSlowLRO keeps asynchronous operations InProgress Fault.Duration
	// longer.
	FaultSlowLRO
	// FaultServerError answers requests about the scale set with 500
	// InternalServerError.
	FaultServerError
	// FaultCommitThenServerError applies a scale set update (a PATCH) and
	// then answers 500 InternalServerError, as a gateway that lost the
	// response does: the change is made, the caller hears it failed.
	FaultCommitThenServerError
	// FaultDeleteFails accepts an instance deletion (202, the VMs go
	// Deleting), then the operation ends Failed with
	// InternalExecutionError and the VMs are Running again, as when Azure
	// fails to delete a VM: the machines live on.
	FaultDeleteFails
	// FaultCommitLate answers a scale set update (a PATCH) 500
	// InternalServerError with nothing changed yet, and applies the update
	// a moment later, as ARM does when its front end gives up on a request
	// the back end goes on to commit: the caller's read-back still shows
	// the old scale set, and the change lands after it. The update must
	// pass its checks when it is sent (an update answered 412 or 409 takes
	// no fault); it lands as it was asked, without its If-Match, just
	// before the request about the scale set that follows the Fault.Lag
	// requests which still see it unchanged (requests answered 429 do not
	// count), or at the next Advance, whichever comes first. ClearFaults
	// does not call back an update already accepted.
	FaultCommitLate
	// FaultDenyAssignment answers writes to the scale set (a PATCH, an
	// instance deletion) 403 DenyAssignmentAuthorizationFailed, as ARM
	// does when a deny assignment covers the scale set: AKS's node
	// resource group lockdown ("Deploy a fully managed resource group
	// using node resource group lockdown", restriction level ReadOnly:
	// "a deny assignment blocks direct updates"). Reads go through;
	// nothing changes. The body is ARM's (Azure/migAz issue 266 quotes
	// one): "The client '…' with object id '…' has permission to perform
	// action '…' on scope '…'; however, the access is denied because of
	// the deny assignment with name '…' and Id '…' at scope '…'."
	FaultDenyAssignment
	// FaultScopeLocked answers writes to the scale set 409 ScopeLocked,
	// as ARM does under a ReadOnly management lock on the scale set or
	// its resource group ("Lock your resources to protect your
	// infrastructure"). Nothing changes.
	FaultScopeLocked
	// FaultForceDeleteRefused answers an instance deletion with
	// forceDeletion=true 409 OperationNotAllowed, synchronously, and
	// changes nothing, as Azure refuses force deletion on a scale set of
	// an isolated VM size or on a dedicated host (the error
	// cluster-autoscaler quotes in azure_force_delete_scale_set.go, whose
	// deleteInstances falls back to a normal delete when
	// isOperationNotAllowed). A deletion without force is unaffected. A
	// scale set of an isolated size (SKU.Isolated, or one of the sizes
	// cluster-autoscaler lists in isolatedVMSizes) refuses force deletion
	// without the fault.
	FaultForceDeleteRefused
	// FaultDeletingWithoutIDs makes VM lists (the scale-set VM list, and
	// the Virtual Machines list of a Flexible scale set) show VMs that
	// are Deleting with an empty resource ID, and in a Uniform scale set
	// an empty instance ID, as ARM sometimes lists a VM late in its
	// deletion: cluster-autoscaler skips such entries ("The resource ID
	// is empty string, which indicates the instance may be in deleting
	// state": updateInstanceCache in azure_scale_set.go, addVMToCache
	// for Flexible). Count counts list pages. A Get of the VM is
	// unaffected.
	FaultDeletingWithoutIDs
	// FaultSlowDelete keeps the VMs an instance deletion starts deleting
	// Fault.Duration longer in Deleting (Count counts deletions), and so
	// its operation, which lasts until its VMs are gone: GPU VMs and VMs
	// with many extensions take minutes to delete on Azure, long enough
	// for a newer write to preempt the deletion (see preempt).
	FaultSlowDelete
	// FaultVanishBeforeDelete makes the next instance deletion that names
	// two VMs or more find its first VM already gone, as if deleted out of
	// band (another tool, a Spot eviction with policy Delete) after the
	// caller's last VM list and finished just before the request: the VM
	// is removed, its node told so at the next Advance, and ARM refuses
	// the whole batch for naming an instance it no longer has (400
	// InvalidParameter, see deleteInstances). Count counts deletions.
	FaultVanishBeforeDelete
)

// lastFaultKind is the highest FaultKind.
const lastFaultKind = FaultVanishBeforeDelete

// String returns the fault kind's name.
func (k FaultKind) String() string {
	names := [...]string{
		FaultQuota:                 "Quota",
		FaultAllocation:            "Allocation",
		FaultLROFail:               "LROFail",
		FaultSlowLRO:               "SlowLRO",
		FaultCommitThenServerError: "CommitThenServerError",
		FaultServerError:           "ServerError",
		FaultDeleteFails:           "DeleteFails",
		FaultCommitLate:            "CommitLate",
		FaultDenyAssignment:        "DenyAssignment",
		FaultScopeLocked:           "ScopeLocked",
		FaultForceDeleteRefused:    "ForceDeleteRefused",
		FaultDeletingWithoutIDs:    "DeletingWithoutIDs",
		FaultSlowDelete:            "SlowDelete",
		FaultVanishBeforeDelete:    "VanishBeforeDelete",
	}
	if k > 0 && int(k) < len(names) && names[k] != "" {
		return names[k]
	}
	return "FaultKind(" + strconv.Itoa(int(k)) + ")"
}

// Fault is a fault injected into a scale set.
type Fault struct {
	Kind FaultKind
	// Count is how many operations (for FaultServerError: requests) it
	// applies to; 0 = until cleared. FaultQuota and FaultAllocation apply
	// to capacity increases, FaultLROFail and FaultSlowLRO to every
	// asynchronous operation (updates and instance deletions),
	// FaultDenyAssignment and FaultScopeLocked to write requests,
	// FaultForceDeleteRefused to force deletions, FaultDeletingWithoutIDs
	// to VM list pages.
	Count int
	// Duration is, for FaultSlowLRO, the extra time the operation stays
	// InProgress.
	Duration time.Duration
	// Lag is, for FaultCommitLate, how many requests about the scale set
	// still see it unchanged after the update was answered; 0 means 1
	// (the caller's read-back).
	Lag int
}

// ScaleSetSpec describes a scale set to add to the simulator.
type ScaleSetSpec struct {
	ResourceGroup string
	Name          string
	SKU           string            // must be one of the server's SKUs
	Capacity      int               // initial VMs, created Running (hook fires on next Advance)
	Tags          map[string]string // scale set tags
	Zones         []string          // e.g. ["1"]; VMs are spread round-robin over them
	// SinglePlacementGroup makes the scale set one placement group: at most
	// 100 VMs. Azure creates a Uniform scale set that way unless told
	// otherwise; AKS node pools, and the simulator's default, span several.
	SinglePlacementGroup bool
	// PlacementGroupLimit raises a single placement group's cap from 100
	// (0 means 100) up to 300, as Azure does for a scale set on request;
	// only with SinglePlacementGroup.
	PlacementGroupLimit int
	// Overprovision is properties.overprovision. Azure overprovisions a
	// Uniform scale set unless told not to ("Design considerations for
	// scale sets", Overprovisioning): on each scale-out it creates extra
	// VMs (Options.OverprovisionPercent of the new ones, rounded up) with
	// instance IDs of their own, and deletes them once the requested VMs
	// are provisioned; sku.capacity stays the requested number, and the
	// extras are neither billed nor counted toward quota. The simulator's
	// default is false (it reports overprovision false), as AKS creates its
	// node pools' scale sets; a test opts in. Not for Flexible scale sets,
	// which do not overprovision.
	Overprovision bool
	// Image is the resource ID of the image the VMs boot: empty for a
	// platform (Marketplace) image; a managed custom image
	// (.../providers/Microsoft.Compute/images/<name>) limits a Uniform
	// scale set to 600 VMs; an Azure Compute Gallery image version does
	// not.
	Image string
	// Flexible makes it a scale set of Flexible orchestration, as ARM
	// serves one: its VMs are virtual machines of their own
	// (Microsoft.Compute/virtualMachines/<name>_<8 hex digits>, computer
	// name <prefix><6 characters>), listed by the Virtual Machines API
	// filtered by scale set, deleted by name; the scale-set VM API refuses
	// it. It holds 1,000 VMs whatever its image, and is never a single
	// placement group.
	Flexible bool
	// Spot makes its VMs Spot VMs (virtualMachineProfile.priority Spot,
	// billingProfile.maxPrice -1), which EvictSpotVMs evicts under
	// EvictionPolicy: EvictionDelete (the VMs are deleted and sku.capacity
	// drops by itself) or EvictionDeallocate (ARM's default: the VMs stop,
	// and stay in sku.capacity and the quota).
	Spot           bool
	EvictionPolicy string
	// ComputerNamePrefix is virtualMachineProfile.osProfile.computerNamePrefix:
	// a VM's computer name, and so its node's name, is the prefix and six
	// characters (the instance ID in base 36 in a Uniform scale set, drawn
	// at random in a Flexible one). Empty: the scale set's name. Two scale
	// sets of one name in two resource groups need prefixes of their own,
	// as AKS gives each node pool's scale set (aks-<pool>-<hash>-vmss), or
	// their nodes' names collide. Letters, digits and hyphens, at most 58,
	// not starting or ending with a hyphen.
	ComputerNamePrefix string
}

// computerNamePrefix matches what ARM accepts as a Linux scale set's
// computerNamePrefix (and a node name, lower-cased, accepts with six
// characters more).
var computerNamePrefix = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,56}[A-Za-z0-9])?$`)

// ScaleSetState is a snapshot of a scale set.
type ScaleSetState struct {
	Capacity int // VMs not being deleted, as sku.capacity reports
	ETag     string
	VMs      []VMState // by instance ID, including VMs being deleted
}

// VMState is a snapshot of a scale set VM.
type VMState struct {
	// InstanceID is what DeleteInstances, FailRunningVM and RepairVM take:
	// the instance ID of a Uniform scale set's VM ("17"), the VM name of a
	// Flexible one's ("gpu_3f9a0c12").
	InstanceID   string
	ProviderID   string // "azure://" + the VM's ARM resource ID
	ComputerName string
	State        string // StateCreating, StateRunning, StateFailed or StateDeleting
	ErrorCode    string // for StateFailed, e.g. "AllocationFailed"
	// PowerState is the instance view's power state: "running" for a
	// running VM, also one Failed while it runs (FailRunningVM) and one
	// still Creating whose OS is up while its extensions are provisioned
	// (Options.ExtensionDelay); "starting" while it boots; "deallocated" for a Spot VM evicted under
	// eviction policy Deallocate; "" for a VM that failed to start or is
	// deleting.
	PowerState string
	// EvictAt is when a Spot VM given notice of its eviction
	// (EvictSpotVMs) is evicted; zero for others.
	EvictAt time.Time
	// Overprovisioned is an extra VM an overprovisioning scale set made
	// beside the requested ones of a scale-out (ScaleSetSpec.Overprovision):
	// not in Capacity, deleted once the requested VMs are provisioned.
	Overprovisioned bool
	// Action is the repair action in progress (ActionRestart, …), "" for
	// none; Broken says BreakVM's fault is still there; Host counts the
	// hosts it has run on (a redeploy moves it: repair.go).
	Action string
	Broken bool
	Host   int
}

// scaleSet is the simulator's record of a scale set. Guarded by Server.mu.
type scaleSet struct {
	rg, name string
	sku      SKU
	tags     map[string]string
	zones    []string
	etag     int
	nextID   int // next instance ID; IDs are never reused
	vms      map[int]*vmRecord
	// phantom is capacity with no VM behind it (DropVMsKeepCapacity): a
	// failed scale-out whose VMs were removed while sku.capacity stayed at
	// its target. A lower capacity written takes it first.
	phantom int
	faults  []*Fault
	lastOp  *operation
	// late are updates answered with an error that have not landed yet
	// (FaultCommitLate), oldest first.
	late []*lateCommit
	// singlePlacementGroup and image are the scale set's properties that
	// bound its capacity (see capacityLimit).
	singlePlacementGroup bool
	image                string
	created              time.Time
	uniqueID             string
	// flexible is Flexible orchestration; byName then holds its VMs by
	// lower-case VM name, and computers their computer names.
	flexible  bool
	byName    map[string]*vmRecord
	computers map[string]bool
	// spot is Spot priority, evicting VMs under evictionPolicy.
	spot           bool
	evictionPolicy string
	// computerPrefix starts its VMs' computer names.
	computerPrefix string
	// placementGroupLimit is a single placement group's cap (100 to 300).
	placementGroupLimit int
	// overprovision: scale-outs create extra VMs (see ScaleSetSpec).
	overprovision bool
	// active are the operations that may still be in progress, oldest
	// first (preemption ends them).
	active []*operation
}

// vmRecord is the simulator's record of a scale set VM. Guarded by Server.mu.
type vmRecord struct {
	set *scaleSet
	// instanceID orders the set's VMs by creation; it is the VM's instance
	// ID in a Uniform scale set.
	instanceID int
	zone       string
	vmID       string
	state      string
	errorCode  string
	failWith   string // error code to fail with instead of booting
	created    time.Time
	readyAt    time.Time // Creating -> Running or Failed
	deleteAt   time.Time // Deleting -> gone
	// deleteFails: at deleteAt the VM is Running again (FaultDeleteFails).
	deleteFails bool
	// notified is set once VMRunning succeeded for the VM.
	notified bool
	// hookFailures counts hook calls for the VM that failed in a row.
	hookFailures int
	// failedRunning: the VM is Failed but runs (FailRunningVM), as a VM
	// whose extension, data-disk attach or model update failed does.
	failedRunning bool
	// name and computer are a Flexible scale set's VM name and computer
	// name ("" in a Uniform scale set, whose names follow instanceID).
	name, computer string
	// evictAt is when a Spot VM given notice of eviction is evicted.
	evictAt time.Time
	// wasDeallocated: the VM was deallocated when it started deleting.
	wasDeallocated bool
	// bootedAt is when its OS is up (PowerState/running); readyAt, later
	// by its extensions' time, when it is provisioned.
	bootedAt time.Time
	// booted: its OS is up (bootedAt passed) while it is still Creating.
	booted bool
	// extra is an overprovisioned VM, made beside the requested ones of
	// a scale-out (requested) and deleted once they are provisioned; it
	// never runs as the scale set's VM.
	extra     bool
	requested []*vmRecord
	// before is what a VM that an instance deletion started deleting was,
	// for a preemption of that deletion to put back; deletedBy is that
	// deletion's operation.
	before    vmBefore
	deletedBy *operation
	// action is the repair action in progress ("" when none: repair.go),
	// done at actionEnd.
	action    string
	actionEnd time.Time
	// broken: BreakVM's fault, which actions ranking at least fixedBy
	// clear ("" fixedBy: none does).
	broken  bool
	fixedBy string
	// host counts the hosts the VM has run on: a redeploy moves it.
	host int
}

// vmBefore is the part of a VM's state that starting its deletion
// overwrites.
type vmBefore struct {
	state, errorCode string
	failedRunning    bool
	evictAt          time.Time
}

// powerState is the VM's power state as its instance view reports it.
func (vm *vmRecord) powerState() string {
	switch {
	case vm.action != "":
		return "starting" // rebooting, reimaged or moved: booting again
	case vm.state == StateRunning, vm.state == StateFailed && vm.failedRunning:
		return "running"
	case vm.state == StateCreating && vm.booted:
		return "running" // provisioning its extensions
	case vm.state == StateCreating:
		return "starting"
	case vm.state == StateDeallocated:
		return "deallocated"
	}
	return ""
}

// lateCommit is an update answered 500 that lands later
// (FaultCommitLate). Guarded by Server.mu.
type lateCommit struct {
	req updateRequest // as asked, without its preconditions
	// wait is how many more requests about the scale set see it before
	// it lands.
	wait int
}

// operation is an asynchronous ARM operation. Guarded by Server.mu.
type operation struct {
	id         string
	set        *scaleSet
	start, end time.Time
	errCode    string // "" if it succeeds
	errMessage string
	// canceled: a later write preempted it (status Canceled, errCode
	// OperationPreempted); end is when.
	canceled bool
	// deleting are the VMs an instance deletion started deleting.
	deleting []*vmRecord
}

func (o *operation) done(now time.Time) bool { return !now.Before(o.end) }

func (o *operation) status(now time.Time) string {
	switch {
	case !o.done(now):
		return "InProgress"
	case o.canceled:
		return "Canceled"
	case o.errCode != "":
		return "Failed"
	}
	return "Succeeded"
}

// armError is an error answered in ARM's error envelope.
type armError struct {
	status  int
	code    string
	message string
	target  string // the error's target, if any
}

func (e *armError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.message) }

func setKey(rg, name string) string { return strings.ToLower(rg) + "/" + strings.ToLower(name) }

// AddScaleSet adds a scale set with spec.Capacity Running VMs. The hook is
// told about them at the next Advance.
func (s *Server) AddScaleSet(spec ScaleSetSpec) error {
	if err := spec.checkName(); err != nil {
		return err
	}
	sku, ok := s.skus[strings.ToLower(spec.SKU)]
	if !ok {
		return fmt.Errorf("adding scale set %s/%s: unknown SKU %q", spec.ResourceGroup, spec.Name, spec.SKU)
	}
	if err := spec.settle(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := setKey(spec.ResourceGroup, spec.Name)
	if _, dup := s.sets[key]; dup {
		return fmt.Errorf("adding scale set %s/%s: it already exists", spec.ResourceGroup, spec.Name)
	}
	set := s.newScaleSet(spec, sku, s.clock.Now())
	s.sets[key] = set
	klog.V(2).InfoS("Added scale set", "resourceGroup", set.rg, "name", set.name, "sku", sku.Name, "capacity", spec.Capacity,
		"flexible", spec.Flexible)
	return nil
}

// checkName checks the scale set's resource group and name.
func (spec *ScaleSetSpec) checkName() error {
	if spec.ResourceGroup == "" || spec.Name == "" {
		return fmt.Errorf("adding scale set %q in resource group %q: resource group and name are required", spec.Name, spec.ResourceGroup)
	}
	if strings.ContainsAny(spec.ResourceGroup+spec.Name, "/?#") {
		return fmt.Errorf("adding scale set %s/%s: names must not contain '/', '?' or '#'", spec.ResourceGroup, spec.Name)
	}
	return nil
}

// settle checks the spec past its name and SKU, filling in ARM's
// defaults: the eviction policy, the layout, the placement group limit,
// then the capacity and zones.
func (spec *ScaleSetSpec) settle() error {
	for _, step := range []func() error{spec.settleEviction, spec.checkLayout, spec.settlePlacementGroupLimit, spec.checkCapacity} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// settleEviction checks a Spot scale set's eviction policy, Deallocate by
// default as in ARM; other scale sets have none.
func (spec *ScaleSetSpec) settleEviction() error {
	switch {
	case !spec.Spot && spec.EvictionPolicy != "":
		return fmt.Errorf("adding scale set %s/%s: eviction policy %q is for Spot scale sets", spec.ResourceGroup, spec.Name, spec.EvictionPolicy)
	case spec.Spot && spec.EvictionPolicy == "":
		spec.EvictionPolicy = EvictionDeallocate // ARM's default
	case spec.Spot && spec.EvictionPolicy != EvictionDelete && spec.EvictionPolicy != EvictionDeallocate:
		return fmt.Errorf("adding scale set %s/%s: eviction policy %q: want %s or %s", spec.ResourceGroup, spec.Name, spec.EvictionPolicy, EvictionDelete, EvictionDeallocate)
	}
	return nil
}

// checkLayout checks the computer name prefix and what a Flexible scale
// set cannot be.
func (spec *ScaleSetSpec) checkLayout() error {
	if spec.ComputerNamePrefix != "" && !computerNamePrefix.MatchString(spec.ComputerNamePrefix) {
		return fmt.Errorf("adding scale set %s/%s: computer name prefix %q: want letters, digits and hyphens, at most 58, not starting or ending with a hyphen",
			spec.ResourceGroup, spec.Name, spec.ComputerNamePrefix)
	}
	if spec.Flexible && spec.SinglePlacementGroup {
		return fmt.Errorf("adding scale set %s/%s: a Flexible scale set is never a single placement group", spec.ResourceGroup, spec.Name)
	}
	if spec.Flexible && spec.Overprovision {
		return fmt.Errorf("adding scale set %s/%s: a Flexible scale set does not overprovision", spec.ResourceGroup, spec.Name)
	}
	return nil
}

// settlePlacementGroupLimit checks a single placement group's limit,
// maxCapacitySinglePlacement by default.
func (spec *ScaleSetSpec) settlePlacementGroupLimit() error {
	switch {
	case spec.PlacementGroupLimit != 0 && !spec.SinglePlacementGroup:
		return fmt.Errorf("adding scale set %s/%s: a placement group limit is for a single placement group", spec.ResourceGroup, spec.Name)
	case spec.PlacementGroupLimit == 0:
		spec.PlacementGroupLimit = maxCapacitySinglePlacement
	case spec.PlacementGroupLimit < maxCapacitySinglePlacement || spec.PlacementGroupLimit > maxCapacitySinglePlacementMax:
		return fmt.Errorf("adding scale set %s/%s: placement group limit %d is outside [%d, %d]", spec.ResourceGroup, spec.Name,
			spec.PlacementGroupLimit, maxCapacitySinglePlacement, maxCapacitySinglePlacementMax)
	}
	return nil
}

// checkCapacity checks the initial capacity against the scale set's limit,
// and the zones.
func (spec *ScaleSetSpec) checkCapacity() error {
	if limit, why := capacityLimit(spec.Flexible, spec.SinglePlacementGroup, spec.PlacementGroupLimit, spec.Image); spec.Capacity < 0 || spec.Capacity > limit {
		return fmt.Errorf("adding scale set %s/%s: capacity %d is outside [0, %d] (%s)", spec.ResourceGroup, spec.Name, spec.Capacity, limit, why)
	}
	for _, z := range spec.Zones {
		if z == "" {
			return fmt.Errorf("adding scale set %s/%s: empty zone", spec.ResourceGroup, spec.Name)
		}
	}
	return nil
}

// newScaleSet builds the scale set of a checked spec, with its initial
// VMs Running. Callers hold s.mu.
func (s *Server) newScaleSet(spec ScaleSetSpec, sku SKU, now time.Time) *scaleSet {
	set := &scaleSet{
		rg:       spec.ResourceGroup,
		name:     spec.Name,
		sku:      sku,
		tags:     maps.Clone(spec.Tags),
		zones:    slices.Clone(spec.Zones),
		etag:     1,
		vms:      map[int]*vmRecord{},
		created:  now,
		uniqueID: newUUID(),

		singlePlacementGroup: spec.SinglePlacementGroup,
		image:                spec.Image,
		flexible:             spec.Flexible,
		spot:                 spec.Spot,
		evictionPolicy:       spec.EvictionPolicy,
		computerPrefix:       cmp.Or(spec.ComputerNamePrefix, spec.Name),
		placementGroupLimit:  spec.PlacementGroupLimit,
		overprovision:        spec.Overprovision,
	}
	if spec.Flexible {
		set.byName, set.computers = map[string]*vmRecord{}, map[string]bool{}
	}
	for range spec.Capacity {
		vm := s.newVM(set, now)
		vm.state, vm.readyAt, vm.bootedAt = StateRunning, now, now
	}
	return set
}

// SetCapacity changes a scale set's capacity as an outside actor would (the
// portal, say): new VMs are created as by a scale-out (without faults),
// surplus VMs start deleting, and the ETag changes.
func (s *Server) SetCapacity(rg, name string, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, err := s.lookup(rg, name)
	if err != nil {
		return fmt.Errorf("setting capacity: %w", err)
	}
	if limit, why := set.capacityLimit(); n < 0 || n > limit {
		return fmt.Errorf("setting capacity of scale set %s/%s: %d is outside [0, %d] (%s)", rg, name, n, limit, why)
	}
	_, _ = s.resize(set, n, "", s.clock.Now())
	set.etag++
	klog.V(2).InfoS("Set scale set capacity", "resourceGroup", set.rg, "name", set.name, "capacity", n)
	return nil
}

// ScaleSet returns a snapshot of a scale set. The error wraps ErrNotFound
// if it does not exist.
func (s *Server) ScaleSet(rg, name string) (ScaleSetState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, err := s.lookup(rg, name)
	if err != nil {
		return ScaleSetState{}, err
	}
	st := ScaleSetState{Capacity: set.capacity(), ETag: set.etagString()}
	for _, vm := range set.sortedVMs() {
		st.VMs = append(st.VMs, VMState{
			InstanceID:   vm.instanceKey(),
			ProviderID:   "azure://" + s.vmResourceID(vm),
			ComputerName: vm.computerName(),
			State:        vm.state,
			ErrorCode:    vm.errorCode,
			PowerState:   vm.powerState(),
			EvictAt:      vm.evictAt,

			Overprovisioned: vm.extra,
			Action:          vm.action,
			Broken:          vm.broken,
			Host:            vm.host,
		})
	}
	return st, nil
}

// CodeVMExtensionProvisioningError is the code ARM gives a VM whose
// extension failed: its provisioning state is Failed, and it runs.
const CodeVMExtensionProvisioningError = "VMExtensionProvisioningError"

// DropVMsKeepCapacity removes the scale set's n newest VMs at once, as if
// never created, and keeps sku.capacity where it was: the state a
// scale-out leaves when its VMs could not be provisioned and were taken
// away while the capacity stayed at its target, which stalls an
// autoscaler that trusts sku.capacity (cluster-autoscaler issue 8323:
// the capacity counts machines that will never come). A capacity written
// lower takes the phantom units first.
func (s *Server) DropVMsKeepCapacity(rg, name string, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, err := s.lookup(rg, name)
	if err != nil {
		return fmt.Errorf("dropping VMs: %w", err)
	}
	vms := set.sortedVMs()
	dropped := 0
	for i := len(vms) - 1; i >= 0 && dropped < n; i-- {
		if vm := vms[i]; vm.state != StateDeleting && !vm.extra {
			set.remove(vm)
			dropped++
		}
	}
	if dropped < n {
		return fmt.Errorf("dropping %d VMs of scale set %s/%s: only %d", n, rg, name, dropped)
	}
	set.phantom += n
	set.etag++
	return nil
}

// FailRunningVM turns a running VM's provisioning state to Failed with the
// error code (CodeVMExtensionProvisioningError when empty) while it keeps
// running, as ARM reports a VM whose extension, data-disk attach or model
// update failed: provisioningState Failed, PowerState/running. Its node
// is untouched. RepairVM brings it back.
func (s *Server) FailRunningVM(rg, name, instanceID, code string) error {
	if code == "" {
		code = CodeVMExtensionProvisioningError
	}
	return s.changeVM(rg, name, instanceID, "failing", func(vm *vmRecord) error {
		if vm.state != StateRunning {
			return fmt.Errorf("VM is %s, not %s", vm.state, StateRunning)
		}
		vm.state, vm.errorCode, vm.failedRunning = StateFailed, code, true
		return nil
	})
}

// RepairVM brings a VM that FailRunningVM failed back to Succeeded, as a
// repaired model (a successful reimage, or the extension fixed and the
// model applied again) does.
func (s *Server) RepairVM(rg, name, instanceID string) error {
	return s.changeVM(rg, name, instanceID, "repairing", func(vm *vmRecord) error {
		if !vm.failedRunning || vm.state != StateFailed {
			return fmt.Errorf("VM is %s, not Failed while running", vm.state)
		}
		vm.state, vm.errorCode, vm.failedRunning = StateRunning, "", false
		return nil
	})
}

// changeVM applies change to one VM under the lock and bumps the scale
// set's etag (a VM's state is part of what a Get returns).
func (s *Server) changeVM(rg, name, instanceID, what string, change func(*vmRecord) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, err := s.lookup(rg, name)
	if err != nil {
		return fmt.Errorf("%s VM %s: %w", what, instanceID, err)
	}
	vm, ok := set.vmByKey(instanceID)
	if !ok {
		return fmt.Errorf("%s VM %s of scale set %s/%s: no such instance", what, instanceID, rg, name)
	}
	if err := change(vm); err != nil {
		return fmt.Errorf("%s VM %s of scale set %s/%s: %w", what, instanceID, rg, name, err)
	}
	set.etag++
	klog.V(2).InfoS("Changed a VM's state", "resourceGroup", set.rg, "name", set.name, "instanceID", instanceID,
		"action", what, "state", vm.state, "errorCode", vm.errorCode)
	return nil
}

// EvictSpotVMs gives the running Spot VMs named by instanceKeys (instance
// IDs, or VM names in a Flexible scale set) notice of their eviction, as
// Azure's Scheduled Events announce a Preempt, and evicts them notice
// later (by Options.Clock, at an Advance): under eviction policy Delete
// the VMs are deleted, and sku.capacity drops by itself; under Deallocate
// they stop (StateDeallocated) and stay in sku.capacity. Either way their
// nodes are gone, as the node hook is told (VMDeleted); a deallocated VM
// is not told about again when it is deleted later. Evictions are not
// ARM requests: a DeletionWatcher is not told of them.
func (s *Server) EvictSpotVMs(rg, name string, notice time.Duration, instanceKeys ...string) error {
	if notice < 0 {
		return fmt.Errorf("evicting VMs of scale set %s/%s: notice %v must not be negative", rg, name, notice)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	set, err := s.lookup(rg, name)
	if err != nil {
		return fmt.Errorf("evicting VMs: %w", err)
	}
	if !set.spot {
		return fmt.Errorf("evicting VMs of scale set %s/%s: it is not a Spot scale set", rg, name)
	}
	vms := make([]*vmRecord, 0, len(instanceKeys))
	for _, key := range instanceKeys {
		vm, ok := set.vmByKey(key)
		if !ok || vm.state != StateRunning || !vm.evictAt.IsZero() {
			return fmt.Errorf("evicting VM %s of scale set %s/%s: no running VM of that name without notice already", key, rg, name)
		}
		vms = append(vms, vm)
	}
	at := s.clock.Now().Add(notice)
	for _, vm := range vms {
		vm.evictAt = at
	}
	klog.V(2).InfoS("Spot VMs to be evicted", "resourceGroup", set.rg, "name", set.name, "count", len(vms),
		"policy", set.evictionPolicy, "at", at)
	return nil
}

// evict evicts a Spot VM whose notice is over; it returns whether the VM
// was deallocated (its node is to go now; a deleted VM's goes when it is
// gone). Callers hold s.mu.
func (s *Server) evict(vm *vmRecord, now time.Time) bool {
	vm.evictAt = time.Time{}
	vm.set.etag++
	if vm.set.evictionPolicy == EvictionDelete {
		s.startDeletingQuietly(vm, now)
		return false
	}
	vm.state = StateDeallocated
	return true
}

// InjectFault makes the scale set suffer f. Faults of several kinds (and
// several of one kind, applied in turn) can be active at once.
func (s *Server) InjectFault(rg, name string, f Fault) error {
	if f.Kind < FaultQuota || f.Kind > lastFaultKind {
		return fmt.Errorf("injecting fault into scale set %s/%s: unknown kind %v", rg, name, f.Kind)
	}
	if f.Count < 0 || f.Duration < 0 || f.Lag < 0 {
		return fmt.Errorf("injecting fault %v into scale set %s/%s: count, duration and lag must not be negative", f.Kind, rg, name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	set, err := s.lookup(rg, name)
	if err != nil {
		return fmt.Errorf("injecting fault %v: %w", f.Kind, err)
	}
	set.faults = append(set.faults, &f)
	klog.V(2).InfoS("Injected fault", "resourceGroup", set.rg, "name", set.name, "kind", f.Kind, "count", f.Count, "duration", f.Duration)
	return nil
}

// ClearFaults removes every fault from the scale set.
func (s *Server) ClearFaults(rg, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, err := s.lookup(rg, name)
	if err != nil {
		return fmt.Errorf("clearing faults: %w", err)
	}
	set.faults = nil
	return nil
}

// lookup finds a scale set. Callers hold s.mu.
func (s *Server) lookup(rg, name string) (*scaleSet, error) {
	set, ok := s.sets[setKey(rg, name)]
	if !ok {
		return nil, fmt.Errorf("scale set %s/%s: %w", rg, name, ErrNotFound)
	}
	return set, nil
}

// groupExists reports whether any scale set lives in the resource group.
// Callers hold s.mu.
func (s *Server) groupExists(rg string) bool {
	prefix := strings.ToLower(rg) + "/"
	for key := range s.sets {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// takeFault consumes one application of the first active fault of the
// kind, if any. Callers hold s.mu.
func (set *scaleSet) takeFault(kind FaultKind) (Fault, bool) {
	for i, f := range set.faults {
		if f.Kind != kind {
			continue
		}
		taken := *f
		if f.Count > 0 {
			f.Count--
			if f.Count == 0 {
				set.faults = slices.Delete(set.faults, i, i+1)
			}
		}
		return taken, true
	}
	return Fault{}, false
}

// capacityLimit is the most VMs a scale set with these properties holds,
// and why.
func capacityLimit(flexible, singlePlacementGroup bool, placementGroupLimit int, image string) (int, string) {
	switch {
	case flexible:
		return maxCapacity, "Flexible scale set"
	case singlePlacementGroup:
		return placementGroupLimit, "single placement group"
	case isManagedImage(image):
		return maxCapacityManagedImage, "managed custom image"
	}
	return maxCapacity, "Uniform scale set"
}

// isManagedImage reports whether an image resource ID names a managed
// custom image (not a gallery image version, not a platform image).
func isManagedImage(id string) bool {
	return strings.Contains(strings.ToLower(id), "/providers/microsoft.compute/images/")
}

func (set *scaleSet) capacityLimit() (int, string) {
	return capacityLimit(set.flexible, set.singlePlacementGroup, set.placementGroupLimit, set.image)
}

// checkCapacity answers as ARM does for a capacity the scale set cannot
// hold: outside the range of sku.capacity, 400 InvalidParameter; above
// what a single placement group or a managed image allows, 409
// OperationNotAllowed naming the limit in ARM's words (quoted in
// hashicorp/terraform-azurerm-nomad issue 6: "Unable to create or update
// VirtualMachineScaleSet '…' as it exceeds the total limit of '100'
// Virtual Machine instances.").
func (set *scaleSet) checkCapacity(n int) *armError {
	if n < 0 || n > maxCapacity {
		return capacityOutOfRange(n)
	}
	if limit, _ := set.capacityLimit(); n > limit {
		return &armError{http.StatusConflict, "OperationNotAllowed", fmt.Sprintf(
			"Unable to create or update VirtualMachineScaleSet '%s' as it exceeds the total limit of '%d' Virtual Machine instances.", set.name, limit), ""}
	}
	return nil
}

func capacityOutOfRange(n int) *armError {
	return &armError{http.StatusBadRequest, "InvalidParameter",
		fmt.Sprintf("The value %d of parameter 'sku.capacity' is out of range. The value must be between 0 and %d, inclusive.", n, maxCapacity), ""}
}

// capacity counts the VMs not being deleted, overprovisioned extras
// aside (sku.capacity stays the number asked for), and the phantom
// capacity.
func (set *scaleSet) capacity() int {
	n := set.phantom
	for _, vm := range set.vms {
		if vm.state != StateDeleting && !vm.extra {
			n++
		}
	}
	return n
}

func (set *scaleSet) etagString() string { return `"` + strconv.Itoa(set.etag) + `"` }

// sortedVMs returns the VMs by instance ID.
func (set *scaleSet) sortedVMs() []*vmRecord {
	vms := slices.Collect(maps.Values(set.vms))
	slices.SortFunc(vms, func(a, b *vmRecord) int { return a.instanceID - b.instanceID })
	return vms
}

// provisioningState is the scale set's provisioning state at now.
func (set *scaleSet) provisioningState(now time.Time) string {
	switch {
	case set.lastOp == nil:
		return "Succeeded"
	case !set.lastOp.done(now):
		return "Updating"
	case set.lastOp.errCode != "":
		return "Failed"
	}
	return "Succeeded"
}

// familyUsage is the number of vCPUs of the SKU family in use by all VMs
// but overprovisioned extras, which "do not count toward your quota
// limits" ("Design considerations for scale sets", Overprovisioning).
// Callers hold s.mu.
func (s *Server) familyUsage(family string) int {
	n := 0
	for _, set := range s.sets {
		if set.sku.Family != family {
			continue
		}
		for _, vm := range set.vms {
			if !vm.extra {
				n += set.sku.VCPUs
			}
		}
	}
	return n
}

// newVM adds a VM in state Creating to the set. Callers hold s.mu.
func (s *Server) newVM(set *scaleSet, now time.Time) *vmRecord {
	id := set.nextID
	set.nextID++
	booted := now.Add(s.bootTime())
	vm := &vmRecord{
		set:        set,
		instanceID: id,
		vmID:       newUUID(),
		state:      StateCreating,
		created:    now,
		bootedAt:   booted,
		readyAt:    booted.Add(s.extensionTime(set.sku)),
	}
	if len(set.zones) > 0 {
		vm.zone = set.zones[id%len(set.zones)]
	}
	if set.flexible {
		vm.name, vm.computer = s.flexibleNames(set)
		set.byName[strings.ToLower(vm.name)] = vm
		set.computers[vm.computer] = true
	}
	set.vms[id] = vm
	return vm
}

// flexibleNames draws a new VM's name and computer name in a Flexible
// scale set as Azure forms them, "<set>_<8 hex digits>" and "<computer
// name prefix><6 characters of [0-9a-z]>", unique in the set, from the
// seeded source (a run is repeatable). Callers hold s.mu.
func (s *Server) flexibleNames(set *scaleSet) (name, computer string) {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	for {
		name = fmt.Sprintf("%s_%08x", set.name, s.rng.Uint32())
		if _, dup := set.byName[strings.ToLower(name)]; !dup {
			break
		}
	}
	for {
		var b [6]byte
		for i := range b {
			b[i] = alphabet[s.rng.IntN(len(alphabet))]
		}
		computer = set.computerPrefix + string(b[:])
		if !set.computers[computer] {
			return name, computer
		}
	}
}

// instanceKey is what names the VM in requests: its instance ID in a
// Uniform scale set, its VM name in a Flexible one.
func (vm *vmRecord) instanceKey() string {
	if vm.set.flexible {
		return vm.name
	}
	return strconv.Itoa(vm.instanceID)
}

// vmByKey finds a VM by what instanceKey returns: an instance ID in its
// canonical form (Uniform), a VM name in any case (Flexible). Callers
// hold s.mu.
func (set *scaleSet) vmByKey(key string) (*vmRecord, bool) {
	if set.flexible {
		vm, ok := set.byName[strings.ToLower(key)]
		return vm, ok
	}
	n, err := strconv.Atoi(key)
	vm, ok := set.vms[n]
	return vm, ok && err == nil && strconv.Itoa(n) == key
}

// remove forgets a VM that is gone. Callers hold s.mu.
func (set *scaleSet) remove(vm *vmRecord) {
	delete(set.vms, vm.instanceID)
	if set.flexible {
		delete(set.byName, strings.ToLower(vm.name))
		delete(set.computers, vm.computer)
	}
}

// bootTime is how long a new VM stays Creating: BootDelay plus a uniform
// draw from [-BootJitter, +BootJitter], never negative. Callers hold s.mu
// (the random source is not safe for concurrent use).
func (s *Server) bootTime() time.Duration {
	d := s.opts.BootDelay
	if j := s.opts.BootJitter; j > 0 {
		d += time.Duration(s.rng.Int64N(2*int64(j)+1)) - j
	}
	return max(d, 0)
}

// resize creates or starts deleting VMs so that the capacity becomes n
// and returns the VMs it created (overprovisioned extras aside) and those
// it started deleting. New VMs fail with failWith, if set, instead of
// booting. An increase of an overprovisioning scale set also creates its
// extras (overprovision). A decrease deletes the newest VMs, those still
// being created first. Callers hold s.mu.
func (s *Server) resize(set *scaleSet, n int, failWith string, now time.Time) (created, deleting []*vmRecord) {
	current := set.capacity()
	for ; current < n; current++ {
		vm := s.newVM(set, now)
		vm.failWith = failWith
		created = append(created, vm)
	}
	if len(created) > 0 {
		s.overprovision(set, created, failWith, now)
	}
	if current <= n {
		return created, nil
	}
	// Capacity with no VM behind it goes first: no VM to delete.
	drop := min(set.phantom, current-n)
	set.phantom -= drop
	current -= drop
	if current <= n {
		return created, nil
	}
	live := set.deletionOrder()
	for _, vm := range live[:current-n] {
		s.startDeleting(vm, now)
	}
	return nil, live[:current-n]
}

// deletionOrder lists the set's VMs a capacity decrease may delete (not
// Deleting, not overprovisioned extras) in the order it deletes them: those
// still being created first, then the newest.
func (set *scaleSet) deletionOrder() []*vmRecord {
	var live []*vmRecord
	for _, vm := range set.vms {
		if vm.state != StateDeleting && !vm.extra {
			live = append(live, vm)
		}
	}
	slices.SortFunc(live, func(a, b *vmRecord) int {
		if ac, bc := a.state == StateCreating, b.state == StateCreating; ac != bc {
			if ac {
				return -1
			}
			return 1
		}
		return b.instanceID - a.instanceID
	})
	return live
}

// startDeleting moves a VM to Deleting and, while a request is handled for a
// DeletionWatcher, records it for the watcher. Callers hold s.mu.
func (s *Server) startDeleting(vm *vmRecord, now time.Time) {
	s.startDeletingQuietly(vm, now)
	if s.recordDeleting {
		s.deleting = append(s.deleting, vm)
	}
}

// startDeletingQuietly moves a VM to Deleting without telling a
// DeletionWatcher (an eviction is no request). Callers hold s.mu.
func (s *Server) startDeletingQuietly(vm *vmRecord, now time.Time) {
	vm.before = vmBefore{state: vm.state, errorCode: vm.errorCode, failedRunning: vm.failedRunning, evictAt: vm.evictAt}
	vm.deletedBy = nil
	vm.wasDeallocated = vm.state == StateDeallocated
	vm.state, vm.failedRunning, vm.evictAt = StateDeleting, false, time.Time{}
	vm.deleteAt = now.Add(s.opts.DeleteDelay)
}

// newOperation starts an asynchronous operation on the set that lasts
// as long as its VMs (vmsDone: when the last VM it creates is
// provisioned, or the last it deletes is gone; see operationEnd),
// applying FaultSlowLRO, and FaultLROFail unless errCode is already set.
// Callers hold s.mu.
func (s *Server) newOperation(set *scaleSet, errCode, errMessage string, now, vmsDone time.Time) *operation {
	end := s.operationEnd(now, vmsDone)
	if f, ok := set.takeFault(FaultSlowLRO); ok {
		end = end.Add(f.Duration)
	}
	if errCode == "" {
		if _, ok := set.takeFault(FaultLROFail); ok {
			errCode = CodeInternalExecutionError
			errMessage = "An internal execution error occurred. Please retry later."
		}
	}
	op := &operation{id: newUUID(), set: set, start: now, end: end, errCode: errCode, errMessage: errMessage}
	s.ops[op.id] = op
	set.lastOp = op
	set.active = append(set.active, op)
	return op
}

// checkUpdate answers as ARM does a PATCH of the scale set that fails its
// preconditions or asks for what the scale set cannot be; nil when it can
// be applied. It changes nothing. Callers hold s.mu.
func (set *scaleSet) checkUpdate(p updateRequest) *armError {
	if p.ifMatch != "" && p.ifMatch != "*" && normalizeETag(p.ifMatch) != normalizeETag(set.etagString()) {
		return &armError{http.StatusPreconditionFailed, "PreconditionFailed",
			fmt.Sprintf("The specified precondition 'If-Match = %s' failed: the current ETag of scale set '%s' is %s.", p.ifMatch, set.name, set.etagString()), ""}
	}
	if p.ifNoneMatch == "*" || (p.ifNoneMatch != "" && normalizeETag(p.ifNoneMatch) == normalizeETag(set.etagString())) {
		return &armError{http.StatusPreconditionFailed, "PreconditionFailed",
			fmt.Sprintf("The specified precondition 'If-None-Match = %s' failed.", p.ifNoneMatch), ""}
	}
	if p.skuName != "" && !strings.EqualFold(p.skuName, set.sku.Name) {
		return &armError{http.StatusConflict, "PropertyChangeNotAllowed",
			fmt.Sprintf("Changing property 'sku.name' from '%s' to '%s' is not allowed by the simulator.", set.sku.Name, p.skuName), ""}
	}
	if p.capacity != nil {
		return set.checkCapacity(*p.capacity)
	}
	return nil
}

// update applies a PATCH of the scale set. Callers hold s.mu.
func (s *Server) update(set *scaleSet, p updateRequest, now time.Time) (*operation, *armError) {
	if aerr := set.checkUpdate(p); aerr != nil {
		return nil, aerr
	}
	// A capacity write supersedes the operations still under way; a
	// preempted instance deletion puts back the VMs it had not deleted
	// yet, so they count in the capacity the write starts from.
	current := set.capacity()
	if p.capacity != nil {
		current += s.preemptedDeletions(set, now)
	}
	want := current
	if p.capacity != nil {
		want = *p.capacity
	}
	failWith, failMessage := "", ""
	if want > current {
		if _, ok := set.takeFault(FaultQuota); ok {
			usage := s.familyUsage(set.sku.Family)
			return nil, &armError{http.StatusConflict, "OperationNotAllowed", fmt.Sprintf(
				"Operation could not be completed as it results in exceeding approved %s Cores quota. "+
					"Additional details - Deployment Model: Resource Manager, Location: %s, Current Limit: %d, "+
					"Current Usage: %d, Additional Required: %d, (Minimum) New Limit Required: %d.",
				set.sku.Family, s.opts.Location, usage, usage, (want-current)*set.sku.VCPUs, usage+(want-current)*set.sku.VCPUs), ""}
		}
		if _, ok := set.takeFault(FaultAllocation); ok {
			failWith = CodeAllocationFailed
			failMessage = allocationFailedMessage
		}
	}
	if p.capacity != nil {
		s.preempt(set, now)
	}
	if p.tags != nil {
		set.tags = p.tags
	}
	created, deleting := s.resize(set, want, failWith, now)
	set.etag++
	op := s.newOperation(set, failWith, failMessage, now, vmsDone(created, deleting))
	klog.V(2).InfoS("Updated scale set", "resourceGroup", set.rg, "name", set.name, "from", current, "to", want,
		"etag", set.etagString(), "operation", op.id, "fails", op.errCode)
	return op, nil
}

// acceptLate takes a FaultCommitLate for an update that passes its checks:
// the update is kept to land later and true returned (the caller answers
// 500); false when the fault is not active or the update would be
// refused. Callers hold s.mu.
func (s *Server) acceptLate(set *scaleSet, p updateRequest) bool {
	if set.checkUpdate(p) != nil {
		return false
	}
	f, ok := set.takeFault(FaultCommitLate)
	if !ok {
		return false
	}
	p.ifMatch, p.ifNoneMatch = "", "" // checked now; it lands as accepted
	set.late = append(set.late, &lateCommit{req: p, wait: max(f.Lag, 1)})
	klog.V(2).InfoS("Accepted a scale set update that lands late; answering 500", "resourceGroup", set.rg, "name", set.name,
		"capacity", p.capacity, "lag", max(f.Lag, 1))
	return true
}

// landLate is called for each request about the scale set (and, with all,
// by Advance): the late updates whose wait is over land, in order, before
// the request is handled; the others wait one request less. Callers hold
// s.mu.
func (s *Server) landLate(set *scaleSet, all bool, now time.Time) {
	kept := set.late[:0]
	for _, l := range set.late {
		if len(kept) == 0 && (all || l.wait == 0) {
			op, aerr := s.update(set, l.req, now)
			if aerr != nil {
				klog.V(2).InfoS("A late scale set update was refused when it landed", "resourceGroup", set.rg, "name", set.name, "err", aerr.Error())
				continue
			}
			klog.V(2).InfoS("A late scale set update landed", "resourceGroup", set.rg, "name", set.name,
				"capacity", set.capacity(), "operation", op.id)
			continue
		}
		if l.wait > 0 {
			l.wait--
		}
		kept = append(kept, l)
	}
	clear(set.late[len(kept):])
	set.late = kept
}

const allocationFailedMessage = "Allocation failed. We do not have sufficient capacity for the requested VM size in this region. " +
	"Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance"

// deleteInstances starts deleting VMs by instance ID, with force deletion
// if force. Callers hold s.mu.
func (s *Server) deleteInstances(set *scaleSet, ids []string, force bool, now time.Time) (*operation, *armError) {
	if len(ids) == 0 {
		return nil, &armError{http.StatusBadRequest, "InvalidParameter", "The parameter 'instanceIds' must contain at least one instance ID.", ""}
	}
	s.vanishFirst(set, ids)
	vms := make([]*vmRecord, 0, len(ids))
	for _, id := range ids {
		vm, ok := set.vmByKey(id)
		if !ok {
			// The whole batch is refused, in ARM's words (quoted in
			// microsoft/onefuzz issue 2547: 400 InvalidParameter,
			// target instanceIds).
			return nil, &armError{status: http.StatusBadRequest, code: "InvalidParameter", target: "instanceIds",
				message: fmt.Sprintf("The provided instanceId %s is not an active Virtual Machine Scale Set VM instanceId.", id)}
		}
		vms = append(vms, vm)
	}
	if force {
		if aerr := s.refuseForceDeletion(set); aerr != nil {
			return nil, aerr
		}
	}
	s.preempt(set, now)
	_, fails := set.takeFault(FaultDeleteFails)
	slow, _ := set.takeFault(FaultSlowDelete)
	var started []*vmRecord
	for _, vm := range vms {
		if vm.state != StateDeleting {
			s.startDeleting(vm, now)
			vm.deleteAt = vm.deleteAt.Add(slow.Duration)
			vm.deleteFails = fails
			started = append(started, vm)
		}
	}
	set.etag++
	errCode, errMessage := "", ""
	if fails {
		errCode, errMessage = CodeInternalExecutionError, "An internal execution error occurred while deleting the virtual machines. Please retry later."
	}
	op := s.newOperation(set, errCode, errMessage, now, vmsDone(nil, vms))
	op.deleting = started
	for _, vm := range started {
		vm.deletedBy = op
	}
	klog.V(2).InfoS("Deleting scale set instances", "resourceGroup", set.rg, "name", set.name, "instanceIDs", ids,
		"capacity", set.capacity(), "operation", op.id)
	return op, nil
}

// vanishFirst applies FaultVanishBeforeDelete to a deletion naming ids:
// its first VM is removed as a finished out-of-band deletion, and its
// node is gone at the next Advance. Callers hold s.mu.
func (s *Server) vanishFirst(set *scaleSet, ids []string) {
	if len(ids) < 2 {
		return
	}
	vm, ok := set.vmByKey(ids[0])
	if !ok {
		return
	}
	if _, ok := set.takeFault(FaultVanishBeforeDelete); !ok {
		return
	}
	set.remove(vm)
	set.etag++
	if vm.notified && !slices.Contains(s.gone, vm) {
		s.gone = append(s.gone, vm)
	}
	klog.V(2).InfoS("Fault: a VM vanished before the deletion naming it", "resourceGroup", set.rg, "name", set.name, "instanceID", ids[0])
}

// normalizeETag strips a weak prefix and quotes from an entity tag.
func normalizeETag(tag string) string {
	tag = strings.TrimSpace(tag)
	tag = strings.TrimPrefix(tag, "W/")
	return strings.Trim(tag, `"`)
}

// transition applies the time-based state changes due at now and returns the
// VMs removed and those deallocated by a Spot eviction. Callers hold s.mu.
func (s *Server) transition(now time.Time) (removed, deallocated []*vmRecord) {
	for _, set := range s.sets {
		s.landLate(set, true, now)
		for _, vm := range set.vms {
			gone, evicted := s.transitionVM(set, vm, now)
			if gone {
				removed = append(removed, vm)
			}
			if evicted {
				deallocated = append(deallocated, vm)
			}
		}
		s.dropExtras(set, now)
	}
	s.pruneOperations(now)
	for _, set := range s.sets {
		set.pruneActive(now)
	}
	return removed, deallocated
}

// transitionVM applies the change due to one VM at now: an action ending,
// a Spot eviction, a creation or deletion progressing. It says whether the
// VM was removed, or deallocated by the eviction. Callers hold s.mu.
func (s *Server) transitionVM(set *scaleSet, vm *vmRecord, now time.Time) (removed, deallocated bool) {
	switch {
	case vm.action != "" && !now.Before(vm.actionEnd):
		s.endAction(vm)
	case !vm.evictAt.IsZero() && !now.Before(vm.evictAt) && vm.state == StateRunning:
		return false, s.evict(vm, now)
	case vm.state == StateCreating:
		advanceCreating(vm, now)
	case vm.state == StateDeleting:
		return advanceDeleting(set, vm, now), false
	}
	return false, false
}

// advanceCreating moves a Creating VM on: Running (or Failed) once ready,
// booted once its boot time has come.
func advanceCreating(vm *vmRecord, now time.Time) {
	switch {
	case vm.extra:
		// An overprovisioned extra never turns Running: it goes
		// once the requested VMs are provisioned (dropExtras).
		vm.booted = !now.Before(vm.bootedAt)
	case !now.Before(vm.readyAt):
		if vm.failWith != "" {
			vm.state, vm.errorCode = StateFailed, vm.failWith
		} else {
			vm.state = StateRunning
		}
		vm.booted = false
	case !now.Before(vm.bootedAt):
		vm.booted = vm.failWith == ""
	}
}

// advanceDeleting ends a Deleting VM's deletion once due: the VM is
// removed (true), or Running again if its deletion fails.
func advanceDeleting(set *scaleSet, vm *vmRecord, now time.Time) bool {
	if now.Before(vm.deleteAt) {
		return false
	}
	if vm.deleteFails {
		vm.state, vm.deleteFails = StateRunning, false
		set.etag++
		return false
	}
	set.remove(vm)
	return true
}

// pruneOperations forgets operations ended longer than operationRetention
// ago. Callers hold s.mu.
func (s *Server) pruneOperations(now time.Time) {
	for id, op := range s.ops {
		if now.Sub(op.end) > operationRetention {
			delete(s.ops, id)
		}
	}
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
