package actuation

import (
	"context"
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// GroupsByID indexes node groups by ID. The loop fills it once, after the
// cloud refresh, and every phase reads it.
func GroupsByID(groups []cloudprovider.NodeGroup) map[string]cloudprovider.NodeGroup {
	out := make(map[string]cloudprovider.NodeGroup, len(groups))
	for _, g := range groups {
		out[g.ID()] = g
	}
	return out
}

// NodeNameIndex is the pod informer's index by spec.nodeName, which
// KubePods reads. AddNodeNameIndex adds it before the informer starts.
const NodeNameIndex = "spec.nodeName"

// AddNodeNameIndex indexes a pod informer by the node its pods are bound to.
func AddNodeNameIndex(pods cache.SharedIndexInformer) error {
	err := pods.AddIndexers(cache.Indexers{NodeNameIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*apiv1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}})
	if err != nil {
		return fmt.Errorf("indexing pods by node: %w", err)
	}
	return nil
}

// KubePods implements PodReader: the informer's index by node, and a list
// of the pods bound to the node from the API server (a field selector the
// API server serves from its watch cache, after waiting for it to catch up
// with etcd: a consistent read that costs no scan of every pod).
type KubePods struct {
	Client  kubernetes.Interface
	Indexer cache.Indexer // indexed by NodeNameIndex
}

// Cached implements PodReader.
func (k KubePods) Cached(node string) []*apiv1.Pod {
	objs, err := k.Indexer.ByIndex(NodeNameIndex, node)
	if err != nil {
		return nil // no index: the fresh read decides
	}
	out := make([]*apiv1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*apiv1.Pod); ok {
			out = append(out, p)
		}
	}
	return out
}

// Fresh implements PodReader.
func (k KubePods) Fresh(ctx context.Context, node string) ([]*apiv1.Pod, error) {
	list, err := k.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	out := make([]*apiv1.Pod, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}
