package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// watcher follows the workload's pods and the nodes through informers (one
// LIST and WATCH each), and NodeClaims when asked.
type watcher struct {
	*measure.Watcher

	mu             sync.Mutex
	phases         measure.Phases
	nodes          map[string]bool
	firstNodeClaim time.Time
	nodeClaims     int
	// target is the pods to wait for; allAt when the informer first saw
	// that many Running (the event's time, not the next sample's).
	target int
	allAt  time.Time
}

func watch(ctx context.Context, cfg *rest.Config, ns string, nodeClaims bool) (*watcher, error) {
	w := &watcher{nodes: map[string]bool{}}
	var more []measure.Informer
	if nodeClaims {
		more = append(more, w.watchNodeClaims)
	}
	mw, err := measure.Watch(ctx, cfg, ns, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.node(obj, true) },
		DeleteFunc: func(obj any) { w.node(obj, false) },
	}, cache.ResourceEventHandlerFuncs{
		AddFunc:    w.pod,
		UpdateFunc: func(_, obj any) { w.pod(obj) },
		DeleteFunc: w.podGone,
	}, more...)
	if err != nil {
		return nil, err
	}
	w.Watcher = mw
	return w, nil
}

// watchNodeClaims starts an informer on Karpenter's NodeClaims.
func (w *watcher) watchNodeClaims(cfg *rest.Config, stop <-chan struct{}) (cache.InformerSynced, error) {
	dc, err := dynamic.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return nil, err
	}
	df := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	claims := df.ForResource(nodeClaimGVR).Informer()
	if _, err := claims.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { w.nodeClaim() }}); err != nil {
		return nil, err
	}
	df.Start(stop)
	return claims.HasSynced, nil
}

func (w *watcher) node(obj any, added bool) {
	name := measure.NodeName(obj)
	w.mu.Lock()
	defer w.mu.Unlock()
	if added {
		w.nodes[name] = true
	} else {
		delete(w.nodes, name)
	}
}

func (w *watcher) nodeClaim() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.nodeClaims == 0 {
		w.firstNodeClaim = time.Now()
	}
	w.nodeClaims++
}

func (w *watcher) pod(obj any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.phases.Set(obj) {
		return
	}
	if w.target > 0 && w.phases.Count(apiv1.PodRunning) >= w.target && w.allAt.IsZero() {
		w.allAt = time.Now()
	}
}

// expect sets the pods to wait for.
func (w *watcher) expect(pods int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.target = pods
}

// allRunning returns when the target was first all Running, or zero.
func (w *watcher) allRunning() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.allAt
}

func (w *watcher) podGone(obj any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.phases.Delete(obj)
}

// counts returns the workload's pods Running and the nodes.
func (w *watcher) counts() (running, nodes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.phases.Count(apiv1.PodRunning), len(w.nodes)
}

// claims returns the NodeClaims seen and when the first was.
func (w *watcher) claims() (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nodeClaims, w.firstNodeClaim
}

// clientRequestMetrics are the names processes export client-go's
// request-result hook (metrics.RequestResult, one increment per request
// sent; a watch counts once, when it starts) under: component-base's and
// this autoscaler's, and awslabs/operatorpkg's (Karpenter's).
var clientRequestMetrics = []string{"rest_client_requests_total", "client_go_request_total"}

// clientRequests is every request a process's Kubernetes clients sent.
func clientRequests(ctx context.Context, metricsURL string) (float64, error) {
	fams, err := measure.Scrape(ctx, metricsURL)
	if err != nil {
		return 0, err
	}
	return requestsOf(fams, metricsURL)
}

func requestsOf(fams map[string]*dto.MetricFamily, source string) (float64, error) {
	for _, name := range clientRequestMetrics {
		if _, ok := fams[name]; ok {
			return measure.Sum(fams, name, nil), nil
		}
	}
	return 0, fmt.Errorf("%s has none of %s", source, strings.Join(clientRequestMetrics, ", "))
}

// apiServerRequests is the API server's apiserver_request_total: every
// request it served, from every client.
func apiServerRequests(ctx context.Context, c kubernetes.Interface) (float64, error) {
	fams, err := measure.APIServerMetrics(ctx, c)
	if err != nil {
		return 0, err
	}
	return measure.Sum(fams, "apiserver_request_total", nil), nil
}
