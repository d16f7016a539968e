// Package health is the passive node health policy (docs/concepts/health-policy.md): rules
// that match what a node already says about itself (a condition, a taint,
// fewer GPUs or less memory than its VM size), each with an action graded
// from a report to a replacement, and the per-group bound on how many nodes
// may be under drain or replacement at once.
//
// The package only decides; it reads nothing from the cluster and acts on
// nothing. Parse reads the policy strictly; Shortfall and Evaluate say what
// a node matches; Judge says what is due.
package health

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Action is what a rule does to a node it matches, ordered from the
// mildest: a stronger action includes the milder ones.
type Action int

const (
	// Report is an event, the metric and the status; nothing is done to the node.
	Report Action = iota
	// Cordon marks the node unschedulable.
	Cordon
	// Drain cordons the node and evicts its pods; the machine is kept.
	Drain
	// Replace drains the node and deletes its machine.
	Replace
)

// String is the action as the policy writes it: "report", "cordon",
// "drain" or "replace" ("Action(n)" for any other value).
func (a Action) String() string {
	switch a {
	case Report:
		return "report"
	case Cordon:
		return "cordon"
	case Drain:
		return "drain"
	case Replace:
		return "replace"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// actionList is the actions as the policy writes them, for errors.
const actionList = "report, cordon, drain, replace"

// parseAction reads an action as the policy writes it.
func parseAction(s string) (Action, bool) {
	for a := Report; a <= Replace; a++ {
		if s == a.String() {
			return a, true
		}
	}
	return 0, false
}

// Policy is a parsed, valid health policy.
type Policy struct {
	// MaxUnhealthy bounds how many of a group's nodes may be under drain or
	// replacement at once: a count (an Int, or a String of digits) or a
	// whole percent of the group's nodes (a String "20%"). See Allowed.
	MaxUnhealthy intstr.IntOrString
	// StormCooldown is how long drains and replacements of a group wait
	// after its breaker engaged, once it is back within MaxUnhealthy.
	StormCooldown time.Duration
	// MemoryTolerance is the share (in [0, 1)) of its VM size's memory a
	// node may lack before it is degraded (written "10%" in the policy).
	MemoryTolerance float64
	// BreakerReleaseAfter and BreakerReleaseNodes: a group's breaker held
	// for BreakerReleaseAfter by at most BreakerReleaseNodes nodes due for
	// a drain or replacement lets them go one at a time: a few known-bad
	// machines in a small pool are no storm, and holding them froze the
	// pool for good (2 bad nodes of 7 over its 20%). 0 nodes: never.
	BreakerReleaseAfter time.Duration
	BreakerReleaseNodes int
	// Rules, in the policy's order.
	Rules []Rule
}

// Allowed is AllowedOf(groupNodes, groupNodes).
func (p *Policy) Allowed(groupNodes int) int { return p.AllowedOf(groupNodes, groupNodes) }

// AllowedOf is how many of a group's nodes may be under drain or
// replacement at once: MaxUnhealthy's count, or its percent of
// groupNodes (the judged ones) rounded down; never below 1. With drain or
// replace rules it is never more than half of the group
// (MaxUnhealthyCapPercent of the larger of groupNodes and allNodes, its
// nodes judged or not, rounded down, never below 1): Parse refuses a
// larger percent, and a count is cut to it here, so a count written for a
// bigger group (or a typo) cannot let one bad signal drain a whole group.
// The cut counts nodes not judged yet (new nodes whose GPUs are not
// advertised) so that a count is not cut below what it says while a
// group comes up. A nil policy, or a MaxUnhealthy that is neither,
// allows 1.
func (p *Policy) AllowedOf(groupNodes, allNodes int) int {
	n := 1
	if p == nil {
		return n
	}
	switch v := p.MaxUnhealthy; v.Type {
	case intstr.Int:
		n = int(v.IntVal)
	case intstr.String:
		if pct, ok := strings.CutSuffix(v.StrVal, "%"); ok {
			if x, err := strconv.Atoi(pct); err == nil && x > 0 && x <= 100 {
				n = max(groupNodes, 0) * x / 100
			}
		} else if c, err := strconv.Atoi(v.StrVal); err == nil {
			n = c
		}
	}
	if p.disrupts() {
		n = min(n, max(groupNodes, allNodes, 0)*MaxUnhealthyCapPercent/100)
	}
	return max(n, 1)
}

// disrupts says whether any rule drains or replaces.
func (p *Policy) disrupts() bool {
	for i := range p.Rules {
		if p.Rules[i].Action >= Drain {
			return true
		}
	}
	return false
}

// Rule is one rule of a policy: exactly one of Condition, Taint and
// BelowSKU is set.
type Rule struct {
	// Name is a DNS label, unique in the policy.
	Name string
	// Condition matches a node condition of this type and status.
	Condition *ConditionMatch
	// Taint matches a taint of the node.
	Taint *TaintMatch
	// BelowSKU matches a node that advertises less of a resource than its
	// node group's VM size (Shortfall).
	BelowSKU *BelowSKUMatch
	// For is how long the match must last before Action.
	For time.Duration
	// Action is what is done once the match lasted For.
	Action Action
	// EvictLocalScratch lets a drain or replace evict pods whose only
	// local storage is emptyDir (never hostPath): the data of a node
	// judged broken is lost with it anyway, and a training pod's scratch
	// emptyDir held every replacement (the gang hung on a dead GPU).
	// Resolved at parse time: true for replace unless the policy says
	// `evictLocalScratch: false`; false for drain unless it says true.
	EvictLocalScratch bool
	// CordonFirst cordons the node as soon as the rule matches, before
	// For has passed. Resolved at parse time: true for drain and replace
	// unless the policy says `cordonFirst: false`; always false for report
	// and cordon.
	CordonFirst bool
	// Repair are the in-place repairs a replace rule tries, in order, on
	// the drained node before its machine is deleted (`repair: [reboot,
	// reimage]`): each is given its timeout (StepTimeout) to bring the
	// node back. None: the machine is replaced at once.
	Repair []RepairStep
	// RepairTimeout is every step's timeout, but those StepTimeouts
	// names (`repairTimeout: {reboot: 10m, reimage: 40m}`).
	RepairTimeout time.Duration
	StepTimeouts  map[RepairStep]time.Duration
}

// Rule is the policy's rule of that name, nil when it has none.
func (p *Policy) Rule(name string) *Rule {
	for i := range p.Rules {
		if p.Rules[i].Name == name {
			return &p.Rules[i]
		}
	}
	return nil
}

// StepTimeout is the time the rule's i-th repair step has to bring the
// node back (the machine's operation, its boot, preflight again, and the
// rule no longer matching); the rule's longest step timeout for an i out
// of range.
func (r *Rule) StepTimeout(i int) time.Duration {
	if i >= 0 && i < len(r.Repair) {
		if d, ok := r.StepTimeouts[r.Repair[i]]; ok {
			return d
		}
		return r.RepairTimeout
	}
	longest := r.RepairTimeout
	for _, d := range r.StepTimeouts {
		longest = max(longest, d)
	}
	return longest
}

// RepairStep is an in-place repair, cheapest first: "reboot", "reimage",
// "redeploy" (cloudprovider.RepairAction's values).
type RepairStep string

// The repair steps, in the order a rule may list them.
const (
	RepairReboot   RepairStep = "reboot"
	RepairReimage  RepairStep = "reimage"
	RepairRedeploy RepairStep = "redeploy"
)

// repairSteps are the steps in their only allowed order.
var repairSteps = []RepairStep{RepairReboot, RepairReimage, RepairRedeploy}

// DefaultRepairTimeout is each repair step's time for the node to stop
// matching when the rule gives none: a GPU VM's reboot, or a reimage's
// boot with the driver extension, plus a monitor's next look.
const DefaultRepairTimeout = 20 * time.Minute

// ConditionMatch matches a node condition.
type ConditionMatch struct {
	Type   apiv1.NodeConditionType
	Status apiv1.ConditionStatus
	// MatchHealthyStatus lets a rule match the status a healthy node
	// reports for a well-known condition (refused otherwise).
	MatchHealthyStatus bool
}

// TaintMatch matches a taint by key and, when they are not empty, value and
// effect.
type TaintMatch struct {
	Key    string
	Value  string
	Effect apiv1.TaintEffect
}

// BelowSKUMatch matches a node that advertises less of Resource (an
// extended resource such as nvidia.com/gpu, or memory beyond the policy's
// MemoryTolerance) than its node group's VM size.
type BelowSKUMatch struct {
	Resource apiv1.ResourceName
}

// DefaultYAML is the built-in policy, used without the ConfigMap, and the
// one the chart ships (docs/concepts/health-policy.md, values.yaml health.policy).
const DefaultYAML = `# How many nodes of a node group may be under drain or replacement by this
# policy at once: a count ("2") or a share of the group's live nodes
# (Ready, past preflight and startup: "20%", rounded down, never below 1;
# never more than half the group with drain or replace rules). Beyond it
# the breaker holds: nodes are reported, not cordoned, drained or
# replaced; the group still scales up.
maxUnhealthy: "20%"
# After a group's breaker engaged, drains and replacements in that group
# wait this long once it has fallen back within maxUnhealthy.
stormCooldown: 10m
# A breaker held this long by at most breakerReleaseNodes nodes due for a
# drain or replacement lets them go, one at a time: a few bad machines in
# a small pool are no storm (0: never).
breakerReleaseAfter: 30m
breakerReleaseNodes: 2
# A node is degraded when its memory (capacity: the RAM its kernel
# reports) is below its VM size's by more than this share (GPUs and other
# extended resources: any shortfall of allocatable).
memoryTolerance: "10%"
# The conditions are those AKS's node-problem-detector sets (Microsoft,
# "Node Problem Detector (NPD) in Azure Kubernetes Service (AKS) nodes"),
# True for a problem.
rules:
- name: xid-error
  condition: {type: XIDErrors, status: "True"}
  for: 2m
  action: replace
- name: gpu-missing
  condition: {type: GPUMissing, status: "True"}
  for: 2m
  action: replace
- name: device-plugin-unhealthy
  condition: {type: UnhealthyNvidiaDevicePlugin, status: "True"}
  for: 10m
  action: drain
- name: kernel-deadlock
  condition: {type: KernelDeadlock, status: "True"}
  for: 10m
  action: replace
- name: readonly-filesystem
  condition: {type: ReadonlyFilesystem, status: "True"}
  for: 5m
  action: replace
- name: gpus-below-sku
  belowSKU: {resource: nvidia.com/gpu}
  for: 5m
  action: replace
`

// Default is the built-in policy, DefaultYAML parsed: a new copy on every
// call. DefaultYAML always parses (TestDefault), so it does not panic.
func Default() *Policy {
	p, err := Parse(DefaultYAML)
	if err != nil {
		panic(fmt.Sprintf("health: the built-in policy does not parse: %v", err))
	}
	return p
}
