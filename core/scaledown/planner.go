package scaledown

import (
	"context"
	"sort"
	"time"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// Options configure the planner. Names follow CA's flags.
type Options struct {
	Rules
	UtilizationThreshold    float64 // --scale-down-utilization-threshold
	GPUUtilizationThreshold float64 // --scale-down-gpu-utilization-threshold
	UnneededTime            time.Duration
	UnreadyTime             time.Duration
	MaxParallelism          int // --max-scale-down-parallelism: drains at once
	MaxEmptyBulkDelete      int // --max-empty-bulk-delete
	GPU                     apiv1.ResourceName
}

// Node is one node as the planner sees it.
type Node struct {
	Node  *apiv1.Node
	Pods  []*apiv1.Pod
	Group string // "" for nodes no group manages
	Ready bool
	// Requested, when set, is the aggregate of all the node's pods (the
	// snapshot's NodeInfo has it): utilisation then needs no per-pod sums.
	Requested *Requested
	// Version changes whenever the node or its set of pods does (the
	// NodeInfo's generation); the planner then keeps the node's utilisation
	// from one pass to the next while it is unchanged. 0: not known,
	// computed every pass.
	Version int64
	// UnneededTime and UnreadyTime override the defaults for the group.
	UnneededTime, UnreadyTime                     time.Duration
	UtilizationThreshold, GPUUtilizationThreshold float64
}

// Group is a node group's sizes.
type Group struct {
	Min, Target int
	// Deleting is the number of its nodes already being deleted.
	Deleting int
	// Healthy is false when too many of its nodes are unready for its
	// nodes to be judged: scale-down stops in this group only.
	Healthy bool
	// RecentScaleUp holds scale-down in the group (--scale-down-delay-after-add).
	RecentScaleUp bool
}

// Removal is a node chosen for deletion.
type Removal struct {
	Node   *apiv1.Node
	Group  string
	Pods   []*apiv1.Pod // to evict; empty for empty nodes
	Reason string       // "empty", "underutilized", "unready"
	Util   float64
}

// Decision is one pass's outcome.
type Decision struct {
	Empty    []Removal
	Drain    []Removal
	Unneeded []string // nodes currently unneeded, sorted
	// Kept counts, by reason, the managed nodes kept this pass.
	Kept map[Reason]int
	// Braked is true when the brake refused a removal.
	Braked bool
}

// Planner keeps the unneeded times between passes. Not safe for concurrent use.
type Planner struct {
	opts  Options
	sim   *simulator.Simulator
	brake *Brake
	since map[string]time.Time
	// requests remembers the requests of the pods utilisation takes off
	// (DaemonSet, mirror and free-room pods: 22,500 at 7,500 nodes), by
	// pod: cached pods are never changed, an update is a new object.
	// Entries not used in a pass are dropped at its end.
	requests map[*apiv1.Pod]requestsEntry
	// util is the utilisation of nodes by name, for the Version it was
	// computed at; entries not used in a pass are dropped at its end.
	util map[string]*utilEntry
	pass uint64
}

type utilEntry struct {
	version int64
	u       Utilization
	pass    uint64
}

type requestsEntry struct {
	Requested
	pass uint64
}

// NewPlanner returns a planner.
func NewPlanner(o Options, sim *simulator.Simulator, brake *Brake) *Planner {
	return &Planner{opts: o, sim: sim, brake: brake, since: map[string]time.Time{}, requests: map[*apiv1.Pod]requestsEntry{}, util: map[string]*utilEntry{}}
}

// SetOptions changes the planner's options (a live reload); the unneeded
// times already counted are kept.
func (p *Planner) SetOptions(o Options) {
	if o.GPU != p.opts.GPU {
		clear(p.requests)
	}
	clear(p.util) // the rules of what utilisation leaves out may have changed
	p.opts = o
}

// podRequests returns a pod's requests, computed once per pod object.
func (p *Planner) podRequests(pod *apiv1.Pod) Requested {
	e, ok := p.requests[pod]
	if !ok {
		e.Requested = podRequests(pod, p.opts.GPU)
	}
	if !ok || e.pass != p.pass {
		e.pass = p.pass
		p.requests[pod] = e
	}
	return e.Requested
}

// utilization returns a node's utilisation, computed again only when the
// node or its pods changed.
func (p *Planner) utilization(n *Node) Utilization {
	if n.Version == 0 {
		return utilizationOf(n.Node, n.Pods, p.opts.GPU, p.opts.Rules, n.Requested, p.podRequests)
	}
	e := p.util[n.Node.Name]
	if e == nil {
		e = &utilEntry{}
		p.util[n.Node.Name] = e
	} else if e.version == n.Version {
		e.pass = p.pass
		return e.u
	}
	e.version, e.pass = n.Version, p.pass
	e.u = utilizationOf(n.Node, n.Pods, p.opts.GPU, p.opts.Rules, n.Requested, p.podRequests)
	return e.u
}

// forget drops the requests and utilisations not used in this pass.
func (p *Planner) forget() {
	for pod, e := range p.requests {
		if e.pass != p.pass {
			delete(p.requests, pod)
		}
	}
	for name, e := range p.util {
		if e.pass != p.pass {
			delete(p.util, name)
		}
	}
}

// Reset forgets every node's unneeded time: while scale-down is held or
// disabled no node counts as unneeded, so none is removed the moment it
// resumes.
func (p *Planner) Reset() { clear(p.since) }

// Brake returns the planner's brake (the actuator records deletions on it).
func (p *Planner) Brake() *Brake { return p.brake }

type candidate struct {
	n     *Node
	util  float64
	move  []*apiv1.Pod
	why   string
	index int
}

func hasTaint(n *apiv1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// Plan finds unneeded nodes and chooses which to remove now. inflight is
// the number of drains still running from earlier passes.
func (p *Planner) Plan(ctx context.Context, now time.Time, snap *snapshot.Snapshot, nodes []Node, groups map[string]*Group, pdbs *PDBs, inflight int) Decision {
	d := Decision{Kept: map[Reason]int{}}
	p.pass++
	defer p.forget()
	seen := make(map[string]bool, len(nodes))
	var due []candidate
	for i := range nodes {
		n := &nodes[i]
		if n.Group == "" {
			continue
		}
		seen[n.Node.Name] = true
		if c, ok := p.due(now, snap, n, groups[n.Group], pdbs, &d); ok {
			due = append(due, c)
		}
	}
	for name := range p.since {
		if !seen[name] {
			delete(p.since, name)
		}
	}
	sort.Strings(d.Unneeded)
	sortDue(due)
	p.choose(ctx, now, snap, nodes, groups, pdbs, inflight, due, &d)
	return d
}

// due judges a managed node: kept (its reason counted in d), unneeded
// (since when is kept), and due for removal once unneeded long enough.
func (p *Planner) due(now time.Time, snap *snapshot.Snapshot, n *Node, g *Group, pdbs *PDBs, d *Decision) (candidate, bool) {
	name := n.Node.Name
	reason, c := p.eligible(n, g, pdbs)
	if reason != ReasonNone {
		delete(p.since, name)
		d.Kept[reason]++
		return c, false
	}
	first, ok := p.since[name]
	if !ok {
		first = now
		p.since[name] = now
	}
	d.Unneeded = append(d.Unneeded, name)
	wait := n.UnneededTime
	if !n.Ready {
		wait = n.UnreadyTime
	}
	if now.Sub(first) < wait {
		d.Kept[ReasonUnneededTimeShort]++
		return c, false
	}
	idx, ok := snap.Index(name)
	if !ok {
		return c, false
	}
	c.index = idx
	return c, true
}

// sortDue orders the due nodes: empty nodes first, then the least
// utilised.
func sortDue(due []candidate) {
	sort.SliceStable(due, func(i, j int) bool {
		if (len(due[i].move) == 0) != (len(due[j].move) == 0) {
			return len(due[i].move) == 0
		}
		if due[i].util != due[j].util {
			return due[i].util < due[j].util
		}
		return due[i].n.Node.Name < due[j].n.Node.Name
	})
}

// eligible applies the node rules; it returns the candidate when the node
// is unneeded.
func (p *Planner) eligible(n *Node, g *Group, pdbs *PDBs) (Reason, candidate) {
	c := candidate{n: n}
	if reason := keptAnyway(n, g); reason != ReasonNone {
		return reason, c
	}
	c.why = "unready"
	if n.Ready {
		util, high := p.highUtilization(n)
		c.util = util
		if high {
			return ReasonHighUtilization, c
		}
		c.why = "underutilized"
	}
	move, reason, _ := PodsToMove(n.Pods, pdbs, p.opts.Rules)
	if reason != ReasonNone {
		return reason, c
	}
	c.move = move
	if len(move) == 0 {
		c.why = "empty"
	}
	return ReasonNone, c
}

// keptAnyway is why a node is kept whatever its pods: its group's size
// unknown, its annotation, its deletion under way, its group unhealthy
// or scaled up recently.
func keptAnyway(n *Node, g *Group) Reason {
	switch {
	case g == nil:
		return ReasonSizeUnknown
	case n.Node.Annotations[ScaleDownDisabledAnnotation] == "true":
		return ReasonDisabled
	case hasTaint(n.Node, ToBeDeletedTaint) || n.Node.DeletionTimestamp != nil:
		return ReasonBeingDeleted
	case !g.Healthy:
		return ReasonGroupUnhealthy
	case g.RecentScaleUp:
		return ReasonRecentScaleUp
	}
	return ReasonNone
}

// highUtilization is a ready node's utilisation, and whether it reaches
// the node's threshold (the GPU one on GPU nodes).
func (p *Planner) highUtilization(n *Node) (float64, bool) {
	u := p.utilization(n)
	threshold := n.UtilizationThreshold
	if u.HasGPU {
		threshold = n.GPUUtilizationThreshold
	}
	return u.Max(), u.Max() >= threshold
}

// choose picks removals within min sizes, the brake and the parallelism
// limit, simulating where each drained node's pods go. A node that
// receives pods in this pass stays.
func (p *Planner) choose(ctx context.Context, now time.Time, snap *snapshot.Snapshot, nodes []Node, groups map[string]*Group, pdbs *PDBs, inflight int, due []candidate, d *Decision) {
	if len(due) == 0 {
		return
	}
	st := newChoosing(snap, nodes)
	for _, c := range due {
		if why := p.hold(now, st, groups[c.n.Group], c, pdbs, inflight, d); why != ReasonNone {
			d.Kept[why]++
			continue
		}
		if len(c.move) > 0 && !p.moveAway(ctx, st, c) {
			d.Kept[ReasonNoPlaceToMove]++
			continue
		}
		pdbs.Take(c.move)
		st.removed[c.index] = true
		st.removedPerGroup[c.n.Group]++
		d.add(Removal{Node: c.n.Node, Group: c.n.Group, Pods: c.move, Reason: c.why, Util: c.util})
		// Reserved now so the shares hold within this pass; the actuator
		// says when the deletion is sent (Brake.Sent) or given up.
		p.brake.Reserve(now, c.n.Group, c.n.Node.Name)
	}
}

// choosing is what choose has decided so far: the simulated cluster with
// the drained nodes' pods moved, the nodes removed (in all and per
// group), the nodes receiving pods, and the sizes and ready nodes it
// started from.
type choosing struct {
	fork            *snapshot.Fork
	removed         map[int]bool
	receiving       map[int]bool
	removedPerGroup map[string]int
	clusterSize     int
	groupSize       map[string]int
	// ready[i] says snapshot node i is ready and not being deleted: a
	// place for moved pods.
	ready []bool
}

func newChoosing(snap *snapshot.Snapshot, nodes []Node) *choosing {
	st := &choosing{
		removed:         map[int]bool{},
		receiving:       map[int]bool{},
		removedPerGroup: map[string]int{},
		clusterSize:     len(nodes),
		groupSize:       map[string]int{},
		ready:           make([]bool, snap.Len()),
	}
	for i := range nodes {
		st.groupSize[nodes[i].Group]++
	}
	for i := range nodes {
		if idx, ok := snap.Index(nodes[i].Node.Name); ok && nodes[i].Ready && !hasTaint(nodes[i].Node, ToBeDeletedTaint) {
			st.ready[idx] = true
		}
	}
	st.fork = snap.Fork()
	return st
}

// hold is why a due node is kept this pass, before its pods are placed:
// its group's min size, pods moved onto it, the parallelism limits, the
// brake (d.Braked set) or a PodDisruptionBudget.
func (p *Planner) hold(now time.Time, st *choosing, g *Group, c candidate, pdbs *PDBs, inflight int, d *Decision) Reason {
	empty := len(c.move) == 0
	if g.Target-g.Deleting-st.removedPerGroup[c.n.Group] <= g.Min {
		return ReasonMinSize
	}
	if st.receiving[c.index] {
		return ReasonNoPlaceToMove
	}
	if empty && len(d.Empty) >= p.opts.MaxEmptyBulkDelete {
		return ReasonParallelism
	}
	if !empty && inflight+len(d.Drain) >= p.opts.MaxParallelism {
		return ReasonParallelism
	}
	if !p.brake.Allow(now, c.n.Group, st.clusterSize-len(st.removed), st.groupSize[c.n.Group]-st.removedPerGroup[c.n.Group]) {
		d.Braked = true
		return ReasonBrake
	}
	if ok, _ := pdbs.CanEvict(c.move); !ok {
		return ReasonPDB
	}
	return ReasonNone
}

// moveAway places a drained node's pods on the ready nodes left, in a
// child of the fork kept when all fit (their nodes then receive them).
func (p *Planner) moveAway(ctx context.Context, st *choosing, c candidate) bool {
	child := st.fork.Fork()
	dests := make([]int, 0, len(st.ready))
	for i, r := range st.ready {
		if r && i != c.index && !st.removed[i] {
			dests = append(dests, i)
		}
	}
	got := map[int]bool{}
	for _, grp := range simulator.GroupPods(unbound(c.move), p.opts.GPU) {
		placed := p.sim.FitOnNodes(ctx, child, grp, 0, dests, func(_, node int) { got[node] = true })
		if placed < len(grp.Pods) {
			return false
		}
	}
	st.fork = child
	for i := range got {
		st.receiving[i] = true
	}
	return true
}

// add adds a removal: an empty node's to Empty, else to Drain.
func (d *Decision) add(r Removal) {
	if len(r.Pods) == 0 {
		d.Empty = append(d.Empty, r)
	} else {
		d.Drain = append(d.Drain, r)
	}
}

// unbound returns shallow copies of pods without their node, as the
// scheduler would see them once evicted and recreated.
func unbound(pods []*apiv1.Pod) []*apiv1.Pod {
	out := make([]*apiv1.Pod, len(pods))
	for i, p := range pods {
		c := *p
		c.Spec.NodeName = ""
		out[i] = &c
	}
	return out
}
