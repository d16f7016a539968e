package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

var (
	t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	t1 = t0.Add(time.Hour)
)

// testNames are the defaults, as Main parses them.
func testNames(t *testing.T) names {
	t.Helper()
	o, err := parseOptions([]string{"--node-name=gpu-0"}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	return o.names
}

func noEnv(string) string { return "" }

// gpuNode builds a node with the given options on top of testobjects.Node.
func gpuNode(opts ...to.NodeOption) *corev1.Node {
	return to.Node("gpu-0", "96", "1800Gi", append([]to.NodeOption{to.NodeGPUs(8)}, opts...)...)
}

// pending is a node as it joins: preflight taint and label pending.
func pending() to.NodeOption {
	return func(n *corev1.Node) {
		to.Taint(preflight.DefaultTaintKey, preflight.DefaultTaintValue)(n)
		label(preflight.ValuePending)(n)
	}
}

func label(value string) to.NodeOption { return nodeLabel(preflight.DefaultLabel, value) }

// nodeLabel sets a label, also on a node whose labels were cleared.
func nodeLabel(key, value string) to.NodeOption {
	return func(n *corev1.Node) {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[key] = value
	}
}

func taint(key, value string, effect corev1.TaintEffect) to.NodeOption {
	return func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: value, Effect: effect})
	}
}

func annotation(key, value string) to.NodeOption {
	return func(n *corev1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[key] = value
	}
}

func noLabels() to.NodeOption { return func(n *corev1.Node) { n.Labels = nil } }

// Other people's taints and labels, which the agent must never touch.
var (
	teamTaint     = taint("openai.com/team", "rl", corev1.TaintEffectNoSchedule)
	notReadyTaint = taint(corev1.TaintNodeNotReady, "", corev1.TaintEffectNoExecute)
	// Same key as the preflight taint, other effect: not the preflight taint.
	otherEffect = taint(preflight.DefaultTaintKey, "drain", corev1.TaintEffectNoExecute)
	groupLabel  = nodeLabel("vmss-autoscaler.io/node-group", "gpu-h100")
)

func TestMarkPassed(t *testing.T) {
	n := testNames(t)
	passedAt := annotation(preflight.PassedAtAnnotation, t0.Format(time.RFC3339))
	tests := []struct {
		name string
		node *corev1.Node
		want *corev1.Node
	}{
		{"pending node", gpuNode(pending()), gpuNode(label(preflight.ValuePassed), passedAt)},
		{"other taints and labels are kept",
			gpuNode(teamTaint, pending(), notReadyTaint, otherEffect, groupLabel),
			gpuNode(teamTaint, notReadyTaint, otherEffect, groupLabel, label(preflight.ValuePassed), passedAt)},
		{"taint matched by key and effect, whatever its value",
			gpuNode(taint(preflight.DefaultTaintKey, "running", corev1.TaintEffectNoSchedule), label(preflight.ValuePending)),
			gpuNode(label(preflight.ValuePassed), passedAt)},
		{"retried failed node loses its failure annotation",
			gpuNode(pending(), label(preflight.ValueFailed), annotation(preflight.DefaultFailureAnnotation, "check gpus: exit code 1")),
			gpuNode(label(preflight.ValuePassed), passedAt)},
		{"node without labels or annotations",
			gpuNode(noLabels(), taint(preflight.DefaultTaintKey, preflight.DefaultTaintValue, corev1.TaintEffectNoSchedule)),
			gpuNode(noLabels(), label(preflight.ValuePassed), passedAt)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := tc.node.DeepCopy()
			if !markPassed(node, n, t0) {
				t.Fatal("markPassed reported no change")
			}
			if !equality.Semantic.DeepEqual(node, tc.want) {
				t.Fatalf("node after markPassed:\n got %s\nwant %s", describe(node), describe(tc.want))
			}
			again := node.DeepCopy()
			if markPassed(again, n, t0) {
				t.Error("second markPassed at the same time reported a change")
			}
			if !equality.Semantic.DeepEqual(again, node) {
				t.Errorf("second markPassed changed the node:\n got %s\nwant %s", describe(again), describe(node))
			}
		})
	}
}

func TestMarkPassedRefreshesPassedAt(t *testing.T) {
	n := testNames(t)
	node := gpuNode(label(preflight.ValuePassed), annotation(preflight.PassedAtAnnotation, t0.Format(time.RFC3339)))
	if !markPassed(node, n, t1) {
		t.Fatal("markPassed an hour later reported no change")
	}
	if got, want := node.Annotations[preflight.PassedAtAnnotation], t1.Format(time.RFC3339); got != want {
		t.Errorf("passed-at = %q, want %q", got, want)
	}
}

func TestMarkFailed(t *testing.T) {
	n := testNames(t)
	const msg = "check gpus: 3 lines matched '^GPU \\d+:', want 8: GPU 0: ..."
	failed := func() to.NodeOption {
		return func(node *corev1.Node) {
			label(preflight.ValueFailed)(node)
			annotation(preflight.DefaultFailureAnnotation, msg)(node)
		}
	}
	passedAt := annotation(preflight.PassedAtAnnotation, t0.Format(time.RFC3339))
	tests := []struct {
		name      string
		node      *corev1.Node
		keepTaint bool
		want      *corev1.Node
	}{
		{"pending node keeps its taint", gpuNode(teamTaint, pending(), groupLabel), true,
			gpuNode(teamTaint, pending(), groupLabel, failed())},
		{"removed taint is put back in DaemonSet mode", gpuNode(teamTaint, label(preflight.ValuePending)), true,
			gpuNode(teamTaint, label(preflight.ValuePending), pending(), failed())},
		{"a taint of another effect is not the preflight taint", gpuNode(otherEffect, label(preflight.ValuePending)), true,
			gpuNode(otherEffect, pending(), failed())},
		{"periodic failure adds no taint and keeps passed-at", gpuNode(teamTaint, notReadyTaint, label(preflight.ValuePassed), passedAt, groupLabel), false,
			gpuNode(teamTaint, notReadyTaint, passedAt, groupLabel, failed())},
		{"node without labels", gpuNode(noLabels()), false, gpuNode(noLabels(), failed())},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := tc.node.DeepCopy()
			if !markFailed(node, n, msg, tc.keepTaint) {
				t.Fatal("markFailed reported no change")
			}
			if !equality.Semantic.DeepEqual(node, tc.want) {
				t.Fatalf("node after markFailed:\n got %s\nwant %s", describe(node), describe(tc.want))
			}
			again := node.DeepCopy()
			if markFailed(again, n, msg, tc.keepTaint) {
				t.Error("second markFailed reported a change")
			}
			if !equality.Semantic.DeepEqual(again, node) {
				t.Errorf("second markFailed changed the node:\n got %s\nwant %s", describe(again), describe(node))
			}
		})
	}
}

func TestShouldRun(t *testing.T) {
	n := testNames(t)
	daemonSet, retry, periodic := mode{}, mode{retryFailed: true}, mode{periodic: true}
	tests := []struct {
		name string
		node *corev1.Node
		mode mode
		want bool
		why  string
	}{
		{"pending", gpuNode(pending()), daemonSet, true, ""},
		{"tainted, no label yet", gpuNode(taint(preflight.DefaultTaintKey, preflight.DefaultTaintValue, corev1.TaintEffectNoSchedule)), daemonSet, true, ""},
		{"passed", gpuNode(label(preflight.ValuePassed)), daemonSet, false, "already passed"},
		{"passed but tainted again", gpuNode(label(preflight.ValuePassed), taint(preflight.DefaultTaintKey, preflight.DefaultTaintValue, corev1.TaintEffectNoSchedule)), daemonSet, true, ""},
		{"passed, other taints", gpuNode(label(preflight.ValuePassed), teamTaint, otherEffect), daemonSet, false, "already passed"},
		{"failed", gpuNode(pending(), label(preflight.ValueFailed)), daemonSet, false, "--retry-failed"},
		{"failed, retry", gpuNode(pending(), label(preflight.ValueFailed)), retry, true, ""},
		{"periodic on passed", gpuNode(label(preflight.ValuePassed)), periodic, true, ""},
		{"periodic on pending", gpuNode(pending()), periodic, false, `this one has "pending"`},
		{"periodic on failed", gpuNode(label(preflight.ValueFailed)), periodic, false, `this one has "failed"`},
		{"periodic without label", gpuNode(), periodic, false, `this one has ""`},
		{"periodic on a node a periodic run failed", gpuNode(label(preflight.ValueFailed), annotation(preflight.PassedAtAnnotation, t0.Format(time.RFC3339))), periodic, true, ""},
		{"periodic on a node failed after pass but pending again", gpuNode(pending(), label(preflight.ValueFailed), annotation(preflight.PassedAtAnnotation, t0.Format(time.RFC3339))), periodic, false, `this one has "failed"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run, why := shouldRun(tc.node, n, tc.mode)
			if run != tc.want || !strings.Contains(why, tc.why) || (run && why != "") {
				t.Fatalf("shouldRun = %v, %q; want %v and a reason containing %q", run, why, tc.want, tc.why)
			}
		})
	}
}

func TestApplyResult(t *testing.T) {
	n := testNames(t)
	pass := &runResult{Checks: []checkResult{{Name: "gpus", Passed: true}, {Name: "dns", Passed: true}}}
	fail := &runResult{Checks: []checkResult{{Name: "gpus", Passed: true}, {Name: "dcgm", Failure: failExit, Reason: "exit code 226", Output: "diag failed"}}}
	tests := []struct {
		name    string
		node    *corev1.Node
		mode    mode
		res     *runResult
		want    *corev1.Node // nil: unchanged
		skipped string
	}{
		{"pass", gpuNode(pending(), teamTaint), mode{}, pass,
			gpuNode(teamTaint, label(preflight.ValuePassed), annotation(preflight.PassedAtAnnotation, t0.Format(time.RFC3339))), ""},
		{"fail", gpuNode(pending(), teamTaint), mode{}, fail,
			gpuNode(pending(), teamTaint, label(preflight.ValueFailed), annotation(preflight.DefaultFailureAnnotation, "check dcgm: exit code 226: diag failed")), ""},
		{"periodic fail", gpuNode(label(preflight.ValuePassed)), mode{periodic: true}, fail,
			gpuNode(label(preflight.ValueFailed), annotation(preflight.DefaultFailureAnnotation, "check dcgm: exit code 226: diag failed")), ""},
		{"marked failed by someone else while the checks ran", gpuNode(pending(), label(preflight.ValueFailed)), mode{}, pass, nil, "already failed"},
		{"periodic: node failed meanwhile", gpuNode(label(preflight.ValueFailed)), mode{periodic: true}, pass, nil, "periodic checks run only"},
		{"periodic pass after a periodic failure", gpuNode(label(preflight.ValueFailed), annotation(preflight.PassedAtAnnotation, "2025-12-31T00:00:00Z"),
			annotation(preflight.DefaultFailureAnnotation, "check dns: exit status 1")), mode{periodic: true}, pass,
			gpuNode(label(preflight.ValuePassed), annotation(preflight.PassedAtAnnotation, t0.Format(time.RFC3339))), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := tc.node.DeepCopy()
			changed, skipped := applyResult(node, n, tc.mode, tc.res, 2048, t0)
			want := tc.want
			if want == nil {
				want = tc.node
			}
			if changed != (tc.want != nil) || !strings.Contains(skipped, tc.skipped) || (tc.skipped == "" && skipped != "") {
				t.Fatalf("applyResult = %v, %q; want changed %v, skipped containing %q", changed, skipped, tc.want != nil, tc.skipped)
			}
			if !equality.Semantic.DeepEqual(node, want) {
				t.Fatalf("node:\n got %s\nwant %s", describe(node), describe(want))
			}
		})
	}
}

func TestParseTaint(t *testing.T) {
	tests := []struct {
		in   string
		want corev1.Taint
		err  string
	}{
		{defaultTaint(), corev1.Taint{Key: preflight.DefaultTaintKey, Value: preflight.DefaultTaintValue, Effect: corev1.TaintEffectNoSchedule}, ""},
		{"example.com/gate:NoExecute", corev1.Taint{Key: "example.com/gate", Effect: corev1.TaintEffectNoExecute}, ""},
		{"example.com/gate=pending", corev1.Taint{}, `--taint: want key=value:Effect, got "example.com/gate=pending"`},
		{"example.com/gate=pending:Sometimes", corev1.Taint{}, `effect "Sometimes"`},
		{"bad key!=pending:NoSchedule", corev1.Taint{}, `--taint: key "bad key!"`},
		{"example.com/gate=not a value:NoSchedule", corev1.Taint{}, `--taint: value "not a value"`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseTaint(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseTaint = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// describe prints what the agent may change: taints, labels, annotations
// (fmt sorts map keys).
func describe(n *corev1.Node) string {
	var taints []string
	for _, t := range n.Spec.Taints {
		taints = append(taints, t.ToString())
	}
	return fmt.Sprintf("taints=%v labels=%v annotations=%v", taints, n.Labels, n.Annotations)
}
