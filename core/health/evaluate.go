package health

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
)

// maxMessage bounds the condition message quoted in a match's Detail
// (events carry 1 KiB).
const maxMessage = 200

// Shortfall is the resources node advertises (status.allocatable) less of
// than template, its node group's VM-size template node (its
// status.allocatable): every extended resource the template has (a
// domain-prefixed name outside kubernetes.io, e.g. nvidia.com/gpu) by any
// amount, absent or 0 on the node included; memory by more than memTol, a
// share in [0, 1) (node < template × (1 − memTol)). Sorted; nil when there
// is none, or when node or template is nil.
//
// A node whose kubelet or device plugin has not reported yet advertises
// nothing: the caller decides whether such a node counts (a new node still
// starting is not degraded).
func Shortfall(node, template *apiv1.Node, memTol float64) []apiv1.ResourceName {
	if node == nil || template == nil {
		return nil
	}
	if !(memTol >= 0) { // negative or NaN
		memTol = 0
	}
	memTol = min(memTol, 1)
	// Memory by capacity (the node's RAM as its kernel reports it against
	// the VM size's): what the kubelet reserves depends on the node's max
	// pods and the AKS version, not on the hardware, so comparing
	// allocatables would find small healthy nodes degraded. Extended
	// resources by allocatable: a device the plugin marked unhealthy
	// leaves capacity and lowers allocatable.
	var out []apiv1.ResourceName
	if memoryShort(node, template, memTol) {
		out = append(out, apiv1.ResourceMemory)
	}
	out = append(out, extendedShort(node, template)...)
	slices.Sort(out)
	return out
}

// memoryShort says whether node's memory capacity is below template's by
// more than memTol.
func memoryShort(node, template *apiv1.Node, memTol float64) bool {
	want, ok := template.Status.Capacity[apiv1.ResourceMemory]
	if !ok || want.Sign() <= 0 {
		return false
	}
	got := node.Status.Capacity[apiv1.ResourceMemory]
	return float64(got.Value()) < float64(want.Value())*(1-memTol)
}

// extendedShort is the extended resources template has that node
// advertises less of (allocatable), unsorted.
func extendedShort(node, template *apiv1.Node) []apiv1.ResourceName {
	var out []apiv1.ResourceName
	have := node.Status.Allocatable
	for name, want := range template.Status.Allocatable {
		if want.Sign() <= 0 || !isExtended(name) {
			continue
		}
		if got := have[name]; got.Cmp(want) < 0 { // the zero Quantity when absent
			out = append(out, name)
		}
	}
	return out
}

// Unjudged says why a node's shortfall of resource (Shortfall) cannot be
// judged by a belowSKU rule, or "" when it can. An extended resource the
// node advertises none of may be managed another way (a DRA driver
// publishes GPUs as ResourceSlices, not as nvidia.com/gpu; NVIDIA, "DRA
// Driver for NVIDIA GPUs": "a replacement for the traditional GPU
// allocation method used by the NVIDIA Kubernetes Device Plugin"); one
// whose domain the node advertises other resources of is advertised under
// other names (MIG devices as nvidia.com/mig-<profile> with the device
// plugin's mixed strategy; time-sliced GPUs as nvidia.com/gpu.shared when
// renamed). A healthy node of either kind was "below the VM size" and
// replaced by the built-in gpus-below-sku rule. A device plugin that never
// started is node-problem-detector's to say (AKS: GPUMissing,
// UnhealthyNvidiaDevicePlugin). Memory is always judged.
func Unjudged(node *apiv1.Node, resource apiv1.ResourceName) string {
	if node == nil || resource == apiv1.ResourceMemory {
		return ""
	}
	domain, _, ok := strings.Cut(string(resource), "/")
	if !ok {
		return ""
	}
	var others []string
	for name, q := range node.Status.Allocatable {
		if name != resource && strings.HasPrefix(string(name), domain+"/") && q.Sign() > 0 {
			others = append(others, string(name))
		}
	}
	slices.Sort(others)
	if len(others) > 0 {
		return fmt.Sprintf("%s advertised as %s", resource, strings.Join(others, ", "))
	}
	if _, ok := node.Status.Allocatable[resource]; !ok {
		return fmt.Sprintf("no %s advertised (a DRA driver or another device plugin may manage the devices)", resource)
	}
	return ""
}

// Match is a rule a node matches now.
type Match struct {
	Rule *Rule
	// Since is when the match began, as the node says: the condition's
	// lastTransitionTime, the taint's timeAdded; zero when the node does
	// not say (a taint without timeAdded, a belowSKU match).
	Since time.Time
	// Detail says what matched, for events and the status, e.g.
	// `condition XIDErrors=True (reason XID79: "GPU has fallen off the bus")`,
	// `taint example.com/bad=x:NoSchedule`, `nvidia.com/gpu below the VM size`.
	Detail string
}

// Evaluate returns the rules node matches now, in the policy's order, one
// Match per rule: a condition rule the node's condition of that type with
// that status; a taint rule the first taint of the node with that key (and
// value and effect, when the rule gives them); a belowSKU rule a resource
// in shortfall (Shortfall of the node and its group's template).
func (p *Policy) Evaluate(node *apiv1.Node, shortfall []apiv1.ResourceName) []Match {
	if p == nil || node == nil {
		return nil
	}
	var out []Match
	for i := range p.Rules {
		if m, ok := p.Rules[i].match(node, shortfall); ok {
			out = append(out, m)
		}
	}
	return out
}

// match is the rule's match on node, if it matches.
func (r *Rule) match(node *apiv1.Node, shortfall []apiv1.ResourceName) (Match, bool) {
	switch {
	case r.Condition != nil:
		return r.matchCondition(node)
	case r.Taint != nil:
		return r.matchTaint(node)
	case r.BelowSKU != nil:
		if slices.Contains(shortfall, r.BelowSKU.Resource) {
			return Match{Rule: r, Detail: string(r.BelowSKU.Resource) + " below the VM size"}, true
		}
	}
	return Match{}, false
}

// matchCondition matches the node's condition of the rule's type with
// the rule's status.
func (r *Rule) matchCondition(node *apiv1.Node) (Match, bool) {
	for _, c := range node.Status.Conditions {
		if c.Type == r.Condition.Type && c.Status == r.Condition.Status {
			return Match{Rule: r, Since: c.LastTransitionTime.Time, Detail: conditionDetail(c)}, true
		}
	}
	return Match{}, false
}

// matchTaint matches the node's first taint the rule's matches.
func (r *Rule) matchTaint(node *apiv1.Node) (Match, bool) {
	for _, t := range node.Spec.Taints {
		if !r.Taint.matches(t) {
			continue
		}
		m := Match{Rule: r, Detail: "taint " + t.ToString()}
		if t.TimeAdded != nil {
			m.Since = t.TimeAdded.Time
		}
		return m, true
	}
	return Match{}, false
}

// matches says whether t has the key, and the value and effect when
// they are not empty.
func (tm *TaintMatch) matches(t apiv1.Taint) bool {
	return t.Key == tm.Key && (tm.Value == "" || t.Value == tm.Value) &&
		(tm.Effect == "" || t.Effect == tm.Effect)
}

// conditionDetail is `condition <type>=<status>`, with the reason and the
// message (shortened) when the condition has them.
func conditionDetail(c apiv1.NodeCondition) string {
	s := fmt.Sprintf("condition %s=%s", c.Type, c.Status)
	msg := c.Message
	if r := []rune(msg); len(r) > maxMessage {
		msg = string(r[:maxMessage]) + "…"
	}
	switch {
	case c.Reason != "" && msg != "":
		s += fmt.Sprintf(" (reason %s: %s)", c.Reason, strconv.Quote(msg))
	case c.Reason != "":
		s += fmt.Sprintf(" (reason %s)", c.Reason)
	case msg != "":
		s += fmt.Sprintf(" (%s)", strconv.Quote(msg))
	}
	return s
}

// Verdict is what to do with a node, given what it matches.
type Verdict struct {
	// Action is the strongest action of the matched rules whose For has
	// passed; Report when the node matches rules none of which is due
	// (and when it matches none: then Rule is "" and Matches empty).
	Action Action
	// Rule is the rule giving Action: the first of the strongest due rules
	// in the policy's order; when none is due, the first of the strongest
	// matched rules (the one the node is waiting for); "" without a match.
	Rule string
	// Cordon says to cordon the node now: a due action of Cordon or
	// stronger, or a matched drain or replace rule with CordonFirst (due
	// or not).
	Cordon bool
	// Due says Action's For has passed (false when nothing is due).
	Due bool
	// Next is, when nothing is due, the time until Rule (the strongest
	// pending rule) becomes due; else the shortest time until a matched
	// rule stronger than the due Action becomes due; 0 when there is none.
	Next time.Duration
	// Matches are the matches judged.
	Matches []Match
}

// Judge decides what is due at now. A match's For is counted from its
// Since; when that is zero, from firstSeen(rule name), when the caller
// first saw the match (the caller keeps these); when that is zero too (or
// firstSeen is nil), from now. A For of 0 is due at once; a Since after
// now (clock skew) counts as now. Matches without a Rule are ignored.
func (p *Policy) Judge(matches []Match, now time.Time, firstSeen func(rule string) time.Time) Verdict {
	v := Verdict{Matches: matches, Cordon: cordonsFirst(matches)}
	left, due, pending := countdown(matches, now, firstSeen)
	switch {
	case due >= 0:
		v.Action, v.Rule, v.Due = matches[due].Rule.Action, matches[due].Rule.Name, true
		v.Cordon = v.Cordon || v.Action >= Cordon
	case pending >= 0:
		v.Action, v.Rule = Report, matches[pending].Rule.Name
	}
	if due < 0 {
		if pending >= 0 {
			v.Next = left[pending] // when the rule named becomes due
		}
		return v
	}
	v.Next = soonestStronger(matches, left, v.Action)
	return v
}

// cordonsFirst says whether a matched drain or replace rule cordons
// before its action.
func cordonsFirst(matches []Match) bool {
	for _, m := range matches {
		if r := m.Rule; r != nil && r.CordonFirst && r.Action >= Drain {
			return true
		}
	}
	return false
}

// countdown is, per match, the time until its rule is due (0 once due),
// and the strongest due and not-due matches (the first of the strongest;
// -1 for none).
func countdown(matches []Match, now time.Time, firstSeen func(rule string) time.Time) (left []time.Duration, due, pending int) {
	due, pending = -1, -1
	left = make([]time.Duration, len(matches))
	for i, m := range matches {
		r := m.Rule
		if r == nil {
			continue
		}
		left[i] = r.For - max(now.Sub(matchStart(m, now, firstSeen)), 0)
		if r.For <= 0 || left[i] <= 0 {
			left[i] = 0
			due = stronger(matches, due, i)
		} else {
			pending = stronger(matches, pending, i)
		}
	}
	return left, due, pending
}

// matchStart is when a match's For is counted from: its Since, else when
// the caller first saw it, else now.
func matchStart(m Match, now time.Time, firstSeen func(rule string) time.Time) time.Time {
	since := m.Since
	if since.IsZero() && firstSeen != nil {
		since = firstSeen(m.Rule.Name)
	}
	if since.IsZero() {
		since = now
	}
	return since
}

// stronger is i when its rule's action is stronger than best's (or best
// is -1), else best.
func stronger(matches []Match, best, i int) int {
	if best < 0 || matches[i].Rule.Action > matches[best].Rule.Action {
		return i
	}
	return best
}

// soonestStronger is the shortest time until a matched rule stronger
// than action becomes due, 0 when there is none.
func soonestStronger(matches []Match, left []time.Duration, action Action) time.Duration {
	var next time.Duration
	for i, m := range matches {
		if m.Rule == nil || left[i] <= 0 || m.Rule.Action <= action {
			continue
		}
		if next == 0 || left[i] < next {
			next = left[i]
		}
	}
	return next
}
