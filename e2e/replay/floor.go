package main

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// The floor is an oracle that knows the whole schedule: what the trace
// costs when every node is bought exactly when needed and released the
// moment it empties. At each instant the schedule changes, the pods that
// leave free their room, the pods that arrive are packed first-fit
// decreasing (by GPUs, then CPU, then memory) onto the nodes in the order
// they were bought, a node is bought when none holds a pod, and a node left
// empty is released.
//
// Pods do not move once placed: GPU jobs are not migrated, and neither
// side's autoscaler moves a running pod to save a node in this replay
// (Karpenter's consolidation could; its report says when it did). The
// fluid bound beside it is what no packing beats: at each moment the
// running pods' requests over a node's, rounded up, as if pods could be
// split and moved freely.
//
// Boot: knowing the schedule, the floor starts a node a boot delay before
// it is needed (before the replay's start if need be), so no pod waits:
// its pending time is 0 and its node-hours include each node's boot. A
// node emptied less than a boot before another is needed is released all
// the same (keeping it would trade idle GPU-hours for node-hours).

// floorResult is the floor's timeline and its fluid bound.
type floorResult struct {
	Timeline timeline
	// BoundNodeHours is the fluid bound in replay hours.
	BoundNodeHours float64
}

// floorNode is a node the floor bought: its entry in the timeline and
// what is left of it.
type floorNode struct {
	life int // in the timeline's Nodes
	free resources
	pods int
}

// packer is the floor's state as it walks the schedule.
type packer struct {
	w    *workload
	boot time.Duration
	tl   timeline
	open []*floorNode // the nodes not released, oldest first
	on   []*floorNode // each pod's node
	// running is what the running pods request; runningPods counts them.
	running     resources
	runningPods int64
	bound       float64 // node-hours so far
	last        time.Duration
	lastBound   int64
}

// floor packs w's schedule; boot is the nodes' boot delay, compressed.
func floor(w *workload, boot time.Duration) floorResult {
	p := &packer{w: w, boot: boot, on: make([]*floorNode, len(w.Pods))}
	p.tl.Pods = make([]podLife, len(w.Pods))
	for i := 0; i < len(w.Events); {
		j := i
		for j < len(w.Events) && w.Events[j].At == w.Events[i].At {
			j++
		}
		p.instant(w.Events[i:j])
		i = j
	}
	p.tl.End = w.Span
	if n := len(w.Events); n > 0 {
		p.tl.End = max(p.tl.End, w.Events[n-1].At)
	}
	p.advance(p.tl.End)
	return floorResult{Timeline: p.tl, BoundNodeHours: p.bound}
}

// instant applies the events of one instant: departures, then arrivals
// packed together, then releases. A pod arriving and leaving at once
// (no lifetime once compressed) leaves after the arrivals are packed.
func (p *packer) instant(evs []event) {
	t := evs[0].At
	p.advance(t)
	var arrivals []int
	for _, e := range evs {
		if e.Kind == createEvent {
			arrivals = append(arrivals, e.Pod)
			continue
		}
		p.pack(t, arrivals)
		arrivals = nil
		p.leave(t, e.Pod)
	}
	p.pack(t, arrivals)
	p.release(t)
	p.lastBound = p.fluid()
}

// advance adds the fluid bound's node-hours up to t.
func (p *packer) advance(t time.Duration) {
	p.bound += float64(p.lastBound) * (t - p.last).Hours()
	p.last = t
}

// fluid is the fewest nodes the running pods' requests fit, split freely.
func (p *packer) fluid() int64 {
	a := p.w.Node.Allocatable
	up := func(x, y int64) int64 {
		if y <= 0 {
			return 0
		}
		return (x + y - 1) / y
	}
	return max(up(p.running.CPUMilli, a.CPUMilli), up(p.running.MemoryMiB, a.MemoryMiB), up(p.running.GPUs, a.GPUs), up(p.runningPods, int64(p.w.Node.MaxPods)))
}

// pack places arrivals first-fit decreasing.
func (p *packer) pack(t time.Duration, arrivals []int) {
	slices.SortFunc(arrivals, func(a, b int) int {
		x, y := p.w.Pods[a].Req, p.w.Pods[b].Req
		return cmp.Or(cmp.Compare(y.GPUs, x.GPUs), cmp.Compare(y.CPUMilli, x.CPUMilli), cmp.Compare(y.MemoryMiB, x.MemoryMiB), cmp.Compare(a, b))
	})
	for _, i := range arrivals {
		p.place(t, i)
	}
}

// place puts pod i on the first open node it fits, or a new one.
func (p *packer) place(t time.Duration, i int) {
	req := p.w.Pods[i].Req
	k := slices.IndexFunc(p.open, func(n *floorNode) bool { return n.pods < p.w.Node.MaxPods && req.fits(n.free) })
	if k < 0 {
		p.open = append(p.open, &floorNode{life: len(p.tl.Nodes), free: p.w.Node.Allocatable})
		p.tl.Nodes = append(p.tl.Nodes, nodeLife{Name: fmt.Sprintf("floor-%d", len(p.tl.Nodes)), Created: t - p.boot, Ready: t, Deleted: never, GPUs: p.w.Node.Allocatable.GPUs})
		k = len(p.open) - 1
	}
	n := p.open[k]
	n.free = n.free.minus(req)
	n.pods++
	p.on[i] = n
	p.running = p.running.plus(req)
	p.runningPods++
	p.tl.Pods[i] = podLife{Name: p.w.Pods[i].Name, Created: t, Running: t, Deleted: never, Node: p.tl.Nodes[n.life].Name, GPUs: req.GPUs}
}

// leave frees pod i's room.
func (p *packer) leave(t time.Duration, i int) {
	req := p.w.Pods[i].Req
	n := p.on[i]
	n.free = n.free.plus(req)
	n.pods--
	p.running = p.running.minus(req)
	p.runningPods--
	p.tl.Pods[i].Deleted = t
}

// release deletes the empty nodes at t.
func (p *packer) release(t time.Duration) {
	p.open = slices.DeleteFunc(p.open, func(n *floorNode) bool {
		if n.pods > 0 {
			return false
		}
		p.tl.Nodes[n.life].Deleted = t
		return true
	})
}
