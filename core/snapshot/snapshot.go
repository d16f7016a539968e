// Package snapshot holds the cluster as the scheduler framework sees it: one
// NodeInfo per node with the pods bound to it. A Snapshot is immutable for a
// loop; simulations write to a Fork, which clones a NodeInfo only when it
// first changes (copy-on-write), so a fork of a 7,500-node snapshot costs a
// slice copy.
package snapshot

import (
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedframework "k8s.io/kubernetes/pkg/scheduler/framework"
)

// Free is a node's unrequested capacity in the units the scheduler's
// NodeResourcesFit plugin compares.
type Free struct {
	MilliCPU         int64
	Memory           int64
	EphemeralStorage int64
	Pods             int64
	// GPU is the free count of the configured GPU resource.
	GPU int64
}

// Snapshot is an immutable set of NodeInfos.
type Snapshot struct {
	nodes []fwk.NodeInfo
	free  []Free
	index map[string]int
	gpu   apiv1.ResourceName
	// pods[i] is the pod objects of nodes[i] when the Builder made the
	// snapshot (kept between loops for nodes that did not change).
	pods [][]*apiv1.Pod
}

// New builds a snapshot from NodeInfos (which it does not copy: callers must
// not change them afterwards). gpu names the GPU resource tracked in Free.
func New(nodes []fwk.NodeInfo, gpu apiv1.ResourceName) *Snapshot {
	s := &Snapshot{nodes: nodes, free: make([]Free, len(nodes)), index: make(map[string]int, len(nodes)), gpu: gpu}
	for i, n := range nodes {
		s.index[n.Node().Name] = i
		s.free[i] = FreeOf(n, gpu)
	}
	return s
}

// Len is the number of nodes.
func (s *Snapshot) Len() int { return len(s.nodes) }

// NodeInfo returns node i.
func (s *Snapshot) NodeInfo(i int) fwk.NodeInfo { return s.nodes[i] }

// Pods returns the pod objects bound to node i. The slice is shared (with
// later snapshots too): callers must not change it.
func (s *Snapshot) Pods(i int) []*apiv1.Pod {
	if s.pods != nil {
		return s.pods[i]
	}
	infos := s.nodes[i].GetPods()
	out := make([]*apiv1.Pod, len(infos))
	for k, pi := range infos {
		out[k] = pi.GetPod()
	}
	return out
}

// Index returns the position of a node by name.
func (s *Snapshot) Index(name string) (int, bool) {
	i, ok := s.index[name]
	return i, ok
}

// FreeOf computes the free capacity of a NodeInfo.
func FreeOf(n fwk.NodeInfo, gpu apiv1.ResourceName) Free {
	a, r := n.GetAllocatable(), n.GetRequested()
	f := Free{
		MilliCPU:         a.GetMilliCPU() - r.GetMilliCPU(),
		Memory:           a.GetMemory() - r.GetMemory(),
		EphemeralStorage: a.GetEphemeralStorage() - r.GetEphemeralStorage(),
		Pods:             int64(a.GetAllowedPodNumber() - len(n.GetPods())),
	}
	if gpu != "" {
		f.GPU = a.GetScalarResources()[gpu] - r.GetScalarResources()[gpu]
	}
	return f
}

// Fork is a writable view of a Snapshot. It implements the scheduler
// framework's SharedLister. A Fork is not safe for concurrent use.
type Fork struct {
	base  *Snapshot
	nodes []fwk.NodeInfo
	free  []Free
	owned []bool
	added map[string]int
	gpu   apiv1.ResourceName
	lists *affinityLists
}

type affinityLists struct {
	affinity, antiAffinity []fwk.NodeInfo
}

// Fork returns a writable view of the snapshot.
func (s *Snapshot) Fork() *Fork {
	f := &Fork{
		base:  s,
		nodes: append(make([]fwk.NodeInfo, 0, len(s.nodes)+16), s.nodes...),
		free:  append(make([]Free, 0, len(s.free)+16), s.free...),
		owned: make([]bool, len(s.nodes), len(s.nodes)+16),
		gpu:   s.gpu,
	}
	return f
}

// Fork returns a writable view of this fork's current state. The parent must
// not be changed while the child is in use.
func (f *Fork) Fork() *Fork {
	c := &Fork{
		base:  f.base,
		nodes: append(make([]fwk.NodeInfo, 0, len(f.nodes)+16), f.nodes...),
		free:  append(make([]Free, 0, len(f.free)+16), f.free...),
		owned: make([]bool, len(f.nodes), len(f.nodes)+16),
		gpu:   f.gpu,
		lists: f.lists,
	}
	if len(f.added) > 0 {
		c.added = make(map[string]int, len(f.added))
		for k, v := range f.added {
			c.added[k] = v
		}
	}
	return c
}

// Len is the number of nodes, template nodes included.
func (f *Fork) Len() int { return len(f.nodes) }

// NodeInfo returns node i.
func (f *Fork) NodeInfo(i int) fwk.NodeInfo { return f.nodes[i] }

// Free returns node i's free capacity.
func (f *Fork) Free(i int) Free { return f.free[i] }

// Index returns a node's position by name.
func (f *Fork) Index(name string) (int, bool) {
	if i, ok := f.base.index[name]; ok {
		return i, true
	}
	i, ok := f.added[name]
	return i, ok
}

// AddNode adds a node (for example a template node) and returns its position.
// The fork owns the NodeInfo from then on.
func (f *Fork) AddNode(n fwk.NodeInfo) (int, error) {
	name := n.Node().Name
	if _, ok := f.Index(name); ok {
		return 0, fmt.Errorf("node %s is already in the snapshot", name)
	}
	if f.added == nil {
		f.added = map[string]int{}
	}
	i := len(f.nodes)
	f.nodes = append(f.nodes, n)
	f.free = append(f.free, FreeOf(n, f.gpu))
	f.owned = append(f.owned, true)
	f.added[name] = i
	if len(n.GetPodsWithAffinity()) > 0 || len(n.GetPodsWithRequiredAntiAffinity()) > 0 {
		f.lists = nil
	}
	return i, nil
}

// RemoveLastNode removes the most recently added node; it is how an
// estimator gives back a template node it could not use.
func (f *Fork) RemoveLastNode() {
	i := len(f.nodes) - 1
	if i < f.base.Len() {
		return
	}
	n := f.nodes[i]
	delete(f.added, n.Node().Name)
	f.nodes = f.nodes[:i]
	f.free = f.free[:i]
	f.owned = f.owned[:i]
	if len(n.GetPodsWithAffinity()) > 0 || len(n.GetPodsWithRequiredAntiAffinity()) > 0 {
		f.lists = nil
	}
}

// AddPod places a pod on node i. podInfo must be built for pod.
func (f *Fork) AddPod(i int, podInfo fwk.PodInfo) {
	if !f.owned[i] {
		f.nodes[i] = f.nodes[i].Snapshot()
		f.owned[i] = true
	}
	n := f.nodes[i]
	n.AddPodInfo(podInfo)
	f.free[i] = FreeOf(n, f.gpu)
	pi := podInfo.GetPod()
	if pi.Spec.Affinity != nil && (pi.Spec.Affinity.PodAffinity != nil || pi.Spec.Affinity.PodAntiAffinity != nil) {
		f.lists = nil
	}
}

// RemovePods takes the pods matching drop off node i (copy on write) and
// returns how many went: balloons' room is free to real pods, because the
// scheduler will preempt them.
func (f *Fork) RemovePods(i int, drop func(*apiv1.Pod) bool) int {
	var gone []*apiv1.Pod
	for _, pi := range f.nodes[i].GetPods() {
		if p := pi.GetPod(); drop(p) {
			gone = append(gone, p)
		}
	}
	if len(gone) == 0 {
		return 0
	}
	if !f.owned[i] {
		f.nodes[i] = f.nodes[i].Snapshot()
		f.owned[i] = true
	}
	n := f.nodes[i]
	for _, p := range gone {
		// The pod is on the node by construction; an error would mean a
		// corrupt NodeInfo, and the pod then simply stays.
		_ = n.RemovePod(klog.Background(), p)
	}
	f.free[i] = FreeOf(n, f.gpu)
	f.lists = nil
	return len(gone)
}

// Freeze returns the fork's current state as a Snapshot, for the rest of
// a loop to see pods the fork placed (capacity booked by provisioning
// requests) as the cluster's. Nodes the fork never changed, and their pod
// lists, are shared with the base. A fork with added nodes (templates)
// cannot be frozen. The fork must not be changed afterwards.
func (f *Fork) Freeze() (*Snapshot, error) {
	if len(f.added) > 0 {
		return nil, fmt.Errorf("freezing a snapshot fork: %d added nodes (templates) are not part of the cluster", len(f.added))
	}
	base := f.base
	s := &Snapshot{nodes: f.nodes, free: f.free, index: base.index, gpu: f.gpu}
	if base.pods != nil {
		s.pods = make([][]*apiv1.Pod, len(f.nodes))
		for i, n := range f.nodes {
			if n == base.nodes[i] {
				s.pods[i] = base.pods[i]
				continue
			}
			infos := n.GetPods()
			pods := make([]*apiv1.Pod, len(infos))
			for k, pi := range infos {
				pods[k] = pi.GetPod()
			}
			s.pods[i] = pods
		}
	}
	return s, nil
}

// --- fwk.SharedLister ---

// NodeInfos implements fwk.SharedLister.
func (f *Fork) NodeInfos() fwk.NodeInfoLister { return (*nodeInfoLister)(f) }

// StorageInfos implements fwk.SharedLister.
func (f *Fork) StorageInfos() fwk.StorageInfoLister { return (*storageInfoLister)(f) }

// PodGroupStates implements fwk.SharedLister. Pod-group scheduling state is
// the scheduler's own; the simulation has none.
func (f *Fork) PodGroupStates() fwk.PodGroupStateLister { return noPodGroupStates{} }

type nodeInfoLister Fork

func (l *nodeInfoLister) List() ([]fwk.NodeInfo, error) { return l.nodes, nil }

func (l *nodeInfoLister) affinityLists() *affinityLists {
	if l.lists == nil {
		al := &affinityLists{}
		for _, n := range l.nodes {
			if len(n.GetPodsWithAffinity()) > 0 {
				al.affinity = append(al.affinity, n)
			}
			if len(n.GetPodsWithRequiredAntiAffinity()) > 0 {
				al.antiAffinity = append(al.antiAffinity, n)
			}
		}
		l.lists = al
	}
	return l.lists
}

func (l *nodeInfoLister) HavePodsWithAffinityList() ([]fwk.NodeInfo, error) {
	return l.affinityLists().affinity, nil
}

func (l *nodeInfoLister) HavePodsWithRequiredAntiAffinityList() ([]fwk.NodeInfo, error) {
	return l.affinityLists().antiAffinity, nil
}

func (l *nodeInfoLister) Get(name string) (fwk.NodeInfo, error) {
	if i, ok := (*Fork)(l).Index(name); ok {
		return l.nodes[i], nil
	}
	return nil, fmt.Errorf("node %q not found in snapshot", name)
}

type storageInfoLister Fork

func (l *storageInfoLister) IsPVCUsedByPods(key string) bool {
	for _, n := range l.nodes {
		if n.GetPVCRefCounts()[key] > 0 {
			return true
		}
	}
	return false
}

type noPodGroupStates struct{}

func (noPodGroupStates) Get(namespace, name string) (fwk.PodGroupState, error) {
	return nil, fmt.Errorf("pod group %s/%s: no pod-group state in a simulation", namespace, name)
}

// NewNodeInfo builds a NodeInfo for a node and its pods.
func NewNodeInfo(node *apiv1.Node, pods ...*apiv1.Pod) *schedframework.NodeInfo {
	ni := schedframework.NewNodeInfo(pods...)
	ni.SetNode(node)
	return ni
}
