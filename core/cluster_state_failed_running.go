package core

import (
	"context"
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
)

// Event reasons for machines the cloud reports failed while they run.
const (
	// EventFailedVMRunning is on the node (on the status ConfigMap when the
	// machine has no node yet) when its VM turns Failed while it runs: a
	// failed extension, data-disk attach or model update. The machine and
	// its pods are left alone.
	EventFailedVMRunning = "FailedVMRunning"
	// EventFailedVMRecovered is on the node when its VM runs with no
	// failure again (a repaired model).
	EventFailedVMRecovered = "FailedVMRecovered"
)

// reportFailedRunning tells of the machines the cloud reports failed while
// they run: an event when one turns failed (or its code changes) and when
// it recovers, the failed_running_instances gauge by group and code, and a
// log line at default verbosity only when the set changes. Nothing is
// deleted, cordoned or drained for it: a failed extension does not stop a
// running VM, and its pods run on.
func (a *Autoscaler) reportFailedRunning(ctx context.Context, act clusterstate.Actions) {
	counts := map[[2]string]int{}
	newly := 0
	for _, f := range act.FailedRunning {
		counts[[2]string{f.Group, f.Error.Code}]++
		if !f.New {
			continue
		}
		newly++
		a.machineEvent(f, apiv1.EventTypeWarning, EventFailedVMRunning, fmt.Sprintf(
			"the VM of node group %s is Failed in Azure (%s: %s) but runs: kept with its pods, never deleted for it; "+
				"repair it (reimage, or apply the scale set's model again) or drain it by hand", f.Group, f.Error.Code, f.Error.Message))
	}
	for _, f := range act.FailedRunningRecovered {
		a.machineEvent(f, apiv1.EventTypeNormal, EventFailedVMRecovered,
			fmt.Sprintf("the VM of node group %s runs with no failure again (it was Failed: %s)", f.Group, f.Error.Code))
	}
	a.metrics.FailedRunning.Reset()
	for k, n := range counts {
		a.metrics.FailedRunning.WithLabelValues(k[0], k[1]).Set(float64(n))
	}
	if newly > 0 || len(act.FailedRunningRecovered) > 0 {
		klog.FromContext(ctx).Info("Machines failed in the cloud but running: kept", "count", len(act.FailedRunning),
			"new", newly, "recovered", len(act.FailedRunningRecovered))
	}
}

// machineEvent records an event on a machine's node, or on the status
// ConfigMap (naming the machine) when it has none.
func (a *Autoscaler) machineEvent(f clusterstate.FailedRunning, eventType, reason, msg string) {
	if a.rec == nil {
		return
	}
	if f.Node != nil {
		a.rec.Event(nodeRef(f.Node), eventType, reason, msg)
		return
	}
	a.groupEvent(eventType, reason, "machine "+f.ProviderID+": "+msg)
}
