// Package preflight is the readiness gate the core uses: a new node joins
// with a preflight taint and label, a preflight agent (preflight/agent, a
// DaemonSet) proves its GPUs, disks and network and lifts the taint. Until
// then the node is coming capacity, not usable capacity; a node whose
// checks failed, or that did not pass within the deadline, is replaced.
//
// The functions here are pure: they read a Node and say what it is.
package preflight

import (
	"fmt"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
)

// Defaults shared with the cluster (design.md).
const (
	DefaultTaintKey          = "vmss-autoscaler.io/preflight"
	DefaultTaintValue        = "pending"
	DefaultLabel             = "vmss-autoscaler.io/preflight"
	DefaultFailureAnnotation = "vmss-autoscaler.io/preflight-failure"
	// PassedAtAnnotation is set by the agent when the node passed (RFC 3339).
	PassedAtAnnotation = "vmss-autoscaler.io/preflight-passed-at"
	// AgainAnnotation is set by the autoscaler when it sends a node that
	// had passed through preflight again (after an in-place repair: the
	// taint and the pending label put back), RFC 3339: the node's
	// --max-preflight-time counts from it, not from its registration.
	AgainAnnotation = "vmss-autoscaler.io/preflight-again-at"

	ValuePending = "pending"
	ValuePassed  = "passed"
	ValueFailed  = "failed"
)

// Options name the taint and label and bound the time a node may take.
type Options struct {
	// Enabled turns the gate on; off, every node is Passed.
	Enabled bool
	// Taint is the taint new nodes join with (key, value, effect).
	Taint apiv1.Taint
	// Label carries pending|passed|failed.
	Label string
	// FailureAnnotation holds the agent's reason for a failure.
	FailureAnnotation string
	// MaxPreflightTime is how long a node may stay pending after it
	// registered before it counts as failed.
	MaxPreflightTime time.Duration
}

// DefaultOptions are design.md's names and a 20-minute deadline (a
// dcgmi level-3 diagnostic takes about 15).
func DefaultOptions() Options {
	return Options{
		Enabled:           true,
		Taint:             apiv1.Taint{Key: DefaultTaintKey, Value: DefaultTaintValue, Effect: apiv1.TaintEffectNoSchedule},
		Label:             DefaultLabel,
		FailureAnnotation: DefaultFailureAnnotation,
		MaxPreflightTime:  20 * time.Minute,
	}
}

// ParseTaint reads key=value:Effect (value optional), naming the flag on error.
func ParseTaint(flag, s string) (apiv1.Taint, error) {
	kv, effect, ok := strings.Cut(s, ":")
	if !ok || kv == "" {
		return apiv1.Taint{}, fmt.Errorf("%s: want key=value:Effect, got %q", flag, s)
	}
	t := apiv1.Taint{Effect: apiv1.TaintEffect(effect)}
	t.Key, t.Value, _ = strings.Cut(kv, "=")
	switch t.Effect {
	case apiv1.TaintEffectNoSchedule, apiv1.TaintEffectNoExecute, apiv1.TaintEffectPreferNoSchedule:
	default:
		return apiv1.Taint{}, fmt.Errorf("%s: effect %q in %q is not NoSchedule, PreferNoSchedule or NoExecute", flag, effect, s)
	}
	if t.Key == "" {
		return apiv1.Taint{}, fmt.Errorf("%s: empty key in %q", flag, s)
	}
	return t, nil
}

// Validate names the flag at fault.
func (o Options) Validate() error {
	if !o.Enabled {
		return nil
	}
	switch {
	case o.Taint.Key == "":
		return fmt.Errorf("--preflight-taint: empty key")
	case o.Label == "":
		return fmt.Errorf("--preflight-label: must not be empty")
	case o.MaxPreflightTime <= 0:
		return fmt.Errorf("--max-preflight-time: must be positive, got %s", o.MaxPreflightTime)
	}
	return nil
}

// State is what a node is to the autoscaler.
type State int

const (
	// Passed nodes (and nodes that never had the gate) are usable capacity.
	Passed State = iota
	// Pending nodes are coming capacity of their group.
	Pending
	// Failed nodes are replaced.
	Failed
)

func (s State) String() string {
	switch s {
	case Pending:
		return "pending"
	case Failed:
		return "failed"
	}
	return "passed"
}

// Classify says what a node is at now, and for a failed one why.
func (o Options) Classify(n *apiv1.Node, now time.Time) (State, string) {
	if !o.Enabled {
		return Passed, ""
	}
	if n.Labels[o.Label] == ValueFailed {
		why := "preflight checks failed"
		if msg := n.Annotations[o.FailureAnnotation]; msg != "" {
			why += ": " + msg
		}
		return Failed, why
	}
	if !o.HasTaint(n) {
		return Passed, ""
	}
	since, what := n.CreationTimestamp.Time, "registration"
	if t, ok := AgainAt(n, now); ok && t.After(since) {
		since, what = t, "it was sent through preflight again"
	}
	if age := now.Sub(since); age >= o.MaxPreflightTime {
		return Failed, fmt.Sprintf("preflight not passed %s after %s (--max-preflight-time %s)", age.Round(time.Second), what, o.MaxPreflightTime)
	}
	return Pending, ""
}

// HasTaint reports whether the node carries the preflight taint (same key
// and effect; the value is informational).
func (o Options) HasTaint(n *apiv1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == o.Taint.Key && t.Effect == o.Taint.Effect {
			return true
		}
	}
	return false
}

// StripTemplate removes the preflight taint and label from a template
// node in place: pods never need to tolerate the gate, they wait for it.
func (o Options) StripTemplate(n *apiv1.Node) {
	if !o.Enabled {
		return
	}
	taints := n.Spec.Taints[:0:0]
	for _, t := range n.Spec.Taints {
		if t.Key != o.Taint.Key {
			taints = append(taints, t)
		}
	}
	n.Spec.Taints = taints
	delete(n.Labels, o.Label)
}

// AgainAt is when the autoscaler sent the node through preflight again
// (AgainAnnotation); false when it never did or the annotation is not a
// time. A time after now (another replica's clock ahead of this one's)
// is now.
func AgainAt(n *apiv1.Node, now time.Time) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, n.Annotations[AgainAnnotation])
	if err != nil {
		return time.Time{}, false
	}
	if t.After(now) {
		return now, true
	}
	return t, true
}

// PassedAt is when the node passed: the agent's annotation, else now.
func PassedAt(n *apiv1.Node, now time.Time) time.Time {
	if s := n.Annotations[PassedAtAnnotation]; s != "" {
		if t, err := time.Parse(time.RFC3339, s); err == nil && !t.After(now) {
			return t
		}
	}
	return now
}

// TimedOut is the check FailedCheck names for a node that did not pass in time.
const TimedOut = "(timeout)"

// FailedCheck names what a failed node failed, so that many nodes failing
// the same check at once can be told from many bad machines: the check
// name of the agent's failure message ("check <name>: <reason>: <output>"),
// else the message's first field before a colon, else the whole message
// (at most 63 bytes); TimedOut for a node that never passed in time.
func (o Options) FailedCheck(n *apiv1.Node) string {
	if n.Labels[o.Label] != ValueFailed {
		return TimedOut
	}
	msg := strings.TrimSpace(n.Annotations[o.FailureAnnotation])
	msg = strings.TrimPrefix(msg, "check ")
	name, _, _ := strings.Cut(msg, ":")
	name = strings.TrimSpace(name)
	if len(name) > 63 {
		name = name[:63]
	}
	if name == "" {
		return "(no reason given)"
	}
	return name
}
