package vmss

import (
	"fmt"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// BenchmarkRefreshAndLookups: one cache refresh of 20 Uniform scale sets
// x 375 VMs over HTTPS to the simulator, then a providerID lookup for
// each of the 7,500 nodes. ARM calls per refresh are reported.
func BenchmarkRefreshAndLookups(b *testing.B) { benchRefreshAndLookups(b, false) }

// BenchmarkRefreshAndLookupsFlexible: the same fleet of Flexible scale
// sets, listed through the Virtual Machines API filtered by scale set;
// the nodes carry provider IDs as cloud-provider-azure writes them, found
// through the cache alone.
func BenchmarkRefreshAndLookupsFlexible(b *testing.B) { benchRefreshAndLookups(b, true) }

func benchRefreshAndLookups(b *testing.B, flexible bool) {
	f, nodes := benchFleet(b, flexible)
	if len(nodes) != 7500 {
		b.Fatalf("%d nodes", len(nodes))
	}
	b.ReportAllocs()
	b.ResetTimer()
	calls := 0
	for i := 0; i < b.N; i++ {
		f.sim.ResetCalls()
		f.expire()
		f.refresh()
		for _, c := range f.sim.Calls() {
			calls += c
		}
		for _, n := range nodes {
			if g, _ := f.p.NodeGroupForNode(n); g == nil {
				b.Fatal("lookup failed")
			}
		}
	}
	b.ReportMetric(float64(calls)/float64(b.N), "arm-calls/refresh")
}

// BenchmarkLookups: 7,500 providerID lookups alone.
func BenchmarkLookups(b *testing.B) {
	f, nodes := benchFleet(b, false)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, n := range nodes {
			if g, _ := f.p.NodeGroupForNode(n); g == nil {
				b.Fatal("lookup failed")
			}
		}
	}
}

// benchFleet is 20 discovered scale sets of 375 VMs, refreshed once, and
// a node object per VM. A Flexible fleet's nodes carry the provider ID
// cloud-provider-azure writes (the resource group lower-cased; the same
// here, where it is "rg").
func benchFleet(b *testing.B, flexible bool) (*fixture, []*apiv1.Node) {
	b.Helper()
	klog.SetLogger(klog.Background().V(10))
	var sets []armsim.ScaleSetSpec
	for i := 0; i < 20; i++ {
		s := gpuSet(fmt.Sprintf("gpu-%02d", i), 375, discoveredTags(0, 500))
		s.Flexible = flexible
		sets = append(sets, s)
	}
	f := newFixture(b, sets, withDiscovery(discoverySpec))
	f.refresh()
	var nodes []*apiv1.Node
	for _, g := range f.p.NodeGroups() {
		ins, _ := g.Instances()
		for _, in := range ins {
			nodes = append(nodes, &apiv1.Node{Spec: apiv1.NodeSpec{ProviderID: armsim.AzureProviderID(in.ProviderID)}})
		}
	}
	return f, nodes
}
