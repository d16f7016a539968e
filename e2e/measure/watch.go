package measure

import (
	"context"
	"fmt"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Watcher is the informers Watch started; Stop stops them.
type Watcher struct {
	stopCh chan struct{}
}

// Informer starts one more informer beside Watch's, on cfg (Watch's
// client configuration) until stop is closed, and returns what says it
// has synced.
type Informer func(cfg *rest.Config, stop <-chan struct{}) (cache.InformerSynced, error)

// Watch follows every node and the pods of namespace ns through informers
// (one LIST and WATCH each, in protobuf, as a kubelet-free observer costs
// the API server), handing their events to nodes and pods, and starts the
// more informers after them. It returns once all have synced, or an error
// when they have not within a minute (or ctx ended).
func Watch(ctx context.Context, cfg *rest.Config, ns string, nodes, pods cache.ResourceEventHandler, more ...Informer) (*Watcher, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the harness's client: %w", err)
	}
	w := &Watcher{stopCh: make(chan struct{})}
	synced, err := w.start(c, ns, nodes, pods)
	if err != nil {
		return nil, err
	}
	for _, start := range more {
		s, err := start(cfg, w.stopCh)
		if err != nil {
			w.Stop()
			return nil, err
		}
		synced = append(synced, s)
	}
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
		w.Stop()
		return nil, fmt.Errorf("the harness's informers did not sync")
	}
	return w, nil
}

// start starts the node and pod informers on c.
func (w *Watcher) start(c kubernetes.Interface, ns string, nodes, pods cache.ResourceEventHandler) ([]cache.InformerSynced, error) {
	all := informers.NewSharedInformerFactory(c, 0)
	inNS := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	nodeInformer := all.Core().V1().Nodes().Informer()
	podInformer := inNS.Core().V1().Pods().Informer()
	if _, err := nodeInformer.AddEventHandler(nodes); err != nil {
		return nil, err
	}
	if _, err := podInformer.AddEventHandler(pods); err != nil {
		return nil, err
	}
	all.Start(w.stopCh)
	inNS.Start(w.stopCh)
	return []cache.InformerSynced{nodeInformer.HasSynced, podInformer.HasSynced}, nil
}

// Stop stops the informers.
func (w *Watcher) Stop() { close(w.stopCh) }

// NodeName is the name of a node an informer handed over: the node, or the
// tombstone of one deleted (its key); "" for anything else.
func NodeName(obj any) string {
	switch o := obj.(type) {
	case *apiv1.Node:
		return o.Name
	case cache.DeletedFinalStateUnknown:
		return o.Key
	}
	return ""
}

// podUID is the UID of a pod an informer handed over, or of the pod in a
// tombstone; "" for anything else.
func podUID(obj any) types.UID {
	switch o := obj.(type) {
	case *apiv1.Pod:
		return o.UID
	case cache.DeletedFinalStateUnknown:
		if p, ok := o.Obj.(*apiv1.Pod); ok {
			return p.UID
		}
	}
	return ""
}

// Phases counts pods by their last phase seen, from a pod informer's
// events. The zero value is ready. It is not safe for concurrent use: its
// owner's lock guards it.
type Phases struct {
	phase map[types.UID]apiv1.PodPhase
	count map[apiv1.PodPhase]int
}

// Set records a pod added or updated, and says whether obj was a pod.
func (s *Phases) Set(obj any) bool {
	p, ok := obj.(*apiv1.Pod)
	if !ok {
		return false
	}
	if s.phase == nil {
		s.phase, s.count = map[types.UID]apiv1.PodPhase{}, map[apiv1.PodPhase]int{}
	}
	if old, ok := s.phase[p.UID]; ok {
		s.count[old]--
	}
	s.phase[p.UID] = p.Status.Phase
	s.count[p.Status.Phase]++
	return true
}

// Delete forgets a pod deleted (obj the pod, or its tombstone).
func (s *Phases) Delete(obj any) {
	uid := podUID(obj)
	if old, ok := s.phase[uid]; ok {
		s.count[old]--
		delete(s.phase, uid)
	}
}

// Count is the pods whose last phase seen is phase.
func (s *Phases) Count(phase apiv1.PodPhase) int { return s.count[phase] }
