// Command scale is the scale harness (make scale): it drives the autoscaler
// binary, with its default flags, on a real local control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, kwok) and the ARM
// simulator with realistic nodes and ARM's subscription limits, from 0 to
// thousands of nodes, and measures what it costs.
//
// Scenarios, each on a fresh control plane:
//
//   - burst: one Deployment of whole-cluster size with default smoothing,
//     then scaled to 0 and watched scaling down under the safety brake;
//   - burst-unsmoothed: the same burst with --node-addition-smoothing=false
//     (every planned node at once, as cluster-autoscaler does);
//   - gangs: several training gangs (PodGroups, native gang scheduling) of
//     hundreds of whole 8-GPU nodes each, larger than --max-nodes-in-flight.
//
// It writes report.md, report.json and SVG plots to --out, prints the table,
// and exits 1 when a check fails (a workload not Running in time, smoothing
// or the brake exceeded, more nodes than the pods need, the autoscaler
// exiting). It stops everything it started, also on Ctrl-C.
//
// The xl size is the seeds' size on the real GPU layout (issue #38):
// 7,500 Standard_ND96isr_H100_v5 nodes (8 GPUs each) in 75 InfiniBand
// scale sets of 100 (singlePlacementGroup=true, --layout=ib), one
// whole-node 8-GPU pod each. A run from 0 would take most of an hour, so
// 55 scale sets start full (--seed-nodes 5,500), their nodes Ready and
// their pods Running before the autoscaler starts; the Deployment is then
// scaled to the full size and the autoscaler adds the rest (2,000) in the
// 20 empty sets with its defaults, scale-down timings included, against
// the simulator's Compute RP policies (on by default) with operations of
// minutes, compressed (--boot-delay, --extension-delay). It then holds the
// cluster until the autoscaler has run 30 minutes (--min-autoscaler-run),
// so that the VM lists are counted over a whole 30-minute window, and
// judges the run on the criteria (azure.go). To fit 2 cores,
// kwok's Lease heartbeat is slowed (a 240 s Lease renewed every 60 s, not
// every 10 s) and the node lifecycle controller's grace raised to match
// (300 s).
//
//	go run ./e2e/scale --size=ci     # 60 nodes per scenario, about 7 minutes (CI)
//	go run ./e2e/scale --size=full   # 2,000 nodes / 8,000 pods, gangs of 400: about 45 minutes
//	go run ./e2e/scale --size=xl     # 75 IB sets: 5,500 seeded + 2,000 added = 7,500 GPU nodes: about 45 minutes
//	go run ./e2e/scale --size=xl --nodes=1000 --seed-nodes=500 --min-autoscaler-run=0   # the same layout, 10 sets
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// size is how large a run is.
type size struct {
	// nodes is the burst's cluster size (CPU nodes).
	nodes int
	// gangs of gangSize whole GPU nodes each.
	gangs, gangSize int
	// scaleDownFor is how long the scale-down is watched.
	scaleDownFor time.Duration
	// timeout bounds each scale-up.
	timeout time.Duration
	// bootDelay is how long a VM takes to become a node.
	bootDelay time.Duration
	// podCPU is what a burst pod requests: the pods a node holds.
	podCPU resource.Quantity
	// seed is how many of the burst's nodes exist (VMs running, nodes
	// Ready) before the autoscaler starts and the workload is submitted.
	seed int
	// hold is how long the run stays at full size once every pod runs,
	// capacity checked and the autoscaler measured (loops, requests, CPU).
	hold time.Duration
	// scenarios run by default.
	scenarios []string
	// The control plane's node heartbeats (harness.Options); 0 for the
	// harness's defaults, a kubelet's.
	kwokLeaseSeconds       int
	kwokStatusInterval     time.Duration
	nodeMonitorGracePeriod time.Duration
	// layout is the burst's scale sets: layoutCPU (CPU sets of up to
	// 1,000, the seed spread evenly) or layoutIB (InfiniBand GPU sets of
	// 100, the seed filling whole sets, an 8-GPU pod a node).
	layout string
	// lro is the least the simulator's long-running operations last (0:
	// armLRODuration); a scale-out's lasts until its VMs are provisioned.
	lro time.Duration
	// extensions is how long a new VM provisions its extensions once
	// booted (armsim.Options.ExtensionDelay); its node registers then.
	extensions time.Duration
	// minRun holds the cluster at full size until the autoscaler has run
	// this long (0: just hold).
	minRun time.Duration
}

const (
	layoutCPU = "cpu"
	layoutIB  = "ib"
)

var allScenarios = []string{"burst", "burst-unsmoothed", "gangs"}

var sizes = map[string]size{
	"ci":   {nodes: 60, gangs: 2, gangSize: 20, scaleDownFor: 2 * time.Minute, timeout: 8 * time.Minute, bootDelay: 20 * time.Second, podCPU: resource.MustParse("500m"), hold: settle, scenarios: allScenarios},
	"full": {nodes: 2000, gangs: 4, gangSize: 400, scaleDownFor: 8 * time.Minute, timeout: 40 * time.Minute, bootDelay: time.Minute, podCPU: resource.MustParse("3500m"), hold: settle, scenarios: allScenarios},
	// The seeds' size on the InfiniBand layout: 75 sets of 100 H100 VMs,
	// 55 of them full at the start, one 8-GPU pod a node. Operations of
	// minutes, compressed: a VM boots in 1 minute ±30 s, then runs its
	// extensions for a minute (the simulator assumes 5 minutes for a GPU
	// size, armsim.GPUExtensionDelay), and a scale-out's operation lasts
	// until its VMs are provisioned, 2 to 2.5 minutes.
	"xl": {nodes: 7500, seed: 5500, timeout: 30 * time.Minute, bootDelay: time.Minute, podCPU: resource.MustParse("10"), hold: 3 * time.Minute, scenarios: []string{"burst"},
		kwokLeaseSeconds: 240, nodeMonitorGracePeriod: 300 * time.Second, layout: layoutIB, extensions: time.Minute, minRun: vmListWindow},
}

type options struct {
	size      string
	sz        size
	scenarios []string
	out       string
	bootDelay time.Duration
	// autoscalerFlags are added to the autoscaler's command line, after
	// the harness's own; the report names them.
	autoscalerFlags []string
}

func main() {
	var o options
	fs := pflag.NewFlagSet("scale", pflag.ContinueOnError)
	fs.StringVar(&o.size, "size", "ci", "run size: ci (60 nodes, 1,860 pods, gangs of 20: about 7 minutes), full (2,000 nodes, 8,000 pods, gangs of 400) or xl (7,500 GPU nodes in 75 InfiniBand scale sets of 100, 5,500 of them seeded, one 8-GPU pod a node, burst only, slowed kwok heartbeats, judged on issue #38's criteria)")
	nodes := fs.Int("nodes", 0, "the burst's nodes (default: the size's)")
	gangs := fs.Int("gangs", 0, "number of gangs (default: the size's)")
	gangSize := fs.Int("gang-size", 0, "whole nodes per gang (default: the size's)")
	podCPU := fs.String("pod-cpu", "", "CPU a burst pod requests on the cpu layout, which sets the pods per node (default: the size's, 500m for ci: 31 a node; 3500m for full: 4 a node; the ib layout's pod takes a whole node)")
	fs.StringSliceVar(&o.scenarios, "scenarios", nil, "scenarios to run, in order (default: the size's; burst, burst-unsmoothed, gangs for ci and full)")
	seed := fs.Int("seed-nodes", 0, "of the burst's nodes, how many exist (VMs running, nodes Ready) before the autoscaler starts and the workload is submitted; the autoscaler adds the rest (default: the size's, 0 but for xl: 5,500)")
	hold := fs.Duration("hold", 0, "how long to stay at full size once every pod runs, measuring the autoscaler there (default: the size's, 30s; 3m for xl)")
	scaleDownFor := fs.Duration("scale-down-for", 0, "how long the burst's scale-down is watched; 0: not at all, and the autoscaler keeps its default scale-down timings (default: the size's, 2m for ci, 8m for full, 0 for xl)")
	timeout := fs.Duration("timeout", 0, "bound on each scale-up (default: the size's)")
	leaseSeconds := fs.Int("kwok-node-lease-seconds", 0, "the Lease duration kwok sets on each node, renewed every quarter of it (default: the size's; 0 a kubelet's 40 s, renewed every 10 s; 240 for xl)")
	statusInterval := fs.Duration("kwok-node-status-interval", 0, "how often kwok updates each Ready node's status, plus up to 10s (default: the size's; kwok's 10m)")
	grace := fs.Duration("node-monitor-grace-period", 0, "kube-controller-manager's --node-monitor-grace-period: how long a node may miss its heartbeat before it is Unknown; raise it with --kwok-node-lease-seconds (default: the size's; 0 the controller manager's 50s; 300s for xl)")
	fs.StringVar(&o.out, "out", "", "where the report, plots and logs go (default: a new folder under .cache/scale)")
	replot := fs.String("replot", "", "only redraw the plots of this report.json, beside it, and exit")
	layout := fs.String("layout", "", "the burst's scale sets: cpu (Standard_D16s_v5 sets of up to 1,000, the seed spread evenly) or ib (InfiniBand Standard_ND96isr_H100_v5 sets of 100 with singlePlacementGroup=true, as many as --nodes needs, the seed filling whole sets, one 8-GPU pod a node) (default: the size's, ib for xl)")
	lro := fs.Duration("lro-duration", 0, "the least the ARM simulator's long-running operations (scale-set updates, instance deletions) stay InProgress; a scale-out's lasts until its VMs are provisioned (default: 10s)")
	extensions := fs.Duration("extension-delay", 0, "how long a new simulated VM runs its extensions once booted, before it is provisioned and its node registers (default: the size's, 0; 1m for xl)")
	minRun := fs.Duration("min-autoscaler-run", 0, "hold the cluster at full size until the autoscaler has run this long, so that its VM lists are counted over a whole 30-minute window; 0: just --hold (default: the size's, 30m for xl)")
	fs.StringArrayVar(&o.autoscalerFlags, "autoscaler-flag", nil, "a flag added to the autoscaler's command line, e.g. --autoscaler-flag=--azure-concurrent-scale-ups (repeatable; the report names them; default: none, every flag but the wiring is the autoscaler's default)")
	fs.DurationVar(&o.bootDelay, "boot-delay", 0, "time a simulated VM takes from creation to a registered node, ±half of it as jitter (default: the size's, 20s for ci, 1m for full)")
	measure.ParseFlags(fs, os.Args[1:])
	if *replot != "" {
		if err := redraw(*replot); err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
		return
	}
	sz, ok := sizes[o.size]
	if !ok {
		fmt.Fprintf(os.Stderr, "scale: --size: %q is not one of ci, full, xl\n", o.size)
		os.Exit(2)
	}
	for flag, v := range map[string]*int{"--nodes": nodes, "--gangs": gangs, "--gang-size": gangSize} {
		if *v < 0 {
			fmt.Fprintf(os.Stderr, "scale: %s: must not be negative, got %d\n", flag, *v)
			os.Exit(2)
		}
	}
	if *nodes > 0 {
		sz.nodes = *nodes
	}
	if *gangs > 0 {
		sz.gangs = *gangs
	}
	if *gangSize > 0 {
		sz.gangSize = *gangSize
	}
	if *podCPU != "" {
		q, err := resource.ParseQuantity(*podCPU)
		if err != nil || q.Sign() <= 0 {
			fmt.Fprintf(os.Stderr, "scale: --pod-cpu: %q is not a positive quantity\n", *podCPU)
			os.Exit(2)
		}
		sz.podCPU = q
	}
	if fs.Changed("seed-nodes") {
		sz.seed = *seed
	}
	if *hold > 0 {
		sz.hold = *hold
	}
	if fs.Changed("scale-down-for") {
		sz.scaleDownFor = *scaleDownFor
	}
	if *timeout > 0 {
		sz.timeout = *timeout
	}
	if *leaseSeconds > 0 {
		sz.kwokLeaseSeconds = *leaseSeconds
	}
	if *statusInterval > 0 {
		sz.kwokStatusInterval = *statusInterval
	}
	if *grace > 0 {
		sz.nodeMonitorGracePeriod = *grace
	}
	if *layout != "" {
		sz.layout = *layout
	}
	if sz.layout == "" {
		sz.layout = layoutCPU
	}
	if *lro > 0 {
		sz.lro = *lro
	}
	if sz.lro == 0 {
		sz.lro = armLRODuration
	}
	if fs.Changed("extension-delay") {
		sz.extensions = *extensions
	}
	if fs.Changed("min-autoscaler-run") {
		sz.minRun = *minRun
	}
	switch {
	case sz.seed >= sz.nodes:
		fmt.Fprintf(os.Stderr, "scale: --seed-nodes: %d leaves nothing for the autoscaler to add to the burst's %d nodes\n", sz.seed, sz.nodes)
		os.Exit(2)
	case *leaseSeconds != 0 && *leaseSeconds < 4:
		fmt.Fprintf(os.Stderr, "scale: --kwok-node-lease-seconds: must be at least 4, got %d\n", *leaseSeconds)
		os.Exit(2)
	case sz.layout != layoutCPU && sz.layout != layoutIB:
		fmt.Fprintf(os.Stderr, "scale: --layout: %q is not one of %s, %s\n", sz.layout, layoutCPU, layoutIB)
		os.Exit(2)
	case *seed < 0 || *statusInterval < 0 || *grace < 0 || *hold < 0 || *timeout < 0 || *scaleDownFor < 0 || *lro < 0 || *minRun < 0 || *extensions < 0:
		fmt.Fprintln(os.Stderr, "scale: counts and durations must not be negative")
		os.Exit(2)
	}
	if len(o.scenarios) == 0 {
		o.scenarios = sz.scenarios
	}
	switch {
	case o.bootDelay < 0:
		fmt.Fprintf(os.Stderr, "scale: --boot-delay: must not be negative, got %s\n", o.bootDelay)
		os.Exit(2)
	case o.bootDelay == 0:
		o.bootDelay = sz.bootDelay
	}
	if sz.gangSize > scaleSetLimit {
		fmt.Fprintf(os.Stderr, "scale: --gang-size: %d does not fit one scale set (at most %d VMs)\n", sz.gangSize, scaleSetLimit)
		os.Exit(2)
	}
	for _, s := range o.scenarios {
		if s == "gangs" && sz.gangs*sz.gangSize == 0 {
			fmt.Fprintf(os.Stderr, "scale: --scenarios: gangs needs --gangs and --gang-size (size %s has none)\n", o.size)
			os.Exit(2)
		}
		if !slices.Contains(scenarioNames, s) {
			fmt.Fprintf(os.Stderr, "scale: --scenarios: %q is not one of %s\n", s, strings.Join(scenarioNames, ", "))
			os.Exit(2)
		}
	}
	o.sz = sz
	// Components log to files; the harness prints progress and the table.
	measure.Main("scale", func(ctx context.Context) error { return run(ctx, o) })
}

// redraw draws the plots of a report.json again, beside it.
func redraw(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return writePlots(filepath.Dir(path), rep.Scenarios)
}

// heartbeats describes the control plane's node heartbeats in a run.
func heartbeats(sz size) string {
	lease := sz.kwokLeaseSeconds
	if lease == 0 {
		lease = harness.DefaultKwokNodeLeaseSeconds
	}
	status := "every 10m"
	if sz.kwokStatusInterval > 0 {
		status = "every " + sz.kwokStatusInterval.String()
	}
	grace := "the default 50s"
	if sz.nodeMonitorGracePeriod > 0 {
		grace = sz.nodeMonitorGracePeriod.String()
	}
	s := fmt.Sprintf("kwok renews each node's %d s Lease every %d s and updates its status %s; node-monitor-grace-period %s", lease, lease/4, status, grace)
	if lease != harness.DefaultKwokNodeLeaseSeconds || sz.kwokStatusInterval > 0 || sz.nodeMonitorGracePeriod > 0 {
		s += " (slowed from a kubelet's 10 s Lease renewal to fit the machine)"
	}
	return s
}

func say(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, o options) error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	if o.out == "" {
		o.out = filepath.Join(root, ".cache", "scale", o.size+"-"+time.Now().Format("20060102-150405"))
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", o.out, err)
	}
	say("scale harness, size %s: burst of %d nodes (%d seeded, %s layout), %d gangs of %d GPU nodes; %s; output in %s", o.size, o.sz.nodes, o.sz.seed, o.sz.layout, o.sz.gangs, o.sz.gangSize, heartbeats(o.sz), o.out)
	say("building the control plane and the autoscaler (the first build takes ~10 minutes on 2 cores) ...")
	bins, err := harness.BuildBinaries(ctx)
	if err != nil {
		return err
	}
	autoscalerBin, err := harness.BuildGoBinary(ctx, "./cmd/vmss-autoscaler", "vmss-autoscaler")
	if err != nil {
		return err
	}
	rep := &report{Size: o.size, Machine: machine(), Started: time.Now().UTC(), BootDelay: o.bootDelay.String(), Heartbeats: heartbeats(o.sz), SeedNodes: o.sz.seed,
		Layout: o.sz.layout, LRODuration: o.sz.lro.String(), Extensions: o.sz.extensions.String()}
	rep.ScaleDownCompressed = o.sz.scaleDownFor > 0
	rep.AutoscalerFlags = o.autoscalerFlags
	for _, name := range o.scenarios {
		sc := newScenario(name, o, bins, autoscalerBin)
		say("scenario %s: %s", name, sc.describe())
		res, err := sc.run(ctx)
		if err == nil && ctx.Err() != nil {
			// Interrupted: report what was measured, run nothing more.
			rep.Scenarios = append(rep.Scenarios, res)
			rep.Failures = append(rep.Failures, "interrupted during "+name)
			break
		}
		if err != nil {
			// The run itself broke (not a failed check): keep what was
			// measured and say where the logs are.
			return fmt.Errorf("scenario %s: %w (logs in %s)", name, err, sc.dir)
		}
		rep.Scenarios = append(rep.Scenarios, res)
		say("scenario %s done in %s", name, res.Duration)
	}
	rep.Finished = time.Now().UTC()
	rep.check()
	if err := rep.write(o.out); err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(rep.markdown())
	fmt.Println()
	say("report: %s, %s; plots: %s", filepath.Join(o.out, "report.md"), filepath.Join(o.out, "report.json"), strings.Join(plotFiles, ", "))
	if fails := rep.failures(); len(fails) > 0 {
		return fmt.Errorf("%d checks failed:\n  %s", len(fails), strings.Join(fails, "\n  "))
	}
	return nil
}
