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
//	go run ./e2e/scale --size=ci     # 60 nodes per scenario, about 7 minutes (CI)
//	go run ./e2e/scale --size=full   # 2,000 nodes / 8,000 pods, gangs of 400: about 45 minutes
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
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
}

var sizes = map[string]size{
	"ci":   {nodes: 60, gangs: 2, gangSize: 20, scaleDownFor: 2 * time.Minute, timeout: 8 * time.Minute, bootDelay: 20 * time.Second, podCPU: resource.MustParse("500m")},
	"full": {nodes: 2000, gangs: 4, gangSize: 400, scaleDownFor: 8 * time.Minute, timeout: 40 * time.Minute, bootDelay: time.Minute, podCPU: resource.MustParse("3500m")},
}

type options struct {
	size      string
	sz        size
	scenarios []string
	out       string
	bootDelay time.Duration
}

func main() {
	var o options
	fs := pflag.NewFlagSet("scale", pflag.ContinueOnError)
	fs.StringVar(&o.size, "size", "ci", "run size: ci (60 nodes, 1,860 pods, gangs of 20: about 7 minutes) or full (2,000 nodes, 8,000 pods, gangs of 400)")
	nodes := fs.Int("nodes", 0, "the burst's nodes (default: the size's)")
	gangs := fs.Int("gangs", 0, "number of gangs (default: the size's)")
	gangSize := fs.Int("gang-size", 0, "whole nodes per gang (default: the size's)")
	podCPU := fs.String("pod-cpu", "", "CPU a burst pod requests, which sets the pods per node (default: the size's, 500m for ci: 31 a node; 3500m for full: 4 a node)")
	fs.StringSliceVar(&o.scenarios, "scenarios", []string{"burst", "burst-unsmoothed", "gangs"}, "scenarios to run, in order")
	fs.StringVar(&o.out, "out", "", "where the report, plots and logs go (default: a new folder under .cache/scale)")
	replot := fs.String("replot", "", "only redraw the plots of this report.json, beside it, and exit")
	fs.DurationVar(&o.bootDelay, "boot-delay", 0, "time a simulated VM takes from creation to a registered node, ±half of it as jitter (default: the size's, 20s for ci, 1m for full)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if *replot != "" {
		if err := redraw(*replot); err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
		return
	}
	sz, ok := sizes[o.size]
	if !ok {
		fmt.Fprintf(os.Stderr, "scale: --size: %q is not one of ci, full\n", o.size)
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
		if !slices.Contains(scenarioNames, s) {
			fmt.Fprintf(os.Stderr, "scale: --scenarios: %q is not one of %s\n", s, strings.Join(scenarioNames, ", "))
			os.Exit(2)
		}
	}
	o.sz = sz
	// Components log to files; the harness prints progress and the table.
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
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
	say("scale harness, size %s: burst of %d nodes, %d gangs of %d GPU nodes; output in %s", o.size, o.sz.nodes, o.sz.gangs, o.sz.gangSize, o.out)
	say("building the control plane and the autoscaler (the first build takes ~10 minutes on 2 cores) ...")
	bins, err := harness.BuildBinaries(ctx)
	if err != nil {
		return err
	}
	autoscalerBin, err := harness.BuildGoBinary(ctx, ".", "vmss-autoscaler")
	if err != nil {
		return err
	}
	rep := &report{Size: o.size, Machine: machine(), Started: time.Now().UTC(), BootDelay: o.bootDelay.String()}
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
