package snapshot

import (
	"runtime"
	"sort"
	"sync"

	apiv1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// Builder turns the informer caches' nodes and pods into a Snapshot, loop
// after loop, doing work only for what changed. Informer stores replace an
// object's pointer on every update, so an unchanged pointer means an
// unchanged object:
//   - a steady loop over 200,000 pods is one lookup by pointer per pod (an
//     8-byte key, not a 36-byte UID: a quarter of the time) and a scan of a
//     dense array to find the pods that went away;
//   - only nodes whose node or pods changed get a new NodeInfo, and their
//     unchanged pods keep their PodInfo (whose requests the framework
//     computes once), so a node rebuilt for one new pod costs one PodInfo;
//   - when many nodes must be built (the first loop, a failover) they are
//     built on every CPU.
//
// A Builder is not safe for concurrent use.
type Builder struct {
	gpu   apiv1.ResourceName
	epoch uint64
	nodes map[string]*nodeEntry
	// index maps a pod object to its slot in pods; seen[slot] is the last
	// Build that listed it. Slots of pods gone are reused (free).
	index map[*apiv1.Pod]int32
	pods  []podEntry
	seen  []uint64
	free  []int32
	// order is the nodes of the last snapshot, sorted by name; nil when the
	// set changed.
	order []*nodeEntry
	// workers builds NodeInfos when at least parallelMin nodes changed.
	workers int
}

// parallelMin is the number of nodes to rebuild from which the work is
// spread over goroutines: below it, starting them costs more than it saves.
const parallelMin = 256

type podKind uint8

const (
	podBound podKind = iota
	podUnbound
	podTerminal // succeeded or failed: holds no resources
)

type podEntry struct {
	pod  *apiv1.Pod // nil for a free slot
	kind podKind
	node *nodeEntry // the node a bound pod is on
	at   int        // the pod's position in node.pods
	info fwk.PodInfo
}

type nodeEntry struct {
	name string
	node *apiv1.Node // nil while the cache has pods bound to it but no node
	pods []int32     // slots of the pods bound here
	info fwk.NodeInfo
	list []*apiv1.Pod // the pods of info, for readers that want objects
	// dirty: the node or its set of pods changed since info was built.
	dirty bool
	seen  uint64
}

// NewBuilder returns a Builder tracking gpu as the GPU resource.
func NewBuilder(gpu apiv1.ResourceName) *Builder {
	return &Builder{gpu: gpu, nodes: map[string]*nodeEntry{}, index: map[*apiv1.Pod]int32{}, workers: runtime.GOMAXPROCS(0)}
}

// Stats says how much work the last Build did.
type Stats struct {
	Nodes, Pods, RebuiltNodes int
}

// Build returns a snapshot of nodes and the pods bound to them, and the pods
// not bound to any node that have not terminated (candidates for pending).
// Pods that have terminated hold no resources and are left out.
func (b *Builder) Build(nodes []*apiv1.Node, pods []*apiv1.Pod) (*Snapshot, []*apiv1.Pod, Stats) {
	b.epoch++
	e := b.epoch
	var st Stats
	b.seeNodes(nodes, e)
	unbound, bound := b.seePods(pods, e)
	st.Pods = bound
	b.dropGonePods(e)
	b.dropGoneNodes(e)
	b.sortNodes(len(nodes))
	dirty := b.dirtyNodes()
	b.rebuild(dirty)
	st.RebuiltNodes = len(dirty)
	infos := make([]fwk.NodeInfo, len(b.order))
	lists := make([][]*apiv1.Pod, len(b.order))
	for i, ne := range b.order {
		infos[i], lists[i] = ne.info, ne.list
	}
	st.Nodes = len(infos)
	s := New(infos, b.gpu)
	s.pods = lists
	return s, unbound, st
}

// seeNodes marks the nodes listed seen in Build e: a new node, or a
// changed one, is dirty; a node new to the order drops it.
func (b *Builder) seeNodes(nodes []*apiv1.Node, e uint64) {
	for _, n := range nodes {
		ne := b.nodes[n.Name]
		if ne == nil {
			ne = &nodeEntry{name: n.Name, dirty: true}
			b.nodes[n.Name] = ne
			b.order = nil
		} else if ne.node == nil {
			b.order = nil
		}
		if ne.node != n {
			ne.node = n
			ne.dirty = true
		}
		ne.seen = e
	}
}

// seePods marks the pods listed seen in Build e, indexing the new ones;
// it returns the unbound pods not terminated, and how many are bound.
func (b *Builder) seePods(pods []*apiv1.Pod, e uint64) (unbound []*apiv1.Pod, bound int) {
	for _, p := range pods {
		slot, ok := b.index[p]
		if !ok {
			slot = b.add(p)
		}
		b.seen[slot] = e
		switch b.pods[slot].kind {
		case podBound:
			bound++
		case podUnbound:
			unbound = append(unbound, p)
		}
	}
	return unbound, bound
}

// dropGonePods forgets the pods Build e did not list.
func (b *Builder) dropGonePods(e uint64) {
	for slot, s := range b.seen {
		if s != e && b.pods[slot].pod != nil {
			b.remove(int32(slot))
		}
	}
}

// dropGoneNodes forgets the nodes Build e did not list (kept, without
// node, while pods are bound to them).
func (b *Builder) dropGoneNodes(e uint64) {
	for name, ne := range b.nodes {
		if ne.seen != e && ne.node != nil {
			ne.node, ne.info, ne.list = nil, nil, nil
			b.order = nil
		}
		if ne.node == nil && len(ne.pods) == 0 {
			delete(b.nodes, name)
		}
	}
}

// sortNodes orders the nodes by name again when the set changed.
func (b *Builder) sortNodes(capacity int) {
	if b.order != nil {
		return
	}
	b.order = make([]*nodeEntry, 0, capacity)
	for _, ne := range b.nodes {
		if ne.node != nil {
			b.order = append(b.order, ne)
		}
	}
	sort.Slice(b.order, func(i, j int) bool { return b.order[i].name < b.order[j].name })
}

// dirtyNodes are the nodes whose NodeInfo must be built.
func (b *Builder) dirtyNodes() []*nodeEntry {
	var dirty []*nodeEntry
	for _, ne := range b.order {
		if ne.dirty || ne.info == nil {
			dirty = append(dirty, ne)
		}
	}
	return dirty
}

// add indexes a pod object not seen before and returns its slot.
func (b *Builder) add(p *apiv1.Pod) int32 {
	var slot int32
	if n := len(b.free); n > 0 {
		slot, b.free = b.free[n-1], b.free[:n-1]
	} else {
		slot = int32(len(b.pods))
		b.pods = append(b.pods, podEntry{})
		b.seen = append(b.seen, 0)
	}
	b.index[p] = slot
	pe := &b.pods[slot]
	*pe = podEntry{pod: p}
	switch {
	case p.Status.Phase == apiv1.PodSucceeded || p.Status.Phase == apiv1.PodFailed:
		pe.kind = podTerminal
	case p.Spec.NodeName == "":
		pe.kind = podUnbound
	default:
		pe.kind = podBound
		ne := b.nodes[p.Spec.NodeName]
		if ne == nil {
			// Bound to a node the cache has not seen (yet): keep it so the
			// node starts with its pods when it appears.
			ne = &nodeEntry{name: p.Spec.NodeName}
			b.nodes[p.Spec.NodeName] = ne
		}
		pe.node, pe.at = ne, len(ne.pods)
		ne.pods = append(ne.pods, slot)
		ne.dirty = true
	}
	return slot
}

// remove forgets the pod in slot, taking it off its node.
func (b *Builder) remove(slot int32) {
	pe := &b.pods[slot]
	if ne := pe.node; ne != nil {
		last := len(ne.pods) - 1
		moved := ne.pods[last]
		ne.pods[pe.at] = moved
		b.pods[moved].at = pe.at
		ne.pods = ne.pods[:last]
		ne.dirty = true
	}
	delete(b.index, pe.pod)
	*pe = podEntry{}
	b.free = append(b.free, slot)
}

// rebuild builds the NodeInfos of the nodes, on several goroutines when
// there are many. Each pod is on one node, so the goroutines share no
// entry.
func (b *Builder) rebuild(nodes []*nodeEntry) {
	workers := min(b.workers, len(nodes)/parallelMin)
	if workers <= 1 {
		shared := sharedResources{}
		for _, ne := range nodes {
			b.build(ne, shared)
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (len(nodes) + workers - 1) / workers
	for start := 0; start < len(nodes); start += chunk {
		part := nodes[start:min(start+chunk, len(nodes))]
		wg.Go(func() {
			shared := sharedResources{}
			for _, ne := range part {
				b.build(ne, shared)
			}
		})
	}
	wg.Wait()
}

func (b *Builder) build(ne *nodeEntry, shared sharedResources) {
	ni := NewNodeInfo(ne.node)
	list := make([]*apiv1.Pod, len(ne.pods))
	for i, slot := range ne.pods {
		pe := &b.pods[slot]
		if pe.info == nil {
			pe.info = shared.podInfo(pe.pod)
		}
		ni.AddPodInfo(pe.info)
		list[i] = pe.pod
	}
	ne.info, ne.list, ne.dirty = ni, list, false
}
