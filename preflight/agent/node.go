package agent

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// names are the taint, label and annotations the agent reads and writes.
type names struct {
	taint              corev1.Taint
	label              string
	failureAnnotation  string
	passedAtAnnotation string
}

// parseTaint parses the --taint flag, key=value:Effect (or key:Effect).
func parseTaint(s string) (corev1.Taint, error) {
	t, err := preflight.ParseTaint("--taint", s)
	if err != nil {
		return corev1.Taint{}, err
	}
	if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
		return corev1.Taint{}, fmt.Errorf("--taint: key %q in %q: %s", t.Key, s, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
		return corev1.Taint{}, fmt.Errorf("--taint: value %q in %q: %s", t.Value, s, strings.Join(errs, "; "))
	}
	return t, nil
}

// isPreflightTaint reports whether t is the preflight taint: same key and
// effect, whatever its value.
func (n names) isPreflightTaint(t corev1.Taint) bool {
	return t.Key == n.taint.Key && t.Effect == n.taint.Effect
}

func (n names) hasTaint(node *corev1.Node) bool {
	for _, t := range node.Spec.Taints {
		if n.isPreflightTaint(t) {
			return true
		}
	}
	return false
}

// failedAfterPass says a failed node had passed before (the passed-at
// annotation) and is not pending again (no preflight taint): a periodic
// run failed it.
func (n names) failedAfterPass(node *corev1.Node) bool {
	_, passed := node.Annotations[n.passedAtAnnotation]
	return passed && !n.hasTaint(node)
}

// mode is how the agent runs.
type mode struct {
	// periodic: re-check a node that already passed (CronJob, or a loop
	// with --interval).
	periodic bool
	// retryFailed: run again on a node already labelled failed.
	retryFailed bool
}

// shouldRun decides whether the checks should run on node. When not, why
// says so for the log.
func shouldRun(node *corev1.Node, n names, m mode) (run bool, why string) {
	label := node.Labels[n.label]
	if m.periodic {
		// A node that failed a periodic run after it had passed is checked
		// again: when what failed was outside it (DNS, the API server), it
		// passes once that recovers, and the autoscaler, which kept it while
		// many nodes failed the same check, uncordons it.
		if label == preflight.ValueFailed && n.failedAfterPass(node) {
			return true, ""
		}
		if label != preflight.ValuePassed {
			return false, fmt.Sprintf("periodic checks run only on nodes labelled %s=%s or failed by a periodic run; this one has %q", n.label, preflight.ValuePassed, label)
		}
		return true, ""
	}
	switch {
	case label == preflight.ValueFailed && !m.retryFailed:
		return false, "preflight already failed on this node, which is to be replaced (--retry-failed runs the checks again)"
	case label == preflight.ValuePassed && !n.hasTaint(node):
		return false, "preflight already passed on this node"
	}
	return true, ""
}

// markPassed records a pass on node: it removes the preflight taint (and
// only it), labels the node passed, removes the failure annotation and sets
// the passed-at annotation to now. It reports whether node changed.
func markPassed(node *corev1.Node, n names, now time.Time) (changed bool) {
	var kept []corev1.Taint
	for _, t := range node.Spec.Taints {
		if n.isPreflightTaint(t) {
			changed = true
			continue
		}
		kept = append(kept, t)
	}
	if changed {
		node.Spec.Taints = kept
	}
	changed = setLabel(node, n.label, preflight.ValuePassed) || changed
	if _, ok := node.Annotations[n.failureAnnotation]; ok {
		delete(node.Annotations, n.failureAnnotation)
		changed = true
	}
	changed = setAnnotation(node, n.passedAtAnnotation, now.UTC().Format(time.RFC3339)) || changed
	return changed
}

// markFailed records a failure on node: it labels the node failed and sets
// the failure annotation to message. With keepTaint (the DaemonSet mode)
// the preflight taint is put back if someone removed it, so the node takes
// no work; without (periodic mode on a node that passed) no taint is added:
// the autoscaler cordons and replaces failed nodes. It reports whether node
// changed.
func markFailed(node *corev1.Node, n names, message string, keepTaint bool) (changed bool) {
	if keepTaint && !n.hasTaint(node) {
		node.Spec.Taints = append(node.Spec.Taints, n.taint)
		changed = true
	}
	changed = setLabel(node, n.label, preflight.ValueFailed) || changed
	changed = setAnnotation(node, n.failureAnnotation, message) || changed
	return changed
}

// applyResult is the whole change a run makes to node, decided again on the
// node as it is now (it may have changed while the checks ran): nothing
// when the checks should no longer run on it (why says so), else
// markPassed or markFailed.
func applyResult(node *corev1.Node, n names, m mode, res *runResult, outputLimit int, now time.Time) (changed bool, why string) {
	if run, why := shouldRun(node, n, m); !run {
		return false, why
	}
	if f := res.Failed(); f != nil {
		return markFailed(node, n, failureMessage(f, outputLimit), !m.periodic), ""
	}
	return markPassed(node, n, now), ""
}

func setLabel(node *corev1.Node, key, value string) bool {
	if v, ok := node.Labels[key]; ok && v == value {
		return false
	}
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	node.Labels[key] = value
	return true
}

func setAnnotation(node *corev1.Node, key, value string) bool {
	if v, ok := node.Annotations[key]; ok && v == value {
		return false
	}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[key] = value
	return true
}
