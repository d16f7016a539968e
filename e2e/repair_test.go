package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// TestRepairAtTheMinimumBuysTheReplacementFirst (#42): a pool of one H100
// node at its minimum (--nodes=1:4) runs a whole-node pod; its GPU throws
// XID 79 under the built-in rules (for: shortened). The pool cannot lose
// its machine, so the replacement is bought first: a second VM, Ready
// while the pod still runs on the broken node; then the pod is evicted
// and runs on the new node, the broken VM deleted, the pool back at one.
// Before, the node stayed cordoned for good with its pod on a dead GPU
// (held: min-size). The never-kill invariant holds (the pod is evicted
// with its grace, never killed with its machine).
func TestRepairAtTheMinimumBuysTheReplacementFirst(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	gpu := sc.scaleSet("gpu", h100, 1, nil)
	hook := sc.faultHook(gpu)
	sc.healthPolicy(defaultPolicyFastRules(t))
	p := sc.autoscaler("autoscaler", "--nodes=1:4:"+gpu)
	sc.workload("work", 1, "90", 8, gpu)
	sc.eventually("the pod Running on the pool's one node", 3*time.Minute, allRunning(sc, 1))
	before, _ := sc.runningByNode("work")
	victim := slices.Collect(maps.Keys(before))[0]
	victimVM := sc.vmOfNode(gpu, victim)
	sc.setCondition(hook, victim, xidError, apiv1.ConditionTrue, "XID79", "GPU 0: XID 79, GPU has fallen off the bus")
	sc.eventually("its replacement bought first, the pod still on the broken node", 3*time.Minute, func() (bool, string) {
		running, _ := sc.runningByNode("work")
		pod, still := running[victim]
		return sc.capacity(gpu) == 2 && still && pod.UID == before[victim].UID && sc.nodeEvents(core.EventHealthReplacementFirst, victim) > 0,
			fmt.Sprintf("capacity %d, pod on %s %v, %d HealthReplacementFirst events", sc.capacity(gpu), victim, still, sc.nodeEvents(core.EventHealthReplacementFirst, victim))
	})
	sc.eventually("the pod Running on the new node, the broken VM gone, the pool at one", 5*time.Minute, func() (bool, string) {
		running, _ := sc.runningByNode("work")
		_, onVictim := running[victim]
		_, vmLeft := sc.vms(gpu)[victimVM]
		ok, state := allRunning(sc, 1)()
		return ok && !onVictim && !vmLeft && sc.capacity(gpu) == 1,
			fmt.Sprintf("%s; on the victim %v, its VM left %v, capacity %d\n%s", state, onVictim, vmLeft, sc.capacity(gpu), sc.writeLog(gpu))
	})
	for _, w := range sc.writesTo(gpu) {
		if w.Op == armsim.OpDeleteInstances && accepted(w) && len(w.InstanceIDs) != 1 {
			t.Fatalf("a deletion of %v: want the broken VM only\n%s", w.InstanceIDs, sc.writeLog(gpu))
		}
	}
	if got := sc.healthMetric(p, `vmss_autoscaler_health_actions_total{action="buy-first",node_group="`+gpu+`",rule="xid-error"}`); got != 1 {
		t.Fatalf("buy-first actions %v, want 1", got)
	}
}

// repairXIDPolicy replaces an XID node after a reboot, then a reimage,
// each given a minute (the least repairTimeout).
const repairXIDPolicy = `rules:
- name: xid-error
  condition: {type: XIDErrors, status: "True"}
  for: 5s
  action: replace
  repair: [reboot, reimage]
  repairTimeout: 1m
`

// TestRepairRebootKeepsTheMachineElseReplaced (#42): two H100 pools of
// one node each, behind the preflight gate with the real agent, run a
// whole-node pod; both GPUs throw XID 79. Pool A's fault is one a reboot
// clears: its node is drained, its VM restarted (ARM's restart of the
// scale-set VM), sent through preflight again (taint and pending label
// back; the agent passes it again), the monitor reports the XID cleared,
// and the node is uncordoned and kept — the VM never deleted, its repair
// record on the node. Pool B, a Flexible scale set, has a fault nothing
// clears: its VM is restarted (the Virtual Machines API's restart),
// passes preflight with the XID still there, a minute later is reimaged,
// a minute later deleted, as without a ladder. Both pods run
// again; the never-kill invariant holds (each was evicted with its grace
// before its machine was stopped). Before, both machines were deleted at
// once, and a rebooted node took work without preflight.
func TestRepairRebootKeepsTheMachineElseReplaced(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	poolA := sc.scaleSet("gpua", h100, 0, preflightTags())
	// Pool B is a Flexible scale set: its VM's repairs are the Virtual
	// Machines API's.
	poolB := sc.prefix + "-gpub"
	must(t, sc.s.sim.AddScaleSet(armsim.ScaleSetSpec{ResourceGroup: sc.rg, Name: poolB, SKU: h100, Tags: preflightTags(), Flexible: true}))
	sc.sets = append(sc.sets, poolB)
	hook := sc.faultHook(poolA, poolB)
	sc.healthPolicy(repairXIDPolicy)
	start := time.Now()
	p := sc.autoscaler("autoscaler", "--nodes=0:3:"+poolA, "--nodes=0:3:"+poolB)
	prom := sc.prometheus(sc.addr(p))
	sc.runAgents(func(string, int) bool { return false }, poolA, poolB)
	sc.workload("a", 1, "90", 8, poolA)
	sc.workload("b", 1, "90", 8, poolB)
	sc.eventually("both pods Running", 3*time.Minute, allRunning(sc, 2))
	nodeOf := func(app string) string {
		running, _ := sc.runningByNode(app)
		return slices.Collect(maps.Keys(running))[0]
	}
	nodeA, nodeB := nodeOf("a"), nodeOf("b")
	vmA, vmB := sc.vmOfNode(poolA, nodeA), sc.vmOfNode(poolB, nodeB)
	broke := time.Now().Truncate(time.Second)
	must(t, sc.s.sim.BreakVM(sc.rg, poolA, vmA, armsim.ActionRestart))
	must(t, sc.s.sim.BreakVM(sc.rg, poolB, vmB, ""))
	sc.setCondition(hook, nodeA, xidError, apiv1.ConditionTrue, "XID79", "GPU 0: XID 79, GPU has fallen off the bus")
	sc.setCondition(hook, nodeB, xidError, apiv1.ConditionTrue, "XID79", "GPU 3: XID 79, GPU has fallen off the bus")
	actions := func(set, vm string) []string {
		var out []string
		for _, w := range sc.writesTo(set) {
			if accepted(w) && slices.Contains(w.InstanceIDs, vm) && w.Op != armsim.OpUpdateScaleSet {
				out = append(out, w.Op)
			}
		}
		return out
	}
	sc.eventually("pool A's node rebooted, fixed and uncordoned, its VM kept", 4*time.Minute, func() (bool, string) {
		n := sc.node(nodeA)
		_, vmLeft := sc.vms(poolA)[vmA]
		got := actions(poolA, vmA)
		return n != nil && !n.Spec.Unschedulable && vmLeft && sc.nodeEvents(core.EventHealthRepaired, nodeA) > 0 && slices.Equal(got, []string{armsim.OpRestartVM}),
			fmt.Sprintf("node there %v, VM left %v, actions on it %v, %d HealthRepaired", n != nil, vmLeft, got, sc.nodeEvents(core.EventHealthRepaired, nodeA))
	})
	// It went through preflight again, and passed, after the reboot.
	n := sc.node(nodeA)
	passedAt, err := time.Parse(time.RFC3339, n.Annotations[preflight.PassedAtAnnotation])
	againAt, err2 := time.Parse(time.RFC3339, n.Annotations[preflight.AgainAnnotation])
	if err != nil || err2 != nil || againAt.Before(broke) || passedAt.Before(againAt) || n.Labels[preflight.DefaultLabel] != preflight.ValuePassed ||
		slices.ContainsFunc(n.Spec.Taints, func(t apiv1.Taint) bool { return t.Key == preflight.DefaultTaintKey }) {
		t.Fatalf("node %s after its repair: label %q, sent again at %q, passed at %q (broke at %s), taints %+v: want preflight passed again after the reboot",
			nodeA, n.Labels[preflight.DefaultLabel], n.Annotations[preflight.AgainAnnotation], n.Annotations[preflight.PassedAtAnnotation], broke.Format(time.RFC3339), n.Spec.Taints)
	}
	var rec struct {
		Run     any `json:"run"`
		History []struct{ Action, Outcome string }
	}
	if err := json.Unmarshal([]byte(n.Annotations[actuation.RepairAnnotation]), &rec); err != nil || rec.Run != nil ||
		len(rec.History) != 1 || rec.History[0].Action != "reboot" || rec.History[0].Outcome != "fixed" {
		t.Fatalf("node %s's repair record %q (%v): want no run and one outcome, reboot fixed", nodeA, n.Annotations[actuation.RepairAnnotation], err)
	}
	sc.eventually("pool B's node rebooted, reimaged, then its VM deleted", 5*time.Minute, func() (bool, string) {
		_, vmLeft := sc.vms(poolB)[vmB]
		got := actions(poolB, vmB)
		return !vmLeft && slices.Equal(got, []string{armsim.OpRestartVirtualMachine, armsim.OpReimageVirtualMachine, armsim.OpDeleteInstances}),
			fmt.Sprintf("VM left %v, actions on it %v", vmLeft, got)
	})
	sc.eventually("both pods Running again", 3*time.Minute, allRunning(sc, 2))
	if got := actions(poolA, vmA); !slices.Equal(got, []string{armsim.OpRestartVM}) {
		t.Fatalf("pool A's VM: %v after the fix, want the one restart", got)
	}
	for _, s := range []struct{ group, action, outcome string }{{poolA, "reboot", "fixed"}, {poolB, "reboot", "timeout"}, {poolB, "reimage", "timeout"}} {
		series := fmt.Sprintf(`vmss_autoscaler_health_repairs_total{action=%q,node_group=%q,outcome=%q}`, s.action, s.group, s.outcome)
		if got := sc.healthMetric(p, series); got != 1 {
			t.Errorf("%s = %v, want 1", series, got)
		}
	}
	// The health dashboard's repair panels (TestDashboardsShowDataFromARealPrometheus
	// leaves them to this scenario, which repairs).
	sc.panelsShowData(prom, "health.json", "health_repair", start)
}
