package balloon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// namespace is a Namespace with labels.
func namespace(name string, labels ...string) *apiv1.Namespace {
	ns := &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	for i := 0; i+1 < len(labels); i += 2 {
		ns.Labels[labels[i]] = labels[i+1]
	}
	return ns
}

// restricted is the balloon namespace as the chart creates it.
func restricted(name string) *apiv1.Namespace {
	return namespace(name, PodSecurityEnforceLabel, PodSecurityRestricted)
}

func TestValidateNamespace(t *testing.T) {
	for _, tc := range []struct {
		name, balloons, own string
		wantErr             string // "" for valid
	}{
		{"own namespace", DefaultNamespace, "kube-system", ""},
		{"configured", "warm", "autoscaler", ""},
		{"kube-system", "kube-system", "autoscaler", `--balloon-namespace: "kube-system" is refused`},
		{"kube-system, also the autoscaler's", "kube-system", "kube-system", `--balloon-namespace: "kube-system" is refused`},
		{"the autoscaler's namespace", "autoscaler", "autoscaler", `--balloon-namespace: "autoscaler" is the autoscaler's own namespace (--namespace)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Namespace = tc.balloons
			err := o.ValidateNamespace(tc.own)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("ValidateNamespace(%q) = %v, want nil", tc.own, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("ValidateNamespace(%q) = %v, want an error containing %q", tc.own, err, tc.wantErr)
			}
		})
	}
}

func TestCheckNamespaceAtStart(t *testing.T) {
	const refused = "--balloon-namespace: namespace vmss-autoscaler-balloons does not carry the label pod-security.kubernetes.io/enforce=restricted"
	for _, tc := range []struct {
		name    string
		objs    []runtime.Object
		listErr error
		wantErr string // "" for a start
	}{
		{"restricted", []runtime.Object{restricted(DefaultNamespace)}, nil, ""},
		{"not there yet: the controller checks before writing", nil, nil, ""},
		{"not readable now: the controller checks before writing", nil, errors.New("connection refused"), ""},
		{"another namespace is restricted, not this one", []runtime.Object{restricted("other"), namespace(DefaultNamespace)}, nil, refused + " (has no such label)"},
		{"no Pod Security label", []runtime.Object{namespace(DefaultNamespace)}, nil, refused + " (has no such label)"},
		{"baseline", []runtime.Object{namespace(DefaultNamespace, PodSecurityEnforceLabel, "baseline")}, nil, refused + " (has baseline)"},
		{"privileged", []runtime.Object{namespace(DefaultNamespace, PodSecurityEnforceLabel, "privileged")}, nil, refused + " (has privileged)"},
		{"restricted only in audit and warn", []runtime.Object{namespace(DefaultNamespace,
			"pod-security.kubernetes.io/audit", "restricted", "pod-security.kubernetes.io/warn", "restricted")}, nil, refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objs...)
			if tc.listErr != nil {
				client.PrependReactor("list", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.listErr })
			}
			err := DefaultOptions().CheckNamespaceAtStart(context.Background(), client)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("CheckNamespaceAtStart = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("CheckNamespaceAtStart = %v, want an error containing %q", err, tc.wantErr)
			}
			// Read by list, which the autoscaler's ClusterRole grants: it
			// may not get namespaces.
			for _, a := range client.Actions() {
				if a.GetResource().Resource == "namespaces" && a.GetVerb() != "list" {
					t.Errorf("%s namespaces: only list is granted", a.GetVerb())
				}
			}
		})
	}
}

// TestSyncWritesOnlyIntoARestrictedNamespace: no balloon Deployment is
// created or updated in a namespace that is missing or does not enforce Pod
// Security restricted; stale ones are still pruned; once the namespace is
// fixed, the next Sync writes.
func TestSyncWritesOnlyIntoARestrictedNamespace(t *testing.T) {
	o := DefaultOptions()
	stale := balloonDeployment(o, spec("gone", 1))
	drifted := balloonDeployment(o, spec("g2", 1), func(d *appsv1.Deployment) { d.Spec.Replicas = new(int32(5)) })
	for _, tc := range []struct {
		name    string
		ns      *apiv1.Namespace // nil: none
		wantErr string
	}{
		{"no namespace", nil, "namespace vmss-autoscaler-balloons does not exist"},
		{"not restricted", namespace(DefaultNamespace, PodSecurityEnforceLabel, "privileged"), "does not carry the label pod-security.kubernetes.io/enforce=restricted (has privileged)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{priorityClass(DefaultPriorityValue, apiv1.PreemptNever), stale.DeepCopy(), drifted.DeepCopy()}
			if tc.ns != nil {
				objs = append(objs, tc.ns)
			}
			e := newEnvWithoutNamespace(t, o, objs...)
			_, err := e.sync(spec("g1", 1), spec("g2", 1))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Sync error = %v, want one containing %q", err, tc.wantErr)
			}
			if got, want := e.writes(), []string{"delete deployments " + stale.Name}; !slices.Equal(got, want) {
				t.Fatalf("writes = %v, want %v (prune only)", got, want)
			}
			// The namespace is fixed: the next Sync writes.
			fixed := restricted(DefaultNamespace)
			if tc.ns == nil {
				_, err = e.client.CoreV1().Namespaces().Create(e.ctx, fixed, metav1.CreateOptions{})
			} else {
				_, err = e.client.CoreV1().Namespaces().Update(e.ctx, fixed, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.sync(spec("g1", 1), spec("g2", 1)); err != nil {
				t.Fatalf("Sync in a restricted namespace: %v", err)
			}
			if got, want := e.writes(), []string{"create deployments " + DeploymentName("g1"), "update deployments " + DeploymentName("g2")}; !slices.Equal(got, want) {
				t.Fatalf("writes = %v, want %v", got, want)
			}
		})
	}
}
