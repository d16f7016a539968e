// Command vmss-autoscaler is a cluster autoscaler for Kubernetes on Azure
// VM Scale Sets. This file is wiring only: configuration, clients,
// informers, leader election, the metrics server and the loop.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/trigger"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/clientmetrics"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/secureserve"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/statuscmd"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/trim"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/version"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight/agent"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	var err error
	sub := ""
	if len(os.Args) > 1 {
		sub = os.Args[1]
	}
	switch sub {
	case "--version", "version":
		fmt.Println(version.Get())
	case "preflight":
		err = agent.Main(ctx, os.Args[2:])
	case "status":
		err = statuscmd.Main(ctx, os.Args[2:], os.Stdout)
	default:
		err = run(ctx, os.Args[1:])
	}
	stop()
	if err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "vmss-autoscaler:", err)
		}
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// run configures and runs the autoscaler until ctx ends or leadership is lost.
// The leader election client's rate: a renewal every few seconds, never
// behind the loop's requests.
const (
	leaderElectionQPS   = 5
	leaderElectionBurst = 10
)

func run(ctx context.Context, args []string) error {
	ctx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	var prov providerFlags
	kf := newKlogFlags()
	c, flags, fallback, err := startConfig(ctx, args, func(fs *pflag.FlagSet) {
		prov.register(fs)
		kf.addReal(fs)
	}, readLastGood)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if fallback != "" {
		logger.Error(nil, "STARTED ON A FALLBACK CONFIGURATION: the flags file was refused", "reason", fallback)
	}
	v := version.Get()
	logger.Info("Starting vmss-autoscaler", "version", v.Version, "commit", v.Commit, "goVersion", v.GoVersion)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := core.NewMetrics(reg)
	readable := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vmss_autoscaler_apiserver_metrics_readable",
		Help: "1 when the last read of the API server's /metrics (flow-control rejections, for the adaptive node-addition rate) succeeded."})
	reg.MustRegister(readable)
	// Every request of the Kubernetes clients: rest_client_* as in
	// Kubernetes components and the cluster-autoscaler.
	if !clientmetrics.New(reg).Register() {
		logger.Info("Kubernetes client metrics were registered elsewhere in this process; rest_client_* are not exported")
	}

	provider, err := newCloudProvider(ctx, c, &prov, reg)
	if err != nil {
		return err
	}
	if closer, ok := provider.(interface{ Close() }); ok {
		defer closer.Close()
	}

	restCfg, err := kubeConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = c.kubeClientQPS, c.kubeClientBurst
	restCfg.UserAgent = "vmss-autoscaler"
	// Built-in types in protobuf (JSON as the fallback the server may
	// answer with); the dynamic client of CRDs sets JSON itself.
	restCfg.ContentType = c.kubeAPIContentType
	restCfg.AcceptContentTypes = c.kubeAPIContentType
	if c.kubeAPIContentType != contentTypeJSON {
		restCfg.AcceptContentTypes += "," + contentTypeJSON
	}
	// The secure listener's reviews get a client of their own, copied
	// before the observer below wraps this one (secureserve.NewReviewClient).
	reviewCfg := rest.CopyConfig(restCfg)
	// The adaptive node-addition rate watches the API server through the
	// autoscaler's own requests: latency, 429s, 5xx.
	observer := ratelimit.NewObserver(c.core.NodeAdditionAdaptiveOptions.LatencyThreshold, nil)
	restCfg.Wrap(observer.Wrap)
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("building Kubernetes client: %w", err)
	}

	// Informers: the loop reads only these caches. What it never reads
	// (managed fields, last-applied, containers' env and probes, node
	// images) is dropped before it is cached (package trim).
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trim.Object))
	// Only the ConfigMaps read live, each by name (the RBAC grants no other).
	configMaps := newNamedConfigMaps(client, c.core.Namespace, c.configMap, c.core.PriorityConfigMapName, c.core.HealthPolicyConfigMapName)
	sim, err := simulator.New(ctx, factory, c.core.GPUResourceName)
	if err != nil {
		return err
	}
	defer func() { _ = sim.Close() }()
	// Pods by node: what the Remover reads again before a machine goes.
	podInformer := factory.Core().V1().Pods().Informer()
	if err := actuation.AddNodeNameIndex(podInformer); err != nil {
		return err
	}
	listers := core.Listers{
		Nodes:      factory.Core().V1().Nodes().Lister(),
		Pods:       factory.Core().V1().Pods().Lister(),
		DaemonSets: factory.Apps().V1().DaemonSets().Lister(),
		ConfigMaps: configMaps.Lister(),
		PDBs:       factory.Policy().V1().PodDisruptionBudgets().Lister(),
		// The scheduler framework's PodTopologySpread watches them already.
		ReplicaSets: factory.Apps().V1().ReplicaSets().Lister(),
	}
	// The balloon Deployments this process manages, in their namespace.
	bo := c.core.Balloons
	// A balloon namespace without Pod Security restricted is refused.
	if err := bo.CheckNamespaceAtStart(ctx, client); err != nil {
		return err
	}
	balloonFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(bo.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = bo.ManagedByLabel + "=" + bo.ManagedByValue }),
		informers.WithTransform(trim.Metadata))
	balloons := balloon.NewController(client, balloonFactory.Apps().V1().Deployments().Lister(), bo)
	gangs, dynFactory, err := gangLookup(ctx, restCfg, client, factory)
	if err != nil {
		return err
	}
	provReqs, err := provisioningRequests(ctx, c, restCfg, client, factory)
	if err != nil {
		return err
	}
	buffers, err := capacityBuffers(ctx, c, restCfg, client, factory)
	if err != nil {
		return err
	}
	// The named ConfigMaps (flags, priorities) are watched by every
	// replica. The rest start at once (--standby-informers=warm, or no
	// leader election) or when this replica leads; Start is idempotent.
	configMaps.Start(ctx.Done())
	var startProvisioningRequests, startBuffers sync.Once
	startInformers := func() {
		factory.Start(ctx.Done())
		balloonFactory.Start(ctx.Done())
		if dynFactory != nil {
			dynFactory.Start(ctx.Done())
		}
		if provReqs != nil {
			startProvisioningRequests.Do(func() { go provReqs.Informer().RunWithContext(ctx) })
		}
		if buffers != nil {
			startBuffers.Do(func() { go buffers.Informer().RunWithContext(ctx) })
		}
	}
	if !c.leaderElect || c.standbyInformers == standbyWarm {
		startInformers()
	}
	if dynFactory != nil {
		defer dynFactory.Shutdown()
	}
	defer factory.Shutdown()
	defer configMaps.Shutdown()
	defer balloonFactory.Shutdown()
	// The informers stop when run returns for any reason, not only on a
	// signal: a replica that lost its lease returns and must exit, not wait
	// in Shutdown for informers nobody stops (deferred after the Shutdowns,
	// so it runs before them).
	defer stopInformers()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, apiv1.EventSource{Component: "vmss-autoscaler"})

	var status core.StatusWriter
	var safety core.SafetyStore
	if c.core.WriteStatusConfigMap {
		w := &core.ConfigMapStatusWriter{Client: client.CoreV1(), Namespace: c.core.Namespace, Name: c.core.StatusConfigMapName}
		status, safety = w, w
	}
	// The fence: with leader election, this replica acts, and writes to
	// the cloud, only while it holds the lease and renewed it within
	// --leader-elect-renew-deadline. A leader that stalled (GC pause, CPU
	// starvation, a partition) past its lease may wake up after another
	// replica took over: it must not write.
	var elector atomic.Pointer[leaderelection.LeaderElector]
	var fence cloudprovider.Fence
	if c.leaderElect {
		fence = func() error {
			le := elector.Load()
			if le == nil || !le.IsLeader() {
				return errors.New("this replica does not hold the leader lease")
			}
			if err := le.Check(c.renewDeadline - c.leaseDuration); err != nil {
				return fmt.Errorf("lease not renewed within --leader-elect-renew-deadline %s: %w", c.renewDeadline, err)
			}
			return nil
		}
	}
	deps := core.Deps{
		Options: c.core, Provider: provider, Listers: listers, Simulator: sim,
		Recorder: recorder, Status: status, Safety: safety, Metrics: metrics,
		Actions: &actuation.KubeNodeActions{Client: client}, Pods: actuation.KubePods{Client: client, Indexer: podInformer.GetIndexer()},
		Health: observer, Balloons: balloons, Gangs: gangs,
		Fence: fence,
	}
	if provReqs != nil {
		deps.ProvisioningRequests = provReqs
	}
	if buffers != nil {
		deps.CapacityBuffers = buffers
	}
	autoscaler, err := core.New(deps)
	if err != nil {
		return err
	}
	if err := wakeOnEvents(factory, autoscaler); err != nil {
		return err
	}

	if fallback != "" {
		metrics.ConfigFallback.Set(1)
		autoscaler.SetConfigFallback(fallback)
		if c.configMap != "" {
			recorder.Event(&apiv1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: c.core.Namespace, Name: c.configMap},
				apiv1.EventTypeWarning, eventConfigFallback, "started on a fallback configuration: "+fallback)
		}
	}
	health := newHealth(c.maxInactivity, c.maxFailingTime, autoscaler.LastSuccess, autoscaler.LastRun)
	// readConfig hands the flags ConfigMap to the reloader once, directly,
	// before the first loop: event handlers run after the cache syncs, and a
	// loop must never act on the command line's values (or a mounted file
	// the kubelet has not refreshed yet) while the ConfigMap says otherwise.
	readConfig := func(context.Context) {}
	// loopDone is told of every loop that completed.
	loopDone := func(context.Context) {}
	if c.configMap != "" {
		// Every replica follows the flags ConfigMap, so a standby that takes
		// over runs the latest configuration; only the leader records events.
		reloadExtra := func(fs *pflag.FlagSet) {
			var p providerFlags
			p.register(fs)
			kf.addShadows(fs)
		}
		r := newReloader(args, reloadExtra, flags, c, reconfigureAndWake(autoscaler), recorder, metrics, health.isLeader)
		r.klog = kf.apply
		// The leader stores the last good configuration at its first
		// successful loop and at every accepted edit.
		r.persist = lastGoodStore{client: client.CoreV1(), namespace: c.core.Namespace, name: c.core.StatusConfigMapName}.save
		loopDone = r.loopSucceeded
		r.accepted = func() {
			metrics.ConfigFallback.Set(0)
			autoscaler.SetConfigFallback("")
		}
		handle := func(obj any) {
			if cm, ok := obj.(*apiv1.ConfigMap); ok && cm.Name == c.configMap {
				r.reload(ctx, cm)
			}
		}
		if _, err := configMaps.Informer(c.configMap).AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: handle, UpdateFunc: func(_, obj any) { handle(obj) },
		}); err != nil {
			return fmt.Errorf("watching the flags ConfigMap: %w", err)
		}
		readConfig = func(ctx context.Context) {
			cm, err := listers.ConfigMaps.Get(c.configMap)
			switch {
			case err == nil:
				r.reload(ctx, cm)
			case apierrors.IsNotFound(err):
				logger.Info("Flags ConfigMap not found; running on the command line and --config", "configMap", klog.KRef(c.core.Namespace, c.configMap))
			default:
				logger.Error(err, "Reading the flags ConfigMap from cache", "configMap", klog.KRef(c.core.Namespace, c.configMap))
			}
		}
	}
	mux := newMux(reg, health)
	srvErr := serve(ctx, c.address, mux)
	if c.secureAddress != "" {
		// TokenReviews and SubjectAccessReviews on a client of their own,
		// with its own rate limiter, capped in flight and cached (negative
		// answers too): whoever reaches the port must not queue the lease
		// renewals and the loop's requests behind reviews of random tokens.
		reviewClient, err := secureserve.NewReviewClient(reviewCfg)
		if err != nil {
			return err
		}
		authn, authz, err := secureserve.Delegating(reviewClient, secureserve.ReviewOptions{Registerer: reg})
		if err != nil {
			return err
		}
		addr, errc, err := secureserve.Serve(ctx, secureserve.Options{Address: c.secureAddress, CertFile: c.tlsCertFile, KeyFile: c.tlsKeyFile},
			secureserve.Handler(mux, authn, authz, []string{"/healthz"}))
		if err != nil {
			return err
		}
		logger.Info("Serving metrics and health with delegated authentication and authorization", "address", addr.String(),
			"selfSignedCertificate", c.tlsCertFile == "")
		srvErr = mergeErrors(srvErr, errc)
	}

	lead := func(ctx context.Context) {
		health.setLeader(true)
		startInformers()
		logger.Info("Waiting for informer caches")
		for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				logger.Error(nil, "Informer cache did not sync", "type", typ.String())
				return
			}
		}
		configMaps.WaitForCacheSync(ctx.Done())
		readConfig(ctx)
		balloonFactory.WaitForCacheSync(ctx.Done())
		if dynFactory != nil {
			dynFactory.WaitForCacheSync(ctx.Done())
		}
		if provReqs != nil && !cache.WaitForCacheSync(ctx.Done(), provReqs.Informer().HasSynced) {
			logger.Error(nil, "ProvisioningRequest informer cache did not sync")
			return
		}
		if buffers != nil && !cache.WaitForCacheSync(ctx.Done(), buffers.Informer().HasSynced) {
			logger.Error(nil, "CapacityBuffer informer cache did not sync")
			return
		}
		if c.core.NodeAdditionAdaptive && c.apiserverMetricsInterval > 0 {
			go watchFlowControl(ctx, client.CoreV1().RESTClient(), c.apiserverMetricsInterval, observer, readable)
		}
		logger.Info("Starting autoscaler loop", "scanInterval", c.core.ScanInterval, "cloudProvider", provider.Name(),
			"nodeGroups", len(provider.NodeGroups()))
		autoscaler.Run(ctx, loopDone)
	}
	if !c.leaderElect {
		go func() { lead(ctx) }()
		select {
		case <-ctx.Done():
			return nil
		case err := <-srvErr:
			return err
		}
	}
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
	leCfg := rest.CopyConfig(restCfg)
	leCfg.QPS, leCfg.Burst = leaderElectionQPS, leaderElectionBurst
	leClient, err := kubernetes.NewForConfig(leCfg)
	if err != nil {
		return fmt.Errorf("building the leader election client: %w", err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.core.Namespace, Name: c.leaderElectResource},
		Client:     leClient.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id, EventRecorder: recorder},
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
			OnStartedLeading: lead,
			OnStoppedLeading: func() { health.setLeader(false); close(lostLease) },
			OnNewLeader: func(identity string) {
				logger.Info("Leader elected", "leader", identity, "self", identity == id)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("setting up leader election: %w", err)
	}
	logger.Info("Starting leader election", "lease", klog.KRef(c.core.Namespace, c.leaderElectResource), "identity", id)
	elector.Store(le)
	go le.Run(ctx)
	select {
	case <-ctx.Done():
		<-lostLease // released on cancel
		return nil
	case <-lostLease:
		// A replica that lost its lease must stop acting at once; exiting
		// lets the Deployment restart it as a clean standby.
		return fmt.Errorf("lost leader election lease %s/%s", c.core.Namespace, c.leaderElectResource)
	case err := <-srvErr:
		return err
	}
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

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration (set --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig=%s: %w", path, err)
	}
	return cfg, nil
}

// newMux serves /metrics and /healthz.
func newMux(reg *prometheus.Registry, h *health) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/healthz", h)
	return mux
}

// mergeErrors forwards the first error of either channel.
func mergeErrors(a, b <-chan error) <-chan error {
	out := make(chan error, 1)
	go func() {
		select {
		case err := <-a:
			out <- err
		case err := <-b:
			out <- err
		}
	}()
	return out
}

// serve runs the plain listener of /metrics and /healthz (--address) until
// ctx ends; a listen error is sent.
func serve(ctx context.Context, addr string, mux http.Handler) <-chan error {
	errc := make(chan error, 1)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 2 * time.Minute, IdleTimeout: secureserve.DefaultIdleTimeout}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		errc <- fmt.Errorf("--address=%s: %w", addr, err)
		return errc
	}
	klog.FromContext(ctx).Info("Serving metrics and health", "address", ln.Addr().String())
	go func() {
		// As the secure listener: idle keep-alives closed, connections
		// bounded.
		if err := srv.Serve(secureserve.LimitListener(ln, secureserve.DefaultMaxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("metrics server: %w", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return errc
}

// providerFlags are the Azure provider's own flags.
type providerFlags struct {
	cfg           vmss.Config
	resourceGroup []string
	discovery     []string
}

func (p *providerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&p.cfg.SubscriptionID, "azure-subscription-id", os.Getenv("AZURE_SUBSCRIPTION_ID"), "subscription of the scale sets (default $AZURE_SUBSCRIPTION_ID)")
	fs.StringSliceVar(&p.resourceGroup, "azure-resource-groups", nil, "resource groups holding the scale sets, comma-separated")
	fs.StringArrayVar(&p.discovery, "node-group-auto-discovery", nil, "discover scale sets by tags, CA's form: label:k8s.io_cluster-autoscaler_enabled,k8s.io_cluster-autoscaler_<cluster> (min and max from the min/max tags); repeatable; --nodes wins")
	fs.StringVar(&p.cfg.ARMEndpoint, "azure-arm-endpoint", vmss.PublicARMEndpoint, "Azure Resource Manager endpoint (sovereign clouds, the ARM simulator)")
	fs.StringVar(&p.cfg.TokenAudience, "azure-token-audience", "", "token audience for ARM; default: the endpoint's")
	fs.StringVar(&p.cfg.AuthorityHost, "azure-authority-host", "", "Entra ID authority host; default: public cloud")
	fs.StringVar(&p.cfg.Auth, "azure-auth", vmss.AuthDefault, "credential: default (DefaultAzureCredential order), workload-identity, managed-identity, client-secret, token-file")
	fs.StringVar(&p.cfg.TenantID, "azure-tenant-id", os.Getenv("AZURE_TENANT_ID"), "tenant ID (default $AZURE_TENANT_ID)")
	fs.StringVar(&p.cfg.ClientID, "azure-client-id", os.Getenv("AZURE_CLIENT_ID"), "client ID of the identity (default $AZURE_CLIENT_ID)")
	fs.StringVar(&p.cfg.ClientSecretFile, "azure-client-secret-file", "", "file holding the client secret (client-secret auth)")
	fs.StringVar(&p.cfg.TokenFile, "azure-token-file", "", "file holding a bearer token (token-file auth)")
	fs.StringVar(&p.cfg.CAFile, "azure-ca-file", "", "extra CA certificate (PEM) to trust for the ARM endpoint")
	fs.DurationVar(&p.cfg.CacheTTL, "azure-cache-ttl", time.Minute, "scale-set cache lifetime (jittered ±10%): one List of scale sets per resource group per refresh (sizes, tags, SKUs); VM lists follow --azure-vm-list-interval")
	fs.DurationVar(&p.cfg.VMListInterval, "azure-vm-list-interval", 5*time.Minute, "how often a quiet scale set's VMs are listed (jittered ±10%; cluster-autoscaler's 5 minutes); a list that fails keeps the last instances")
	fs.DurationVar(&p.cfg.VMListActiveInterval, "azure-vm-list-active-interval", time.Minute, "how often a scale set's VMs are listed while something happens to it (a write, machines coming, going or failed, a size its VMs do not match, Spot)")
	fs.IntVar(&p.cfg.VMListBudget, "azure-vm-list-budget", 300, "most VM lists of all scale sets per 30 minutes (a third of the 900 Microsoft's example of HighCostGetVMScaleSet30Min allows a whole subscription); a scale set's first list is never refused")
	fs.IntVar(&p.cfg.VMListParallelism, "azure-vm-list-parallelism", 8, "most VM lists in flight at once")
	fs.BoolVar(&p.cfg.AllowAKSManaged, "azure-allow-aks-managed-scale-sets", false, "manage scale sets of AKS node pools (aks-managed-* tags), which AKS does not support writing directly; off: such scale sets are refused")
	fs.BoolVar(&p.cfg.ForceDelete, "azure-force-delete", false, "force-delete instances on scale-down")
	fs.BoolVar(&p.cfg.ConcurrentScaleUps, "azure-concurrent-scale-ups", false, "send a scale set's capacity write while its previous scale-up operation still runs (ARM preempts the earlier one, as cluster-autoscaler's writes do); off: at most one capacity write in flight per scale set, and demand that arrives meanwhile waits for the operation to end (minutes for GPU VMs)")
	fs.DurationVar(&p.cfg.LROPollInterval, "azure-operation-poll-interval", 10*time.Second, "how often long-running ARM operations are polled in the background")
}

func newCloudProvider(_ context.Context, c *config, p *providerFlags, reg prometheus.Registerer) (cloudprovider.CloudProvider, error) {
	if c.cloudProvider != "azure" {
		return nil, fmt.Errorf("--cloud-provider=%q: only azure is supported", c.cloudProvider)
	}
	cfg := p.cfg
	cfg.ResourceGroups = p.resourceGroup
	cfg.AutoDiscovery = p.discovery
	cfg.NodeGroups = c.nodeGroupSpecs
	cfg.GPUResourceName = string(c.core.GPUResourceName)
	cfg.Registerer = reg
	prov, err := vmss.New(cfg)
	if err != nil {
		return nil, err
	}
	return prov, nil
}
