package e2e

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

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
// one node each run a whole-node pod; both GPUs throw XID 79. Pool A's
// fault is one a reboot clears: its node is drained, its VM restarted
// (ARM's restart of the scale-set VM), the monitor reports the XID
// cleared, the node is uncordoned and kept — the VM never deleted. Pool
// B's fault nothing clears: its VM is restarted, a minute later
// reimaged, a minute later deleted, as without a ladder. Both pods run
// again; the never-kill invariant holds (each was evicted with its grace
// before its machine was stopped). Before, both machines were deleted at
// once.
func TestRepairRebootKeepsTheMachineElseReplaced(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	poolA := sc.scaleSet("gpua", h100, 0, nil)
	poolB := sc.scaleSet("gpub", h100, 0, nil)
	hook := sc.faultHook(poolA, poolB)
	sc.healthPolicy(repairXIDPolicy)
	p := sc.autoscaler("autoscaler", "--nodes=0:3:"+poolA, "--nodes=0:3:"+poolB)
	sc.workload("a", 1, "90", 8, poolA)
	sc.workload("b", 1, "90", 8, poolB)
	sc.eventually("both pods Running", 3*time.Minute, allRunning(sc, 2))
	nodeOf := func(app string) string {
		running, _ := sc.runningByNode(app)
		return slices.Collect(maps.Keys(running))[0]
	}
	nodeA, nodeB := nodeOf("a"), nodeOf("b")
	vmA, vmB := sc.vmOfNode(poolA, nodeA), sc.vmOfNode(poolB, nodeB)
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
	sc.eventually("pool B's node rebooted, reimaged, then its VM deleted", 5*time.Minute, func() (bool, string) {
		_, vmLeft := sc.vms(poolB)[vmB]
		got := actions(poolB, vmB)
		return !vmLeft && slices.Equal(got, []string{armsim.OpRestartVM, armsim.OpReimageVM, armsim.OpDeleteInstances}),
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
}
