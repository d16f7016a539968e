package harness

import (
	"bytes"
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

const (
	// stopGracePeriod is how long Stop waits after SIGTERM before SIGKILL.
	stopGracePeriod = 10 * time.Second
	// killWaitTimeout bounds the wait for a process to be reaped after SIGKILL.
	killWaitTimeout = 30 * time.Second
	// logTailBytes is how much of a log file error messages quote.
	logTailBytes = 2048
)

// Process is a child process whose standard output and error go to LogFile.
type Process struct {
	// Name identifies the process in logs and names its log file.
	Name string
	// LogFile receives the process's standard output and error.
	LogFile string

	cmd     *exec.Cmd
	logger  klog.Logger
	done    chan struct{}
	exitErr error // written once before done is closed
}

// startProcess starts bin with args, and env added to this process's
// environment, appending its output to logFile. The process is not bound to
// ctx: it runs until Stop or Kill. ctx only carries the logger.
func startProcess(ctx context.Context, name, logFile, bin string, env []string, args ...string) (*Process, error) {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: opening log file: %w", name, err)
	}
	fmt.Fprintf(f, "### %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = childSysProcAttr()
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &Process{
		Name:    name,
		LogFile: logFile,
		cmd:     cmd,
		logger:  klog.FromContext(ctx).WithValues("process", name, "pid", cmd.Process.Pid),
		done:    make(chan struct{}),
	}
	p.logger.V(1).Info("Started process", "binary", bin, "logFile", logFile)
	go func() {
		p.exitErr = cmd.Wait()
		_ = f.Close()
		p.logger.V(1).Info("Process exited", "state", cmd.ProcessState.String())
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited returns a channel that is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// ExitErr returns the error of the process's exit (nil for status 0, an
// *exec.ExitError otherwise), or nil while it is still running.
func (p *Process) ExitErr() error {
	select {
	case <-p.done:
		return p.exitErr
	default:
		return nil
	}
}

// exited reports whether the process has exited.
func (p *Process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL and waits until the process has exited.
func (p *Process) Kill() error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s (pid %d): %w", p.Name, p.Pid(), err)
	}
	return p.wait(killWaitTimeout)
}

// Stop sends SIGTERM, then SIGKILL if the process has not exited after 10s,
// and waits until it has exited. Stopping an exited process is a no-op. The
// process's own exit status is reported by ExitErr, not by Stop.
func (p *Process) Stop() error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping %s (pid %d): %w", p.Name, p.Pid(), err)
	}
	timer := time.NewTimer(stopGracePeriod)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	p.logger.Info("Process ignored SIGTERM, killing it", "gracePeriod", stopGracePeriod)
	return p.Kill()
}

// wait waits up to timeout for the process to exit.
func (p *Process) wait(timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("%s (pid %d) still running %s after SIGKILL", p.Name, p.Pid(), timeout)
	}
}

// exitError describes an unexpected exit, quoting the end of the log file.
func (p *Process) exitError() error {
	return fmt.Errorf("%s exited unexpectedly (%v); end of %s:\n%s", p.Name, p.ExitErr(), p.LogFile, tailFile(p.LogFile, logTailBytes))
}

// tailFile returns up to n bytes from the end of the file at path.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer func() { _ = f.Close() }()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		if _, err := f.Seek(-n, io.SeekEnd); err != nil {
			return fmt.Sprintf("(cannot read log: %v)", err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	return string(bytes.TrimSpace(data))
}
