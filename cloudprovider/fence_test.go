package cloudprovider_test

import (
	"context"
	"errors"
	"testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testobjects"
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
