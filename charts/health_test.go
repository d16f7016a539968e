package charts

import (
	"reflect"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/health"
)

const (
	healthConfigMap = "vmss-autoscaler-health-policy"
	pausedKey       = "vmss-autoscaler.io/health-paused"
)

// TestHealthPolicyConfigMap: the chart ships the binary's built-in policy,
// byte for byte, in the ConfigMap --health-policy-configmap names, in the
// release namespace, and the autoscaler may read it; health.paused sets
// the pause annotation.
func TestHealthPolicyConfigMap(t *testing.T) {
	for _, tc := range []struct {
		name, values, cmName string
		paused               bool
	}{
		{"defaults", "", healthConfigMap, false},
		{"every switch", fullValues, healthConfigMap, false},
		{"paused", "health: {paused: true}", healthConfigMap, true},
		{"renamed", "config: {health-policy-configmap: gpu-health}", "gpu-health", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, parseValues(t, tc.values))
			o := r.get(t, "ConfigMap", tc.cmName)
			cm := decode[*corev1.ConfigMap](t, o)
			if cm.Namespace != namespace {
				t.Errorf("ConfigMap in %q, want the release namespace %s (--namespace)", cm.Namespace, namespace)
			}
			if got := cm.Data["policy"]; got != health.DefaultYAML {
				t.Errorf("policy is not health.DefaultYAML:\n%s\nwant:\n%s", got, health.DefaultYAML)
			}
			if len(cm.Data) != 1 {
				t.Errorf("keys %v, want policy only", cm.Data)
			}
			p, err := health.Parse(cm.Data["policy"])
			if err != nil {
				t.Fatalf("the chart's policy does not parse: %v", err)
			}
			if !reflect.DeepEqual(p, health.Default()) {
				t.Errorf("the chart's policy is not the built-in one")
			}
			if v, ok := cm.Annotations[pausedKey]; ok != tc.paused || (tc.paused && v != "true") {
				t.Errorf("annotations %v, want %s=true: %v", cm.Annotations, pausedKey, tc.paused)
			}
			role := decode[*rbacv1.Role](t, r.get(t, "Role", "vmss-autoscaler"))
			for _, verb := range []string{"list", "watch"} {
				if !allows(role.Rules, grant{"", "configmaps", verb, tc.cmName}) {
					t.Errorf("Role does not let the autoscaler %s ConfigMap %s", verb, tc.cmName)
				}
			}
			if allows(role.Rules, grant{"", "configmaps", "update", tc.cmName}) {
				t.Errorf("Role lets the autoscaler update its health policy %s", tc.cmName)
			}
		})
	}
}

// TestHealthPolicyValues: a policy of the values is rendered verbatim (the
// binary parses it), whatever its indentation or quoting, ending in one
// line break.
func TestHealthPolicyValues(t *testing.T) {
	for _, policy := range []string{
		"maxUnhealthy: 2\nrules:\n- name: nvsentinel\n  taint: {key: nvidia.com/gpu-error, effect: NoSchedule}\n  for: 1m\n  action: drain\n",
		"rules: []",
		"  # indented first line\n  rules: []\n",
		"\n\n# after blank lines\nrules: []\n\n\n",
		"rules:\n\n- {name: a, taint: {key: k}, action: cordon}\t# after a tab\n",
		"rules:\n- {name: a, condition: {type: X, status: \"True\"}, action: report}   \n",
	} {
		vals := map[string]any{"health": map[string]any{"policy": policy}}
		r := mustRender(t, vals)
		cm := decode[*corev1.ConfigMap](t, r.get(t, "ConfigMap", healthConfigMap))
		if got, want := cm.Data["policy"], strings.TrimRight(policy, "\n")+"\n"; got != want {
			t.Errorf("policy %q rendered as %q", policy, got)
		}
		if _, err := health.Parse(cm.Data["policy"]); err != nil {
			t.Errorf("policy %q: %v", policy, err)
		}
	}
}

// TestHealthSchema: values.schema.json refuses a bad health block, naming
// the field.
func TestHealthSchema(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct{ name, values, field string }{
		{"empty policy", `health: {policy: ""}`, "policy"},
		{"policy as a map", `health: {policy: {rules: []}}`, "policy"},
		{"paused as a string", `health: {paused: "yes"}`, "paused"},
		{"unknown key", `health: {pause: true}`, "pause"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			coalesced, err := chartutil.CoalesceValues(ch, parseValues(t, tc.values))
			if err != nil {
				t.Fatal(err)
			}
			err = chartutil.ValidateAgainstSchema(ch, coalesced)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("schema error = %v, want one naming %s", err, tc.field)
			}
		})
	}
}
