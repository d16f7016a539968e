// Package balloon is what a balloon pod is, the warm-pool policy of a node
// group, and the controller that keeps one balloon Deployment per node group.
//
// Balloons are low-priority placeholder pods (a negative PriorityClass with
// preemptionPolicy Never, a pause container sized to a whole node) that keep
// warm nodes: the scheduler preempts them the moment real work needs the
// room, and the autoscaler counts their room as free.
//
// The package never reaches into the core's state. The core calls the pure
// functions here (IsBalloon, GroupOf, Policy.WarmTarget, Options.Deployment)
// and runs a Controller, handing it the desired GroupSpecs each loop.
package balloon

import (
	"fmt"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Defaults shared with the cluster (design.md, "Names shared with the cluster").
const (
	DefaultLabel             = "vmss-autoscaler.io/balloon"
	DefaultPriorityClassName = "vmss-autoscaler-balloon"
	DefaultPriorityValue     = int32(-100)
	DefaultImage             = "registry.k8s.io/pause:3.10"
	DefaultNamespace         = "vmss-autoscaler-balloons"
	DefaultNodeGroupLabel    = "vmss-autoscaler.io/node-group"
	DefaultManagedByLabel    = "app.kubernetes.io/managed-by"
	DefaultManagedByValue    = "vmss-autoscaler"
	// DefaultPreflightTaintKey is preflight.DefaultTaintKey; balloons never
	// tolerate it (a balloon must not hold a node that is not proven yet).
	DefaultPreflightTaintKey = "vmss-autoscaler.io/preflight"

	// SpecHashAnnotation holds a hash of the desired Deployment, so that
	// "did what we want change" is one string comparison.
	SpecHashAnnotation = "vmss-autoscaler.io/balloon-spec-hash"
)

// Options name the objects balloons are made of. All are configurable; the
// core maps its flags onto them.
type Options struct {
	// Label marks balloon pods; its value is the node group's name.
	Label string
	// PriorityClassName is the balloons' PriorityClass.
	PriorityClassName string
	// PriorityValue is that PriorityClass's value; it must be negative so
	// that every pod of default priority (0) preempts balloons.
	PriorityValue int32
	// Image is the balloon container's image (a pause image).
	Image string
	// Namespace holds the balloon Deployments.
	Namespace string
	// NodeGroupLabel is the label a node group's nodes carry with the
	// group's name; balloons require it (node affinity).
	NodeGroupLabel string
	// ManagedByLabel=ManagedByValue is put on every object the package
	// creates; the controller only ever changes or deletes objects carrying it.
	ManagedByLabel string
	ManagedByValue string
	// PreflightTaintKey is the preflight gate's taint key; a toleration for
	// it is never given to a balloon.
	PreflightTaintKey string
	// MaxReplicas bounds a balloon Deployment's replicas (a warm pool):
	// the chart's admission policy refuses more (--balloon-max-replicas).
	MaxReplicas int32
}

// DefaultOptions are design.md's names.
func DefaultOptions() Options {
	return Options{
		Label:             DefaultLabel,
		PriorityClassName: DefaultPriorityClassName,
		PriorityValue:     DefaultPriorityValue,
		Image:             DefaultImage,
		Namespace:         DefaultNamespace,
		NodeGroupLabel:    DefaultNodeGroupLabel,
		ManagedByLabel:    DefaultManagedByLabel,
		ManagedByValue:    DefaultManagedByValue,
		PreflightTaintKey: DefaultPreflightTaintKey,
		MaxReplicas:       DefaultMaxReplicas,
	}
}

// DefaultMaxReplicas is MaxReplicas' default.
const DefaultMaxReplicas = 100

// Validate names the flag at fault.
func (o Options) Validate() error {
	if err := o.validatePods(); err != nil {
		return err
	}
	if errs := validation.IsQualifiedName(o.Label); len(errs) > 0 {
		return fmt.Errorf("--balloon-label: %q is not a label key: %s", o.Label, strings.Join(errs, "; "))
	}
	if err := o.validatePriorityClass(); err != nil {
		return err
	}
	if err := o.validateNodeGroupLabel(); err != nil {
		return err
	}
	return o.validateManagedBy()
}

// validatePods checks what makes the balloon pods: their priority, image,
// count and namespace.
func (o Options) validatePods() error {
	if o.PriorityValue >= 0 {
		return fmt.Errorf("--balloon-priority-value: must be negative so that every pod of default priority preempts balloons, got %d", o.PriorityValue)
	}
	if strings.TrimSpace(o.Image) == "" {
		return fmt.Errorf("--balloon-image: must not be empty")
	}
	if o.MaxReplicas < 1 {
		return fmt.Errorf("--balloon-max-replicas: must be at least 1, got %d", o.MaxReplicas)
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return fmt.Errorf("--balloon-namespace: %q is not a namespace name: %s", o.Namespace, strings.Join(errs, "; "))
	}
	return nil
}

// validatePriorityClass checks the PriorityClass's name: valid, not
// reserved.
func (o Options) validatePriorityClass() error {
	if errs := validation.IsDNS1123Subdomain(o.PriorityClassName); len(errs) > 0 {
		return fmt.Errorf("--balloon-priority-class: %q is not a PriorityClass name: %s", o.PriorityClassName, strings.Join(errs, "; "))
	}
	if strings.HasPrefix(o.PriorityClassName, "system-") {
		return fmt.Errorf("--balloon-priority-class: %q: the prefix system- is reserved", o.PriorityClassName)
	}
	return nil
}

// validateNodeGroupLabel checks the node-group label: a label key, not
// the balloon label.
func (o Options) validateNodeGroupLabel() error {
	if errs := validation.IsQualifiedName(o.NodeGroupLabel); len(errs) > 0 {
		return fmt.Errorf("--balloon-node-group-label: %q is not a label key: %s", o.NodeGroupLabel, strings.Join(errs, "; "))
	}
	if o.NodeGroupLabel == o.Label {
		return fmt.Errorf("--balloon-label: %q is also the node-group label", o.Label)
	}
	return nil
}

// validateManagedBy checks the managed-by label: a label key with a
// non-empty value, not the balloon label.
func (o Options) validateManagedBy() error {
	if errs := validation.IsQualifiedName(o.ManagedByLabel); len(errs) > 0 {
		return fmt.Errorf("balloon managed-by label: %q is not a label key: %s", o.ManagedByLabel, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(o.ManagedByValue); len(errs) > 0 || o.ManagedByValue == "" {
		return fmt.Errorf("balloon managed-by label: value %q is not a non-empty label value", o.ManagedByValue)
	}
	if o.ManagedByLabel == o.Label {
		return fmt.Errorf("--balloon-label: %q is also the managed-by label", o.Label)
	}
	return nil
}

// IsBalloon reports whether p is a balloon of this autoscaler: it is in the
// balloon namespace, carries the managed-by label with the controller's
// value, runs at the balloon PriorityClass and carries the balloon label
// with a non-empty value (the node group's name). The label alone is not
// enough: any tenant may label its own pods, and a pod taken for a balloon
// has its room counted as free, which buys nothing for the pods waiting for
// that room when the scheduler will not preempt it. Only the controller
// (and whoever may create pods in the balloon namespace) makes balloons.
func (o Options) IsBalloon(p *apiv1.Pod) bool {
	return o.GroupOf(p) != ""
}

// GroupOf is the node group a balloon pod keeps warm, "" for other pods
// (IsBalloon).
func (o Options) GroupOf(p *apiv1.Pod) string {
	if p == nil || p.Namespace != o.Namespace || !o.isManaged(p.Labels) || p.Spec.PriorityClassName != o.PriorityClassName {
		return ""
	}
	return p.Labels[o.Label]
}

// isManaged reports whether an object's labels say this package made it.
func (o Options) isManaged(labels map[string]string) bool {
	return labels[o.ManagedByLabel] == o.ManagedByValue
}
