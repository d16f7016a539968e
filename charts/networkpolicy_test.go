package charts

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestNetworkPolicy: by default the chart ships a NetworkPolicy that
// denies every ingress to the autoscaler's pods but the metrics port from
// the namespaces networkPolicy.metricsNamespaces names (monitoring), the
// ServiceMonitor's Prometheus namespace and networkPolicy.metricsFrom's
// peers; it selects the autoscaler's pods only (not the preflight agent's).
func TestNetworkPolicy(t *testing.T) {
	policy := func(t *testing.T, values string) (*networkingv1.NetworkPolicy, rendered) {
		t.Helper()
		r := mustRender(t, parseValues(t, values))
		checkTyped(t, r)
		return decode[*networkingv1.NetworkPolicy](t, r.get(t, "NetworkPolicy", "vmss-autoscaler")), r
	}
	// from describes a rule's peers: "ns=a,b" for the namespace selector,
	// the rest as they are.
	from := func(peers []networkingv1.NetworkPolicyPeer) []string {
		var out []string
		for _, p := range peers {
			switch {
			case p.NamespaceSelector != nil && p.PodSelector == nil && p.IPBlock == nil && len(p.NamespaceSelector.MatchLabels) == 0 &&
				len(p.NamespaceSelector.MatchExpressions) == 1 && p.NamespaceSelector.MatchExpressions[0].Key == "kubernetes.io/metadata.name" &&
				p.NamespaceSelector.MatchExpressions[0].Operator == metav1.LabelSelectorOpIn:
				out = append(out, "ns="+strings.Join(p.NamespaceSelector.MatchExpressions[0].Values, ","))
			case p.IPBlock != nil && p.NamespaceSelector == nil && p.PodSelector == nil:
				out = append(out, "ip="+p.IPBlock.CIDR)
			default:
				out = append(out, fmt.Sprintf("%+v", p))
			}
		}
		return out
	}
	checkRule := func(t *testing.T, np *networkingv1.NetworkPolicy, port int32, want ...string) {
		t.Helper()
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("policyTypes %v, want [Ingress] (egress unrestricted)", np.Spec.PolicyTypes)
		}
		if len(np.Spec.Ingress) != 1 {
			t.Fatalf("%d ingress rules, want 1: %+v", len(np.Spec.Ingress), np.Spec.Ingress)
		}
		rule := np.Spec.Ingress[0]
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || rule.Ports[0].Port.IntValue() != int(port) ||
			rule.Ports[0].Protocol == nil || *rule.Ports[0].Protocol != "TCP" {
			t.Errorf("ports %+v, want TCP %d only", rule.Ports, port)
		}
		if got := from(rule.From); !slices.Equal(got, want) {
			t.Errorf("from %q, want %q", got, want)
		}
	}

	t.Run("defaults", func(t *testing.T) {
		np, r := policy(t, "")
		checkRule(t, np, 8443, "ns=monitoring")
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || sel.Empty() {
			t.Fatalf("podSelector %+v: %v (an empty one would take every pod of the namespace)", np.Spec.PodSelector, err)
		}
		d := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler"))
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("podSelector %s does not select the autoscaler's pods %v", sel, d.Spec.Template.Labels)
		}
		if c := d.Spec.Template.Spec.Containers[0]; len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8443 {
			t.Errorf("container ports %+v, want the policy's 8443", c.Ports)
		}
		for _, ds := range r.ofKind("DaemonSet") {
			agent := decode[*appsv1.DaemonSet](t, ds)
			if sel.Matches(labels.Set(agent.Spec.Template.Labels)) {
				t.Errorf("podSelector %s selects the preflight agent's pods too", sel)
			}
		}
	})
	t.Run("ServiceMonitor's Prometheus namespace and extra peers", func(t *testing.T) {
		np, _ := policy(t, `
serviceMonitor: {enabled: true, prometheusServiceAccount: {name: prometheus, namespace: observability}}
networkPolicy:
  metricsNamespaces: [monitoring, observability]
  metricsFrom:
    - ipBlock: {cidr: 10.1.0.0/16}`)
		checkRule(t, np, 8443, "ns=monitoring,observability", "ip=10.1.0.0/16")
		np, _ = policy(t, `serviceMonitor: {enabled: true, prometheusServiceAccount: {name: prometheus, namespace: observability}}`)
		checkRule(t, np, 8443, "ns=monitoring,observability")
	})
	t.Run("plain metrics listener", func(t *testing.T) {
		np, _ := policy(t, "metrics: {port: 9090, secure: {enabled: false}}")
		checkRule(t, np, 9090, "ns=monitoring")
	})
	t.Run("no namespace named: nothing in", func(t *testing.T) {
		np, _ := policy(t, "networkPolicy: {metricsNamespaces: []}")
		if np.Spec.Ingress == nil || len(np.Spec.Ingress) != 0 ||
			!slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("ingress %+v, policyTypes %v: want none allowed", np.Spec.Ingress, np.Spec.PolicyTypes)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		if got := mustRender(t, parseValues(t, "networkPolicy: {enabled: false}")).ofKind("NetworkPolicy"); len(got) != 0 {
			t.Errorf("%d NetworkPolicies with networkPolicy.enabled false", len(got))
		}
	})
	t.Run("schema", func(t *testing.T) {
		ch := loadChart(t)
		for _, v := range []string{
			"networkPolicy: {metricsNamespaces: [Monitoring]}",
			"networkPolicy: {metricsNamespaces: monitoring}",
			"networkPolicy: {metricsFrom: [{podSelecter: {}}]}",
			"networkPolicy: {enable: true}",
		} {
			coalesced, err := chartutil.CoalesceValues(ch, parseValues(t, v))
			if err != nil {
				t.Fatal(err)
			}
			if err := chartutil.ValidateAgainstSchema(ch, coalesced); err == nil || !strings.Contains(err.Error(), "networkPolicy") {
				t.Errorf("schema: %s: %v, want an error naming networkPolicy", v, err)
			}
		}
	})
}
