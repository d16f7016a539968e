package preflight

import (
	"strings"
	"testing"

	apiv1 "k8s.io/api/core/v1"
)

// The preflight taint comes from --preflight-taint (the flags file, the
// live flags ConfigMap).
func FuzzParseTaint(f *testing.F) {
	for _, s := range []string{"vmss-autoscaler.io/preflight=pending:NoSchedule", "k:NoExecute", "=v:NoSchedule", "k=v", "k=v=w:PreferNoSchedule", ":", "a:b:NoSchedule"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tn, err := ParseTaint("--preflight-taint", s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--preflight-taint: ") {
				t.Fatalf("ParseTaint(%q): error %q does not name the flag", s, err)
			}
			return
		}
		switch tn.Effect {
		case apiv1.TaintEffectNoSchedule, apiv1.TaintEffectNoExecute, apiv1.TaintEffectPreferNoSchedule:
		default:
			t.Fatalf("ParseTaint(%q): effect %q accepted", s, tn.Effect)
		}
		if tn.Key == "" {
			t.Fatalf("ParseTaint(%q): empty key accepted", s)
		}
		again := tn.Key + "=" + tn.Value + ":" + string(tn.Effect)
		if back, err := ParseTaint("--preflight-taint", again); err != nil || back != tn {
			t.Fatalf("ParseTaint(%q) = %+v; its own form %q parses to %+v, %v", s, tn, again, back, err)
		}
	})
}
