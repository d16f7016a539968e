package app

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// lead runs the loop while this replica leads: the informers started and
// synced, the flags ConfigMap read, then the loop until ctx ends.
func (a *app) lead(ctx context.Context) {
	c, logger := a.c, a.logger
	a.liveness.setLeader(true)
	a.startInformers()
	logger.Info("Waiting for informer caches")
	for typ, ok := range a.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			logger.Error(nil, "Informer cache did not sync", "type", typ.String())
			return
		}
	}
	a.configMaps.WaitForCacheSync(ctx.Done())
	a.readConfig(ctx)
	a.balloonFactory.WaitForCacheSync(ctx.Done())
	if a.dynFactory != nil {
		a.dynFactory.WaitForCacheSync(ctx.Done())
	}
	if a.provReqs != nil && !cache.WaitForCacheSync(ctx.Done(), a.provReqs.Informer().HasSynced) {
		logger.Error(nil, "ProvisioningRequest informer cache did not sync")
		return
	}
	if a.buffers != nil && !cache.WaitForCacheSync(ctx.Done(), a.buffers.Informer().HasSynced) {
		logger.Error(nil, "CapacityBuffer informer cache did not sync")
		return
	}
	if c.core.NodeAdditionAdaptive && c.apiserverMetricsInterval > 0 {
		go watchFlowControl(ctx, a.client.CoreV1().RESTClient(), c.apiserverMetricsInterval, a.observer, a.readable)
	}
	logger.Info("Starting autoscaler loop", "scanInterval", c.core.ScanInterval, "cloudProvider", a.provider.Name(),
		"nodeGroups", len(a.provider.NodeGroups()))
	a.autoscaler.Run(ctx, a.loopDone)
}

// elect runs leader election (the Lease --leader-elect-resource-name) and
// leads while it holds the lease; it returns when ctx ends (the lease
// released), when the lease is lost (an error: the replica exits, to be
// restarted as a clean standby) or when a listener fails.
func (a *app) elect(ctx context.Context) error {
	c, logger := a.c, a.logger
	id, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("reading hostname for the leader election identity: %w", err)
	}
	id = fmt.Sprintf("%s_%d", id, os.Getpid())
	// The lease has a client of its own, as kube-scheduler's and
	// kube-controller-manager's do: on the loop's client, a burst of
	// events and taints (thousands of empty nodes at once) spent its rate
	// and the renewal waited past --leader-elect-renew-deadline: the
	// leader lost its lease and exited (the scale harness, 6,500 nodes).
	leCfg := rest.CopyConfig(a.restCfg)
	leCfg.QPS, leCfg.Burst = leaderElectionQPS, leaderElectionBurst
	leClient, err := kubernetes.NewForConfig(leCfg)
	if err != nil {
		return fmt.Errorf("building the leader election client: %w", err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.core.Namespace, Name: c.leaderElectResource},
		Client:     leClient.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id, EventRecorder: a.recorder},
	}
	lostLease := make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   c.leaseDuration,
		RenewDeadline:   c.renewDeadline,
		RetryPeriod:     c.retryPeriod,
		ReleaseOnCancel: true,
		Name:            c.leaderElectResource,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: a.lead,
			OnStoppedLeading: func() { a.liveness.setLeader(false); close(lostLease) },
			OnNewLeader: func(identity string) {
				logger.Info("Leader elected", "leader", identity, "self", identity == id)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("setting up leader election: %w", err)
	}
	logger.Info("Starting leader election", "lease", klog.KRef(c.core.Namespace, c.leaderElectResource), "identity", id)
	a.elector.Store(le)
	go le.Run(ctx)
	select {
	case <-ctx.Done():
		<-lostLease // released on cancel
		return nil
	case <-lostLease:
		// A replica that lost its lease must stop acting at once; exiting
		// lets the Deployment restart it as a clean standby.
		return fmt.Errorf("lost leader election lease %s/%s", c.core.Namespace, c.leaderElectResource)
	case err := <-a.srvErr:
		return err
	}
}

// watchFlowControl reads the API server's count of requests rejected by
// API Priority and Fairness every interval, for the adaptive rate. A
// failure (no RBAC for /metrics, say) leaves the signal unknown and is
// logged once until it recovers.
func watchFlowControl(ctx context.Context, rc rest.Interface, interval time.Duration, o *ratelimit.Observer, readable prometheus.Gauge) {
	logger := klog.FromContext(ctx)
	failing := false
	read := func() {
		body, err := rc.Get().AbsPath("/metrics").Stream(ctx)
		var total float64
		if err == nil {
			total, err = ratelimit.ParseRejected(body)
			_ = body.Close()
		}
		o.SetRejectedTotal(total, err)
		switch {
		case err != nil && !failing:
			logger.Error(err, "Reading the API server's /metrics for flow-control rejections; the adaptive rate goes on without that signal")
			readable.Set(0)
		case err == nil && failing:
			logger.Info("Reading the API server's /metrics again")
		}
		if err == nil {
			readable.Set(1)
		}
		failing = err != nil
	}
	read()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			read()
		}
	}
}
