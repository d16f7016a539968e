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
