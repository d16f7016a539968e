// Package vmss is the Azure Virtual Machine Scale Set cloud provider, on the
// Azure SDK for Go (armcompute, azidentity). Its ARM cost grows with the
// number of scale sets, never with the number of VMs: a refresh is one
// scale-set List per resource group and one VM List per managed scale set,
// providerID lookups are O(1) map reads, and a 429 holds back every call of
// its kind until Retry-After while the stale cache is kept and no scaling
// acts on it.
package vmss

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
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
	explicit  map[string]cloudprovider.NodeGroupSpec // lower-case name
	vmss      *armcompute.VirtualMachineScaleSetsClient
	vms       *armcompute.VirtualMachineScaleSetVMsClient
	skus      *armcompute.ResourceSKUsClient
	metrics   *armMetrics
	throttle  *throttle
	rnd       *rand.Rand

	// bg is the context of background LRO watchers; cancelled by Close.
	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu           sync.RWMutex
	groups       map[string]*scaleSet // lower-case name
	order        []string
	byProviderID map[string]*scaleSet // provider ID as listed, and lower-case
	skuCache     map[string]skuCacheEntry
	nextRefresh  time.Time
	lastRefresh  time.Time
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
	}
	for _, d := range cfg.AutoDiscovery {
		dd, _ := parseAutoDiscovery(d)
		p.discovery = append(p.discovery, dd)
	}
	for _, ng := range cfg.NodeGroups {
		p.explicit[strings.ToLower(ng.Name)] = ng
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
// lookup of the providerID, or, for a VM the cache has not listed yet, the
// scale set named in the providerID.
func (p *Provider) NodeGroupForNode(node *apiv1.Node) (cloudprovider.NodeGroup, error) {
	id := node.Spec.ProviderID
	if id == "" {
		return nil, nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	// Nodes carry the ID as ARM spells it: an exact match needs no
	// allocation; other spellings fall back to the lower-case key.
	if g, ok := p.byProviderID[id]; ok {
		return g, nil
	}
	key := strings.ToLower(id)
	if g, ok := p.byProviderID[key]; ok {
		return g, nil
	}
	ref, ok := parseProviderID(key)
	if !ok || !strings.EqualFold(ref.subscription, p.cfg.SubscriptionID) {
		return nil, nil
	}
	g, ok := p.groups[ref.scaleSet]
	if !ok || !strings.EqualFold(g.rg, ref.resourceGroup) {
		return nil, nil
	}
	return g, nil
}

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
	if len(parts) != 10 || parts[0] != "subscriptions" || parts[2] != "resourcegroups" || parts[4] != "providers" ||
		parts[5] != "microsoft.compute" || parts[6] != "virtualmachinescalesets" || parts[8] != "virtualmachines" {
		return vmRef{}, false
	}
	if parts[1] == "" || parts[3] == "" || parts[7] == "" || parts[9] == "" {
		return vmRef{}, false
	}
	return vmRef{subscription: parts[1], resourceGroup: parts[3], scaleSet: parts[7], instanceID: parts[9]}, true
}

// Refresh implements cloudprovider.CloudProvider: when the cache is older
// than its TTL, one List of scale sets per resource group and one List of
// VMs per managed scale set. While reads are throttled it makes no call
// and marks every group stale, so no size is acted on until a refresh
// succeeds.
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
	if u := p.throttle.blockedUntil(kindRead); !u.IsZero() {
		p.markAllStale("ARM reads throttled until " + u.UTC().Format(time.RFC3339))
		logger.Info("Skipping cloud refresh: ARM reads are throttled", "until", u)
		return nil
	}
	seen := map[string]bool{}
	var errs []error
	refreshed := 0
	for _, rg := range p.cfg.ResourceGroups {
		sets, err := p.listScaleSets(ctx, rg)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing scale sets in resource group %s: %w", rg, err))
			p.markStaleInGroup(rg, err.Error())
			continue
		}
		for _, s := range sets {
			name := strings.ToLower(*s.Name)
			minSize, maxSize, managed := p.managed(s)
			if !managed {
				continue
			}
			seen[name] = true
			g := p.ensureGroup(rg, *s.Name, minSize, maxSize)
			vms, err := p.listVMs(ctx, rg, *s.Name)
			if err != nil {
				errs = append(errs, fmt.Errorf("listing VMs of scale set %s: %w", *s.Name, err))
				g.markStale(err.Error())
				continue
			}
			skus, err := p.skusFor(ctx, deref(s.Location))
			if err != nil {
				logger.Error(err, "Listing resource SKUs; templates use the previous list", "location", deref(s.Location))
			}
			g.update(s, vms, skus, now)
			g.warnLimit(logger)
			refreshed++
		}
	}
	p.mu.Lock()
	var order []string
	for k := range p.groups {
		if seen[k] {
			order = append(order, k)
		} else if !p.groupStale(k) {
			delete(p.groups, k)
		}
	}
	for k := range p.groups {
		if !seen[k] {
			order = append(order, k)
		}
	}
	sort.Strings(order)
	p.order = order
	p.byProviderID = make(map[string]*scaleSet, len(p.byProviderID))
	for _, k := range order {
		g := p.groups[k]
		for _, in := range g.instances {
			p.byProviderID[in.ProviderID] = g
			p.byProviderID[strings.ToLower(in.ProviderID)] = g
		}
	}
	if len(errs) == 0 {
		p.lastRefresh = now
		jitter := time.Duration((p.rnd.Float64()*0.2 - 0.1) * float64(p.cfg.CacheTTL))
		p.nextRefresh = now.Add(p.cfg.CacheTTL + jitter)
	}
	p.mu.Unlock()
	for _, err := range errs {
		logger.Error(err, "Cloud refresh incomplete; affected node groups have an unknown size until the next refresh")
	}
	if refreshed == 0 && len(errs) > 0 && !cloudprovider.IsThrottled(classify(errs[0])) {
		return fmt.Errorf("no scale set could be read: %w", errors.Join(errs...))
	}
	return nil
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
// an explicit --nodes spec wins over tag discovery.
func (p *Provider) managed(s *armcompute.VirtualMachineScaleSet) (int, int, bool) {
	if s.Name == nil {
		return 0, 0, false
	}
	if spec, ok := p.explicit[strings.ToLower(*s.Name)]; ok {
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
				"scaleSet", *s.Name, "err", err)
			return 0, 0, false
		}
		return minSize, maxSize, true
	}
	return 0, 0, false
}

func (p *Provider) ensureGroup(rg, name string, minSize, maxSize int) *scaleSet {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := strings.ToLower(name)
	g, ok := p.groups[k]
	if !ok {
		g = &scaleSet{p: p, rg: rg, name: name, maxInstanceID: -1}
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

func (p *Provider) listVMs(ctx context.Context, rg, name string) ([]*armcompute.VirtualMachineScaleSetVM, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	var out []*armcompute.VirtualMachineScaleSetVM
	pager := p.vms.NewListPager(rg, name, &armcompute.VirtualMachineScaleSetVMsClientListOptions{Expand: to.Ptr("instanceView")})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		out = append(out, page.Value...)
	}
	return out, nil
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
