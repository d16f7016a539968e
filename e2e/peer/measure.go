package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// watcher follows the workload's pods and the nodes through informers (one
// LIST and WATCH each), and NodeClaims when asked.
type watcher struct {
	stopCh chan struct{}

	mu             sync.Mutex
	phase          map[types.UID]apiv1.PodPhase
	running        int
	nodes          map[string]bool
	firstNodeClaim time.Time
	nodeClaims     int
	// target is the pods to wait for; allAt when the informer first saw
	// that many Running (the event's time, not the next sample's).
	target int
	allAt  time.Time
}

func watch(ctx context.Context, cfg *rest.Config, ns string, nodeClaims bool) (*watcher, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	w := &watcher{stopCh: make(chan struct{}), phase: map[types.UID]apiv1.PodPhase{}, nodes: map[string]bool{}}
	all := informers.NewSharedInformerFactory(c, 0)
	inNS := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	nodes := all.Core().V1().Nodes().Informer()
	pods := inNS.Core().V1().Pods().Informer()
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.node(obj, true) },
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
	synced := []cache.InformerSynced{nodes.HasSynced, pods.HasSynced}
	all.Start(w.stopCh)
	inNS.Start(w.stopCh)
	if nodeClaims {
		dc, err := dynamic.NewForConfig(rest.CopyConfig(cfg))
		if err != nil {
			w.stop()
			return nil, err
		}
		df := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
		claims := df.ForResource(nodeClaimGVR).Informer()
		if _, err := claims.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { w.nodeClaim() }}); err != nil {
			w.stop()
			return nil, err
		}
		df.Start(w.stopCh)
		synced = append(synced, claims.HasSynced)
	}
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
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
	p, ok := obj.(*apiv1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.phase[p.UID] == apiv1.PodRunning {
		w.running--
	}
	w.phase[p.UID] = p.Status.Phase
	if p.Status.Phase == apiv1.PodRunning {
		w.running++
	}
	if w.target > 0 && w.running >= w.target && w.allAt.IsZero() {
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
	if w.phase[uid] == apiv1.PodRunning {
		w.running--
	}
	delete(w.phase, uid)
}

// counts returns the workload's pods Running and the nodes.
func (w *watcher) counts() (running, nodes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.running, len(w.nodes)
}

// claims returns the NodeClaims seen and when the first was.
func (w *watcher) claims() (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nodeClaims, w.firstNodeClaim
}

// usage is a process's peak resident memory (VmHWM) and CPU time (user +
// system), from /proc.
type usage struct {
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	CPUSeconds float64 `json:"cpuSeconds"`
}

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTicks = 100

func procUsage(pid int) (usage, error) {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return usage{}, err
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return usage{}, err
	}
	return parseProc(string(status), string(stat))
}

func parseProc(status, stat string) (usage, error) {
	var u usage
	found := false
	for line := range strings.Lines(status) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return u, fmt.Errorf("/proc status: VmHWM: unexpected %q", strings.TrimSpace(rest))
			}
			kb, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return u, fmt.Errorf("/proc status: VmHWM: %w", err)
			}
			u.PeakRSSMiB, found = kb/1024, true
		}
	}
	if !found {
		return u, fmt.Errorf("/proc status: no VmHWM line")
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return u, fmt.Errorf("/proc stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return u, fmt.Errorf("/proc stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks float64
	for _, s := range f[11:13] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return u, fmt.Errorf("/proc stat: CPU time %q: %w", s, err)
		}
		ticks += v
	}
	u.CPUSeconds = ticks / clockTicks
	return u, nil
}

// scrapeURL reads a Prometheus text endpoint.
func scrapeURL(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return fams, nil
}

// sum adds up every series of a counter (or gauge, or untyped).
func sum(fams map[string]*dto.MetricFamily, name string) float64 {
	total := 0.0
	for _, m := range fams[name].GetMetric() {
		switch {
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Untyped != nil:
			total += m.GetUntyped().GetValue()
		}
	}
	return total
}

// clientRequestMetrics are the names processes export client-go's
// request-result hook (metrics.RequestResult, one increment per request
// sent; a watch counts once, when it starts) under: component-base's and
// this autoscaler's, and awslabs/operatorpkg's (Karpenter's).
var clientRequestMetrics = []string{"rest_client_requests_total", "client_go_request_total"}

// clientRequests is every request a process's Kubernetes clients sent.
func clientRequests(ctx context.Context, metricsURL string) (float64, error) {
	fams, err := scrapeURL(ctx, metricsURL)
	if err != nil {
		return 0, err
	}
	return requestsOf(fams, metricsURL)
}

func requestsOf(fams map[string]*dto.MetricFamily, source string) (float64, error) {
	for _, name := range clientRequestMetrics {
		if _, ok := fams[name]; ok {
			return sum(fams, name), nil
		}
	}
	return 0, fmt.Errorf("%s has none of %s", source, strings.Join(clientRequestMetrics, ", "))
}

// apiServerRequests is the API server's apiserver_request_total: every
// request it served, from every client.
func apiServerRequests(ctx context.Context, c kubernetes.Interface) (float64, error) {
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	fams, err := parseMetrics(strings.NewReader(string(raw)))
	if err != nil {
		return 0, err
	}
	return sum(fams, "apiserver_request_total"), nil
}
