package preflight

import (
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func withAnnotation(k, v string) to.NodeOption {
	return func(n *apiv1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[k] = v
	}
}

func TestClassify(t *testing.T) {
	o := DefaultOptions()
	born := to.NodeCreatedAt(t0.Add(-5 * time.Minute))
	old := to.NodeCreatedAt(t0.Add(-25 * time.Minute))
	for _, tc := range []struct {
		name   string
		node   *apiv1.Node
		opts   func(*Options)
		want   State
		whyHas string
	}{
		{"no gate ever: passed", to.Node("n", "8", "8Gi", born), nil, Passed, ""},
		{"tainted within the deadline: pending", to.Node("n", "8", "8Gi", born, to.Taint(DefaultTaintKey, "pending"), to.NodeLabels(DefaultLabel, ValuePending)), nil, Pending, ""},
		{"taint value does not matter", to.Node("n", "8", "8Gi", born, to.Taint(DefaultTaintKey, "running")), nil, Pending, ""},
		{"tainted past the deadline: failed", to.Node("n", "8", "8Gi", old, to.Taint(DefaultTaintKey, "pending")), nil, Failed, "--max-preflight-time 20m0s"},
		{"label failed: failed with the agent's reason", to.Node("n", "8", "8Gi", born, to.Taint(DefaultTaintKey, "pending"), to.NodeLabels(DefaultLabel, ValueFailed),
			withAnnotation(DefaultFailureAnnotation, "check gpus: 7 lines matched, want 8")), nil, Failed, "check gpus: 7 lines matched"},
		{"failed by periodic re-run, no taint", to.Node("n", "8", "8Gi", old, to.NodeLabels(DefaultLabel, ValueFailed)), nil, Failed, "preflight checks failed"},
		{"passed label, taint gone", to.Node("n", "8", "8Gi", old, to.NodeLabels(DefaultLabel, ValuePassed)), nil, Passed, ""},
		{"other taints are not the gate", to.Node("n", "8", "8Gi", old, to.Taint("openai.com/team", "rl")), nil, Passed, ""},
		{"gate off: everything passes", to.Node("n", "8", "8Gi", old, to.Taint(DefaultTaintKey, "pending"), to.NodeLabels(DefaultLabel, ValueFailed)),
			func(o *Options) { o.Enabled = false }, Passed, ""},
		{"old node sent through preflight again: pending within the deadline from then", to.Node("n", "8", "8Gi", old, to.Taint(DefaultTaintKey, "pending"), to.NodeLabels(DefaultLabel, ValuePending),
			withAnnotation(AgainAnnotation, t0.Add(-5*time.Minute).Format(time.RFC3339))), nil, Pending, ""},
		{"sent again, past the deadline from then: failed", to.Node("n", "8", "8Gi", old, to.Taint(DefaultTaintKey, "pending"),
			withAnnotation(AgainAnnotation, t0.Add(-21*time.Minute).Format(time.RFC3339))), nil, Failed, "after it was sent through preflight again"},
		{"a garbled again-at counts from registration", to.Node("n", "8", "8Gi", old, to.Taint(DefaultTaintKey, "pending"),
			withAnnotation(AgainAnnotation, "yesterday")), nil, Failed, "after registration"},
		{"a future again-at (another replica's clock ahead) counts from now", to.Node("n", "8", "8Gi", old, to.Taint(DefaultTaintKey, "pending"),
			withAnnotation(AgainAnnotation, t0.Add(time.Hour).Format(time.RFC3339))), nil, Pending, ""},
		{"configured names", to.Node("n", "8", "8Gi", born, to.Taint("example.com/burn-in", "x")),
			func(o *Options) { o.Taint.Key = "example.com/burn-in" }, Pending, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oo := o
			if tc.opts != nil {
				tc.opts(&oo)
			}
			got, why := oo.Classify(tc.node, t0)
			if got != tc.want || !strings.Contains(why, tc.whyHas) {
				t.Fatalf("Classify = %s %q, want %s with %q", got, why, tc.want, tc.whyHas)
			}
		})
	}
}

func TestStripTemplate(t *testing.T) {
	o := DefaultOptions()
	n := to.Node("tmpl", "8", "8Gi", to.Taint(DefaultTaintKey, "pending"), to.Taint("openai.com/team", "rl"), to.NodeLabels(DefaultLabel, ValuePending, "pool", "gpu"))
	o.StripTemplate(n)
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "openai.com/team" {
		t.Fatalf("taints %v, want only the team taint", n.Spec.Taints)
	}
	if _, ok := n.Labels[DefaultLabel]; ok || n.Labels["pool"] != "gpu" {
		t.Fatalf("labels %v", n.Labels)
	}
}

func TestParseTaintAndValidate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want apiv1.Taint
		err  string
	}{
		{"vmss-autoscaler.io/preflight=pending:NoSchedule", apiv1.Taint{Key: DefaultTaintKey, Value: "pending", Effect: apiv1.TaintEffectNoSchedule}, ""},
		{"burn-in:NoExecute", apiv1.Taint{Key: "burn-in", Effect: apiv1.TaintEffectNoExecute}, ""},
		{"burn-in=x", apiv1.Taint{}, `want key=value:Effect, got "burn-in=x"`},
		{"burn-in=x:Sometimes", apiv1.Taint{}, `effect "Sometimes"`},
		{"=x:NoSchedule", apiv1.Taint{}, "empty key"},
	} {
		got, err := ParseTaint("--preflight-taint", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--preflight-taint") {
				t.Errorf("ParseTaint(%q) error %v, want %q naming the flag", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTaint(%q) = %+v, %v", tc.in, got, err)
		}
	}
	o := DefaultOptions()
	o.MaxPreflightTime = 0
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--max-preflight-time") {
		t.Errorf("Validate: %v", err)
	}
}

func TestPassedAt(t *testing.T) {
	n := to.Node("n", "8", "8Gi", withAnnotation(PassedAtAnnotation, t0.Add(-time.Minute).Format(time.RFC3339)))
	if got := PassedAt(n, t0); !got.Equal(t0.Add(-time.Minute)) {
		t.Fatalf("PassedAt = %s", got)
	}
	n = to.Node("n", "8", "8Gi", withAnnotation(PassedAtAnnotation, "yesterday"))
	if got := PassedAt(n, t0); !got.Equal(t0) {
		t.Fatalf("PassedAt with a bad annotation = %s, want now", got)
	}
}

func TestFailedCheck(t *testing.T) {
	o := DefaultOptions()
	long := strings.Repeat("x", 100)
	for _, tc := range []struct {
		name, label, msg, want string
	}{
		{"agent message", ValueFailed, "check dns: exit status 1: lookup kubernetes.default.svc: i/o timeout", "dns"},
		{"another agent", ValueFailed, "nccl: 120 GB/s, want 300", "nccl"},
		{"no colon", ValueFailed, "GPU 3 fell off the bus", "GPU 3 fell off the bus"},
		{"long", ValueFailed, long, long[:63]},
		{"empty", ValueFailed, "", "(no reason given)"},
		{"timed out", ValuePending, "", TimedOut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &apiv1.Node{}
			n.Labels = map[string]string{o.Label: tc.label}
			n.Annotations = map[string]string{o.FailureAnnotation: tc.msg}
			if got := o.FailedCheck(n); got != tc.want {
				t.Fatalf("FailedCheck = %q, want %q", got, tc.want)
			}
		})
	}
}
