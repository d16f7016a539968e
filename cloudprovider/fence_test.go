package cloudprovider_test

import (
	"context"
	"errors"
	"testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

func TestFenceGuardsEveryWrite(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		fence error
	}{{"fence open", nil}, {"fence closed", errors.New("lease not renewed")}} {
		t.Run(tc.name, func(t *testing.T) {
			p := inmemory.New()
			g := p.AddGroup("g", 0, 10, to.Node("g", "4", "8Gi"), inmemory.WithTarget(2))
			g.SetNoInstances(true) // an increase raises the target only: a decrease may lower it again
			fp := cloudprovider.WithFence(p, func() error { return tc.fence })
			fg := fp.NodeGroups()[0]
			n := to.Node("n", "4", "8Gi", to.ProviderID(g.ProviderIDs()[0]))
			byNode, err := fp.NodeGroupForNode(n)
			if err != nil || byNode == nil {
				t.Fatalf("NodeGroupForNode: %v %v", byNode, err)
			}
			errs := []error{
				fg.IncreaseSize(ctx, 1),
				byNode.DeleteNodes(ctx, g.ProviderIDs()[:1]),
				fg.DecreaseTargetSize(ctx, -1),
			}
			for i, err := range errs {
				if (err != nil) != (tc.fence != nil) {
					t.Fatalf("write %d: err %v with fence %v", i, err, tc.fence)
				}
				if tc.fence != nil && cloudprovider.ClassOf(err) != cloudprovider.ClassFenced {
					t.Fatalf("write %d: class %v, want fenced", i, cloudprovider.ClassOf(err))
				}
			}
			if tc.fence != nil && (len(g.Increases()) != 0 || len(g.Deleted()) != 0) {
				t.Fatalf("increases %v deleted %v through a closed fence", g.Increases(), g.Deleted())
			}
			if tc.fence == nil && (len(g.Increases()) != 1 || len(g.Deleted()) != 1) {
				t.Fatalf("increases %v deleted %v through an open fence", g.Increases(), g.Deleted())
			}
		})
	}
}

// TestDeletionGuardHoldsOnlyDeletions: a deletion hold (the cluster-wide
// unready guard) refuses DeleteNodes with ClassHeld and sends nothing,
// while increases and target decreases go on.
func TestDeletionGuardHoldsOnlyDeletions(t *testing.T) {
	ctx := context.Background()
	p := inmemory.New()
	g := p.AddGroup("g", 0, 10, to.Node("g", "4", "8Gi"), inmemory.WithTarget(2))
	g.SetNoInstances(true)
	held := errors.New("7 of 9 managed nodes unready")
	fg := cloudprovider.WithGuards(p, cloudprovider.Guards{Deletions: func() error { return held }}).NodeGroups()[0]
	err := fg.DeleteNodes(ctx, g.ProviderIDs()[:1])
	if cloudprovider.ClassOf(err) != cloudprovider.ClassHeld || !errors.Is(err, held) {
		t.Fatalf("DeleteNodes under the hold: %v (class %v), want held", err, cloudprovider.ClassOf(err))
	}
	if len(g.Deleted()) != 0 {
		t.Fatalf("deleted %v under the hold", g.Deleted())
	}
	if err := fg.IncreaseSize(ctx, 1); err != nil {
		t.Fatalf("IncreaseSize under a deletion hold: %v", err)
	}
	if err := fg.DecreaseTargetSize(ctx, -1); err != nil {
		t.Fatalf("DecreaseTargetSize under a deletion hold: %v", err)
	}
}

// TestFencedGroupKeepsItsSizeLimit: the fence wraps a group without hiding
// its platform limit.
func TestFencedGroupKeepsItsSizeLimit(t *testing.T) {
	p := inmemory.New()
	g := p.AddGroup("g", 0, 2500, to.Node("g", "4", "8Gi"))
	g.SetSizeLimit(1000, "Uniform scale set")
	fenced := cloudprovider.WithFence(p, func() error { return nil }).NodeGroups()[0]
	sl, ok := fenced.(cloudprovider.SizeLimited)
	if !ok {
		t.Fatal("a fenced group is not SizeLimited")
	}
	if configured, limit, why := sl.SizeLimit(); configured != 2500 || limit != 1000 || why != "Uniform scale set" {
		t.Fatalf("SizeLimit = %d, %d, %q", configured, limit, why)
	}
	if fenced.MaxSize() != 1000 {
		t.Fatalf("MaxSize = %d, want the limit", fenced.MaxSize())
	}
}

// probed wraps a provider's groups so that their write methods call during
// instead of writing: a test looks at what the call's context says.
type probed struct {
	cloudprovider.CloudProvider
	during func(ctx context.Context)
}

func (p *probed) NodeGroups() []cloudprovider.NodeGroup {
	var out []cloudprovider.NodeGroup
	for _, g := range p.CloudProvider.NodeGroups() {
		out = append(out, &probedGroup{NodeGroup: g, during: p.during})
	}
	return out
}

type probedGroup struct {
	cloudprovider.NodeGroup
	during func(ctx context.Context)
}

func (g *probedGroup) IncreaseSize(ctx context.Context, _ int) error {
	g.during(ctx)
	return nil
}

func (g *probedGroup) DeleteNodes(ctx context.Context, _ []string) error {
	g.during(ctx)
	return nil
}

func (g *probedGroup) DecreaseTargetSize(ctx context.Context, _ int) error {
	g.during(ctx)
	return nil
}

// TestGuardsAreCheckedAgainDuringTheCall: the guards pass when a write
// method is called and then one closes; CheckWrite on the context the
// wrapped group was given reports it, so a provider that writes more than
// once in a call stops there.
func TestGuardsAreCheckedAgainDuringTheCall(t *testing.T) {
	const ok = cloudprovider.ErrorClass(-1)
	tests := []struct {
		name string
		// closes says which guard refuses from the middle of the call on:
		// "writes", "deletions", "outer" (the outer of two fences) or "".
		closes string
		// want is CheckWrite's class during IncreaseSize, DeleteNodes and
		// DecreaseTargetSize (ok: nil).
		want [3]cloudprovider.ErrorClass
	}{
		{"guards stay open", "", [3]cloudprovider.ErrorClass{ok, ok, ok}},
		{"the fence closes", "writes", [3]cloudprovider.ErrorClass{cloudprovider.ClassFenced, cloudprovider.ClassFenced, cloudprovider.ClassFenced}},
		{"a deletion hold starts", "deletions", [3]cloudprovider.ErrorClass{ok, cloudprovider.ClassHeld, ok}},
		{"guarded twice, the outer fence closes", "outer", [3]cloudprovider.ErrorClass{cloudprovider.ClassFenced, cloudprovider.ClassFenced, cloudprovider.ClassFenced}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			p := inmemory.New()
			g := p.AddGroup("g", 0, 10, to.Node("g", "4", "8Gi"), inmemory.WithTarget(2))
			closed := ""
			guard := func(name string) cloudprovider.Fence {
				return func() error {
					if closed == name {
						return errors.New(name + " closed")
					}
					return nil
				}
			}
			var got []cloudprovider.ErrorClass
			during := func(ctx context.Context) {
				closed = tc.closes
				err := cloudprovider.CheckWrite(ctx)
				closed = ""
				if err == nil {
					got = append(got, ok)
				} else {
					got = append(got, cloudprovider.ClassOf(err))
				}
			}
			fp := cloudprovider.WithGuards(&probed{CloudProvider: p, during: during}, cloudprovider.Guards{Writes: guard("writes"), Deletions: guard("deletions")})
			fp = cloudprovider.WithFence(fp, guard("outer"))
			fg := fp.NodeGroups()[0]
			for i, err := range []error{fg.IncreaseSize(ctx, 1), fg.DeleteNodes(ctx, g.ProviderIDs()[:1]), fg.DecreaseTargetSize(ctx, -1)} {
				if err != nil {
					t.Fatalf("write %d refused at the call: %v", i, err)
				}
			}
			if len(got) != 3 || [3]cloudprovider.ErrorClass(got) != tc.want {
				t.Fatalf("CheckWrite during the calls: %v, want %v", got, tc.want)
			}
		})
	}
	if err := cloudprovider.CheckWrite(context.Background()); err != nil {
		t.Fatalf("CheckWrite without guards: %v", err)
	}
}

func TestProviderIDKey(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"azure:///subscriptions/S/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu/virtualMachines/3",
			"azure://subscriptions/s/resourcegroups/mc_rg/providers/microsoft.compute/virtualmachinescalesets/gpu/virtualmachines/3"},
		{"azure:///subscriptions/s/x/", "azure:///subscriptions/s/x"},
		{"inmemory://cpu/1", "INMEMORY:///cpu/1"},
	} {
		if cloudprovider.ProviderIDKey(tc.a) != cloudprovider.ProviderIDKey(tc.b) {
			t.Errorf("%q and %q name one machine: keys %q, %q", tc.a, tc.b, cloudprovider.ProviderIDKey(tc.a), cloudprovider.ProviderIDKey(tc.b))
		}
	}
	if cloudprovider.ProviderIDKey("azure:///subscriptions/s/x/1") == cloudprovider.ProviderIDKey("azure:///subscriptions/s/x/2") {
		t.Error("two machines with one key")
	}
}
