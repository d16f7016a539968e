package snapshot

import (
	"sort"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
)

// Builder turns the informer caches' nodes and pods into a Snapshot, loop
// after loop, doing work only for what changed. Informer stores replace an
// object's pointer on every update, so an unchanged pointer means an
// unchanged object: a steady loop over 200,000 pods is a pass of map
// lookups, and only nodes whose node or pods changed get a new NodeInfo.
// A Builder is not safe for concurrent use.
type Builder struct {
	gpu   apiv1.ResourceName
	epoch uint64
	nodes map[string]*nodeEntry
	pods  map[types.UID]*podEntry
	// order is the node names of the last snapshot, sorted; nil when the set changed.
	order []string
}

type nodeEntry struct {
	node  *apiv1.Node
	pods  map[types.UID]*apiv1.Pod
	info  fwk.NodeInfo
	dirty bool
	seen  uint64
}

type podEntry struct {
	pod  *apiv1.Pod
	node string
	seen uint64
}

// NewBuilder returns a Builder tracking gpu as the GPU resource.
func NewBuilder(gpu apiv1.ResourceName) *Builder {
	return &Builder{gpu: gpu, nodes: map[string]*nodeEntry{}, pods: map[types.UID]*podEntry{}}
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
	for _, n := range nodes {
		ne := b.nodes[n.Name]
		if ne == nil {
			ne = &nodeEntry{pods: map[types.UID]*apiv1.Pod{}, dirty: true}
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
	var unbound []*apiv1.Pod
	for _, p := range pods {
		if p.Status.Phase == apiv1.PodSucceeded || p.Status.Phase == apiv1.PodFailed {
			continue
		}
		if p.Spec.NodeName == "" {
			unbound = append(unbound, p)
			continue
		}
		st.Pods++
		pe := b.pods[p.UID]
		if pe != nil && pe.pod == p {
			pe.seen = e
			continue
		}
		if pe != nil {
			b.unbindLocked(pe)
		} else {
			pe = &podEntry{}
			b.pods[p.UID] = pe
		}
		pe.pod, pe.node, pe.seen = p, p.Spec.NodeName, e
		ne := b.nodes[p.Spec.NodeName]
		if ne == nil {
			// Bound to a node the cache has not seen (yet): keep it so the
			// node starts with its pods when it appears.
			ne = &nodeEntry{pods: map[types.UID]*apiv1.Pod{}}
			b.nodes[p.Spec.NodeName] = ne
		}
		ne.pods[p.UID] = p
		ne.dirty = true
	}
	for uid, pe := range b.pods {
		if pe.seen != e {
			b.unbindLocked(pe)
			delete(b.pods, uid)
		}
	}
	for name, ne := range b.nodes {
		if ne.seen != e && ne.node != nil {
			ne.node, ne.info = nil, nil
			b.order = nil
		}
		if ne.node == nil && len(ne.pods) == 0 {
			delete(b.nodes, name)
		}
	}
	if b.order == nil {
		b.order = make([]string, 0, len(nodes))
		for name, ne := range b.nodes {
			if ne.node != nil {
				b.order = append(b.order, name)
			}
		}
		sort.Strings(b.order)
	}
	infos := make([]fwk.NodeInfo, len(b.order))
	for i, name := range b.order {
		ne := b.nodes[name]
		if ne.dirty || ne.info == nil {
			ni := NewNodeInfo(ne.node)
			for _, p := range ne.pods {
				ni.AddPod(p)
			}
			ne.info = ni
			ne.dirty = false
			st.RebuiltNodes++
		}
		infos[i] = ne.info
	}
	st.Nodes = len(infos)
	return New(infos, b.gpu), unbound, st
}

func (b *Builder) unbindLocked(pe *podEntry) {
	if ne := b.nodes[pe.node]; ne != nil {
		delete(ne.pods, pe.pod.UID)
		ne.dirty = true
	}
}
