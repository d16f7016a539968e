// Package measure is what the e2e tools (demo, peer and scale) share: how
// they run, and how they measure a control plane and the processes on it,
// so that each tool reports the same figure the same way.
//
//   - Main and ParseFlags: a tool's command line, signals and exit status.
//   - ProcUsage and CPUModel: a process's memory and CPU time, and the
//     machine's CPU, from /proc.
//   - Scrape, APIServerMetrics, ParseMetrics and Sum: Prometheus metrics of
//     a process and of the API server.
//   - Watch, NodeName and Phases: informers on the nodes and the workload's
//     pods, whose events each tool keeps as it needs.
//   - PodsPerNode: how many of the workload's pods a simulated node holds.
//   - WriteReport: report.json and report.md.
package measure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// ParseFlags parses args into fs (made with pflag.ContinueOnError), and
// exits 0 when they ask for help (fs has printed its usage) and 2 when they
// are wrong, naming the tool and the flag (with ContinueOnError, pflag
// prints nothing then: the tools used to exit 2 silently).
func ParseFlags(fs *pflag.FlagSet, args []string) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", fs.Name(), err)
		os.Exit(2)
	}
}

// Main runs a tool: klog discarded (the components log to files; the tool
// prints its own progress), run's context cancelled on SIGINT or SIGTERM,
// and when run fails, "tool: error" on stderr and exit status 1.
func Main(tool string, run func(context.Context) error) {
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, tool+":", err)
		os.Exit(1)
	}
}
