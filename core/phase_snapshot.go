package core

import (
	"context"
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// takeSnapshot is the snapshot phase: it reads nodes and pods from the informer caches and brings the
// scheduler's view of them up to date.
func (a *Autoscaler) takeSnapshot(ctx context.Context, l *loop) error {
	nodes, err := a.listers.Nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing nodes from cache: %w", err)
	}
	pods, err := a.listers.Pods.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing pods from cache: %w", err)
	}
	snap, unbound, st := a.builder.Build(nodes, pods)
	l.nodes, l.snap, l.unbound = nodes, snap, unbound
	a.metrics.SnapshotRebuilt.Set(float64(st.RebuiltNodes))
	l.groupOf = make(map[string]cloudprovider.NodeGroup, len(nodes))
	l.nodesOf = make(map[string][]*apiv1.Node, len(l.groups))
	for _, n := range nodes {
		g, err := a.provider.NodeGroupForNode(n)
		if err != nil {
			return fmt.Errorf("finding node group of node %s: %w", n.Name, err)
		}
		if g != nil {
			l.groupOf[n.Name] = g
			l.nodesOf[g.ID()] = append(l.nodesOf[g.ID()], n)
		}
	}
	klog.FromContext(ctx).V(4).Info("Snapshot taken", "nodes", st.Nodes, "boundPods", st.Pods,
		"rebuiltNodes", st.RebuiltNodes, "unboundPods", len(unbound))
	return nil
}
