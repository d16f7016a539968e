package vmss

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

var _ cloudprovider.Repairer = (*scaleSet)(nil)

// repairOp is a repair this process started on one machine.
type repairOp struct {
	status cloudprovider.RepairStatus
}

// CanRepair implements cloudprovider.Repairer: a scale set's VMs can be
// repaired in place, Uniform (the scale-set VM API) or Flexible (the
// Virtual Machines API).
func (g *scaleSet) CanRepair() bool { return true }

// Repair implements cloudprovider.Repairer. A Uniform scale set's VM:
// POST .../virtualMachineScaleSets/{set}/virtualMachines/{instanceId}/
// restart, /reimage or /redeploy (the Virtual Machine Scale Set VMs REST
// API), charged by the Compute RP to the VM's "Update VMSS VMs" policy (4
// a minute, a bucket of 12, per VM: "Compute throttling limits"). A
// Flexible scale set's VM is a virtual machine of its own: POST
// .../virtualMachines/{vmName}/restart, /reimage or /redeploy (the
// Virtual Machines REST API), charged to that VM's "Update VM" policy, of
// the same numbers. The machine must be the group's, in its last VM list
// and neither deleting nor coming; the write guards are checked first (a
// fenced or paused process asks nothing). The operation is followed in
// the background like a scale-up's (a poll error is not a failure, up to
// opDeadline), and RepairState says how it ended.
func (g *scaleSet) Repair(ctx context.Context, providerID string, action cloudprovider.RepairAction) error {
	key := cloudprovider.ProviderIDKey(providerID)
	g.mu.Lock()
	var found *cloudprovider.Instance
	for i := range g.instances {
		if cloudprovider.ProviderIDKey(g.instances[i].ProviderID) == key {
			found = &g.instances[i]
			break
		}
	}
	switch {
	case !g.ownsLocked(key, found != nil) || isPlaceholder(key):
		g.mu.Unlock()
		return fmt.Errorf("repairing %s: not a machine of scale set %s: %w", providerID, g.ID(), cloudprovider.ErrNotSent)
	case found == nil:
		g.mu.Unlock()
		return fmt.Errorf("repairing %s in scale set %s: not in its last VM list: %w", providerID, g.ID(), cloudprovider.ErrNotSent)
	case found.State != cloudprovider.InstanceRunning || g.deleting[key]:
		g.mu.Unlock()
		return fmt.Errorf("repairing %s in scale set %s: the machine is %s: %w", providerID, g.ID(), found.State, cloudprovider.ErrNotSent)
	}
	if r := g.repairs[key]; r != nil && !r.status.Done {
		g.mu.Unlock()
		return fmt.Errorf("repairing %s in scale set %s: its %s started at %s is still running: %w", providerID, g.ID(), r.status.Action,
			r.status.Started.UTC().Format("15:04:05"), cloudprovider.ErrNotSent)
	}
	// Taken before sending, so a second call cannot send another.
	r := &repairOp{status: cloudprovider.RepairStatus{Action: action, Started: g.p.cfg.Clock.Now()}}
	if g.repairs == nil {
		g.repairs = map[string]*repairOp{}
	}
	g.repairs[key] = r
	g.mu.Unlock()
	instanceID := lastSegment(providerID)
	follow, err := func() (func(string, int, func(opResult)), error) {
		if err := cloudprovider.CheckWrite(ctx); err != nil {
			return nil, err
		}
		return g.beginRepair(ctx, instanceID, action)
	}()
	if err != nil {
		err = classify(err)
		g.mu.Lock()
		if cloudprovider.NotSent(err) || isDefiniteRefusal(err) {
			delete(g.repairs, key) // nothing runs
		} else {
			// Unclear (a timeout, a 5xx): the action may run; the
			// caller treats it as running until its step times out.
			r.status.Done, r.status.Unknown, r.status.Err = true, true, fmt.Errorf("%s of %s: unclear answer: %w", action, instanceID, err)
			g.mu.Unlock()
			return fmt.Errorf("repairing %s (%s) in scale set %s: %w: %w", providerID, action, g.ID(), cloudprovider.ErrOutcomeUnknown, err)
		}
		g.mu.Unlock()
		return fmt.Errorf("repairing %s (%s) in scale set %s: %w", providerID, action, g.ID(), err)
	}
	g.mu.Lock()
	g.opSeq++
	op := g.opSeq
	g.mu.Unlock()
	klog.FromContext(ctx).Info("Repairing a machine in place", "scaleSet", g.ID(), "instance", instanceID, "action", action)
	follow("repair-"+string(action), op, func(res opResult) {
		g.mu.Lock()
		defer g.mu.Unlock()
		r.status.Done = true
		switch res.outcome {
		case opFailed:
			r.status.Err = fmt.Errorf("%s of %s failed: %s: %s", action, instanceID, res.code, res.message)
		case opPreempted:
			r.status.Err = fmt.Errorf("%s of %s was preempted: %s", action, instanceID, res.message)
		case opUnknown:
			r.status.Unknown = true
			r.status.Err = fmt.Errorf("%s of %s: outcome unknown: %s", action, instanceID, res.why)
		}
	})
	return nil
}

// beginRepair sends the action's POST and returns what starts following
// its operation (watch, for the poller's type).
func (g *scaleSet) beginRepair(ctx context.Context, instanceID string, action cloudprovider.RepairAction) (func(kind string, op int, done func(opResult)), error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	if g.flexible {
		return g.beginFlexibleRepair(ctx, instanceID, action)
	}
	switch action {
	case cloudprovider.RepairReboot:
		p, err := g.p.vms.BeginRestart(ctx, g.rg, g.name, instanceID, nil)
		return watcher(g, p), err
	case cloudprovider.RepairReimage:
		p, err := g.p.vms.BeginReimage(ctx, g.rg, g.name, instanceID, nil)
		return watcher(g, p), err
	case cloudprovider.RepairRedeploy:
		p, err := g.p.vms.BeginRedeploy(ctx, g.rg, g.name, instanceID, nil)
		return watcher(g, p), err
	}
	return nil, fmt.Errorf("unknown repair action %q: %w", action, cloudprovider.ErrNotSent)
}

// beginFlexibleRepair is beginRepair for a Flexible scale set's VM,
// named by instanceID (its VM name), in the scale set's resource group.
func (g *scaleSet) beginFlexibleRepair(ctx context.Context, vmName string, action cloudprovider.RepairAction) (func(kind string, op int, done func(opResult)), error) {
	vms := g.p.virtualMachines
	switch action {
	case cloudprovider.RepairReboot:
		p, err := vms.BeginRestart(ctx, g.rg, vmName, nil)
		return watcher(g, p), err
	case cloudprovider.RepairReimage:
		p, err := vms.BeginReimage(ctx, g.rg, vmName, nil)
		return watcher(g, p), err
	case cloudprovider.RepairRedeploy:
		p, err := vms.BeginRedeploy(ctx, g.rg, vmName, nil)
		return watcher(g, p), err
	}
	return nil, fmt.Errorf("unknown repair action %q: %w", action, cloudprovider.ErrNotSent)
}

// watcher binds watch to a poller.
func watcher[T any](g *scaleSet, p *runtime.Poller[T]) func(kind string, op int, done func(opResult)) {
	return func(kind string, op int, done func(opResult)) { watch(g, p, kind, op, done) }
}

// RepairState implements cloudprovider.Repairer.
func (g *scaleSet) RepairState(providerID string) (cloudprovider.RepairStatus, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.repairs[cloudprovider.ProviderIDKey(providerID)]
	if !ok {
		return cloudprovider.RepairStatus{}, false
	}
	return r.status, true
}

// isDefiniteRefusal says ARM refused the request (a 4xx other than a
// timeout): nothing was started.
func isDefiniteRefusal(err error) bool {
	var re *azcore.ResponseError
	return errors.As(err, &re) && re.StatusCode >= 400 && re.StatusCode < 500 && re.StatusCode != http.StatusRequestTimeout
}
