package armsim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

const (
	// updateRetryInterval is how long a delayed node update that failed
	// (other than for a conflict or a node gone) waits before it is tried
	// again.
	updateRetryInterval = 2 * time.Second
	// conflictRetries is how many times an update is read and made again at
	// once after a conflict.
	conflictRetries = 5
)

// errReplaced is wrapped by errors about a node deleted and registered
// again under the same name since the update was scheduled.
var errReplaced = errors.New("node replaced by another of the same name")

// nodeChange is a change to a registered node made some time after it
// registered.
type nodeChange struct {
	node   string    // node name
	uid    types.UID // the node registered; another node by its name is left alone ("": any)
	what   string    // for logs
	status bool      // the change is to the node's status
	// apply changes the node and reports whether it changed anything.
	apply func(*v1.Node) bool
}

// delayedUpdate is a pending nodeChange: its timer, and the ctx watch that
// stops the timer when the registering ctx ends.
type delayedUpdate struct {
	timer   clock.Timer
	stopCtx func() bool
}

// scheduleUpdates schedules what happens to node after it registered: the
// device plugin advertising the VM's GPUs and the network agent removing
// the startup taints.
func (h *KubeNodeHook) scheduleUpdates(ctx context.Context, vm VM, node *v1.Node) {
	r := h.Realism
	if r.DevicePluginDelay > 0 && vm.SKU.GPUs > 0 {
		gpus := *resource.NewQuantity(int64(vm.SKU.GPUs), resource.DecimalSI)
		healthy := *resource.NewQuantity(h.allocatableGPUs(vm, node.Name), resource.DecimalSI)
		h.after(ctx, r.DevicePluginDelay, nodeChange{
			node: node.Name, uid: node.UID, what: "advertise GPUs", status: true,
			apply: func(n *v1.Node) bool { return advertise(n, GPUResource, gpus, healthy) },
		})
	}
	if r.StartupTaintDelay > 0 && len(r.StartupTaints) > 0 {
		taints := slices.Clone(r.StartupTaints)
		h.after(ctx, r.StartupTaintDelay, nodeChange{
			node: node.Name, uid: node.UID, what: "remove startup taints",
			apply: func(n *v1.Node) bool { return removeTaints(n, taints) },
		})
	}
}

// after makes c in d, unless ctx ends or the node's VM is deleted first.
func (h *KubeNodeHook) after(ctx context.Context, d time.Duration, c nodeChange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	u := &delayedUpdate{}
	u.timer = h.clock().AfterFunc(d, func() {
		// A fake clock runs this inside Step, holding its lock: work elsewhere.
		h.running.Add(1)
		go func() {
			defer h.running.Done()
			h.fire(ctx, u, c)
		}()
	})
	u.stopCtx = context.AfterFunc(ctx, func() {
		if h.forget(c.node, u) {
			u.timer.Stop()
		}
	})
	if h.pending == nil {
		h.pending = map[string][]*delayedUpdate{}
	}
	h.pending[c.node] = append(h.pending[c.node], u)
}

// fire makes a change whose time has come, retrying it later if it failed
// for any reason but the node being gone.
func (h *KubeNodeHook) fire(ctx context.Context, u *delayedUpdate, c nodeChange) {
	if !h.forget(c.node, u) || ctx.Err() != nil {
		return // cancelled meanwhile
	}
	err := h.change(ctx, c)
	switch {
	case err == nil:
		klog.V(2).InfoS("Updated node", "node", c.node, "change", c.what)
	case apierrors.IsNotFound(err) || errors.Is(err, errReplaced):
		klog.V(2).InfoS("Node gone before its update; nothing to do", "node", c.node, "change", c.what, "err", err)
	case ctx.Err() != nil:
	default:
		klog.ErrorS(err, "Updating node failed; retrying", "node", c.node, "change", c.what, "after", updateRetryInterval)
		h.after(ctx, updateRetryInterval, c)
	}
}

// change reads the node and makes c, reading again after a conflict.
func (h *KubeNodeHook) change(ctx context.Context, c nodeChange) error {
	nodes := h.Client.CoreV1().Nodes()
	for attempt := 0; ; attempt++ {
		node, err := nodes.Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s to %s: %w", c.node, c.what, err)
		}
		if c.uid != "" && node.UID != c.uid {
			return fmt.Errorf("node %s has UID %s, not %s: %w", c.node, node.UID, c.uid, errReplaced)
		}
		if !c.apply(node) {
			return nil
		}
		// Update, not Patch: it carries the resourceVersion, so a taint
		// another actor added or removed meanwhile is never overwritten, and
		// it never creates a node that was deleted.
		if c.status {
			_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		} else {
			_, err = nodes.Update(ctx, node, metav1.UpdateOptions{})
		}
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == conflictRetries {
			return fmt.Errorf("updating node %s to %s: %w", c.node, c.what, err)
		}
	}
}

// forget removes u from the pending updates, reporting whether it was
// there; the first of firing and cancelling to forget u wins. It releases
// u's ctx watch.
func (h *KubeNodeHook) forget(node string, u *delayedUpdate) bool {
	h.mu.Lock()
	i := slices.Index(h.pending[node], u)
	if i >= 0 {
		h.pending[node] = slices.Delete(h.pending[node], i, i+1)
		if len(h.pending[node]) == 0 {
			delete(h.pending, node)
		}
	}
	h.mu.Unlock()
	if i < 0 {
		return false
	}
	u.stopCtx()
	return true
}

// cancel stops the node's pending updates and forgets its GPU fault.
func (h *KubeNodeHook) cancel(node string) {
	h.mu.Lock()
	updates := h.pending[node]
	delete(h.pending, node)
	delete(h.gpuFaults.dealt, node)
	h.mu.Unlock()
	for _, u := range updates {
		u.timer.Stop()
		u.stopCtx()
	}
}

// Wait blocks until every delayed update whose time has come has finished.
// It does not wait for updates still due: call it once their timers have
// fired (after stepping a fake clock, say) or after the registering ctx
// ended.
func (h *KubeNodeHook) Wait() { h.running.Wait() }

func (h *KubeNodeHook) clock() clock.WithDelayedExecution {
	if h.Clock != nil {
		return h.Clock
	}
	return clock.RealClock{}
}

// advertise sets the extended resource's capacity (every device) and
// allocatable (the healthy ones), as the kubelet does once a device plugin
// registers.
func advertise(node *v1.Node, name v1.ResourceName, capacity, allocatable resource.Quantity) bool {
	changed := false
	for _, s := range []struct {
		list *v1.ResourceList
		n    resource.Quantity
	}{{&node.Status.Capacity, capacity}, {&node.Status.Allocatable, allocatable}} {
		if *s.list == nil {
			*s.list = v1.ResourceList{}
		}
		if have, ok := (*s.list)[name]; !ok || have.Cmp(s.n) != 0 {
			(*s.list)[name] = s.n
			changed = true
		}
	}
	return changed
}

// removeTaints removes the node's taints that match one of taints by key and
// effect.
func removeTaints(node *v1.Node, taints []v1.Taint) bool {
	before := len(node.Spec.Taints)
	node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t v1.Taint) bool {
		return slices.ContainsFunc(taints, func(r v1.Taint) bool { return r.MatchTaint(&t) })
	})
	return len(node.Spec.Taints) != before
}
