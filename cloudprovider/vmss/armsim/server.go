// Package armsim simulates the subset of Azure Resource Manager (ARM) that a
// virtual machine scale set (VMSS) cluster-autoscaler provider uses: listing
// and reading scale sets, changing their capacity, deleting instances, listing
// their VMs, listing resource SKUs and polling asynchronous operations. Scale
// sets are of Uniform orchestration, or of Flexible orchestration
// (ScaleSetSpec.Flexible), whose VMs are virtual machines of their own
// listed through the Virtual Machines API filtered by scale set.
//
// The simulator speaks ARM's wire protocol over HTTPS, so the real
// armcompute SDK client works against it unmodified. It models ARM's
// semantics that matter to an autoscaler: ETags and If-Match, long-running
// operations that last as long as their VMs and that a later write
// preempts (OperationPreempted), overprovisioning (ScaleSetSpec.Overprovision),
// Azure's request throttling (ARM's buckets per principal and
// the Compute resource provider's policies per resource and per
// subscription: Options.Throttling, throttle.go) with 429 and Retry-After,
// and injectable faults (quota, allocation failure, failed or slow
// operations, server errors). Time-based transitions (VM boot, VM deletion,
// operation completion) follow Options.Clock, so tests can drive them with a
// fake clock. VMs boot after Options.BootDelay ± Options.BootJitter, drawn
// from a source seeded by Options.Seed.
//
// KubeNodeHook registers a Kubernetes Node for each running VM, and by
// default (NewKubeNodeHook, cmd/armsim) registers it as an AKS node is, not
// as the SKU's ideal: allocatable below capacity by AKS's kube-reserved and
// eviction thresholds, a providerID with the resource group lower-cased as
// cloud-provider-azure writes it (ARM keeps returning it as created), GPUs
// advertised only once the device plugin would have started, optional
// network-agent startup taints removed after a delay, and AKS's node pool
// labels. Realism holds the knobs and documents what each models; Exact()
// (the zero Realism) is the ideal node for tests whose subject is elsewhere.
//
// The hook's later node updates (GPUs, startup taints) read the node and
// Update it (UpdateStatus for the GPUs), so they keep whatever else changed
// meanwhile. kwok, which fakes the kubelets in e2e, does not undo them: its
// node-initialize stage copies status.capacity and status.allocatable as
// they are (filling defaults only when they are empty) and runs once, while
// the node is not Ready; its heartbeat stage rewrites only conditions,
// addresses and daemonEndpoints.
package armsim

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

const (
	defaultLocation = "eastus"
	defaultPageSize = 1000
	defaultAddr     = "127.0.0.1:0"
	// runTick is how often Run advances the fleet model (real time).
	runTick = 100 * time.Millisecond
	// operationRetention is how long finished operations stay pollable.
	operationRetention = time.Hour
	// jitterStream is the second half of the PCG seed: any constant works,
	// one that is not zero keeps seed 0 from being a degenerate state.
	jitterStream = 0x9e3779b97f4a7c15
)

// Options configure a Server.
type Options struct {
	SubscriptionID string        // required
	Location       string        // default "eastus"
	BootDelay      time.Duration // Creating -> Running (default 0: running at the next Advance)
	// HookParallelism is how many node hook calls (VMRunning, VMDeleted)
	// an Advance makes at once. Default 0 or 1: one after the other, in
	// provider ID order (repeatable). Real VMs' kubelets register their
	// nodes each on its own, at once: a serial hook registers a burst of
	// 2,000 nodes at the harness's pace (about 17 a second on 2 cores,
	// two API calls a node), not the API server's.
	HookParallelism int
	// BootJitter spreads boot times: each VM boots after BootDelay plus a
	// uniform draw from [-BootJitter, +BootJitter] (never before it was
	// created), as real scale set VMs of one scale-out come up minutes
	// apart. Default 0: every VM takes exactly BootDelay.
	BootJitter time.Duration
	// Seed seeds the jitter's random source (math/rand/v2 PCG), so a run
	// is repeatable: the same seed and requests give the same boot times.
	Seed        uint64
	DeleteDelay time.Duration // Deleting -> gone (default 0: gone at the next Advance)
	// RestartDuration, ReimageDuration and RedeployDuration are how long
	// a VM's repair action lasts (repair.go; default 0: done at the next
	// Advance). Azure publishes none; a GPU VM's take minutes.
	RestartDuration, ReimageDuration, RedeployDuration time.Duration
	// LRODuration is the least an asynchronous operation stays
	// InProgress (default 0). An operation lasts as long as its VMs: a
	// scale-out's until the VMs it creates are provisioned (boot and
	// extensions), a deletion's until its VMs are gone (operations.go).
	LRODuration time.Duration
	// FixedOperations makes every operation last LRODuration, whatever
	// its VMs (the simulator's model before #38).
	FixedOperations bool
	// ExtensionDelay is how long a new VM stays Creating after its OS is
	// up (PowerState/running), provisioning its extensions, for SKUs
	// without an ExtensionDelay of their own (default 0). GPU sizes take
	// minutes on Azure (drivers installed at provisioning); give their
	// SKUs an ExtensionDelay (GPUExtensionDelay, say) to model it.
	ExtensionDelay time.Duration
	// NoPreemption turns off preemption: by default a capacity write or
	// an instance deletion ends the scale set's operations in progress
	// Canceled with OperationPreempted, as ARM does (operations.go).
	NoPreemption bool
	// OverprovisionPercent is how many extra VMs an overprovisioning
	// scale set (ScaleSetSpec.Overprovision) creates on a scale-out, in
	// percent of the requested ones, rounded up; default 20.
	OverprovisionPercent int
	// Throttling is ARM's and the Compute resource provider's
	// throttling, on by default at Azure's limits (ComputePolicies,
	// DefaultARMLimits); Throttling.Disabled turns it off.
	Throttling Throttling
	PageSize   int         // VM list page size, nextLink paging beyond it; default 1000
	Clock      clock.Clock // default real clock; tests pass a fake clock
	Hook       NodeHook    // may be nil; may also be a DeletionWatcher
	SKUs       []SKU       // default DefaultSKUs()
	// Addr is the address Start listens on; default "127.0.0.1:0". Only
	// loopback addresses are accepted.
	Addr string
}

// Server is an ARM simulator. Create it with New, add scale sets with
// AddScaleSet, then serve it with Start (or mount Handler yourself).
type Server struct {
	opts  Options
	clock clock.Clock
	hook  NodeHook
	// watcher is the hook as a DeletionWatcher, nil if it is not one.
	watcher DeletionWatcher
	skus    map[string]SKU // by lower-case name

	// hookMu serialises Advance, so each hook call is made once even when
	// Advance runs concurrently (Run and a test, say).
	hookMu sync.Mutex

	mu   sync.Mutex
	rng  *rand.Rand            // boot jitter; seeded by Options.Seed
	sets map[string]*scaleSet  // by setKey
	ops  map[string]*operation // by operation ID
	gone []*vmRecord           // removed VMs whose VMDeleted hook is pending
	// repaired are repair actions that ended, whose VMRepaired hook call
	// is pending (repair.go).
	repaired []*repairDone
	calls    map[string]int
	thr      *throttler // ARM's buckets and the Compute policies'
	writes   []Write    // every write request, in order
	// recordDeleting is set while a request is handled for the watcher:
	// startDeleting then appends the VMs it moves to Deleting to deleting.
	recordDeleting bool
	deleting       []*vmRecord

	ts      *httptest.Server
	cert    tls.Certificate
	certPEM []byte
	pool    *x509.CertPool
}

// New validates opts, fills in defaults and returns a Server that is not yet
// serving.
func New(opts Options) (*Server, error) {
	if opts.SubscriptionID == "" {
		return nil, fmt.Errorf("armsim: subscription ID is required")
	}
	opts.fillDefaults()
	if err := opts.settle(); err != nil {
		return nil, err
	}
	skus, err := skuIndex(opts.SKUs)
	if err != nil {
		return nil, err
	}
	watcher, _ := opts.Hook.(DeletionWatcher)
	return &Server{
		opts:    opts,
		clock:   opts.Clock,
		hook:    opts.Hook,
		watcher: watcher,
		skus:    skus,
		rng:     rand.New(rand.NewPCG(opts.Seed, opts.Seed^jitterStream)),
		sets:    map[string]*scaleSet{},
		ops:     map[string]*operation{},
		calls:   map[string]int{},
		thr:     newThrottler(opts.Throttling),
	}, nil
}

// fillDefaults fills in the zero options that have a default.
func (o *Options) fillDefaults() {
	if o.Location == "" {
		o.Location = defaultLocation
	}
	if o.PageSize == 0 {
		o.PageSize = defaultPageSize
	}
	if o.Addr == "" {
		o.Addr = defaultAddr
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if len(o.SKUs) == 0 {
		o.SKUs = DefaultSKUs()
	}
}

// settle validates the options, defaults filled in, and fills in the
// throttling's defaults.
func (o *Options) settle() error {
	if o.OverprovisionPercent < 0 {
		return fmt.Errorf("armsim: overprovision percent must not be negative, got %d", o.OverprovisionPercent)
	}
	for name, d := range map[string]time.Duration{"boot delay": o.BootDelay, "boot jitter": o.BootJitter,
		"delete delay": o.DeleteDelay, "LRO duration": o.LRODuration, "extension delay": o.ExtensionDelay} {
		if d < 0 {
			return fmt.Errorf("armsim: %s must not be negative, got %v", name, d)
		}
	}
	throttling, err := o.Throttling.withDefaults()
	if err != nil {
		return fmt.Errorf("armsim: %w", err)
	}
	o.Throttling = throttling
	if o.PageSize < 0 {
		return fmt.Errorf("armsim: page size must not be negative, got %d", o.PageSize)
	}
	if err := checkLoopback(o.Addr); err != nil {
		return fmt.Errorf("armsim: %w", err)
	}
	return nil
}

// skuIndex validates the SKUs and indexes them by lower-case name.
func skuIndex(list []SKU) (map[string]SKU, error) {
	skus := make(map[string]SKU, len(list))
	for _, k := range list {
		if err := k.validate(); err != nil {
			return nil, fmt.Errorf("armsim: %w", err)
		}
		key := strings.ToLower(k.Name)
		if _, dup := skus[key]; dup {
			return nil, fmt.Errorf("armsim: SKU %s listed twice", k.Name)
		}
		skus[key] = k
	}
	return skus, nil
}

// checkLoopback returns an error unless addr ("host:port") names a loopback
// IP address (or "localhost").
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("listen address %q: host must be a loopback IP address", addr)
	}
	return nil
}

// Handler returns the HTTP handler serving the ARM API. Start serves it over
// HTTPS; it can also be mounted elsewhere (URLs in responses, such as
// nextLink and operation URLs, are built from the request's Host).
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(s.serveHTTP)
}

// Start serves the ARM API over HTTPS on Options.Addr (127.0.0.1 with a free
// port by default) with a freshly generated self-signed certificate.
func (s *Server) Start() error {
	if s.ts != nil {
		return fmt.Errorf("armsim: server already started")
	}
	cert, certPEM, err := selfSignedCert(time.Now())
	if err != nil {
		return fmt.Errorf("armsim: generating serving certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(certPEM) {
		return fmt.Errorf("armsim: adding the serving certificate to a pool failed")
	}
	host, port, _ := net.SplitHostPort(s.opts.Addr) // validated in New
	if host == "localhost" {
		host = "127.0.0.1"
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return fmt.Errorf("armsim: listening on %s: %w", s.opts.Addr, err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	_ = ts.Listener.Close() // replace httptest's own listener with ours
	ts.Listener = l
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	ts.StartTLS()
	s.ts, s.cert, s.certPEM, s.pool = ts, cert, certPEM, pool
	klog.InfoS("ARM simulator started", "url", ts.URL, "subscription", s.opts.SubscriptionID, "location", s.opts.Location)
	return nil
}

// URL returns the server's base URL, e.g. "https://127.0.0.1:PORT"; empty
// before Start.
func (s *Server) URL() string {
	if s.ts == nil {
		return ""
	}
	return s.ts.URL
}

// CertPool returns a pool trusting the serving certificate; nil before Start.
func (s *Server) CertPool() *x509.CertPool {
	return s.pool
}

// CACertPEM returns the PEM encoding of the (self-signed) serving
// certificate; nil before Start.
func (s *Server) CACertPEM() []byte {
	return s.certPEM
}

// Close stops serving. It is safe to call without Start and more than once.
func (s *Server) Close() {
	if s.ts == nil {
		return
	}
	s.ts.Close()
	klog.InfoS("ARM simulator stopped", "url", s.ts.URL)
}

// Run advances the fleet model every 100ms of real time until ctx ends, so
// VMs change state (and the hook fires) even when nobody calls the API.
// Transitions are still due according to Options.Clock.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(runTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Advance(ctx)
		}
	}
}

// Calls returns the number of requests answered per operation:
// "ListScaleSets", "GetScaleSet", "UpdateScaleSet", "DeleteInstances",
// "ListVMs" (one per page), "GetVM", "ListVirtualMachines" (the Virtual
// Machines API that lists Flexible scale sets' VMs, one per page),
// "ListSKUs", "PollOperation", and "Throttled" for 429 answers (which are
// not counted as their operation; Throttled tells them apart by policy).
func (s *Server) Calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.calls))
	for k, v := range s.calls {
		out[k] = v
	}
	return out
}

// ResetCalls sets all call counters to zero.
func (s *Server) ResetCalls() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = map[string]int{}
	s.writes = nil
	s.thr.resetCounters()
}

// Write is one write request the simulator answered (PATCH, POST, PUT,
// DELETE), whatever its outcome: what a test asserts on when ARM must hear
// nothing, or a change exactly once.
type Write struct {
	At     time.Time
	Method string
	// ResourceGroup and ScaleSet name what it was about ("" when the path
	// names no scale set).
	ResourceGroup, ScaleSet string
	// Op is the operation ("UpdateScaleSet", "DeleteInstances"), or "" for
	// a path the simulator does not serve.
	Op string
	// Status is the HTTP status answered (429 when throttled).
	Status int
	// Capacity is the sku.capacity a scale-set update asked for, or -1.
	Capacity int
	// InstanceIDs are the instances an instance deletion named (instance
	// IDs, or a Flexible scale set's VM names), as sent, or the one VM a
	// repair action (OpRestartVM, …) was on.
	InstanceIDs []string
	// Caller names who sent it: CallerOf its bearer token. A test that
	// gives each process a token of its own tells their writes apart.
	Caller string
}

// CallerOf is the name Write.Caller gives a bearer token: the first 12 hex
// digits of its SHA-256 (the token itself is never kept).
func CallerOf(token string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return hex.EncodeToString(sum[:6])
}

// Writes returns the write requests answered since the start (or the last
// ResetCalls), oldest first.
func (s *Server) Writes() []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Write(nil), s.writes...)
}

// logWrite records a write request. Callers hold s.mu.
func (s *Server) logWrite(r *http.Request, body []byte, status int, now time.Time) {
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	w := Write{At: now, Method: r.Method, Status: status, Capacity: -1, Caller: CallerOf(token)}
	if rt, ok := parseRoute(r.URL.EscapedPath()); ok {
		s.writeTarget(&w, rt, r.Method)
	}
	switch w.Op {
	case OpDeleteInstances:
		var req struct {
			InstanceIDs []string `json:"instanceIds"`
		}
		if json.Unmarshal(body, &req) == nil {
			w.InstanceIDs = req.InstanceIDs
		}
	case OpUpdateScaleSet:
		if c, ok := requestedCapacity(body); ok {
			w.Capacity = int(c)
		}
	}
	s.writes = append(s.writes, w)
}

// writeTarget fills in what a write is about: its resource group, scale
// set and operation, and for a repair action its VM. Callers hold s.mu.
func (s *Server) writeTarget(w *Write, rt route, method string) {
	w.ResourceGroup, w.ScaleSet, w.Op = rt.rg, rt.name, rt.ops[method]
	if actionOf(w.Op) == "" {
		return
	}
	w.InstanceIDs = []string{rt.instance} // the VM a repair action is on
	if set := s.flexSetOfVM(rt.rg, rt.instance); rt.name == "" && set != nil {
		w.ScaleSet = set.name // a Flexible set's VM, by the Virtual Machines API
	}
}
