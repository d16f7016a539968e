// Package actuation holds the loop's writes to nodes and machines: taints,
// cordons and evictions through the Kubernetes API, machine deletions
// batched one DeleteNodes per group, and scale-down's drains, which run in
// the background between loops. Every path that deletes or cordons goes
// through here.
package actuation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// NodeActions are the Kubernetes writes of the loop.
type NodeActions interface {
	// AddTaint adds a taint to a node unless a taint with its key is there.
	AddTaint(ctx context.Context, node string, taint apiv1.Taint) error
	// RemoveTaint removes every taint with the key.
	RemoveTaint(ctx context.Context, node, key string) error
	// Evict evicts a pod through the Eviction API, so PodDisruptionBudgets hold.
	Evict(ctx context.Context, pod *apiv1.Pod, gracePeriodSeconds int64) error
	// Cordon marks a node unschedulable, and says on it (CordonedAnnotation)
	// that this autoscaler did and why, so the next leader knows.
	Cordon(ctx context.Context, node, reason string) error
	// Uncordon marks schedulable again a node this autoscaler cordoned
	// (it carries CordonedAnnotation); a node cordoned by anyone else is
	// left as it is.
	Uncordon(ctx context.Context, node string) error
	// UpdateRepair changes the node's repair record (RepairAnnotation):
	// change gets the record there now ("" for none) and returns the
	// new one. With again, the same write sends the node through
	// preflight again. Only on a node this autoscaler cordoned
	// (ErrNotCordoned otherwise: the chart's admission policy refuses
	// it too).
	UpdateRepair(ctx context.Context, node string, change func(old string) string, again *PreflightAgain) error
}

// KubeNodeActions implements NodeActions with client-go.
type KubeNodeActions struct {
	Client kubernetes.Interface
}

// AddTaint implements NodeActions.
func (k *KubeNodeActions) AddTaint(ctx context.Context, node string, taint apiv1.Taint) error {
	return k.updateTaints(ctx, node, func(ts []apiv1.Taint) ([]apiv1.Taint, bool) {
		for _, t := range ts {
			if t.Key == taint.Key {
				return ts, false
			}
		}
		return append(ts, taint), true
	})
}

// RemoveTaint implements NodeActions.
func (k *KubeNodeActions) RemoveTaint(ctx context.Context, node, key string) error {
	return k.updateTaints(ctx, node, func(ts []apiv1.Taint) ([]apiv1.Taint, bool) {
		out := ts[:0:0]
		for _, t := range ts {
			if t.Key != key {
				out = append(out, t)
			}
		}
		return out, len(out) != len(ts)
	})
}

func (k *KubeNodeActions) updateTaints(ctx context.Context, node string, change func([]apiv1.Taint) ([]apiv1.Taint, bool)) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ts, changed := change(n.Spec.Taints)
		if !changed {
			return nil
		}
		n.Spec.Taints = ts
		_, err = k.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("updating taints of node %s: %w", node, err)
	}
	return nil
}

// CordonedAnnotation is on a node this autoscaler cordoned: "<reason>
// <RFC3339 time>". A new leader reads it to take over the cordon (and to
// take it back when the node recovers); a node cordoned by anyone else
// never carries it and is never uncordoned by this autoscaler.
const CordonedAnnotation = "vmss-autoscaler.io/cordoned"

// CordonedBy says whether this autoscaler cordoned the node, and why.
func CordonedBy(n *apiv1.Node) (string, bool) {
	v, ok := n.Annotations[CordonedAnnotation]
	return v, ok && n.Spec.Unschedulable
}

// Cordon implements NodeActions. A node already cordoned (by anyone) is
// left as it is: its cordon is not claimed.
func (k *KubeNodeActions) Cordon(ctx context.Context, node, reason string) error {
	err := k.updateNode(ctx, node, func(n *apiv1.Node) bool {
		if n.Spec.Unschedulable {
			return false
		}
		n.Spec.Unschedulable = true
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[CordonedAnnotation] = reason + " " + metav1.Now().UTC().Format(time.RFC3339)
		return true
	})
	if err != nil {
		return fmt.Errorf("cordoning node %s: %w", node, err)
	}
	return nil
}

// Uncordon implements NodeActions.
func (k *KubeNodeActions) Uncordon(ctx context.Context, node string) error {
	err := k.updateNode(ctx, node, func(n *apiv1.Node) bool {
		if _, ours := n.Annotations[CordonedAnnotation]; !ours {
			return false
		}
		delete(n.Annotations, CordonedAnnotation)
		n.Spec.Unschedulable = false
		return true
	})
	if err != nil {
		return fmt.Errorf("uncordoning node %s: %w", node, err)
	}
	return nil
}

// updateNode reads a node, changes it and writes it back, again on a
// conflict; change says whether it changed anything.
func (k *KubeNodeActions) updateNode(ctx context.Context, node string, change func(*apiv1.Node) bool) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil || !change(n) {
			return err
		}
		_, err = k.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// RepairAnnotation is the node's repair record, written by the autoscaler:
// the repair ladder in progress and the last steps' outcomes (JSON, at
// most MaxRepairRecord bytes). A new leader reads it to go on.
const RepairAnnotation = "vmss-autoscaler.io/repair"

// MaxRepairRecord bounds RepairAnnotation's value (the chart's admission
// policy refuses a longer one).
const MaxRepairRecord = 4096

// ErrNotCordoned: the node is not cordoned by this autoscaler's health
// handling.
var ErrNotCordoned = errors.New("the node is not cordoned by vmss-autoscaler's health handling")

// HealthCordonPrefix begins the reason of a health cordon ("health/<rule>"
// in CordonedAnnotation): the only cordons whose nodes a repair ladder
// may write (the chart's admission policy holds the same).
const HealthCordonPrefix = "health/"

// PreflightAgain sends a node through preflight again: the preflight
// taint added (unless one with its key is there), the preflight label
// set to Value (pending), AgainAnnotation set to At.
type PreflightAgain struct {
	Taint           apiv1.Taint
	Label, Value    string
	AgainAnnotation string
	At              time.Time
}

// UpdateRepair implements NodeActions.
func (k *KubeNodeActions) UpdateRepair(ctx context.Context, node string, change func(string) string, again *PreflightAgain) error {
	var refused error
	err := k.updateNode(ctx, node, func(n *apiv1.Node) bool {
		var changed bool
		changed, refused = ChangeRepair(n, change, again)
		return changed
	})
	if err == nil {
		err = refused
	}
	if err != nil {
		return fmt.Errorf("writing the repair record of node %s: %w", node, err)
	}
	return nil
}

// ChangeRepair makes UpdateRepair's change on n (a copy the caller
// writes back): whether it changed n, or why it may not.
func ChangeRepair(n *apiv1.Node, change func(string) string, again *PreflightAgain) (bool, error) {
	if why, ours := CordonedBy(n); !ours || !strings.HasPrefix(why, HealthCordonPrefix) {
		return false, ErrNotCordoned
	}
	old := n.Annotations[RepairAnnotation]
	rec := change(old)
	if len(rec) > MaxRepairRecord {
		return false, fmt.Errorf("repair record of %d bytes, over %d", len(rec), MaxRepairRecord)
	}
	changed := rec != old
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	if rec == "" {
		delete(n.Annotations, RepairAnnotation)
	} else {
		n.Annotations[RepairAnnotation] = rec
	}
	if again != nil {
		changed = applyPreflightAgain(n, again) || changed
	}
	return changed, nil
}

// applyPreflightAgain changes n as again says; whether it changed.
func applyPreflightAgain(n *apiv1.Node, again *PreflightAgain) bool {
	changed := false
	if !slices.ContainsFunc(n.Spec.Taints, func(t apiv1.Taint) bool { return t.Key == again.Taint.Key }) {
		n.Spec.Taints = append(n.Spec.Taints, again.Taint)
		changed = true
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	if n.Labels[again.Label] != again.Value {
		n.Labels[again.Label] = again.Value
		changed = true
	}
	at := again.At.UTC().Format(time.RFC3339)
	if n.Annotations[again.AgainAnnotation] != at {
		n.Annotations[again.AgainAnnotation] = at
		changed = true
	}
	return changed
}

// Evict implements NodeActions.
func (k *KubeNodeActions) Evict(ctx context.Context, pod *apiv1.Pod, grace int64) error {
	err := k.Client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: &grace},
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
