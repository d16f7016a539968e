package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"
)

// testDeadline bounds every runner test: a check that is not stopped
// (sleep 30) would outlive it, so a run that returns within it proves the
// runner stopped the check.
const testDeadline = 10 * time.Second

// checkOption changes a check under construction.
type checkOption func(*checkSpec)

// check builds a check running argv with a 10 s timeout.
func newCheck(name string, argv []string, opts ...checkOption) checkSpec {
	c := checkSpec{Name: name, Command: argv, Timeout: 10 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func sh(script string) []string { return []string{"sh", "-c", script} }

func timeout(d time.Duration) checkOption { return func(c *checkSpec) { c.Timeout = d } }

func match(re string, min int) checkOption {
	return func(c *checkSpec) { c.Match, c.MinMatches = regexp.MustCompile(re), min }
}

// configOption changes a config under construction.
type configOption func(*checkConfig)

func deadline(d time.Duration) configOption { return func(c *checkConfig) { c.Deadline = d } }
func outputLimit(n int) configOption        { return func(c *checkConfig) { c.OutputLimit = n } }

// config builds a config of checks with a one-minute deadline. It does not
// go through validation, so that tests can set a deadline shorter than a
// timeout.
func newConfig(checks []checkSpec, opts ...configOption) *checkConfig {
	c := &checkConfig{Deadline: time.Minute, OutputLimit: defaultOutputLimit, Checks: checks}
	for _, o := range opts {
		o(c)
	}
	return c
}

// runWithin runs cfg with r and fails the test if the run does not return
// within testDeadline. The run's own context is not the test's, so a hang
// shows as a test failure rather than as an interrupted run.
func runWithin(t *testing.T, r runner, cfg *checkConfig) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	type outcome struct {
		res runResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := r.run(context.Background(), cfg)
		done <- outcome{res, err}
	}()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("run: %v", o.err)
		}
		return o.res
	case <-ctx.Done():
		t.Fatalf("run did not return within %s", testDeadline)
		return runResult{}
	}
}

func TestRunSingleCheck(t *testing.T) {
	t.Parallel()
	gpus := sh("echo GPU 0: x; echo GPU 1: y")
	tests := []struct {
		name     string
		check    checkSpec
		passed   bool
		failure  failure
		reason   string
		exitCode int
		matches  int
		output   string
	}{
		{"true", newCheck("t", []string{"true"}), true, "", "", 0, 0, ""},
		{"false", newCheck("f", []string{"false"}), false, failExit, "exit code 1", 1, 0, ""},
		{"exit code", newCheck("e", sh("echo broken >&2; exit 3")), false, failExit, "exit code 3", 3, 0, "broken\n"},
		{"killed by a signal", newCheck("k", sh("kill -9 $$")), false, failExit, "killed by signal 9 (killed)", -1, 0, ""},
		{"not found", newCheck("n", []string{"/nonexistent/preflight-check"}), false, failStart, "start: fork/exec /nonexistent/preflight-check: no such file or directory", -1, 0, ""},
		{"enough matches", newCheck("gpus", gpus, match(`^GPU \d+:`, 2)), true, "", "", 0, 2, "GPU 0: x\nGPU 1: y\n"},
		{"too few matches", newCheck("gpus", gpus, match(`^GPU \d+:`, 8)), false, failNoMatch, `2 lines matched '^GPU \d+:', want 8`, 0, 2, "GPU 0: x\nGPU 1: y\n"},
		{"one match", newCheck("gpus", sh("echo GPU 0: x"), match(`^GPU \d+:`, 8)), false, failNoMatch, `1 line matched '^GPU \d+:', want 8`, 0, 1, "GPU 0: x\n"},
		{"stderr counts, last line needs no newline", newCheck("gpus", sh(`echo 'GPU 0: x' >&2; printf 'GPU 1: y\r\nGPU 2: z'`), match(`^GPU \d+: .$`, 3)), true, "", "", 0, 3, "GPU 0: x\nGPU 1: y\r\nGPU 2: z"},
		{"matches do not save a failed exit", newCheck("gpus", sh("echo GPU 0: x; exit 1"), match(`^GPU`, 1)), false, failExit, "exit code 1", 1, 1, "GPU 0: x\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := runWithin(t, runner{}, newConfig([]checkSpec{tc.check}))
			if len(res.Checks) != 1 {
				t.Fatalf("ran %d checks, want 1", len(res.Checks))
			}
			c := res.Checks[0]
			if c.Name != tc.check.Name || c.Passed != tc.passed || c.Failure != tc.failure || c.Reason != tc.reason ||
				c.ExitCode != tc.exitCode || c.Matches != tc.matches || c.Output != tc.output {
				t.Fatalf("result = %+v\nwant passed=%v failure=%q reason=%q exitCode=%d matches=%d output=%q",
					c, tc.passed, tc.failure, tc.reason, tc.exitCode, tc.matches, tc.output)
			}
			if res.Passed() != tc.passed {
				t.Errorf("Result.Passed() = %v, want %v", res.Passed(), tc.passed)
			}
			if c.Duration <= 0 || res.Duration < c.Duration {
				t.Errorf("durations: check %s, run %s", c.Duration, res.Duration)
			}
		})
	}
}

func TestRunTimeout(t *testing.T) {
	t.Parallel()
	res := runWithin(t, runner{}, newConfig([]checkSpec{newCheck("slow", sh("echo started; sleep 30"), timeout(time.Second))}))
	c := res.Failed()
	if c == nil || c.Failure != failTimeout || c.Reason != "timed out after 1s" || c.Output != "started\n" {
		t.Fatalf("result = %+v, want a timeout after 1s with the output so far", res.Checks)
	}
}

// A child that keeps the output pipe open must not keep the run waiting: the
// whole process group is stopped. The grace period is longer than the
// test's deadline, so the run returns in time only if the background sleep
// died and closed the pipe.
func TestRunTimeoutKillsChildrenHoldingThePipe(t *testing.T) {
	t.Parallel()
	r := runner{grace: 2 * testDeadline}
	res := runWithin(t, r, newConfig([]checkSpec{newCheck("children", sh("sleep 30 & echo started; wait"), timeout(time.Second))}))
	c := res.Failed()
	if c == nil || c.Failure != failTimeout || c.Output != "started\n" {
		t.Fatalf("result = %+v, want a timeout with output %q", res.Checks, "started\n")
	}
}

// On timeout every process of the check gets SIGTERM, so that tools can
// clean up: here a child reports it, and the shell waits for it. The grace
// period is longer than the test's deadline, so SIGKILL plays no part.
func TestRunTimeoutSendsSIGTERMToTheWholeGroup(t *testing.T) {
	t.Parallel()
	script := `( trap 'echo child got TERM; exit 0' TERM; sleep 30 & wait ) & child=$!
trap 'wait $child; exit 143' TERM
echo started; wait`
	res := runWithin(t, runner{grace: 2 * testDeadline}, newConfig([]checkSpec{newCheck("graceful", sh(script), timeout(time.Second))}))
	c := res.Failed()
	if c == nil || c.Failure != failTimeout || c.Output != "started\nchild got TERM\n" || c.ExitCode != 143 {
		t.Fatalf("result = %+v, want a timeout, exit code 143, the child's goodbye in the output", res.Checks)
	}
}

// A check that exits 0 but leaves a child running passes, and the child is
// killed with the rest of the group (else, holding the pipe, it would keep
// the run waiting past the test's deadline).
func TestRunKillsWhatAPassingCheckLeftBehind(t *testing.T) {
	t.Parallel()
	r := runner{grace: 2 * testDeadline}
	res := runWithin(t, r, newConfig([]checkSpec{newCheck("daemon", sh("sleep 30 & echo done"))}))
	if !res.Passed() || res.Checks[0].Output != "done\n" {
		t.Fatalf("result = %+v, want a pass with output %q", res.Checks, "done\n")
	}
}

// A check that ignores SIGTERM is killed after the grace period, and its
// children with it. The background child writes to a FIFO the test reads:
// EOF there means the child is gone.
func TestRunKillsChecksThatIgnoreSIGTERM(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	opened := make(chan *os.File, 1)
	go func() {
		f, err := os.Open(fifo) // blocks until the check opens it for writing
		if err != nil {
			t.Error(err)
		}
		opened <- f
	}()

	script := fmt.Sprintf(`trap "" TERM; { echo ready; exec sleep 30; } > %s & echo started; wait`, fifo)
	res := runWithin(t, runner{grace: 200 * time.Millisecond}, newConfig([]checkSpec{newCheck("stubborn", sh(script), timeout(2*time.Second))}))
	c := res.Failed()
	if c == nil || c.Failure != failTimeout || c.Output != "started\n" {
		t.Fatalf("result = %+v, want a timeout with output %q", res.Checks, "started\n")
	}

	var f *os.File
	select {
	case f = <-opened:
	case <-time.After(testDeadline):
		t.Fatal("the check's background child never opened the FIFO")
	}
	if f == nil {
		t.FailNow()
	}
	defer f.Close()
	if err := f.SetReadDeadline(time.Now().Add(testDeadline)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	var got []byte
	for {
		n, err := f.Read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the check's background child still holds the FIFO (read %q)", got)
		}
		if err != nil {
			break // EOF: every writer is gone
		}
	}
	if string(got) != "ready\n" {
		t.Errorf("FIFO = %q, want %q", got, "ready\n")
	}
}

// A process that left the check's process group (setsid) cannot be killed
// with it; the run still returns once the grace period for the output pipe
// is over.
func TestRunDoesNotWaitForEscapedProcesses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	script := fmt.Sprintf(`setsid sh -c 'echo $$ > %[1]s; exec sleep 30' & while [ ! -s %[1]s ]; do :; done; echo started`, pidFile)
	res := runWithin(t, runner{grace: 200 * time.Millisecond}, newConfig([]checkSpec{newCheck("escape", sh(script))}))
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	}
	if !res.Passed() || res.Checks[0].Output != "started\n" {
		t.Fatalf("result = %+v, want a pass with output %q", res.Checks, "started\n")
	}
}

func TestRunDeadlineStopsLaterChecks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	cfg := newConfig([]checkSpec{
		newCheck("first", []string{"true"}),
		newCheck("slow", sh("sleep 30")),
		newCheck("later", []string{"touch", marker}),
	}, deadline(time.Second))
	res := runWithin(t, runner{}, cfg)
	if len(res.Checks) != 2 || !res.Checks[0].Passed {
		t.Fatalf("checks run = %+v, want first (passed) and slow", res.Checks)
	}
	if c := res.Failed(); c == nil || c.Name != "slow" || c.Failure != failDeadline || c.Reason != "deadline 1s exceeded" {
		t.Fatalf("failed = %+v, want slow stopped by the deadline", c)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the check after the deadline ran (stat %s: %v)", marker, err)
	}
}

func TestRunStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	cfg := newConfig([]checkSpec{
		newCheck("ok", []string{"true"}),
		newCheck("broken", []string{"false"}),
		newCheck("later", []string{"touch", marker}),
	})
	res := runWithin(t, runner{}, cfg)
	if len(res.Checks) != 2 || res.Passed() {
		t.Fatalf("checks run = %+v, want ok and broken", res.Checks)
	}
	if c := res.Failed(); c.Name != "broken" {
		t.Fatalf("failed = %q, want broken", c.Name)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the check after the failure ran (stat %s: %v)", marker, err)
	}
}

func TestRunAllPass(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	res := runWithin(t, runner{}, newConfig([]checkSpec{newCheck("ok", []string{"true"}), newCheck("touch", []string{"touch", marker})}))
	if !res.Passed() || len(res.Checks) != 2 || res.Failed() != nil {
		t.Fatalf("result = %+v, want both passed", res.Checks)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the last check did not run: %v", err)
	}
}

func TestRunTruncatesOutput(t *testing.T) {
	t.Parallel()
	// 200 000 bytes of 'a', then a last line: more than the capture keeps.
	script := `head -c 200000 /dev/zero | tr '\0' a; echo; echo 'the error: é'; exit 1`
	res := runWithin(t, runner{}, newConfig([]checkSpec{newCheck("loud", sh(script))}, outputLimit(100)))
	c := res.Failed()
	if c == nil || c.Reason != "exit code 1" {
		t.Fatalf("result = %+v, want exit code 1", res.Checks)
	}
	if want := int64(200000 + 1 + len("the error: é\n")); c.OutputBytes != want {
		t.Errorf("OutputBytes = %d, want %d", c.OutputBytes, want)
	}
	if len(c.Output) > 100 || !strings.HasPrefix(c.Output, ellipsis) || !strings.HasSuffix(c.Output, "aaa\nthe error: é\n") || !utf8.ValidString(c.Output) {
		t.Errorf("Output = %q (%d bytes), want the last 100 bytes behind %q", c.Output, len(c.Output), ellipsis)
	}
}

// A run whose context ends (the agent is stopped) is interrupted, not a
// failure of the node: run returns an error, not a failed check.
func TestRunInterrupted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	testCtx, testCancel := context.WithTimeout(context.Background(), testDeadline)
	defer testCancel()
	done := make(chan error, 1)
	go func() {
		_, err := runner{}.run(ctx, newConfig([]checkSpec{newCheck("slow", sh("sleep 30"))}))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the context's deadline", err)
		}
	case <-testCtx.Done():
		t.Fatal("run did not return after its context ended")
	}
}

func TestFailureMessage(t *testing.T) {
	long := strings.Repeat("x", 5000) + "\nfatal: GPU 3 fell off the bus\n"
	tests := []struct {
		name  string
		cr    checkResult
		limit int
		want  string
	}{
		{"no output", checkResult{Name: "dns", Reason: "exit code 2"}, 2048, "check dns: exit code 2"},
		{"output", checkResult{Name: "gpus", Reason: `3 lines matched '^GPU \d+:', want 8`, Output: "GPU 0: a\nGPU 1: b\nGPU 2: c\n"}, 2048,
			"check gpus: 3 lines matched '^GPU \\d+:', want 8: GPU 0: a\nGPU 1: b\nGPU 2: c"},
		{"long output keeps its end", checkResult{Name: "dcgm", Reason: "exit code 226", Output: long}, 64,
			"check dcgm: exit code 226: " + ellipsis + "xxxx\nfatal: GPU 3 fell off the bus"},
		{"limit shorter than the reason", checkResult{Name: "dcgm", Reason: "timed out after 5m0s", Output: long}, 20,
			"check dcgm: timed" + ellipsis},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := failureMessage(&tc.cr, tc.limit)
			if got != tc.want {
				t.Fatalf("failureMessage = %q\nwant %q", got, tc.want)
			}
			if len(got) > tc.limit {
				t.Fatalf("failureMessage is %d bytes, limit %d", len(got), tc.limit)
			}
		})
	}
}

func mustNotMatch(re string) checkOption {
	return func(c *checkSpec) { c.MustNotMatch = regexp.MustCompile(re) }
}

// threshold sets min and/or max (nil for none) on the check's match, whose
// first group holds the number.
func threshold(lo, hi *float64) checkOption {
	return func(c *checkSpec) { c.Min, c.Max, c.ValueGroup = lo, hi, 1 }
}

func retries(n int, delay time.Duration) checkOption {
	return func(c *checkSpec) { c.Retries, c.RetryDelay = n, delay }
}

func num(v float64) *float64 { return &v }

func TestRunOutputRules(t *testing.T) {
	t.Parallel()
	xid := sh(`echo '[  12.5] NVRM: loading NVIDIA UNIX x86_64 Kernel Module'; echo '[ 345.6] NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus.'`)
	counts := sh(`printf '0\n0\n3\n'`)
	tests := []struct {
		name    string
		check   checkSpec
		failure failure // empty: passes
		reason  string
	}{
		{"forbidden line", newCheck("xid", xid, mustNotMatch(`NVRM: Xid \(PCI:[^)]*\): 79,`)), failForbidden,
			`1 line matched mustNotMatch 'NVRM: Xid \(PCI:[^)]*\): 79,', the first: "[ 345.6] NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus."`},
		{"nothing forbidden", newCheck("xid", xid, mustNotMatch(`NVRM: Xid \(PCI:[^)]*\): 48,`)), "", ""},
		{"value above max", newCheck("ecc", counts, match(`^(\d+)$`, 3), threshold(nil, num(0))), failThreshold,
			`1 of 3 lines matching '^(\d+)$' out of range (want at most 0), the first: value "3" in "3"`},
		{"values within max", newCheck("ecc", sh(`printf '0\n0\n'`), match(`^(\d+)$`, 2), threshold(nil, num(0))), "", ""},
		{"value below min", newCheck("bw", sh(`echo '# Avg bus bandwidth    : 92.4'`), match(`bandwidth\s*:\s*([0-9.]+)`, 1), threshold(num(180), nil)), failThreshold,
			`1 of 1 line matching 'bandwidth\s*:\s*([0-9.]+)' out of range (want at least 180), the first: value "92.4" in "# Avg bus bandwidth    : 92.4"`},
		{"value above min", newCheck("bw", sh(`echo '# Avg bus bandwidth    : 181.07'`), match(`bandwidth\s*:\s*([0-9.]+)`, 1), threshold(num(180), nil)), "", ""},
		{"not a number", newCheck("ecc", sh(`echo '0, [N/A]'`), match(`^\d+, (\S+)$`, 1), threshold(nil, num(0))), failThreshold,
			`1 of 1 line matching '^\d+, (\S+)$' out of range (want at most 0), the first: value "[N/A]" in "0, [N/A]"`},
		{"within a range", newCheck("t", sh(`echo 'temp 41'`), match(`temp (\d+)`, 1), threshold(num(20), num(85))), "", ""},
		{"too few values", newCheck("ecc", counts, match(`^(\d+)$`, 8), threshold(nil, num(5))), failNoMatch, `3 lines matched '^(\d+)$', want 8`},
		{"forbidden wins over the rest", newCheck("all", counts, match(`^(\d+)$`, 8), threshold(nil, num(0)), mustNotMatch(`^3$`)), failForbidden,
			`1 line matched mustNotMatch '^3$', the first: "3"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runWithin(t, runner{}, newConfig([]checkSpec{tc.check}))
			c := res.Checks[0]
			if c.Passed != (tc.failure == "") || c.Failure != tc.failure || c.Reason != tc.reason {
				t.Fatalf("result: passed %v failure %q reason %q\nwant failure %q reason %q", c.Passed, c.Failure, c.Reason, tc.failure, tc.reason)
			}
		})
	}
}

func TestRunRetries(t *testing.T) {
	t.Parallel()
	// flaky fails until its third run, counting runs in a file.
	flaky := func(t *testing.T) []string {
		f := filepath.Join(t.TempDir(), "runs")
		return sh(fmt.Sprintf(`n=$(cat %[1]s 2>/dev/null || echo 0); n=$((n+1)); echo $n > %[1]s; echo run $n; [ $n -ge 3 ]`, f))
	}
	tests := []struct {
		name     string
		check    func(t *testing.T) checkSpec
		passed   bool
		attempts int
		reason   string
	}{
		{"passes on the third attempt", func(t *testing.T) checkSpec { return newCheck("flaky", flaky(t), retries(2, 10*time.Millisecond)) }, true, 3, ""},
		{"out of retries", func(t *testing.T) checkSpec { return newCheck("flaky", flaky(t), retries(1, 10*time.Millisecond)) }, false, 2, "exit code 1 (attempt 2 of 2)"},
		{"no retries", func(t *testing.T) checkSpec { return newCheck("flaky", flaky(t)) }, false, 1, "exit code 1"},
		{"a missing program is not retried", func(t *testing.T) checkSpec {
			return newCheck("n", []string{"/nonexistent/preflight-check"}, retries(3, 10*time.Millisecond))
		}, false, 1, "start: fork/exec /nonexistent/preflight-check: no such file or directory"},
		{"output rules are retried too", func(t *testing.T) checkSpec {
			return newCheck("m", sh("echo GPU 0: x"), match(`^GPU \d+:`, 8), retries(1, 10*time.Millisecond))
		}, false, 2, `1 line matched '^GPU \d+:', want 8 (attempt 2 of 2)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runWithin(t, runner{}, newConfig([]checkSpec{tc.check(t)}))
			c := res.Checks[0]
			if c.Passed != tc.passed || c.Attempts != tc.attempts || c.Reason != tc.reason {
				t.Fatalf("result: passed %v attempts %d reason %q; want %v, %d, %q", c.Passed, c.Attempts, c.Reason, tc.passed, tc.attempts, tc.reason)
			}
		})
	}
}

// The deadline ends a retry delay: the last failure stands, and the run
// returns at the deadline, not after the delay.
//
// The run is in a synctest bubble: its clock moves only when every
// goroutine of the run is blocked on time, never while the check's process
// runs (a wait for a process or a pipe is not such a block). So the
// deadline cannot fire during the first attempt however slow the machine,
// and the run is seen to end at the deadline exactly.
func TestRunRetryDelayEndsAtTheDeadline(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const runDeadline = 500 * time.Millisecond
		cfg := newConfig([]checkSpec{newCheck("f", []string{"false"}, retries(3, time.Hour))}, deadline(runDeadline))
		start := time.Now()
		res, err := runner{}.run(context.Background(), cfg)
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		if took := time.Since(start); took != runDeadline {
			t.Errorf("run returned after %s, want the deadline %s", took, runDeadline)
		}
		c := res.Failed()
		if c == nil || c.Failure != failExit || c.Attempts != 1 || c.Reason != "exit code 1 (attempt 1 of 4; the deadline came before the next)" {
			t.Fatalf("result = %+v", res.Checks)
		}
	})
}
