// Package vmss is the Azure Virtual Machine Scale Set cloud provider, on the
// Azure SDK for Go (armcompute, azidentity). Its ARM cost grows with the
// number of scale sets, never with the number of VMs: a refresh is one
// scale-set List per resource group and one VM List per managed scale set,
// providerID lookups are O(1) map reads, and a 429 holds back every call of
// its kind until Retry-After while the stale cache is kept and no scaling
// acts on it.
//
// Scale sets of both orchestration modes are node groups. A Uniform scale
// set's VMs are listed by the scale-set VM API; a Flexible one's by the
// Virtual Machines API filtered by the scale set (with their instance
// view: the same one call per refresh), and their provider IDs
// (.../providers/Microsoft.Compute/virtualMachines/<name>) do not name the
// scale set, so a node's group is the cache's answer alone.
//
// A Spot scale set's size is read again before any action on it, and the
// VMs Azure evicts are found by comparing its VM lists, refresh to
// refresh, and reported (cloudprovider.EvictionReporter, evictions.go).
package vmss

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// Provider is the VMSS cloud provider.
type Provider struct {
	cfg       Config
	discovery []discovery
	explicit  map[string]cloudprovider.NodeGroupSpec // --nodes by lower-case "name", or "rg/name" when it names the resource group
	vmss      *armcompute.VirtualMachineScaleSetsClient
	vms       *armcompute.VirtualMachineScaleSetVMsClient
	skus      *armcompute.ResourceSKUsClient
	metrics   *armMetrics
	throttle  *throttle
	rndMu     sync.Mutex
	rnd       *rand.Rand
	// vmLists is the budget of VM lists (vmlist.go).
	vmLists *vmListBudget
	// virtualMachines lists Flexible scale sets' VMs.
	virtualMachines *armcompute.VirtualMachinesClient

	// bg is the context of background LRO watchers; cancelled by Close.
	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu           sync.RWMutex
	groups       map[string]*scaleSet // by setKey(resource group, name)
	order        []string
	byProviderID map[string]*scaleSet // provider ID as listed, and its cloudprovider.ProviderIDKey
	skuCache     map[string]skuCacheEntry
	nextRefresh  time.Time
	lastRefresh  time.Time
	// namesIn holds the scale set names (lower-case) each resource group
	// (lower-case) had when it was last listed: a name in several is
	// ambiguous, even while one of them cannot be read.
	namesIn map[string]map[string]bool
	// refused holds, by lower-case name, why a --nodes spec without a
	// resource group is refused (its name is ambiguous), as last logged.
	refused map[string]string
	// refusedSets holds, by setKey, why a scale set is not managed
	// (settings this provider does not model), as last logged.
	refusedSets map[string]string
	// evictions are the Spot evictions refreshes noticed and the core has
	// not taken yet (Evictions).
	evictions []cloudprovider.Eviction
}

type skuCacheEntry struct {
	at   time.Time
	skus map[string]skuInfo // lower-case SKU name
}

// New builds the provider. It makes no ARM call; the first Refresh does.
func New(cfg Config) (*Provider, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tr, err := cfg.transport()
	if err != nil {
		return nil, err
	}
	cred, err := cfg.credential(tr)
	if err != nil {
		return nil, err
	}
	m := newARMMetrics(cfg.Registerer)
	th := newThrottle(cfg.Clock, m)
	opts := &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud:            cfg.cloudConfig(),
		Transport:        tr,
		Retry:            retryOptions(),
		PerRetryPolicies: []policy.Policy{&armPolicy{throttle: th, metrics: m, clock: cfg.Clock}},
		Telemetry:        policy.TelemetryOptions{ApplicationID: "vmss-autoscaler"},
	}}
	factory, err := armcompute.NewClientFactory(cfg.SubscriptionID, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("building armcompute clients: %w", err)
	}
	p := &Provider{
		cfg:          cfg,
		explicit:     map[string]cloudprovider.NodeGroupSpec{},
		vmss:         factory.NewVirtualMachineScaleSetsClient(),
		vms:          factory.NewVirtualMachineScaleSetVMsClient(),
		skus:         factory.NewResourceSKUsClient(),
		metrics:      m,
		throttle:     th,
		rnd:          rand.New(rand.NewPCG(uint64(cfg.Clock.Now().UnixNano()), 7)),
		groups:       map[string]*scaleSet{},
		byProviderID: map[string]*scaleSet{},
		skuCache:     map[string]skuCacheEntry{},
		namesIn:      map[string]map[string]bool{},
		refused:      map[string]string{},
		refusedSets:  map[string]string{},
		vmLists:      newVMListBudget(cfg.VMListBudget, cfg.Clock.Now()),

		virtualMachines: factory.NewVirtualMachinesClient(),
	}
	for _, d := range cfg.AutoDiscovery {
		dd, _ := parseAutoDiscovery(d)
		p.discovery = append(p.discovery, dd)
	}
	for _, ng := range cfg.NodeGroups {
		p.explicit[strings.ToLower(ng.Target())] = ng
	}
	p.bg, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// Close stops the background operation watchers.
func (p *Provider) Close() {
	p.cancel()
	p.wg.Wait()
}

// Name implements cloudprovider.CloudProvider.
func (p *Provider) Name() string { return "azure" }

// NodeGroups implements cloudprovider.CloudProvider.
func (p *Provider) NodeGroups() []cloudprovider.NodeGroup {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]cloudprovider.NodeGroup, 0, len(p.order))
	for _, k := range p.order {
		out = append(out, p.groups[k])
	}
	return out
}

// NodeGroupForNode implements cloudprovider.CloudProvider in O(1): a map
// lookup of the providerID, or, for a Uniform scale set's VM the cache has
// not listed yet, the scale set named in the providerID. A Flexible scale
// set's VM is found through the cache only: its providerID names no scale
// set, so until a refresh lists it its node has no group.
func (p *Provider) NodeGroupForNode(node *apiv1.Node) (cloudprovider.NodeGroup, error) {
	id := node.Spec.ProviderID
	if id == "" {
		return nil, nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	// Nodes carry the ID as ARM spells it: an exact match needs no
	// allocation; other spellings fall back to the normalised key.
	if g, ok := p.byProviderID[id]; ok {
		return g, nil
	}
	key := cloudprovider.ProviderIDKey(id)
	if g, ok := p.byProviderID[key]; ok {
		return g, nil
	}
	ref, ok := parseProviderID(key)
	if !ok || !strings.EqualFold(ref.subscription, p.cfg.SubscriptionID) {
		return nil, nil
	}
	g, ok := p.groups[setKey(ref.resourceGroup, ref.scaleSet)]
	if !ok || g.flexible {
		return nil, nil
	}
	return g, nil
}

// setKey is a scale set's key: its resource group and name, lower-case.
func setKey(rg, name string) string { return strings.ToLower(rg) + "/" + strings.ToLower(name) }

// vmRef is a parsed scale-set VM providerID.
type vmRef struct {
	subscription, resourceGroup, scaleSet, instanceID string
}

// parseProviderID parses
// azure:///subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<ss>/virtualMachines/<id>
// case-insensitively; the returned names are lower-case.
func parseProviderID(id string) (vmRef, bool) {
	rest, ok := strings.CutPrefix(strings.ToLower(id), "azure://")
	if !ok {
		return vmRef{}, false
	}
	parts := strings.Split(strings.Trim(rest, "/"), "/")
	// "" stands for a name, which must not be empty.
	pattern := [...]string{"subscriptions", "", "resourcegroups", "", "providers", "microsoft.compute", "virtualmachinescalesets", "", "virtualmachines", ""}
	if len(parts) != len(pattern) {
		return vmRef{}, false
	}
	for i, want := range pattern {
		if parts[i] == "" || (want != "" && parts[i] != want) {
			return vmRef{}, false
		}
	}
	return vmRef{subscription: parts[1], resourceGroup: parts[3], scaleSet: parts[7], instanceID: parts[9]}, true
}

// Refresh implements cloudprovider.CloudProvider: when the cache is older
// than its TTL, one List of scale sets per resource group (sizes, tags,
// SKUs) and the VM lists that are due (vmlist.go), in parallel. While
// ARM's own subscription reads are throttled it makes no call and marks
// every group stale, so no size is acted on until a refresh succeeds; a
// Compute policy's throttle holds back only what it covers, and a VM list
// that fails keeps the last instances.
func (p *Provider) Refresh(ctx context.Context) error {
	now := p.cfg.Clock.Now()
	p.mu.RLock()
	due := !now.Before(p.nextRefresh)
	last := p.lastRefresh
	p.mu.RUnlock()
	if !last.IsZero() {
		p.metrics.cacheAge.Set(now.Sub(last).Seconds())
	}
	if !due {
		return nil
	}
	logger := klog.FromContext(ctx)
	if u, why := p.throttle.blocked(kindRead, "", ""); !u.IsZero() {
		p.markAllStale(why + " throttled until " + u.UTC().Format(time.RFC3339))
		logger.Info("Skipping cloud refresh: ARM's subscription reads are throttled", "until", u)
		return nil
	}
	errs, sets := p.listAllScaleSets(ctx)
	p.refuseAmbiguous(logger)
	seen := map[string]bool{}
	var jobs []*vmListJob
	for _, l := range sets {
		s := l.set
		minSize, maxSize, managed := p.managed(l.rg, s)
		if managed {
			why := p.refusal(s)
			p.noteRefusal(logger, l.rg, *s.Name, why)
			managed = why == ""
		}
		if !managed {
			continue
		}
		seen[setKey(l.rg, *s.Name)] = true
		g := p.ensureGroup(l.rg, *s.Name, isFlexible(s), minSize, maxSize)
		skus, err := p.skusFor(ctx, deref(s.Location))
		if err != nil {
			logger.Error(err, "Listing resource SKUs; templates use the previous list", "location", deref(s.Location))
		}
		g.mu.Lock()
		g.updateSetLocked(s, skus)
		warn := g.view.overprovision && !g.warnedOverprovision
		g.warnedOverprovision = g.view.overprovision
		g.mu.Unlock()
		if warn {
			logger.Info("Warning: scale set overprovisions (properties.overprovision is true or unset): Azure makes extra VMs on each scale-out and deletes them; they are not counted as this group's machines. Set overprovision to false on GPU scale sets",
				"nodeGroup", g.ID())
		}
		g.warnLimit(logger)
		jobs = append(jobs, &vmListJob{g: g, set: s, rg: l.rg})
	}
	listed := p.pickVMLists(jobs, now)
	p.runVMLists(ctx, listed)
	var evicted []noticed
	oldest := time.Duration(0)
	for _, j := range listed {
		if ev := p.applyVMList(j, now); len(ev) > 0 {
			evicted = append(evicted, noticed{j.g, ev})
		}
		if j.err != nil {
			logger.Error(j.err, "Listing VMs failed; the group keeps its last instances and its size from the scale-set list",
				"nodeGroup", j.g.ID())
		}
	}
	for _, j := range jobs {
		if age, _ := j.g.InstancesAge(now); age > oldest {
			oldest = age
		}
	}
	p.metrics.vmListAge.Set(oldest.Seconds())
	p.commitRefresh(logger, seen, evicted, len(errs) == 0, now)
	for _, err := range errs {
		logger.Error(err, "Cloud refresh incomplete; affected node groups have an unknown size until the next refresh")
	}
	if len(jobs) == 0 && len(errs) > 0 && !cloudprovider.IsThrottled(classify(errs[0])) {
		return fmt.Errorf("no scale set could be read: %w", errors.Join(errs...))
	}
	return nil
}

// listedSet is a scale set as its resource group's list gave it.
type listedSet struct {
	rg  string
	set *armcompute.VirtualMachineScaleSet
}

// listAllScaleSets lists the scale sets of every resource group; a group
// that cannot be listed has its node groups marked stale.
func (p *Provider) listAllScaleSets(ctx context.Context) ([]error, []listedSet) {
	var errs []error
	var sets []listedSet
	for _, rg := range p.cfg.ResourceGroups {
		ss, err := p.listScaleSets(ctx, rg)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing scale sets in resource group %s: %w", rg, err))
			p.markStaleInGroup(rg, err.Error())
			continue
		}
		names := make(map[string]bool, len(ss))
		for _, s := range ss {
			names[strings.ToLower(*s.Name)] = true
			sets = append(sets, listedSet{rg, s})
		}
		p.mu.Lock()
		p.namesIn[strings.ToLower(rg)] = names
		p.mu.Unlock()
	}
	return errs, sets
}

// commitRefresh keeps the groups seen (and the stale ones), orders them,
// rebuilds the provider ID index and schedules the next refresh.
func (p *Provider) commitRefresh(logger klog.Logger, seen map[string]bool, evicted []noticed, complete bool, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var order []string
	for k := range p.groups {
		if seen[k] || p.groupStale(k) {
			order = append(order, k)
		} else {
			delete(p.groups, k)
		}
	}
	// By name, then resource group: with one resource group, the order
	// of names.
	slices.SortFunc(order, func(a, b string) int {
		ga, gb := p.groups[a], p.groups[b]
		return cmp.Or(strings.Compare(strings.ToLower(ga.name), strings.ToLower(gb.name)), strings.Compare(a, b))
	})
	p.order = order
	p.assignIDsLocked(logger)
	p.keepEvictionsLocked(logger, evicted)
	p.byProviderID = make(map[string]*scaleSet, len(p.byProviderID))
	for _, k := range order {
		g := p.groups[k]
		g.mu.Lock()
		for _, in := range g.instances {
			p.byProviderID[in.ProviderID] = g
			p.byProviderID[cloudprovider.ProviderIDKey(in.ProviderID)] = g
		}
		g.mu.Unlock()
	}
	if complete {
		p.lastRefresh = now
		jitter := time.Duration((p.jitter()*0.2 - 0.1) * float64(p.cfg.CacheTTL))
		p.nextRefresh = now.Add(p.cfg.CacheTTL + jitter)
	}
}

// resourceGroupsNaming returns the resource groups (as configured) whose
// last list had a scale set of the name: more than one makes the name
// ambiguous. Called with p.mu held.
func (p *Provider) resourceGroupsNaming(name string) []string {
	var out []string
	for _, rg := range p.cfg.ResourceGroups {
		if p.namesIn[strings.ToLower(rg)][strings.ToLower(name)] {
			out = append(out, rg)
		}
	}
	return out
}

// refuseAmbiguous logs, once per change, each --nodes spec that gives a
// scale set name alone while scale sets of that name are in several
// resource groups: it is refused (neither scale set is managed by it,
// nor by tags in its stead) until it names its resource group. The other
// node groups go on.
func (p *Provider) refuseAmbiguous(logger klog.Logger) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, spec := range p.explicit {
		if spec.ResourceGroup != "" {
			continue
		}
		why := ""
		if rgs := p.resourceGroupsNaming(spec.Name); len(rgs) > 1 {
			candidates := make([]string, len(rgs))
			for i, rg := range rgs {
				candidates[i] = rg + "/" + spec.Name
			}
			why = fmt.Sprintf("--nodes=%d:%d:%s: scale set name %s is ambiguous: it names %s; give each with its resource group, e.g. --nodes=%d:%d:%s",
				spec.Min, spec.Max, spec.Name, spec.Name, strings.Join(candidates, " and "), spec.Min, spec.Max, candidates[0])
		}
		if why == p.refused[key] {
			continue
		}
		if why != "" {
			logger.Error(errors.New(why), "Refusing a node group spec; no scale set of that name is managed until it names its resource group")
			p.refused[key] = why
		} else {
			logger.Info("Node group spec no longer ambiguous", "nodes", fmt.Sprintf("%d:%d:%s", spec.Min, spec.Max, spec.Name))
			delete(p.refused, key)
		}
	}
}

// assignIDsLocked gives each group its ID: its name, or "rg/name" while
// the name is ambiguous, logging each change. Called with p.mu held.
func (p *Provider) assignIDsLocked(logger klog.Logger) {
	for _, g := range p.groups {
		before := g.ID()
		if len(p.resourceGroupsNaming(g.name)) > 1 {
			id := g.rg + "/" + g.name
			g.id.Store(&id)
		} else {
			g.id.Store(nil)
		}
		if after := g.ID(); after != before {
			logger.Info("Node group ID changed: scale sets of its name are in several resource groups, or no longer",
				"from", before, "to", after)
		}
	}
}

// groupStale reports whether a group kept from a previous refresh is stale
// (it was not seen because its resource group could not be read). Called
// with p.mu held.
func (p *Provider) groupStale(k string) bool {
	g := p.groups[k]
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stale != ""
}

func (p *Provider) markAllStale(why string) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, g := range p.groups {
		g.markStale(why)
	}
}

func (p *Provider) markStaleInGroup(rg, why string) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, g := range p.groups {
		if strings.EqualFold(g.rg, rg) {
			g.markStale(why)
		}
	}
}

// managed says whether a scale set is a node group and with which bounds:
// an explicit --nodes spec wins over tag discovery; one that gives the
// name alone while the name is ambiguous is refused, and the scale sets
// of that name are not managed.
func (p *Provider) managed(rg string, s *armcompute.VirtualMachineScaleSet) (int, int, bool) {
	if s.Name == nil {
		return 0, 0, false
	}
	if spec, ok := p.explicit[setKey(rg, *s.Name)]; ok {
		return spec.Min, spec.Max, true
	}
	if spec, ok := p.explicit[strings.ToLower(*s.Name)]; ok {
		p.mu.RLock()
		_, refused := p.refused[strings.ToLower(*s.Name)]
		p.mu.RUnlock()
		if refused {
			return 0, 0, false
		}
		return spec.Min, spec.Max, true
	}
	tags := tagMap(s.Tags)
	for _, d := range p.discovery {
		if !d.matches(tags) {
			continue
		}
		minSize, maxSize, err := groupBounds(tags)
		if err != nil {
			klog.InfoS("Ignoring discovered scale set with missing or invalid min/max tags",
				"resourceGroup", rg, "scaleSet", *s.Name, "err", err)
			return 0, 0, false
		}
		return minSize, maxSize, true
	}
	return 0, 0, false
}

func (p *Provider) ensureGroup(rg, name string, flexible bool, minSize, maxSize int) *scaleSet {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := setKey(rg, name)
	g, ok := p.groups[k]
	if !ok || g.flexible != flexible {
		// A scale set's orchestration mode is fixed at its creation: one
		// of another mode is another scale set of the same name.
		g = &scaleSet{p: p, rg: rg, name: name, flexible: flexible, maxInstanceID: -1}
		p.groups[k] = g
	}
	g.mu.Lock()
	g.min, g.max = minSize, maxSize
	g.mu.Unlock()
	return g
}

func (p *Provider) listScaleSets(ctx context.Context, rg string) ([]*armcompute.VirtualMachineScaleSet, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	var out []*armcompute.VirtualMachineScaleSet
	pager := p.vmss.NewListPager(rg, nil)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		for _, s := range page.Value {
			if s != nil && s.Name != nil {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// isFlexible says the scale set is of Flexible orchestration (ARM leaves
// the mode out of a Uniform scale set's answer).
func isFlexible(s *armcompute.VirtualMachineScaleSet) bool {
	return s.Properties != nil && s.Properties.OrchestrationMode != nil &&
		*s.Properties.OrchestrationMode == armcompute.OrchestrationModeFlexible
}

// listVMs lists a scale set's VMs with their instance view, one List (one
// call per page) either way: a Uniform scale set's through the scale-set
// VM API, a Flexible one's through the Virtual Machines API filtered by
// the scale set, which is the only way ARM serves them ($expand is only
// accepted with that filter).
func (p *Provider) listVMs(ctx context.Context, rg string, s *armcompute.VirtualMachineScaleSet, flexible bool) ([]vmStatus, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	// A Flexible set's list names no scale set in its URL: the throttle
	// keys its policies by the set all the same.
	ctx = withResource(ctx, scaleSetID(p.cfg.SubscriptionID, rg, s))
	if flexible {
		pager := p.virtualMachines.NewListPager(rg, &armcompute.VirtualMachinesClientListOptions{
			Filter: to.Ptr("'virtualMachineScaleSet/id' eq '" + scaleSetID(p.cfg.SubscriptionID, rg, s) + "'"),
			Expand: to.Ptr(armcompute.ExpandTypeForListVMsInstanceView),
		})
		values := func(r armcompute.VirtualMachinesClientListResponse) []*armcompute.VirtualMachine { return r.Value }
		return readPages(ctx, pager, values, statusOfVirtualMachine)
	}
	pager := p.vms.NewListPager(rg, *s.Name, &armcompute.VirtualMachineScaleSetVMsClientListOptions{Expand: to.Ptr("instanceView")})
	values := func(r armcompute.VirtualMachineScaleSetVMsClientListResponse) []*armcompute.VirtualMachineScaleSetVM {
		return r.Value
	}
	return readPages(ctx, pager, values, statusOfScaleSetVM)
}

// readPages reads every page of a VM list and what read makes of each VM
// it accepts.
func readPages[P, V any](ctx context.Context, pager *runtime.Pager[P], values func(P) []V, read func(V) (vmStatus, bool)) ([]vmStatus, error) {
	var out []vmStatus
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		for _, v := range values(page) {
			if st, ok := read(v); ok {
				out = append(out, st)
			}
		}
	}
	return out, nil
}

// scaleSetID is the scale set's resource ID as ARM listed it, or as ARM
// forms it when the answer left it out.
func scaleSetID(subscription, rg string, s *armcompute.VirtualMachineScaleSet) string {
	if s.ID != nil && *s.ID != "" {
		return *s.ID
	}
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s", subscription, rg, *s.Name)
}

// skusFor returns a location's VM SKUs, listing them at most once per SKUCacheTTL.
func (p *Provider) skusFor(ctx context.Context, location string) (map[string]skuInfo, error) {
	loc := strings.ToLower(strings.ReplaceAll(location, " ", ""))
	now := p.cfg.Clock.Now()
	p.mu.RLock()
	e, ok := p.skuCache[loc]
	p.mu.RUnlock()
	if ok && now.Sub(e.at) < p.cfg.SKUCacheTTL {
		return e.skus, nil
	}
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	skus := map[string]skuInfo{}
	pager := p.skus.NewListPager(&armcompute.ResourceSKUsClientListOptions{Filter: to.Ptr("location eq '" + loc + "'")})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return e.skus, classify(err)
		}
		for _, s := range page.Value {
			if s == nil || s.ResourceType == nil || !strings.EqualFold(*s.ResourceType, "virtualMachines") {
				continue
			}
			if info, ok := skuInfoOf(s); ok {
				skus[strings.ToLower(info.name)] = info
			}
		}
	}
	p.mu.Lock()
	p.skuCache[loc] = skuCacheEntry{at: now, skus: skus}
	p.mu.Unlock()
	return skus, nil
}

func tagMap(tags map[string]*string) map[string]string {
	out := make(map[string]string, len(tags))
	for k, v := range tags {
		out[k] = deref(v)
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
