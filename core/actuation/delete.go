package actuation

import (
	"context"
	"fmt"
	"maps"
	"slices"

	apiv1 "k8s.io/api/core/v1"

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

// DeleteByGroup deletes machines with one DeleteNodes per group, groups in
// name order, and hands each group's items and outcome to done. items are
// what the caller tracks (a removal, a node, a provider ID); providerID
// names each one's machine. A group missing from groups fails with an
// error naming it, and its machines are left alone.
func DeleteByGroup[T any](ctx context.Context, groups map[string]cloudprovider.NodeGroup, batch map[string][]T,
	providerID func(T) string, done func(group string, items []T, err error)) {
	for _, id := range slices.Sorted(maps.Keys(batch)) {
		items := batch[id]
		if len(items) == 0 {
			continue
		}
		g, ok := groups[id]
		if !ok {
			done(id, items, fmt.Errorf("deleting %d machines: node group %s is gone", len(items), id))
			continue
		}
		pids := make([]string, 0, len(items))
		for _, it := range items {
			pids = append(pids, providerID(it))
		}
		var err error
		if err = g.DeleteNodes(ctx, pids); err != nil {
			err = fmt.Errorf("deleting %d machines of node group %s: %w", len(pids), id, err)
		}
		done(id, items, err)
	}
}

// ProviderIDOf is the providerID of a node, for DeleteByGroup.
func ProviderIDOf(n *apiv1.Node) string { return n.Spec.ProviderID }

// Same is the identity, for DeleteByGroup over provider IDs.
func Same(s string) string { return s }
