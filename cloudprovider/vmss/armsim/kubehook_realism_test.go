package armsim

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
)

var ciliumTaint = v1.Taint{Key: "node.cilium.io/agent-not-ready", Value: "true", Effect: v1.TaintEffectNoSchedule}

// hookEnv is a KubeNodeHook on a fake clientset that assigns UIDs as an API
// server does, timed by a fake clock.
type hookEnv struct {
	hook   *KubeNodeHook
	client *fake.Clientset
	clock  *testingclock.FakeClock
}

func newHookEnv(t *testing.T, r Realism) *hookEnv {
	t.Helper()
	client := fake.NewClientset()
	var uids atomic.Int64
	client.PrependReactor("create", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		a.(k8stesting.CreateAction).GetObject().(*v1.Node).UID = types.UID(fmt.Sprintf("uid-%d", uids.Add(1)))
		return false, nil, nil
	})
	fc := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	return &hookEnv{hook: &KubeNodeHook{Client: client, Realism: r, Clock: fc}, client: client, clock: fc}
}

// step moves the clock and waits for the updates that came due.
func (e *hookEnv) step(d time.Duration) {
	e.clock.Step(d)
	e.hook.Wait()
}

// node returns the node, or nil if it does not exist.
func (e *hookEnv) node(t *testing.T, name string) *v1.Node {
	t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("Get node %s: %v", name, err)
	}
	return n
}

// gpuVM is an H100 VM in a node resource group named as AKS names them.
func gpuVM(t *testing.T) VM {
	t.Helper()
	return VM{
		ResourceGroup: "MC_rg_cluster_eastus", ScaleSet: "aks-h100-12345678-vmss", InstanceID: "4",
		ComputerName: "aks-h100-12345678-vmss000004",
		ProviderID: "azure:///subscriptions/s/resourceGroups/MC_rg_cluster_eastus/providers/Microsoft.Compute/" +
			"virtualMachineScaleSets/aks-h100-12345678-vmss/virtualMachines/4",
		SKU: skuByName(t, "Standard_ND96isr_H100_v5"), Location: "eastus", Zone: "1",
	}
}

func gpus(n *v1.Node) (capacity, allocatable string) {
	c, okC := n.Status.Capacity[GPUResource]
	a, okA := n.Status.Allocatable[GPUResource]
	capacity, allocatable = "none", "none"
	if okC {
		capacity = c.String()
	}
	if okA {
		allocatable = a.String()
	}
	return capacity, allocatable
}

func hasTaint(n *v1.Node, taint v1.Taint) bool {
	for _, t := range n.Spec.Taints {
		if t.MatchTaint(&taint) {
			return true
		}
	}
	return false
}

// TestKubeNodeHookRealisticRegistration registers a GPU node as AKS does
// and follows it over time: GPUs and the startup taint change at their
// delays, nothing else changes.
func TestKubeNodeHookRealisticRegistration(t *testing.T) {
	r := DefaultRealism()
	r.StartupTaints = []v1.Taint{ciliumTaint}
	env := newHookEnv(t, r)
	vm := gpuVM(t)
	if err := env.hook.VMRunning(t.Context(), vm); err != nil {
		t.Fatalf("VMRunning: %v", err)
	}
	name := "aks-h100-12345678-vmss000004"
	n := env.node(t, name)
	if n == nil {
		t.Fatalf("no node %s", name)
	}

	// At registration: provider ID as cloud-provider-azure writes it,
	// kubelet labels, allocatable below capacity.
	wantID := "azure:///subscriptions/s/resourceGroups/mc_rg_cluster_eastus/providers/Microsoft.Compute/" +
		"virtualMachineScaleSets/aks-h100-12345678-vmss/virtualMachines/4"
	if n.Spec.ProviderID != wantID {
		t.Errorf("providerID %s, want %s", n.Spec.ProviderID, wantID)
	}
	if n.Spec.ProviderID == vm.ProviderID || !strings.EqualFold(n.Spec.ProviderID, vm.ProviderID) {
		t.Errorf("providerID %s should differ from ARM's %s in case only", n.Spec.ProviderID, vm.ProviderID)
	}
	for k, want := range map[string]string{
		"kubernetes.azure.com/agentpool":   "aks-h100-12345678-vmss",
		"kubernetes.azure.com/cluster":     "MC_rg_cluster_eastus",
		"kubernetes.azure.com/accelerator": "nvidia",
		"node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5",
		"topology.kubernetes.io/zone":      "eastus-1",
		"topology.kubernetes.io/region":    "eastus",
		"vmss-autoscaler.io/node-group":    "aks-h100-12345678-vmss",
	} {
		if got := n.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	for res, want := range map[v1.ResourceName][2]string{
		v1.ResourceCPU:              {"96", "94940m"},
		v1.ResourceMemory:           {"1900Gi", "1940450Mi"},
		v1.ResourcePods:             {"250", "250"},
		v1.ResourceEphemeralStorage: {"129886128Ki", "119703055367"},
	} {
		c, a := n.Status.Capacity[res], n.Status.Allocatable[res]
		if c.Cmp(resource.MustParse(want[0])) != 0 || a.Cmp(resource.MustParse(want[1])) != 0 {
			t.Errorf("%s capacity %s allocatable %s, want %s and %s", res, c.String(), a.String(), want[0], want[1])
		}
	}

	steps := []struct {
		by          time.Duration
		wantGPUs    string // capacity and allocatable
		wantStartup bool
	}{
		{0, "none", true},
		{DefaultStartupTaintDelay - time.Nanosecond, "none", true},
		{time.Nanosecond, "none", false}, // the agent runs: taint gone
		{DefaultDevicePluginDelay - DefaultStartupTaintDelay - time.Nanosecond, "none", false},
		{time.Nanosecond, "8", false}, // the device plugin registers
		{time.Hour, "8", false},
	}
	var at time.Duration
	for _, s := range steps {
		env.step(s.by)
		at += s.by
		n := env.node(t, name)
		if c, a := gpus(n); c != s.wantGPUs || a != s.wantGPUs {
			t.Errorf("at %v: GPUs capacity %s allocatable %s, want %s", at, c, a, s.wantGPUs)
		}
		if got := hasTaint(n, ciliumTaint); got != s.wantStartup {
			t.Errorf("at %v: startup taint present %v, want %v", at, got, s.wantStartup)
		}
		if c := n.Status.Allocatable[v1.ResourceCPU]; c.Cmp(resource.MustParse("94940m")) != 0 {
			t.Errorf("at %v: allocatable CPU %s, want 94940m", at, c.String())
		}
	}
	if w := env.clock.Waiters(); w != 0 {
		t.Errorf("%d timers left after every update was made", w)
	}
}

// TestKubeNodeHookGPUsAtOnce checks that a zero device-plugin delay, or a
// VM without GPUs, schedules nothing.
func TestKubeNodeHookGPUsAtOnce(t *testing.T) {
	cpu := gpuVM(t)
	cpu.SKU = skuByName(t, "Standard_D16s_v5")
	noDelay := DefaultRealism()
	noDelay.DevicePluginDelay = 0
	tests := []struct {
		name     string
		realism  Realism
		vm       VM
		wantGPUs string
	}{
		{"zero delay: GPUs at registration", noDelay, gpuVM(t), "8"},
		{"no GPUs: nothing to advertise", DefaultRealism(), cpu, "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newHookEnv(t, tt.realism)
			if err := env.hook.VMRunning(t.Context(), tt.vm); err != nil {
				t.Fatalf("VMRunning: %v", err)
			}
			if w := env.clock.Waiters(); w != 0 {
				t.Errorf("%d timers scheduled, want none", w)
			}
			if c, a := gpus(env.node(t, nodeName(tt.vm))); c != tt.wantGPUs || a != tt.wantGPUs {
				t.Errorf("GPUs capacity %s allocatable %s, want %s", c, a, tt.wantGPUs)
			}
		})
	}
}

// TestKubeNodeHookDelayedUpdateCancelled covers a node's delayed update
// meeting a node that is gone, replaced, or a hook whose ctx ended: the
// update is dropped, nothing is recreated and no retry is left behind.
func TestKubeNodeHookDelayedUpdateCancelled(t *testing.T) {
	vm := gpuVM(t)
	name := nodeName(vm)
	tests := []struct {
		name string
		// before runs between registration and the device plugin's delay.
		before   func(t *testing.T, env *hookEnv, cancel context.CancelFunc)
		wantNode bool
	}{
		{"VM deleted", func(t *testing.T, env *hookEnv, _ context.CancelFunc) {
			if err := env.hook.VMDeleted(t.Context(), vm); err != nil {
				t.Fatalf("VMDeleted: %v", err)
			}
			if w := env.clock.Waiters(); w != 0 {
				t.Errorf("VMDeleted left %d timers", w)
			}
		}, false},
		{"node deleted by someone else", func(t *testing.T, env *hookEnv, _ context.CancelFunc) {
			if err := env.client.CoreV1().Nodes().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("Delete: %v", err)
			}
		}, false},
		{"node replaced by one of the same name", func(t *testing.T, env *hookEnv, _ context.CancelFunc) {
			if err := env.client.CoreV1().Nodes().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if _, err := env.client.CoreV1().Nodes().Create(t.Context(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
				t.Fatalf("Create: %v", err)
			}
		}, true},
		{"ctx ended", func(_ *testing.T, _ *hookEnv, cancel context.CancelFunc) { cancel() }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newHookEnv(t, DefaultRealism())
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if err := env.hook.VMRunning(ctx, vm); err != nil {
				t.Fatalf("VMRunning: %v", err)
			}
			tt.before(t, env, cancel)
			env.step(DefaultDevicePluginDelay)
			n := env.node(t, name)
			if (n != nil) != tt.wantNode {
				t.Fatalf("node exists %v, want %v", n != nil, tt.wantNode)
			}
			if n != nil {
				if c, a := gpus(n); c != "none" || a != "none" {
					t.Errorf("GPUs capacity %s allocatable %s, want none", c, a)
				}
			}
			if w := env.clock.Waiters(); w != 0 {
				t.Errorf("%d timers left (a retry?)", w)
			}
		})
	}
}

// TestKubeNodeHookNoTimerAfterCtx checks that a hook called with a ctx that
// has ended schedules nothing.
func TestKubeNodeHookNoTimerAfterCtx(t *testing.T) {
	env := newHookEnv(t, DefaultRealism())
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := env.hook.VMRunning(ctx, gpuVM(t)); err != nil {
		t.Fatalf("VMRunning: %v", err)
	}
	if w := env.clock.Waiters(); w != 0 {
		t.Fatalf("%d timers scheduled with an ended ctx", w)
	}
}

// TestKubeNodeHookUpdateRetries fails the device plugin's status update and
// checks that it is made again: at once after a conflict, after
// updateRetryInterval after another error.
func TestKubeNodeHookUpdateRetries(t *testing.T) {
	nodes := schema.GroupResource{Resource: "nodes"}
	tests := []struct {
		name      string
		err       error
		wantAfter time.Duration // extra time before the GPUs show
	}{
		{"conflict: read again at once", apierrors.NewConflict(nodes, "n", fmt.Errorf("changed")), 0},
		{"server error: retried later", apierrors.NewInternalError(fmt.Errorf("etcd down")), updateRetryInterval},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newHookEnv(t, DefaultRealism())
			vm := gpuVM(t)
			if err := env.hook.VMRunning(t.Context(), vm); err != nil {
				t.Fatalf("VMRunning: %v", err)
			}
			var failed atomic.Int32
			env.client.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() == "status" && failed.Add(1) == 1 {
					return true, nil, tt.err
				}
				return false, nil, nil
			})
			env.step(DefaultDevicePluginDelay)
			want := "8"
			if tt.wantAfter > 0 {
				want = "none"
			}
			if c, _ := gpus(env.node(t, nodeName(vm))); c != want {
				t.Fatalf("after the delay: GPUs %s, want %s", c, want)
			}
			if tt.wantAfter > 0 {
				env.step(tt.wantAfter - time.Nanosecond)
				if c, _ := gpus(env.node(t, nodeName(vm))); c != "none" {
					t.Fatalf("GPUs %s before the retry", c)
				}
				env.step(time.Nanosecond)
				if c, _ := gpus(env.node(t, nodeName(vm))); c != "8" {
					t.Fatalf("after the retry: GPUs %s, want 8", c)
				}
			}
			if got := failed.Load(); got != 2 {
				t.Errorf("%d status updates, want 2 (one failed, one made)", got)
			}
		})
	}
}

// TestKubeNodeHookRetryAfterStatusFailure checks that VMRunning retried
// after the status could not be set sets it and schedules the device
// plugin, as the first call would have.
func TestKubeNodeHookRetryAfterStatusFailure(t *testing.T) {
	env := newHookEnv(t, DefaultRealism())
	var calls atomic.Int32
	env.client.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" && calls.Add(1) == 1 {
			return true, nil, apierrors.NewInternalError(fmt.Errorf("boom"))
		}
		return false, nil, nil
	})
	// An API server drops the status on create.
	env.client.PrependReactor("create", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		a.(k8stesting.CreateAction).GetObject().(*v1.Node).Status = v1.NodeStatus{}
		return false, nil, nil
	})
	vm := gpuVM(t)
	if err := env.hook.VMRunning(t.Context(), vm); err == nil {
		t.Fatalf("VMRunning succeeded though setting the status failed")
	}
	if w := env.clock.Waiters(); w != 0 {
		t.Fatalf("%d timers scheduled by a failed registration", w)
	}
	if err := env.hook.VMRunning(t.Context(), vm); err != nil {
		t.Fatalf("VMRunning again: %v", err)
	}
	n := env.node(t, nodeName(vm))
	if a := n.Status.Allocatable[v1.ResourceMemory]; a.Cmp(resource.MustParse("1940450Mi")) != 0 {
		t.Fatalf("allocatable memory %s after the retry, want 1940450Mi", a.String())
	}
	env.step(DefaultDevicePluginDelay)
	if c, _ := gpus(env.node(t, nodeName(vm))); c != "8" {
		t.Fatalf("GPUs %s after the device plugin's delay, want 8", c)
	}
}

// TestRealisticFleet runs the simulator with a realistic hook on one fake
// clock: a GPU scale set in an AKS-style node resource group scales out,
// VMs boot at jittered times, each node registers without GPUs and gets
// them DefaultDevicePluginDelay later, and every node's providerID is the
// ID ARM lists for its VM with the resource group lower-cased.
func TestRealisticFleet(t *testing.T) {
	const rg, set, n = "MC_rg_cluster_eastus", "aks-h100-vmss", 6
	client := fake.NewClientset()
	hook := &KubeNodeHook{Client: client, Realism: DefaultRealism()}
	env := newTestEnv(t, Options{BootDelay: time.Minute, BootJitter: 20 * time.Second, Seed: 3, Hook: hook},
		ScaleSetSpec{ResourceGroup: rg, Name: set, SKU: "Standard_ND96isr_H100_v5", Zones: []string{"1", "2"}})
	hook.Clock = env.clock
	ctx := t.Context()
	capacity := int64(n)
	if _, err := env.sets.BeginUpdate(ctx, rg, set, armcompute.VirtualMachineScaleSetUpdate{SKU: &armcompute.SKU{Capacity: &capacity}}, nil); err != nil {
		t.Fatalf("scaling to %d: %v", n, err)
	}
	const tick = 5 * time.Second
	registered, advertised := map[string]time.Duration{}, map[string]time.Duration{}
	for at := time.Duration(0); at <= 2*time.Minute; at += tick {
		env.srv.Advance(ctx)
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing nodes: %v", err)
		}
		for i := range nodes.Items {
			node := &nodes.Items[i]
			if _, ok := registered[node.Name]; !ok {
				registered[node.Name] = at
			}
			if c, _ := gpus(node); c == "8" {
				if _, ok := advertised[node.Name]; !ok {
					advertised[node.Name] = at
				}
			}
		}
		env.clock.Step(tick)
		hook.Wait()
	}
	if len(registered) != n {
		t.Fatalf("%d nodes registered, want %d", len(registered), n)
	}
	times := map[time.Duration]bool{}
	for name, at := range registered {
		times[at] = true
		if at < 40*time.Second || at > 80*time.Second {
			t.Errorf("node %s registered at %v, want within 1m±20s", name, at)
		}
		if adv, ok := advertised[name]; !ok || adv-at != DefaultDevicePluginDelay {
			t.Errorf("node %s registered at %v, GPUs at %v (seen %v), want %v later", name, at, adv, ok, DefaultDevicePluginDelay)
		}
	}
	if len(times) < 2 {
		t.Errorf("every node registered at %v: no jitter", registered)
	}

	// ARM lists its IDs with the resource group as created; the nodes carry
	// them lower-cased.
	pager := env.vms.NewListPager(rg, set, nil)
	var ids []string
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			t.Fatalf("listing VMs: %v", err)
		}
		for _, vm := range page.Value {
			ids = append(ids, "azure://"+*vm.ID)
		}
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing nodes: %v", err)
	}
	for _, node := range nodes.Items {
		id := node.Spec.ProviderID
		if !strings.Contains(id, "/resourceGroups/mc_rg_cluster_eastus/") {
			t.Errorf("node %s providerID %s: resource group not lower-cased", node.Name, id)
		}
		matches := 0
		for _, armID := range ids {
			if strings.EqualFold(armID, id) {
				matches++
				if !strings.Contains(armID, "/resourceGroups/"+rg+"/") || armID == id {
					t.Errorf("ARM ID %s should keep the resource group %s as created", armID, rg)
				}
			}
		}
		if matches != 1 {
			t.Errorf("node %s providerID %s matches %d of ARM's IDs %v case-insensitively, want 1", node.Name, id, matches, ids)
		}
	}
}
