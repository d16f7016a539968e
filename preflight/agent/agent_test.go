package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestParseOptions(t *testing.T) {
	o, err := parseOptions(nil, env("NODE_NAME", "gpu-7"))
	if err != nil {
		t.Fatal(err)
	}
	want := names{
		taint:              corev1.Taint{Key: preflight.DefaultTaintKey, Value: preflight.DefaultTaintValue, Effect: corev1.TaintEffectNoSchedule},
		label:              preflight.DefaultLabel,
		failureAnnotation:  preflight.DefaultFailureAnnotation,
		passedAtAnnotation: preflight.PassedAtAnnotation,
	}
	if o.nodeName != "gpu-7" || o.names != want || o.checksPath != DefaultChecksPath || o.mode != (mode{}) || o.dryRun {
		t.Fatalf("defaults = %+v, want node gpu-7 from NODE_NAME and the names of design.md", o)
	}

	o, err = parseOptions([]string{"--node-name=gpu-8", "--periodic", "--interval=1h", "--taint=example.com/gate:NoExecute",
		"--label=example.com/result", "--failure-annotation=example.com/why", "--checks=/tmp/c.yaml", "-v=2"}, env("NODE_NAME", "gpu-7"))
	if err != nil {
		t.Fatal(err)
	}
	if o.nodeName != "gpu-8" || !o.mode.periodic || o.interval != time.Hour || o.checksPath != "/tmp/c.yaml" ||
		o.names.taint != (corev1.Taint{Key: "example.com/gate", Effect: corev1.TaintEffectNoExecute}) ||
		o.names.label != "example.com/result" || o.names.failureAnnotation != "example.com/why" {
		t.Fatalf("options = %+v", o)
	}
}

func TestParseOptionsRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  func(string) string
		want string
	}{
		{"no node name", nil, env(), "--node-name: required (or set NODE_NAME)"},
		{"bad node name", []string{"--node-name=GPU_0"}, env(), `--node-name="GPU_0"`},
		{"bad taint", []string{"--taint=nope"}, env("NODE_NAME", "n"), `--taint: want key=value:Effect, got "nope"`},
		{"bad effect", []string{"--taint=a=b:Never"}, env("NODE_NAME", "n"), `effect "Never"`},
		{"bad label", []string{"--label=a b"}, env("NODE_NAME", "n"), `--label="a b"`},
		{"bad annotation", []string{"--failure-annotation="}, env("NODE_NAME", "n"), `--failure-annotation=""`},
		{"annotation clash", []string{"--failure-annotation=" + preflight.PassedAtAnnotation}, env("NODE_NAME", "n"), "taken by the passed-at annotation"},
		{"interval without periodic", []string{"--interval=1h"}, env("NODE_NAME", "n"), "--interval=1h0m0s: only with --periodic"},
		{"negative interval", []string{"--periodic", "--interval=-1m"}, env("NODE_NAME", "n"), "--interval=-1m0s: must not be negative"},
		{"interval too short", []string{"--periodic", "--interval=10ms"}, env("NODE_NAME", "n"), "--interval=10ms: must be between 1s and 168h0m0s"},
		{"interval a month", []string{"--periodic", "--interval=720h"}, env("NODE_NAME", "n"), "--interval=720h0m0s: must be between 1s and 168h0m0s"},
		{"retry-failed with periodic", []string{"--periodic", "--retry-failed"}, env("NODE_NAME", "n"), "--retry-failed: not with --periodic"},
		{"unknown flag", []string{"--nodename=x"}, env("NODE_NAME", "n"), "unknown flag: --nodename"},
		{"stray argument", []string{"run"}, env("NODE_NAME", "n"), `unexpected arguments ["run"]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseOptions(tc.args, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parseOptions = %+v, %v; want an error containing %q", o, err, tc.want)
			}
		})
	}
}

func TestParseOptionsDryRunNeedsNoNode(t *testing.T) {
	if _, err := parseOptions([]string{"--dry-run"}, env()); err != nil {
		t.Fatal(err)
	}
}

func TestMainHelp(t *testing.T) {
	if err := Main(context.Background(), []string{"--help"}); !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("Main(--help) = %v, want pflag.ErrHelp", err)
	}
}

func TestMainRejectsBadChecksFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checks.yaml")
	if err := os.WriteFile(path, []byte("checks:\n- name: a\n  command: [\"true\"]\n  timeout: 0s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Main(context.Background(), []string{"--dry-run", "--checks=" + path})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `checks[0].timeout: must be positive, got "0s"`) {
		t.Fatalf("Main = %v, want the file and the field named", err)
	}
}

func TestDryRun(t *testing.T) {
	cfg := newConfig([]checkSpec{
		newCheck("gpus", sh("echo GPU 0: a; echo GPU 1: b"), match(`^GPU \d+:`, 2)),
		newCheck("dcgm", sh("echo diag: GPU 1 failed; exit 226")),
		newCheck("dns", []string{"true"}),
	})
	var out strings.Builder
	err := dryRun(context.Background(), cfg, &out)
	if err == nil || err.Error() != "preflight failed: check dcgm: exit code 226" {
		t.Errorf("dryRun = %v, want the failed check", err)
	}
	text := out.String()
	for _, want := range []string{"preflight FAILED: 2 of 3 checks run", "PASS  gpus", "FAIL  dcgm", "exit code 226", "diag: GPU 1 failed"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "dns") {
		t.Errorf("output mentions a check that did not run:\n%s", text)
	}
}

// sinkRecorder is an EventSink that keeps what it is sent.
type sinkRecorder struct {
	mu     sync.Mutex
	events []*corev1.Event
}

func (s *sinkRecorder) Create(e *corev1.Event) (*corev1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
	return e, nil
}

func (s *sinkRecorder) Update(e *corev1.Event) (*corev1.Event, error) { return e, nil }

func (s *sinkRecorder) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) { return e, nil }

// close returns only once the events emitted were sent: an agent that
// exits right after reporting must not lose them (the broadcaster's own
// Shutdown drops events still queued).
func TestEventsCloseFlushes(t *testing.T) {
	sink := &sinkRecorder{}
	ev := newEventsToSink(context.Background(), sink, "gpu-0")
	ev.emit(gpuNode(), corev1.EventTypeWarning, ReasonFailed, "check dcgm: exit code 226: "+strings.Repeat("x", 4000))
	ev.close(context.Background())

	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.events) != 1 {
		t.Fatalf("sent %d events, want 1", len(sink.events))
	}
	e := sink.events[0]
	if e.Reason != ReasonFailed || e.Type != corev1.EventTypeWarning || e.InvolvedObject.Kind != "Node" ||
		e.InvolvedObject.Name != "gpu-0" || e.Source.Component != eventComponent || e.Source.Host != "gpu-0" {
		t.Errorf("event = %+v", e)
	}
	if len(e.Message) > eventMessageLimit || !strings.HasPrefix(e.Message, "check dcgm: exit code 226: xxx") {
		t.Errorf("message is %d bytes (limit %d): %.60q…", len(e.Message), eventMessageLimit, e.Message)
	}
}

func TestIsTransient(t *testing.T) {
	gr := schema.GroupResource{Resource: "nodes"}
	tests := []struct {
		err  error
		want bool
	}{
		{apierrors.NewNotFound(gr, "gpu-0"), false},
		{apierrors.NewForbidden(gr, "gpu-0", errors.New("no")), false},
		{apierrors.NewConflict(gr, "gpu-0", errors.New("changed")), false},
		{apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, "gpu-0", nil), false},
		{apierrors.NewTooManyRequests("slow down", 1), true},
		{apierrors.NewServiceUnavailable("restarting"), true},
		{apierrors.NewInternalError(errors.New("etcd")), true},
		{fmt.Errorf("get node gpu-0: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), true},
	}
	for _, tc := range tests {
		if got := isTransient(tc.err); got != tc.want {
			t.Errorf("isTransient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
