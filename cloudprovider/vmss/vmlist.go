package vmss

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// VM lists at cluster-autoscaler's cost.
//
// A scale set's size, tags and SKU come from the scale-set list (one call
// per resource group per --azure-cache-ttl); its VMs from a VM list of
// its own, the call Azure charges to the subscription's windowed
// HighCostGetVMScaleSet3Min/30Min policies (public examples allow 900 to
// 1,800 a subscription per 30 minutes, shared with every other client).
// cluster-autoscaler's Azure provider refreshes instances every 5 minutes
// (its vmssVmsCacheTTL) and keeps the cached instances when a list fails;
// so does this provider: each scale set is listed every VMListInterval
// (jittered ±10 %), early (every VMListActiveInterval) only while
// something is happening to it, and every list takes a token from a
// budget of VMListBudget lists per 30 minutes, so a fleet of many quiet
// scale sets lists each less often rather than more in all. A list that
// fails keeps the last instances (their age is in the status) while the
// size keeps coming from the scale-set list.

// vmListBudget is a token bucket of VM lists that allows at most its
// per-30-minute count in any 30-minute window, as the windowed
// HighCostGetVMScaleSet30Min counts them: what a window can take is the
// tokens at its start (at most the capacity) and its refill, so the
// refill is the count less the capacity. (A refill of the whole count
// let 330 lists into a window of a 300 budget: the full bucket and then
// 300 more.) Lists forced into debt (a scale set's first) are repaid
// before any other is let through.
type vmListBudget struct {
	mu       sync.Mutex
	tokens   float64
	capacity float64
	perSec   float64
	last     time.Time
}

func newVMListBudget(per30Min int, now time.Time) *vmListBudget {
	c := math.Max(1, float64(per30Min)/10)
	if per30Min <= 1 {
		c = 1
	}
	refill := math.Max(1, float64(per30Min)-c)
	return &vmListBudget{tokens: c, capacity: c, perSec: refill / (30 * 60), last: now}
}

// take takes a token if there is one; force takes it anyway (the first
// list of a scale set: without it the group has no instances at all) and
// leaves the budget in debt.
func (b *vmListBudget) take(now time.Time, force bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.After(b.last) {
		b.tokens = math.Min(b.capacity, b.tokens+b.perSec*now.Sub(b.last).Seconds())
		b.last = now
	}
	if b.tokens >= 1 || force {
		b.tokens--
		return true
	}
	return false
}

// listState is a scale set's VM-list bookkeeping, guarded by the group's mu.
type listState struct {
	// listedAt is when its VMs were last listed (zero: never); next when
	// the next regular list is due (jittered).
	listedAt, next time.Time
	// err is why the last list failed ("" when it did not): the instances
	// are listedAt's.
	err string
}

// activeLocked says something is happening to the scale set, so its VMs
// are listed early: a Spot set (Azure evicts at any time), machines
// coming or going or failed, operations this process watches, a capacity
// the listed VMs do not match.
func (g *scaleSet) activeLocked() bool {
	if g.spot || len(g.deleting) > 0 || len(g.failedOps) > 0 {
		return true
	}
	live := 0
	for _, in := range g.instances {
		if in.State != cloudprovider.InstanceRunning || in.Error != nil {
			return true
		}
		live++
	}
	return live != g.view.capacity
}

// listDueLocked says when the scale set's VMs are due to be listed.
func (g *scaleSet) listDueLocked(active time.Duration) time.Time {
	if g.list.listedAt.IsZero() {
		return time.Time{}
	}
	if g.activeLocked() && g.list.listedAt.Add(active).Before(g.list.next) {
		return g.list.listedAt.Add(active)
	}
	return g.list.next
}

// updateSetLocked applies the scale set's own record, from the
// scale-set list or a GET: capacity, tags, SKU, limit, ETag.
func (g *scaleSet) updateSetLocked(s *armcompute.VirtualMachineScaleSet, skus map[string]skuInfo) {
	v := scaleSetView{name: g.name, location: deref(s.Location), tags: tagMap(s.Tags)}
	for _, z := range s.Zones {
		v.zones = append(v.zones, deref(z))
	}
	if s.SKU != nil {
		v.skuName = deref(s.SKU.Name)
		if s.SKU.Capacity != nil {
			v.capacity = int(*s.SKU.Capacity)
		}
	}
	g.spot, g.evictionPolicy = spotOf(s)
	v.spot = g.spot
	v.overprovision = overprovisioned(s)
	g.view = v
	limit, why := platformLimit(s)
	if limit != g.limit || why != g.limitWhy {
		// What ARM named was about the scale set as it was (a tag
		// raising a placement group's cap, a conversion to several
		// placement groups): it says nothing about it now.
		g.learned = 0
	}
	g.limit, g.limitWhy = limit, why
	g.known = s.SKU != nil && s.SKU.Capacity != nil
	g.stale = ""
	g.etag = deref(s.Etag)
	if info, ok := skus[strings.ToLower(v.skuName)]; ok {
		g.sku, g.skuKnown = info, true
	} else if skus != nil {
		g.skuKnown = false
	}
}

// updateVMsLocked applies a VM list and returns the evictions it noticed
// (a Spot scale set's; their Group is left for the caller).
func (g *scaleSet) updateVMsLocked(vms []vmStatus, now time.Time) []cloudprovider.Eviction {
	listed := map[string]bool{}
	g.instances = g.instances[:0]
	ev := g.newEvictionWatch()
	for _, vm := range vms {
		in := instanceOf(vm)
		if g.spot && g.evictionPolicy == armcompute.VirtualMachineEvictionPolicyTypesDeallocate {
			deallocatedSpot(&in, vm)
		}
		key := cloudprovider.ProviderIDKey(in.ProviderID)
		listed[key] = true
		if id, ok := numericInstanceID(in.ProviderID); ok && !g.flexible && id > g.maxInstanceID {
			g.maxInstanceID = id
		}
		if g.deleting[key] {
			in.State = cloudprovider.InstanceDeleting
			in.Error, in.FailedRunning = nil, nil
		}
		ev.listed(key, in, vm)
		g.instances = append(g.instances, in)
	}
	evictions := ev.done(listed)
	for k := range g.deleting {
		if !listed[k] {
			delete(g.deleting, k)
		}
	}
	for k, r := range g.repairs {
		if !listed[k] && r.status.Done {
			delete(g.repairs, k) // the machine is gone
		}
	}
	g.dropOverprovisionedLocked()
	g.instances = append(g.instances, g.placeholdersLocked()...)
	g.list.listedAt, g.list.err = now, ""
	return evictions
}

// overprovisioned says the scale set overprovisions: Azure's default for
// Uniform scale sets when the property is left out ("Design
// considerations for scale sets": overprovisioning creates extra VMs and
// deletes them once the asked-for ones succeed). A Flexible set does not.
func overprovisioned(s *armcompute.VirtualMachineScaleSet) bool {
	if s.Properties == nil || isFlexible(s) {
		return false
	}
	return s.Properties.Overprovision == nil || *s.Properties.Overprovision
}

// dropOverprovisionedLocked leaves out of the instances the extra VMs an
// overprovisioning scale set makes: Azure deletes them once the asked-for
// ones run, they never become this cluster's nodes, and the core would
// count them as machines that never registered. They are the
// highest-numbered VMs still coming beyond the capacity.
func (g *scaleSet) dropOverprovisionedLocked() {
	if !g.view.overprovision || g.flexible {
		return
	}
	live := 0
	for _, in := range g.instances {
		if in.State != cloudprovider.InstanceDeleting {
			live++
		}
	}
	extra := live - g.view.capacity
	if extra <= 0 {
		return
	}
	type cand struct{ i, id int }
	var coming []cand
	for i, in := range g.instances {
		if id, ok := numericInstanceID(in.ProviderID); ok && in.State == cloudprovider.InstanceCreating {
			coming = append(coming, cand{i, id})
		}
	}
	slices.SortFunc(coming, func(a, b cand) int { return b.id - a.id })
	drop := map[int]bool{}
	for _, c := range coming[:min(extra, len(coming))] {
		drop[c.i] = true
	}
	kept := g.instances[:0]
	for i, in := range g.instances {
		if !drop[i] {
			kept = append(kept, in)
		}
	}
	g.instances = kept
}

// vmListJob is one scale set's VM list in a refresh.
type vmListJob struct {
	g   *scaleSet
	set *armcompute.VirtualMachineScaleSet
	rg  string
	vms []vmStatus
	err error
}

// pickVMLists returns the groups whose VMs are listed in this refresh:
// never listed first (always, in debt of the budget), then those due,
// most overdue first, while the budget lasts.
func (p *Provider) pickVMLists(jobs []*vmListJob, now time.Time) []*vmListJob {
	type due struct {
		j  *vmListJob
		at time.Time
	}
	var ds []due
	for _, j := range jobs {
		j.g.mu.Lock()
		at := j.g.listDueLocked(p.cfg.VMListActiveInterval)
		j.g.mu.Unlock()
		if !now.Before(at) {
			ds = append(ds, due{j, at})
		}
	}
	slices.SortStableFunc(ds, func(a, b due) int { return a.at.Compare(b.at) })
	var out []*vmListJob
	for _, d := range ds {
		if !p.vmLists.take(now, d.at.IsZero()) {
			break
		}
		out = append(out, d.j)
	}
	return out
}

// runVMLists lists the jobs' VMs, at most VMListParallelism at a time.
func (p *Provider) runVMLists(ctx context.Context, jobs []*vmListJob) {
	sem := make(chan struct{}, max(1, p.cfg.VMListParallelism))
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			j.vms, j.err = p.listVMs(ctx, j.rg, j.set, j.g.flexible)
		}()
	}
	wg.Wait()
}

// applyVMList applies a job's list, or keeps the last instances when it
// failed; the next regular list is due VMListInterval later either way
// (±10 %), so a throttled list does not come back at once.
func (p *Provider) applyVMList(j *vmListJob, now time.Time) []cloudprovider.Eviction {
	g := j.g
	g.mu.Lock()
	defer g.mu.Unlock()
	jitter := time.Duration((p.jitter() - 0.5) * 0.2 * float64(p.cfg.VMListInterval))
	g.list.next = now.Add(p.cfg.VMListInterval + jitter)
	if j.err != nil {
		g.list.err = j.err.Error()
		if g.list.listedAt.IsZero() {
			// Never listed: retry at the next refresh rather than wait.
			g.list.next = time.Time{}
		}
		return nil
	}
	return g.updateVMsLocked(j.vms, now)
}

func (p *Provider) jitter() float64 {
	p.rndMu.Lock()
	defer p.rndMu.Unlock()
	return p.rnd.Float64()
}

// InstancesAge implements cloudprovider.InstancesAged: how old its
// instances are and why the last list failed ("" when it did not).
func (g *scaleSet) InstancesAge(now time.Time) (time.Duration, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.list.listedAt.IsZero() {
		return 0, g.list.err
	}
	return now.Sub(g.list.listedAt), g.list.err
}

// refusal says why a discovered or configured scale set is not managed
// ("" when it is): settings whose behaviour this provider does not
// model.
func (p *Provider) refusal(s *armcompute.VirtualMachineScaleSet) string {
	props := s.Properties
	if props != nil && props.SpotRestorePolicy != nil && props.SpotRestorePolicy.Enabled != nil && *props.SpotRestorePolicy.Enabled {
		// Azure restores evicted Spot VMs itself ("Spot Priority Mix" and
		// "Try & restore" in the scale-set docs): capacity changes the
		// autoscaler did not ask for.
		return "Spot try-and-restore is enabled (properties.spotRestorePolicy.enabled): Azure re-creates evicted VMs itself, which this autoscaler does not model"
	}
	if props != nil && props.PriorityMixPolicy != nil {
		return "a Spot priority mix is set (properties.priorityMixPolicy): Azure chooses regular or Spot per VM, which this autoscaler does not model"
	}
	if !p.cfg.AllowAKSManaged && aksManaged(s) {
		// AKS owns its node pools' scale sets: writing them directly is
		// unsupported, and with node resource group lockdown ARM answers
		// 403 (AKS docs, "Node resource group lockdown").
		return "an AKS-managed node pool's scale set (aks-managed-* tags): AKS does not support writing it; scale the node pool through AKS, or pass --azure-allow-aks-managed-scale-sets if you know what you do"
	}
	return ""
}

// aksManaged says the scale set is an AKS node pool's: AKS tags the scale
// sets it creates aks-managed-poolName, aks-managed-createOperationID and
// the like (cloud-provider-azure reads aks-managed-poolName for the same
// purpose). The resource group's name is no sign: MC_* is only AKS's
// default node resource group (az aks create --node-resource-group names
// any other), and self-managed clusters may use any name.
func aksManaged(s *armcompute.VirtualMachineScaleSet) bool {
	for k := range s.Tags {
		if strings.HasPrefix(strings.ToLower(k), "aks-managed-") {
			return true
		}
	}
	return false
}

// noteRefusal logs, once per change, why a scale set is not managed.
func (p *Provider) noteRefusal(logger klog.Logger, rg, name, why string) {
	k := setKey(rg, name)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refusedSets[k] == why {
		return
	}
	if why == "" {
		delete(p.refusedSets, k)
		logger.Info("Scale set no longer refused", "resourceGroup", rg, "scaleSet", name)
		return
	}
	p.refusedSets[k] = why
	logger.Error(fmt.Errorf("scale set %s/%s: %s", rg, name, why), "Refusing a scale set as a node group")
}

// maxUnlistedReads bounds the GETs one DeleteNodes call makes for VMs
// newer than the scale set's last list (each charged to its own VM's
// GetVMScaleSetVM bucket and to the subscription's 6,000): past it the
// call is refused unsent until a list shows them.
const maxUnlistedReads = 100

// readUnlisted reads one Uniform VM the scale set's last list does not
// show, by the scale-set VM API's GET (charged to the GetVMScaleSetVM
// policies, not to the 30-minute VM-list budget: Microsoft's
// compute-throttling-limits), so that a node that joined after the last
// list can be deleted while lists are throttled. found is false when ARM
// answers 404 (the VM is gone); a VM answered with an empty ID is being
// deleted (statusOfScaleSetVM).
func (g *scaleSet) readUnlisted(ctx context.Context, providerID string) (cloudprovider.Instance, bool, error) {
	ctx, cancel := withTimeout(withResource(ctx, g.resourceID()))
	defer cancel()
	resp, err := g.p.vms.Get(ctx, g.rg, g.name, lastSegment(providerID), &armcompute.VirtualMachineScaleSetVMsClientGetOptions{
		Expand: to.Ptr(armcompute.InstanceViewTypesInstanceView)})
	if err != nil {
		var re *azcore.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
			return cloudprovider.Instance{}, false, nil
		}
		return cloudprovider.Instance{}, false, classify(err)
	}
	st, ok := statusOfScaleSetVM(&resp.VirtualMachineScaleSetVM)
	if !ok {
		return cloudprovider.Instance{ProviderID: providerID, State: cloudprovider.InstanceDeleting}, true, nil
	}
	return instanceOf(st), true, nil
}
