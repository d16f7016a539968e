package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/trigger"
)

// newAutoscaler builds the loop: its event recorder, its status and
// safety store, the fence on its writes, and the liveness its /healthz
// serves.
func (a *app) newAutoscaler(ctx context.Context) error {
	c, client := a.c, a.client
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	a.onStop(broadcaster.Shutdown)
	a.recorder = broadcaster.NewRecorder(scheme.Scheme, apiv1.EventSource{Component: "vmss-autoscaler"})

	var status core.StatusWriter
	var safety core.SafetyStore
	if c.core.WriteStatusConfigMap {
		w := &core.ConfigMapStatusWriter{Client: client.CoreV1(), Namespace: c.core.Namespace, Name: c.core.StatusConfigMapName}
		status, safety = w, w
	}
	deps := core.Deps{
		Options: c.core, Provider: a.provider, Listers: a.listers, Simulator: a.sim,
		Recorder: a.recorder, Status: status, Safety: safety, Metrics: a.metrics,
		Actions: &actuation.KubeNodeActions{Client: client}, Pods: actuation.KubePods{Client: client, Indexer: a.podInformer.GetIndexer()},
		APIServer: a.observer, Balloons: a.balloons, Gangs: a.gangs,
		Fence: a.fence(),
	}
	if a.provReqs != nil {
		deps.ProvisioningRequests = a.provReqs
	}
	if a.buffers != nil {
		deps.CapacityBuffers = a.buffers
	}
	autoscaler, err := core.New(deps)
	if err != nil {
		return err
	}
	if err := wakeOnEvents(a.factory, autoscaler); err != nil {
		return err
	}
	a.autoscaler = autoscaler
	if a.fallback != "" {
		a.metrics.ConfigFallback.Set(1)
		autoscaler.SetConfigFallback(a.fallback)
		if c.configMap != "" {
			a.recorder.Event(&apiv1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: c.core.Namespace, Name: c.configMap},
				apiv1.EventTypeWarning, eventConfigFallback, "started on a fallback configuration: "+a.fallback)
		}
	}
	a.liveness = newLiveness(c.maxInactivity, c.maxFailingTime, autoscaler.LastSuccess, autoscaler.LastRun)
	return nil
}

// fence is the loop's fence: with leader election, this replica acts, and
// writes to the cloud, only while it holds the lease and renewed it within
// --leader-elect-renew-deadline. A leader that stalled (GC pause, CPU
// starvation, a partition) past its lease may wake up after another
// replica took over: it must not write. Nil without leader election.
func (a *app) fence() cloudprovider.Fence {
	c := a.c
	if !c.leaderElect {
		return nil
	}
	return func() error {
		le := a.elector.Load()
		if le == nil || !le.IsLeader() {
			return errors.New("this replica does not hold the leader lease")
		}
		if err := le.Check(c.renewDeadline - c.leaseDuration); err != nil {
			return fmt.Errorf("lease not renewed within --leader-elect-renew-deadline %s: %w", c.renewDeadline, err)
		}
		return nil
	}
}

// configReload follows the flags ConfigMap (--config-map): every replica
// does, so a standby that takes over runs the latest configuration; only
// the leader records events and stores the last good configuration (at
// its first successful loop and at every accepted edit). The leader reads
// the ConfigMap once, directly, before its first loop (readConfig): event
// handlers run after the cache syncs, and a loop must never act on the
// command line's values (or a mounted file the kubelet has not refreshed
// yet) while the ConfigMap says otherwise.
func (a *app) configReload(ctx context.Context) error {
	c, logger := a.c, a.logger
	if c.configMap == "" {
		return nil
	}
	reloadExtra := func(fs *pflag.FlagSet) {
		var p providerFlags
		p.register(fs)
		a.kf.addShadows(fs)
	}
	r := newReloader(a.args, reloadExtra, a.flags, c, reconfigureAndWake(a.autoscaler), a.recorder, a.metrics, a.liveness.isLeader)
	r.klog = a.kf.apply
	r.persist = lastGoodStore{client: a.client.CoreV1(), namespace: c.core.Namespace, name: c.core.StatusConfigMapName}.save
	a.loopDone = r.loopSucceeded
	r.accepted = func() {
		a.metrics.ConfigFallback.Set(0)
		a.autoscaler.SetConfigFallback("")
	}
	handle := func(obj any) {
		if cm, ok := obj.(*apiv1.ConfigMap); ok && cm.Name == c.configMap {
			r.reload(ctx, cm)
		}
	}
	if _, err := a.configMaps.Informer(c.configMap).AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: handle, UpdateFunc: func(_, obj any) { handle(obj) },
	}); err != nil {
		return fmt.Errorf("watching the flags ConfigMap: %w", err)
	}
	a.readConfig = func(ctx context.Context) {
		cm, err := a.listers.ConfigMaps.Get(c.configMap)
		switch {
		case err == nil:
			r.reload(ctx, cm)
		case apierrors.IsNotFound(err):
			logger.Info("Flags ConfigMap not found; running on the command line and --config", "configMap", klog.KRef(c.core.Namespace, c.configMap))
		default:
			logger.Error(err, "Reading the flags ConfigMap from cache", "configMap", klog.KRef(c.core.Namespace, c.configMap))
		}
	}
	return nil
}

// reconfigureAndWake is the reloader's apply: the new options take effect
// at the start of the next loop, which it wakes.
func reconfigureAndWake(a *core.Autoscaler) func(core.Options) error {
	return func(o core.Options) error {
		if err := a.Reconfigure(o); err != nil {
			return err
		}
		a.Wake(trigger.Config)
		return nil
	}
}
