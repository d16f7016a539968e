// Command armsim runs the Azure Resource Manager simulator for VM scale sets
// (package cloudprovider/vmss/armsim) as a standalone HTTPS server on a
// loopback address, optionally registering Kubernetes nodes for its VMs.
package main

import (
	"context"
	goflag "flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// config is the parsed command line.
type config struct {
	listen       string
	subscription string
	location     string
	scaleSets    []string
	bootDelay    time.Duration
	bootJitter   time.Duration
	seed         uint64
	deleteDelay  time.Duration
	lroDuration  time.Duration
	// Operations (armsim.Options): how long they last, preemption.
	extensionDelay  time.Duration
	fixedOperations bool
	noPreemption    bool
	pageSize        int
	caOut           string
	kubeconfig      string
	registerTaints  []string
	annotations     []string

	// Throttling (armsim.Throttling).
	throttling      bool
	armReads        string
	armWrites       string
	armDeletes      string
	armGlobalFactor int
	computePolicies []string

	// Per scale set options, each naming a --scale-set as rg/name.
	flexible       []string
	overprovision  []string
	spot           []string
	computerPrefix []string

	// Realism of the registered nodes.
	exact             bool
	reservation       string
	maxPods           int
	ephemeralStorage  string
	providerIDs       string
	devicePluginDelay time.Duration
	startupTaints     []string
	startupTaintDelay time.Duration
}

// Values of --provider-ids.
const (
	providerIDsAzure = "azure"
	providerIDsARM   = "arm"
)

// defaultBootDelay and defaultBootJitter: a scale set VM takes a minute or
// so from the capacity change to a running OS, and VMs of one scale-out
// come up tens of seconds apart.
const (
	defaultBootDelay  = time.Minute
	defaultBootJitter = 20 * time.Second
)

func main() {
	klogFlags := goflag.NewFlagSet("klog", goflag.ExitOnError)
	klog.InitFlags(klogFlags)
	fs := pflag.NewFlagSet("armsim", pflag.ExitOnError)
	fs.AddGoFlagSet(klogFlags)
	cfg := bindFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg.complete(fs)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		klog.ErrorS(err, "ARM simulator failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func bindFlags(fs *pflag.FlagSet) *config {
	cfg := &config{}
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:0", "Address to listen on; the host must be a loopback address.")
	fs.StringVar(&cfg.subscription, "subscription", "00000000-0000-0000-0000-000000000000", "Subscription ID to serve.")
	fs.StringVar(&cfg.location, "location", "eastus", "Azure location of the scale sets.")
	fs.StringArrayVar(&cfg.scaleSets, "scale-set", nil,
		`Scale set to create, "rg/name:SKU:capacity[:k=v,k=v]" (the optional last part is tags). Repeatable.`)
	fs.StringArrayVar(&cfg.flexible, "flexible", nil,
		`A --scale-set, "rg/name", of Flexible orchestration: its VMs are served by the Virtual Machines API filtered by scale set. Repeatable.`)
	fs.StringArrayVar(&cfg.overprovision, "overprovision", nil,
		`A Uniform --scale-set, "rg/name", with overprovision true (Azure's default for Uniform sets; AKS sets it false): each scale-out creates 20% extra VMs, deleted once the asked-for ones run. Repeatable.`)
	fs.StringArrayVar(&cfg.spot, "spot", nil,
		`A --scale-set, "rg/name[:Delete|Deallocate]", of Spot VMs with that eviction policy (ARM's default: Deallocate); their nodes carry AKS's Spot label and taint. Repeatable.`)
	fs.StringArrayVar(&cfg.computerPrefix, "computer-name-prefix", nil,
		`A --scale-set's computer name prefix, "rg/name:prefix": its VMs' computer (and node) names start with it (default: the scale set's name); two scale sets of one name in two resource groups need their own. Repeatable.`)
	fs.DurationVar(&cfg.bootDelay, "boot-delay", defaultBootDelay, "How long new VMs stay Creating, on average (see --boot-jitter).")
	fs.DurationVar(&cfg.bootJitter, "boot-jitter", defaultBootJitter,
		"Each VM boots after --boot-delay plus a uniform draw from [-jitter, +jitter]; 0 = every VM takes --boot-delay.")
	fs.Uint64Var(&cfg.seed, "seed", 1, "Seed of the boot jitter: the same seed and requests give the same boot times.")
	fs.DurationVar(&cfg.deleteDelay, "delete-delay", 0, "How long deleted VMs stay Deleting.")
	fs.DurationVar(&cfg.lroDuration, "lro-duration", 0, "The least asynchronous operations stay InProgress; a scale-out's lasts until its VMs are provisioned (boot and extensions), a deletion's until its VMs are gone.")
	fs.DurationVar(&cfg.extensionDelay, "extension-delay", 0,
		"How long a new VM runs its extensions once booted before it is provisioned (and its node registers), for sizes without a delay of their own; GPU sizes take minutes on Azure.")
	fs.BoolVar(&cfg.fixedOperations, "fixed-operations", false, "Every operation lasts --lro-duration, whatever its VMs (the model before today's operations).")
	fs.BoolVar(&cfg.noPreemption, "no-preemption", false,
		"Never preempt: by default a capacity write or an instance deletion ends the scale set's operations in progress Canceled (OperationPreempted), as ARM does.")
	arm := armsim.DefaultARMLimits()
	fs.BoolVar(&cfg.throttling, "throttling", true,
		"Throttle as Azure does: ARM's buckets per principal (--arm-*) and the Compute resource provider's policies per scale set and "+
			"per subscription (--compute-policy); false: no bucket or window throttles.")
	fs.StringVar(&cfg.armReads, "arm-reads", formatRate(arm.Reads, false), `ARM's read bucket per principal, "capacity+refill/period".`)
	fs.StringVar(&cfg.armWrites, "arm-writes", formatRate(arm.Writes, false), `ARM's write bucket per principal, "capacity+refill/period".`)
	fs.StringVar(&cfg.armDeletes, "arm-deletes", formatRate(arm.Deletes, false), `ARM's delete bucket per principal, "capacity+refill/period".`)
	fs.IntVar(&cfg.armGlobalFactor, "arm-global-factor", arm.GlobalFactor, "ARM's global subscription limit across principals, in multiples of the principal's buckets.")
	fs.StringArrayVar(&cfg.computePolicies, "compute-policy", nil,
		`Override a Compute throttling policy: "Name=capacity+refill/period" (a token bucket), "Name=limit/period" (a fixed window: `+
			`HighCostGetVMScaleSet3Min, HighCostGetVMScaleSet30Min) or "Name=off". Names and defaults: `+policyDefaults()+`. Repeatable.`)
	fs.IntVar(&cfg.pageSize, "page-size", 1000, "VM list page size.")
	fs.StringVar(&cfg.caOut, "ca-out", "", "File to write the PEM of the server's self-signed certificate to.")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "Kubeconfig of a cluster to register a Node in for each running VM.")
	fs.StringArrayVar(&cfg.registerTaints, "register-taint", nil,
		"Taint key=value:Effect put on every registered Node and left there, as kubelet's --register-with-taints (the preflight taint, say). Repeatable.")
	fs.StringArrayVar(&cfg.annotations, "node-annotation", nil, "Annotation k=v to put on every registered Node. Repeatable.")

	// Realism: the defaults register nodes as AKS does (armsim.DefaultRealism).
	def := armsim.DefaultRealism()
	fs.BoolVar(&cfg.exact, "exact", false, "Register ideal nodes: allocatable = capacity (110 pods, 100Gi ephemeral storage), ARM's resource ID "+
		"as providerID, GPUs at registration, no boot jitter. Realism flags given explicitly still apply.")
	fs.StringVar(&cfg.reservation, "reservation", def.Reservation.String(),
		"Allocatable CPU and memory: aks (AKS on Kubernetes 1.29+), aks-legacy (AKS before 1.29) or none (allocatable = capacity).")
	fs.IntVar(&cfg.maxPods, "max-pods", def.MaxPods, "Pods capacity of a node (AKS: 250 with Azure CNI Overlay, 110 with kubenet, 30 with Azure CNI).")
	fs.StringVar(&cfg.ephemeralStorage, "ephemeral-storage", def.EphemeralStorage.String(),
		"Ephemeral-storage capacity of a node (AKS, 128 GB OS disk: 129886128Ki); 10% is the eviction threshold unless --reservation=none.")
	fs.StringVar(&cfg.providerIDs, "provider-ids", providerIDsAzure,
		"Node providerIDs: azure (as cloud-provider-azure writes them, resource group lower-cased) or arm (ARM's resource ID as it is).")
	fs.DurationVar(&cfg.devicePluginDelay, "device-plugin-delay", def.DevicePluginDelay,
		"How long after registering a GPU node advertises nvidia.com/gpu, as the NVIDIA device plugin does; 0 = at registration.")
	fs.StringArrayVar(&cfg.startupTaints, "startup-taint", nil,
		"Taint key=value:Effect put on every registered Node and removed --startup-taint-delay later, as a network agent does "+
			"(Cilium: node.cilium.io/agent-not-ready=true:NoSchedule). Repeatable.")
	fs.DurationVar(&cfg.startupTaintDelay, "startup-taint-delay", def.StartupTaintDelay, "How long startup taints stay on a new Node.")
	return cfg
}

// complete applies --exact: realism flags not given explicitly take the
// exact mode's values.
func (cfg *config) complete(fs *pflag.FlagSet) {
	if !cfg.exact {
		return
	}
	exact := armsim.Exact()
	defaults := map[string]func(){
		"boot-jitter":         func() { cfg.bootJitter = 0 },
		"reservation":         func() { cfg.reservation = exact.Reservation.String() },
		"max-pods":            func() { cfg.maxPods = exact.MaxPods },
		"ephemeral-storage":   func() { cfg.ephemeralStorage = "" },
		"provider-ids":        func() { cfg.providerIDs = providerIDsARM },
		"device-plugin-delay": func() { cfg.devicePluginDelay = exact.DevicePluginDelay },
	}
	for name, set := range defaults {
		if !fs.Changed(name) {
			set()
		}
	}
}

// realism builds the registered nodes' Realism from the flags.
func (cfg *config) realism() (armsim.Realism, error) {
	var r armsim.Realism
	var err error
	if r.Reservation, err = armsim.ParseReservation(cfg.reservation); err != nil {
		return r, fmt.Errorf("--reservation: %w", err)
	}
	if cfg.maxPods < 0 {
		return r, fmt.Errorf("--max-pods %d: must not be negative", cfg.maxPods)
	}
	r.MaxPods = cfg.maxPods
	if cfg.ephemeralStorage != "" {
		if r.EphemeralStorage, err = parseEphemeralStorage(cfg.ephemeralStorage); err != nil {
			return r, err
		}
	}
	if r.AzureProviderIDs, err = parseProviderIDs(cfg.providerIDs); err != nil {
		return r, err
	}
	for name, d := range map[string]time.Duration{"--device-plugin-delay": cfg.devicePluginDelay, "--startup-taint-delay": cfg.startupTaintDelay} {
		if d < 0 {
			return r, fmt.Errorf("%s %v: must not be negative", name, d)
		}
	}
	r.DevicePluginDelay, r.StartupTaintDelay = cfg.devicePluginDelay, cfg.startupTaintDelay
	if r.StartupTaints, err = parseTaints("--startup-taint", cfg.startupTaints); err != nil {
		return r, err
	}
	if err := r.Validate(); err != nil {
		return r, err
	}
	return r, nil
}

// parseProviderIDs parses --provider-ids: whether node providerIDs take
// cloud-provider-azure's form.
func parseProviderIDs(v string) (bool, error) {
	switch v {
	case providerIDsAzure:
		return true, nil
	case providerIDsARM:
		return false, nil
	}
	return false, fmt.Errorf("--provider-ids %q: want %s or %s", v, providerIDsAzure, providerIDsARM)
}

// parseEphemeralStorage parses --ephemeral-storage, a positive quantity.
func parseEphemeralStorage(v string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return q, fmt.Errorf("--ephemeral-storage %q: %w", v, err)
	}
	if q.Sign() <= 0 {
		return q, fmt.Errorf("--ephemeral-storage %q: must be positive", v)
	}
	return q, nil
}

// parseTaints parses the values of a repeatable taint flag.
func parseTaints(flag string, values []string) ([]v1.Taint, error) {
	var taints []v1.Taint
	for _, s := range values {
		taint, err := armsim.ParseTaint(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		taints = append(taints, taint)
	}
	return taints, nil
}

func run(ctx context.Context, cfg *config) error {
	specs, err := cfg.scaleSetSpecs()
	if err != nil {
		return err
	}
	opts, err := cfg.options()
	if err != nil {
		return err
	}
	srv, err := newSimulator(opts, specs)
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return fmt.Errorf("starting the simulator: %w", err)
	}
	defer srv.Close()
	if cfg.caOut != "" {
		if err := os.WriteFile(cfg.caOut, srv.CACertPEM(), 0o644); err != nil {
			return fmt.Errorf("writing the certificate to %s: %w", cfg.caOut, err)
		}
	}
	fmt.Printf("ARM simulator listening on %s\n", srv.URL())
	srv.Run(ctx)
	klog.InfoS("Shutting down the ARM simulator")
	return nil
}

// scaleSetSpecs parses the --scale-set flags and applies the per scale set
// options to them.
func (cfg *config) scaleSetSpecs() ([]armsim.ScaleSetSpec, error) {
	specs := make([]armsim.ScaleSetSpec, 0, len(cfg.scaleSets))
	for _, s := range cfg.scaleSets {
		spec, err := parseScaleSet(s)
		if err != nil {
			return nil, err
		}
		specs = append(specs, spec)
	}
	if err := cfg.applySetOptions(specs); err != nil {
		return nil, err
	}
	return specs, nil
}

// options builds the simulator's options from the flags, with its
// throttling and, with --kubeconfig, its node hook.
func (cfg *config) options() (armsim.Options, error) {
	opts := armsim.Options{
		SubscriptionID: cfg.subscription,
		Location:       cfg.location,
		BootDelay:      cfg.bootDelay,
		BootJitter:     cfg.bootJitter,
		Seed:           cfg.seed,
		DeleteDelay:    cfg.deleteDelay,
		LRODuration:    cfg.lroDuration,
		PageSize:       cfg.pageSize,
		Addr:           cfg.listen,

		ExtensionDelay:  cfg.extensionDelay,
		FixedOperations: cfg.fixedOperations,
		NoPreemption:    cfg.noPreemption,
	}
	switch {
	case cfg.bootJitter < 0:
		return opts, fmt.Errorf("--boot-jitter %v: must not be negative", cfg.bootJitter)
	case cfg.extensionDelay < 0:
		return opts, fmt.Errorf("--extension-delay %v: must not be negative", cfg.extensionDelay)
	}
	throttling, err := cfg.throttlingOptions()
	if err != nil {
		return opts, err
	}
	opts.Throttling = throttling
	realism, err := cfg.realism()
	if err != nil {
		return opts, err
	}
	if cfg.kubeconfig != "" {
		hook, err := newKubeHook(cfg, realism)
		if err != nil {
			return opts, err
		}
		opts.Hook = hook
	}
	return opts, nil
}

// newSimulator creates the simulator with the scale sets, not yet serving.
func newSimulator(opts armsim.Options, specs []armsim.ScaleSetSpec) (*armsim.Server, error) {
	srv, err := armsim.New(opts)
	if err != nil {
		return nil, fmt.Errorf("creating the simulator: %w", err)
	}
	for _, spec := range specs {
		if err := srv.AddScaleSet(spec); err != nil {
			return nil, fmt.Errorf("--scale-set: %w", err)
		}
	}
	return srv, nil
}

// parseScaleSet parses "rg/name:SKU:capacity[:k=v,k=v]". Tag values may
// contain ':' (taint tags do), so everything after the third ':' is tags.
func parseScaleSet(s string) (armsim.ScaleSetSpec, error) {
	parts := strings.SplitN(s, ":", 4)
	if len(parts) < 3 {
		return armsim.ScaleSetSpec{}, fmt.Errorf("--scale-set %q: want rg/name:SKU:capacity[:k=v,k=v]", s)
	}
	rg, name, ok := strings.Cut(parts[0], "/")
	if !ok || rg == "" || name == "" || strings.Contains(name, "/") {
		return armsim.ScaleSetSpec{}, fmt.Errorf("--scale-set %q: want rg/name before the first ':'", s)
	}
	capacity, err := strconv.Atoi(parts[2])
	if err != nil {
		return armsim.ScaleSetSpec{}, fmt.Errorf("--scale-set %q: capacity: %w", s, err)
	}
	spec := armsim.ScaleSetSpec{ResourceGroup: rg, Name: name, SKU: parts[1], Capacity: capacity}
	if len(parts) == 4 && parts[3] != "" {
		if spec.Tags, err = parseTags(s, parts[3]); err != nil {
			return armsim.ScaleSetSpec{}, err
		}
	}
	return spec, nil
}

// parseTags parses the tags part of --scale-set s, "k=v,k=v".
func parseTags(s, tags string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(tags, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--scale-set %q: tag %q: want k=v", s, kv)
		}
		out[k] = v
	}
	return out, nil
}

// applySetOptions applies --flexible, --overprovision, --spot and
// --computer-name-prefix to the scale sets they name; one that names no
// --scale-set is refused, and so is overprovisioning a Flexible one.
func (cfg *config) applySetOptions(specs []armsim.ScaleSetSpec) error {
	byKey := make(scaleSetIndex, len(specs))
	for i := range specs {
		byKey[strings.ToLower(specs[i].ResourceGroup+"/"+specs[i].Name)] = &specs[i]
	}
	for _, apply := range []func(scaleSetIndex) error{cfg.applyFlexible, cfg.applyOverprovision, cfg.applySpot, cfg.applyComputerPrefix} {
		if err := apply(byKey); err != nil {
			return err
		}
	}
	return nil
}

// scaleSetIndex holds the --scale-set specs by lower-case "rg/name".
type scaleSetIndex map[string]*armsim.ScaleSetSpec

// spec is the --scale-set that value of --flag names by key.
func (idx scaleSetIndex) spec(flag, value, key string) (*armsim.ScaleSetSpec, error) {
	spec, ok := idx[strings.ToLower(key)]
	if !ok {
		return nil, fmt.Errorf("--%s %q: %s is no --scale-set", flag, value, key)
	}
	return spec, nil
}

// applyFlexible applies --flexible.
func (cfg *config) applyFlexible(idx scaleSetIndex) error {
	for _, v := range cfg.flexible {
		spec, err := idx.spec("flexible", v, v)
		if err != nil {
			return err
		}
		spec.Flexible = true
	}
	return nil
}

// applyOverprovision applies --overprovision, after --flexible.
func (cfg *config) applyOverprovision(idx scaleSetIndex) error {
	for _, v := range cfg.overprovision {
		spec, err := idx.spec("overprovision", v, v)
		if err != nil {
			return err
		}
		if spec.Flexible {
			return fmt.Errorf("--overprovision %q: a Flexible scale set does not overprovision", v)
		}
		spec.Overprovision = true
	}
	return nil
}

// applySpot applies --spot, with its eviction policy.
func (cfg *config) applySpot(idx scaleSetIndex) error {
	for _, v := range cfg.spot {
		key, policy, _ := strings.Cut(v, ":")
		spec, err := idx.spec("spot", v, key)
		if err != nil {
			return err
		}
		if policy != "" && policy != armsim.EvictionDelete && policy != armsim.EvictionDeallocate {
			return fmt.Errorf("--spot %q: eviction policy %q: want %s or %s", v, policy, armsim.EvictionDelete, armsim.EvictionDeallocate)
		}
		spec.Spot, spec.EvictionPolicy = true, policy
	}
	return nil
}

// applyComputerPrefix applies --computer-name-prefix.
func (cfg *config) applyComputerPrefix(idx scaleSetIndex) error {
	for _, v := range cfg.computerPrefix {
		key, prefix, ok := strings.Cut(v, ":")
		if !ok || prefix == "" {
			return fmt.Errorf("--computer-name-prefix %q: want rg/name:prefix", v)
		}
		spec, err := idx.spec("computer-name-prefix", v, key)
		if err != nil {
			return err
		}
		spec.ComputerNamePrefix = prefix
	}
	return nil
}

// newKubeHook builds the node hook from --kubeconfig, --register-taint,
// --node-annotation and the realism flags.
func newKubeHook(cfg *config, realism armsim.Realism) (*armsim.KubeNodeHook, error) {
	registerTaints, err := parseTaints("--register-taint", cfg.registerTaints)
	if err != nil {
		return nil, err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", cfg.kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("creating a Kubernetes client: %w", err)
	}
	hook := &armsim.KubeNodeHook{Client: client, RegisterTaints: registerTaints, Realism: realism}
	for _, s := range cfg.annotations {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-annotation %q: want k=v", s)
		}
		if hook.Annotations == nil {
			hook.Annotations = map[string]string{}
		}
		hook.Annotations[k] = v
	}
	return hook, nil
}

// throttlingOptions builds the simulator's throttling from the flags.
func (cfg *config) throttlingOptions() (armsim.Throttling, error) {
	t := armsim.Throttling{Disabled: !cfg.throttling, Compute: armsim.ComputePolicies(), ARM: armsim.ARMLimits{GlobalFactor: cfg.armGlobalFactor}}
	if cfg.armGlobalFactor < 1 {
		return t, fmt.Errorf("--arm-global-factor %d: must be at least 1", cfg.armGlobalFactor)
	}
	for _, f := range []struct {
		flag, value string
		rate        *armsim.Rate
	}{{"--arm-reads", cfg.armReads, &t.ARM.Reads}, {"--arm-writes", cfg.armWrites, &t.ARM.Writes}, {"--arm-deletes", cfg.armDeletes, &t.ARM.Deletes}} {
		r, err := parseRate(f.value, false)
		if err != nil {
			return t, fmt.Errorf("%s: %w", f.flag, err)
		}
		*f.rate = r
	}
	for _, v := range cfg.computePolicies {
		name, value, ok := strings.Cut(v, "=")
		p, known := armsim.ComputePolicy(name)
		switch {
		case !ok:
			return t, fmt.Errorf("--compute-policy %q: want Name=rate or Name=off", v)
		case !known:
			return t, fmt.Errorf("--compute-policy %q: unknown policy %q", v, name)
		case strings.EqualFold(strings.TrimSpace(value), "off"):
			t.Compute = slices.DeleteFunc(t.Compute, func(q armsim.Policy) bool { return q.Name == p.Name })
			continue
		}
		r, err := parseRate(value, p.FixedWindow)
		if err != nil {
			return t, fmt.Errorf("--compute-policy %q: %w", v, err)
		}
		p.Rate = r
		t.Compute = armsim.WithPolicy(t.Compute, p)
	}
	return t, nil
}

// parseRate parses "capacity+refill/period" (a token bucket) or, fixed,
// "limit/period" (a fixed window).
func parseRate(s string, fixed bool) (armsim.Rate, error) {
	var r armsim.Rate
	counts, period, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return r, fmt.Errorf("rate %q: want %s", s, rateForm(fixed))
	}
	d, err := time.ParseDuration(period)
	if err != nil {
		return r, fmt.Errorf("rate %q: period: %w", s, err)
	}
	r.Period = d
	if r.Capacity, r.Refill, err = parseRateCounts(s, counts, fixed); err != nil {
		return r, err
	}
	if r.Capacity <= 0 || r.Period <= 0 || (!fixed && r.Refill <= 0) {
		return r, fmt.Errorf("rate %q: capacity, refill and period must be positive", s)
	}
	return r, nil
}

// parseRateCounts parses the counts of rate s: "capacity+refill", or
// fixed "limit".
func parseRateCounts(s, counts string, fixed bool) (capacity, refill int, err error) {
	c, rf, hasRefill := strings.Cut(counts, "+")
	if hasRefill == fixed {
		return 0, 0, fmt.Errorf("rate %q: want %s", s, rateForm(fixed))
	}
	if capacity, err = strconv.Atoi(c); err != nil {
		return capacity, 0, fmt.Errorf("rate %q: capacity: %w", s, err)
	}
	if hasRefill {
		if refill, err = strconv.Atoi(rf); err != nil {
			return capacity, refill, fmt.Errorf("rate %q: refill: %w", s, err)
		}
	}
	return capacity, refill, nil
}

func rateForm(fixed bool) string {
	if fixed {
		return `"limit/period" (a fixed window), e.g. "900/30m"`
	}
	return `"capacity+refill/period" (a token bucket), e.g. "12+4/1m"`
}

// formatRate is parseRate's inverse.
func formatRate(r armsim.Rate, fixed bool) string {
	period := r.Period.String()
	if strings.HasSuffix(period, "m0s") {
		period = strings.TrimSuffix(period, "0s")
	}
	if strings.HasSuffix(period, "h0m") {
		period = strings.TrimSuffix(period, "0m")
	}
	if fixed {
		return fmt.Sprintf("%d/%s", r.Capacity, period)
	}
	return fmt.Sprintf("%d+%d/%s", r.Capacity, r.Refill, period)
}

// policyDefaults lists the default Compute policies for --help.
func policyDefaults() string {
	var parts []string
	for _, p := range armsim.ComputePolicies() {
		parts = append(parts, p.Name+"="+formatRate(p.Rate, p.FixedWindow))
	}
	return strings.Join(parts, ", ")
}
