// Package trim holds the informer transforms (cache.TransformFunc) that
// drop, before an object enters a cache, what the autoscaler never reads.
// At 200,000 pods most of a pod's bytes are fields no phase looks at:
// managed fields, kubectl's last-applied annotation, and per-container
// environment, commands and probes.
//
// What is kept is what the loop reads (checked against core/, balloon/,
// preflight/ and the scheduler Filter plugins the simulation runs):
// metadata but managed fields and the last-applied annotation; a pod's
// whole spec but its containers' env, envFrom, command, args, working
// dir, probes, lifecycle hooks, termination-message settings and volume
// mounts (resources, ports, restart policy of sidecars, images and
// volumes stay: fit, NodePorts, drain's local-storage check); its whole
// status (the in-place resize fields of container statuses count in the
// scheduler's requests); a node's whole spec and status but the images it
// holds (ImageLocality is a Score plugin, never run); the pod templates of
// PodTemplates and ReplicaSets as a pod's spec.
//
// Only caches the process never writes back from may use Object: objects
// updated from a cache copy would lose the annotation on the server. The
// balloon controller's Deployments use Metadata (managed fields only,
// which an update leaves alone when absent).
package trim

import (
	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// LastAppliedAnnotation is kubectl's copy of the last applied manifest.
const LastAppliedAnnotation = apiv1.LastAppliedConfigAnnotation

var (
	_ cache.TransformFunc = Object
	_ cache.TransformFunc = Metadata
)

// Object trims any object (see the package comment). It changes obj in
// place, is idempotent, and passes anything that is not an object
// (tombstones) through.
func Object(obj any) (any, error) {
	switch o := obj.(type) {
	case *apiv1.Pod:
		meta(&o.ObjectMeta)
		podSpec(&o.Spec)
	case *apiv1.Node:
		meta(&o.ObjectMeta)
		o.Status.Images = nil
	case *apiv1.PodTemplate:
		// A CapacityBuffer's or a ProvisioningRequest's pod shape: its
		// containers' environment (secrets written inline, often) is
		// never read.
		meta(&o.ObjectMeta)
		podSpec(&o.Template.Spec)
	case *appsv1.ReplicaSet:
		// The pods to come are made from its template.
		meta(&o.ObjectMeta)
		podSpec(&o.Spec.Template.Spec)
	case metav1.ObjectMetaAccessor:
		m := o.GetObjectMeta()
		m.SetManagedFields(nil)
		if a := m.GetAnnotations(); a != nil {
			if _, ok := a[LastAppliedAnnotation]; ok {
				delete(a, LastAppliedAnnotation)
				m.SetAnnotations(a)
			}
		}
	}
	return obj, nil
}

// Metadata drops managed fields only.
func Metadata(obj any) (any, error) {
	if a, ok := obj.(metav1.ObjectMetaAccessor); ok {
		a.GetObjectMeta().SetManagedFields(nil)
	}
	return obj, nil
}

func meta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	delete(m.Annotations, LastAppliedAnnotation)
}

func podSpec(s *apiv1.PodSpec) {
	for i := range s.InitContainers {
		container(&s.InitContainers[i])
	}
	for i := range s.Containers {
		container(&s.Containers[i])
	}
	for i := range s.EphemeralContainers {
		c := &s.EphemeralContainers[i].EphemeralContainerCommon
		c.Env, c.EnvFrom, c.Command, c.Args, c.WorkingDir = nil, nil, nil, nil, ""
		c.LivenessProbe, c.ReadinessProbe, c.StartupProbe, c.Lifecycle = nil, nil, nil, nil
		c.TerminationMessagePath, c.TerminationMessagePolicy, c.VolumeMounts = "", "", nil
	}
}

func container(c *apiv1.Container) {
	c.Env, c.EnvFrom, c.Command, c.Args, c.WorkingDir = nil, nil, nil, nil, ""
	c.LivenessProbe, c.ReadinessProbe, c.StartupProbe, c.Lifecycle = nil, nil, nil, nil
	c.TerminationMessagePath, c.TerminationMessagePolicy, c.VolumeMounts = "", "", nil
}
