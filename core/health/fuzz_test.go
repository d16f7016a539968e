package health

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The health policy comes from a ConfigMap whoever may edit it writes:
// Parse must never panic, and what it accepts must be a policy the rest of
// the code can trust, and write back.
func FuzzParseHealthPolicy(f *testing.F) {
	for _, s := range []string{
		DefaultYAML,
		"rules: []",
		"maxUnhealthy: 2\nstormCooldown: 0s\nmemoryTolerance: 0%\nrules: []",
		"maxUnhealthy: 100%\nmemoryTolerance: 99.5%\nrules:\n- {name: a, taint: {key: example.com/bad, value: x, effect: NoExecute}, for: 90s, action: drain, cordonFirst: false}",
		"rules:\n- {name: m, belowSKU: {resource: memory}, action: report}\n- {name: g, belowSKU: {resource: nvidia.com/gpu}, action: replace, cordonFirst: true}",
		"rules:\n- {name: a, condition: {type: X, status: True}, action: reboot}",
		"rules:\n- {name: r, condition: {type: X, status: \"True\"}, action: replace, repair: [reboot, reimage], repairTimeout: 30m}",
		"rules:\n- {name: a, action: report}\n- {name: a, condition: {type: X, status: \"True\"}, taint: {key: k}, action: drain}",
		"maxUnhealthy: 0%\nmemoryTolerance: NaN%\nstormCooldown: -1s\nrules: {}",
		"rules: [&a {name: x, condition: {type: Y, status: \"True\"}, action: cordon}, *a]",
		"- 1\n- 2",
		"",
		"# only a comment\n",
		"rules: [",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		p, err := Parse(data)
		if err != nil {
			if p != nil {
				t.Fatalf("Parse(%q) returned a policy with its error %v", data, err)
			}
			if err.Error() == "" {
				t.Fatalf("Parse(%q): an empty error", data)
			}
			return
		}
		checkInvariants(t, data, p)
		out, err := p.Marshal()
		if err != nil {
			t.Fatalf("Parse(%q) then Marshal: %v", data, err)
		}
		q, err := Parse(string(out))
		if err != nil {
			t.Fatalf("Parse(%q) then Marshal gives what Parse refuses: %v\n%s", data, err, out)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("Parse(%q): Marshal does not read back:\n%s\nreads as\n%s", data, dump(p), dump(q))
		}
	})
}

// checkInvariants: what every accepted policy guarantees.
func checkInvariants(t *testing.T, data string, p *Policy) {
	t.Helper()
	for _, n := range []int{0, 1, 5, 100, 1000} {
		if a := p.Allowed(n); a < 1 {
			t.Fatalf("Parse(%q): Allowed(%d) = %d", data, n, a)
		}
	}
	for _, n := range []int{1, 2, 7, 100} {
		if a := p.Allowed(n); p.disrupts() && a > max(1, n*MaxUnhealthyCapPercent/100) {
			t.Fatalf("Parse(%q): Allowed(%d) = %d, more than half the group with drain or replace rules", data, n, a)
		}
	}
	if p.Allowed(1000) > max(1000, 100_000) {
		t.Fatalf("Parse(%q): Allowed(1000) = %d", data, p.Allowed(1000))
	}
	if !(p.MemoryTolerance >= 0 && p.MemoryTolerance < 1) {
		t.Fatalf("Parse(%q): memoryTolerance %v", data, p.MemoryTolerance)
	}
	if p.StormCooldown < 0 || p.StormCooldown > 7*24*time.Hour {
		t.Fatalf("Parse(%q): stormCooldown %v", data, p.StormCooldown)
	}
	if p.Rules == nil || len(p.Rules) > MaxRules {
		t.Fatalf("Parse(%q): %d rules (nil %v)", data, len(p.Rules), p.Rules == nil)
	}
	var names []string
	for i, r := range p.Rules {
		n := 0
		for _, set := range []bool{r.Condition != nil, r.Taint != nil, r.BelowSKU != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("Parse(%q): rule %d has %d matches", data, i, n)
		}
		if len(validation.IsDNS1123Label(r.Name)) > 0 || slices.Contains(names, r.Name) {
			t.Fatalf("Parse(%q): rule %d name %q invalid or repeated", data, i, r.Name)
		}
		names = append(names, r.Name)
		if r.Action < Report || r.Action > Replace || strings.HasPrefix(r.Action.String(), "Action(") {
			t.Fatalf("Parse(%q): rule %d action %d", data, i, r.Action)
		}
		if len(r.Repair) > 0 && (r.Action != Replace || len(r.Repair) > len(repairSteps) || r.RepairTimeout < time.Minute || r.RepairTimeout > 6*time.Hour) {
			t.Fatalf("Parse(%q): rule %d repairs %v (timeout %v) on %s", data, i, r.Repair, r.RepairTimeout, r.Action)
		}
		for k := range r.Repair {
			if d := r.StepTimeout(k); d < time.Minute || d > 6*time.Hour {
				t.Fatalf("Parse(%q): rule %d repair step %s has timeout %v", data, i, r.Repair[k], d)
			}
		}
		for st := range r.StepTimeouts {
			if !slices.Contains(r.Repair, st) {
				t.Fatalf("Parse(%q): rule %d has a timeout for %s, not one of its steps %v", data, i, st, r.Repair)
			}
		}
		for k := 1; k < len(r.Repair); k++ {
			if slices.Index(repairSteps, r.Repair[k]) <= slices.Index(repairSteps, r.Repair[k-1]) || slices.Index(repairSteps, r.Repair[k-1]) < 0 {
				t.Fatalf("Parse(%q): rule %d repair steps %v out of order", data, i, r.Repair)
			}
		}
		if r.CordonFirst && r.Action < Drain {
			t.Fatalf("Parse(%q): rule %d cordons first on %s", data, i, r.Action)
		}
		if r.For < 0 || r.For > 7*24*time.Hour {
			t.Fatalf("Parse(%q): rule %d for %v", data, i, r.For)
		}
		if c := r.Condition; c != nil && (c.Type == "" || (c.Status != "True" && c.Status != "False" && c.Status != "Unknown")) {
			t.Fatalf("Parse(%q): rule %d condition %+v", data, i, *c)
		}
		if tm := r.Taint; tm != nil && (tm.Key == "" || isOwnTaint(tm.Key)) {
			t.Fatalf("Parse(%q): rule %d taint %+v", data, i, *tm)
		}
		if b := r.BelowSKU; b != nil && b.Resource != "memory" && !isExtended(b.Resource) {
			t.Fatalf("Parse(%q): rule %d belowSKU %q", data, i, b.Resource)
		}
	}
}
