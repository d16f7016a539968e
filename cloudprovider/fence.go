package cloudprovider

import (
	"context"

	apiv1 "k8s.io/api/core/v1"
)

// Fence says whether this process may write to the cloud now: nil, or why
// not (not the leader; the lease not renewed within the renew deadline, so
// another replica may have taken over while this one stalled).
type Fence func() error

// WithFence returns p with every write of its node groups (IncreaseSize,
// DeleteNodes, DecreaseTargetSize) checked against fence first: a write
// the fence refuses is not sent, and fails with ClassFenced. Every path
// that writes to the cloud goes through the provider, so none escapes it.
func WithFence(p CloudProvider, fence Fence) CloudProvider {
	if fence == nil {
		return p
	}
	return &fenced{CloudProvider: p, fence: fence}
}

type fenced struct {
	CloudProvider
	fence Fence
}

func (f *fenced) NodeGroups() []NodeGroup {
	gs := f.CloudProvider.NodeGroups()
	out := make([]NodeGroup, len(gs))
	for i, g := range gs {
		out[i] = &fencedGroup{NodeGroup: g, fence: f.fence}
	}
	return out
}

func (f *fenced) NodeGroupForNode(n *apiv1.Node) (NodeGroup, error) {
	g, err := f.CloudProvider.NodeGroupForNode(n)
	if g == nil || err != nil {
		return g, err
	}
	return &fencedGroup{NodeGroup: g, fence: f.fence}, nil
}

type fencedGroup struct {
	NodeGroup
	fence Fence
}

func (g *fencedGroup) check() error {
	if err := g.fence(); err != nil {
		return NewError(ClassFenced, "", "no write to node group "+g.ID(), err)
	}
	return nil
}

func (g *fencedGroup) IncreaseSize(ctx context.Context, delta int) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.NodeGroup.IncreaseSize(ctx, delta)
}

func (g *fencedGroup) DeleteNodes(ctx context.Context, providerIDs []string) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.NodeGroup.DeleteNodes(ctx, providerIDs)
}

func (g *fencedGroup) DecreaseTargetSize(ctx context.Context, delta int) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.NodeGroup.DecreaseTargetSize(ctx, delta)
}

// SizeLimit implements SizeLimited with the wrapped group's limit (none
// when it has no SizeLimit).
func (g *fencedGroup) SizeLimit() (int, int, string) {
	if sl, ok := g.NodeGroup.(SizeLimited); ok {
		return sl.SizeLimit()
	}
	return g.NodeGroup.MaxSize(), 0, ""
}
