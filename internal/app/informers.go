package app

import (
	"context"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/trim"
)

// informers builds the caches the loop reads (it reads nothing else):
// what it never reads (managed fields, last-applied, containers' env and
// probes, node images) is dropped before it is cached (package trim). The
// named ConfigMaps (flags, priorities, health policy) are watched by every
// replica; the rest start at once (--standby-informers=warm, or no leader
// election) or when this replica leads (startInformers, idempotent).
func (a *app) informers(ctx context.Context) error {
	c, client := a.c, a.client
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trim.Object))
	// Only the ConfigMaps read live, each by name (the RBAC grants no other).
	configMaps := newNamedConfigMaps(client, c.core.Namespace, c.configMap, c.core.PriorityConfigMapName, c.core.HealthPolicyConfigMapName)
	sim, err := simulator.New(ctx, factory, c.core.GPUResourceName)
	if err != nil {
		return err
	}
	a.onStop(func() { _ = sim.Close() })
	// Pods by node: what the Remover reads again before a machine goes.
	podInformer := factory.Core().V1().Pods().Informer()
	if err := actuation.AddNodeNameIndex(podInformer); err != nil {
		return err
	}
	a.factory, a.configMaps, a.sim, a.podInformer = factory, configMaps, sim, podInformer
	a.listers = core.Listers{
		Nodes:      factory.Core().V1().Nodes().Lister(),
		Pods:       factory.Core().V1().Pods().Lister(),
		DaemonSets: factory.Apps().V1().DaemonSets().Lister(),
		ConfigMaps: configMaps.Lister(),
		PDBs:       factory.Policy().V1().PodDisruptionBudgets().Lister(),
		// The scheduler framework's PodTopologySpread watches them already.
		ReplicaSets: factory.Apps().V1().ReplicaSets().Lister(),
	}
	if err := a.balloonInformers(ctx); err != nil {
		return err
	}
	if a.gangs, a.dynFactory, err = gangLookup(ctx, a.restCfg, client, factory); err != nil {
		return err
	}
	if a.provReqs, err = provisioningRequests(ctx, c, a.restCfg, client, factory); err != nil {
		return err
	}
	if a.buffers, err = capacityBuffers(ctx, c, a.restCfg, client, factory); err != nil {
		return err
	}
	a.startAndStopInformers(ctx)
	return nil
}

// balloonInformers caches the balloon Deployments this process manages,
// in their namespace (one without Pod Security restricted is refused).
func (a *app) balloonInformers(ctx context.Context) error {
	bo := a.c.core.Balloons
	if err := bo.CheckNamespaceAtStart(ctx, a.client); err != nil {
		return err
	}
	a.balloonFactory = informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithNamespace(bo.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = bo.ManagedByLabel + "=" + bo.ManagedByValue }),
		informers.WithTransform(trim.Metadata))
	a.balloons = balloon.NewController(a.client, a.balloonFactory.Apps().V1().Deployments().Lister(), bo)
	return nil
}

// startAndStopInformers starts the named ConfigMaps' informers, the
// others too unless they wait for the lease, and arranges their stop.
func (a *app) startAndStopInformers(ctx context.Context) {
	a.configMaps.Start(ctx.Done())
	var startProvisioningRequests, startBuffers sync.Once
	a.startInformers = func() {
		a.factory.Start(ctx.Done())
		a.balloonFactory.Start(ctx.Done())
		if a.dynFactory != nil {
			a.dynFactory.Start(ctx.Done())
		}
		if a.provReqs != nil {
			startProvisioningRequests.Do(func() { go a.provReqs.Informer().RunWithContext(ctx) })
		}
		if a.buffers != nil {
			startBuffers.Do(func() { go a.buffers.Informer().RunWithContext(ctx) })
		}
	}
	if !a.c.leaderElect || a.c.standbyInformers == standbyWarm {
		a.startInformers()
	}
	if a.dynFactory != nil {
		a.onStop(a.dynFactory.Shutdown)
	}
	a.onStop(a.factory.Shutdown)
	a.onStop(a.configMaps.Shutdown)
	a.onStop(a.balloonFactory.Shutdown)
	// The informers stop when Run returns for any reason, not only on a
	// signal: a replica that lost its lease returns and must exit, not wait
	// in Shutdown for informers nobody stops (added after the Shutdowns,
	// so it runs before them).
	a.onStop(a.stopInformers)
}

// wakeOnEvents registers the informer handlers that wake the loop (with
// --frequent-loops-enabled): pods the scheduler just marked unschedulable,
// nodes turning usable. They do O(1) work per event and never block.
func wakeOnEvents(factory informers.SharedInformerFactory, a *core.Autoscaler) error {
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(a.PodHandler()); err != nil {
		return fmt.Errorf("watching pods for the loop's triggers: %w", err)
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(a.NodeHandler()); err != nil {
		return fmt.Errorf("watching nodes for the loop's triggers: %w", err)
	}
	return nil
}

// gangLookup watches the PodGroups of the gang APIs the API server serves:
// native gang scheduling (scheduling.k8s.io/v1alpha2) and the coscheduling
// plugin's CRD (scheduling.x-k8s.io/v1alpha1). Checked once at start: an
// API enabled later needs a restart (logged).
func gangLookup(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, factory informers.SharedInformerFactory) (gang.Lookup, dynamicinformer.DynamicSharedInformerFactory, error) {
	logger := klog.FromContext(ctx)
	var l gang.Lookup
	serves := func(gv string) bool {
		res, err := client.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil {
			return false
		}
		for _, r := range res.APIResources {
			if r.Name == "podgroups" {
				return true
			}
		}
		return false
	}
	if serves("scheduling.k8s.io/v1alpha2") {
		l.Native = factory.Scheduling().V1alpha2().PodGroups().Lister()
		logger.Info("Gangs: reading native PodGroups", "api", "scheduling.k8s.io/v1alpha2")
	}
	var dyn dynamicinformer.DynamicSharedInformerFactory
	if serves("scheduling.x-k8s.io/v1alpha1") {
		dc, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return l, nil, fmt.Errorf("building dynamic client for coscheduling PodGroups: %w", err)
		}
		dyn = dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
		l.Coscheduling = dyn.ForResource(schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}).Lister()
		logger.Info("Gangs: reading coscheduling PodGroups", "api", "scheduling.x-k8s.io/v1alpha1")
	}
	if l.Native == nil && l.Coscheduling == nil {
		logger.Info("Gangs: no PodGroup API served; a gang's minimum is all its members")
	}
	return l, dyn, nil
}
