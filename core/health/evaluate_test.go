package health

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// withAllocatable is a node advertising the given resources ("nvidia.com/gpu": "8"),
// its capacity the same.
func withAllocatable(res map[string]string) *apiv1.Node {
	n := &apiv1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: apiv1.NodeStatus{Allocatable: apiv1.ResourceList{}}}
	for k, v := range res {
		n.Status.Allocatable[apiv1.ResourceName(k)] = resource.MustParse(v)
	}
	n.Status.Capacity = n.Status.Allocatable.DeepCopy()
	return n
}

func TestShortfall(t *testing.T) {
	h100 := withAllocatable(map[string]string{"cpu": "96", "memory": "1800Gi", "nvidia.com/gpu": "8", "rdma/ib": "8",
		"ephemeral-storage": "1Ti", "pods": "110", "hugepages-2Mi": "1Gi", "example.kubernetes.io/thing": "1"})
	for _, tc := range []struct {
		name     string
		node     map[string]string
		template *apiv1.Node
		memTol   float64
		want     []apiv1.ResourceName
	}{
		{"whole", map[string]string{"cpu": "96", "memory": "1800Gi", "nvidia.com/gpu": "8", "rdma/ib": "8"}, h100, 0.1, nil},
		{"7 of 8 GPUs", map[string]string{"memory": "1800Gi", "nvidia.com/gpu": "7", "rdma/ib": "8"}, h100, 0.1, []apiv1.ResourceName{"nvidia.com/gpu"}},
		{"GPU absent", map[string]string{"memory": "1800Gi", "rdma/ib": "8"}, h100, 0.1, []apiv1.ResourceName{"nvidia.com/gpu"}},
		{"0 GPUs", map[string]string{"memory": "1800Gi", "nvidia.com/gpu": "0", "rdma/ib": "8"}, h100, 0.1, []apiv1.ResourceName{"nvidia.com/gpu"}},
		{"more GPUs than the VM size", map[string]string{"memory": "1800Gi", "nvidia.com/gpu": "9", "rdma/ib": "8"}, h100, 0.1, nil},
		{"memory within tolerance", map[string]string{"memory": "1700Gi", "nvidia.com/gpu": "8", "rdma/ib": "8"}, h100, 0.1, nil},
		{"memory at the tolerance", map[string]string{"memory": "1620Gi", "nvidia.com/gpu": "8", "rdma/ib": "8"}, h100, 0.1, nil},
		{"memory beyond tolerance", map[string]string{"memory": "1619Gi", "nvidia.com/gpu": "8", "rdma/ib": "8"}, h100, 0.1, []apiv1.ResourceName{"memory"}},
		{"memory a byte short, no tolerance", map[string]string{"memory": "1932735283199", "nvidia.com/gpu": "8", "rdma/ib": "8"}, h100, 0, []apiv1.ResourceName{"memory"}},
		{"negative tolerance counts as 0", map[string]string{"memory": "1799Gi", "nvidia.com/gpu": "8", "rdma/ib": "8"}, h100, -1, []apiv1.ResourceName{"memory"}},
		{"cpu, pods, storage, hugepages and kubernetes.io names are not compared", map[string]string{"cpu": "2", "memory": "1800Gi", "nvidia.com/gpu": "8", "rdma/ib": "8"}, h100, 0.1, nil},
		{"several, sorted", map[string]string{"memory": "900Gi", "nvidia.com/gpu": "7", "rdma/ib": "4"}, h100, 0.1,
			[]apiv1.ResourceName{"memory", "nvidia.com/gpu", "rdma/ib"}},
		{"nothing advertised yet", map[string]string{}, h100, 0.1, []apiv1.ResourceName{"memory", "nvidia.com/gpu", "rdma/ib"}},
		{"template nil", map[string]string{"nvidia.com/gpu": "1"}, nil, 0.1, nil},
		{"template with 0 GPUs", map[string]string{"memory": "16Gi"}, withAllocatable(map[string]string{"memory": "16Gi", "nvidia.com/gpu": "0"}), 0.1, nil},
		{"template without memory", map[string]string{}, withAllocatable(map[string]string{"cpu": "4"}), 0.1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Shortfall(withAllocatable(tc.node), tc.template, tc.memTol)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Shortfall = %v, want %v", got, tc.want)
			}
		})
	}
	// A small node's kubelet reserves more than the VM-size template
	// assumed (250 pods, not 110): its allocatable memory is 13% short, its
	// RAM whole. Not degraded.
	small := withAllocatable(map[string]string{"memory": "16Gi"})
	small.Status.Allocatable[apiv1.ResourceMemory] = resource.MustParse("13900Mi")
	if got := Shortfall(small, withAllocatable(map[string]string{"memory": "16Gi"}), 0.1); got != nil {
		t.Errorf("Shortfall of a whole node whose kubelet reserves more = %v, want none (memory is compared by capacity)", got)
	}
	if got := Shortfall(nil, h100, 0.1); got != nil {
		t.Errorf("Shortfall(nil node) = %v", got)
	}
}

func TestIsExtended(t *testing.T) {
	for name, want := range map[apiv1.ResourceName]bool{
		"nvidia.com/gpu": true, "rdma/ib": true, "example.com/fpga": true,
		"cpu": false, "memory": false, "hugepages-2Mi": false, "kubernetes.io/foo": false, "example.kubernetes.io/x": false,
		"requests.nvidia.com/gpu": false, "nvidia.com/": false, "/gpu": false, "nvidia.com/g pu": false,
	} {
		if got := isExtended(name); got != want {
			t.Errorf("isExtended(%q) = %v, want %v", name, got, want)
		}
	}
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func mustParse(t *testing.T, y string) *Policy {
	t.Helper()
	p, err := Parse(y)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

func TestEvaluate(t *testing.T) {
	p := mustParse(t, `
rules:
- name: xid-error
  condition: {type: XIDErrors, status: "True"}
  for: 2m
  action: replace
- name: not-ready
  condition: {type: NetworkUnavailable, status: "True"}
  for: 10m
  action: cordon
- name: bad
  taint: {key: example.com/bad, value: x}
  action: drain
- name: any-bad
  taint: {key: example.com/bad, effect: NoExecute}
  action: report
- name: gpus-below-sku
  belowSKU: {resource: nvidia.com/gpu}
  for: 5m
  action: replace
- name: memory-below-sku
  belowSKU: {resource: memory}
  action: report
`)
	added := metav1.NewTime(t0.Add(-time.Minute))
	node := &apiv1.Node{
		Spec: apiv1.NodeSpec{Taints: []apiv1.Taint{
			{Key: "example.com/other", Effect: apiv1.TaintEffectNoSchedule},
			{Key: "example.com/bad", Value: "y", Effect: apiv1.TaintEffectNoSchedule},
			{Key: "example.com/bad", Value: "x", Effect: apiv1.TaintEffectNoSchedule, TimeAdded: &added},
		}},
		Status: apiv1.NodeStatus{Conditions: []apiv1.NodeCondition{
			{Type: apiv1.NodeReady, Status: apiv1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))},
			{Type: "XIDErrors", Status: apiv1.ConditionTrue, Reason: "XID79", Message: "GPU has fallen off the bus",
				LastTransitionTime: metav1.NewTime(t0.Add(-30 * time.Second))},
		}},
	}
	got := p.Evaluate(node, []apiv1.ResourceName{"nvidia.com/gpu"})
	want := []Match{
		{Rule: &p.Rules[0], Since: t0.Add(-30 * time.Second), Detail: `condition XIDErrors=True (reason XID79: "GPU has fallen off the bus")`},
		{Rule: &p.Rules[2], Since: t0.Add(-time.Minute), Detail: "taint example.com/bad=x:NoSchedule"},
		{Rule: &p.Rules[4], Detail: "nvidia.com/gpu below the VM size"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Evaluate =\n%+v\nwant\n%+v", got, want)
	}
	for i := range got {
		if got[i].Rule != want[i].Rule {
			t.Errorf("match %d points at a copy of its rule, not the policy's", i)
		}
	}

	// A taint without timeAdded, matched by key and effect; the condition
	// gone; a long message shortened; no shortfall.
	node.Spec.Taints = []apiv1.Taint{{Key: "example.com/bad", Value: "z", Effect: apiv1.TaintEffectNoExecute}}
	node.Status.Conditions = []apiv1.NodeCondition{{Type: "XIDErrors", Status: apiv1.ConditionFalse}}
	if got := p.Evaluate(node, nil); len(got) != 1 || got[0].Rule.Name != "any-bad" || !got[0].Since.IsZero() ||
		got[0].Detail != "taint example.com/bad=z:NoExecute" {
		t.Fatalf("Evaluate = %+v, want any-bad without a Since", got)
	}
	node.Spec.Taints = nil
	node.Status.Conditions = []apiv1.NodeCondition{{Type: "XIDErrors", Status: apiv1.ConditionTrue, Message: strings.Repeat("é", 300)}}
	got = p.Evaluate(node, []apiv1.ResourceName{"memory"})
	if len(got) != 2 || got[0].Rule.Name != "xid-error" || got[1].Rule.Name != "memory-below-sku" {
		t.Fatalf("Evaluate = %+v", got)
	}
	if d := got[0].Detail; !strings.HasPrefix(d, `condition XIDErrors=True ("éé`) || !strings.HasSuffix(d, `…")`) || len([]rune(d)) > 250 {
		t.Errorf("Detail %q: want the message shortened", d)
	}
	if !got[0].Since.IsZero() {
		t.Errorf("Since %v for a condition without lastTransitionTime", got[0].Since)
	}
	node.Status.Conditions[0].Message = ""
	node.Status.Conditions[0].Reason = "XID48"
	if d := p.Evaluate(node, nil)[0].Detail; d != "condition XIDErrors=True (reason XID48)" {
		t.Errorf("Detail %q", d)
	}
	if got := p.Evaluate(&apiv1.Node{}, nil); got != nil {
		t.Errorf("a healthy node matches %+v", got)
	}
	var none *Policy
	if got := none.Evaluate(node, nil); got != nil {
		t.Errorf("a nil policy matches %+v", got)
	}
}

func TestJudge(t *testing.T) {
	p := mustParse(t, `
rules:
- name: report-now
  taint: {key: example.com/report}
  action: report
- name: cordon-later
  taint: {key: example.com/cordon}
  for: 10m
  action: cordon
- name: drain-soon
  condition: {type: DrainMe, status: "True"}
  for: 1m
  action: drain
  cordonFirst: false
- name: xid-error
  condition: {type: XIDErrors, status: "True"}
  for: 2m
  action: replace
- name: gpus-below-sku
  belowSKU: {resource: nvidia.com/gpu}
  for: 5m
  action: replace
- name: also-drain
  taint: {key: example.com/drain}
  action: drain
`)
	rule := func(name string) *Rule {
		for i := range p.Rules {
			if p.Rules[i].Name == name {
				return &p.Rules[i]
			}
		}
		t.Fatalf("no rule %s", name)
		return nil
	}
	m := func(name string, ago time.Duration) Match {
		mm := Match{Rule: rule(name)}
		if ago != 0 {
			mm.Since = t0.Add(-ago)
		}
		return mm
	}
	seen := func(ago time.Duration) func(string) time.Time {
		return func(string) time.Time { return t0.Add(-ago) }
	}
	never := func(string) time.Time { return time.Time{} }
	for _, tc := range []struct {
		name      string
		matches   []Match
		firstSeen func(string) time.Time
		want      Verdict // Matches filled in
	}{
		{"no match", nil, never, Verdict{}},
		{"replace not yet due: report, cordon first", []Match{m("xid-error", time.Minute)}, never,
			Verdict{Action: Report, Rule: "xid-error", Cordon: true, Next: time.Minute}},
		{"replace due", []Match{m("xid-error", 3*time.Minute)}, never,
			Verdict{Action: Replace, Rule: "xid-error", Cordon: true, Due: true}},
		{"replace due to the second", []Match{m("xid-error", 2*time.Minute)}, never,
			Verdict{Action: Replace, Rule: "xid-error", Cordon: true, Due: true}},
		{"drain without cordonFirst, not due: nothing to cordon", []Match{m("drain-soon", 30*time.Second)}, never,
			Verdict{Action: Report, Rule: "drain-soon", Next: 30 * time.Second}},
		{"drain without cordonFirst, due", []Match{m("drain-soon", time.Minute)}, never,
			Verdict{Action: Drain, Rule: "drain-soon", Cordon: true, Due: true}},
		{"two rules: the strongest due wins", []Match{m("drain-soon", 5*time.Minute), m("xid-error", 5*time.Minute)}, never,
			Verdict{Action: Replace, Rule: "xid-error", Cordon: true, Due: true}},
		{"two rules: a weaker one due, the stronger pending", []Match{m("drain-soon", 5*time.Minute), m("xid-error", 90*time.Second)}, never,
			Verdict{Action: Drain, Rule: "drain-soon", Cordon: true, Due: true, Next: 30 * time.Second}},
		{"equal actions: the first in the policy", []Match{m("xid-error", 5*time.Minute), m("gpus-below-sku", 6*time.Minute)}, never,
			Verdict{Action: Replace, Rule: "xid-error", Cordon: true, Due: true}},
		{"a report due now, a replace pending", []Match{m("report-now", 0), m("xid-error", 0)}, never,
			Verdict{Action: Report, Rule: "report-now", Cordon: true, Due: true, Next: 2 * time.Minute}},
		{"weaker pending rules do not set Next", []Match{m("report-now", 0), m("cordon-later", 0), m("also-drain", 0)}, never,
			Verdict{Action: Drain, Rule: "also-drain", Cordon: true, Due: true}},
		{"none due: the strongest pending names the rule and sets Next (not the sooner weaker one)", []Match{m("cordon-later", 9*time.Minute), m("xid-error", 0)}, never,
			Verdict{Action: Report, Rule: "xid-error", Cordon: true, Next: 2 * time.Minute}},
		{"cordon due", []Match{m("cordon-later", 10*time.Minute)}, never,
			Verdict{Action: Cordon, Rule: "cordon-later", Cordon: true, Due: true}},
		{"cordon pending: no cordon yet", []Match{m("cordon-later", time.Minute)}, never,
			Verdict{Action: Report, Rule: "cordon-later", Next: 9 * time.Minute}},
		{"zero Since: from firstSeen, due", []Match{m("gpus-below-sku", 0)}, seen(6 * time.Minute),
			Verdict{Action: Replace, Rule: "gpus-below-sku", Cordon: true, Due: true}},
		{"zero Since: from firstSeen, pending", []Match{m("gpus-below-sku", 0)}, seen(4 * time.Minute),
			Verdict{Action: Report, Rule: "gpus-below-sku", Cordon: true, Next: time.Minute}},
		{"zero Since, never seen: from now", []Match{m("gpus-below-sku", 0)}, never,
			Verdict{Action: Report, Rule: "gpus-below-sku", Cordon: true, Next: 5 * time.Minute}},
		{"zero Since, no firstSeen: from now", []Match{m("gpus-below-sku", 0)}, nil,
			Verdict{Action: Report, Rule: "gpus-below-sku", Cordon: true, Next: 5 * time.Minute}},
		{"a Since wins over firstSeen", []Match{m("xid-error", 30*time.Second)}, seen(time.Hour),
			Verdict{Action: Report, Rule: "xid-error", Cordon: true, Next: 90 * time.Second}},
		{"a Since in the future counts as now", []Match{m("xid-error", -time.Hour)}, never,
			Verdict{Action: Report, Rule: "xid-error", Cordon: true, Next: 2 * time.Minute}},
		{"for 0 is due even from the future", []Match{m("also-drain", -time.Hour)}, never,
			Verdict{Action: Drain, Rule: "also-drain", Cordon: true, Due: true}},
		{"a match without a rule is ignored", []Match{{Detail: "stray"}}, never, Verdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			want.Matches = tc.matches
			got := p.Judge(tc.matches, t0, tc.firstSeen)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Judge =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// TestJudgeTaintTimeAdded: a taint's timeAdded counts, end to end.
func TestJudgeTaintTimeAdded(t *testing.T) {
	p := mustParse(t, "rules:\n- {name: nvsentinel, taint: {key: nvidia.com/gpu-error, effect: NoSchedule}, for: 5m, action: replace}\n")
	for _, tc := range []struct {
		added time.Duration
		want  Action
		due   bool
	}{
		{time.Minute, Report, false},
		{6 * time.Minute, Replace, true},
	} {
		at := metav1.NewTime(t0.Add(-tc.added))
		node := &apiv1.Node{Spec: apiv1.NodeSpec{Taints: []apiv1.Taint{{Key: "nvidia.com/gpu-error", Value: "xid", Effect: apiv1.TaintEffectNoSchedule, TimeAdded: &at}}}}
		v := p.Judge(p.Evaluate(node, nil), t0, func(string) time.Time { t.Fatal("firstSeen asked with a timeAdded"); return time.Time{} })
		if v.Action != tc.want || v.Due != tc.due || !v.Cordon || v.Rule != "nvsentinel" {
			t.Errorf("taint added %s ago: %+v, want %s due %v", tc.added, v, tc.want, tc.due)
		}
	}
}

// TestDefaultPolicyEndToEnd: the built-in policy on a node with 7 of its 8
// GPUs and one with an XID.
func TestDefaultPolicyEndToEnd(t *testing.T) {
	p := Default()
	template := withAllocatable(map[string]string{"memory": "1800Gi", "nvidia.com/gpu": "8"})
	degraded := withAllocatable(map[string]string{"memory": "1800Gi", "nvidia.com/gpu": "7"})
	matches := p.Evaluate(degraded, Shortfall(degraded, template, p.MemoryTolerance))
	v := p.Judge(matches, t0, func(rule string) time.Time {
		if rule != "gpus-below-sku" {
			t.Errorf("firstSeen(%q)", rule)
		}
		return t0.Add(-5 * time.Minute)
	})
	if v.Action != Replace || !v.Due || !v.Cordon || v.Rule != "gpus-below-sku" {
		t.Errorf("7 of 8 GPUs for 5m: %+v, want replace", v)
	}
	xid := withAllocatable(map[string]string{"memory": "1800Gi", "nvidia.com/gpu": "8"})
	xid.Status.Conditions = []apiv1.NodeCondition{{Type: "XIDErrors", Status: apiv1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(-time.Minute))}}
	v = p.Judge(p.Evaluate(xid, Shortfall(xid, template, p.MemoryTolerance)), t0, nil)
	if v.Action != Report || v.Due || !v.Cordon || v.Rule != "xid-error" || v.Next != time.Minute {
		t.Errorf("XIDErrors for 1m: %+v, want cordon first, replace in 1m", v)
	}
}

// TestUnjudged: a GPU shortfall explained by the node's other resources
// of the same domain (MIG, renamed time-slicing) or by no such resource at
// all (DRA) cannot be judged; a GPU the plugin marked unhealthy can.
func TestUnjudged(t *testing.T) {
	node := func(alloc apiv1.ResourceList) *apiv1.Node {
		return &apiv1.Node{Status: apiv1.NodeStatus{Allocatable: alloc}}
	}
	for _, tc := range []struct {
		name  string
		alloc apiv1.ResourceList
		want  string // a substring; "" means judged
	}{
		{"7 of 8 GPUs: judged", apiv1.ResourceList{"nvidia.com/gpu": resource.MustParse("7")}, ""},
		{"MIG, mixed strategy", apiv1.ResourceList{"nvidia.com/gpu": resource.MustParse("0"), "nvidia.com/mig-1g.10gb": resource.MustParse("56")}, "advertised as nvidia.com/mig-1g.10gb"},
		{"time-slicing renamed", apiv1.ResourceList{"nvidia.com/gpu.shared": resource.MustParse("32")}, "advertised as nvidia.com/gpu.shared"},
		{"DRA: none advertised", apiv1.ResourceList{"cpu": resource.MustParse("96")}, "no nvidia.com/gpu advertised"},
		{"another domain does not explain it", apiv1.ResourceList{"nvidia.com/gpu": resource.MustParse("6"), "rdma/ib": resource.MustParse("8")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Unjudged(node(tc.alloc), "nvidia.com/gpu")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("Unjudged = %q, want %q", got, tc.want)
			}
		})
	}
	if got := Unjudged(node(nil), apiv1.ResourceMemory); got != "" {
		t.Fatalf("memory unjudged: %q", got)
	}
}
