package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apiv1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
)

// securityScenario is the chart applied to the real API server with its
// admission policies, and tokens of its ServiceAccounts.
type securityScenario struct {
	*scenario
	// full is the chart's full name, the prefix of its objects.
	full string
	objs []*unstructured.Unstructured
}

func newSecurityScenario(t *testing.T, release string) *securityScenario {
	return newSecurityScenarioWith(t, release, nil)
}

// newSecurityScenarioWith is newSecurityScenario with extra chart values
// (top-level keys replaced), made from the scenario (its namespace).
func newSecurityScenarioWith(t *testing.T, release string, extra func(*scenario) map[string]any) *securityScenario {
	sc := newScenario(t)
	values := map[string]any{
		"image":        map[string]any{"repository": "example.invalid/vmss-autoscaler"},
		"nodeSelector": map[string]any{"e2e.vmss-autoscaler.io/no-such-node": "true"},
		"config": map[string]any{
			"nodes":             []any{"0:10:" + sc.prefix + "-none"},
			"balloon-namespace": sc.ns + "-balloons",
		},
		// The agent's DaemonSet selects no node here: the test plays its pod.
		"preflight": map[string]any{"enabled": true, "library": map[string]any{"gpus": map[string]any{"enabled": false},
			"ecc": map[string]any{"enabled": false}, "xid": map[string]any{"enabled": false}, "dcgm": map[string]any{"enabled": false}}},
	}
	if extra != nil {
		for k, v := range extra(sc) {
			values[k] = v
		}
	}
	keep := sc.applyChart(values, release)
	t.Cleanup(func() { sc.deleteClusterScoped(keep) })
	ss := &securityScenario{scenario: sc, full: release + "-vmss-autoscaler", objs: keep}
	ss.grantsInForce()
	return ss
}

// grantsInForce waits until the API server's authorizer has every rule of
// every role the chart binds, for every ServiceAccount bound: the RBAC
// authorizer reads roles and bindings from its own caches, so a grant is
// in force a moment after it is stored, and a test that acts at once could
// see a refusal the chart does not make (and take it for the admission
// policy's).
func (ss *securityScenario) grantsInForce() {
	ss.t.Helper()
	admin := ss.s.cp.Client
	var reviews []authzv1.SubjectAccessReview
	add := func(subjects []rbacv1.Subject, bindingNS string, rules []rbacv1.PolicyRule) {
		for _, s := range subjects {
			if s.Kind != rbacv1.ServiceAccountKind {
				continue
			}
			for _, r := range rules {
				if len(r.Verbs) == 0 || len(r.Resources) == 0 || len(r.APIGroups) == 0 {
					continue
				}
				attrs := &authzv1.ResourceAttributes{Namespace: bindingNS, Verb: r.Verbs[0], Group: r.APIGroups[0], Resource: r.Resources[0]}
				if len(r.ResourceNames) > 0 {
					attrs.Name = r.ResourceNames[0]
				}
				attrs.Resource, attrs.Subresource, _ = strings.Cut(attrs.Resource, "/") // pods/eviction
				reviews = append(reviews, authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
					User: "system:serviceaccount:" + s.Namespace + ":" + s.Name, ResourceAttributes: attrs,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + s.Namespace, "system:authenticated"}}})
			}
		}
	}
	for _, o := range ss.objs {
		switch o.GetKind() {
		case "RoleBinding":
			b, err := admin.RbacV1().RoleBindings(o.GetNamespace()).Get(ss.ctx, o.GetName(), metav1.GetOptions{})
			must(ss.t, err)
			var rules []rbacv1.PolicyRule
			if b.RoleRef.Kind == "ClusterRole" {
				r, err := admin.RbacV1().ClusterRoles().Get(ss.ctx, b.RoleRef.Name, metav1.GetOptions{})
				must(ss.t, err)
				rules = r.Rules
			} else {
				r, err := admin.RbacV1().Roles(b.Namespace).Get(ss.ctx, b.RoleRef.Name, metav1.GetOptions{})
				must(ss.t, err)
				rules = r.Rules
			}
			add(b.Subjects, b.Namespace, rules)
		case "ClusterRoleBinding":
			b, err := admin.RbacV1().ClusterRoleBindings().Get(ss.ctx, o.GetName(), metav1.GetOptions{})
			must(ss.t, err)
			r, err := admin.RbacV1().ClusterRoles().Get(ss.ctx, b.RoleRef.Name, metav1.GetOptions{})
			must(ss.t, err)
			add(b.Subjects, "", r.Rules)
		}
	}
	if len(reviews) == 0 {
		ss.t.Fatal("the chart binds no rule to a ServiceAccount")
	}
	ss.eventually(fmt.Sprintf("the chart's %d grants in force", len(reviews)), 30*time.Second, func() (bool, string) {
		for i := range reviews {
			got, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ss.ctx, &reviews[i], metav1.CreateOptions{})
			if err != nil {
				return false, err.Error()
			}
			if !got.Status.Allowed {
				return false, fmt.Sprintf("%s may not %+v yet", reviews[i].Spec.User, *reviews[i].Spec.ResourceAttributes)
			}
		}
		return true, ""
	})
}

// token is a token of ServiceAccount sa, bound to pod when pod is not nil
// (as a pod's projected token is: the API server then names the pod's node
// in the user's extra authentication.kubernetes.io/node-name).
func (ss *securityScenario) token(sa string, pod *apiv1.Pod) string {
	ss.t.Helper()
	exp := int64(3600)
	req := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := ss.s.cp.Client.CoreV1().ServiceAccounts(ss.ns).CreateToken(ss.ctx, sa, req, metav1.CreateOptions{})
	must(ss.t, err)
	return tok.Status.Token
}

// client authenticates with token.
func (ss *securityScenario) client(token string) *kubernetes.Clientset {
	ss.t.Helper()
	cfg := rest.AnonymousClientConfig(ss.s.cp.RESTConfig)
	cfg.BearerToken = token
	c, err := kubernetes.NewForConfig(cfg)
	must(ss.t, err)
	return c
}

// tokenKubeconfig writes a kubeconfig carrying token, for the agent binary.
func (ss *securityScenario) tokenKubeconfig(dir, token string) string {
	ss.t.Helper()
	admin := ss.s.cp.RESTConfig
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthorityData: admin.CAData, CertificateAuthority: admin.CAFile}
	cfg.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "agent"}
	cfg.CurrentContext = "e2e"
	path := filepath.Join(dir, "agent.kubeconfig")
	must(ss.t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// node creates a node with the preflight taint, a team taint and the
// pending label, as a new node of a GPU group joins.
func (ss *securityScenario) node(name string) *apiv1.Node {
	ss.t.Helper()
	n := &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"vmss-autoscaler.io/preflight": "pending", "openai.com/team": "rl", "e2e.vmss-autoscaler.io/security": ss.ns,
		}},
		Spec: apiv1.NodeSpec{Taints: []apiv1.Taint{
			{Key: "vmss-autoscaler.io/preflight", Value: "pending", Effect: apiv1.TaintEffectNoSchedule},
			{Key: "openai.com/team", Value: "rl", Effect: apiv1.TaintEffectNoSchedule},
		}},
	}
	created, err := ss.s.cp.Client.CoreV1().Nodes().Create(ss.ctx, n, metav1.CreateOptions{})
	must(ss.t, err)
	ss.t.Cleanup(func() { _ = ss.s.cp.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return created
}

// update gets node name with c, changes it and updates it; it returns the
// update's error. A conflict is retried on a fresh read, as every client of
// Nodes must: the API server checks the resourceVersion before admission,
// so a conflict says nothing of the policy, and the node lifecycle
// controller writes these nodes on its own (it lifts the not-ready taint
// the TaintNodesByCondition admission plugin put on them at creation).
func update(ctx context.Context, c kubernetes.Interface, name string, change func(*apiv1.Node)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node %s: %w", name, err)
		}
		change(n)
		_, err = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// ownTaints are the taints of n that are not the node lifecycle
// controller's (node.kubernetes.io/...), which come and go on a node with
// no kubelet whatever the test does.
func ownTaints(n *apiv1.Node) []apiv1.Taint {
	var own []apiv1.Taint
	for _, t := range n.Spec.Taints {
		if !strings.HasPrefix(t.Key, "node.kubernetes.io/") {
			own = append(own, t)
		}
	}
	return own
}

// withoutTaint is taints less the one with key.
func withoutTaint(taints []apiv1.Taint, key string) []apiv1.Taint {
	var kept []apiv1.Taint
	for _, t := range taints {
		if t.Key != key {
			kept = append(kept, t)
		}
	}
	return kept
}

// wantRefused fails unless err is the admission policy's Forbidden
// carrying want.
func wantRefused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Fatalf("%s: got %v, want refused by the admission policy", what, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: refused with %q, want a message containing %q", what, err, want)
	}
	t.Logf("%s: refused: %v", what, err)
}

// The preflight agent's ServiceAccount may update only the node its token
// is bound to, and only the preflight label, taint and annotations on it;
// the real agent binary's fail and pass of its own node are admitted.
func TestPreflightAgentOwnNodeOnly(t *testing.T) {
	t.Parallel()
	ss := newSecurityScenario(t, "e2e-sec-agent")
	a, b := ss.node(ss.prefix+"-node-a"), ss.node(ss.prefix+"-node-b")
	sa := ss.full + "-preflight"
	pod, err := ss.s.cp.Client.CoreV1().Pods(ss.ns).Create(ss.ctx, &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		Spec: apiv1.PodSpec{NodeName: a.Name, ServiceAccountName: sa,
			Tolerations: []apiv1.Toleration{{Operator: apiv1.TolerationOpExists}},
			Containers:  []apiv1.Container{{Name: "preflight", Image: "example.invalid/vmss-autoscaler"}}},
	}, metav1.CreateOptions{})
	must(t, err)
	agentToken := ss.token(sa, pod)
	agent := ss.client(agentToken)
	// The API server loads a new policy within a moment: probe with no-op
	// updates of node B (which change nothing if admitted) until refused.
	ss.eventually("the preflight admission policy in force", 30*time.Second, func() (bool, string) {
		err := update(ss.ctx, agent, b.Name, func(*apiv1.Node) {})
		return apierrors.IsForbidden(err), fmt.Sprintf("no-op update of node B: %v", err)
	})

	for _, tc := range []struct {
		name   string
		node   string
		change func(*apiv1.Node)
		want   string
	}{
		{"mark another node failed", b.Name, func(n *apiv1.Node) { n.Labels["vmss-autoscaler.io/preflight"] = "failed" },
			"may update only the node its pod runs on (its token is bound to node " + a.Name + "), not node " + b.Name},
		{"lift another node's taint", b.Name, func(n *apiv1.Node) {
			n.Spec.Taints = withoutTaint(n.Spec.Taints, "vmss-autoscaler.io/preflight")
		}, "not node " + b.Name},
		{"change another label of its node", a.Name, func(n *apiv1.Node) { n.Labels["openai.com/team"] = "other" },
			"may change only the vmss-autoscaler.io/preflight label"},
		{"add a label to its node", a.Name, func(n *apiv1.Node) { n.Labels["node-role.kubernetes.io/control-plane"] = "" },
			"may change only the vmss-autoscaler.io/preflight label"},
		{"remove another taint of its node", a.Name, func(n *apiv1.Node) { n.Spec.Taints = withoutTaint(n.Spec.Taints, "openai.com/team") },
			"may add or remove only the vmss-autoscaler.io/preflight taint"},
		{"add an annotation to its node", a.Name, func(n *apiv1.Node) {
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations["example.com/other"] = "x"
		}, "may change only its own annotations"},
		{"cordon its node", a.Name, func(n *apiv1.Node) { n.Spec.Unschedulable = true }, "may not cordon or uncordon a node"},
		{"a label value outside the protocol", a.Name, func(n *apiv1.Node) { n.Labels["vmss-autoscaler.io/preflight"] = "whatever" },
			"pending, passed or failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantRefused(t, tc.name, update(ss.ctx, agent, tc.node, tc.change), tc.want)
		})
	}
	// A token of the agent's ServiceAccount not bound to a pod names no
	// node, and may update none.
	unbound := ss.client(ss.token(sa, nil))
	wantRefused(t, "an unbound token", update(ss.ctx, unbound, a.Name, func(n *apiv1.Node) {
		n.Labels["vmss-autoscaler.io/preflight"] = "passed"
	}), "its token is bound to no node")

	// The real agent, with the bound token: a failing check labels its node
	// failed (admitted), then --retry-failed with a passing check passes it
	// and lifts the taint (admitted); the team taint and label stay.
	dir := t.TempDir()
	kubeconfig := ss.tokenKubeconfig(dir, agentToken)
	// The agent, as a DaemonSet pod, waits to be stopped once it reported.
	runAgent := func(name, checks string, done func(*apiv1.Node) (bool, string), extra ...string) {
		t.Helper()
		file := filepath.Join(dir, name+".yaml")
		must(t, os.WriteFile(file, []byte(checks), 0o600))
		p, err := ss.s.cp.StartProcess(ss.ctx, ss.prefix+"-"+name, ss.s.autoscaler,
			append([]string{"preflight", "--kubeconfig=" + kubeconfig, "--node-name=" + a.Name, "--checks=" + file}, extra...)...)
		must(t, err)
		defer func() { _ = p.Stop() }()
		ss.eventually("the agent's "+name+" of its node admitted", time.Minute, func() (bool, string) {
			select {
			case <-p.Exited():
				t.Fatalf("agent %s exited: %v; see %s", name, p.ExitErr(), p.LogFile)
			default:
			}
			n, err := ss.s.cp.Client.CoreV1().Nodes().Get(ss.ctx, a.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return done(n)
		})
	}
	runAgent("fail", "checks:\n- name: broken\n  command: [\"false\"]\n  timeout: 10s\n", func(n *apiv1.Node) (bool, string) {
		ok := n.Labels["vmss-autoscaler.io/preflight"] == "failed" && strings.Contains(n.Annotations["vmss-autoscaler.io/preflight-failure"], "broken")
		return ok, fmt.Sprintf("labels %v, annotations %v", n.Labels, n.Annotations)
	})
	runAgent("pass", "checks:\n- name: ok\n  command: [\"true\"]\n  timeout: 10s\n", func(n *apiv1.Node) (bool, string) {
		ok := n.Labels["vmss-autoscaler.io/preflight"] == "passed" && n.Annotations["vmss-autoscaler.io/preflight-passed-at"] != ""
		return ok, fmt.Sprintf("labels %v, annotations %v, taints %v", n.Labels, n.Annotations, n.Spec.Taints)
	}, "--retry-failed")
	n, err := ss.s.cp.Client.CoreV1().Nodes().Get(ss.ctx, a.Name, metav1.GetOptions{})
	must(t, err)
	if own := ownTaints(n); len(own) != 1 || own[0].Key != "openai.com/team" || n.Labels["openai.com/team"] != "rl" {
		t.Fatalf("after a pass: taints %+v, labels %v; want only the team taint, the team label kept", n.Spec.Taints, n.Labels)
	}
	// Node B was never touched.
	nb, err := ss.s.cp.Client.CoreV1().Nodes().Get(ss.ctx, b.Name, metav1.GetOptions{})
	must(t, err)
	if nb.Labels["vmss-autoscaler.io/preflight"] != "pending" || len(ownTaints(nb)) != 2 || nb.Spec.Unschedulable ||
		nb.Annotations["vmss-autoscaler.io/preflight-failure"] != "" || nb.Annotations["vmss-autoscaler.io/preflight-passed-at"] != "" {
		t.Fatalf("node B changed: labels %v, taints %+v, annotations %v", nb.Labels, nb.Spec.Taints, nb.Annotations)
	}
}

// The autoscaler's ServiceAccount, with the chart's RBAC and admission
// policy: it reads only its own ConfigMaps, creates only its own status
// ConfigMap, Lease and PriorityClass, writes Deployments only in the
// balloon namespace, where Pod Security "restricted" holds.
func TestAutoscalerOwnObjectsOnly(t *testing.T) {
	t.Parallel()
	ss := newSecurityScenario(t, "e2e-sec-own")
	as := ss.client(ss.token(ss.full, nil))
	ctx, cms := ss.ctx, as.CoreV1().ConfigMaps(ss.ns)
	balloonNS := ss.ns + "-balloons"

	// Reads: the named ConfigMaps, by name only.
	if _, err := cms.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=vmss-autoscaler-priority-expander"}); err != nil {
		t.Fatalf("list of the priority ConfigMap by name: %v", err)
	}
	if _, err := cms.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + ss.full + "-config"}); err != nil {
		t.Fatalf("list of the flags ConfigMap by name: %v", err)
	}
	for what, err := range map[string]error{
		"list every ConfigMap":          errOf(cms.List(ctx, metav1.ListOptions{})),
		"list the preflight checks":     errOf(cms.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + ss.full + "-preflight-checks"})),
		"get a Secret":                  errOf(as.CoreV1().Secrets(ss.ns).Get(ctx, "x", metav1.GetOptions{})),
		"create a Deployment elsewhere": errOf(as.AppsV1().Deployments(ss.ns).Create(ctx, balloonDeployment(ss.ns), metav1.CreateOptions{})),
		"delete a node":                 as.CoreV1().Nodes().Delete(ctx, "x", metav1.DeleteOptions{}),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden by RBAC", what, err)
		}
	}

	// Creates: its own names admitted, any other refused by the policy
	// (once the API server has loaded it: probe until refused).
	cm := func(name string) *apiv1.ConfigMap { return &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	ss.eventually("the autoscaler's admission policy in force", 30*time.Second, func() (bool, string) {
		_, err := cms.Create(ctx, cm("probe"), metav1.CreateOptions{})
		if err == nil {
			must(t, ss.s.cp.Client.CoreV1().ConfigMaps(ss.ns).Delete(ctx, "probe", metav1.DeleteOptions{}))
		}
		return apierrors.IsForbidden(err), fmt.Sprintf("create of ConfigMap probe: %v", err)
	})
	if _, err := cms.Create(ctx, cm("vmss-autoscaler-status"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create of the status ConfigMap: %v", err)
	}
	wantRefused(t, "create another ConfigMap", errOf(cms.Create(ctx, cm("stolen"), metav1.CreateOptions{})),
		"vmss-autoscaler may create only its own configmaps, not "+ss.ns+"/stolen")
	leases := as.CoordinationV1().Leases(ss.ns)
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "vmss-autoscaler"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create of the leader-election Lease: %v", err)
	}
	wantRefused(t, "create another Lease", errOf(leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{})),
		"may create only its own leases")
	pcName := ss.prefix + "-high"
	wantRefused(t, "create another PriorityClass", errOf(as.SchedulingV1().PriorityClasses().Create(ctx,
		&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: pcName}, Value: 1000000}, metav1.CreateOptions{})),
		"may create only its own priorityclasses, not "+pcName)
	t.Cleanup(func() {
		_ = ss.s.cp.Client.SchedulingV1().PriorityClasses().Delete(context.Background(), pcName, metav1.DeleteOptions{})
	})

	// Deployments in the balloon namespace, whose Pod Security level is
	// restricted: the balloon Deployment the controller builds is created
	// and its pod admitted; a privileged pod is not.
	if _, err := as.AppsV1().Deployments(balloonNS).Create(ctx, balloonDeployment(balloonNS), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create of a balloon Deployment in %s: %v", balloonNS, err)
	}
	ss.eventually("the balloon pod admitted under Pod Security restricted", time.Minute, func() (bool, string) {
		pods, err := ss.s.cp.Client.CoreV1().Pods(balloonNS).List(ctx, metav1.ListOptions{LabelSelector: balloon.DefaultLabel})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 1, fmt.Sprintf("%d balloon pods", len(pods.Items))
	})
	priv := true
	_, err := ss.s.cp.Client.CoreV1().Pods(balloonNS).Create(ctx, &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "privileged"},
		Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Image: "example.invalid/x",
			SecurityContext: &apiv1.SecurityContext{Privileged: &priv}}}},
	}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) {
		t.Fatalf("privileged pod in %s: %v, want refused by Pod Security restricted", balloonNS, err)
	}
}

// balloonDeployment is the Deployment the balloon controller writes for a
// group, in namespace ns.
func balloonDeployment(ns string) *appsv1.Deployment {
	o := balloon.DefaultOptions()
	o.Namespace = ns
	return o.Deployment(balloon.GroupSpec{Group: "gpu", Replicas: 1,
		Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("1"), apiv1.ResourceMemory: resource.MustParse("1Gi")}})
}

func errOf[T any](_ T, err error) error { return err }

// checkSecureMetrics proves the autoscaler's TLS listener at addr (the
// chart's --secure-address, run as the chart's ServiceAccount) on the real
// API server: /healthz is open (the kubelet's probe), /metrics needs a
// token (TokenReview) that RBAC lets get /metrics (SubjectAccessReview): a
// ServiceAccount bound to the chart's <full>-metrics-reader reads it, the
// namespace's default ServiceAccount is forbidden.
func (sc *scenario) checkSecureMetrics(addr, full string) {
	sc.t.Helper()
	t, ctx, admin := sc.t, sc.ctx, sc.s.cp.Client
	_, err := admin.CoreV1().ServiceAccounts(sc.ns).Create(ctx, &apiv1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scraper"}}, metav1.CreateOptions{})
	must(t, err)
	binding := sc.ns + "-scraper"
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: full + "-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: sc.ns}},
	}, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding, metav1.DeleteOptions{})
	})
	token := func(sa string) string {
		exp := int64(3600)
		tok, err := admin.CoreV1().ServiceAccounts(sc.ns).CreateToken(ctx, sa, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
		must(t, err)
		return tok.Status.Token
	}
	scraper, other := token("scraper"), token("default")
	// The listener's certificate is self-signed (no certSecret): the token,
	// not the chain, is what this checks.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed
	get := func(path, tok string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+path, nil)
		must(t, err)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, tc := range []struct {
		what, path, token string
		want              int
		body              string
	}{
		{"/healthz without a token", "/healthz", "", http.StatusOK, ""},
		{"/metrics without a token", "/metrics", "", http.StatusUnauthorized, "Unauthorized"},
		{"/metrics with a token RBAC does not allow", "/metrics", other, http.StatusForbidden, "may not get /metrics"},
		{"/metrics with the scraper's token", "/metrics", scraper, http.StatusOK, "vmss_autoscaler_"},
	} {
		sc.eventually("secure listener: "+tc.what, 30*time.Second, func() (bool, string) {
			code, body := get(tc.path, tc.token)
			return code == tc.want && strings.Contains(body, tc.body), fmt.Sprintf("%d %.200q", code, body)
		})
		t.Logf("secure listener: %s: %d", tc.what, tc.want)
	}
}

// A node health signal writer named in admissionPolicies.healthSignalWriters
// (a node-problem-detector DaemonSet's ServiceAccount, granted nodes/status
// cluster-wide as such DaemonSets are) may set conditions only on the node
// its bound token names: a stolen token cannot flag the fleet for the
// health policy (issue #39); a token bound to no pod sets none.
func TestHealthSignalWriterOwnNodeOnly(t *testing.T) {
	t.Parallel()
	const sa = "npd"
	ss := newSecurityScenarioWith(t, "e2e-sec-npd", func(sc *scenario) map[string]any {
		return map[string]any{"admissionPolicies": map[string]any{"enabled": true,
			"healthSignalWriters": []any{map[string]any{"namespace": sc.ns, "serviceAccount": sa}}}}
	})
	admin := ss.s.cp.Client
	_, err := admin.CoreV1().ServiceAccounts(ss.ns).Create(ss.ctx, &apiv1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	must(t, err)
	role := ss.prefix + "-npd"
	_, err = admin.RbacV1().ClusterRoles().Create(ss.ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes", "nodes/status"}, Verbs: []string{"get", "update", "patch"}}}}, metav1.CreateOptions{})
	must(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ss.ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ss.ns, Name: sa}}}, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
	a, b := ss.node(ss.prefix+"-npd-a"), ss.node(ss.prefix+"-npd-b")
	pod, err := admin.CoreV1().Pods(ss.ns).Create(ss.ctx, &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "npd"},
		Spec: apiv1.PodSpec{NodeName: a.Name, ServiceAccountName: sa,
			Tolerations: []apiv1.Toleration{{Operator: apiv1.TolerationOpExists}},
			Containers:  []apiv1.Container{{Name: "npd", Image: "example.invalid/npd"}}},
	}, metav1.CreateOptions{})
	must(t, err)
	npd := ss.client(ss.token(sa, pod))
	setXID := func(c kubernetes.Interface, node string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := c.CoreV1().Nodes().Get(ss.ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Status.Conditions = append(n.Status.Conditions, apiv1.NodeCondition{Type: "XIDErrors", Status: apiv1.ConditionTrue,
				Reason: "XID79", LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now()})
			_, err = c.CoreV1().Nodes().UpdateStatus(ss.ctx, n, metav1.UpdateOptions{})
			return err
		})
	}
	// RBAC and the policy take a moment to be in force: probe node B until
	// the policy, not RBAC, refuses it.
	ss.eventually("the signal writers' admission policy in force", 30*time.Second, func() (bool, string) {
		err := setXID(npd, b.Name)
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "signal writer"), fmt.Sprintf("condition on node B: %v", err)
	})
	wantRefused(t, "a condition on another node", setXID(npd, b.Name),
		"may update only the node its pod runs on (its token is bound to node "+a.Name+"), not node "+b.Name)
	wantRefused(t, "a taint on another node", update(ss.ctx, npd, b.Name, func(n *apiv1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: "nvidia.com/gpu-error", Effect: apiv1.TaintEffectNoSchedule})
	}), "not node "+b.Name)
	must(t, setXID(npd, a.Name))
	unbound := ss.client(ss.token(sa, nil))
	wantRefused(t, "an unbound token", setXID(unbound, a.Name), "its token is bound to no node")
}
