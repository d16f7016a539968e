// Package app is the autoscaler command's wiring: configuration, clients,
// informers, the autoscaler, its servers and leader election, each a named
// step of Run, each a screen at most. cmd/vmss-autoscaler calls it; the
// loop itself is core's.
package app

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// The leader election client's rate: a renewal every few seconds, never
// behind the loop's requests.
const (
	leaderElectionQPS   = 5
	leaderElectionBurst = 10
)

// app is what Run's steps build, in order. Each step reads what the
// earlier ones set; undo holds what to stop when Run returns, run in
// reverse.
type app struct {
	args []string
	// configure
	c        *config
	flags    *pflag.FlagSet
	fallback string
	kf       *klogFlags
	prov     providerFlags
	logger   klog.Logger
	reg      *prometheus.Registry
	metrics  *core.Metrics
	readable prometheus.Gauge
	// clients
	provider  cloudprovider.CloudProvider
	restCfg   *rest.Config
	reviewCfg *rest.Config
	observer  *ratelimit.Observer
	client    kubernetes.Interface
	// informers
	factory        informers.SharedInformerFactory
	configMaps     *namedConfigMaps
	sim            *simulator.Simulator
	podInformer    cache.SharedIndexInformer
	listers        core.Listers
	balloonFactory informers.SharedInformerFactory
	balloons       *balloon.Controller
	gangs          gang.Lookup
	dynFactory     dynamicinformer.DynamicSharedInformerFactory
	provReqs       *provreq.Client
	buffers        *capacitybuffer.Client
	startInformers func()
	// autoscaler
	recorder   record.EventRecorder
	elector    atomic.Pointer[leaderelection.LeaderElector]
	autoscaler *core.Autoscaler
	liveness   *liveness
	// configReload: readConfig hands the flags ConfigMap to the reloader
	// once before the first loop; loopDone is told of every loop that
	// completed.
	readConfig func(context.Context)
	loopDone   func(context.Context)
	// servers
	srvErr <-chan error

	stopInformers context.CancelFunc
	undo          []func()
}

// Run configures and runs the autoscaler until ctx ends or leadership is
// lost.
func Run(ctx context.Context, args []string) error {
	ctx, stopInformers := context.WithCancel(ctx)
	a := &app{args: args, stopInformers: stopInformers, readConfig: func(context.Context) {}, loopDone: func(context.Context) {}}
	defer a.stop()
	a.onStop(stopInformers)
	for _, step := range []func(context.Context) error{
		a.configure,     // flags, the last good configuration, logs, metrics
		a.clients,       // the cloud provider, the Kubernetes clients
		a.informers,     // the caches the loop reads
		a.newAutoscaler, // events, status, the fence, the loop
		a.configReload,  // the live flags ConfigMap
		a.servers,       // /metrics and /healthz
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	if !a.c.leaderElect {
		go a.lead(ctx)
		select {
		case <-ctx.Done():
			return nil
		case err := <-a.srvErr:
			return err
		}
	}
	return a.elect(ctx)
}

// onStop adds f to what Run undoes when it returns (last added, first run).
func (a *app) onStop(f func()) { a.undo = append(a.undo, f) }

func (a *app) stop() {
	for i := len(a.undo) - 1; i >= 0; i-- {
		a.undo[i]()
	}
}
