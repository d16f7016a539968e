// Package inmemory is a cloud provider held in memory, for tests of the core
// where the cloud is not the subject. It creates instances on IncreaseSize
// and lets a test inject the failures a real cloud reports.
package inmemory

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// Provider is an in-memory CloudProvider. It is safe for concurrent use.
type Provider struct {
	mu     sync.Mutex
	groups map[string]*Group
	order  []string
	// byProviderID maps an instance's provider ID (ProviderIDKey: compared
	// case-insensitively, as Azure does) to its group.
	byProviderID map[string]*Group
	nextID       int
	// evictions are the machines Evict took back, until Evictions.
	evictions []cloudprovider.Eviction
}

var _ cloudprovider.EvictionReporter = (*Provider)(nil)

// Evictions implements cloudprovider.EvictionReporter: the machines
// Group.Evict took back since the last call.
func (p *Provider) Evictions() []cloudprovider.Eviction {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.evictions
	p.evictions = nil
	return out
}

// New returns an empty provider.
func New() *Provider {
	return &Provider{groups: map[string]*Group{}, byProviderID: map[string]*Group{}}
}

// GroupOption configures a group created by AddGroup.
type GroupOption func(*Group)

// WithTarget sets the group's initial target size; instances are created running.
func WithTarget(n int) GroupOption { return func(g *Group) { g.initial = n } }

// WithOptions sets the group's per-group option overrides.
func WithOptions(f func(*cloudprovider.GroupOptions)) GroupOption {
	return func(g *Group) { g.options = f }
}

// AddGroup adds a node group built from a template node.
func (p *Provider) AddGroup(id string, minSize, maxSize int, template *apiv1.Node, opts ...GroupOption) *Group {
	g := &Group{p: p, id: id, min: minSize, max: maxSize, template: template}
	for _, o := range opts {
		o(g)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.groups[id] = g
	p.order = append(p.order, id)
	for i := 0; i < g.initial; i++ {
		p.addInstanceLocked(g, cloudprovider.InstanceRunning)
	}
	g.target = g.initial
	return g
}

func (p *Provider) addInstanceLocked(g *Group, state cloudprovider.InstanceState) *instance {
	p.nextID++
	in := &instance{Instance: cloudprovider.Instance{
		ProviderID: fmt.Sprintf("inmemory://%s/%d", g.id, p.nextID),
		State:      state,
	}}
	g.instances = append(g.instances, in)
	p.byProviderID[cloudprovider.ProviderIDKey(in.ProviderID)] = g
	return in
}

// Name implements cloudprovider.CloudProvider.
func (p *Provider) Name() string { return "inmemory" }

// NodeGroups implements cloudprovider.CloudProvider.
func (p *Provider) NodeGroups() []cloudprovider.NodeGroup {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]cloudprovider.NodeGroup, 0, len(p.order))
	for _, id := range p.order {
		out = append(out, p.groups[id])
	}
	return out
}

// NodeGroupForNode implements cloudprovider.CloudProvider.
func (p *Provider) NodeGroupForNode(node *apiv1.Node) (cloudprovider.NodeGroup, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g, ok := p.byProviderID[cloudprovider.ProviderIDKey(node.Spec.ProviderID)]; ok {
		return g, nil
	}
	return nil, nil
}

// Refresh implements cloudprovider.CloudProvider; it counts calls.
func (p *Provider) Refresh(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.groups {
		g.refreshes++
	}
	return nil
}

// Group is an in-memory node group.
type Group struct {
	p  *Provider
	id string
	// repairs are the in-place repairs asked ("<provider ID> <action>"),
	// and each machine's last one (Repair, FinishRepair).
	repairs      []string
	repairState  map[string]cloudprovider.RepairStatus
	cannotRepair bool
	// repairErrs are the errors the next Repair calls return, in order
	// (nothing recorded for them).
	repairErrs []error
	min, max   int
	initial    int
	target     int
	template   *apiv1.Node
	options    func(*cloudprovider.GroupOptions)

	instances []*instance
	// failNext, when set, makes instances created by the next IncreaseSize fail.
	failNext *cloudprovider.InstanceError
	// increaseErr, when set, is returned by IncreaseSize.
	increaseErr error
	// deleteErr, when set, is returned by DeleteNodes.
	deleteErr error
	// lostDeletes makes DeleteNodes accept deletions that then fail, as a
	// cloud's asynchronous delete operation can: the machines stay.
	lostDeletes bool
	// slowDeletes makes DeleteNodes accept deletions that take their
	// time: the machines stay listed, deleting (SetSlowDeletes).
	slowDeletes bool
	// sizeUnknown makes TargetSize fail.
	sizeUnknown bool
	// writing is what ScaleUpInFlight answers (SetScaleUpInFlight).
	writing bool
	// noInstances makes IncreaseSize raise the target without creating instances.
	noInstances bool
	// limit, when positive, is the most machines the group can hold
	// (SetSizeLimit); max stays as configured.
	limit    int
	limitWhy string

	increases []int
	deleted   []string
	refreshes int
}

type instance struct {
	cloudprovider.Instance
}

// ID implements cloudprovider.NodeGroup.
func (g *Group) ID() string { return g.id }

// MinSize implements cloudprovider.NodeGroup.
func (g *Group) MinSize() int { return g.min }

// MaxSize implements cloudprovider.NodeGroup: the configured max, or the
// size limit when that is lower.
func (g *Group) MaxSize() int {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	return g.maxLocked()
}

func (g *Group) maxLocked() int {
	if g.limit > 0 && g.limit < g.max {
		return g.limit
	}
	return g.max
}

// SetSizeLimit makes the group hold at most limit machines, as a scale
// set's platform limit does, whatever its configured max.
func (g *Group) SetSizeLimit(limit int, why string) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.limit, g.limitWhy = limit, why
}

// SizeLimit implements cloudprovider.SizeLimited.
func (g *Group) SizeLimit() (int, int, string) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	return g.max, g.limit, g.limitWhy
}

// TargetSize implements cloudprovider.NodeGroup.
func (g *Group) TargetSize() (int, error) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	if g.sizeUnknown {
		return 0, cloudprovider.ErrSizeUnknown(g.id, nil)
	}
	return g.target, nil
}

// IncreaseSize implements cloudprovider.NodeGroup.
func (g *Group) IncreaseSize(_ context.Context, delta int) error {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	if delta <= 0 {
		return fmt.Errorf("increase of node group %s must be positive, got %d", g.id, delta)
	}
	if g.increaseErr != nil {
		return g.increaseErr
	}
	if g.target+delta > g.maxLocked() {
		return fmt.Errorf("increase of node group %s by %d exceeds max %d (target %d)", g.id, delta, g.maxLocked(), g.target)
	}
	g.target += delta
	g.increases = append(g.increases, delta)
	if g.noInstances {
		return nil
	}
	for i := 0; i < delta; i++ {
		in := g.p.addInstanceLocked(g, cloudprovider.InstanceCreating)
		if g.failNext != nil {
			e := *g.failNext
			in.Error = &e
		}
	}
	g.failNext = nil
	return nil
}

// DeleteNodes implements cloudprovider.NodeGroup.
func (g *Group) DeleteNodes(_ context.Context, providerIDs []string) error {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	if g.deleteErr != nil {
		return g.deleteErr
	}
	if g.lostDeletes {
		return nil
	}
	if g.slowDeletes {
		for _, in := range g.instances {
			if slices.ContainsFunc(providerIDs, func(id string) bool {
				return cloudprovider.ProviderIDKey(id) == cloudprovider.ProviderIDKey(in.ProviderID)
			}) {
				in.State = cloudprovider.InstanceDeleting
			}
		}
		return nil
	}
	want := map[string]bool{}
	for _, id := range providerIDs {
		key := cloudprovider.ProviderIDKey(id)
		if g.p.byProviderID[key] != g {
			return fmt.Errorf("instance %s is not in node group %s", id, g.id)
		}
		want[key] = true
	}
	kept := g.instances[:0]
	for _, in := range g.instances {
		if key := cloudprovider.ProviderIDKey(in.ProviderID); want[key] {
			delete(g.p.byProviderID, key)
			g.deleted = append(g.deleted, in.ProviderID)
			g.target--
			continue
		}
		kept = append(kept, in)
	}
	g.instances = kept
	return nil
}

// DecreaseTargetSize implements cloudprovider.NodeGroup.
func (g *Group) DecreaseTargetSize(_ context.Context, delta int) error {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	if delta >= 0 {
		return fmt.Errorf("decrease of node group %s must be negative, got %d", g.id, delta)
	}
	if g.target+delta < len(g.instances) {
		return fmt.Errorf("decrease of node group %s by %d would delete existing instances (target %d, instances %d)", g.id, -delta, g.target, len(g.instances))
	}
	g.target += delta
	return nil
}

// Instances implements cloudprovider.NodeGroup.
func (g *Group) Instances() ([]cloudprovider.Instance, error) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	out := make([]cloudprovider.Instance, 0, len(g.instances))
	for _, in := range g.instances {
		c := in.Instance
		if in.Error != nil {
			e := *in.Error
			c.Error = &e
		}
		if in.FailedRunning != nil {
			e := *in.FailedRunning
			c.FailedRunning = &e
		}
		out = append(out, c)
	}
	return out, nil
}

// TemplateNode implements cloudprovider.NodeGroup.
func (g *Group) TemplateNode() (*apiv1.Node, error) {
	if g.template == nil {
		return nil, fmt.Errorf("node group %s has no template", g.id)
	}
	return g.template.DeepCopy(), nil
}

// Options implements cloudprovider.NodeGroup.
func (g *Group) Options(defaults cloudprovider.GroupOptions) cloudprovider.GroupOptions {
	if g.options != nil {
		g.options(&defaults)
	}
	return defaults
}

// --- test controls ---

// FailNextCreation makes the instances created by the next IncreaseSize report err.
func (g *Group) FailNextCreation(class cloudprovider.ErrorClass, code, msg string) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.failNext = &cloudprovider.InstanceError{Class: class, Code: code, Message: msg}
}

// SetInstanceFailure makes an existing instance report a failure, as a
// cloud reports a machine whose last operation failed: while it runs
// (FailedRunning, as an Azure VM whose extension failed) when running is
// set, else as a machine that is not running (Error). A nil failure
// clears both. It reports whether the instance exists.
func (g *Group) SetInstanceFailure(providerID string, running bool, failure *cloudprovider.InstanceError) bool {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	for _, in := range g.instances {
		if in.ProviderID != providerID {
			continue
		}
		in.Error, in.FailedRunning = nil, nil
		switch {
		case failure == nil:
		case running:
			e := *failure
			in.FailedRunning = &e
		default:
			e := *failure
			in.Error = &e
		}
		return true
	}
	return false
}

// Evict takes instances back as a cloud evicts Spot machines, and reports
// them (Provider.Evictions): deleted (the target drops by itself), or with
// deallocate stopped and kept, running nothing (an instance with a
// ClassEvicted error, for the core to delete). It fails, evicting none,
// when an ID is not a live instance of the group.
func (g *Group) Evict(deallocate bool, providerIDs ...string) error {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	want := make(map[string]bool, len(providerIDs))
	for _, id := range providerIDs {
		want[cloudprovider.ProviderIDKey(id)] = true
	}
	found := 0
	for _, in := range g.instances {
		if want[cloudprovider.ProviderIDKey(in.ProviderID)] && in.Error == nil && in.State != cloudprovider.InstanceDeleting {
			found++
		}
	}
	if found != len(want) {
		return fmt.Errorf("evicting %d instances of node group %s: %d are live instances of it", len(want), g.id, found)
	}
	kept := g.instances[:0]
	for _, in := range g.instances {
		key := cloudprovider.ProviderIDKey(in.ProviderID)
		if !want[key] {
			kept = append(kept, in)
			continue
		}
		g.p.evictions = append(g.p.evictions, cloudprovider.Eviction{Group: g.id, ProviderID: in.ProviderID, Deallocated: deallocate})
		if deallocate {
			in.State, in.FailedRunning = cloudprovider.InstanceRunning, nil
			in.Error = &cloudprovider.InstanceError{Class: cloudprovider.ClassEvicted, Code: "Evicted", Message: "evicted and deallocated"}
			kept = append(kept, in)
			continue
		}
		delete(g.p.byProviderID, key)
		g.target--
	}
	g.instances = kept
	return nil
}

// SetIncreaseError makes IncreaseSize return err (nil to clear).
func (g *Group) SetIncreaseError(err error) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.increaseErr = err
}

// SetScaleUpInFlight sets what ScaleUpInFlight answers, as a provider
// whose previous capacity write of the group still runs would.
func (g *Group) SetScaleUpInFlight(v bool) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.writing = v
}

// ScaleUpInFlight says whether the group's previous capacity write still
// runs (SetScaleUpInFlight; the vmss provider's one write in flight per
// scale set).
func (g *Group) ScaleUpInFlight() bool {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	return g.writing
}

// SetLostDeletes makes DeleteNodes accept deletions that then fail: the
// machines stay running, as after a failed asynchronous delete.
func (g *Group) SetLostDeletes(v bool) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.lostDeletes = v
}

// SetSlowDeletes makes DeleteNodes accept deletions that take their
// time: the machines stay listed as deleting, their nodes as they were,
// as a GPU VM's deletion runs for minutes.
func (g *Group) SetSlowDeletes(v bool) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.slowDeletes = v
}

// SetDeleteError makes DeleteNodes return err (nil to clear).
func (g *Group) SetDeleteError(err error) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.deleteErr = err
}

// SetSizeUnknown makes TargetSize fail with a size-unknown error.
func (g *Group) SetSizeUnknown(v bool) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.sizeUnknown = v
}

// SetNoInstances makes IncreaseSize raise the target without creating instances,
// as a cloud that accepted a request but never started the machines.
func (g *Group) SetNoInstances(v bool) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.noInstances = v
}

// Reset removes every instance created since the group was added and
// restores its initial target; benchmarks use it to replay a loop.
func (g *Group) Reset() {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	for _, in := range g.instances[g.initial:] {
		delete(g.p.byProviderID, cloudprovider.ProviderIDKey(in.ProviderID))
	}
	g.instances = g.instances[:g.initial]
	g.target = g.initial
	g.increases, g.deleted = nil, nil
}

// MarkRunning moves every creating instance without error to running.
func (g *Group) MarkRunning() {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	for _, in := range g.instances {
		if in.State == cloudprovider.InstanceCreating && in.Error == nil {
			in.State = cloudprovider.InstanceRunning
		}
	}
}

// Increases returns the deltas IncreaseSize accepted, in order.
func (g *Group) Increases() []int {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	return append([]int(nil), g.increases...)
}

// Deleted returns the provider IDs DeleteNodes removed, sorted.
func (g *Group) Deleted() []string {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	out := append([]string(nil), g.deleted...)
	sort.Strings(out)
	return out
}

// ProviderIDs returns the provider IDs of the group's current instances.
func (g *Group) ProviderIDs() []string {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	out := make([]string, 0, len(g.instances))
	for _, in := range g.instances {
		out = append(out, in.ProviderID)
	}
	return out
}

var _ cloudprovider.Repairer = (*Group)(nil)

// CanRepair implements cloudprovider.Repairer: unless SetCannotRepair.
func (g *Group) CanRepair() bool {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	return !g.cannotRepair
}

// FailNextRepairs makes the next Repair calls return errs, one each,
// asking nothing (a throttled or refused request).
func (g *Group) FailNextRepairs(errs ...error) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.repairErrs = append(g.repairErrs, errs...)
}

// SetCannotRepair makes the group's machines not repairable in place.
func (g *Group) SetCannotRepair(v bool) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.cannotRepair = v
}

// Repair implements cloudprovider.Repairer: it records the action, which
// runs until FinishRepair; a machine the group does not have, or one
// already being repaired, is refused unsent.
func (g *Group) Repair(_ context.Context, providerID string, action cloudprovider.RepairAction) error {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	key := cloudprovider.ProviderIDKey(providerID)
	found := false
	for _, in := range g.instances {
		found = found || cloudprovider.ProviderIDKey(in.ProviderID) == key
	}
	if !found {
		return fmt.Errorf("repairing %s: not a machine of node group %s: %w", providerID, g.id, cloudprovider.ErrNotSent)
	}
	if len(g.repairErrs) > 0 {
		err := g.repairErrs[0]
		g.repairErrs = g.repairErrs[1:]
		return err
	}
	if st, ok := g.repairState[key]; ok && !st.Done {
		return fmt.Errorf("repairing %s: its %s runs: %w", providerID, st.Action, cloudprovider.ErrNotSent)
	}
	if g.repairState == nil {
		g.repairState = map[string]cloudprovider.RepairStatus{}
	}
	g.repairState[key] = cloudprovider.RepairStatus{Action: action}
	g.repairs = append(g.repairs, providerID+" "+string(action))
	return nil
}

// RepairState implements cloudprovider.Repairer.
func (g *Group) RepairState(providerID string) (cloudprovider.RepairStatus, bool) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	st, ok := g.repairState[cloudprovider.ProviderIDKey(providerID)]
	return st, ok
}

// FinishRepair ends the machine's repair, failed when err is not nil.
func (g *Group) FinishRepair(providerID string, err error) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	key := cloudprovider.ProviderIDKey(providerID)
	st := g.repairState[key]
	st.Done, st.Err = true, err
	g.repairState[key] = st
}

// Repairs are the repairs asked, in order: "<provider ID> <action>".
func (g *Group) Repairs() []string {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	return append([]string(nil), g.repairs...)
}
