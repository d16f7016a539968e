package agent

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The checks YAML is the checks ConfigMap: whoever may edit it chooses the
// commands the agent runs as root on every new node (SECURITY.md), so the
// agent must at least never crash on it and keep every value in range.
func FuzzChecksYAML(f *testing.F) {
	f.Add([]byte("checks:\n- name: dns\n  command: [getent, hosts, kubernetes]\n  timeout: 10s\n"))
	f.Add([]byte("deadline: 1m\noutputLimit: 100\nchecks:\n- name: gpus\n  command: [nvidia-smi]\n  timeout: 30s\n  match: '^GPU (?P<value>\\d+)'\n  minMatches: 8\n  min: 0\n  max: 7\n  retries: 2\n  retryDelay: 1s\n  mustNotMatch: Xid\n"))
	f.Add([]byte("checks:\n- name: a\n  command: [x]\n  timeout: 24h\n  retries: 10\n  retryDelay: 1h\n"))
	f.Add([]byte("checks: [{name: a, command: [x], timeout: 1s, min: 1e999, match: '(x)'}]"))
	f.Add([]byte("checks: ["))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig(data)
		if err != nil {
			return
		}
		if len(c.Checks) == 0 || len(c.Checks) > maxChecks {
			t.Fatalf("accepted %d checks", len(c.Checks))
		}
		if c.Deadline <= 0 || c.Deadline > maxDeadline {
			t.Fatalf("deadline %s accepted", c.Deadline)
		}
		if c.OutputLimit < 1 || c.OutputLimit > maxOutputLimit {
			t.Fatalf("outputLimit %d accepted", c.OutputLimit)
		}
		for _, ch := range c.Checks {
			switch {
			case ch.Name == "" || len(ch.Name) > maxNameLength:
				t.Fatalf("check name %q accepted", ch.Name)
			case len(ch.Command) == 0 || ch.Command[0] == "":
				t.Fatalf("check %s: command %q accepted", ch.Name, ch.Command)
			case ch.Timeout <= 0 || ch.Timeout > maxCheckTimeout || ch.Timeout > c.Deadline:
				t.Fatalf("check %s: timeout %s accepted (deadline %s)", ch.Name, ch.Timeout, c.Deadline)
			case ch.Retries < 0 || ch.Retries > maxRetries || ch.RetryDelay < 0 || ch.RetryDelay > maxRetryDelay:
				t.Fatalf("check %s: retries %d, retryDelay %s accepted", ch.Name, ch.Retries, ch.RetryDelay)
			case ch.hasThreshold() && (ch.Match == nil || ch.ValueGroup < 1 || ch.ValueGroup > ch.Match.NumSubexp()):
				t.Fatalf("check %s: min/max without a capture group accepted", ch.Name)
			case ch.Match != nil && (ch.MinMatches < 1 || ch.MinMatches > maxMinMatches):
				t.Fatalf("check %s: minMatches %d accepted", ch.Name, ch.MinMatches)
			case ch.Min != nil && ch.Max != nil && *ch.Min > *ch.Max:
				t.Fatalf("check %s: min %v above max %v accepted", ch.Name, *ch.Min, *ch.Max)
			}
		}
	})
}

// The agent's --taint: what it accepts must be a taint the API server takes.
func FuzzTaintFlag(f *testing.F) {
	for _, s := range []string{"vmss-autoscaler.io/preflight=pending:NoSchedule", "example.com/gate:NoExecute", "bad key=v:NoSchedule", "k=bad value:NoSchedule", "k=v"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tn, err := parseTaint(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--taint: ") {
				t.Fatalf("parseTaint(%q): error %q does not name the flag", s, err)
			}
			return
		}
		if len(validation.IsQualifiedName(tn.Key)) > 0 || len(validation.IsValidLabelValue(tn.Value)) > 0 {
			t.Fatalf("parseTaint(%q) = %+v: not a valid taint", s, tn)
		}
	})
}
