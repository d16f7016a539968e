// Package harness starts a real local Kubernetes control plane for
// end-to-end tests and demos: an embedded etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and kwok (fake kubelets), each of
// the latter as its own process built from this module's dependency graph.
// Everything listens on 127.0.0.1 only, on free ports, so several control
// planes can run side by side.
package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
)

const (
	// DefaultFeatureGates enables the native gang scheduling of Kubernetes 1.36.
	DefaultFeatureGates = "GenericWorkload=true,GangScheduling=true"
	// DefaultKwokAnnotationSelector selects the nodes kwok manages.
	DefaultKwokAnnotationSelector = "kwok.x-k8s.io/node=fake"

	// serviceClusterIPRange is the Service CIDR; its first address, 10.0.0.1,
	// is in the apiserver certificate.
	serviceClusterIPRange = "10.0.0.0/24"
	// kwokPodCIDR is where kwok draws pod IPs from. They are only written
	// into pod status, never used; the range just avoids the Service CIDR.
	kwokPodCIDR = "10.244.0.0/16"
	// DefaultKwokNodeLeaseSeconds makes kwok hold and renew a Lease per
	// node (every quarter of it, as a kubelet does: 10 s), the heartbeat
	// that keeps node-lifecycle from marking nodes unreachable.
	DefaultKwokNodeLeaseSeconds = 40

	componentStartTimeout = 2 * time.Minute
	namespaceReadyTimeout = time.Minute
	pollInterval          = 100 * time.Millisecond
	probeTimeout          = 5 * time.Second

	// clientQPS and clientBurst keep client-side throttling out of tests.
	clientQPS   = 500
	clientBurst = 1000
)

// Options configures Start. The zero value is valid.
type Options struct {
	// Dir holds certificates, kubeconfig, etcd data and logs; default a new
	// os.MkdirTemp dir. Stop removes the etcd data and keeps the rest.
	Dir string
	// FeatureGates for the apiserver, controller manager and scheduler;
	// default DefaultFeatureGates. The apiserver also always gets
	// --runtime-config=scheduling.k8s.io/v1alpha2=true.
	FeatureGates string
	// KwokAnnotationSelector: kwok manages only nodes with this annotation;
	// default DefaultKwokAnnotationSelector.
	KwokAnnotationSelector string

	// The node heartbeats below are a kubelet's by default. A large kwok
	// cluster on a small machine may slow them (the scale harness at
	// thousands of nodes): each Lease renewal and status update is an API
	// write, and 7,500 nodes renewing every 10 s are 750 writes a second.
	// Raise NodeMonitorGracePeriod with them, or the node lifecycle
	// controller marks the nodes unreachable.

	// KwokNodeLeaseSeconds is the Lease duration kwok sets; it renews every
	// quarter of it. Default DefaultKwokNodeLeaseSeconds (renewed every 10 s).
	KwokNodeLeaseSeconds int
	// KwokNodeStatusInterval is how often kwok updates a Ready node's
	// status (its conditions' heartbeat), plus up to 10 s of jitter;
	// default kwok's heartbeat stage's, 10 minutes (the Lease is the
	// heartbeat node-lifecycle reads in between, as with kubelets).
	KwokNodeStatusInterval time.Duration
	// NodeMonitorGracePeriod is kube-controller-manager's
	// --node-monitor-grace-period: how long a node may go without a
	// heartbeat (Lease renewal or status update) before it is marked
	// Unknown; default the controller manager's own (50 s).
	NodeMonitorGracePeriod time.Duration
}

// ControlPlane is a running control plane. Stop it with Stop.
type ControlPlane struct {
	// Dir holds the certificates, kubeconfig, etcd data and logs.
	Dir string
	// LogDir holds one <component>.log per process (etcd.log for etcd).
	LogDir string
	// Kubeconfig is the admin kubeconfig (client certificate in system:masters).
	Kubeconfig string
	// RESTConfig is the admin client configuration.
	RESTConfig *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface

	logger      klog.Logger
	pki         *pki
	etcd        *embed.Etcd
	etcdDataDir string
	core        []*Process // apiserver, controller manager, scheduler, kwok, in start order (guarded by mu once started)
	specs       map[string]coreSpec
	etcdProxy   *freezableProxy // between the API server and etcd
	probe       *http.Client

	mu       sync.Mutex
	extra    []*Process // started with StartProcess, in start order
	stopped  bool
	stopOnce sync.Once
}

// ports are the free 127.0.0.1 ports of one control plane.
type ports struct {
	etcdClient, etcdPeer, apiServer, controllerManager, scheduler, kwok int
	// etcdServed is where the API server reaches etcd: the freezable proxy.
	etcdServed int
}

// Start brings the control plane up on free 127.0.0.1 ports and waits until
// the apiserver's /readyz is ok, the "default" ServiceAccount exists in
// namespace default (the controller manager runs), and the controller
// manager, scheduler and kwok answer their health checks. Start order: etcd,
// apiserver, controller manager, scheduler, kwok. ctx bounds the start-up
// only; the control plane runs until Stop. On error, whatever was started
// has been stopped again and the logs are kept.
func Start(ctx context.Context, bins Binaries, opts Options) (_ *ControlPlane, retErr error) {
	logger := klog.FromContext(ctx)
	begin := time.Now()
	if opts.FeatureGates == "" {
		opts.FeatureGates = DefaultFeatureGates
	}
	if opts.KwokAnnotationSelector == "" {
		opts.KwokAnnotationSelector = DefaultKwokAnnotationSelector
	}
	if opts.KwokNodeLeaseSeconds == 0 {
		opts.KwokNodeLeaseSeconds = DefaultKwokNodeLeaseSeconds
	}
	switch {
	case opts.KwokNodeLeaseSeconds < 4:
		// kwok renews every quarter of the duration: at least a second.
		return nil, fmt.Errorf("starting control plane: KwokNodeLeaseSeconds %d is below 4", opts.KwokNodeLeaseSeconds)
	case opts.KwokNodeStatusInterval < 0:
		return nil, fmt.Errorf("starting control plane: KwokNodeStatusInterval %s is negative", opts.KwokNodeStatusInterval)
	case opts.NodeMonitorGracePeriod < 0:
		return nil, fmt.Errorf("starting control plane: NodeMonitorGracePeriod %s is negative", opts.NodeMonitorGracePeriod)
	}
	for name, path := range map[string]string{
		"kube-apiserver": bins.APIServer, "kube-controller-manager": bins.ControllerManager,
		"kube-scheduler": bins.Scheduler, "kwok": bins.Kwok,
	} {
		if path == "" {
			return nil, fmt.Errorf("starting control plane: no %s binary given", name)
		}
	}

	dir, err := prepareDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("starting control plane: %w", err)
	}
	cp := &ControlPlane{
		Dir:         dir,
		LogDir:      filepath.Join(dir, "logs"),
		Kubeconfig:  filepath.Join(dir, "admin.kubeconfig"),
		logger:      logger.WithValues("controlPlane", dir),
		etcdDataDir: filepath.Join(dir, "etcd"),
	}
	defer func() {
		if retErr != nil {
			cp.Stop()
			retErr = fmt.Errorf("starting control plane: %w (%s)", retErr, cp.LogHint())
		}
	}()
	if err := os.MkdirAll(cp.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating log dir: %w", err)
	}
	if cp.pki, err = generatePKI(filepath.Join(dir, "pki")); err != nil {
		return nil, fmt.Errorf("generating certificates: %w", err)
	}
	if cp.probe, err = newProbeClient(cp.pki.CACert); err != nil {
		return nil, err
	}
	p, err := freePorts()
	if err != nil {
		return nil, err
	}

	// etcd, in process, behind a proxy that can freeze it.
	if cp.etcd, err = startEtcd(ctx, cp.etcdDataDir, filepath.Join(cp.LogDir, "etcd.log"), p.etcdClient, p.etcdPeer); err != nil {
		return nil, err
	}
	if cp.etcdProxy, err = newFreezableProxy(net.JoinHostPort("127.0.0.1", strconv.Itoa(p.etcdClient))); err != nil {
		return nil, err
	}
	_, proxyPort, _ := net.SplitHostPort(cp.etcdProxy.addr())
	p.etcdServed, _ = strconv.Atoi(proxyPort)

	// kube-apiserver.
	server := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p.apiServer))
	if err := writeKubeconfig(cp.Kubeconfig, server, cp.pki); err != nil {
		return nil, err
	}
	if cp.RESTConfig, err = clientcmd.BuildConfigFromFlags("", cp.Kubeconfig); err != nil {
		return nil, fmt.Errorf("loading %s: %w", cp.Kubeconfig, err)
	}
	cp.RESTConfig.QPS, cp.RESTConfig.Burst = clientQPS, clientBurst
	client, err := kubernetes.NewForConfig(cp.RESTConfig)
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	cp.Client = client
	if err := cp.startCore(ctx, "kube-apiserver", bins.APIServer, apiServerArgs(cp.pki, p, opts)...); err != nil {
		return nil, err
	}
	if err := cp.waitUntil(ctx, "kube-apiserver /readyz", cp.apiServerReady); err != nil {
		return nil, err
	}
	logger.V(1).Info("kube-apiserver is ready", "server", server, "elapsed", time.Since(begin).Round(time.Millisecond))

	// The rest need only the apiserver: start them together, then wait.
	kwokConfig := filepath.Join(dir, "kwok-stages.yaml")
	if err := writeKwokConfig(kwokConfig, opts.KwokNodeStatusInterval); err != nil {
		return nil, err
	}
	if err := cp.startCore(ctx, "kube-controller-manager", bins.ControllerManager, controllerManagerArgs(cp.pki, cp.Kubeconfig, p, opts)...); err != nil {
		return nil, err
	}
	if err := cp.startCore(ctx, "kube-scheduler", bins.Scheduler, schedulerArgs(cp.pki, cp.Kubeconfig, p, opts)...); err != nil {
		return nil, err
	}
	if err := cp.startCore(ctx, "kwok", bins.Kwok, kwokArgs(cp.Kubeconfig, kwokConfig, p, opts)...); err != nil {
		return nil, err
	}
	checks := []struct {
		what string
		cond func(context.Context) (bool, error)
	}{
		{"kube-controller-manager /healthz", cp.httpOK(fmt.Sprintf("https://127.0.0.1:%d/healthz", p.controllerManager))},
		{"kube-scheduler /healthz", cp.httpOK(fmt.Sprintf("https://127.0.0.1:%d/healthz", p.scheduler))},
		{"kwok /healthz", cp.httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthz", p.kwok))},
		{"ServiceAccount default/default (created by kube-controller-manager)", cp.serviceAccountExists(metav1.NamespaceDefault)},
	}
	for _, c := range checks {
		if err := cp.waitUntil(ctx, c.what, c.cond); err != nil {
			return nil, err
		}
	}
	logger.Info("Control plane is ready", "server", server, "dir", dir, "duration", time.Since(begin).Round(time.Millisecond))
	return cp, nil
}

// prepareDir creates dir, or a new temporary directory when dir is empty,
// and returns its absolute path.
func prepareDir(dir string) (string, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "vmss-autoscaler-e2e-")
		if err != nil {
			return "", fmt.Errorf("creating temporary directory: %w", err)
		}
		return d, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", abs, err)
	}
	return abs, nil
}

// freePorts picks distinct free TCP ports on 127.0.0.1. All listeners stay
// open until every port is chosen, so the ports differ from one another.
func freePorts() (ports, error) {
	var nums [6]int
	listeners := make([]net.Listener, 0, len(nums))
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for i := range nums {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return ports{}, fmt.Errorf("finding a free port on 127.0.0.1: %w", err)
		}
		listeners = append(listeners, l)
		nums[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports{
		etcdClient: nums[0], etcdPeer: nums[1], apiServer: nums[2],
		controllerManager: nums[3], scheduler: nums[4], kwok: nums[5],
	}, nil
}

// writeKubeconfig writes an admin kubeconfig that authenticates with the
// admin client certificate.
func writeKubeconfig(path, server string, p *pki) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["harness"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: p.CACert}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificate: p.AdminCert, ClientKey: p.AdminKey}
	cfg.Contexts["harness"] = &clientcmdapi.Context{Cluster: "harness", AuthInfo: "admin", Namespace: metav1.NamespaceDefault}
	cfg.CurrentContext = "harness"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// newProbeClient returns an HTTP client for health checks that trusts the
// cluster CA and never uses a proxy.
func newProbeClient(caFile string) (*http.Client, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("reading CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", caFile)
	}
	return &http.Client{
		Timeout: probeTimeout,
		Transport: &http.Transport{
			Proxy:             nil,
			TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}, nil
}

func apiServerArgs(p *pki, pt ports, opts Options) []string {
	return []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", pt.etcdServed),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", pt.apiServer),
		"--tls-cert-file=" + p.APIServerCert,
		"--tls-private-key-file=" + p.APIServerKey,
		"--client-ca-file=" + p.CACert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.ServiceAccountPub,
		"--service-account-signing-key-file=" + p.ServiceAccountKey,
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=" + serviceClusterIPRange,
		// The advertise address is loopback: no endpoints for the
		// kubernetes Service.
		"--endpoint-reconciler-type=none",
		"--requestheader-client-ca-file=" + p.FrontProxyCACert,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p.FrontProxyClientCert,
		"--proxy-client-key-file=" + p.FrontProxyClientKey,
		"--feature-gates=" + opts.FeatureGates,
		"--runtime-config=scheduling.k8s.io/v1alpha2=true",
		"--allow-privileged=true",
	}
}

func controllerManagerArgs(p *pki, kubeconfig string, pt ports, opts Options) []string {
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--service-account-private-key-file=" + p.ServiceAccountKey,
		"--root-ca-file=" + p.CACert,
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", pt.controllerManager),
		"--tls-cert-file=" + p.ServingCert,
		"--tls-private-key-file=" + p.ServingKey,
		"--kube-api-qps=1000",
		"--kube-api-burst=1000",
		// nodeipam needs a cluster CIDR and is of no use without a network;
		// node-lifecycle stays: it lifts the not-ready taint from new nodes.
		"--controllers=*,-nodeipam",
		"--cluster-signing-cert-file=" + p.CACert,
		"--cluster-signing-key-file=" + p.CAKey,
		// GenericWorkload also turns on the PodGroup protection controller.
		"--feature-gates=" + opts.FeatureGates,
	}
	if opts.NodeMonitorGracePeriod > 0 {
		args = append(args, "--node-monitor-grace-period="+opts.NodeMonitorGracePeriod.String())
	}
	return args
}

func schedulerArgs(p *pki, kubeconfig string, pt ports, opts Options) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", pt.scheduler),
		"--tls-cert-file=" + p.ServingCert,
		"--tls-private-key-file=" + p.ServingKey,
		"--kube-api-qps=1000",
		"--kube-api-burst=1000",
		"--feature-gates=" + opts.FeatureGates,
		// v=2 logs every binding, which is what one reads after a failure.
		"--v=2",
	}
}

func kwokArgs(kubeconfig, stagesFile string, pt ports, opts Options) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=" + opts.KwokAnnotationSelector,
		"--config=" + stagesFile,
		fmt.Sprintf("--server-address=127.0.0.1:%d", pt.kwok),
		"--node-ip=127.0.0.1",
		fmt.Sprintf("--node-lease-duration-seconds=%d", opts.KwokNodeLeaseSeconds),
		"--cidr=" + kwokPodCIDR,
	}
}

// startCore starts one of the control plane's own processes.
func (cp *ControlPlane) startCore(ctx context.Context, name, bin string, args ...string) error {
	p, err := startProcess(ctx, name, filepath.Join(cp.LogDir, name+".log"), bin, nil, args...)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.core = append(cp.core, p)
	if cp.specs == nil {
		cp.specs = map[string]coreSpec{}
	}
	cp.specs[name] = coreSpec{bin: bin, args: args}
	return nil
}

// waitUntil polls cond until it reports true, failing when a control plane
// process exits, ctx ends or componentStartTimeout passes.
func (cp *ControlPlane) waitUntil(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	return poll(ctx, componentStartTimeout, what, cp.coreExited, cond)
}

// coreExited returns an error if one of the control plane processes exited.
func (cp *ControlPlane) coreExited() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, p := range cp.core {
		if p.exited() {
			return p.exitError()
		}
	}
	return nil
}

// poll calls cond every pollInterval until it reports true, failing when
// abort (if not nil) returns an error, ctx ends or timeout passes. Errors
// from cond mean "not yet"; the last one is quoted if the wait fails.
func poll(ctx context.Context, timeout time.Duration, what string, abort func() error, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	var lastErr error
	for {
		if abort != nil {
			if err := abort(); err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
		}
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %v)", what, context.Cause(ctx), lastErr)
			}
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case <-ticker.C:
		}
	}
}

// apiServerReady reports whether the apiserver's /readyz returns ok.
func (cp *ControlPlane) apiServerReady(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(body)) == "ok", nil
}

// httpOK returns a condition that holds when GET url answers 200.
func (cp *ControlPlane) httpOK(url string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := cp.probe.Do(req)
		if err != nil {
			return false, err
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
		}
		return true, nil
	}
}

// serviceAccountExists returns a condition that holds when the "default"
// ServiceAccount exists in namespace ns.
func (cp *ControlPlane) serviceAccountExists(ns string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		_, err := cp.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		default:
			return false, err
		}
	}
}

// Stop stops everything cleanly: first the processes started with
// StartProcess (latest first), then kwok, scheduler, controller manager and
// apiserver (each SIGTERM, then SIGKILL after 10s), then etcd last. It removes
// the etcd data and keeps the logs, certificates and kubeconfig in Dir. Stop
// is idempotent and safe to call on a partly started control plane.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		begin := time.Now()
		cp.mu.Lock()
		cp.stopped = true
		extra := cp.extra
		cp.mu.Unlock()

		for i := len(extra) - 1; i >= 0; i-- {
			cp.stopProcess(extra[i])
		}
		cp.mu.Lock()
		core := append([]*Process(nil), cp.core...)
		cp.mu.Unlock()
		for i := len(core) - 1; i >= 0; i-- {
			cp.stopProcess(core[i])
		}
		if cp.etcdProxy != nil {
			cp.etcdProxy.close()
		}
		if cp.etcd != nil {
			cp.etcd.Close()
			if err := os.RemoveAll(cp.etcdDataDir); err != nil {
				cp.logger.Error(err, "Removing etcd data", "dir", cp.etcdDataDir)
			}
		}
		cp.logger.Info("Control plane stopped", "duration", time.Since(begin).Round(time.Millisecond), "logDir", cp.LogDir)
	})
}

// stopProcess stops p, logging failures.
func (cp *ControlPlane) stopProcess(p *Process) {
	if err := p.Stop(); err != nil {
		cp.logger.Error(err, "Stopping process", "process", p.Name)
	}
}

// StartProcess runs an extra process (the autoscaler, the ARM simulator)
// with its output appended to LogDir/<name>.log. Stop stops these first. The
// process is not bound to ctx; stop it with Process.Stop or ControlPlane.Stop.
func (cp *ControlPlane) StartProcess(ctx context.Context, name, bin string, args ...string) (*Process, error) {
	return cp.StartProcessEnv(ctx, name, bin, nil, args...)
}

// StartProcessEnv is StartProcess with env ("KEY=value") added to the
// process's environment.
func (cp *ControlPlane) StartProcessEnv(ctx context.Context, name, bin string, env []string, args ...string) (*Process, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || strings.HasPrefix(name, ".") {
		return nil, fmt.Errorf("starting process: invalid name %q", name)
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return nil, fmt.Errorf("starting %s: control plane is stopped", name)
	}
	p, err := startProcess(klog.NewContext(ctx, cp.logger), name, filepath.Join(cp.LogDir, name+".log"), bin, env, args...)
	if err != nil {
		return nil, err
	}
	cp.extra = append(cp.extra, p)
	return p, nil
}

// NewNamespace creates a fresh namespace with a unique name from prefix and
// waits for its default ServiceAccount, without which pods are rejected.
func (cp *ControlPlane) NewNamespace(ctx context.Context, prefix string) (string, error) {
	if prefix == "" {
		prefix = "e2e"
	}
	ns, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: strings.TrimSuffix(prefix, "-") + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating namespace %s-*: %w", prefix, err)
	}
	what := fmt.Sprintf("ServiceAccount %s/default", ns.Name)
	if err := poll(ctx, namespaceReadyTimeout, what, nil, cp.serviceAccountExists(ns.Name)); err != nil {
		return "", err
	}
	return ns.Name, nil
}

// LogHint returns a one-line message naming LogDir, for failing tests to print.
func (cp *ControlPlane) LogHint() string {
	return fmt.Sprintf("control plane logs (etcd.log, kube-apiserver.log, kube-controller-manager.log, kube-scheduler.log, kwok.log and one per extra process) are in %s", cp.LogDir)
}

// Components returns the control plane's running processes (the core
// components, then those started with StartProcess) by name, for callers
// that measure them (RSS, CPU time from /proc). A process that exited is
// left out.
func (cp *ControlPlane) Components() map[string]*Process {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	out := make(map[string]*Process, len(cp.core)+len(cp.extra))
	for _, p := range append(slices.Clone(cp.core), cp.extra...) {
		if p != nil && !p.exited() {
			out[p.Name] = p
		}
	}
	return out
}

// FreeAddr returns a free 127.0.0.1 address ("127.0.0.1:port") for a
// process to listen on.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}
