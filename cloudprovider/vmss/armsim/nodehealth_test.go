package armsim

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/kwok/kustomize/stage/node/fast"
	heartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	"sigs.k8s.io/kwok/pkg/apis/internalversion"
	"sigs.k8s.io/kwok/pkg/apis/v1alpha1"
	"sigs.k8s.io/kwok/pkg/utils/gotpl"
	"sigs.k8s.io/kwok/pkg/utils/lifecycle"
	"sigs.k8s.io/yaml"
)

// condition returns the node's condition of the type, or nil.
func condition(n *v1.Node, t v1.NodeConditionType) *v1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// registered registers vm through env's hook and returns its node's name.
func (e *hookEnv) registered(t *testing.T, vm VM) string {
	t.Helper()
	if err := e.hook.VMRunning(t.Context(), vm); err != nil {
		t.Fatalf("VMRunning %s: %v", vm.ComputerName, err)
	}
	return vm.NodeName()
}

// TestSetNodeCondition follows a condition as node-problem-detector posts
// it: set, posted again (the heartbeat moves, the transition does not),
// changed, cleared; the kubelet's conditions and the device plugin's later
// update leave it alone.
func TestSetNodeCondition(t *testing.T) {
	env := newHookEnv(t, DefaultRealism())
	name := env.registered(t, gpuVM(t))
	ready := *condition(env.node(t, name), v1.NodeReady)
	t0 := env.clock.Now()
	const xid v1.NodeConditionType = "XIDErrors"

	steps := []struct {
		by        time.Duration
		status    v1.ConditionStatus
		reason    string
		wantSince time.Duration // lastTransitionTime, after t0
	}{
		{0, v1.ConditionTrue, "XID79", 0},
		{time.Minute, v1.ConditionTrue, "XID48", 0}, // still True: same transition
		{time.Minute, v1.ConditionFalse, "NoXIDErrors", 2 * time.Minute},
		{time.Minute, v1.ConditionFalse, "NoXIDErrors", 2 * time.Minute},
		{time.Minute, v1.ConditionUnknown, "MonitorDown", 4 * time.Minute},
		{time.Minute, v1.ConditionTrue, "XID79", 5 * time.Minute},
	}
	var at time.Duration
	for _, s := range steps {
		env.step(s.by)
		at += s.by
		c := v1.NodeCondition{Type: xid, Status: s.status, Reason: s.reason, Message: "GPU 3: " + s.reason,
			// Ignored: the hook's clock times the condition.
			LastTransitionTime: metav1.NewTime(time.Unix(1, 0)), LastHeartbeatTime: metav1.NewTime(time.Unix(1, 0))}
		if err := env.hook.SetNodeCondition(t.Context(), name, c); err != nil {
			t.Fatalf("at %v: SetNodeCondition: %v", at, err)
		}
		n := env.node(t, name)
		got := condition(n, xid)
		if got == nil {
			t.Fatalf("at %v: no %s condition in %+v", at, xid, n.Status.Conditions)
		}
		if got.Status != s.status || got.Reason != s.reason || got.Message != c.Message {
			t.Errorf("at %v: condition %+v, want status %s reason %s message %q", at, got, s.status, s.reason, c.Message)
		}
		if want := t0.Add(s.wantSince); !got.LastTransitionTime.Time.Equal(want) {
			t.Errorf("at %v: lastTransitionTime %v, want %v", at, got.LastTransitionTime.Time, want)
		}
		if want := t0.Add(at); !got.LastHeartbeatTime.Time.Equal(want) {
			t.Errorf("at %v: lastHeartbeatTime %v, want %v", at, got.LastHeartbeatTime.Time, want)
		}
		if len(n.Status.Conditions) != 2 {
			t.Errorf("at %v: %d conditions, want Ready and %s: %+v", at, len(n.Status.Conditions), xid, n.Status.Conditions)
		}
		if r := condition(n, v1.NodeReady); r == nil || r.Status != ready.Status || !r.LastHeartbeatTime.Equal(&ready.LastHeartbeatTime) {
			t.Errorf("at %v: Ready condition changed: %+v, was %+v", at, r, ready)
		}
	}
	// The device plugin registers later (its own read-modify-write): the
	// condition stays.
	env.step(DefaultDevicePluginDelay)
	n := env.node(t, name)
	if c, a := gpus(n); c != "8" || a != "8" {
		t.Errorf("GPUs capacity %s allocatable %s, want 8", c, a)
	}
	if got := condition(n, xid); got == nil || got.Status != v1.ConditionTrue || got.Reason != "XID79" {
		t.Errorf("after the device plugin: condition %+v, want XIDErrors True (XID79)", got)
	}
}

// TestSetNodeConditionRefused covers a bad condition and a node that is not
// there: an error naming them, and nothing written.
func TestSetNodeConditionRefused(t *testing.T) {
	env := newHookEnv(t, DefaultRealism())
	name := env.registered(t, gpuVM(t))
	tests := []struct {
		name, node string
		c          v1.NodeCondition
		wantIn     string
		notFound   bool
	}{
		{"no type", name, v1.NodeCondition{Status: v1.ConditionTrue}, "empty condition type", false},
		{"bad status", name, v1.NodeCondition{Type: "XIDErrors", Status: "Yes"}, `status "Yes"`, false},
		{"no node", "gone000000", v1.NodeCondition{Type: "XIDErrors", Status: v1.ConditionTrue}, "gone000000", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := env.hook.SetNodeCondition(t.Context(), tt.node, tt.c)
			if err == nil || !strings.Contains(err.Error(), tt.wantIn) {
				t.Fatalf("SetNodeCondition: %v, want an error with %q", err, tt.wantIn)
			}
			if apierrors.IsNotFound(err) != tt.notFound {
				t.Errorf("IsNotFound(%v) = %v, want %v", err, !tt.notFound, tt.notFound)
			}
			if c := env.node(t, name).Status.Conditions; len(c) != 1 {
				t.Errorf("conditions %+v, want Ready alone", c)
			}
		})
	}
}

// TestSetNodeConditionConflicts makes the status update conflict (a
// heartbeat or a cordon landing between read and write): the node is read
// and the condition set again, up to conflictRetries times.
func TestSetNodeConditionConflicts(t *testing.T) {
	tests := []struct {
		name      string
		conflicts int32
		wantErr   bool
	}{
		{"one conflict", 1, false},
		{"as many as retries", conflictRetries, false},
		{"more than retries", conflictRetries + 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newHookEnv(t, DefaultRealism())
			name := env.registered(t, gpuVM(t))
			var updates atomic.Int32
			env.client.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() == "status" && updates.Add(1) <= tt.conflicts {
					return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, name, fmt.Errorf("changed"))
				}
				return false, nil, nil
			})
			err := env.hook.SetNodeCondition(t.Context(), name, v1.NodeCondition{Type: "KernelDeadlock", Status: v1.ConditionTrue, Reason: "DockerHung"})
			if (err != nil) != tt.wantErr || (err != nil && !apierrors.IsConflict(err)) {
				t.Fatalf("SetNodeCondition: %v, want error %v (a conflict)", err, tt.wantErr)
			}
			if got, want := condition(env.node(t, name), "KernelDeadlock") != nil, !tt.wantErr; got != want {
				t.Errorf("condition set %v, want %v", got, want)
			}
			if got, want := updates.Load(), min(tt.conflicts+1, conflictRetries+1); got != want {
				t.Errorf("%d status updates, want %d", got, want)
			}
		})
	}
}

// TestSetHealthyDevices marks GPUs unhealthy as the device plugin and the
// kubelet do: allocatable drops, capacity and everything else stay.
func TestSetHealthyDevices(t *testing.T) {
	env := newHookEnv(t, DefaultRealism())
	name := env.registered(t, gpuVM(t))
	ctx := t.Context()
	// Before the device plugin registers the node has no GPUs to mark.
	if err := env.hook.SetHealthyDevices(ctx, name, GPUResource, 7); err == nil || !strings.Contains(err.Error(), "has not registered") {
		t.Fatalf("SetHealthyDevices before the device plugin: %v, want refused", err)
	}
	env.step(DefaultDevicePluginDelay)
	before := env.node(t, name)
	for _, s := range []struct {
		n       int64
		wantErr string
		want    string
	}{
		{7, "", "7"},
		{0, "", "0"},
		{9, "more than its capacity 8", "0"},
		{-1, "must not be negative", "0"},
		{8, "", "8"}, // every GPU healthy again
	} {
		err := env.hook.SetHealthyDevices(ctx, name, GPUResource, s.n)
		if s.wantErr == "" && err != nil || s.wantErr != "" && (err == nil || !strings.Contains(err.Error(), s.wantErr)) {
			t.Fatalf("SetHealthyDevices(%d): %v, want error %q", s.n, err, s.wantErr)
		}
		n := env.node(t, name)
		if c, a := gpus(n); c != "8" || a != s.want {
			t.Errorf("after SetHealthyDevices(%d): GPUs capacity %s allocatable %s, want 8 and %s", s.n, c, a, s.want)
		}
		for _, res := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourcePods, v1.ResourceEphemeralStorage} {
			if got, was := n.Status.Allocatable[res], before.Status.Allocatable[res]; got.Cmp(was) != 0 {
				t.Errorf("after SetHealthyDevices(%d): allocatable %s %s, was %s", s.n, res, got.String(), was.String())
			}
		}
		if len(n.Status.Conditions) != len(before.Status.Conditions) {
			t.Errorf("after SetHealthyDevices(%d): conditions %+v changed", s.n, n.Status.Conditions)
		}
	}
	if err := env.hook.SetHealthyDevices(ctx, "gone000000", GPUResource, 7); !apierrors.IsNotFound(err) {
		t.Fatalf("SetHealthyDevices on a missing node: %v, want not found", err)
	}
}

// vmOf is gpuVM as instance id of scale set set (ComputerName and
// ProviderID to match).
func vmOf(t *testing.T, set string, id int) VM {
	t.Helper()
	vm := gpuVM(t)
	vm.ScaleSet, vm.InstanceID = set, fmt.Sprint(id)
	vm.ComputerName = fmt.Sprintf("%s%06d", set, id)
	vm.ProviderID = strings.Replace(vm.ProviderID, "aks-h100-12345678-vmss/virtualMachines/4", set+"/virtualMachines/"+vm.InstanceID, 1)
	return vm
}

// TestDegradeNextGPUs deals GPUs dead from the start to the next nodes of
// a scale set, in registration order: those nodes get capacity 8 and
// allocatable 7 when the device plugin registers; later nodes, nodes of
// other scale sets and a VM registered again are dealt nothing more.
func TestDegradeNextGPUs(t *testing.T) {
	noDelay := DefaultRealism()
	noDelay.DevicePluginDelay = 0
	for _, r := range []struct {
		name    string
		realism Realism
	}{{"device plugin delay", DefaultRealism()}, {"GPUs at registration", noDelay}} {
		t.Run(r.name, func(t *testing.T) {
			env := newHookEnv(t, r.realism)
			if err := env.hook.DegradeNextGPUs("H100-Pool", 2, 7); err != nil {
				t.Fatalf("DegradeNextGPUs: %v", err)
			}
			if err := env.hook.DegradeNextGPUs("h100-pool", 1, 6); err != nil { // adds up, any case
				t.Fatalf("DegradeNextGPUs: %v", err)
			}
			cpu := vmOf(t, "h100-pool", 9)
			cpu.SKU = skuByName(t, "Standard_D16s_v5") // no GPUs: not counted
			order := []struct {
				vm                VM
				wantCap, wantAllo string
			}{
				{cpu, "none", "none"},
				{vmOf(t, "h100-pool", 3), "8", "7"},
				{vmOf(t, "other", 0), "8", "8"},
				{vmOf(t, "h100-pool", 3), "8", "7"}, // told again: dealt no second fault
				{vmOf(t, "h100-pool", 1), "8", "7"},
				{vmOf(t, "h100-pool", 2), "8", "6"},
				{vmOf(t, "h100-pool", 4), "8", "8"},
			}
			for _, o := range order {
				env.registered(t, o.vm)
			}
			env.step(r.realism.DevicePluginDelay)
			for _, o := range order {
				n := env.node(t, o.vm.NodeName())
				if c, a := gpus(n); c != o.wantCap || a != o.wantAllo {
					t.Errorf("node %s: GPUs capacity %s allocatable %s, want %s and %s", n.Name, c, a, o.wantCap, o.wantAllo)
				}
				if r := condition(n, v1.NodeReady); r == nil || len(n.Status.Conditions) != 1 {
					t.Errorf("node %s: conditions %+v, want Ready alone (no condition tells of the dead GPU)", n.Name, n.Status.Conditions)
				}
			}
			if w := env.clock.Waiters(); w != 0 {
				t.Errorf("%d timers left", w)
			}
			// A node deleted and registered again (a VM of the same
			// name) is a new machine: no fault left for it.
			gone := vmOf(t, "h100-pool", 1)
			if err := env.hook.VMDeleted(t.Context(), gone); err != nil {
				t.Fatalf("VMDeleted: %v", err)
			}
			env.registered(t, gone)
			env.step(r.realism.DevicePluginDelay)
			if c, a := gpus(env.node(t, gone.NodeName())); c != "8" || a != "8" {
				t.Errorf("node %s registered again: GPUs capacity %s allocatable %s, want 8", gone.NodeName(), c, a)
			}
		})
	}
	env := newHookEnv(t, DefaultRealism())
	for _, bad := range [][2]int64{{-1, 7}, {1, -1}} {
		if err := env.hook.DegradeNextGPUs("h100-pool", int(bad[0]), bad[1]); err == nil || !strings.Contains(err.Error(), "h100-pool") {
			t.Errorf("DegradeNextGPUs(%d, %d): %v, want an error naming the scale set", bad[0], bad[1], err)
		}
	}
}

// kwokStage reads one of kwok's stock Stages as kwok does.
func kwokStage(t *testing.T, doc string) *internalversion.Stage {
	t.Helper()
	var st v1alpha1.Stage
	if err := yaml.UnmarshalStrict([]byte(doc), &st); err != nil {
		t.Fatalf("reading kwok stage: %v", err)
	}
	in, err := internalversion.ConvertToInternalStage(&st)
	if err != nil {
		t.Fatalf("converting kwok stage %s: %v", st.Name, err)
	}
	return in
}

// TestKwokStagesKeepInjectedConditions plays kwok's own node stages
// (node-initialize and node-heartbeat-with-lease, as the e2e control plane
// runs them) with kwok's own stage code on a node that carries injected
// conditions: kwok patches the status with a strategic merge patch, so the
// kubelet's conditions it renders merge by type and the injected ones keep
// their status and times. If a kwok upgrade changed that, conditions would
// be wiped every heartbeat and SetNodeCondition would have to re-assert
// them.
func TestKwokStagesKeepInjectedConditions(t *testing.T) {
	env := newHookEnv(t, DefaultRealism())
	name := env.registered(t, gpuVM(t))
	ctx := t.Context()
	lc, err := lifecycle.NewLifecycle([]*internalversion.Stage{kwokStage(t, fast.DefaultNodeInit), kwokStage(t, heartbeat.DefaultNodeHeartbeatWithLease)})
	if err != nil {
		t.Fatalf("kwok lifecycle: %v", err)
	}
	renderer := gotpl.NewRenderer(gotpl.FuncMap{
		"NodeIP":   func() string { return "10.0.0.4" },
		"NodeName": func() string { return name },
		"NodePort": func() int { return 10250 },
	})
	// play runs the stage kwok would pick for the node now and returns its
	// name and patch types.
	play := func() (string, []types.PatchType) {
		t.Helper()
		n := env.node(t, name)
		stage, err := lc.Match(ctx, &lifecycle.Event{Labels: n.Labels, Annotations: n.Annotations, Data: n})
		if err != nil || stage == nil {
			t.Fatalf("no kwok stage for node %s (conditions %+v): %v", name, n.Status.Conditions, err)
		}
		var patches []types.PatchType
		_, err = stage.DoSteps(0, n.Finalizers, n, renderer,
			func(*internalversion.StageEvent) error { return nil },
			func() error { return fmt.Errorf("stage %s deletes the node", stage.Name()) },
			func(p *lifecycle.Patch) error {
				patches = append(patches, p.Type)
				var sub []string
				if p.Subresource != "" {
					sub = []string{p.Subresource}
				}
				_, err := env.client.CoreV1().Nodes().Patch(ctx, name, p.Type, p.Data, metav1.PatchOptions{}, sub...)
				return err
			},
			func(*lifecycle.Apply) error { return fmt.Errorf("stage %s applies a resource", stage.Name()) },
		)
		if err != nil {
			t.Fatalf("playing kwok stage %s: %v", stage.Name(), err)
		}
		return stage.Name(), patches
	}

	// A monitor may report before the kubelet is Ready.
	early := v1.NodeCondition{Type: "KernelDeadlock", Status: v1.ConditionTrue, Reason: "TaskHung", Message: "task hung for 120s"}
	if err := env.hook.SetNodeCondition(ctx, name, early); err != nil {
		t.Fatalf("SetNodeCondition: %v", err)
	}
	env.step(time.Minute)
	xid := v1.NodeCondition{Type: "XIDErrors", Status: v1.ConditionTrue, Reason: "XID79", Message: "GPU has fallen off the bus"}
	for i, want := range []string{"node-initialize", "node-heartbeat-with-lease", "node-heartbeat-with-lease"} {
		if i == 1 {
			if err := env.hook.SetNodeCondition(ctx, name, xid); err != nil {
				t.Fatalf("SetNodeCondition: %v", err)
			}
		}
		before := env.node(t, name)
		stage, patches := play()
		if stage != want {
			t.Fatalf("play %d: kwok played %s, want %s", i, stage, want)
		}
		if len(patches) != 1 || patches[0] != types.StrategicMergePatchType {
			t.Fatalf("kwok stage %s patched with %v, want one strategic merge patch", stage, patches)
		}
		after := env.node(t, name)
		if r := condition(after, v1.NodeReady); r == nil || r.Status != v1.ConditionTrue {
			t.Fatalf("after kwok's %s: Ready %+v, want True", stage, r)
		}
		for _, c := range []v1.NodeConditionType{early.Type, xid.Type} {
			was := condition(before, c)
			if was == nil {
				continue
			}
			got := condition(after, c)
			if got == nil || got.Status != was.Status || got.Reason != was.Reason || got.Message != was.Message ||
				!got.LastTransitionTime.Equal(&was.LastTransitionTime) || !got.LastHeartbeatTime.Equal(&was.LastHeartbeatTime) {
				t.Errorf("kwok's %s changed condition %s: %+v, was %+v", stage, c, got, was)
			}
		}
		env.step(20 * time.Minute)
	}
	if got := condition(env.node(t, name), xid.Type); got == nil || got.Status != v1.ConditionTrue {
		t.Fatalf("XIDErrors gone after kwok's heartbeats: %+v", env.node(t, name).Status.Conditions)
	}
	// Clearing is setting it False: kwok keeps that too.
	xid.Status, xid.Reason = v1.ConditionFalse, "NoXIDErrors"
	if err := env.hook.SetNodeCondition(ctx, name, xid); err != nil {
		t.Fatalf("SetNodeCondition: %v", err)
	}
	play()
	if got := condition(env.node(t, name), xid.Type); got == nil || got.Status != v1.ConditionFalse {
		t.Fatalf("cleared XIDErrors after a heartbeat: %+v", got)
	}
	// The node's resources stay the hook's (the device plugin registered
	// before kwok's first stage), not kwok's defaults.
	if c, a := gpus(env.node(t, name)); c != "8" || a != "8" {
		t.Errorf("GPUs capacity %s allocatable %s after kwok's stages, want 8", c, a)
	}
}

// TestVMRepairedClearsWhatAFixClears: a repair that fixes the VM clears
// the problems node-problem-detector had reported (False, RepairedBy…)
// and advertises its unhealthy GPUs again; one that does not leaves them.
// The Node object stays either way, its cordon and taints as they were
// (the kubelet's registration finds it).
func TestVMRepairedClearsWhatAFixClears(t *testing.T) {
	env := newHookEnv(t, DefaultRealism())
	vm := gpuVM(t)
	name := env.registered(t, vm)
	ctx := t.Context()
	env.step(DefaultDevicePluginDelay)
	if err := env.hook.SetNodeCondition(ctx, name, v1.NodeCondition{Type: "XIDErrors", Status: v1.ConditionTrue, Reason: "XID79"}); err != nil {
		t.Fatal(err)
	}
	if err := env.hook.SetHealthyDevices(ctx, name, GPUResource, 7); err != nil {
		t.Fatal(err)
	}
	n := env.node(t, name)
	n.Spec.Unschedulable = true
	if _, err := env.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	uid := n.UID
	if err := env.hook.VMRepaired(ctx, vm, ActionRestart, false); err != nil {
		t.Fatal(err)
	}
	n = env.node(t, name)
	if c := condition(n, "XIDErrors"); c == nil || c.Status != v1.ConditionTrue {
		t.Fatalf("after a restart that did not fix it: XIDErrors %+v, want still True", c)
	}
	if _, a := gpus(n); a != "7" {
		t.Fatalf("after a restart that did not fix it: %s GPUs allocatable, want 7", a)
	}
	if err := env.hook.VMRepaired(ctx, vm, ActionReimage, true); err != nil {
		t.Fatal(err)
	}
	n = env.node(t, name)
	if c := condition(n, "XIDErrors"); c == nil || c.Status != v1.ConditionFalse || c.Reason != "RepairedByReimage" {
		t.Fatalf("after a reimage that fixed it: XIDErrors %+v, want False, RepairedByReimage", c)
	}
	if _, a := gpus(n); a != "8" {
		t.Fatalf("after a reimage that fixed it: %s GPUs allocatable, want 8", a)
	}
	if n.UID != uid || !n.Spec.Unschedulable {
		t.Fatalf("the Node was replaced or uncordoned by the repair (uid %s → %s, unschedulable %t)", uid, n.UID, n.Spec.Unschedulable)
	}
}
