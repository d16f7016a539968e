package trim

import (
	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

func realPod(i int) *apiv1.Pod   { return to.RealisticPod(i) }
func realNode(i int) *apiv1.Node { return to.RealisticNode(i) }

func realDaemonSet() *appsv1.DaemonSet {
	p := realPod(0)
	return &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{Kind: "DaemonSet", APIVersion: "apps/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "kube-system", Annotations: map[string]string{LastAppliedAnnotation: "{}", "keep": "me"}, ManagedFields: p.ManagedFields},
		Spec:       appsv1.DaemonSetSpec{Template: apiv1.PodTemplateSpec{Spec: *p.Spec.DeepCopy()}},
	}
}

func realDaemonSetTemplate(obj any) apiv1.PodTemplateSpec {
	return obj.(*appsv1.DaemonSet).Spec.Template
}
