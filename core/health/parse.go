package health

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

const (
	// MaxRules bounds the rules of one policy.
	MaxRules = 100
	// maxCount bounds a count of maxUnhealthy: far above any group (a
	// scale set holds at most 1,000 instances); "100%" is no bound.
	maxCount = 100_000
	// maxDuration bounds for and stormCooldown.
	maxDuration = 7 * 24 * time.Hour

	defaultMaxUnhealthy    = "20%"
	defaultStormCooldown   = 10 * time.Minute
	defaultMemoryTolerance = 0.10
	// defaultBreakerReleaseAfter and defaultBreakerReleaseNodes: a breaker
	// held that long by at most that many known-bad nodes replaces them
	// one at a time (Policy.BreakerReleaseNodes).
	defaultBreakerReleaseAfter = 30 * time.Minute
	defaultBreakerReleaseNodes = 2
	// MaxUnhealthyCapPercent is the most of a group that maxUnhealthy may
	// put under drain or replacement at once, when the policy has drain or
	// replace rules: a breaker that lets more through lets one bad signal
	// empty a group (issue #39: "100%" with a rule matching healthy nodes
	// deleted every machine of a group).
	MaxUnhealthyCapPercent = 50
)

// The fields of each level of the policy, as written (case-sensitive).
const (
	policyFields    = "maxUnhealthy, stormCooldown, memoryTolerance, breakerReleaseAfter, breakerReleaseNodes, rules"
	ruleFields      = "name, condition, taint, belowSKU, for, action, cordonFirst, evictLocalScratch, repair, repairTimeout"
	conditionFields = "type, status, matchHealthyStatus"
	taintFields     = "key, value, effect"
	belowSKUFields  = "resource"
)

// healthyStatus is, for the well-known node conditions, the status a
// healthy node reports: a rule on it matches every healthy node (issue
// #39: {type: KernelDeadlock, status: "False"} cordoned a whole group in
// one loop). Sources: the kubelet's conditions (Kubernetes, "Node
// status", Conditions: MemoryPressure, DiskPressure, PIDPressure and
// NetworkUnavailable are False on a healthy node); node-problem-
// detector's (kubernetes/node-problem-detector config/*.json: each
// condition's default status is False, "…IsNotReadOnly",
// "KernelHasNoDeadlock"); AKS's (Microsoft, "Node Problem Detector (NPD)
// in Azure Kubernetes Service (AKS) nodes", Node conditions, GPU only
// included: a condition is set True for a problem).
var healthyStatus = map[apiv1.NodeConditionType]apiv1.ConditionStatus{
	apiv1.NodeMemoryPressure:     apiv1.ConditionFalse,
	apiv1.NodeDiskPressure:       apiv1.ConditionFalse,
	apiv1.NodePIDPressure:        apiv1.ConditionFalse,
	apiv1.NodeNetworkUnavailable: apiv1.ConditionFalse,
	// node-problem-detector
	"KernelDeadlock":              apiv1.ConditionFalse,
	"ReadonlyFilesystem":          apiv1.ConditionFalse,
	"FrequentKubeletRestart":      apiv1.ConditionFalse,
	"FrequentDockerRestart":       apiv1.ConditionFalse,
	"FrequentContainerdRestart":   apiv1.ConditionFalse,
	"FrequentUnregisterNetDevice": apiv1.ConditionFalse,
	"KubeletUnhealthy":            apiv1.ConditionFalse,
	"ContainerRuntimeUnhealthy":   apiv1.ConditionFalse,
	"CorruptDockerOverlay2":       apiv1.ConditionFalse,
	// AKS's node-problem-detector
	"FilesystemCorruptionProblem": apiv1.ConditionFalse,
	"KubeletProblem":              apiv1.ConditionFalse,
	"ContainerRuntimeProblem":     apiv1.ConditionFalse,
	"VMEventScheduled":            apiv1.ConditionFalse,
	"GPUMissing":                  apiv1.ConditionFalse,
	"NVLinkStatusInactive":        apiv1.ConditionFalse,
	"XIDErrors":                   apiv1.ConditionFalse,
	"IBLinkFlapping":              apiv1.ConditionFalse,
	"GPUClockThrottling":          apiv1.ConditionFalse,
	"UnhealthyNvidiaDevicePlugin": apiv1.ConditionFalse,
}

// isOwnTaint says whether key is a taint the autoscaler itself (or the node
// controller, on its cordon) puts on nodes: a rule matching one would act
// on the autoscaler's own work, a health cordon feeding a health
// replacement.
func isOwnTaint(key string) bool {
	switch key {
	case apiv1.TaintNodeUnschedulable, "ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler":
		return true
	}
	// The node lifecycle controller's and the kubelet's taints
	// (not-ready, unreachable, pressure), this autoscaler's (preflight)
	// and startup taints belong to the paths that own them.
	for _, prefix := range []string{"node.kubernetes.io/", "node.cloudprovider.kubernetes.io/", "vmss-autoscaler.io/", "startup-taint.cluster-autoscaler.kubernetes.io/"} {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// Parse reads a policy (YAML, docs/concepts/health-policy.md) strictly: an unknown or
// duplicate field, a value of the wrong type or out of range, a rule
// without a match or with two, two rules of one name are all refused,
// each error naming the field's path and the value, e.g.
//
//	rules[2].action: "reboot": must be one of report, cordon, drain, replace
//
// Every problem found is returned (errors.Join). Absent, maxUnhealthy is
// "20%", stormCooldown 10m and memoryTolerance "10%"; a rule's for is 0s.
// The rules key is required; an empty list disables every rule.
func Parse(data string) (*Policy, error) {
	if strings.TrimSpace(data) == "" {
		return nil, errors.New("policy: empty")
	}
	j, err := yaml.YAMLToJSONStrict([]byte(data))
	if err != nil {
		return nil, fmt.Errorf("policy: not valid YAML: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber() // numbers keep the text the user wrote
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("policy: not valid YAML: %w", err)
	}
	if doc == nil {
		return nil, errors.New("policy: empty")
	}
	v := &validator{}
	p := v.policy(doc)
	if err := errors.Join(v.errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// validator collects the problems of a policy.
type validator struct{ errs []error }

func (v *validator) fail(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf(format, args...))
}

// show is a value as an error quotes it: a string quoted, anything else
// as JSON.
func show(x any) string {
	if s, ok := x.(string); ok {
		return strconv.Quote(s)
	}
	b, err := json.Marshal(x)
	if err != nil {
		return fmt.Sprintf("%v", x)
	}
	return string(b)
}

// kindOf names a value's YAML type.
func kindOf(x any) string {
	switch x.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "a map"
	}
	return fmt.Sprintf("%T", x)
}

// object checks that x is a map of known fields only; ok false when it
// is not a map.
func (v *validator) object(path string, x any, known string) (map[string]any, bool) {
	m, ok := x.(map[string]any)
	if !ok {
		v.fail("%s: %s: want a map of %s, got %s", path, show(x), known, kindOf(x))
		return nil, false
	}
	fields := strings.Split(known, ", ")
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(fields, k) {
			v.fail("%s: unknown field %q (want %s)", path, k, known)
		}
	}
	return m, true
}

// join is a field's path below parent ("" at the top).
func join(parent, field string) string {
	if parent == "" {
		return field
	}
	return parent + "." + field
}

// text is a scalar as the text the user wrote: a string as is, a number as
// its digits. present is false for an absent or null field; ok is false
// (and the problem recorded) for a boolean, a list or a map.
func (v *validator) text(path string, m map[string]any, field string) (s string, present, ok bool) {
	x, present := m[field]
	if !present || x == nil {
		return "", false, true
	}
	switch t := x.(type) {
	case string:
		return t, true, true
	case json.Number:
		return t.String(), true, true
	case bool:
		word := "False"
		if t {
			word = "True"
		}
		v.fail("%s: %v: must be a string; quote it (%q): unquoted, YAML reads %s as a boolean", join(path, field), t, word, word)
	default:
		v.fail("%s: %s: must be a string, got %s", join(path, field), show(x), kindOf(x))
	}
	return "", true, false
}

// duration reads a Go duration in [0, maxDuration]; def when absent.
func (v *validator) duration(path string, m map[string]any, field string, def time.Duration) time.Duration {
	s, present, ok := v.text(path, m, field)
	if !present || !ok {
		return def
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		v.fail("%s: %q: not a duration: want a Go duration such as 90s, 2m or 1h30m", join(path, field), s)
	case d < 0:
		v.fail("%s: %q: must not be negative", join(path, field), s)
	case d > maxDuration:
		v.fail("%s: %q: must be at most %s", join(path, field), s, maxDuration)
	default:
		return d
	}
	return def
}

func (v *validator) policy(doc any) *Policy {
	m, ok := v.object("policy", doc, policyFields)
	if !ok {
		return nil
	}
	p := &Policy{
		MaxUnhealthy:        v.maxUnhealthy(m),
		StormCooldown:       v.duration("", m, "stormCooldown", defaultStormCooldown),
		MemoryTolerance:     v.memoryTolerance(m),
		BreakerReleaseAfter: v.duration("", m, "breakerReleaseAfter", defaultBreakerReleaseAfter),
		BreakerReleaseNodes: v.count("", m, "breakerReleaseNodes", defaultBreakerReleaseNodes, 0, 10),
	}
	list, ok := v.ruleList(m)
	if !ok {
		return p
	}
	p.Rules = v.rules(list)
	v.breakerCap(p)
	return p
}

// ruleList is the policy's list of rules; ok false (and the problem
// recorded) when it is absent, not a list or too long.
func (v *validator) ruleList(m map[string]any) ([]any, bool) {
	raw, present := m["rules"]
	list, isList := raw.([]any)
	switch {
	case !present || raw == nil:
		v.fail("rules: required: a list of rules (an empty list disables every rule)")
		return nil, false
	case !isList:
		v.fail("rules: %s: want a list of rules, got %s", show(raw), kindOf(raw))
		return nil, false
	case len(list) > MaxRules:
		v.fail("rules: at most %d rules, got %d", MaxRules, len(list))
		return nil, false
	}
	return list, true
}

// rules reads every rule, refusing a name used twice.
func (v *validator) rules(list []any) []Rule {
	out := make([]Rule, 0, len(list))
	names := map[string]int{}
	for i, x := range list {
		path := fmt.Sprintf("rules[%d]", i)
		r := v.rule(path, x)
		if r.Name != "" {
			if j, dup := names[r.Name]; dup {
				v.fail("%s.name: %q: duplicate name (also rules[%d].name)", path, r.Name, j)
			} else {
				names[r.Name] = i
			}
		}
		out = append(out, r)
	}
	return out
}

// breakerCap refuses a maxUnhealthy percent above MaxUnhealthyCapPercent
// when a rule drains or replaces, naming the first such rule.
func (v *validator) breakerCap(p *Policy) {
	pct, ok := strings.CutSuffix(p.MaxUnhealthy.StrVal, "%")
	if !ok || p.MaxUnhealthy.Type != intstr.String {
		return
	}
	if n, err := strconv.Atoi(pct); err != nil || n <= MaxUnhealthyCapPercent {
		return
	}
	for i := range p.Rules {
		if p.Rules[i].Action >= Drain {
			v.fail("maxUnhealthy: %q: at most \"%d%%\" with drain or replace rules (rules[%d] %q is a %s rule): a breaker that lets more than half a group be drained at once lets one bad signal empty it",
				p.MaxUnhealthy.StrVal, MaxUnhealthyCapPercent, i, p.Rules[i].Name, p.Rules[i].Action)
			return
		}
	}
}

// count reads a whole number in [lo, hi]; def when absent.
func (v *validator) count(path string, m map[string]any, field string, def, lo, hi int) int {
	s, present, ok := v.text(path, m, field)
	if !present || !ok {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		v.fail("%s: %q: must be a whole number from %d to %d", join(path, field), s, lo, hi)
		return def
	}
	return n
}

// maxUnhealthy reads a count from 1 to maxCount (a number or a string of
// digits) or a whole percent from 1% to 100%, normalized: a count as an
// Int, a percent as "<n>%".
func (v *validator) maxUnhealthy(m map[string]any) intstr.IntOrString {
	def := intstr.FromString(defaultMaxUnhealthy)
	s, present, ok := v.text("", m, "maxUnhealthy")
	if !present || !ok {
		return def
	}
	const want = "must be a node count from 1 to %d or a whole percent from 1%% to 100%% (2 or \"20%%\")"
	if pct, isPct := strings.CutSuffix(s, "%"); isPct {
		n, err := strconv.Atoi(pct)
		if err != nil || n < 1 || n > 100 {
			v.fail("maxUnhealthy: %q: "+want, s, maxCount)
			return def
		}
		return intstr.FromString(strconv.Itoa(n) + "%")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxCount {
		v.fail("maxUnhealthy: %q: "+want, s, maxCount)
		return def
	}
	return intstr.FromInt32(int32(n))
}

// memoryTolerance reads a percent in [0%, 100%) as a share.
func (v *validator) memoryTolerance(m map[string]any) float64 {
	s, present, ok := v.text("", m, "memoryTolerance")
	if !present || !ok {
		return defaultMemoryTolerance
	}
	pct, isPct := strings.CutSuffix(s, "%")
	f, err := strconv.ParseFloat(pct, 64)
	if !isPct || err != nil || !(f >= 0 && f < 100) {
		v.fail("memoryTolerance: %q: must be a percent from 0%% to below 100%%, such as \"10%%\"", s)
		return defaultMemoryTolerance
	}
	if f == 0 {
		f = 0 // not -0
	}
	return f / 100
}

func (v *validator) rule(path string, x any) Rule {
	var r Rule
	m, ok := v.object(path, x, ruleFields)
	if !ok {
		return r
	}
	r.Name = v.ruleName(path, m)
	v.ruleMatch(path, m, &r)
	r.For = v.duration(path, m, "for", 0)
	r.Action = v.ruleAction(path, m)
	r.EvictLocalScratch = v.drainFlag(path, m, "evictLocalScratch", "evicts", r.Action, r.Action == Replace)
	r.CordonFirst = v.drainFlag(path, m, "cordonFirst", "cordons before its action", r.Action, r.Action >= Drain)
	r.Repair, r.RepairTimeout, r.StepTimeouts = v.repair(path, m, r.Action)
	return r
}

// ruleName reads a rule's name: required, a DNS label.
func (v *validator) ruleName(path string, m map[string]any) string {
	name, present, ok := v.text(path, m, "name")
	if !present {
		v.fail("%s.name: required", path)
		return ""
	}
	if !ok {
		return ""
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		v.fail("%s.name: %q: must be a DNS label: %s", path, name, strings.Join(errs, "; "))
		return ""
	}
	return name
}

// ruleMatch reads a rule's match: exactly one of condition, taint and
// belowSKU.
func (v *validator) ruleMatch(path string, m map[string]any, r *Rule) {
	var matches []string
	for _, f := range []string{"condition", "taint", "belowSKU"} {
		if m[f] != nil {
			matches = append(matches, f)
		}
	}
	switch len(matches) {
	case 0:
		v.fail("%s: no match: give one of condition, taint or belowSKU", path)
	case 1:
		switch matches[0] {
		case "condition":
			r.Condition = v.condition(join(path, "condition"), m["condition"])
		case "taint":
			r.Taint = v.taint(join(path, "taint"), m["taint"])
		case "belowSKU":
			r.BelowSKU = v.belowSKU(join(path, "belowSKU"), m["belowSKU"])
		}
	default:
		v.fail("%s: %d matches (%s): give exactly one", path, len(matches), strings.Join(matches, ", "))
	}
}

// ruleAction reads a rule's action: required, one of actionList.
func (v *validator) ruleAction(path string, m map[string]any) Action {
	s, present, ok := v.text(path, m, "action")
	switch {
	case !present:
		v.fail("%s.action: required: one of %s", path, actionList)
	case ok:
		if a, known := parseAction(s); known {
			return a
		}
		v.fail("%s.action: %q: must be one of %s", path, s, actionList)
	}
	return Report
}

// boolean reads a boolean field: present false for an absent or null
// field; ok false (and the problem recorded) for anything but a boolean.
func (v *validator) boolean(path string, m map[string]any, field string) (b, present, ok bool) {
	x, present := m[field]
	if !present || x == nil {
		return false, false, true
	}
	b, ok = x.(bool)
	if !ok {
		v.fail("%s.%s: %s: must be true or false, got %s", path, field, show(x), kindOf(x))
	}
	return b, true, ok
}

// drainFlag reads a rule's boolean that only a drain or replace rule may
// set true (what it does, for the error); def when absent or refused.
func (v *validator) drainFlag(path string, m map[string]any, field, does string, action Action, def bool) bool {
	b, present, ok := v.boolean(path, m, field)
	switch {
	case !present || !ok:
		return def
	case b && action < Drain:
		v.fail("%s.%s: true: only a drain or replace rule %s, not a %s rule", path, field, does, action)
		return def
	}
	return b
}

// repair reads a rule's repair steps and their timeouts: only on a replace
// rule, each a known step, in the order reboot, reimage, redeploy, none
// twice; repairTimeout is one duration for every step, or a map of step
// to duration (a step it leaves out has DefaultRepairTimeout), each from
// 1m to 6h.
func (v *validator) repair(path string, m map[string]any, action Action) ([]RepairStep, time.Duration, map[RepairStep]time.Duration) {
	x, present := m["repair"]
	_, hasTimeout := m["repairTimeout"]
	if !present || x == nil {
		if hasTimeout {
			v.fail("%s.repairTimeout: only with repair steps", path)
		}
		return nil, 0, nil
	}
	if action != Replace {
		v.fail("%s.repair: only a replace rule repairs its node before replacing it, not a %s rule", path, action)
		return nil, 0, nil
	}
	list, ok := x.([]any)
	if !ok {
		v.fail("%s.repair: %s: must be a list of steps (reboot, reimage, redeploy), got %s", path, show(x), kindOf(x))
		return nil, 0, nil
	}
	steps := v.repairSteps(path, list)
	if len(list) == 0 {
		v.fail("%s.repair: empty: leave it out to replace at once", path)
	}
	timeout, byStep := v.repairTimeouts(path, m, steps)
	return steps, timeout, byStep
}

// repairSteps reads a repair's steps: each a known step, in the order
// reboot, reimage, redeploy, none twice.
func (v *validator) repairSteps(path string, list []any) []RepairStep {
	var steps []RepairStep
	last := -1
	for i, e := range list {
		s, isText := e.(string)
		at := slices.Index(repairSteps, RepairStep(s))
		switch {
		case !isText:
			v.fail("%s.repair[%d]: %s: must be reboot, reimage or redeploy, got %s", path, i, show(e), kindOf(e))
		case at < 0:
			v.fail("%s.repair[%d]: %q: must be reboot, reimage or redeploy", path, i, s)
		case at <= last:
			v.fail("%s.repair[%d]: %q: the steps go cheapest first, each once: reboot, reimage, redeploy", path, i, s)
		default:
			steps, last = append(steps, RepairStep(s)), at
		}
	}
	return steps
}

// repairTimeouts reads repairTimeout: one duration for every step, or a
// map of step to duration (a step it leaves out has
// DefaultRepairTimeout), each from 1m to 6h.
func (v *validator) repairTimeouts(path string, m map[string]any, steps []RepairStep) (time.Duration, map[RepairStep]time.Duration) {
	perStep, isMap := m["repairTimeout"].(map[string]any)
	if !isMap {
		timeout := v.duration(path, m, "repairTimeout", DefaultRepairTimeout)
		v.repairTimeoutInRange(path, "repairTimeout", timeout)
		return timeout, nil
	}
	byStep := map[RepairStep]time.Duration{}
	for _, k := range slices.Sorted(maps.Keys(perStep)) {
		if !slices.Contains(steps, RepairStep(k)) {
			v.fail("%s.repairTimeout.%s: not a step of this rule's repair %v", path, k, steps)
			continue
		}
		if _, isText := perStep[k].(string); !isText {
			v.fail("%s.repairTimeout.%s: %s: must be a duration such as 15m, got %s", path, k, show(perStep[k]), kindOf(perStep[k]))
			continue
		}
		d := v.duration(path+".repairTimeout", perStep, k, DefaultRepairTimeout)
		v.repairTimeoutInRange(path, "repairTimeout."+k, d)
		byStep[RepairStep(k)] = d
	}
	return DefaultRepairTimeout, byStep
}

// repairTimeoutInRange refuses a repair timeout outside [1m, 6h].
func (v *validator) repairTimeoutInRange(path, field string, d time.Duration) {
	if d < time.Minute || d > 6*time.Hour {
		v.fail("%s.%s: %s: must be from 1m to 6h", path, field, d)
	}
}

func (v *validator) condition(path string, x any) *ConditionMatch {
	m, ok := v.object(path, x, conditionFields)
	if !ok {
		return nil
	}
	c := &ConditionMatch{}
	c.Type = v.conditionType(path, m)
	c.Status = v.conditionStatus(path, m)
	if b, present, ok := v.boolean(path, m, "matchHealthyStatus"); present && ok {
		c.MatchHealthyStatus = b
	}
	if healthy, known := healthyStatus[c.Type]; known && c.Status == healthy && !c.MatchHealthyStatus {
		v.fail("%s.status: %q: %s=%s is what a healthy node reports: the rule would match every healthy node (the problem is %s=True); set matchHealthyStatus: true only if that is meant",
			path, c.Status, c.Type, c.Status, c.Type)
	}
	return c
}

// conditionType reads a condition match's type: required, a qualified
// name, not Ready.
func (v *validator) conditionType(path string, m map[string]any) apiv1.NodeConditionType {
	t, present, ok := v.text(path, m, "type")
	if !present || (ok && t == "") {
		v.fail("%s.type: required: the condition's type, such as XIDErrors", path)
		return ""
	}
	if !ok {
		return ""
	}
	if errs := validation.IsQualifiedName(t); len(errs) > 0 {
		v.fail("%s.type: %q: not a condition type: %s", path, t, strings.Join(errs, "; "))
		return ""
	}
	if apiv1.NodeConditionType(t) == apiv1.NodeReady {
		v.fail("%s.type: %q: the kubelet's readiness is the unready guard's and scale-down's (--scale-down-unready-time), not a health rule's: True matches every node, False and Unknown none (unready nodes are not judged)", path, t)
		return ""
	}
	return apiv1.NodeConditionType(t)
}

// conditionStatus reads a condition match's status: required, True,
// False or Unknown.
func (v *validator) conditionStatus(path string, m map[string]any) apiv1.ConditionStatus {
	statuses := []apiv1.ConditionStatus{apiv1.ConditionTrue, apiv1.ConditionFalse, apiv1.ConditionUnknown}
	s, present, ok := v.text(path, m, "status")
	if !present {
		v.fail("%s.status: required: \"True\", \"False\" or \"Unknown\"", path)
		return ""
	}
	if !ok {
		return ""
	}
	if !slices.Contains(statuses, apiv1.ConditionStatus(s)) {
		v.fail("%s.status: %q: must be \"True\", \"False\" or \"Unknown\"", path, s)
		return ""
	}
	return apiv1.ConditionStatus(s)
}

func (v *validator) taint(path string, x any) *TaintMatch {
	m, ok := v.object(path, x, taintFields)
	if !ok {
		return nil
	}
	t := &TaintMatch{}
	t.Key = v.taintKey(path, m)
	t.Value = v.taintValue(path, m)
	t.Effect = v.taintEffect(path, m)
	return t
}

// taintKey reads a taint match's key: required, a qualified name, not
// one of the autoscaler's own taints.
func (v *validator) taintKey(path string, m map[string]any) string {
	k, present, ok := v.text(path, m, "key")
	if !present || (ok && k == "") {
		v.fail("%s.key: required: the taint's key", path)
		return ""
	}
	if !ok {
		return ""
	}
	if errs := validation.IsQualifiedName(k); len(errs) > 0 {
		v.fail("%s.key: %q: not a taint key: %s", path, k, strings.Join(errs, "; "))
		return ""
	}
	if isOwnTaint(k) {
		v.fail("%s.key: %q: the autoscaler's own (or its cordon's) taint: a rule on it would act on the autoscaler's own work", path, k)
		return ""
	}
	return k
}

// taintValue reads a taint match's value, a label value; "" (any) when
// absent.
func (v *validator) taintValue(path string, m map[string]any) string {
	val, present, ok := v.text(path, m, "value")
	if !present || !ok {
		return ""
	}
	if errs := validation.IsValidLabelValue(val); len(errs) > 0 {
		v.fail("%s.value: %q: not a taint value: %s", path, val, strings.Join(errs, "; "))
		return ""
	}
	return val
}

// taintEffect reads a taint match's effect; "" (any) when absent.
func (v *validator) taintEffect(path string, m map[string]any) apiv1.TaintEffect {
	effects := []apiv1.TaintEffect{apiv1.TaintEffectNoSchedule, apiv1.TaintEffectPreferNoSchedule, apiv1.TaintEffectNoExecute}
	e, present, ok := v.text(path, m, "effect")
	if !present || !ok || e == "" {
		return ""
	}
	if !slices.Contains(effects, apiv1.TaintEffect(e)) {
		v.fail("%s.effect: %q: must be NoSchedule, PreferNoSchedule or NoExecute (or absent: any)", path, e)
		return ""
	}
	return apiv1.TaintEffect(e)
}

func (v *validator) belowSKU(path string, x any) *BelowSKUMatch {
	m, ok := v.object(path, x, belowSKUFields)
	if !ok {
		return nil
	}
	b := &BelowSKUMatch{}
	if res, present, ok := v.text(path, m, "resource"); !present || (ok && res == "") {
		v.fail("%s.resource: required: an extended resource such as nvidia.com/gpu, or memory", path)
	} else if ok {
		if name := apiv1.ResourceName(res); name != apiv1.ResourceMemory && !isExtended(name) {
			v.fail("%s.resource: %q: must be an extended resource such as nvidia.com/gpu (a domain outside kubernetes.io), or memory", path, res)
		} else {
			b.Resource = name
		}
	}
	return b
}

// isExtended says whether name is an extended resource, as Kubernetes
// defines it: a domain-prefixed name outside kubernetes.io (nvidia.com/gpu,
// rdma/ib), valid as a resource quota's requests.<name>.
func isExtended(name apiv1.ResourceName) bool {
	s := string(name)
	if !strings.Contains(s, "/") || strings.Contains(s, "kubernetes.io/") || strings.HasPrefix(s, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+s)) == 0
}

// outPolicy and outRule are a policy as Marshal writes it.
type outPolicy struct {
	MaxUnhealthy        intstr.IntOrString `json:"maxUnhealthy"`
	StormCooldown       string             `json:"stormCooldown"`
	MemoryTolerance     string             `json:"memoryTolerance"`
	BreakerReleaseAfter string             `json:"breakerReleaseAfter"`
	BreakerReleaseNodes int                `json:"breakerReleaseNodes"`
	Rules               []outRule          `json:"rules"`
}

type outRule struct {
	Name        string        `json:"name"`
	Condition   *outCondition `json:"condition,omitempty"`
	Taint       *outTaint     `json:"taint,omitempty"`
	BelowSKU    *outBelowSKU  `json:"belowSKU,omitempty"`
	For         string        `json:"for"`
	Action      string        `json:"action"`
	CordonFirst *bool         `json:"cordonFirst,omitempty"`
	// EvictLocalScratch only where it differs from its default.
	EvictLocalScratch *bool    `json:"evictLocalScratch,omitempty"`
	Repair            []string `json:"repair,omitempty"`
	// RepairTimeout is a duration, or a map of step to duration.
	RepairTimeout any `json:"repairTimeout,omitempty"`
}

type outCondition struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	MatchHealthyStatus bool   `json:"matchHealthyStatus,omitempty"`
}

type outTaint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect,omitempty"`
}

type outBelowSKU struct {
	Resource string `json:"resource"`
}

// Marshal writes the policy as YAML that Parse reads back into an equal
// policy (keys in alphabetical order, no comments; cordonFirst only where
// it differs from its default).
func (p *Policy) Marshal() ([]byte, error) {
	out := outPolicy{
		MaxUnhealthy:        p.MaxUnhealthy,
		StormCooldown:       p.StormCooldown.String(),
		MemoryTolerance:     percent(p.MemoryTolerance),
		BreakerReleaseAfter: p.BreakerReleaseAfter.String(),
		BreakerReleaseNodes: p.BreakerReleaseNodes,
		Rules:               make([]outRule, 0, len(p.Rules)),
	}
	for i := range p.Rules {
		out.Rules = append(out.Rules, outRuleOf(&p.Rules[i]))
	}
	data, err := yaml.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("policy: marshal: %w", err)
	}
	return data, nil
}

// outRuleOf is a rule as Marshal writes it.
func outRuleOf(r *Rule) outRule {
	o := outRule{Name: r.Name, For: r.For.String(), Action: r.Action.String()}
	if r.Condition != nil {
		o.Condition = &outCondition{Type: string(r.Condition.Type), Status: string(r.Condition.Status), MatchHealthyStatus: r.Condition.MatchHealthyStatus}
	}
	if r.BelowSKU != nil {
		o.BelowSKU = &outBelowSKU{Resource: string(r.BelowSKU.Resource)}
	}
	if r.Taint != nil {
		o.Taint = &outTaint{Key: r.Taint.Key, Value: r.Taint.Value, Effect: string(r.Taint.Effect)}
	}
	if r.CordonFirst != (r.Action >= Drain) {
		b := r.CordonFirst
		o.CordonFirst = &b
	}
	if r.EvictLocalScratch != (r.Action == Replace) {
		b := r.EvictLocalScratch
		o.EvictLocalScratch = &b
	}
	o.Repair, o.RepairTimeout = outRepair(r)
	return o
}

// outRepair is a rule's repair steps and timeout as Marshal writes them:
// the timeouts per step when there are some, else the one timeout when
// there are steps.
func outRepair(r *Rule) (steps []string, timeout any) {
	for _, st := range r.Repair {
		steps = append(steps, string(st))
	}
	switch {
	case len(r.StepTimeouts) > 0:
		byStep := map[string]string{}
		for st, d := range r.StepTimeouts {
			byStep[string(st)] = d.String()
		}
		return steps, byStep
	case len(r.Repair) > 0:
		return steps, r.RepairTimeout.String()
	}
	return steps, nil
}

// percent writes a share as a percent that reads back as the same share:
// the shortest of a few decimals when one does ("10%", "12.5%"), else the
// fewest significant digits that do, else the exact text of a float64 next
// to share × 100 that does.
func percent(share float64) string {
	x := share * 100
	back := func(s string) bool {
		f, err := strconv.ParseFloat(s, 64)
		return err == nil && f/100 == share
	}
	for prec := 0; prec <= 6; prec++ {
		if s := strconv.FormatFloat(x, 'f', prec, 64); back(s) {
			return s + "%"
		}
	}
	for prec := 1; prec <= 17; prec++ {
		if s := strconv.FormatFloat(x, 'g', prec, 64); back(s) {
			return s + "%"
		}
	}
	up, down := x, x
	for range 4 {
		for _, c := range []float64{up, down} {
			if s := strconv.FormatFloat(c, 'g', -1, 64); back(s) {
				return s + "%"
			}
		}
		up, down = math.Nextafter(up, math.Inf(1)), math.Nextafter(down, math.Inf(-1))
	}
	return strconv.FormatFloat(x, 'g', -1, 64) + "%"
}
