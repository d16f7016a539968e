package core

import (
	"context"
	"fmt"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
)

// refreshCloud is the cloud-refresh phase: it brings the provider's cache
// up to date. A failed refresh fails the loop: nothing is decided on a
// cloud view that may be stale.
func (a *Autoscaler) refreshCloud(ctx context.Context, l *loop) error {
	if err := a.provider.Refresh(ctx); err != nil {
		return fmt.Errorf("refreshing cloud provider %s: %w", a.provider.Name(), err)
	}
	l.groups = a.provider.NodeGroups()
	l.byID = actuation.GroupsByID(l.groups)
	return nil
}
