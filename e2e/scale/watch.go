package main

import (
	"context"
	"sync"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
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
	*measure.Watcher

	mu       sync.Mutex
	phases   measure.Phases
	nodes    map[string]bool
	ready    map[string]bool
	series   []nodePoint
	joins    []time.Time
	removals []time.Time
}

func watch(ctx context.Context, cfg *rest.Config, ns string) (*watcher, error) {
	w := &watcher{nodes: map[string]bool{}, ready: map[string]bool{}}
	mw, err := measure.Watch(ctx, cfg, ns, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.node(obj, true) },
		UpdateFunc: func(_, obj any) { w.nodeReady(obj) },
		DeleteFunc: func(obj any) { w.node(obj, false) },
	}, cache.ResourceEventHandlerFuncs{
		AddFunc:    w.pod,
		UpdateFunc: func(_, obj any) { w.pod(obj) },
		DeleteFunc: w.podGone,
	})
	if err != nil {
		return nil, err
	}
	w.Watcher = mw
	return w, nil
}

func (w *watcher) node(obj any, added bool) {
	name := measure.NodeName(obj)
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
	w.mu.Lock()
	defer w.mu.Unlock()
	w.phases.Set(obj)
}

func (w *watcher) podGone(obj any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.phases.Delete(obj)
}

// pods returns the workload's running and pending pods.
func (w *watcher) pods() (running, pending int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.phases.Count(apiv1.PodRunning), w.phases.Count(apiv1.PodPending)
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
