package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// defaultGrace is how long a check gets to exit after SIGTERM (timeout,
// deadline) before it is killed, and how long its output pipe may stay open
// once its processes are gone.
const defaultGrace = 5 * time.Second

// failure says why a check failed.
type failure string

const (
	failExit      failure = "exit"      // non-zero exit status or killed by a signal
	failTimeout   failure = "timeout"   // the check's own timeout
	failDeadline  failure = "deadline"  // the total deadline of all checks
	failNoMatch   failure = "no-match"  // exit 0 but too few matching lines
	failForbidden failure = "forbidden" // exit 0 but a line matched mustNotMatch
	failThreshold failure = "threshold" // exit 0 but a captured number was out of [min, max]
	failStart     failure = "start"     // the command could not be started
)

// checkResult is what one check did.
type checkResult struct {
	Name    string
	Passed  bool
	Failure failure // empty when Passed
	// Reason is a short explanation of a failure: "exit code 1",
	// "timed out after 30s", "3 lines matched '^GPU \d+:', want 8".
	Reason   string
	ExitCode int // -1 when the command did not exit on its own
	Matches  int // lines matched, when the check has a match
	// Output is the end of the combined stdout and stderr, at most the
	// config's OutputLimit bytes, valid UTF-8.
	Output      string
	OutputBytes int64 // how much the check printed in all
	// Attempts is how many times the check ran (1 + retries used); the
	// fields above are the last attempt's, Duration covers them all.
	Attempts int
	Duration time.Duration
}

// runResult is the outcome of a run: the checks that ran, in order. Only the
// last can have failed, since a run stops at the first failure.
type runResult struct {
	Checks   []checkResult
	Duration time.Duration
}

// Passed reports whether every check ran and passed.
func (r *runResult) Passed() bool { return r.Failed() == nil && len(r.Checks) > 0 }

// Failed returns the failed check, or nil.
func (r *runResult) Failed() *checkResult {
	if n := len(r.Checks); n > 0 && !r.Checks[n-1].Passed {
		return &r.Checks[n-1]
	}
	return nil
}

// runner runs checks as real processes.
type runner struct {
	// grace: see defaultGrace.
	grace time.Duration
}

// run runs cfg's checks in order, each within its timeout and all within
// cfg.Deadline, and stops at the first failure. A failure is part of the
// result; the error is non-nil only when ctx ended first (the agent is
// being stopped), in which case the node must not be reported as failed.
func (r runner) run(ctx context.Context, cfg *checkConfig) (runResult, error) {
	start := time.Now()
	errDeadline := fmt.Errorf("deadline %s exceeded", cfg.Deadline)
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Deadline, errDeadline)
	defer cancel()

	var res runResult
	for _, ch := range cfg.Checks {
		cr, err := r.runWithRetries(ctx, ch, cfg.OutputLimit, errDeadline)
		if err != nil {
			res.Duration = time.Since(start)
			return res, err
		}
		res.Checks = append(res.Checks, cr)
		if !cr.Passed {
			break
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

// runWithRetries runs a check, and again after a failure while it has
// retries left, RetryDelay apart. A command that could not start is not
// retried (it will not start the next time either). When the deadline
// ends the delay, the last failure stands.
func (r runner) runWithRetries(ctx context.Context, ch checkSpec, outputLimit int, errDeadline error) (checkResult, error) {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		cr, err := r.runCheck(ctx, ch, outputLimit, errDeadline)
		cr.Attempts = attempt
		cr.Duration = time.Since(start)
		if cr.lastAttempt(err, attempt, ch.Retries) {
			if !cr.Passed && attempt > 1 {
				cr.Reason += fmt.Sprintf(" (attempt %d of %d)", attempt, ch.Retries+1)
			}
			return cr, err
		}
		klog.FromContext(ctx).Info("Check failed; retrying", "check", ch.Name, "attempt", attempt, "of", ch.Retries+1,
			"reason", cr.Reason, "retryDelay", ch.RetryDelay)
		t := time.NewTimer(ch.RetryDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if context.Cause(ctx) != errDeadline {
				return cr, fmt.Errorf("check %s interrupted: %w", ch.Name, context.Cause(ctx))
			}
			cr.Reason += fmt.Sprintf(" (attempt %d of %d; the deadline came before the next)", attempt, ch.Retries+1)
			return cr, nil
		}
	}
}

// lastAttempt says an attempt whose result is cr (err, the agent
// stopped) is the check's last: it passed, could not start, met the
// deadline, or was the last of its retries.
func (cr *checkResult) lastAttempt(err error, attempt, retries int) bool {
	return err != nil || cr.Passed || cr.Failure == failStart || cr.Failure == failDeadline || attempt > retries
}

// runCheck runs one check. The command runs in its own process group so
// that a timeout stops everything it started: the group gets SIGTERM, the
// leader SIGKILL after the grace period (cmd.WaitDelay), and whatever is
// left of the group SIGKILL once the leader is gone, on success as on
// failure, so no check leaves processes behind. Output goes through a pipe
// the runner owns, so a process that escaped the group and keeps it open
// cannot hang the run either.
func (r runner) runCheck(ctx context.Context, ch checkSpec, outputLimit int, errDeadline error) (cr checkResult, err error) {
	cr = checkResult{Name: ch.Name, ExitCode: -1}
	start := time.Now()
	defer func() { cr.Duration = time.Since(start) }()

	if ctx.Err() != nil {
		return cr, stopped(ctx, &cr, nil, errDeadline)
	}

	errTimeout := fmt.Errorf("timed out after %s", ch.Timeout)
	ctx, cancel := context.WithTimeoutCause(ctx, ch.Timeout, errTimeout)
	defer cancel()

	grace := r.graceOrDefault()
	cmd := exec.CommandContext(ctx, ch.Command[0], ch.Command[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return signalGroup(cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = grace

	pr, pw, err := os.Pipe()
	if err != nil {
		return cr, fmt.Errorf("check %s: output pipe: %w", ch.Name, err)
	}
	defer pr.Close()
	cmd.Stdout, cmd.Stderr = pw, pw // one pipe: stdout and stderr interleave as written
	err = cmd.Start()
	pw.Close() // the children hold the write end now
	if err != nil {
		if ctx.Err() != nil { // Start refuses a done context: not the node's fault
			return cr, stopped(ctx, &cr, errTimeout, errDeadline)
		}
		cr.Failure, cr.Reason = failStart, fmt.Sprintf("start: %v", err)
		return cr, nil
	}
	pgid := cmd.Process.Pid

	out := newCapture(&ch)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(out, pr) // ends at EOF, or with an error once pr is closed below
	}()

	waitErr := cmd.Wait()
	_ = signalGroup(pgid, syscall.SIGKILL) // what the leader left behind
	drain := time.NewTimer(grace)
	select {
	case <-copied:
	case <-drain.C:
		pr.Close() // a process outside the group still holds the pipe
		<-copied
	}
	drain.Stop()
	out.finish()

	cr.Output = truncateTail(string(out.output()), outputLimit)
	cr.OutputBytes = out.total
	cr.Matches = out.lines.matches
	if cmd.ProcessState != nil {
		cr.ExitCode = cmd.ProcessState.ExitCode()
	}

	err = judge(ctx, &cr, &ch, &out.lines, waitErr, errTimeout, errDeadline)
	return cr, err
}

// graceOrDefault is r.grace, else defaultGrace.
func (r runner) graceOrDefault() time.Duration {
	if r.grace <= 0 {
		return defaultGrace
	}
	return r.grace
}

// judge records on cr the verdict on a check whose command ended with
// waitErr and whose output the line rules saw as lines: failed by its
// exit, stopped by ctx (see stopped, whose error it returns), failed by
// its output, or passed.
func judge(ctx context.Context, cr *checkResult, ch *checkSpec, lines *lineStats, waitErr, errTimeout, errDeadline error) error {
	switch {
	case waitErr == nil:
		// exited 0; the match decides below
	case ctx.Err() != nil:
		return stopped(ctx, cr, errTimeout, errDeadline)
	default:
		cr.Failure, cr.Reason = failExit, exitReason(waitErr)
		return nil
	}
	if f, why := lines.verdict(ch); f != "" {
		cr.Failure, cr.Reason = f, why
		return nil
	}
	cr.Passed = true
	return nil
}

// stopped records why ctx stopped a check: its own timeout (errTimeout) or
// the total deadline (errDeadline) fail the check; anything else means the
// agent itself is being stopped, which interrupts the run (the error).
func stopped(ctx context.Context, cr *checkResult, errTimeout, errDeadline error) error {
	switch cause := context.Cause(ctx); cause {
	case errTimeout:
		cr.Failure, cr.Reason = failTimeout, cause.Error()
	case errDeadline:
		cr.Failure, cr.Reason = failDeadline, cause.Error()
	default:
		return fmt.Errorf("check %s interrupted: %w", cr.Name, cause)
	}
	return nil
}

// signalGroup signals every process of the group pgid. A group that is
// already gone counts as done (os.ErrProcessDone, which exec.Cmd.Cancel
// understands).
func signalGroup(pgid int, sig syscall.Signal) error {
	err := syscall.Kill(-pgid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// exitReason describes how a command that ran ended unsuccessfully.
func exitReason(err error) string {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err.Error()
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by signal %d (%s)", int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("exit code %d", ee.ExitCode())
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// failureMessage is the failure annotation's value and the event's message:
// "check <name>: <reason>: <output>", at most limit bytes. The output is cut
// first (keeping its end); the rest only if it alone is too long.
func failureMessage(cr *checkResult, limit int) string {
	head := fmt.Sprintf("check %s: %s", cr.Name, cr.Reason)
	output := strings.TrimSpace(cr.Output)
	if output == "" {
		return truncateHead(head, limit)
	}
	head += ": "
	if len(head) >= limit {
		return truncateHead(head, limit)
	}
	return head + truncateTail(output, limit-len(head))
}
