package vmss

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// withResourceGroups sets --azure-resource-groups.
func withResourceGroups(rgs ...string) fixtureOption {
	return func(_ *armsim.Options, c *Config) { c.ResourceGroups = rgs }
}

// inRG moves a scale set spec to a resource group.
func inRG(rg string, s armsim.ScaleSetSpec) armsim.ScaleSetSpec {
	s.ResourceGroup = rg
	return s
}

// withLog sends the fixture's context logger to a buffer.
func withLog(f *fixture) *bytes.Buffer {
	var buf bytes.Buffer
	f.ctx = klog.NewContext(f.ctx, textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf))))
	return &buf
}

// groupBounds maps each node group's ID to its min and max.
func groupIDs(f *fixture) string {
	var out []string
	for _, g := range f.p.NodeGroups() {
		out = append(out, fmt.Sprintf("%s[%d,%d]", g.ID(), g.MinSize(), g.MaxSize()))
	}
	return strings.Join(out, " ")
}

// TestSameNameInTwoResourceGroups: two scale sets named gpu, in two
// resource groups (one Uniform, one Flexible), are two node groups with
// IDs rg/name, each scaled, looked up and deleted from on its own; a
// name that is not ambiguous keeps its bare ID.
func TestSameNameInTwoResourceGroups(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{
		inRG("rg-a", gpuSet("gpu", 2, discoveredTags(0, 10))),
		inRG("rg-b", flexSet("gpu", 1, discoveredTags(0, 20))),
		inRG("rg-a", cpuSet("cpu", 1, discoveredTags(0, 5))),
	}, withResourceGroups("rg-a", "rg-b"), withDiscovery(discoverySpec))
	f.refresh()
	if got, want := groupIDs(f), "cpu[0,5] rg-a/gpu[0,10] rg-b/gpu[0,20]"; got != want {
		t.Fatalf("node groups %s, want %s", got, want)
	}
	a, b := f.group("rg-a/gpu"), f.group("rg-b/gpu")
	if err := a.IncreaseSize(f.ctx, 3); err != nil {
		t.Fatal(err)
	}
	stA, _ := f.sim.ScaleSet("rg-a", "gpu")
	stB, _ := f.sim.ScaleSet("rg-b", "gpu")
	if stA.Capacity != 5 || stB.Capacity != 1 {
		t.Fatalf("capacities rg-a/gpu %d, rg-b/gpu %d; want 5 and 1 (only rg-a's scaled)", stA.Capacity, stB.Capacity)
	}
	for g, st := range map[cloudprovider.NodeGroup]armsim.ScaleSetState{a: stA, b: stB} {
		for _, vm := range st.VMs {
			got, err := f.p.NodeGroupForNode(node(armsim.AzureProviderID(vm.ProviderID)))
			if err != nil || got == nil || got.ID() != g.ID() {
				t.Fatalf("NodeGroupForNode(%s) = %v, %v; want %s", vm.ProviderID, got, err, g.ID())
			}
		}
	}
	if err := a.DeleteNodes(f.ctx, []string{stB.VMs[0].ProviderID}); !errors.Is(err, cloudprovider.ErrNotSent) {
		t.Fatalf("deleting rg-b's VM from rg-a/gpu: %v, want refused", err)
	}
	if _, err := a.TargetSize(); err != nil {
		t.Fatal(err)
	}
	// Its size errors name it as it is known.
	b.(*scaleSet).markStale("test")
	if _, err := b.TargetSize(); err == nil || !strings.Contains(err.Error(), "node group rg-b/gpu") {
		t.Fatalf("TargetSize of a stale rg-b/gpu: %v, want an error naming rg-b/gpu", err)
	}
}

// TestNodesSpecsAndAmbiguousNames: --nodes takes rg/name; a name alone
// that names scale sets in several resource groups is refused, naming
// both, without holding back the other groups; tags do not manage the
// scale sets it was meant for.
func TestNodesSpecsAndAmbiguousNames(t *testing.T) {
	both := []armsim.ScaleSetSpec{
		inRG("rg-a", gpuSet("gpu", 1, discoveredTags(0, 9))),
		inRG("rg-b", gpuSet("gpu", 1, discoveredTags(0, 9))),
		inRG("rg-b", cpuSet("cpu", 1, nil)),
	}
	tests := []struct {
		name     string
		sets     []armsim.ScaleSetSpec
		nodes    []string
		discover bool
		want     string
		wantLog  string
	}{
		{"each with its resource group", both, []string{"0:5:rg-a/gpu", "0:7:RG-B/gpu", "1:3:cpu"}, false,
			"cpu[1,3] rg-a/gpu[0,5] rg-b/gpu[0,7]", ""},
		{"one with its resource group, the other by tags", both, []string{"0:5:rg-a/gpu"}, true,
			"rg-a/gpu[0,5] rg-b/gpu[0,9]", ""},
		{"a name alone, ambiguous: refused, tags or not", both, []string{"0:5:gpu", "1:3:cpu"}, true,
			"cpu[1,3]", "--nodes=0:5:gpu: scale set name gpu is ambiguous: it names rg-a/gpu and rg-b/gpu; give each with its resource group"},
		{"a name alone, in one resource group", both[:1], []string{"0:5:gpu"}, false,
			"gpu[0,5]", ""},
		{"a resource group and name, alone in its resource groups: the bare ID", both[:1], []string{"0:5:rg-a/gpu"}, false,
			"gpu[0,5]", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := []fixtureOption{withResourceGroups("rg-a", "rg-b"), withNodes(tc.nodes...)}
			if tc.discover {
				opts = append(opts, withDiscovery(discoverySpec))
			}
			f := newFixture(t, tc.sets, opts...)
			log := withLog(f)
			f.refresh()
			if got := groupIDs(f); got != tc.want {
				t.Fatalf("node groups %s, want %s", got, tc.want)
			}
			f.expire()
			f.refresh()
			if tc.wantLog == "" {
				if strings.Contains(log.String(), "Refusing") {
					t.Fatalf("refused a spec: %s", log.String())
				}
				return
			}
			if n := strings.Count(log.String(), tc.wantLog); n != 1 {
				t.Fatalf("logged %d times %q, want once (two refreshes):\n%s", n, tc.wantLog, log.String())
			}
		})
	}
}

// TestGroupIDFollowsAmbiguity: a scale set of the same name appearing in
// another resource group makes the ID rg/name (logged), and its going
// back to the bare name.
func TestGroupIDFollowsAmbiguity(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{inRG("rg-a", gpuSet("gpu", 1, nil))},
		withResourceGroups("rg-a", "rg-b"), withNodes("0:5:rg-a/gpu"))
	log := withLog(f)
	f.refresh()
	g := f.group("gpu")
	// Another gpu, not a node group, appears in rg-b (rg-b needs a scale
	// set to exist at all in the simulator).
	if err := f.sim.AddScaleSet(inRG("rg-b", cpuSet("gpu", 0, nil))); err != nil {
		t.Fatal(err)
	}
	f.expire()
	f.refresh()
	if g.ID() != "rg-a/gpu" || groupIDs(f) != "rg-a/gpu[0,5]" {
		t.Fatalf("ID %s, groups %s; want rg-a/gpu once gpu is in two resource groups", g.ID(), groupIDs(f))
	}
	if !strings.Contains(log.String(), `"Node group ID changed`) || !strings.Contains(log.String(), `from="gpu" to="rg-a/gpu"`) {
		t.Fatalf("ID change not logged:\n%s", log.String())
	}
}

// TestNodesSpecResourceGroupMustBeConfigured: a --nodes resource group
// outside --azure-resource-groups is refused at start, naming both.
func TestNodesSpecResourceGroupMustBeConfigured(t *testing.T) {
	ng, err := cloudprovider.ParseNodeGroupSpec("0:5:rg-z/gpu")
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{SubscriptionID: sub, ResourceGroups: []string{"rg-a", "rg-b"}, NodeGroups: []cloudprovider.NodeGroupSpec{ng},
		Credential: staticToken{}, ARMEndpoint: "https://127.0.0.1:1"})
	want := `--nodes=0:5:rg-z/gpu: resource group "rg-z" is not one of --azure-resource-groups (rg-a,rg-b)`
	if err == nil || err.Error() != want {
		t.Fatalf("New: %v, want %q", err, want)
	}
}
