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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// config is the parsed command line.
type config struct {
	listen          string
	subscription    string
	location        string
	scaleSets       []string
	bootDelay       time.Duration
	deleteDelay     time.Duration
	lroDuration     time.Duration
	readsPerWindow  int
	writesPerWindow int
	window          time.Duration
	pageSize        int
	caOut           string
	kubeconfig      string
	startupTaints   []string
	annotations     []string
}

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
	fs.DurationVar(&cfg.bootDelay, "boot-delay", 0, "How long new VMs stay Creating.")
	fs.DurationVar(&cfg.deleteDelay, "delete-delay", 0, "How long deleted VMs stay Deleting.")
	fs.DurationVar(&cfg.lroDuration, "lro-duration", 0, "How long asynchronous operations stay InProgress.")
	fs.IntVar(&cfg.readsPerWindow, "reads-per-window", 0, "Subscription read requests allowed per window; 0 = unlimited.")
	fs.IntVar(&cfg.writesPerWindow, "writes-per-window", 0, "Subscription write requests allowed per window; 0 = unlimited.")
	fs.DurationVar(&cfg.window, "window", time.Minute, "Throttling window.")
	fs.IntVar(&cfg.pageSize, "page-size", 1000, "VM list page size.")
	fs.StringVar(&cfg.caOut, "ca-out", "", "File to write the PEM of the server's self-signed certificate to.")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "Kubeconfig of a cluster to register a Node in for each running VM.")
	fs.StringArrayVar(&cfg.startupTaints, "startup-taint", nil, "Taint key=value:Effect to put on every registered Node. Repeatable.")
	fs.StringArrayVar(&cfg.annotations, "node-annotation", nil, "Annotation k=v to put on every registered Node. Repeatable.")
	return cfg
}

func run(ctx context.Context, cfg *config) error {
	specs := make([]armsim.ScaleSetSpec, 0, len(cfg.scaleSets))
	for _, s := range cfg.scaleSets {
		spec, err := parseScaleSet(s)
		if err != nil {
			return err
		}
		specs = append(specs, spec)
	}
	opts := armsim.Options{
		SubscriptionID:  cfg.subscription,
		Location:        cfg.location,
		BootDelay:       cfg.bootDelay,
		DeleteDelay:     cfg.deleteDelay,
		LRODuration:     cfg.lroDuration,
		ReadsPerWindow:  cfg.readsPerWindow,
		WritesPerWindow: cfg.writesPerWindow,
		Window:          cfg.window,
		PageSize:        cfg.pageSize,
		Addr:            cfg.listen,
	}
	if cfg.kubeconfig != "" {
		hook, err := newKubeHook(cfg)
		if err != nil {
			return err
		}
		opts.Hook = hook
	}
	srv, err := armsim.New(opts)
	if err != nil {
		return fmt.Errorf("creating the simulator: %w", err)
	}
	for _, spec := range specs {
		if err := srv.AddScaleSet(spec); err != nil {
			return fmt.Errorf("--scale-set: %w", err)
		}
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
		spec.Tags = map[string]string{}
		for _, kv := range strings.Split(parts[3], ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return armsim.ScaleSetSpec{}, fmt.Errorf("--scale-set %q: tag %q: want k=v", s, kv)
			}
			spec.Tags[k] = v
		}
	}
	return spec, nil
}

// newKubeHook builds the node hook from --kubeconfig, --startup-taint and
// --node-annotation.
func newKubeHook(cfg *config) (*armsim.KubeNodeHook, error) {
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", cfg.kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("creating a Kubernetes client: %w", err)
	}
	hook := &armsim.KubeNodeHook{Client: client}
	for _, s := range cfg.startupTaints {
		taint, err := armsim.ParseTaint(s)
		if err != nil {
			return nil, fmt.Errorf("--startup-taint: %w", err)
		}
		hook.StartupTaints = append(hook.StartupTaints, taint)
	}
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
