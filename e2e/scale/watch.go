package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// nodePoint is the node count after a change.
type nodePoint struct {
	At time.Time
	N  int
}

// watcher follows nodes and the workload's pods through informers (one
// LIST and WATCH each, as a kubelet-free observer costs the API server), and
// records when nodes join and go.
type watcher struct {
	stopCh chan struct{}

	mu       sync.Mutex
	phase    map[types.UID]apiv1.PodPhase
	count    map[apiv1.PodPhase]int
	nodes    map[string]bool
	ready    map[string]bool
	series   []nodePoint
	joins    []time.Time
	removals []time.Time
}

func watch(ctx context.Context, cfg *rest.Config, ns string) (*watcher, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the harness's client: %w", err)
	}
	w := &watcher{stopCh: make(chan struct{}), phase: map[types.UID]apiv1.PodPhase{}, count: map[apiv1.PodPhase]int{}, nodes: map[string]bool{}, ready: map[string]bool{}}
	all := informers.NewSharedInformerFactory(c, 0)
	inNS := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	nodes := all.Core().V1().Nodes().Informer()
	pods := inNS.Core().V1().Pods().Informer()
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.node(obj, true) },
		UpdateFunc: func(_, obj any) { w.nodeReady(obj) },
		DeleteFunc: func(obj any) { w.node(obj, false) },
	}); err != nil {
		return nil, err
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.pod,
		UpdateFunc: func(_, obj any) { w.pod(obj) },
		DeleteFunc: w.podGone,
	}); err != nil {
		return nil, err
	}
	all.Start(w.stopCh)
	inNS.Start(w.stopCh)
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), nodes.HasSynced, pods.HasSynced) {
		w.stop()
		return nil, fmt.Errorf("the harness's informers did not sync")
	}
	return w, nil
}

func (w *watcher) stop() { close(w.stopCh) }

func (w *watcher) node(obj any, added bool) {
	name := ""
	switch o := obj.(type) {
	case *apiv1.Node:
		name = o.Name
	case cache.DeletedFinalStateUnknown:
		name = o.Key
	}
	if added {
		w.nodeReady(obj)
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !added {
		delete(w.ready, name)
	}
	if w.nodes[name] == added {
		return
	}
	if added {
		w.nodes[name] = true
		w.joins = append(w.joins, now)
	} else {
		delete(w.nodes, name)
		w.removals = append(w.removals, now)
	}
	w.series = append(w.series, nodePoint{At: now, N: len(w.nodes)})
}

// nodeReady records whether a node is Ready.
func (w *watcher) nodeReady(obj any) {
	n, ok := obj.(*apiv1.Node)
	if !ok {
		return
	}
	ready := false
	for _, c := range n.Status.Conditions {
		if c.Type == apiv1.NodeReady {
			ready = c.Status == apiv1.ConditionTrue
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if ready {
		w.ready[n.Name] = true
	} else {
		delete(w.ready, n.Name)
	}
}

// readyCount is the nodes whose Ready condition is True.
func (w *watcher) readyCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ready)
}

func (w *watcher) pod(obj any) {
	p, ok := obj.(*apiv1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.phase[p.UID]; ok {
		w.count[old]--
	}
	w.phase[p.UID] = p.Status.Phase
	w.count[p.Status.Phase]++
}

func (w *watcher) podGone(obj any) {
	var uid types.UID
	switch o := obj.(type) {
	case *apiv1.Pod:
		uid = o.UID
	case cache.DeletedFinalStateUnknown:
		if p, ok := o.Obj.(*apiv1.Pod); ok {
			uid = p.UID
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.phase[uid]; ok {
		w.count[old]--
		delete(w.phase, uid)
	}
}

// pods returns the workload's running and pending pods.
func (w *watcher) pods() (running, pending int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count[apiv1.PodRunning], w.count[apiv1.PodPending]
}

func (w *watcher) nodeCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.nodes)
}

func (w *watcher) nodeSeries() []nodePoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]nodePoint(nil), w.series...)
}

func (w *watcher) joinTimes() []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Time(nil), w.joins...)
}

func (w *watcher) firstRemovalAfter(t time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.removals {
		if r.After(t) {
			return r
		}
	}
	return time.Time{}
}
