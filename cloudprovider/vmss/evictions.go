package vmss

import (
	"slices"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// Evictions implements cloudprovider.EvictionReporter: the Spot VMs the
// refreshes since the last call found taken back by Azure. The core takes
// them after every refresh; should nothing take them, the oldest beyond
// maxPendingEvictions are dropped (and logged).
func (p *Provider) Evictions() []cloudprovider.Eviction {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.evictions
	p.evictions = nil
	return out
}

// maxPendingEvictions bounds the evictions kept for the core between two
// of its calls: far above what a refresh of the largest cluster finds
// (every Spot VM of 7,500 nodes evicted at once).
const maxPendingEvictions = 20_000

// noticed are the evictions a refresh found in one scale set.
type noticed struct {
	g         *scaleSet
	evictions []cloudprovider.Eviction
}

// keepEvictions stores what a refresh noticed, naming each group by its
// ID as of that refresh, and logs one line per group. Called with p.mu
// held, after the refresh assigned the groups' IDs.
func (p *Provider) keepEvictionsLocked(logger klog.Logger, found []noticed) {
	for _, n := range found {
		id := n.g.ID()
		ids := make([]string, len(n.evictions))
		for i := range n.evictions {
			n.evictions[i].Group = id
			ids[i] = n.evictions[i].ProviderID
		}
		p.evictions = append(p.evictions, n.evictions...)
		n.g.mu.Lock()
		policy := n.g.evictionPolicy
		n.g.mu.Unlock()
		logger.Info("Spot VMs evicted by Azure", "nodeGroup", id, "count", len(n.evictions), "evictionPolicy", policy)
		logger.V(2).Info("Spot VMs evicted by Azure: provider IDs", "nodeGroup", id, "providerIDs", ids)
	}
	if over := len(p.evictions) - maxPendingEvictions; over > 0 {
		logger.Error(nil, "Evictions not taken by the core; dropping the oldest", "dropped", over, "kept", maxPendingEvictions)
		p.evictions = append([]cloudprovider.Eviction(nil), p.evictions[over:]...)
	}
}

// evictionWatch compares one VM list of a Spot scale set with the one
// before it, in O(1) per VM: a VM the last list showed that Azure may yet
// evict is evicted when this list shows it
//   - under eviction policy Delete: gone, or deleting, without a deletion
//     of ours (the scale set's capacity dropped by itself);
//   - under Deallocate: deallocated (a ClassEvicted instance).
//
// A VM this process asked ARM to delete never counts. Nothing is found at
// a scale set's first list (there is nothing to compare with: an eviction
// before it is not this process's to count) nor in a regular scale set.
//
// A VM Azure may yet evict is one that runs or is being created, without a
// failure that stops it (one failed while it runs, Instance.FailedRunning,
// still runs); under Deallocate, also one deallocating, not yet
// deallocated.
type evictionWatch struct {
	g          *scaleSet
	before     map[string]string // the last list's evictable VMs: key → provider ID
	deallocate bool
	found      []cloudprovider.Eviction
}

// newEvictionWatch starts comparing a new VM list. Called with g.mu held,
// after update read the scale set's priority and eviction policy.
func (g *scaleSet) newEvictionWatch() *evictionWatch {
	w := &evictionWatch{g: g, before: g.evictable, deallocate: g.evictionPolicy == armcompute.VirtualMachineEvictionPolicyTypesDeallocate}
	if g.spot {
		g.evictable = make(map[string]string, len(g.evictable))
	} else {
		g.evictable = nil
	}
	return w
}

// listed looks at one VM of the new list: key is its provider ID key, in
// the instance update made of it, vm what ARM said.
func (w *evictionWatch) listed(key string, in cloudprovider.Instance, vm vmStatus) {
	g := w.g
	if !g.spot || g.deleting[key] {
		return
	}
	deleting := in.State == cloudprovider.InstanceDeleting
	switch {
	case in.Error == nil && !deleting,
		w.deallocate && deleting && powerState(vm) == "deallocating":
		g.evictable[key] = in.ProviderID
		return
	}
	evicted := deleting && !w.deallocate
	if w.deallocate {
		evicted = in.Error != nil && in.Error.Class == cloudprovider.ClassEvicted
	}
	if _, was := w.before[key]; was && evicted {
		w.found = append(w.found, cloudprovider.Eviction{ProviderID: in.ProviderID, Deallocated: w.deallocate})
	}
}

// done ends the comparison: under eviction policy Delete, the VMs of the
// last list that this one does not have (listed, by provider ID key) and
// that this process did not delete were evicted too. It returns every
// eviction found, in list order, then the vanished ones by provider ID.
func (w *evictionWatch) done(listed map[string]bool) []cloudprovider.Eviction {
	if !w.g.spot || w.before == nil {
		return nil
	}
	if !w.deallocate {
		var gone []cloudprovider.Eviction
		for key, pid := range w.before {
			if !listed[key] && !w.g.deleting[key] {
				gone = append(gone, cloudprovider.Eviction{ProviderID: pid})
			}
		}
		slices.SortFunc(gone, func(a, b cloudprovider.Eviction) int { return strings.Compare(a.ProviderID, b.ProviderID) })
		w.found = append(w.found, gone...)
	}
	return w.found
}
