// Command replay replays a public GPU cluster trace (the Alibaba
// cluster-trace-gpu-v2023 OpenB pod list) compressed in time against this
// autoscaler, Karpenter's kwok provider and a floor oracle, and reports
// what users pay and wait for: pod pending time and idle GPU node-hours
// (issue #44).
//
// Phase 1 (this): the trace, the workload model, the floor and the
// accounting and report; it runs the floor only, and its report marks ours
// and Karpenter "not run". Phase 2 adds the driver that creates and
// deletes the pods on a fresh real control plane for each. See README.md.
//
// The trace states no licence: it is read from a path (--trace, by default
// ../shared/traces/openb_pod_list_default.csv beside the repository root
// when there) and never copied into the repository.
//
//	go run ./e2e/replay --trace=<path> --sides=floor
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// notYet is why phase 1 does not run an autoscaler.
const notYet = "phase 1: the driver that replays the trace on a real control plane is not written yet"

type options struct {
	trace       string
	window      window
	compression float64
	rounds      int
	sides       []string
	bootDelay   time.Duration
	oursFlags   []string
	reportDir   string
}

func main() {
	var o options
	fs := pflag.NewFlagSet("replay", pflag.ContinueOnError)
	fs.StringVar(&o.trace, "trace", "", "the trace's "+traceFile+" (default ../shared/traces/"+traceFile+" beside the repository root, when there)")
	fs.DurationVar(&o.window.Start, "window-start", 0, "replay the trace from this far into it (trace time)")
	fs.DurationVar(&o.window.Length, "window", 0, "replay this much of the trace (trace time; 0: to its end)")
	fs.Float64Var(&o.compression, "compression", 0, "trace seconds per replayed second (0: the window's span over 20 minutes, rounded up)")
	fs.IntVar(&o.rounds, "rounds", 1, "rounds of each autoscaler, interleaved; the report shows each figure's median (the floor is computed once)")
	fs.StringSliceVar(&o.sides, "sides", sideNames(), "sides to run: ours, karpenter, floor")
	fs.DurationVar(&o.bootDelay, "boot-delay", 0, "a node's boot as Azure has it (e.g. 8m for an ND H100 v5 with preflight), compressed like the trace, the same on every side")
	fs.StringArrayVar(&o.oursFlags, "ours-flag", nil, "a flag added to this autoscaler's command line, for a variant (repeatable)")
	fs.StringVar(&o.reportDir, "report-dir", "", "where report.md and report.json go (default .cache/replay)")
	measure.ParseFlags(fs, os.Args[1:])
	if err := o.check(); err != nil {
		fmt.Fprintln(os.Stderr, "replay:", err)
		os.Exit(2)
	}
	measure.Main("replay", func(ctx context.Context) error { return run(ctx, o) })
}

// check refuses options that cannot be run.
func (o options) check() error {
	if err := checkSides(o.sides); err != nil {
		return err
	}
	switch {
	case o.rounds < 1 || o.rounds > 20:
		return fmt.Errorf("--rounds: %d is not between 1 and 20", o.rounds)
	case o.bootDelay < 0:
		return fmt.Errorf("--boot-delay: %s is negative", o.bootDelay)
	case o.window.Start < 0 || o.window.Length < 0:
		return fmt.Errorf("--window-start %s, --window %s: neither may be negative", o.window.Start, o.window.Length)
	case o.compression != 0 && o.compression < 1:
		return fmt.Errorf("--compression: %v is below 1 (0: the default)", o.compression)
	}
	return nil
}

// checkSides refuses no sides, or one not known.
func checkSides(sides []string) error {
	if len(sides) == 0 {
		return fmt.Errorf("--sides: none given (want some of %s)", strings.Join(sideNames(), ", "))
	}
	for _, s := range sides {
		if !slices.Contains(sideNames(), s) {
			return fmt.Errorf("--sides: %q is not one of %s", s, strings.Join(sideNames(), ", "))
		}
	}
	return nil
}

func say(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, o options) error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	if o.trace == "" {
		if o.trace = defaultTracePath(root); o.trace == "" {
			return missingTraceError(filepath.Join(filepath.Dir(root), "shared", "traces", traceFile), os.ErrNotExist)
		}
	}
	if o.reportDir == "" {
		o.reportDir = filepath.Join(root, ".cache", "replay")
	}
	if err := os.MkdirAll(o.reportDir, 0o755); err != nil {
		return fmt.Errorf("--report-dir %s: %w", o.reportDir, err)
	}
	rep, err := replay(ctx, o)
	if err != nil {
		return err
	}
	if err := rep.write(o.reportDir); err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(rep.markdown())
	fmt.Println()
	say("report: %s, %s", filepath.Join(o.reportDir, "report.md"), filepath.Join(o.reportDir, "report.json"))
	return nil
}

// replay reads the trace, builds the workload and runs the sides asked
// for that phase 1 can run (the floor).
func replay(ctx context.Context, o options) (*report, error) {
	rep := &report{Machine: machine(), Started: time.Now().UTC(), Trace: o.trace, Citation: traceCitation,
		BootDelay: o.bootDelay.String(), Sides: o.sides, Rounds: o.rounds, OursFlags: o.oursFlags, NotRun: map[string]string{}}
	tr, err := readTrace(o.trace)
	if err != nil {
		return nil, err
	}
	rep.TracePods, rep.TraceEndSeconds = len(tr.Pods), tr.End
	node, err := shapeOf(nodeSKU)
	if err != nil {
		return nil, err
	}
	w, err := buildWorkload(tr, workloadOptions{Window: o.window, Compression: o.compression, Budget: defaultBudget, Node: node})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.trace, err)
	}
	rep.Workload, rep.Pods = w, len(w.Pods)
	boot := time.Duration(float64(o.bootDelay) / w.Compression)
	rep.BootDelayReplay = boot.String()
	say("trace %s: %d pods; replaying %d over %s (compression %.0f×), boot %s (%s replayed)", o.trace, len(tr.Pods), len(w.Pods), w.Span.Round(time.Second), w.Compression, o.bootDelay, boot)
	for _, s := range o.sides {
		if s != sideFloor {
			rep.NotRun[s] = notYet
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r := floor(w, boot)
		f, err := account(r.Timeline, w.Compression)
		if err != nil {
			return nil, fmt.Errorf("the floor's timeline: %w", err)
		}
		rep.Results = append(rep.Results, round{Side: sideFloor, Round: 1, Figures: f})
		rep.FloorBoundNodeHours = r.BoundNodeHours * w.Compression
	}
	rep.Finished = time.Now().UTC()
	return rep, nil
}
