package health

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// rulesYAML wraps one rule (its lines, indented under "- ") in a policy.
func rulesYAML(rule string) string {
	return "rules:\n- " + strings.ReplaceAll(strings.TrimSpace(rule), "\n", "\n  ") + "\n"
}

func TestDefault(t *testing.T) {
	p := Default()
	replace := func(name string, cond apiv1.NodeConditionType, d time.Duration) Rule {
		return Rule{Name: name, Condition: &ConditionMatch{Type: cond, Status: apiv1.ConditionTrue}, For: d, Action: Replace, CordonFirst: true, EvictLocalScratch: true}
	}
	want := &Policy{
		MaxUnhealthy:        intstr.FromString("20%"),
		StormCooldown:       10 * time.Minute,
		MemoryTolerance:     0.10,
		BreakerReleaseAfter: 30 * time.Minute,
		BreakerReleaseNodes: 2,
		Rules: []Rule{
			replace("xid-error", "XIDErrors", 2*time.Minute),
			replace("gpu-missing", "GPUMissing", 2*time.Minute),
			{Name: "device-plugin-unhealthy", Condition: &ConditionMatch{Type: "UnhealthyNvidiaDevicePlugin", Status: "True"},
				For: 10 * time.Minute, Action: Drain, CordonFirst: true},
			replace("kernel-deadlock", "KernelDeadlock", 10*time.Minute),
			replace("readonly-filesystem", "ReadonlyFilesystem", 5*time.Minute),
			{Name: "gpus-below-sku", BelowSKU: &BelowSKUMatch{Resource: "nvidia.com/gpu"}, For: 5 * time.Minute, Action: Replace, CordonFirst: true, EvictLocalScratch: true},
		},
	}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("Default() = %s, want %s", dump(p), dump(want))
	}
	// A new copy each time: a caller's change does not leak.
	p.Rules[0].Action = Report
	if Default().Rules[0].Action != Replace {
		t.Fatal("Default() shares its rules between calls")
	}
}

func dump(p *Policy) string {
	if p == nil {
		return "nil"
	}
	b, err := p.Marshal()
	if err != nil {
		return fmt.Sprintf("%+v", *p)
	}
	return "\n" + string(b)
}

// TestDefaultYAMLIsTheDocumented: the built-in policy is the one
// docs/concepts/health-policy.md shows, comments and all.
func TestDefaultYAMLIsTheDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/concepts/health-policy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "```yaml\n")
	block, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("docs/concepts/health-policy.md has no yaml block")
	}
	if block != DefaultYAML {
		t.Fatalf("docs/concepts/health-policy.md's policy differs from DefaultYAML:\n%s\nwant:\n%s", block, DefaultYAML)
	}
}

func TestParse(t *testing.T) {
	cond := func(typ apiv1.NodeConditionType, status apiv1.ConditionStatus) *ConditionMatch {
		return &ConditionMatch{Type: typ, Status: status}
	}
	for _, tc := range []struct {
		name string
		yaml string
		want *Policy
	}{
		{"no rules: the defaults", "rules: []", &Policy{MaxUnhealthy: intstr.FromString("20%"), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1, Rules: []Rule{}}},
		{"count as a number", "maxUnhealthy: 2\nrules: []", &Policy{MaxUnhealthy: intstr.FromInt32(2), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1, Rules: []Rule{}}},
		{"count as a string", `maxUnhealthy: "3"` + "\nrules: []", &Policy{MaxUnhealthy: intstr.FromInt32(3), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1, Rules: []Rule{}}},
		{"percent normalized", `maxUnhealthy: "+050%"` + "\nrules: []", &Policy{MaxUnhealthy: intstr.FromString("50%"), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1, Rules: []Rule{}}},
		{"100 percent, no cooldown, no tolerance", "maxUnhealthy: 100%\nstormCooldown: 0s\nmemoryTolerance: 0%\nrules: []",
			&Policy{MaxUnhealthy: intstr.FromString("100%"), StormCooldown: 0, MemoryTolerance: 0, Rules: []Rule{}}},
		{"fractional tolerance", "memoryTolerance: 2.5%\nstormCooldown: 1h30m\nrules: []",
			&Policy{MaxUnhealthy: intstr.FromString("20%"), StormCooldown: 90 * time.Minute, MemoryTolerance: 0.025, Rules: []Rule{}}},
		{"null fields are absent", "maxUnhealthy: null\nstormCooldown:\nrules:\n- name: a\n  condition: {type: X, status: \"False\"}\n  for:\n  action: report\n  cordonFirst: null",
			&Policy{MaxUnhealthy: intstr.FromString("20%"), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1,
				Rules: []Rule{{Name: "a", Condition: cond("X", "False"), Action: Report}}}},
		{"breaker release", "breakerReleaseAfter: 1h\nbreakerReleaseNodes: 0\nrules: []",
			&Policy{MaxUnhealthy: intstr.FromString("20%"), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1, BreakerReleaseAfter: time.Hour, Rules: []Rule{}}},
		{"the healthy status, said explicitly", "rules:\n- {name: a, condition: {type: KernelDeadlock, status: \"False\", matchHealthyStatus: true}, action: report}",
			withReleaseDefaults(&Policy{MaxUnhealthy: intstr.FromString("20%"), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1,
				Rules: []Rule{{Name: "a", Condition: &ConditionMatch{Type: "KernelDeadlock", Status: "False", MatchHealthyStatus: true}, Action: Report}}})},
		{"half a group with replace rules", "maxUnhealthy: 50%\nrules:\n- {name: a, condition: {type: X, status: \"True\"}, action: replace}",
			withReleaseDefaults(&Policy{MaxUnhealthy: intstr.FromString("50%"), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1,
				Rules: []Rule{{Name: "a", Condition: cond("X", "True"), Action: Replace, CordonFirst: true, EvictLocalScratch: true}}})},
		{"local scratch said both ways", "rules:\n- {name: a, taint: {key: k}, action: replace, evictLocalScratch: false}\n- {name: b, taint: {key: k}, action: drain, evictLocalScratch: true}",
			withReleaseDefaults(&Policy{MaxUnhealthy: intstr.FromString("20%"), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1,
				Rules: []Rule{{Name: "a", Taint: &TaintMatch{Key: "k"}, Action: Replace, CordonFirst: true},
					{Name: "b", Taint: &TaintMatch{Key: "k"}, Action: Drain, CordonFirst: true, EvictLocalScratch: true}}})},
		{"every match and action", `
rules:
- name: ready-unknown
  condition: {type: NetworkUnavailable, status: Unknown}
  action: cordon
- name: nvsentinel
  taint: {key: nvidia.com/gpu-error, value: xid-79, effect: NoExecute}
  for: 30s
  action: drain
  cordonFirst: false
- name: custom
  taint: {key: example.com/bad}
  for: 0
  action: replace
- name: "123"
  belowSKU: {resource: memory}
  for: 1h
  action: report
  cordonFirst: false
- name: rdma
  belowSKU: {resource: rdma/ib}
  action: replace
  cordonFirst: true
`, &Policy{MaxUnhealthy: intstr.FromString("20%"), StormCooldown: 10 * time.Minute, MemoryTolerance: 0.1, Rules: []Rule{
			{Name: "ready-unknown", Condition: cond("NetworkUnavailable", "Unknown"), Action: Cordon},
			{Name: "nvsentinel", Taint: &TaintMatch{Key: "nvidia.com/gpu-error", Value: "xid-79", Effect: "NoExecute"}, For: 30 * time.Second, Action: Drain},
			{Name: "custom", Taint: &TaintMatch{Key: "example.com/bad"}, Action: Replace, CordonFirst: true, EvictLocalScratch: true},
			{Name: "123", BelowSKU: &BelowSKUMatch{Resource: "memory"}, For: time.Hour, Action: Report},
			{Name: "rdma", BelowSKU: &BelowSKUMatch{Resource: "rdma/ib"}, Action: Replace, CordonFirst: true, EvictLocalScratch: true},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.yaml)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if tc.want.BreakerReleaseAfter == 0 && tc.name != "breaker release" {
				withReleaseDefaults(tc.want)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Parse = %s\nwant %s", dump(got), dump(tc.want))
			}
		})
	}
}

// withReleaseDefaults sets the breaker release's defaults (30m, 2 nodes).
func withReleaseDefaults(p *Policy) *Policy {
	p.BreakerReleaseAfter, p.BreakerReleaseNodes = 30*time.Minute, 2
	return p
}

func TestParseErrors(t *testing.T) {
	ok := "name: a\ncondition: {type: XIDErrors, status: \"True\"}\naction: replace\n"
	var many strings.Builder
	many.WriteString("rules:\n")
	for i := range MaxRules + 1 {
		fmt.Fprintf(&many, "- {name: r%d, condition: {type: X, status: \"True\"}, action: report}\n", i)
	}
	for _, tc := range []struct {
		name string
		yaml string
		want []string // each must be in the error
	}{
		{"empty", "", []string{"policy: empty"}},
		{"blank", " \n\t\n", []string{"policy: empty"}},
		{"comments only", "# nothing\n", []string{"policy: empty"}},
		{"not YAML", "rules: [", []string{"policy: not valid YAML"}},
		{"duplicate key", "rules: []\nrules: []", []string{"policy: not valid YAML", `"rules"`}},
		{"a list", "- a", []string{"policy:", "want a map", "got a list"}},
		{"a string", "hello", []string{"policy:", `"hello"`, "got a string"}},
		{"unknown field", "rules: []\nmaxUnhealty: 2", []string{`policy: unknown field "maxUnhealty"`}},
		{"field names are case-sensitive", "Rules: []", []string{`unknown field "Rules"`, "rules: required"}},
		{"no rules key", "maxUnhealthy: 2", []string{"rules: required"}},
		{"rules null", "rules:", []string{"rules: required"}},
		{"rules a map", "rules: {a: 1}", []string{"rules:", `{"a":1}`, "want a list"}},
		{"too many rules", many.String(), []string{"rules: at most 100 rules, got 101"}},
		{"rule a string", "rules: [x]", []string{"rules[0]:", `"x"`, "want a map"}},
		{"unknown rule field", rulesYAML(ok + "acton: drain"), []string{`rules[0]: unknown field "acton"`}},
		{"repair on a drain rule", rulesYAML("name: a\ncondition: {type: X, status: \"True\"}\naction: drain\nrepair: [reboot]"), []string{"rules[0].repair: only a replace rule repairs"}},
		{"repair step unknown", rulesYAML(ok + "repair: [reboot, reinstall]"), []string{`rules[0].repair[1]: "reinstall": must be reboot, reimage or redeploy`}},
		{"repair steps out of order", rulesYAML(ok + "repair: [reimage, reboot]"), []string{`rules[0].repair[1]: "reboot": the steps go cheapest first, each once`}},
		{"repair step twice", rulesYAML(ok + "repair: [reboot, reboot]"), []string{`rules[0].repair[1]: "reboot": the steps go cheapest first, each once`}},
		{"repair empty", rulesYAML(ok + "repair: []"), []string{"rules[0].repair: empty"}},
		{"repair a string", rulesYAML(ok + "repair: reboot"), []string{"rules[0].repair:", "must be a list"}},
		{"repair timeout too short", rulesYAML(ok + "repair: [reboot]\nrepairTimeout: 30s"), []string{"rules[0].repairTimeout: 30s: must be from 1m to 6h"}},
		{"repair timeout alone", rulesYAML(ok + "repairTimeout: 10m"), []string{"rules[0].repairTimeout: only with repair steps"}},
		{"repair timeout of a step not listed", rulesYAML(ok + "repair: [reboot]\nrepairTimeout: {reboot: 10m, reimage: 30m}"), []string{"rules[0].repairTimeout.reimage: not a step of this rule's repair [reboot]"}},
		{"repair timeout of a step too long", rulesYAML(ok + "repair: [reboot, reimage]\nrepairTimeout: {reimage: 7h}"), []string{"rules[0].repairTimeout.reimage: 7h0m0s: must be from 1m to 6h"}},
		{"repair timeout of a step a number", rulesYAML(ok + "repair: [reboot]\nrepairTimeout: {reboot: 10}"), []string{"rules[0].repairTimeout.reboot: 10: must be a duration"}},
		{"repair timeout of a step not a duration", rulesYAML(ok + "repair: [reboot]\nrepairTimeout: {reboot: soon}"), []string{`rules[0].repairTimeout.reboot: "soon": not a duration`}},
		{"name missing", rulesYAML("condition: {type: X, status: \"True\"}\naction: report"), []string{"rules[0].name: required"}},
		{"name not a label", rulesYAML("name: GPU_bad\ncondition: {type: X, status: \"True\"}\naction: report"), []string{"rules[0].name:", `"GPU_bad"`, "DNS label"}},
		{"name too long", rulesYAML("name: " + strings.Repeat("a", 64) + "\ncondition: {type: X, status: \"True\"}\naction: report"), []string{"rules[0].name:", "DNS label"}},
		{"name a list", rulesYAML("name: [a]\ncondition: {type: X, status: \"True\"}\naction: report"), []string{"rules[0].name:", `["a"]`, "must be a string"}},
		{"duplicate names", "rules:\n- {name: a, condition: {type: X, status: \"True\"}, action: report}\n- {name: b, taint: {key: k}, action: report}\n- {name: a, taint: {key: k}, action: report}",
			[]string{"rules[2].name:", `"a"`, "duplicate name (also rules[0].name)"}},
		{"no match", rulesYAML("name: a\naction: report"), []string{"rules[0]: no match"}},
		{"null match", rulesYAML("name: a\ncondition: null\naction: report"), []string{"rules[0]: no match"}},
		{"two matches", rulesYAML(ok + "taint: {key: example.com/bad}"), []string{"rules[0]: 2 matches (condition, taint)"}},
		{"three matches", rulesYAML(ok + "taint: {key: k}\nbelowSKU: {resource: memory}"), []string{"rules[0]: 3 matches (condition, taint, belowSKU)"}},
		{"condition a string", rulesYAML("name: a\ncondition: XIDErrors\naction: report"), []string{"rules[0].condition:", `"XIDErrors"`, "want a map"}},
		{"unknown condition field", rulesYAML("name: a\ncondition: {type: X, status: \"True\", reason: Y}\naction: report"), []string{`rules[0].condition: unknown field "reason"`}},
		{"condition type missing", rulesYAML("name: a\ncondition: {status: \"True\"}\naction: report"), []string{"rules[0].condition.type: required"}},
		{"condition type empty", rulesYAML("name: a\ncondition: {type: \"\", status: \"True\"}\naction: report"), []string{"rules[0].condition.type: required"}},
		{"condition type with a space", rulesYAML("name: a\ncondition: {type: \"XID Error\", status: \"True\"}\naction: report"), []string{"rules[0].condition.type:", `"XID Error"`}},
		{"status missing", rulesYAML("name: a\ncondition: {type: X}\naction: report"), []string{"rules[0].condition.status: required"}},
		{"status lower case", rulesYAML("name: a\ncondition: {type: X, status: \"true\"}\naction: report"), []string{"rules[0].condition.status:", `"true"`, `must be "True", "False" or "Unknown"`}},
		{"status unquoted", rulesYAML("name: a\ncondition: {type: X, status: True}\naction: report"), []string{"rules[0].condition.status: true", `quote it ("True")`}},
		{"status unquoted false", rulesYAML("name: a\ncondition: {type: X, status: False}\naction: report"), []string{"rules[0].condition.status: false", `quote it ("False")`}},
		{"taint key missing", rulesYAML("name: a\ntaint: {value: x}\naction: report"), []string{"rules[0].taint.key: required"}},
		{"taint key invalid", rulesYAML("name: a\ntaint: {key: \"bad key\"}\naction: report"), []string{"rules[0].taint.key:", `"bad key"`, "not a taint key"}},
		{"own cordon taint", rulesYAML("name: a\ntaint: {key: node.kubernetes.io/unschedulable}\naction: replace"), []string{"rules[0].taint.key:", `"node.kubernetes.io/unschedulable"`, "own"}},
		{"own deletion taint", rulesYAML("name: a\ntaint: {key: ToBeDeletedByClusterAutoscaler}\naction: replace"), []string{"rules[0].taint.key:", `"ToBeDeletedByClusterAutoscaler"`}},
		{"the preflight taint", rulesYAML("name: a\ntaint: {key: vmss-autoscaler.io/preflight}\naction: replace"), []string{"rules[0].taint.key:", `"vmss-autoscaler.io/preflight"`}},
		{"a startup taint", rulesYAML("name: a\ntaint: {key: startup-taint.cluster-autoscaler.kubernetes.io/cilium}\naction: cordon"), []string{"rules[0].taint.key:", "startup-taint"}},
		{"the not-ready taint", rulesYAML("name: a\ntaint: {key: node.kubernetes.io/not-ready}\naction: drain"), []string{"rules[0].taint.key:", `"node.kubernetes.io/not-ready"`}},
		{"the Ready condition", rulesYAML("name: a\ncondition: {type: Ready, status: \"True\"}\naction: cordon"), []string{"rules[0].condition.type:", `"Ready"`, "unready guard"}},
		{"taint value invalid", rulesYAML("name: a\ntaint: {key: k, value: \"a b\"}\naction: report"), []string{"rules[0].taint.value:", `"a b"`}},
		{"taint effect invalid", rulesYAML("name: a\ntaint: {key: k, effect: NoRun}\naction: report"), []string{"rules[0].taint.effect:", `"NoRun"`, "NoSchedule, PreferNoSchedule or NoExecute"}},
		{"unknown taint field", rulesYAML("name: a\ntaint: {key: k, operator: Exists}\naction: report"), []string{`rules[0].taint: unknown field "operator"`}},
		{"belowSKU resource missing", rulesYAML("name: a\nbelowSKU: {}\naction: report"), []string{"rules[0].belowSKU.resource: required"}},
		{"belowSKU cpu", rulesYAML("name: a\nbelowSKU: {resource: cpu}\naction: report"), []string{"rules[0].belowSKU.resource:", `"cpu"`, "extended resource"}},
		{"belowSKU kubernetes.io", rulesYAML("name: a\nbelowSKU: {resource: kubernetes.io/foo}\naction: report"), []string{"rules[0].belowSKU.resource:", `"kubernetes.io/foo"`}},
		{"belowSKU bad name", rulesYAML("name: a\nbelowSKU: {resource: \"nvidia.com/g pu\"}\naction: report"), []string{"rules[0].belowSKU.resource:", `"nvidia.com/g pu"`}},
		{"for not a duration", rulesYAML(ok + "for: 2 minutes"), []string{"rules[0].for:", `"2 minutes"`, "not a duration"}},
		{"for without unit", rulesYAML(ok + "for: 120"), []string{"rules[0].for:", `"120"`, "not a duration"}},
		{"for in days", rulesYAML(ok + "for: 1d"), []string{"rules[0].for:", `"1d"`}},
		{"for negative", rulesYAML(ok + "for: -1m"), []string{"rules[0].for:", `"-1m"`, "negative"}},
		{"for too long", rulesYAML(ok + "for: 200h"), []string{"rules[0].for:", `"200h"`, "at most 168h0m0s"}},
		{"for a boolean", rulesYAML(ok + "for: yes"), []string{"rules[0].for: true", "must be a string"}},
		{"action missing", rulesYAML("name: a\ncondition: {type: X, status: \"True\"}"), []string{"rules[0].action: required"}},
		{"action unknown", rulesYAML("name: a\ncondition: {type: X, status: \"True\"}\naction: reboot"), []string{`rules[0].action: "reboot": must be one of report, cordon, drain, replace`}},
		{"action capitalized", rulesYAML("name: a\ncondition: {type: X, status: \"True\"}\naction: Replace"), []string{`rules[0].action: "Replace"`}},
		{"cordonFirst on report", rulesYAML("name: a\ncondition: {type: X, status: \"True\"}\naction: report\ncordonFirst: true"), []string{"rules[0].cordonFirst: true", "not a report rule"}},
		{"cordonFirst on cordon", rulesYAML("name: a\ncondition: {type: X, status: \"True\"}\naction: cordon\ncordonFirst: true"), []string{"rules[0].cordonFirst: true", "not a cordon rule"}},
		{"evictLocalScratch on a cordon rule", rulesYAML("name: a\ncondition: {type: X, status: \"True\"}\naction: cordon\nevictLocalScratch: true"), []string{"rules[0].evictLocalScratch: true", "not a cordon rule"}},
		{"evictLocalScratch a string", rulesYAML(ok + "evictLocalScratch: \"yes\""), []string{"rules[0].evictLocalScratch:", `"yes"`, "true or false"}},
		{"cordonFirst a string", rulesYAML(ok + "cordonFirst: \"yes\""), []string{"rules[0].cordonFirst:", `"yes"`, "true or false"}},
		{"maxUnhealthy 0", "maxUnhealthy: 0\nrules: []", []string{"maxUnhealthy:", `"0"`, "count from 1"}},
		{"maxUnhealthy negative", "maxUnhealthy: -1\nrules: []", []string{"maxUnhealthy:", `"-1"`}},
		{"maxUnhealthy 0%", "maxUnhealthy: 0%\nrules: []", []string{"maxUnhealthy:", `"0%"`, "percent from 1% to 100%"}},
		{"maxUnhealthy over 100%", "maxUnhealthy: 101%\nrules: []", []string{"maxUnhealthy:", `"101%"`}},
		{"maxUnhealthy fractional percent", "maxUnhealthy: 12.5%\nrules: []", []string{"maxUnhealthy:", `"12.5%"`}},
		{"maxUnhealthy fractional count", "maxUnhealthy: 2.5\nrules: []", []string{"maxUnhealthy:", `"2.5"`}},
		{"maxUnhealthy huge", "maxUnhealthy: 100001\nrules: []", []string{"maxUnhealthy:", `"100001"`}},
		{"maxUnhealthy a word", "maxUnhealthy: half\nrules: []", []string{"maxUnhealthy:", `"half"`}},
		{"stormCooldown negative", "stormCooldown: -5m\nrules: []", []string{"stormCooldown:", `"-5m"`, "negative"}},
		{"stormCooldown without unit", "stormCooldown: 10\nrules: []", []string{"stormCooldown:", `"10"`, "not a duration"}},
		{"memoryTolerance 100%", "memoryTolerance: 100%\nrules: []", []string{"memoryTolerance:", `"100%"`, "below 100%"}},
		{"memoryTolerance negative", "memoryTolerance: -1%\nrules: []", []string{"memoryTolerance:", `"-1%"`}},
		{"memoryTolerance a share", "memoryTolerance: 0.1\nrules: []", []string{"memoryTolerance:", `"0.1"`, `such as "10%"`}},
		{"memoryTolerance NaN", "memoryTolerance: NaN%\nrules: []", []string{"memoryTolerance:", `"NaN%"`}},
		// Issue #39: {type: KernelDeadlock, status: "False"} matched every
		// healthy node and cordoned a whole group in one loop.
		{"the healthy status of an NPD condition", rulesYAML("name: a\ncondition: {type: KernelDeadlock, status: \"False\"}\naction: replace"),
			[]string{"rules[0].condition.status:", `"False"`, "KernelDeadlock=False is what a healthy node reports", "matchHealthyStatus: true"}},
		{"the healthy status of an AKS GPU condition", rulesYAML("name: a\ncondition: {type: XIDErrors, status: \"False\"}\naction: cordon"),
			[]string{"rules[0].condition.status:", "XIDErrors=False"}},
		{"the healthy status of a kubelet condition", rulesYAML("name: a\ncondition: {type: MemoryPressure, status: \"False\"}\naction: drain"),
			[]string{"rules[0].condition.status:", "MemoryPressure=False"}},
		{"matchHealthyStatus a string", rulesYAML("name: a\ncondition: {type: KernelDeadlock, status: \"False\", matchHealthyStatus: \"yes\"}\naction: report"),
			[]string{"rules[0].condition.matchHealthyStatus:", `"yes"`, "true or false"}},
		{"maxUnhealthy above half with a replace rule", "maxUnhealthy: 100%\nrules:\n- {name: a, condition: {type: X, status: \"True\"}, action: report}\n- {name: b, condition: {type: Y, status: \"True\"}, action: replace}",
			[]string{"maxUnhealthy:", `"100%"`, `at most "50%"`, `rules[1] "b" is a replace rule`}},
		{"maxUnhealthy above half with a drain rule", "maxUnhealthy: 51%\nrules:\n- {name: a, taint: {key: k}, action: drain}",
			[]string{"maxUnhealthy:", `"51%"`, "drain rule"}},
		{"breakerReleaseNodes too many", "breakerReleaseNodes: 11\nrules: []", []string{"breakerReleaseNodes:", `"11"`, "from 0 to 10"}},
		{"breakerReleaseNodes negative", "breakerReleaseNodes: -1\nrules: []", []string{"breakerReleaseNodes:", `"-1"`}},
		{"breakerReleaseAfter not a duration", "breakerReleaseAfter: soon\nrules: []", []string{"breakerReleaseAfter:", `"soon"`, "not a duration"}},
		{"every problem at once", "maxUnhealthy: 0\nrules:\n- {name: a, action: reboot}\n- {name: B, taint: {key: k}, action: drain, for: x}",
			[]string{"maxUnhealthy:", "rules[0]: no match", `rules[0].action: "reboot"`, `rules[1].name: "B"`, `rules[1].for: "x"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse(tc.yaml)
			if err == nil {
				t.Fatalf("Parse accepted it: %s", dump(p))
			}
			if p != nil {
				t.Errorf("Parse returned a policy with its error: %s", dump(p))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestAllowed(t *testing.T) {
	pct := func(s string) *Policy { return &Policy{MaxUnhealthy: intstr.FromString(s)} }
	count := func(n int32) *Policy { return &Policy{MaxUnhealthy: intstr.FromInt32(n)} }
	for _, tc := range []struct {
		name   string
		p      *Policy
		nodes  int
		wanted int
	}{
		{"1 node at 20%: never below 1", pct("20%"), 1, 1},
		{"5 nodes at 20%", pct("20%"), 5, 1},
		{"9 nodes at 20% rounds down", pct("20%"), 9, 1},
		{"10 nodes at 20%", pct("20%"), 10, 2},
		{"100 nodes at 20%", pct("20%"), 100, 20},
		{"no nodes", pct("20%"), 0, 1},
		{"negative nodes", pct("20%"), -3, 1},
		{"100%", pct("100%"), 7, 7},
		{"a count", count(2), 100, 2},
		{"a count above the group", count(5), 3, 5},
		{"a count as a string", pct("3"), 100, 3},
		{"zero count", count(0), 100, 1},
		{"negative count", count(-4), 100, 1},
		{"malformed percent", pct("x%"), 100, 1},
		{"percent over 100", pct("150%"), 100, 1},
		{"the default", Default(), 50, 10},
		// A count above half a group that drains or replaces is cut to
		// half (#39: a count bypassed the percent's cap).
		{"a count above half a group that replaces", replacing(count(5)), 6, 3},
		{"a count above half a small group that replaces", replacing(count(5)), 3, 1},
		{"a count within half a group that replaces", replacing(count(5)), 100, 5},
		{"a count above half a group that only reports", count(5), 6, 5},
		{"nil policy", nil, 100, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Allowed(tc.nodes); got != tc.wanted {
				t.Fatalf("Allowed(%d) = %d, want %d", tc.nodes, got, tc.wanted)
			}
		})
	}
}

// TestAllowedOf: the cut of a count counts the group's nodes not judged
// yet, so a count is not cut below what it says while the group comes up
// (2 of 8 nodes judged: e2e TestHealthDegradedGPUNodeIsNotTheTemplate's
// maxUnhealthy 2 was cut to 1 and held its breaker for its storm
// cooldown); the percent is of the judged ones.
func TestAllowedOf(t *testing.T) {
	count := func(n int32) *Policy { return &Policy{MaxUnhealthy: intstr.FromInt32(n)} }
	pct := func(s string) *Policy { return &Policy{MaxUnhealthy: intstr.FromString(s)} }
	for _, tc := range []struct {
		name        string
		p           *Policy
		judged, all int
		wanted      int
	}{
		{"a count while the group comes up", replacing(count(2)), 2, 8, 2},
		{"a count above half of every node", replacing(count(5)), 2, 8, 4},
		{"the percent is of the judged nodes", replacing(pct("20%")), 10, 100, 2},
		{"all below judged (a stale count) changes nothing", replacing(count(5)), 6, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.AllowedOf(tc.judged, tc.all); got != tc.wanted {
				t.Fatalf("AllowedOf(%d, %d) = %d, want %d", tc.judged, tc.all, got, tc.wanted)
			}
		})
	}
}

// replacing adds a replace rule to p.
func replacing(p *Policy) *Policy {
	p.Rules = append(p.Rules, Rule{Name: "r", Taint: &TaintMatch{Key: "k"}, Action: Replace})
	return p
}

func TestActionString(t *testing.T) {
	for a, want := range map[Action]string{Report: "report", Cordon: "cordon", Drain: "drain", Replace: "replace", Action(9): "Action(9)", Action(-1): "Action(-1)"} {
		if got := a.String(); got != want {
			t.Errorf("Action(%d).String() = %q, want %q", int(a), got, want)
		}
		if got, ok := parseAction(want); ok != (a >= Report && a <= Replace) || (ok && got != a) {
			t.Errorf("parseAction(%q) = %v, %v", want, got, ok)
		}
	}
}

func TestMarshalRoundTrips(t *testing.T) {
	for _, y := range []string{
		DefaultYAML,
		"rules: []",
		"maxUnhealthy: 3\nstormCooldown: 0s\nmemoryTolerance: 0%\nrules: []",
		"memoryTolerance: 7%\nrules: []",
		"memoryTolerance: 33.333%\nrules: []",
		"memoryTolerance: 0.0000001%\nrules: []",
		"memoryTolerance: 99.99999999999999%\nrules: []",
		rulesYAML("name: a\ntaint: {key: example.com/bad, value: \"true\", effect: NoSchedule}\nfor: 90s\naction: drain\ncordonFirst: false"),
		rulesYAML("name: \"007\"\ntaint: {key: k}\naction: cordon\ncordonFirst: false"),
		rulesYAML("name: m\nbelowSKU: {resource: memory}\naction: report"),
		rulesYAML("name: x\ncondition: {type: XIDErrors, status: \"True\"}\naction: replace\nrepair: [reboot, redeploy]\nrepairTimeout: 45m"),
		rulesYAML("name: x\ncondition: {type: XIDErrors, status: \"True\"}\naction: replace\nrepair: [reimage]"),
		rulesYAML("name: x\ncondition: {type: XIDErrors, status: \"True\"}\naction: replace\nrepair: [reboot, reimage, redeploy]\nrepairTimeout: {reboot: 10m, redeploy: 1h}"),
	} {
		p, err := Parse(y)
		if err != nil {
			t.Fatalf("Parse(%q): %v", y, err)
		}
		out, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		q, err := Parse(string(out))
		if err != nil {
			t.Fatalf("Parse(Marshal(%q)) = %v\n%s", y, err, out)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("%q: Marshal does not read back:\n%s\n%s", y, dump(p), dump(q))
		}
	}
}

func TestPercent(t *testing.T) {
	for share, want := range map[float64]string{0: "0%", 0.1: "10%", 0.07: "7%", 0.125: "12.5%", 0.025: "2.5%", 0.99: "99%"} {
		if got := percent(share); got != want {
			t.Errorf("percent(%v) = %q, want %q", share, got, want)
		}
	}
}

// TestRepairStepTimeouts: repairTimeout as one duration times every
// step; as a map, each named step its own, the others the default.
func TestRepairStepTimeouts(t *testing.T) {
	for _, tc := range []struct {
		timeout string
		want    []time.Duration
	}{
		{"", []time.Duration{DefaultRepairTimeout, DefaultRepairTimeout, DefaultRepairTimeout}},
		{"\nrepairTimeout: 45m", []time.Duration{45 * time.Minute, 45 * time.Minute, 45 * time.Minute}},
		{"\nrepairTimeout: {reboot: 10m, redeploy: 1h}", []time.Duration{10 * time.Minute, DefaultRepairTimeout, time.Hour}},
	} {
		p, err := Parse(rulesYAML("name: x\ncondition: {type: XIDErrors, status: \"True\"}\naction: replace\nrepair: [reboot, reimage, redeploy]" + tc.timeout))
		if err != nil {
			t.Fatalf("%q: %v", tc.timeout, err)
		}
		var got []time.Duration
		for i := range p.Rules[0].Repair {
			got = append(got, p.Rules[0].StepTimeout(i))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: step timeouts %v, want %v", tc.timeout, got, tc.want)
		}
	}
}
