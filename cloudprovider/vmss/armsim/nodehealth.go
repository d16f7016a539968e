package armsim

import (
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// What a node's own monitors do to it once it runs, as the real components
// do it, for tests of what an autoscaler makes of a broken node:
//
//   - node-problem-detector and AKS's GPU health monitoring report a
//     problem as a Node condition of their own type (KernelDeadlock,
//     XIDErrors, GPUMissing, ...), True while it lasts, False once it
//     cleared (SetNodeCondition);
//   - the NVIDIA device plugin marks a GPU unhealthy (a critical XID) and
//     the kubelet then advertises fewer of them as allocatable, capacity
//     unchanged, the node Ready and no condition changed
//     (SetHealthyDevices); a GPU may be dead from the start, and the
//     plugin then never advertises it as allocatable (DegradeNextGPUs).
//
// kwok and these conditions: kwok (v0.8.0) posts a node's kubelet
// conditions by its stock Stages, node-initialize (while Ready is not
// True) and node-heartbeat-with-lease (every 10 to 20 minutes), whose
// statusTemplate renders Ready, MemoryPressure, DiskPressure, PIDPressure
// and NetworkUnavailable only. A statusTemplate becomes a patch of the
// status subresource without a patch type, and kwok sends a Node's (or a
// Pod's) untyped patch as a strategic merge patch
// (sigs.k8s.io/kwok/pkg/utils/lifecycle computePatch), in which
// status.conditions merge by type: a condition of any other type, with its
// status and times, survives every heartbeat. So a condition is set once,
// as node-problem-detector posts it on a change, and needs no re-asserting;
// TestKwokStagesKeepInjectedConditions holds kwok's own stage code to it.

// SetNodeCondition sets the node's condition of c's type, or adds it, as
// node-problem-detector does: reason, message and status are c's, the
// heartbeat time is now and the transition time is now when the status
// changed (or the condition is new), else it is kept (c's own times are
// not used). Clearing a problem is setting its condition False. The node is
// read and updated through its status, read again after a conflict (a
// kubelet's heartbeat, a cordon), so nothing else about it is overwritten.
// Any node by that name is changed, whoever registered it.
func (h *KubeNodeHook) SetNodeCondition(ctx context.Context, nodeName string, c v1.NodeCondition) error {
	if c.Type == "" {
		return fmt.Errorf("setting a condition on node %s: empty condition type", nodeName)
	}
	switch c.Status {
	case v1.ConditionTrue, v1.ConditionFalse, v1.ConditionUnknown:
	default:
		return fmt.Errorf("setting condition %s on node %s: status %q: want True, False or Unknown", c.Type, nodeName, c.Status)
	}
	err := h.change(ctx, nodeChange{
		node: nodeName, what: fmt.Sprintf("set condition %s=%s", c.Type, c.Status), status: true,
		apply: func(n *v1.Node) bool {
			setCondition(n, c, metav1.NewTime(h.clock().Now()))
			return true // the heartbeat time, at least
		},
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	if c.Status == v1.ConditionTrue {
		if h.problems == nil {
			h.problems = map[string]map[v1.NodeConditionType]bool{}
		}
		if h.problems[nodeName] == nil {
			h.problems[nodeName] = map[v1.NodeConditionType]bool{}
		}
		h.problems[nodeName][c.Type] = true
	} else {
		delete(h.problems[nodeName], c.Type)
	}
	h.mu.Unlock()
	klog.V(2).InfoS("Set node condition", "node", nodeName, "type", c.Type, "status", c.Status, "reason", c.Reason)
	return nil
}

// VMRepaired implements RepairWatcher as the node's own monitors would
// see a repair action end. The Node object stays through a restart, a
// reimage and a redeploy (the kubelet registers again under its name and
// finds it: it keeps its taints, labels and cordon; the kubelet's
// register-with-taints apply to a new Node only), so a node a repair
// brings back keeps whatever the autoscaler put on it before. When the VM
// is fixed, node-problem-detector reports each problem it had set False
// ("RepairedBy<Action>"), and a GPU the device plugin had found unhealthy
// is advertised again (allocatable back to capacity); when it is not, the
// problems stay True, as a monitor finds them again after the boot.
func (h *KubeNodeHook) VMRepaired(ctx context.Context, vm VM, action string, fixed bool) error {
	name := nodeName(vm)
	if !fixed {
		klog.V(2).InfoS("Repair left the node broken", "node", name, "action", action)
		return nil
	}
	h.mu.Lock()
	var types []v1.NodeConditionType
	for t := range h.problems[name] {
		types = append(types, t)
	}
	delete(h.gpuFaults.dealt, name)
	h.mu.Unlock()
	slices.Sort(types)
	reason := "RepairedBy" + strings.ToUpper(action[:1]) + action[1:]
	for _, t := range types {
		if err := h.SetNodeCondition(ctx, name, v1.NodeCondition{Type: t, Status: v1.ConditionFalse, Reason: reason,
			Message: fmt.Sprintf("the problem cleared after a %s", action)}); err != nil {
			return fmt.Errorf("clearing condition %s of node %s after a %s: %w", t, name, action, err)
		}
	}
	if vm.SKU.GPUs > 0 {
		if err := h.change(ctx, nodeChange{node: name, what: "advertise every GPU again", status: true,
			apply: func(n *v1.Node) bool {
				if _, ok := n.Status.Capacity[GPUResource]; !ok {
					return false // the device plugin has not registered yet
				}
				c := n.Status.Capacity[GPUResource]
				return setAllocatable(n, GPUResource, c.Value())
			}}); err != nil {
			return fmt.Errorf("advertising the GPUs of node %s after a %s: %w", name, action, err)
		}
	}
	klog.V(2).InfoS("Repair fixed the node", "node", name, "action", action, "conditionsCleared", len(types))
	return nil
}

// setCondition sets c on the node at now, as SetNodeCondition says.
func setCondition(n *v1.Node, c v1.NodeCondition, now metav1.Time) {
	c.LastHeartbeatTime = now
	c.LastTransitionTime = now
	for i := range n.Status.Conditions {
		old := &n.Status.Conditions[i]
		if old.Type != c.Type {
			continue
		}
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		*old = c
		return
	}
	n.Status.Conditions = append(n.Status.Conditions, c)
}

// SetHealthyDevices makes the node advertise n of the extended resource
// res as allocatable, its capacity unchanged, as the kubelet does when a
// device plugin reports some of its devices unhealthy (capacity counts
// every device, allocatable the healthy ones); n equal to the capacity is
// every device healthy again. The node must have res in its capacity (its
// device plugin has registered), and n may not exceed it.
func (h *KubeNodeHook) SetHealthyDevices(ctx context.Context, nodeName string, res v1.ResourceName, n int64) error {
	if n < 0 {
		return fmt.Errorf("setting healthy %s of node %s to %d: must not be negative", res, nodeName, n)
	}
	var refused error
	err := h.change(ctx, nodeChange{
		node: nodeName, what: fmt.Sprintf("set allocatable %s to %d", res, n), status: true,
		apply: func(node *v1.Node) bool {
			refused = nil
			capacity, ok := node.Status.Capacity[res]
			switch {
			case !ok:
				refused = fmt.Errorf("setting healthy %s of node %s to %d: the node has no %s capacity (its device plugin has not registered)", res, nodeName, n, res)
				return false
			case capacity.CmpInt64(n) < 0:
				refused = fmt.Errorf("setting healthy %s of node %s to %d: more than its capacity %s", res, nodeName, n, capacity.String())
				return false
			}
			return setAllocatable(node, res, n)
		},
	})
	if err != nil {
		return err
	}
	if refused != nil {
		return refused
	}
	klog.V(2).InfoS("Set healthy devices", "node", nodeName, "resource", res, "allocatable", n)
	return nil
}

// setAllocatable sets the node's allocatable res to n, reporting whether
// it changed.
func setAllocatable(node *v1.Node, res v1.ResourceName, n int64) bool {
	q := *resource.NewQuantity(n, resource.DecimalSI)
	if have, ok := node.Status.Allocatable[res]; ok && have.Cmp(q) == 0 {
		return false
	}
	if node.Status.Allocatable == nil {
		node.Status.Allocatable = v1.ResourceList{}
	}
	node.Status.Allocatable[res] = q
	return true
}

// gpuFaults are the GPUs dead from the start that DegradeNextGPUs armed,
// and those already dealt to nodes. Guarded by KubeNodeHook.mu.
type gpuFaults struct {
	// armed are, by lower-cased scale set, the healthy GPUs of each of
	// its next nodes, in registration order.
	armed map[string][]int64
	// dealt are the healthy GPUs of the nodes dealt a fault, by node name.
	dealt map[string]int64
}

// DegradeNextGPUs makes the next k nodes of the scale set that the hook
// registers (VMRunning, in the order it is called; a call for a VM dealt
// a fault already deals no other) advertise only healthy of their GPUs:
// when the device plugin registers, capacity is the VM size's GPUs and
// allocatable is healthy, as the kubelet reports a node with GPUs the
// plugin found unhealthy from the start. The node is otherwise as any
// other: Ready, no condition. Calls add up: k nodes more each. VMs without
// GPUs are not counted; healthy at or above the VM size's GPUs is no
// fault.
func (h *KubeNodeHook) DegradeNextGPUs(scaleSet string, k int, healthy int64) error {
	if k < 0 || healthy < 0 {
		return fmt.Errorf("degrading the next %d nodes of scale set %s to %d GPUs: counts must not be negative", k, scaleSet, healthy)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gpuFaults.armed == nil {
		h.gpuFaults.armed = map[string][]int64{}
	}
	key := strings.ToLower(scaleSet)
	for range k {
		h.gpuFaults.armed[key] = append(h.gpuFaults.armed[key], healthy)
	}
	return nil
}

// dealGPUFault deals the VM's node, about to register, the next GPU fault
// armed for its scale set, unless it was dealt one already. If the node
// registers with its GPUs (no device plugin delay), it sets their
// allocatable; otherwise the device plugin's advertisement does
// (allocatableGPUs).
func (h *KubeNodeHook) dealGPUFault(vm VM, node *v1.Node) {
	if vm.SKU.GPUs <= 0 {
		return
	}
	h.mu.Lock()
	healthy, dealt := h.gpuFaults.dealt[node.Name]
	key := strings.ToLower(vm.ScaleSet)
	if armed := h.gpuFaults.armed[key]; !dealt && len(armed) > 0 {
		healthy, dealt = armed[0], true
		if len(armed) == 1 {
			delete(h.gpuFaults.armed, key)
		} else {
			h.gpuFaults.armed[key] = armed[1:]
		}
		if h.gpuFaults.dealt == nil {
			h.gpuFaults.dealt = map[string]int64{}
		}
		h.gpuFaults.dealt[node.Name] = healthy
		klog.V(2).InfoS("Node registers with GPUs dead from the start", "node", node.Name, "scaleSet", vm.ScaleSet,
			"gpus", vm.SKU.GPUs, "healthy", healthy)
	}
	h.mu.Unlock()
	if _, ok := node.Status.Capacity[GPUResource]; dealt && ok {
		setAllocatable(node, GPUResource, min(healthy, int64(vm.SKU.GPUs)))
	}
}

// allocatableGPUs is how many of the VM's GPUs its device plugin
// advertises as allocatable: the VM size's, or fewer if it was dealt a
// fault.
func (h *KubeNodeHook) allocatableGPUs(vm VM, node string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if healthy, ok := h.gpuFaults.dealt[node]; ok {
		return min(healthy, int64(vm.SKU.GPUs))
	}
	return int64(vm.SKU.GPUs)
}
