package charts

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestTenantTemplatesPolicy: admissionPolicies.tenantTemplates renders the
// policy <fullname>-tenant-templates and its binding only when enabled, with
// the annotations and the namespace selector its values name, never on
// kube-system or the release namespace. e2e
// TestSecurityTenantTemplatesHeldToNamespaceRules proves it on the API server.
func TestTenantTemplatesPolicy(t *testing.T) {
	const name = "vmss-autoscaler-tenant-templates"
	for _, tc := range []struct {
		name, values, ns string
		// off: neither policy nor binding.
		off bool
		// the annotations the policy reads.
		tolerations, selector string
		// the binding's namespace selector (nil: no matchResources).
		selectorOf *metav1.LabelSelector
		// the namespaces the policy never holds.
		excluded []string
	}{
		{name: "off by default", ns: "kube-system", off: true},
		{name: "off when disabled", values: "admissionPolicies: {tenantTemplates: {enabled: false, namespaceSelector: {matchLabels: {tenant: \"true\"}}}}",
			ns: "kube-system", off: true},
		{name: "on, the default annotations, every namespace", values: "admissionPolicies: {tenantTemplates: {enabled: true}}", ns: "kube-system",
			tolerations: "vmss-autoscaler.io/allowed-toleration-keys", selector: "scheduler.alpha.kubernetes.io/node-selector",
			excluded: []string{"kube-system"}},
		{name: "on, named annotations and a selector, another release namespace", ns: "autoscaling",
			values: `admissionPolicies:
  tenantTemplates:
    enabled: true
    namespaceSelector:
      matchLabels: {example.com/tenant: "true"}
      matchExpressions: [{key: example.com/tier, operator: NotIn, values: [system]}]
    tolerationKeysAnnotation: example.com/tolerable
    nodeSelectorAnnotation: example.com/node-selector`,
			tolerations: "example.com/tolerable", selector: "example.com/node-selector",
			selectorOf: &metav1.LabelSelector{MatchLabels: map[string]string{"example.com/tenant": "true"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "example.com/tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"system"}}}},
			excluded: []string{"kube-system", "autoscaling"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Render(filepath.Join(".", chartDir), parseValues(t, tc.values), release, tc.ns)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			var policy *admissionregistrationv1.ValidatingAdmissionPolicy
			var binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
			var policyRaw string
			for _, o := range objs {
				if o.GetName() != name {
					continue
				}
				switch o.GetKind() {
				case "ValidatingAdmissionPolicy":
					policy = convert[admissionregistrationv1.ValidatingAdmissionPolicy](t, o)
					for _, v := range policy.Spec.Variables {
						policyRaw += v.Expression + "\n"
					}
					for _, v := range policy.Spec.Validations {
						policyRaw += v.Expression + "\n" + v.MessageExpression + "\n"
					}
				case "ValidatingAdmissionPolicyBinding":
					binding = convert[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, o)
				}
			}
			if tc.off {
				if policy != nil || binding != nil {
					t.Fatalf("rendered the policy (%v) or its binding (%v) with tenantTemplates off", policy != nil, binding != nil)
				}
				return
			}
			if policy == nil || binding == nil {
				t.Fatalf("policy rendered %v, binding rendered %v: want both", policy != nil, binding != nil)
			}
			if policy.Spec.FailurePolicy == nil || *policy.Spec.FailurePolicy != admissionregistrationv1.Fail || len(policy.Spec.Validations) != 3 {
				t.Errorf("policy: failurePolicy %v, %d validations", policy.Spec.FailurePolicy, len(policy.Spec.Validations))
			}
			// The kinds a CapacityBuffer's scalableRef may name, and the
			// PodTemplates of buffers and ProvisioningRequests.
			got := map[string][]string{}
			for _, r := range policy.Spec.MatchConstraints.ResourceRules {
				if !slices.Equal(r.Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}) ||
					!slices.Equal(r.APIVersions, []string{"v1"}) || len(r.APIGroups) != 1 {
					t.Errorf("rule %+v: want CREATE and UPDATE of v1 in one group", r.Rule)
					continue
				}
				got[r.APIGroups[0]] = append(got[r.APIGroups[0]], r.Resources...)
			}
			if want := map[string][]string{"": {"podtemplates"}, "apps": {"deployments", "statefulsets", "replicasets"}, "batch": {"jobs"}}; !reflect.DeepEqual(got, want) {
				t.Errorf("resources %v, want %v", got, want)
			}
			ns := policy.Spec.MatchConstraints.NamespaceSelector
			if want := (&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name",
				Operator: metav1.LabelSelectorOpNotIn, Values: tc.excluded}}}); !reflect.DeepEqual(ns, want) {
				t.Errorf("policy namespaceSelector %+v, want %+v", ns, want)
			}
			for _, s := range []string{`"` + tc.tolerations + `" in variables.annotations`, `"` + tc.selector + `" in variables.annotations`,
				"namespaceObject.metadata.annotations", "'*' in variables.allowedKeys", "spec.template.spec", "'template.spec'"} {
				if !strings.Contains(policyRaw, s) {
					t.Errorf("policy does not name %s:\n%s", s, policyRaw)
				}
			}
			for _, other := range []string{"vmss-autoscaler.io/allowed-toleration-keys", "scheduler.alpha.kubernetes.io/node-selector"} {
				if other != tc.tolerations && other != tc.selector && strings.Contains(policyRaw, other) {
					t.Errorf("policy names %s, not a value of this release", other)
				}
			}
			if binding.Spec.PolicyName != name || !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
				t.Errorf("binding: policy %q, actions %v", binding.Spec.PolicyName, binding.Spec.ValidationActions)
			}
			var bound *metav1.LabelSelector
			if binding.Spec.MatchResources != nil {
				bound = binding.Spec.MatchResources.NamespaceSelector
			}
			if !reflect.DeepEqual(bound, tc.selectorOf) {
				t.Errorf("binding namespaceSelector %+v, want %+v", bound, tc.selectorOf)
			}
		})
	}
}

// TestTenantTemplatesRejectsBadValues: an annotation that is not a key,
// and the policy without the chart's admission policies.
func TestTenantTemplatesRejectsBadValues(t *testing.T) {
	for _, tc := range []struct{ name, values, want string }{
		{"toleration annotation not a key", `admissionPolicies: {tenantTemplates: {enabled: true, tolerationKeysAnnotation: "allowed keys"}}`, "tolerationKeysAnnotation"},
		{"node-selector annotation empty", `admissionPolicies: {tenantTemplates: {enabled: true, nodeSelectorAnnotation: ""}}`, "nodeSelectorAnnotation"},
		{"selector misspelt", `admissionPolicies: {tenantTemplates: {enabled: true, namespaceSelector: {matchLabel: {a: b}}}}`, "matchLabel"},
		{"unknown key", `admissionPolicies: {tenantTemplates: {enabled: true, allowedKeys: [a]}}`, "allowedKeys"},
		{"without the admission policies", "admissionPolicies: {enabled: false, tenantTemplates: {enabled: true}}\npreflight: {enabled: false}",
			"admissionPolicies.tenantTemplates.enabled needs admissionPolicies.enabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(filepath.Join(".", chartDir), parseValues(t, tc.values), release, namespace)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render error = %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// convert decodes a rendered object into T, refusing unknown fields.
func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return out
}
