package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// DefaultChecksPath is where --checks looks by default: the check
// configuration mounted from a ConfigMap.
const DefaultChecksPath = "/etc/vmss-autoscaler/preflight/checks.yaml"

// defaultTaint is design.md's preflight taint in --taint's form,
// vmss-autoscaler.io/preflight=pending:NoSchedule.
func defaultTaint() string {
	return preflight.DefaultTaintKey + "=" + preflight.DefaultTaintValue + ":" + string(corev1.TaintEffectNoSchedule)
}

// options are Main's parsed flags.
type options struct {
	kubeconfig string
	nodeName   string
	checksPath string
	mode       mode
	interval   time.Duration
	dryRun     bool
	names      names
}

// Main runs the preflight agent with the given command-line arguments
// (without the program name and subcommand) until its work is done or ctx
// is cancelled.
//
// In the default, DaemonSet mode it runs the checks on the node named by
// --node-name (default $NODE_NAME) unless the node already passed, or
// failed (see --retry-failed), reports the result on the Node, and then
// blocks until ctx is cancelled instead of returning: a DaemonSet pod that
// exits is restarted, and would loop. The DaemonSet is meant to select
// nodes by the label value "pending" (nodeSelector
// vmss-autoscaler.io/preflight: pending), so that once the agent labels the
// node passed or failed the DaemonSet controller deletes the pod, which
// cancels ctx (SIGTERM) and Main returns nil.
//
// With --periodic it checks a node labelled passed again, marks it failed on
// failure (without adding a taint) or refreshes its passed-at annotation,
// and returns (a CronJob), or repeats every --interval.
//
// With --dry-run it runs the checks, prints the result to stdout and
// changes nothing; the error is non-nil when a check failed.
//
// It returns pflag.ErrHelp (wrapped) for --help.
func Main(ctx context.Context, args []string) error {
	o, err := parseOptions(args, os.Getenv)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(o.checksPath)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if o.nodeName != "" {
		logger = logger.WithValues("node", o.nodeName)
	}
	ctx = klog.NewContext(ctx, logger)

	if o.dryRun {
		return dryRun(ctx, cfg, os.Stdout)
	}
	client, err := newClient(o.kubeconfig)
	if err != nil {
		return err
	}
	a := &agent{
		opts: o, cfg: cfg, runner: runner{},
		nodes:  nodeClient{client: client, nodeName: o.nodeName},
		events: newEvents(context.WithoutCancel(ctx), client, o.nodeName),
	}
	defer a.events.close(context.WithoutCancel(ctx))
	return a.loop(ctx)
}

// parseOptions parses and validates the flags; getenv supplies NODE_NAME.
func parseOptions(args []string, getenv func(string) string) (*options, error) {
	// The passed-at annotation is not a flag: the autoscaler's core reads
	// it by its fixed name.
	o := &options{names: names{passedAtAnnotation: preflight.PassedAtAnnotation}}
	var taint string
	fs := pflag.NewFlagSet("preflight", pflag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	fs.StringVar(&o.nodeName, "node-name", getenv("NODE_NAME"), "the node this agent runs on, the only one it reads and updates (default $NODE_NAME)")
	fs.StringVar(&o.checksPath, "checks", DefaultChecksPath, "check configuration (YAML)")
	fs.BoolVar(&o.mode.periodic, "periodic", false, "check a node that already passed again; mark it failed on failure, refresh its passed-at annotation on success; then exit, or repeat every --interval")
	fs.DurationVar(&o.interval, "interval", 0, "with --periodic: run every interval instead of once")
	fs.BoolVar(&o.mode.retryFailed, "retry-failed", false, "run the checks on a node already labelled failed (DaemonSet mode)")
	fs.StringVar(&taint, "taint", defaultTaint(), "the preflight taint, key=value:Effect; removed on pass (matched by key and effect)")
	fs.StringVar(&o.names.label, "label", preflight.DefaultLabel, "the result label: "+preflight.ValuePending+", "+preflight.ValuePassed+" or "+preflight.ValueFailed)
	fs.StringVar(&o.names.failureAnnotation, "failure-annotation", preflight.DefaultFailureAnnotation, "annotation saying which check failed and why")
	fs.BoolVar(&o.dryRun, "dry-run", false, "run the checks and print the result; change nothing (no API access)")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("preflight: unexpected arguments %q", fs.Args())
	}
	if err := o.validate(taint); err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	return o, nil
}

// validate checks the parsed options and sets the taint parsed from
// --taint.
func (o *options) validate(taint string) error {
	var errs []error
	var err error
	if o.names.taint, err = parseTaint(taint); err != nil {
		errs = append(errs, err)
	}
	if err := o.nodeNameError(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, o.nameErrors()...)
	if err := o.intervalError(); err != nil {
		errs = append(errs, err)
	}
	if o.mode.retryFailed && o.mode.periodic {
		errs = append(errs, errors.New("--retry-failed: not with --periodic, which checks only nodes that passed"))
	}
	return errors.Join(errs...)
}

// nodeNameError checks --node-name: required but with --dry-run, a DNS
// subdomain.
func (o *options) nodeNameError() error {
	switch {
	case o.nodeName == "" && !o.dryRun:
		return errors.New("--node-name: required (or set NODE_NAME), the agent only ever touches its own node")
	case o.nodeName != "":
		if msgs := validation.IsDNS1123Subdomain(o.nodeName); len(msgs) > 0 {
			return fmt.Errorf("--node-name=%q: %s", o.nodeName, strings.Join(msgs, "; "))
		}
	}
	return nil
}

// nameErrors checks --label and --failure-annotation: qualified names,
// the annotation not the passed-at one.
func (o *options) nameErrors() []error {
	var errs []error
	for _, f := range []struct{ flag, value string }{
		{"--label", o.names.label},
		{"--failure-annotation", o.names.failureAnnotation},
	} {
		if msgs := validation.IsQualifiedName(f.value); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s=%q: %s", f.flag, f.value, strings.Join(msgs, "; ")))
		}
	}
	if o.names.failureAnnotation == o.names.passedAtAnnotation {
		errs = append(errs, fmt.Errorf("--failure-annotation=%q: taken by the passed-at annotation", o.names.failureAnnotation))
	}
	return errs
}

// intervalError checks --interval: 0 (run once), or between 1s and
// maxInterval with --periodic.
func (o *options) intervalError() error {
	switch {
	case o.interval < 0:
		return fmt.Errorf("--interval=%s: must not be negative", o.interval)
	case o.interval > 0 && (o.interval < time.Second || o.interval > maxInterval):
		return fmt.Errorf("--interval=%s: must be between 1s and %s (0: run once)", o.interval, maxInterval)
	case o.interval > 0 && !o.mode.periodic:
		return fmt.Errorf("--interval=%s: only with --periodic", o.interval)
	}
	return nil
}

func newClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("in-cluster configuration (set --kubeconfig outside a cluster): %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("--kubeconfig=%s: %w", kubeconfig, err)
	}
	cfg.UserAgent = eventComponent
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return client, nil
}

// agent runs the checks on its node and reports the result there.
type agent struct {
	opts   *options
	cfg    *checkConfig
	runner runner
	nodes  nodeClient
	events *events
}

// loop is Main's mode: once then wait for ctx (DaemonSet), once (periodic),
// or every interval (periodic with --interval).
func (a *agent) loop(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for {
		if err := a.once(ctx); err != nil {
			return err
		}
		switch {
		case !a.opts.mode.periodic:
			logger.Info("Done; waiting to be stopped: the DaemonSet controller removes this pod once the node no longer has the label value it selects",
				"label", a.opts.names.label, "selectedValue", preflight.ValuePending)
			<-ctx.Done()
			return nil
		case a.opts.interval == 0:
			return nil
		}
		t := time.NewTimer(a.opts.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// once runs the checks if the node's state asks for it and reports the
// result on the node.
func (a *agent) once(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	node, err := a.nodes.get(ctx)
	if err != nil {
		return err
	}
	if run, why := shouldRun(node, a.opts.names, a.opts.mode); !run {
		logger.Info("Not running the checks", "reason", why, "label", node.Labels[a.opts.names.label])
		return nil
	}

	logger.Info("Running preflight checks", "checks", len(a.cfg.Checks), "deadline", a.cfg.Deadline, "periodic", a.opts.mode.periodic)
	res, err := a.runner.run(ctx, a.cfg)
	logResult(logger, &res)
	if err != nil {
		return fmt.Errorf("preflight checks interrupted, nothing reported: %w", err)
	}

	now := time.Now()
	var skipped string
	node, wrote, err := a.nodes.update(ctx, func(n *corev1.Node) bool {
		changed, why := applyResult(n, a.opts.names, a.opts.mode, &res, a.cfg.OutputLimit, now)
		skipped = why
		return changed
	})
	if err != nil {
		return fmt.Errorf("report preflight result: %w", err)
	}
	if skipped != "" {
		logger.Info("Node changed while the checks ran; result not recorded", "reason", skipped)
		return nil
	}
	if f := res.Failed(); f != nil {
		msg := failureMessage(f, min(a.cfg.OutputLimit, eventMessageLimit))
		a.events.emit(node, corev1.EventTypeWarning, ReasonFailed, msg)
		logger.Info("Marked node failed", "label", a.opts.names.label, "updated", wrote, "check", f.Name, "reason", f.Reason)
		return nil
	}
	a.events.emit(node, corev1.EventTypeNormal, ReasonPassed,
		fmt.Sprintf("all %d preflight checks passed in %s", len(res.Checks), res.Duration.Round(time.Millisecond)))
	logger.Info("Marked node passed", "label", a.opts.names.label, "updated", wrote)
	return nil
}

func logResult(logger klog.Logger, res *runResult) {
	for _, c := range res.Checks {
		if c.Passed {
			logger.Info("Check passed", "check", c.Name, "duration", c.Duration, "matches", c.Matches, "attempts", c.Attempts)
			continue
		}
		logger.Info("Check failed", "check", c.Name, "duration", c.Duration, "failure", c.Failure,
			"reason", c.Reason, "attempts", c.Attempts, "exitCode", c.ExitCode, "outputBytes", c.OutputBytes, "output", c.Output)
	}
}

// dryRun runs the checks and prints the result; a failed check is an error.
func dryRun(ctx context.Context, cfg *checkConfig, w io.Writer) error {
	res, err := runner{}.run(ctx, cfg)
	printResult(w, cfg, &res)
	if err != nil {
		return fmt.Errorf("preflight checks interrupted: %w", err)
	}
	if f := res.Failed(); f != nil {
		return fmt.Errorf("preflight failed: check %s: %s", f.Name, f.Reason)
	}
	return nil
}

func printResult(w io.Writer, cfg *checkConfig, res *runResult) {
	verdict := "PASSED"
	if !res.Passed() {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "preflight %s: %d of %d checks run in %s (deadline %s)\n",
		verdict, len(res.Checks), len(cfg.Checks), res.Duration.Round(time.Millisecond), cfg.Deadline)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range res.Checks {
		status := "PASS"
		if !c.Passed {
			status = "FAIL"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", status, c.Name, c.Duration.Round(time.Millisecond), c.Reason)
	}
	_ = tw.Flush()
	if f := res.Failed(); f != nil && f.Output != "" {
		fmt.Fprintf(w, "output of %s (last %d of %d bytes):\n%s\n", f.Name, len(f.Output), f.OutputBytes, f.Output)
	}
}
