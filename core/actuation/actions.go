// Package actuation holds the loop's writes to nodes and machines: taints,
// cordons and evictions through the Kubernetes API, machine deletions
// batched one DeleteNodes per group, and scale-down's drains, which run in
// the background between loops. Every path that deletes or cordons goes
// through here.
package actuation

import (
	"context"
	"fmt"

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
	// Cordon marks a node unschedulable.
	Cordon(ctx context.Context, node string) error
	// Uncordon marks a node schedulable again.
	Uncordon(ctx context.Context, node string) error
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

// Cordon implements NodeActions.
func (k *KubeNodeActions) Cordon(ctx context.Context, node string) error {
	if err := k.setUnschedulable(ctx, node, true); err != nil {
		return fmt.Errorf("cordoning node %s: %w", node, err)
	}
	return nil
}

// Uncordon implements NodeActions.
func (k *KubeNodeActions) Uncordon(ctx context.Context, node string) error {
	if err := k.setUnschedulable(ctx, node, false); err != nil {
		return fmt.Errorf("uncordoning node %s: %w", node, err)
	}
	return nil
}

func (k *KubeNodeActions) setUnschedulable(ctx context.Context, node string, v bool) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil || n.Spec.Unschedulable == v {
			return err
		}
		n.Spec.Unschedulable = v
		_, err = k.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
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
