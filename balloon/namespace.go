package balloon

import (
	"context"
	"errors"
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// The balloon namespace's Pod Security: the autoscaler may create and update
// Deployments there, so whoever holds its token may run pods there; the
// restricted level keeps those pods unprivileged (non-root, no host access,
// no added capabilities). Balloon pods meet it.
const (
	PodSecurityEnforceLabel = "pod-security.kubernetes.io/enforce"
	PodSecurityRestricted   = "restricted"
)

// ValidateNamespace refuses a balloon namespace that would hand the
// autoscaler's Deployment rights over more than balloons: kube-system (a
// Deployment there may run as any of its ServiceAccounts, some of them
// cluster-admin) and own, the autoscaler's namespace (--namespace: its own
// ServiceAccount and the release's objects live there).
func (o Options) ValidateNamespace(own string) error {
	switch o.Namespace {
	case metav1.NamespaceSystem:
		return fmt.Errorf("--balloon-namespace: %q is refused: the autoscaler may create and update Deployments in the balloon namespace, "+
			"and a Deployment in kube-system may run as any ServiceAccount there (cluster-admin); use a namespace of its own (default %s) "+
			"with Pod Security enforce=restricted", o.Namespace, DefaultNamespace)
	case own:
		return fmt.Errorf("--balloon-namespace: %q is the autoscaler's own namespace (--namespace) and is refused: the autoscaler may create "+
			"and update Deployments in the balloon namespace, and a Deployment there may run as the autoscaler's own ServiceAccount; "+
			"use a namespace of its own (default %s) with Pod Security enforce=restricted", o.Namespace, DefaultNamespace)
	}
	return nil
}

// NamespaceProblem says why ns may not hold balloons ("" when it may): its
// Pod Security admission must enforce the restricted level.
func (o Options) NamespaceProblem(ns *apiv1.Namespace) string {
	if got := ns.Labels[PodSecurityEnforceLabel]; got != PodSecurityRestricted {
		if got == "" {
			got = "no such label"
		}
		return fmt.Sprintf("--balloon-namespace: namespace %s does not carry the label %s=%s (has %s): Pod Security must keep the pods "+
			"of the autoscaler's Deployments there unprivileged; label it (kubectl label namespace %s %s=%s) or let the chart create it",
			ns.Name, PodSecurityEnforceLabel, PodSecurityRestricted, got, ns.Name, PodSecurityEnforceLabel, PodSecurityRestricted)
	}
	return ""
}

// readNamespace reads the balloon namespace, nil when it does not exist.
// By list with a field selector: the autoscaler may list namespaces (the
// scheduler framework's informer), not get them.
func (o Options) readNamespace(ctx context.Context, client kubernetes.Interface) (*apiv1.Namespace, error) {
	list, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", o.Namespace).String()})
	if err != nil {
		return nil, fmt.Errorf("reading the balloon namespace %s: %w", o.Namespace, err)
	}
	for i := range list.Items {
		if list.Items[i].Name == o.Namespace {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

// checkNamespace is nil when balloon Deployments may be written: the
// namespace exists and enforces Pod Security restricted.
func (o Options) checkNamespace(ctx context.Context, client kubernetes.Interface) error {
	ns, err := o.readNamespace(ctx, client)
	if err != nil {
		return err
	}
	if ns == nil {
		return fmt.Errorf("--balloon-namespace: namespace %s does not exist (create it with the label %s=%s, or let the chart create it)",
			o.Namespace, PodSecurityEnforceLabel, PodSecurityRestricted)
	}
	if p := o.NamespaceProblem(ns); p != "" {
		return errors.New(p)
	}
	return nil
}

// CheckNamespaceAtStart refuses to start (an error) when the balloon
// namespace exists without Pod Security enforce=restricted. A namespace not
// there yet, or not readable now, is logged only: the Controller checks
// again before it writes any balloon Deployment, and writes none until the
// namespace is there and restricted.
func (o Options) CheckNamespaceAtStart(ctx context.Context, client kubernetes.Interface) error {
	logger := klog.FromContext(ctx)
	ns, err := o.readNamespace(ctx, client)
	switch {
	case err != nil:
		logger.Error(err, "Balloon namespace not checked at start; no balloon Deployment is written until it is read as restricted")
		return nil
	case ns == nil:
		logger.Info("Balloon namespace does not exist; no balloon Deployment is written until it does, with Pod Security restricted",
			"namespace", o.Namespace)
		return nil
	}
	if p := o.NamespaceProblem(ns); p != "" {
		return errors.New(p)
	}
	return nil
}
