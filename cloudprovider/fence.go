package cloudprovider

import (
	"context"
	"fmt"

	apiv1 "k8s.io/api/core/v1"
)

// Fence says whether this process may write to the cloud now: nil, or why
// not (not the leader; the lease not renewed within the renew deadline, so
// another replica may have taken over while this one stalled).
type Fence func() error

// Guards are the checks a cloud write passes before it is sent. Nil
// checks pass.
type Guards struct {
	// Writes guards every write (IncreaseSize, DeleteNodes,
	// DecreaseTargetSize): the leader fence. A refused write fails with
	// ClassFenced.
	Writes Fence
	// Deletions guards DeleteNodes alone: a safety hold such as the
	// cluster-wide unready guard, under which machines are never deleted
	// but scale-up goes on. A refused deletion fails with ClassHeld.
	Deletions Fence
}

// WithFence returns p with every write of its node groups checked against
// fence first; see WithGuards.
func WithFence(p CloudProvider, fence Fence) CloudProvider {
	return WithGuards(p, Guards{Writes: fence})
}

// WithGuards returns p with every write of its node groups checked against
// g first: a write a guard refuses is not sent. Every path that writes to
// the cloud goes through the provider, so none escapes them.
//
// The guards are checked when a write method is called, and travel in its
// context to the wrapped group: a provider whose one call sends several
// write requests (the same write again after an unclear answer or a
// read-back) checks CheckWrite before each, so a fence that closes during
// the call stops the writes still to come.
func WithGuards(p CloudProvider, g Guards) CloudProvider {
	if g.Writes == nil && g.Deletions == nil {
		return p
	}
	return &fenced{CloudProvider: p, guards: g}
}

type fenced struct {
	CloudProvider
	guards Guards
}

func (f *fenced) NodeGroups() []NodeGroup {
	gs := f.CloudProvider.NodeGroups()
	out := make([]NodeGroup, len(gs))
	for i, g := range gs {
		out[i] = &fencedGroup{NodeGroup: g, guards: f.guards}
	}
	return out
}

func (f *fenced) NodeGroupForNode(n *apiv1.Node) (NodeGroup, error) {
	g, err := f.CloudProvider.NodeGroupForNode(n)
	if g == nil || err != nil {
		return g, err
	}
	return &fencedGroup{NodeGroup: g, guards: f.guards}, nil
}

type fencedGroup struct {
	NodeGroup
	guards Guards
}

func (g *fencedGroup) check() error {
	if g.guards.Writes == nil {
		return nil
	}
	if err := g.guards.Writes(); err != nil {
		return NewError(ClassFenced, "", "no write to node group "+g.ID(), err)
	}
	return nil
}

// checkDeletion is check and the deletion hold.
func (g *fencedGroup) checkDeletion() error {
	if err := g.check(); err != nil {
		return err
	}
	if g.guards.Deletions == nil {
		return nil
	}
	if err := g.guards.Deletions(); err != nil {
		return NewError(ClassHeld, "", "no deletion from node group "+g.ID(), err)
	}
	return nil
}

func (g *fencedGroup) IncreaseSize(ctx context.Context, delta int) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.NodeGroup.IncreaseSize(withWriteCheck(ctx, g.check), delta)
}

func (g *fencedGroup) DeleteNodes(ctx context.Context, providerIDs []string) error {
	if err := g.checkDeletion(); err != nil {
		return err
	}
	return g.NodeGroup.DeleteNodes(withWriteCheck(ctx, g.checkDeletion), providerIDs)
}

// Repair passes on to the wrapped group's Repair, checked against the
// write guards and the deletion hold first (a reboot, reimage or redeploy
// stops what runs on the machine as a deletion does), which travel with it;
// a group that cannot repair refuses it unsent.
func (g *fencedGroup) Repair(ctx context.Context, providerID string, action RepairAction) error {
	r, ok := g.NodeGroup.(Repairer)
	if !ok {
		return fmt.Errorf("node group %s cannot repair machines in place: %w", g.ID(), ErrNotSent)
	}
	if err := g.checkDeletion(); err != nil {
		return err
	}
	return r.Repair(withWriteCheck(ctx, g.checkDeletion), providerID, action)
}

// CanRepair passes on the wrapped group's answer (false when it has no
// Repair).
func (g *fencedGroup) CanRepair() bool {
	r, ok := g.NodeGroup.(Repairer)
	return ok && r.CanRepair()
}

// RepairState passes on the wrapped group's answer (none when it cannot
// repair).
func (g *fencedGroup) RepairState(providerID string) (RepairStatus, bool) {
	if r, ok := g.NodeGroup.(Repairer); ok {
		return r.RepairState(providerID)
	}
	return RepairStatus{}, false
}

func (g *fencedGroup) DecreaseTargetSize(ctx context.Context, delta int) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.NodeGroup.DecreaseTargetSize(withWriteCheck(ctx, g.check), delta)
}

// writeCheckKey is the context key of the guards of a write call.
type writeCheckKey struct{}

// CheckWrite says whether a write request may be sent to the cloud now:
// nil, or the error of the guard that refuses it (ClassFenced; ClassHeld
// for a held deletion). ctx is the one a guarded group (WithGuards) passed
// to the write method of the group it wraps; a context without guards
// passes. A provider calls it right before each write request it sends.
func CheckWrite(ctx context.Context) error {
	if check, ok := ctx.Value(writeCheckKey{}).(func() error); ok {
		return check()
	}
	return nil
}

// withWriteCheck returns ctx carrying check, after any check ctx carries
// already (a group guarded twice is checked against both).
func withWriteCheck(ctx context.Context, check func() error) context.Context {
	if outer, ok := ctx.Value(writeCheckKey{}).(func() error); ok {
		inner := check
		check = func() error {
			if err := outer(); err != nil {
				return err
			}
			return inner()
		}
	}
	return context.WithValue(ctx, writeCheckKey{}, check)
}

// SizeLimit implements SizeLimited with the wrapped group's limit (none
// when it has no SizeLimit).
func (g *fencedGroup) SizeLimit() (int, int, string) {
	if sl, ok := g.NodeGroup.(SizeLimited); ok {
		return sl.SizeLimit()
	}
	return g.NodeGroup.MaxSize(), 0, ""
}

// ScaleUpInFlight passes on the wrapped group's answer: whether its
// previous capacity write still runs (false when it does not say).
func (g *fencedGroup) ScaleUpInFlight() bool {
	r, ok := g.NodeGroup.(interface{ ScaleUpInFlight() bool })
	return ok && r.ScaleUpInFlight()
}
