package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
)

// TestSecurityTenantTemplatesHeldToNamespaceRules (#40): CapacityBuffers
// and ProvisioningRequests make the autoscaler buy nodes for templates no
// pod admission ever sees. With admissionPolicies.tenantTemplates the
// chart's policy holds PodTemplates and workload templates, in the
// namespaces of its selector, to the namespace's annotations: a tenant
// allowed the "team-b/gpu" and "nvidia.com/gpu" taints and the node
// selector team=b gets a template that keeps to them, and is refused one
// tolerating team A's taint (on a PodTemplate, a 0-replica Deployment, a
// suspended Job), every taint (an empty key), or without or against its
// node selector, even as a cluster administrator. A namespace outside the
// selector, kube-system and the release namespace are not held; "*" allows
// every toleration; a malformed node selector admits nothing; an update
// that leaves a template's tolerations and nodeSelector as they were is
// admitted after its namespace's rules changed.
func TestSecurityTenantTemplatesHeldToNamespaceRules(t *testing.T) {
	t.Parallel()
	const (
		label       = "e2e.vmss-autoscaler.io/tenant-templates"
		keysAnn     = "vmss-autoscaler.io/allowed-toleration-keys"
		selectorAnn = "scheduler.alpha.kubernetes.io/node-selector"
		tenantKeys  = "team-b/gpu, nvidia.com/gpu"
		keysMsg     = `is not in the namespace's ` + keysAnn + ` ("` + tenantKeys + `")`
		selectorMsg = `: the namespace's ` + selectorAnn + ` ("team=b") requires team=b`
	)
	ps := newPoliciesScenarioWith(t, "e2e-sec-tenant", func(sc *scenario, values map[string]any) {
		// Only this test's namespaces: the API server is shared by the
		// tests running in parallel, whose templates tolerate taints.
		values["admissionPolicies"].(map[string]any)["tenantTemplates"] = map[string]any{
			"enabled":           true,
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{label: sc.prefix}},
		}
	})
	ps.typeChecked("tenant-templates")
	ctx, admin := ps.ctx, ps.s.cp.Client
	nss := admin.CoreV1().Namespaces()

	// kube-system and the release namespace carry the selector's label
	// first: the API server's namespace cache, fed by one watch, has their
	// labels before it has any namespace created below.
	for _, ns := range []string{"kube-system", ps.ns} {
		_, err := nss.Patch(ctx, ns, types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, label, ps.prefix), metav1.PatchOptions{})
		must(t, err)
	}
	t.Cleanup(func() {
		_, _ = nss.Patch(context.Background(), "kube-system", types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, label), metav1.PatchOptions{})
	})
	namespace := func(suffix string, selected bool, annotations map[string]string) string {
		t.Helper()
		ns := &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ps.ns + "-" + suffix, Annotations: annotations}}
		if selected {
			ns.Labels = map[string]string{label: ps.prefix}
		}
		_, err := nss.Create(ctx, ns, metav1.CreateOptions{})
		must(t, err)
		t.Cleanup(func() { _ = nss.Delete(context.Background(), ns.Name, metav1.DeleteOptions{}) })
		return ns.Name
	}
	tenantRules := map[string]string{keysAnn: tenantKeys, selectorAnn: "team=b"}
	other := namespace("other", false, tenantRules)
	anyKey := namespace("any", true, map[string]string{keysAnn: "*"})
	malformed := namespace("bad", true, map[string]string{keysAnn: tenantKeys, selectorAnn: "team"})
	tenant := namespace("tenant", true, tenantRules)

	teamB := apiv1.Toleration{Key: "team-b/gpu", Operator: apiv1.TolerationOpExists, Effect: apiv1.TaintEffectNoSchedule}
	gpu := apiv1.Toleration{Key: "nvidia.com/gpu", Operator: apiv1.TolerationOpExists, Effect: apiv1.TaintEffectNoSchedule}
	teamA := apiv1.Toleration{Key: "team-a/gpu", Operator: apiv1.TolerationOpEqual, Value: "true", Effect: apiv1.TaintEffectNoSchedule}
	every := apiv1.Toleration{Operator: apiv1.TolerationOpExists}
	onB := map[string]string{"team": "b"}
	podSpec := func(tolerations []apiv1.Toleration, selector map[string]string, restart apiv1.RestartPolicy) apiv1.PodTemplateSpec {
		return apiv1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "tenant"}},
			Spec: apiv1.PodSpec{Tolerations: tolerations, NodeSelector: selector, RestartPolicy: restart,
				Containers: []apiv1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
		}
	}
	createTemplate := func(ns, name string, tolerations []apiv1.Toleration, selector map[string]string) error {
		_, err := admin.CoreV1().PodTemplates(ns).Create(ctx, &apiv1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: name},
			Template: podSpec(tolerations, selector, apiv1.RestartPolicyAlways)}, metav1.CreateOptions{})
		return err
	}
	createDeployment := func(ns, name string, tolerations []apiv1.Toleration, selector map[string]string) error {
		_, err := admin.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: appsv1.DeploymentSpec{Replicas: new(int32(0)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "tenant"}},
				Template: podSpec(tolerations, selector, apiv1.RestartPolicyAlways)}}, metav1.CreateOptions{})
		return err
	}
	createJob := func(ns, name string, tolerations []apiv1.Toleration, selector map[string]string) error {
		_, err := admin.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: batchv1.JobSpec{Suspend: new(true), Template: podSpec(tolerations, selector, apiv1.RestartPolicyNever)}}, metav1.CreateOptions{})
		return err
	}

	// The policy is loaded a moment after it is stored: probe with team A's
	// toleration until refused (a probe admitted before is deleted).
	ps.eventually("the tenant template policy in force", 30*time.Second, func() (bool, string) {
		err := createTemplate(tenant, "probe", []apiv1.Toleration{teamA}, onB)
		if err == nil {
			must(t, admin.CoreV1().PodTemplates(tenant).Delete(ctx, "probe", metav1.DeleteOptions{}))
		}
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), keysMsg), fmt.Sprintf("PodTemplate tolerating team-a/gpu: %v", err)
	})

	for _, tc := range []struct {
		name   string
		create func() error
		want   string
	}{
		{"a PodTemplate tolerating team A's taint", func() error {
			return createTemplate(tenant, "team-a", []apiv1.Toleration{teamA}, onB)
		}, `template.spec.tolerations[0].key "team-a/gpu" ` + keysMsg},
		{"a PodTemplate tolerating team A's taint after its own", func() error {
			return createTemplate(tenant, "team-b-and-a", []apiv1.Toleration{teamB, teamA}, onB)
		}, `template.spec.tolerations[1].key "team-a/gpu" ` + keysMsg},
		{"a PodTemplate tolerating every taint", func() error {
			return createTemplate(tenant, "every", []apiv1.Toleration{every}, onB)
		}, `template.spec.tolerations[0].key "" ` + keysMsg + `: an empty key tolerates every taint, which only "*" allows`},
		{"a PodTemplate without the node selector", func() error {
			return createTemplate(tenant, "anywhere", []apiv1.Toleration{teamB}, nil)
		}, `template.spec.nodeSelector has no "team"` + selectorMsg},
		{"a PodTemplate on team A's nodes", func() error {
			return createTemplate(tenant, "on-a", []apiv1.Toleration{teamB}, map[string]string{"team": "a"})
		}, `template.spec.nodeSelector["team"] is "a"` + selectorMsg},
		{"a 0-replica Deployment tolerating team A's taint", func() error {
			return createDeployment(tenant, "team-a", []apiv1.Toleration{teamA}, onB)
		}, `spec.template.spec.tolerations[0].key "team-a/gpu" ` + keysMsg},
		{"a suspended Job without the node selector", func() error {
			return createJob(tenant, "anywhere", []apiv1.Toleration{teamB}, map[string]string{"zone": "1"})
		}, `spec.template.spec.nodeSelector has no "team"` + selectorMsg},
		{"a PodTemplate where the node selector is malformed", func() error {
			return createTemplate(malformed, "good", []apiv1.Toleration{teamB}, onB)
		}, `the namespace's ` + selectorAnn + ` ("team") is not of the form k1=v1,k2=v2`},
	} {
		t.Run(tc.name, func(t *testing.T) { wantRefused(t, tc.name, tc.create(), tc.want) })
	}

	// What keeps to the rules, and where the policy does not hold.
	good := []apiv1.Toleration{teamB, gpu}
	for _, tc := range []struct {
		name   string
		create func() error
	}{
		{"a PodTemplate keeping to its namespace's rules", func() error { return createTemplate(tenant, "team-b", good, onB) }},
		{"a 0-replica Deployment keeping to them", func() error {
			return createDeployment(tenant, "team-b", good, map[string]string{"team": "b", "zone": "1"})
		}},
		{"a suspended Job keeping to them", func() error { return createJob(tenant, "team-b", good, onB) }},
		{`every taint tolerated where "*" is allowed`, func() error { return createTemplate(anyKey, "every", []apiv1.Toleration{every, teamA}, nil) }},
		{"team A's taint outside the selector", func() error { return createTemplate(other, "team-a", []apiv1.Toleration{teamA}, nil) }},
		{"team A's taint in the release namespace", func() error { return createTemplate(ps.ns, "team-a", []apiv1.Toleration{teamA}, nil) }},
		{"team A's taint in kube-system", func() error {
			name := ps.prefix + "-team-a"
			t.Cleanup(func() {
				_ = admin.CoreV1().PodTemplates("kube-system").Delete(context.Background(), name, metav1.DeleteOptions{})
			})
			return createTemplate("kube-system", name, []apiv1.Toleration{teamA}, nil)
		}},
	} {
		if err := tc.create(); err != nil {
			t.Errorf("%s: %v, want admitted", tc.name, err)
			continue
		}
		t.Logf("admitted: %s", tc.name)
	}

	// Updates: a toleration added is refused; after the namespace's rules
	// change, an update leaving the tolerations and nodeSelector as they
	// were is admitted (the garbage collector, controllers and labels go
	// on), a changed one is held to the new rules.
	updateTemplate := func(name string, change func(*apiv1.PodTemplate)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pt, err := admin.CoreV1().PodTemplates(tenant).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(pt)
			_, err = admin.CoreV1().PodTemplates(tenant).Update(ctx, pt, metav1.UpdateOptions{})
			return err
		})
	}
	wantRefused(t, "team A's toleration added to a PodTemplate", updateTemplate("team-b", func(pt *apiv1.PodTemplate) {
		pt.Template.Spec.Tolerations = append(pt.Template.Spec.Tolerations, teamA)
	}), `template.spec.tolerations[2].key "team-a/gpu" `+keysMsg)
	_, err := nss.Patch(ctx, tenant, types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"team-c/gpu"}}}`, keysAnn), metav1.PatchOptions{})
	must(t, err)
	const narrowed = `template.spec.tolerations[0].key "team-b/gpu" is not in the namespace's ` + keysAnn + ` ("team-c/gpu")`
	ps.eventually("the tenant namespace's new toleration keys in force", 30*time.Second, func() (bool, string) {
		err := createTemplate(tenant, "probe-b", good, onB)
		if err == nil {
			must(t, admin.CoreV1().PodTemplates(tenant).Delete(ctx, "probe-b", metav1.DeleteOptions{}))
		}
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), narrowed), fmt.Sprintf("PodTemplate tolerating team-b/gpu: %v", err)
	})
	if err := updateTemplate("team-b", func(pt *apiv1.PodTemplate) { pt.Labels = map[string]string{"relabelled": "true"} }); err != nil {
		t.Errorf("an update leaving the template's tolerations and nodeSelector: %v, want admitted", err)
	}
	wantRefused(t, "an update changing the tolerations under the new rules", updateTemplate("team-b", func(pt *apiv1.PodTemplate) {
		pt.Template.Spec.Tolerations = pt.Template.Spec.Tolerations[:1]
	}), narrowed)
}
