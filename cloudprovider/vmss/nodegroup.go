package vmss

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// scaleSet is one VMSS node group. Its fields are guarded by mu, but for
// id.
type scaleSet struct {
	p    *Provider
	rg   string // as in --azure-resource-groups
	name string
	// id is the group's ID when it is not the name: "<resource group>/<name>"
	// while scale sets of its name are in several resource groups (set by
	// Refresh).
	id atomic.Pointer[string]
	// flexible is Flexible orchestration: its VMs are virtual machines of
	// their own, listed through the Virtual Machines API, named (not
	// numbered) and deleted by name; their provider IDs do not name the
	// scale set.
	flexible bool
	// spot (guarded by mu) is Spot priority, read from the scale set's
	// VM profile: Azure evicts its VMs, which changes its capacity
	// (eviction policy Delete) or leaves deallocated VMs in it
	// (evictionPolicy Deallocate).
	spot           bool
	evictionPolicy armcompute.VirtualMachineEvictionPolicyTypes
	// evictable (guarded by mu) holds, for a Spot scale set, the VMs its
	// last list showed that Azure may yet evict, by provider ID key (the
	// ID as listed): what the next list compares with (evictions.go).
	// Nil before the first list, and for a regular scale set.
	evictable map[string]string

	mu       sync.Mutex
	min, max int // max as configured (--nodes or the max tag)
	// limit is the most VMs the scale set can hold, from its properties
	// and tags (platformLimit), lowered by what ARM said when it refused
	// a size (learned, forgotten when the limit read changes); why says
	// what sets it.
	limit, learned int
	limitWhy       string
	// warned is the clamp last logged, so it is logged once per change.
	warned   string
	view     scaleSetView
	known    bool   // capacity was read successfully at least once
	stale    string // why the cache cannot be trusted now ("" when fresh)
	etag     string
	sku      skuInfo
	skuKnown bool
	// instances from the last VM list, with local overrides applied.
	instances []cloudprovider.Instance
	// deleting holds provider IDs this process asked ARM to delete, until
	// the VM list no longer shows them.
	deleting map[string]bool
	// failedOps are scale-ups whose operation failed; for the machines such
	// an operation never created, update adds placeholder failed instances
	// (the core deletes them like failed VMs, which drops them).
	failedOps []failedOp
	dropped   map[string]bool
	opSeq     int
	// scaleUp is this process's capacity write whose operation is still
	// watched (nil when none): while it runs, IncreaseSize sends no other
	// (operations.go), unless Config.ConcurrentScaleUps.
	scaleUp *runningOp
	// redelete are deletions whose operation ARM preempted or partly
	// refused, waiting for the next VM list to send again what it still
	// shows (operations.go).
	redelete []*deletion
	// noForce: ARM refused a force deletion of this scale set's VMs
	// (isolated VM sizes, maintenance control): its deletions are sent
	// without force from then on.
	noForce bool
	// maxInstanceID is the highest numeric instance ID seen (Uniform).
	maxInstanceID int
	// list is the VM-list bookkeeping (vmlist.go).
	list listState
	// warnedOverprovision: the overprovisioning warning was logged.
	warnedOverprovision bool
	// optionsProblem is the last invalid autoscaling-options tags logged
	// (each is logged once, when it first appears).
	optionsProblem string
	// repairs are the in-place repairs this process started, by machine
	// (provider ID key): repair.go.
	repairs map[string]*repairOp
}

// failedOp is a scale-up operation that ARM reported failed.
type failedOp struct {
	op, delta int
	before    opBase
	err       cloudprovider.InstanceError
}

// opBase is what a scale-up saw of its scale set when it was sent: the
// VMs listed since are the ones it may have created.
type opBase struct {
	// maxID is the highest instance ID seen (Uniform: instance IDs grow).
	maxID int
	// listed holds the provider ID keys of the VMs then listed (Flexible:
	// VM names are drawn at random, so only the names already seen tell
	// new VMs from old).
	listed map[string]bool
}

// newSince says the instance was not listed when the operation was sent.
func (b opBase) newSince(flexible bool, in cloudprovider.Instance) bool {
	if flexible {
		return !b.listed[cloudprovider.ProviderIDKey(in.ProviderID)] && !isPlaceholder(in.ProviderID)
	}
	id, ok := numericInstanceID(in.ProviderID)
	return ok && id > b.maxID
}

// baseLocked is the scale set as a scale-up sent now sees it.
func (g *scaleSet) baseLocked() opBase {
	b := opBase{maxID: g.maxInstanceID}
	if g.flexible {
		b.listed = make(map[string]bool, len(g.instances))
		for _, in := range g.instances {
			b.listed[cloudprovider.ProviderIDKey(in.ProviderID)] = true
		}
	}
	return b
}

// scaleSetView is what a refresh read of the scale set.
type scaleSetView struct {
	name     string
	location string
	zones    []string
	tags     map[string]string
	capacity int
	skuName  string
	spot     bool
	// overprovision: Azure makes extra VMs on scale-out and deletes them
	// (vmlist.go).
	overprovision bool
}

// placeholdersLocked returns a failed instance for each machine a failed
// scale-up never created: the operation's delta minus the VMs listed since
// it was sent (a higher instance ID than any seen before, in a Uniform
// scale set; a name not listed before, in a Flexible one).
//
// A placeholder's provider ID has the Uniform form for either mode:
// .../virtualMachineScaleSets/<set>/virtualMachines/failed-op<op>-<i>. It
// is no VM's ID, and that form names the scale set, so DeleteNodes knows
// it as this group's without a lookup.
//
// It is called once per VM list, after the list is applied: the
// deletions waiting for a list to be sent again are settled first
// (settleRedeletesLocked, operations.go).
func (g *scaleSet) placeholdersLocked() []cloudprovider.Instance {
	g.settleRedeletesLocked()
	var out []cloudprovider.Instance
	kept := g.failedOps[:0]
	for _, f := range g.failedOps {
		created := 0
		for _, in := range g.instances {
			if f.before.newSince(g.flexible, in) {
				created++
			}
		}
		if !g.flexible {
			// Instance IDs grow and are never reused: the IDs seen since
			// the operation was sent were its VMs (or another writer's),
			// whether or not they are still listed. A Failed VM of the
			// operation that was deleted before its failure was seen
			// (the core removes failed machines at once; the operation
			// ends when its VMs do) was created, not a machine it never
			// made: counting it again as a placeholder reported each
			// failure twice and doubled the group's backoff per machine.
			created = max(created, min(f.delta, g.maxInstanceID-f.before.maxID))
		}
		live := 0
		for i := created; i < f.delta; i++ {
			pid := fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s/virtualMachines/%s%d-%d",
				g.p.cfg.SubscriptionID, g.rg, g.name, placeholderPrefix, f.op, i)
			if g.dropped[cloudprovider.ProviderIDKey(pid)] {
				continue
			}
			e := f.err
			out = append(out, cloudprovider.Instance{ProviderID: pid, State: cloudprovider.InstanceCreating, Error: &e})
			live++
		}
		if live > 0 {
			kept = append(kept, f)
		}
	}
	g.failedOps = kept
	return out
}

// placeholderPrefix starts the last segment of a placeholder's provider ID.
const placeholderPrefix = "failed-op"

// isPlaceholder says the provider ID is a placeholder's (of the Uniform
// form: a Flexible VM named failed-op… is none).
func isPlaceholder(providerID string) bool {
	ref, ok := parseProviderID(providerID)
	return ok && strings.HasPrefix(ref.instanceID, placeholderPrefix)
}

// lastSegment is the last segment of a resource ID or provider ID: a
// Uniform VM's instance ID, a Flexible VM's name.
func lastSegment(id string) string {
	return id[strings.LastIndex(id, "/")+1:]
}

// numericInstanceID returns the instance ID of a VM's provider ID when it
// is a number (placeholders are not).
func numericInstanceID(providerID string) (int, bool) {
	i := strings.LastIndex(providerID, "/")
	n, err := strconv.Atoi(providerID[i+1:])
	return n, err == nil
}

// vmStatus is what the provider reads of a VM, from either API: a
// Uniform scale set's VM (the scale-set VM API) or a Flexible one's (a
// virtual machine of its own).
type vmStatus struct {
	id                string // ARM resource ID
	provisioningState string
	// view is the instance view's statuses; hasView says there was one.
	view    []*armcompute.InstanceViewStatus
	hasView bool
}

// statusOfScaleSetVM reads a Uniform scale set's VM; ok is false without
// an ID. ARM lists a VM with an empty ID while it is being deleted
// (cluster-autoscaler's buildScaleSetCacheForUniform skips those: "The
// resource ID is empty string, which indicates the instance may be in
// deleting state"): it is no machine to act on, and an empty instance ID
// in a deletion would have ARM refuse the whole batch.
func statusOfScaleSetVM(vm *armcompute.VirtualMachineScaleSetVM) (vmStatus, bool) {
	if vm == nil || vm.ID == nil || *vm.ID == "" {
		return vmStatus{}, false
	}
	st := vmStatus{id: *vm.ID}
	if p := vm.Properties; p != nil {
		st.provisioningState = deref(p.ProvisioningState)
		if p.InstanceView != nil {
			st.view, st.hasView = p.InstanceView.Statuses, true
		}
	}
	return st, true
}

// statusOfVirtualMachine reads a Flexible scale set's VM; ok is false
// without an ID.
func statusOfVirtualMachine(vm *armcompute.VirtualMachine) (vmStatus, bool) {
	if vm == nil || vm.ID == nil || *vm.ID == "" {
		return vmStatus{}, false
	}
	st := vmStatus{id: *vm.ID}
	if p := vm.Properties; p != nil {
		st.provisioningState = deref(p.ProvisioningState)
		if p.InstanceView != nil {
			st.view, st.hasView = p.InstanceView.Statuses, true
		}
	}
	return st, true
}

// instanceOf maps a VM's provisioning state and instance view to an instance.
func instanceOf(vm vmStatus) cloudprovider.Instance {
	in := cloudprovider.Instance{ProviderID: "azure://" + vm.id, State: cloudprovider.InstanceRunning}
	switch strings.ToLower(vm.provisioningState) {
	case "creating":
		in.State = cloudprovider.InstanceCreating
	case "deleting":
		in.State = cloudprovider.InstanceDeleting
	case "failed":
		code, msg := failureOf(vm)
		ie := &cloudprovider.InstanceError{Class: classOfCode(0, code, msg), Code: code, Message: msg}
		// The provisioning state is the last operation's: a VM whose
		// extension, data-disk attach or model update failed is Failed
		// and runs on. Only one that is not running (or whose power state
		// is not reported) failed to come up (cluster-autoscaler's rule).
		if ps := powerState(vm); ps == "running" || ps == "starting" {
			in.FailedRunning = ie
			return in
		}
		in.Error = ie
		return in
	}
	// The power state refines a VM that exists: one still starting is
	// coming capacity; one deallocated (or going there) is not capacity.
	// One Updating while it starts is an existing machine booting again
	// (a restart, reimage or redeploy: repair.go), not capacity coming.
	switch powerState(vm) {
	case "starting":
		if in.State == cloudprovider.InstanceRunning && !strings.EqualFold(vm.provisioningState, "updating") {
			in.State = cloudprovider.InstanceCreating
		}
	case "deallocating", "deallocated":
		in.State = cloudprovider.InstanceDeleting
	}
	return in
}

// spotOf reads a scale set's priority and eviction policy.
func spotOf(s *armcompute.VirtualMachineScaleSet) (bool, armcompute.VirtualMachineEvictionPolicyTypes) {
	if s.Properties == nil || s.Properties.VirtualMachineProfile == nil {
		return false, ""
	}
	vp := s.Properties.VirtualMachineProfile
	if vp.Priority == nil || *vp.Priority != armcompute.VirtualMachinePriorityTypesSpot {
		return false, ""
	}
	if vp.EvictionPolicy == nil {
		return true, ""
	}
	return true, *vp.EvictionPolicy
}

// CodeSpotEvicted is the error code of a Spot VM that Azure evicted and
// deallocated (eviction policy Deallocate).
const CodeSpotEvicted = "SpotEvicted"

// deallocatedSpot turns a deallocated VM of a Spot scale set with
// eviction policy Deallocate into a failed instance: Azure evicted it; it
// runs nothing yet stays in sku.capacity and holds its cores in the
// quota, so it is to be deleted (ClassEvicted: one eviction backs nothing
// off, the core counts them) rather than counted as deleting for ever.
func deallocatedSpot(in *cloudprovider.Instance, vm vmStatus) {
	if powerState(vm) != "deallocated" || in.Error != nil {
		return
	}
	in.State = cloudprovider.InstanceRunning
	in.Error = &cloudprovider.InstanceError{Class: cloudprovider.ClassEvicted, Code: CodeSpotEvicted,
		Message: "Spot VM evicted and deallocated (eviction policy Deallocate): it runs nothing and holds its cores in the quota"}
}

// powerState is the VM's power state from its instance view
// ("PowerState/running" → "running"), or "".
func powerState(vm vmStatus) string {
	for _, st := range vm.view {
		if st != nil && st.Code != nil {
			if rest, ok := strings.CutPrefix(*st.Code, "PowerState/"); ok {
				return strings.ToLower(rest)
			}
		}
	}
	return ""
}

// failureOf finds the error code of a failed VM in its instance view
// ("ProvisioningState/failed/AllocationFailed").
func failureOf(vm vmStatus) (string, string) {
	if !vm.hasView {
		return "ProvisioningFailed", "provisioning failed (no instance view)"
	}
	for _, st := range vm.view {
		if st == nil || st.Code == nil {
			continue
		}
		if rest, ok := strings.CutPrefix(*st.Code, "ProvisioningState/failed/"); ok {
			return rest, deref(st.Message)
		}
	}
	return "ProvisioningFailed", "provisioning failed"
}

func (g *scaleSet) markStale(why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stale = why
}

// ID implements cloudprovider.NodeGroup: the scale set's name, or
// "<resource group>/<name>" while that name is ambiguous (scale sets of
// it are in several of the resource groups).
func (g *scaleSet) ID() string {
	if id := g.id.Load(); id != nil {
		return *id
	}
	return g.name
}

// MinSize implements cloudprovider.NodeGroup.
func (g *scaleSet) MinSize() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.min
}

// MaxSize implements cloudprovider.NodeGroup: the configured max, or what
// the scale set can hold when that is less.
func (g *scaleSet) MaxSize() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.maxLocked()
}

func (g *scaleSet) maxLocked() int {
	if l, _ := g.limitLocked(); l > 0 && l < g.max {
		return l
	}
	return g.max
}

// limitLocked is the lower of the platform limit and a learned one (0 when
// neither is known).
func (g *scaleSet) limitLocked() (int, string) {
	l, why := g.limit, g.limitWhy
	if g.learned > 0 && (l == 0 || g.learned < l) {
		l, why = g.learned, "refused by ARM above this size"
	}
	return l, why
}

// SizeLimit implements cloudprovider.SizeLimited.
func (g *scaleSet) SizeLimit() (int, int, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	l, why := g.limitLocked()
	return g.max, l, why
}

// warnLimit logs, once per change, that the configured max is more than
// the scale set can hold.
func (g *scaleSet) warnLimit(logger klog.Logger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	l, why := g.limitLocked()
	key := ""
	if l > 0 && g.max > l {
		key = fmt.Sprintf("%d/%d/%s", g.max, l, why)
	}
	if key == g.warned {
		return
	}
	g.warned = key
	if key != "" {
		logger.Info("Warning: node group max is more than its scale set can hold; using the scale set's limit",
			"nodeGroup", g.ID(), "configuredMax", g.max, "limit", l, "reason", why)
	}
}

// Platform limits of a scale set's capacity (Azure's "Virtual Machine
// Scale Sets and placement groups"): a Uniform scale set spanning several
// placement groups holds 1,000 VMs from a platform or Azure Compute
// Gallery image, 600 from a managed custom image; a single placement
// group holds 100 ("When set to the default value of true, a scale set is
// composed of a single placement group, and has a range of 0-100 VMs"),
// which Azure raises to at most 300 for a scale set on request (azure-cli
// issue 9630: "the limit is now 300", for InfiniBand sizes whose VMs must
// share a placement group). A Flexible scale set holds 1,000.
const (
	limitUniform            = 1000
	limitManagedImage       = 600
	limitSinglePlacement    = 100
	limitSinglePlacementMax = 300
)

// tagPlacementGroupLimit, on a single-placement-group scale set, says
// Azure raised its cap on request: the value (100 to 300) is the most
// VMs the provider sends a capacity for. No property of the scale set
// says so, and the provider sends no capacity above what it believes the
// set holds (a refused write backs the group off for long), so without
// the tag it keeps to 100. A tag that says more than Azure granted is
// corrected by ARM's answer to a capacity beyond the real cap ("exceeds
// the total limit of 'N'"): the group's max follows N (learned), until
// the tag changes.
const tagPlacementGroupLimit = "vmss-autoscaler.io_placement-group-limit"

// platformLimit returns the most VMs the scale set can hold and why. A
// scale set that does not say whether it is a single placement group is
// taken as not one (ARM always says; a guess would block a scale-up).
func platformLimit(s *armcompute.VirtualMachineScaleSet) (int, string) {
	p := s.Properties
	if p == nil {
		return limitUniform, "scale set"
	}
	if p.OrchestrationMode != nil && *p.OrchestrationMode == armcompute.OrchestrationModeFlexible {
		return limitUniform, "Flexible scale set"
	}
	if isSinglePlacementGroup(s) {
		return placementGroupLimit(s.Tags)
	}
	if vp := p.VirtualMachineProfile; vp != nil && vp.StorageProfile != nil && vp.StorageProfile.ImageReference != nil {
		if id := strings.ToLower(deref(vp.StorageProfile.ImageReference.ID)); strings.Contains(id, "/providers/microsoft.compute/images/") {
			return limitManagedImage, "managed custom image"
		}
	}
	return limitUniform, "Uniform scale set"
}

// isSinglePlacementGroup says a Uniform scale set is one placement group.
func isSinglePlacementGroup(s *armcompute.VirtualMachineScaleSet) bool {
	p := s.Properties
	return p != nil && !isFlexible(s) && p.SinglePlacementGroup != nil && *p.SinglePlacementGroup
}

// placementGroupLimit is a single placement group's cap: 100, or what
// tagPlacementGroupLimit says Azure raised it to (a value that is not a
// whole number from 100 to 300 is ignored, and the reason says so).
func placementGroupLimit(tags map[string]*string) (int, string) {
	for k, v := range tags {
		if !strings.EqualFold(k, tagPlacementGroupLimit) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(deref(v)))
		if err != nil || n < limitSinglePlacement || n > limitSinglePlacementMax {
			return limitSinglePlacement, fmt.Sprintf("single placement group (tag %s=%q ignored: want %d to %d)",
				tagPlacementGroupLimit, deref(v), limitSinglePlacement, limitSinglePlacementMax)
		}
		if n > limitSinglePlacement {
			return n, fmt.Sprintf("single placement group raised to %d (tag %s)", n, tagPlacementGroupLimit)
		}
	}
	return limitSinglePlacement, "single placement group"
}

// sizeLocked returns the capacity, or a size-unknown error when it was
// never read or the cache is stale.
func (g *scaleSet) sizeLocked() (int, error) {
	switch {
	case !g.known:
		return 0, cloudprovider.ErrSizeUnknown(g.ID(), errors.New("capacity never read from ARM"))
	case g.stale != "":
		return 0, cloudprovider.ErrSizeUnknown(g.ID(), errors.New("stale cache: "+g.stale))
	}
	return g.view.capacity, nil
}

// freshen reads a Spot scale set's capacity (and ETag) again before an
// action on it: Azure's evictions change it at any time, and an action on
// the cached size would act on a wrong number (cluster-autoscaler issue
// 7373). One GET, for Spot scale sets only; a cache that cannot be trusted
// is refused first, as for any scale set.
func (g *scaleSet) freshen(ctx context.Context) error {
	g.mu.Lock()
	_, err := g.sizeLocked()
	spot := g.spot
	g.mu.Unlock()
	if err != nil || !spot {
		return err
	}
	if _, err := g.reread(ctx); err != nil {
		return fmt.Errorf("reading the capacity of Spot scale set %s before acting on it: %w", g.ID(), err)
	}
	return nil
}

// TargetSize implements cloudprovider.NodeGroup.
func (g *scaleSet) TargetSize() (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sizeLocked()
}

// maxScaleUpWrites bounds the PATCHes of one scale-up: the first, and the
// same target again after an unclear answer or a 412.
const maxScaleUpWrites = 3

// IncreaseSize implements cloudprovider.NodeGroup: a PATCH of sku.capacity
// to the absolute target (the cached size the loop decided on plus delta,
// computed once; for a Spot scale set, the size read again first, see
// freshen), guarded by the scale set's ETag. The long-running
// operation is watched in the background; its failure shows up as failed
// instances.
//
// The write is idempotent, so it can be sent again safely. An answer that
// leaves its outcome unknown (a 5xx or no answer: ARM may have committed
// it, now or a moment later) is not retried by the SDK, and a 412 means the
// scale set changed since it was read: either way the scale set is read
// again and compared with the target, never with a fresh size plus delta.
// At or above the target, nothing more is written (the earlier write
// committed, or another writer raised it); below, the same target is
// written again with the fresh ETag. Each write is sent only if the write
// guards (cloudprovider.CheckWrite) pass just before it.
//
// At most one capacity write is in flight per scale set (unless
// Config.ConcurrentScaleUps): while this process's previous scale-up
// operation of the scale set runs, IncreaseSize sends nothing and fails
// with a throttled error that wraps cloudprovider.ErrNotSent; the core
// keeps the demand queued and sends one write of the absolute target
// after the operation ended. A later write would supersede the running
// operation anyway (ARM preempts it), and every capacity write is charged
// to the scale set's own Update bucket (a few a minute, throttle.go).
// The price is latency: demand that arrives while an operation runs
// waits for it to end (the operation lasts until its VMs are
// provisioned: minutes for GPU VMs). cluster-autoscaler tried refusing
// scale-ups while the scale set was Updating (its PR 3023) and took it
// back (PR 3037) because scaling got much slower; this provider's core
// queues the demand rather than losing it, and the knob stays.
func (g *scaleSet) IncreaseSize(ctx context.Context, delta int) error {
	if delta <= 0 {
		return fmt.Errorf("increase of scale set %s must be positive, got %d", g.ID(), delta)
	}
	if err := g.freshen(ctx); err != nil {
		return err
	}
	g.mu.Lock()
	size, err := g.sizeLocked()
	etag, maxSize := g.etag, g.maxLocked()
	var busy error
	if g.scaleUp != nil && !g.p.cfg.ConcurrentScaleUps {
		busy = g.scaleUpInProgressLocked()
	}
	g.mu.Unlock()
	if err != nil {
		return err
	}
	target := size + delta
	if target > maxSize {
		return fmt.Errorf("increase of scale set %s to %d exceeds its max %d", g.ID(), target, maxSize)
	}
	if busy != nil {
		// A guard that refuses says more (this process may not write at
		// all) than the operation in flight.
		if err := cloudprovider.CheckWrite(ctx); err != nil {
			return err
		}
		return busy
	}

	logger := klog.FromContext(ctx)
	var (
		poller  *runtime.Poller[armcompute.VirtualMachineScaleSetsClientUpdateResponse]
		base    = size // the capacity that the write that succeeds raises
		unclear bool   // an earlier write of the target may have committed
		prev    error  // the answer that made this write be sent again
	)
	for attempt := 1; ; attempt++ {
		poller, err = g.patchCapacity(ctx, target, etag)
		if cloudprovider.ClassOf(err) == cloudprovider.ClassFenced && prev != nil {
			return fmt.Errorf("scaling scale set %s to %d: not writing again after %v: %w", g.ID(), target, prev, err)
		}
		if !(isAmbiguous(err) || isPreconditionFailed(err)) || attempt == maxScaleUpWrites {
			break
		}
		unclear, prev = unclear || isAmbiguous(err), err
		fresh, ferr := g.reread(ctx)
		if ferr != nil {
			return fmt.Errorf("re-reading scale set %s after a failed write of capacity %d (%v): %w", g.ID(), target, err, ferr)
		}
		if fresh >= target {
			if unclear {
				logger.Info("Scale-up committed though its answer was lost; not writing again",
					"scaleSet", g.ID(), "target", target, "capacity", fresh, "err", err.Error())
				return nil
			}
			// Not this write's doing: another writer raised the capacity,
			// or a deletion sent since the size was read failed and its
			// machines count again (ARM restores the capacity). Whether the
			// demand is met is the core's to decide from the fresh size:
			// nothing was sent, and the demand is planned again next loop
			// (a deferred write, counted as no release).
			logger.Info("Scale set already at or above the scale-up target (another writer changed it, or a deletion failed); not writing, planned again",
				"scaleSet", g.ID(), "target", target, "capacity", fresh)
			return cloudprovider.NewError(cloudprovider.ClassThrottled, "CapacityChanged",
				fmt.Sprintf("scale set %s is at capacity %d, at or above the target %d computed from capacity %d: another writer raised it, or a deletion failed and its machines count again; nothing written, the demand is planned again from the fresh size",
					g.ID(), fresh, target, size), cloudprovider.ErrNotSent)
		}
		logger.V(2).Info("Writing the scale-up target again", "scaleSet", g.ID(), "target", target,
			"capacity", fresh, "attempt", attempt+1, "err", err.Error())
		base = fresh
		g.mu.Lock()
		etag = g.etag
		g.mu.Unlock()
	}
	if err != nil {
		if cloudprovider.ClassOf(err) == cloudprovider.ClassFenced {
			return err // refused before the first write
		}
		if n := sizeLimitOf(err); n > 0 {
			// ARM knows a limit the scale set's properties did not show:
			// the group's max follows it from now on.
			g.mu.Lock()
			g.learned = n
			g.mu.Unlock()
		}
		return fmt.Errorf("scaling scale set %s to %d: %w", g.ID(), target, classify(err))
	}
	g.mu.Lock()
	g.view.capacity = target
	g.opSeq++
	op, before := g.opSeq, g.baseLocked()
	g.scaleUp = &runningOp{op: op, target: target, sent: g.p.cfg.Clock.Now()}
	g.mu.Unlock()
	delta = target - base
	watch(g, poller, "scale-up", op, func(r opResult) { g.scaleUpEnded(op, delta, before, r) })
	return nil
}

// patchCapacity sends one PATCH of the capacity, if the write guards in ctx
// pass (cloudprovider.CheckWrite).
func (g *scaleSet) patchCapacity(ctx context.Context, target int, etag string) (*runtime.Poller[armcompute.VirtualMachineScaleSetsClientUpdateResponse], error) {
	if err := cloudprovider.CheckWrite(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	// Never retried by the SDK: IncreaseSize reads back an ambiguous outcome.
	ctx = policy.WithRetryOptions(ctx, policy.RetryOptions{MaxRetries: -1})
	var opts *armcompute.VirtualMachineScaleSetsClientBeginUpdateOptions
	if etag != "" {
		opts = &armcompute.VirtualMachineScaleSetsClientBeginUpdateOptions{IfMatch: to.Ptr(etag)}
	}
	poller, err := g.p.vmss.BeginUpdate(ctx, g.rg, g.name, armcompute.VirtualMachineScaleSetUpdate{
		SKU: &armcompute.SKU{Capacity: to.Ptr(int64(target))},
	}, opts)
	if err != nil {
		return nil, err
	}
	return poller, nil
}

// reread GETs the scale set (one call) and returns its capacity.
func (g *scaleSet) reread(ctx context.Context) (int, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	resp, err := g.p.vmss.Get(ctx, g.rg, g.name, nil)
	if err != nil {
		return 0, classify(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if resp.SKU == nil || resp.SKU.Capacity == nil {
		g.known = false
		return 0, cloudprovider.ErrSizeUnknown(g.ID(), errors.New("scale set has no sku.capacity"))
	}
	g.view.capacity = int(*resp.SKU.Capacity)
	g.etag = deref(resp.Etag)
	g.known, g.stale = true, ""
	return g.view.capacity, nil
}

// isAmbiguous says a write may or may not have been applied: ARM answered
// 5xx, or no answer came (but not a throttle: a 429 is never applied; nor
// a write the guards refused, which was never sent).
func isAmbiguous(err error) bool {
	var th *errThrottled
	var refused *cloudprovider.Error
	if err == nil || errors.Is(err, context.Canceled) || errors.As(err, &th) || errors.As(err, &refused) {
		return false
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return re.StatusCode >= 500
	}
	return true
}

func isPreconditionFailed(err error) bool {
	var re *azcore.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusPreconditionFailed
}

// DeleteNodes implements cloudprovider.NodeGroup: one batched
// DeleteInstances call for the scale set, with the instance IDs of a
// Uniform scale set's VMs or the names of a Flexible one's; the instances
// are marked deleting at once. A Flexible VM belongs to the group only if
// the group's last VM list has it (its provider ID does not name the
// scale set).
//
// Only machines the latest VM list shows are sent: ARM answers 400 for
// the whole batch when one ID is not an active instance. A Uniform VM
// the list no longer shows (its ID is at most the highest listed: IDs
// are never reused) is gone already and dropped; one newer than the list
// (it joined after it, or the lists are throttled for up to 30 minutes)
// is read by one GET of its own (readUnlisted), at most
// maxUnlistedReads per call: sent when ARM has it, dropped when it
// answers 404; past that bound, or when the GET fails, the call is
// refused unsent (the next list shows them). Machines listed deleting
// are not sent again.
//
// A VM deleted out of band after the latest list is still in it, and ARM
// refuses the batch: the scale set's VMs are then listed once more and
// what that list still shows alive is sent (deleteStillListed).
//
// Placeholders of failed scale-ups are dropped, and the capacity they
// hold is written down first by their number, to at least the VMs that
// exist (lowerForPlaceholders): the failed operation left sku.capacity at
// its target. The deletion's operation is watched: preempted or partly
// refused, what the next VM list still shows is sent again
// (operations.go).
func (g *scaleSet) DeleteNodes(ctx context.Context, providerIDs []string) error {
	if err := g.freshen(ctx); err != nil {
		return err
	}
	g.mu.Lock()
	size, err := g.sizeLocked()
	if err != nil {
		g.mu.Unlock()
		return err
	}
	byID := make(map[string]cloudprovider.Instance, len(g.instances))
	live := 0
	for _, in := range g.instances {
		byID[cloudprovider.ProviderIDKey(in.ProviderID)] = in
		if in.State != cloudprovider.InstanceDeleting && !isPlaceholder(in.ProviderID) {
			live++
		}
	}
	var ids []string
	running := 0
	dropFailed := map[string]bool{}
	var gone, unlisted []string
	for _, pid := range providerIDs {
		key := cloudprovider.ProviderIDKey(pid)
		in, known := byID[key]
		if !g.ownsLocked(key, known) {
			g.mu.Unlock()
			return fmt.Errorf("deleting from scale set %s: instance %s does not belong to it: %w", g.ID(), pid, cloudprovider.ErrNotSent)
		}
		if isPlaceholder(key) {
			dropFailed[key] = true
			continue
		}
		if !known {
			id, ok := numericInstanceID(key)
			switch {
			case ok && id <= g.maxInstanceID:
				gone = append(gone, pid)
			case !ok || len(unlisted) == maxUnlistedReads:
				g.mu.Unlock()
				return fmt.Errorf("deleting from scale set %s: instance %s is not in its last VM list yet: %w", g.ID(), pid, cloudprovider.ErrNotSent)
			default:
				unlisted = append(unlisted, pid)
			}
			continue
		}
		if in.State == cloudprovider.InstanceDeleting {
			continue
		}
		if in.Error == nil {
			running++
		}
		ids = append(ids, lastSegment(in.ProviderID)) // a Flexible VM's name as ARM spells it
	}
	g.mu.Unlock()
	var read []cloudprovider.Instance
	for _, pid := range unlisted {
		in, found, err := g.readUnlisted(ctx, pid)
		switch {
		case err != nil:
			return fmt.Errorf("deleting from scale set %s: instance %s is not in its last VM list yet and reading it failed: %w: %w", g.ID(), pid, err, cloudprovider.ErrNotSent)
		case !found:
			gone = append(gone, pid)
		case in.State == cloudprovider.InstanceDeleting:
		default:
			if in.Error == nil {
				running++
			}
			ids = append(ids, lastSegment(in.ProviderID))
			read = append(read, in)
		}
	}
	g.mu.Lock()
	if len(unlisted) > 0 {
		// The lock was let go for the GETs: a list or another deletion
		// may have changed the size meanwhile.
		if size, err = g.sizeLocked(); err != nil {
			g.mu.Unlock()
			return err
		}
	}
	// Cached until the next list, so the deletion marks it (and lowers
	// the capacity seen) as it marks the listed ones.
	for _, in := range read {
		if !slices.ContainsFunc(g.instances, func(c cloudprovider.Instance) bool {
			return cloudprovider.ProviderIDKey(c.ProviderID) == cloudprovider.ProviderIDKey(in.ProviderID)
		}) {
			g.instances = append(g.instances, in)
		}
	}
	if size-running < g.min {
		g.mu.Unlock()
		return fmt.Errorf("deleting %d running instances from scale set %s would go below its min %d (size %d): %w", running, g.ID(), g.min, size, cloudprovider.ErrNotSent)
	}
	etag := g.etag
	g.mu.Unlock()
	if len(gone) > 0 {
		klog.FromContext(ctx).V(2).Info("Not sending instances the scale set's last VM list no longer shows: they are gone",
			"scaleSet", g.ID(), "instances", gone)
	}
	if len(dropFailed) > 0 {
		if err := g.lowerForPlaceholders(ctx, len(dropFailed), size, live, etag); err != nil {
			return err
		}
		g.mu.Lock()
		if g.dropped == nil {
			g.dropped = map[string]bool{}
		}
		for k := range dropFailed {
			g.dropped[k] = true
		}
		g.dropInstancesLocked(dropFailed)
		g.mu.Unlock()
	}
	if len(ids) == 0 {
		return nil
	}
	sort.Strings(ids)
	poller, forced, err := g.sendDelete(ctx, ids)
	var vanished []string
	if isUnknownInstance(err) {
		ids, vanished, poller, forced, err = g.deleteStillListed(ctx, ids, err)
	}
	if len(vanished) > 0 {
		g.mu.Lock()
		g.markDeletingLocked(vanished) // gone: until a list drops them
		g.mu.Unlock()
	}
	if err != nil {
		if cloudprovider.NotSent(err) {
			return err
		}
		return fmt.Errorf("deleting %d instances of scale set %s: %w", len(ids), g.ID(), classify(err))
	}
	if poller == nil {
		return nil // nothing left to send
	}
	g.mu.Lock()
	marked := g.markDeletingLocked(ids)
	g.opSeq++
	op := g.opSeq
	g.mu.Unlock()
	d := &deletion{keys: marked, guards: context.WithoutCancel(ctx), forced: forced}
	watch(g, poller, "delete", op, func(r opResult) { g.deleteEnded(d, r) })
	return nil
}

// ownsLocked says whether the machine with the provider ID key (listed in
// the group's cache or not) is the group's: a placeholder or a Uniform VM
// by the scale set its ID names, a Flexible VM by the cache alone.
func (g *scaleSet) ownsLocked(key string, listed bool) bool {
	ref, ok := parseProviderID(key)
	named := ok && ref.scaleSet == strings.ToLower(g.name) && ref.resourceGroup == strings.ToLower(g.rg)
	switch {
	case isPlaceholder(key):
		return named
	case g.flexible:
		return listed
	}
	return named
}

func (g *scaleSet) dropInstancesLocked(drop map[string]bool) {
	kept := g.instances[:0]
	for _, in := range g.instances {
		if !drop[cloudprovider.ProviderIDKey(in.ProviderID)] {
			kept = append(kept, in)
		}
	}
	g.instances = kept
}

// DecreaseTargetSize implements cloudprovider.NodeGroup. It only lowers the
// capacity down to the number of existing VMs: lowering sku.capacity below
// that would let ARM pick running VMs to delete, which this never does.
func (g *scaleSet) DecreaseTargetSize(ctx context.Context, delta int) error {
	if delta >= 0 {
		return fmt.Errorf("decrease of scale set %s must be negative, got %d", g.ID(), delta)
	}
	if err := g.freshen(ctx); err != nil {
		return err
	}
	g.mu.Lock()
	size, err := g.sizeLocked()
	etag := g.etag
	live := 0
	for _, in := range g.instances {
		if in.State != cloudprovider.InstanceDeleting && !isPlaceholder(in.ProviderID) {
			live++
		}
	}
	g.mu.Unlock()
	if err != nil {
		return err
	}
	target := size + delta
	if target < live {
		return fmt.Errorf("decreasing scale set %s to %d would delete existing VMs (%d exist)", g.ID(), target, live)
	}
	poller, err := g.patchCapacity(ctx, target, etag)
	if err != nil {
		return fmt.Errorf("lowering scale set %s to %d: %w", g.ID(), target, classify(err))
	}
	g.mu.Lock()
	g.view.capacity = target
	g.opSeq++
	op := g.opSeq
	g.mu.Unlock()
	watch(g, poller, "decrease", op, nil)
	return nil
}

// Instances implements cloudprovider.NodeGroup from the cache.
func (g *scaleSet) Instances() ([]cloudprovider.Instance, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]cloudprovider.Instance, len(g.instances))
	copy(out, g.instances)
	return out, nil
}

// TemplateNode implements cloudprovider.NodeGroup from the SKU's
// capabilities and the scale set's tags. A SKU missing from the resource
// SKU list is an error: an unknown size means no scale-up, never a guess.
func (g *scaleSet) TemplateNode() (*apiv1.Node, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.skuKnown {
		return nil, fmt.Errorf("scale set %s: VM size %q not found in the resource SKU list of %s", g.ID(), g.view.skuName, g.view.location)
	}
	v := g.view
	return templateNode(&v, g.sku, g.p.cfg.GPUResourceName)
}

// Options implements cloudprovider.NodeGroup from the scale set's
// autoscaling-options tags.
func (g *scaleSet) Options(defaults cloudprovider.GroupOptions) cloudprovider.GroupOptions {
	g.mu.Lock()
	defer g.mu.Unlock()
	opts, errs := groupOptions(g.view.tags, defaults)
	problem := errors.Join(errs...)
	if msg := fmt.Sprint(problem); problem != nil && msg != g.optionsProblem {
		klog.ErrorS(problem, "Ignoring invalid autoscaling-options tags; those options keep the flags' values", "scaleSet", g.ID())
	}
	g.optionsProblem = ""
	if problem != nil {
		g.optionsProblem = problem.Error()
	}
	return opts
}

// ScaleUpInFlight says whether this process's previous capacity write of
// the scale set still runs, so that IncreaseSize now would send nothing
// (one capacity write in flight per scale set, see IncreaseSize); always
// false with Config.ConcurrentScaleUps. The core holds the group's demand
// meanwhile rather than spend tokens on a write that cannot go.
func (g *scaleSet) ScaleUpInFlight() bool {
	if g.p.cfg.ConcurrentScaleUps {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.scaleUp != nil
}
