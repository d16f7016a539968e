package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// Scenarios of Azure as it is documented today (issue #38): the Compute
// resource provider's throttling policies, its long-running operations
// and the scale-set settings that change what ARM does.

// scaleSetID is a scenario's scale set's ARM resource ID.
func (sc *scenario) scaleSetID(set string) string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s", subscription, sc.rg, set)
}

// TestAzureVMListThrottledFor20MinutesFreezesNothingElse: the VM lists
// of one scale set are answered the Compute RP's 429 of the windowed
// HighCostGetVMScaleSet30Min policy with a Retry-After of 20 minutes
// ("Troubleshooting API throttling errors": the policy counts VM lists
// per subscription over 30 minutes). Meanwhile a second scale set scales
// up and a third scales down: both proceed, the throttled set keeps its
// machines (its last VM list is kept, not taken as empty), and the
// autoscaler honours the Retry-After (a few 429s, not one per refresh).
// Before, any 429 held back every read for its Retry-After: every group
// went stale and the cluster neither scaled up nor down for 20 minutes.
func TestAzureVMListThrottledFor20MinutesFreezesNothingElse(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	listed := sc.scaleSet("listed", "Standard_D16s_v5", 0, nil)
	up := sc.scaleSet("up", "Standard_D16s_v5", 0, nil)
	down := sc.scaleSet("down", "Standard_D16s_v5", 0, nil)
	flags := fastScaleDown("--nodes=0:10:"+listed, "--nodes=0:10:"+up, "--nodes=0:10:"+down,
		"--node-addition-adaptive=false", "--node-addition-rate=600", "--node-addition-burst=10",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")
	p := sc.autoscaler("one", flags...)
	// One 12-CPU pod per 16-CPU node, each workload on its own set.
	sc.workload("stay", 2, "12", 0, listed)
	sc.workload("leave", 3, "12", 0, down)
	sc.eventually("5 pods Running", 3*time.Minute, allRunning(sc, 5))
	sc.steadyFor(p, 3, "capacities 2 and 3", func() (bool, string) {
		a, c := sc.capacity(listed), sc.capacity(down)
		return a == 2 && c == 3, fmt.Sprintf("capacities %d and %d", a, c)
	})

	before := sc.s.sim.Throttled()[armsim.PolicyHighCostGetVMScaleSet30Min]
	until := sc.s.sim.ThrottlePolicy(armsim.PolicyHighCostGetVMScaleSet30Min, sc.scaleSetID(listed), 20*time.Minute)
	t.Cleanup(func() { sc.s.sim.ThrottlePolicy(armsim.PolicyHighCostGetVMScaleSet30Min, sc.scaleSetID(listed), 0) })
	sc.eventually("the throttled VM list met", time.Minute, func() (bool, string) {
		n := sc.s.sim.Throttled()[armsim.PolicyHighCostGetVMScaleSet30Min] - before
		return n > 0, fmt.Sprintf("%d VM lists throttled", n)
	})

	sc.workload("arrive", 3, "12", 0, up)
	sc.scaleDeployment("leave", 0)
	sc.eventually("the second set scaled up and the third down", 3*time.Minute, func() (bool, string) {
		u, d := sc.capacity(up), sc.capacity(down)
		return u == 3 && d == 0, fmt.Sprintf("capacity of %s %d (want 3), of %s %d (want 0)", up, u, down, d)
	})
	sc.eventually("5 pods Running", 2*time.Minute, allRunning(sc, 5))
	if time.Now().After(until) {
		t.Fatalf("the scenario outlived the 20-minute throttling: it proves nothing")
	}
	// The throttled set keeps its machines and its pods.
	if c := sc.capacity(listed); c != 2 {
		t.Fatalf("capacity of the throttled set %d, want 2", c)
	}
	for _, w := range sc.writesTo(listed) {
		if w.Op == armsim.OpDeleteInstances {
			t.Fatalf("a deletion in the throttled set:\n%s", sc.writeLog(listed))
		}
	}
	// Retry-After honoured: a VM list every second or five would have
	// met the 429 hundreds of times in these minutes.
	if n := sc.s.sim.Throttled()[armsim.PolicyHighCostGetVMScaleSet30Min] - before; n > 5 {
		t.Fatalf("%d VM lists answered 429 during a 20-minute Retry-After, want a handful", n)
	}
	_, body := sc.get(p, "/metrics")
	held := false
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `vmss_autoscaler_arm_policy_held_until_seconds{policy="highcostgetvmscaleset30min"`) && !strings.HasSuffix(line, " 0") {
			held = true
		}
	}
	if !held {
		t.Fatalf("/metrics shows no hold of highcostgetvmscaleset30min")
	}
}

// pinCapacity writes a scale set's capacity as an operator's script (or
// another controller) would, beside the autoscaler, and waits for ARM's
// answer, not for the operation.
func (sc *scenario) pinCapacity(set string, capacity int64) {
	sc.t.Helper()
	_, err := sc.armScaleSets().BeginUpdate(sc.ctx, sc.rg, set, armcompute.VirtualMachineScaleSetUpdate{
		SKU: &armcompute.SKU{Capacity: to.Ptr(capacity)},
	}, nil)
	if err != nil {
		sc.t.Fatalf("writing capacity %d of %s: %v", capacity, set, err)
	}
}

// autoscalerWrites are the accepted writes of an operation kind the
// scenario's autoscaler sent about a set (the test's own writes carry
// another caller).
func (sc *scenario) autoscalerWrites(set, op string, since time.Time) int {
	n := 0
	for _, w := range sc.writesTo(set) {
		if w.Op == op && accepted(w) && !w.At.Before(since) && w.Caller != armsim.CallerOf("e2e-token-"+sc.prefix) {
			n++
		}
	}
	return n
}

// TestAzurePreemptedScaleUpAndDelete: a newer write to a scale set
// preempts the operation running on it (ARM resolves the set to the
// newest goal state and ends the older operation Canceled with
// OperationPreempted: cluster-autoscaler issue 3018,
// cloud-provider-azure's OperationPreemptedErrorMessage). Another writer
// re-applies the capacity while the autoscaler's scale-up runs: the
// scale-up is superseded, not failed (no FailedScaleUp, no backoff, no
// second increase) and its VMs come. Then, while the autoscaler's
// deletion of the empty nodes runs (slow, as GPU VMs are), the other
// writer pins the capacity again: the deletion is preempted and its VMs
// put back Running; the autoscaler sends it again for the machines still
// listed, with no failed scale-down counted, and the set ends empty.
// Before, an operation ended Canceled was a failure: the scale-up backed
// the group off and the deletion's nodes were untainted and judged again.
func TestAzurePreemptedScaleUpAndDelete(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	p := sc.autoscaler("one", fastScaleDown("--nodes=0:10:"+cpu, "--node-addition-adaptive=false",
		"--node-addition-rate=600", "--node-addition-burst=10",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	// The scale-up's operation runs a minute past its VMs' boot.
	if err := sc.s.sim.InjectFault(sc.rg, cpu, armsim.Fault{Kind: armsim.FaultSlowLRO, Count: 1, Duration: time.Minute}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sc.workload("web", 3, "12", 0, cpu)
	sc.eventually("the scale-up sent", time.Minute, func() (bool, string) {
		n := sc.autoscalerWrites(cpu, armsim.OpUpdateScaleSet, start)
		return n >= 1, sc.writeLog(cpu)
	})
	sc.pinCapacity(cpu, int64(sc.capacity(cpu)))
	sc.eventually("the preemption seen", time.Minute, func() (bool, string) {
		_, body := sc.get(p, "/metrics")
		n, lines := operationFailures(body, cpu, "OperationPreempted")
		return n >= 1, lines
	})
	sc.eventually("3 pods Running", 2*time.Minute, allRunning(sc, 3))
	sc.steadyFor(p, 3, "capacity 3", sc.capacityIs(cpu, 3))
	if n := sc.autoscalerWrites(cpu, armsim.OpUpdateScaleSet, start); n != 1 {
		t.Fatalf("%d capacity writes by the autoscaler, want 1 (the superseded scale-up is not sent again):\n%s", n, sc.writeLog(cpu))
	}
	if evs := sc.eventsAnywhere("FailedScaleUp"); len(evs) != 0 {
		t.Fatalf("a preempted scale-up reported failed: %v", evs[0].Message)
	}

	// The deletion, preempted.
	if err := sc.s.sim.InjectFault(sc.rg, cpu, armsim.Fault{Kind: armsim.FaultSlowDelete, Count: 1, Duration: time.Minute}); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	sc.scaleDeployment("web", 0)
	sc.eventually("the deletion sent", 2*time.Minute, func() (bool, string) {
		return sc.autoscalerWrites(cpu, armsim.OpDeleteInstances, gone) >= 1, sc.writeLog(cpu)
	})
	sc.pinCapacity(cpu, 3) // the VMs being deleted come back
	sc.eventually("the deletion sent again and the set empty", 3*time.Minute, func() (bool, string) {
		vms := sc.vms(cpu)
		return len(vms) == 0, fmt.Sprintf("VMs %v\n%s", vms, sc.writeLog(cpu))
	})
	if n := sc.autoscalerWrites(cpu, armsim.OpDeleteInstances, gone); n < 2 {
		t.Fatalf("%d deletions sent by the autoscaler, want the preempted one and the one sent again:\n%s", n, sc.writeLog(cpu))
	}
	_, body := sc.get(p, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_failed_scale_downs_total{node_group="`+cpu+`",step="delete"}`); got > 0 {
		t.Fatalf("%v failed scale-downs counted for a preempted deletion, want none", got)
	}
}

// TestAzureOverprovisionedScaleSet: a scale set that overprovisions
// (properties.overprovision true, Azure's default for Uniform sets:
// "Design considerations for scale sets", Overprovisioning) makes extra
// VMs with their own instance IDs on every scale-out and deletes them
// once the asked-for ones run. The autoscaler warns at discovery, counts
// the extras as none of its machines (no "never registered" deletion of
// them, no second scale-up for the pods) and the pods get their nodes.
func TestAzureOverprovisionedScaleSet(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.prefix + "-over"
	if err := sc.s.sim.AddScaleSet(armsim.ScaleSetSpec{ResourceGroup: sc.rg, Name: cpu, SKU: "Standard_D16s_v5", Overprovision: true}); err != nil {
		t.Fatal(err)
	}
	sc.sets = append(sc.sets, cpu)
	p := sc.autoscaler("one", "--nodes=0:10:"+cpu, "--node-addition-adaptive=false", "--node-addition-rate=600", "--node-addition-burst=10",
		"--max-node-provision-time=30s")
	sc.workload("web", 4, "12", 0, cpu)
	sawExtras := false
	sc.eventually("4 pods Running", 2*time.Minute, func() (bool, string) {
		st, err := sc.s.sim.ScaleSet(sc.rg, cpu)
		if err != nil {
			t.Fatal(err)
		}
		for _, vm := range st.VMs {
			sawExtras = sawExtras || vm.Overprovisioned
		}
		return allRunning(sc, 4)()
	})
	if !sawExtras {
		t.Fatal("the simulator made no extra VMs: the scenario proves nothing")
	}
	sc.steadyFor(p, 5, "capacity 4", sc.capacityIs(cpu, 4))
	sc.increasesOnce(cpu, 4, false)
	if !sc.logContains(p, "scale set overprovisions") {
		t.Fatal("no warning about overprovisioning in the autoscaler's log")
	}
}

// operationFailures sums vmss_autoscaler_arm_operation_failures_total of
// a scale set (its name in any case) and an error code, and returns the
// metric's lines for a failure message.
func operationFailures(body, set, code string) (float64, string) {
	var sum float64
	var lines []string
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "vmss_autoscaler_arm_operation_failures_total{") {
			continue
		}
		lines = append(lines, line)
		if strings.Contains(strings.ToLower(line), `node_group="`+strings.ToLower(set)+`"`) && strings.Contains(line, `code="`+code+`"`) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum, strings.Join(lines, "\n")
}

// TestAzureDeleteBatchNamingAVanishedVM: a VM deleted out of band after
// the autoscaler's last VM list is still named in its deletion batch, and
// ARM refuses the whole batch (400 InvalidParameter: "The provided
// instanceId … is not an active Virtual Machine Scale Set VM instanceId",
// as quoted in microsoft/onefuzz issue 2547). The autoscaler lists the
// VMs again and sends the rest: the set ends empty, every node goes, and
// no failed scale-down is counted. Before, one vanished VM failed the
// whole batch and its machines were untainted and judged again.
func TestAzureDeleteBatchNamingAVanishedVM(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("vanish", "Standard_D16s_v5", 4, nil)
	sc.registered(cpu, 4)
	if err := sc.s.sim.InjectFault(sc.rg, cpu, armsim.Fault{Kind: armsim.FaultVanishBeforeDelete, Count: 1}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// The brake's shares at 1: the four empty nodes go in one batch.
	p := sc.autoscaler("one", fastScaleDown("--nodes=0:10:"+cpu,
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	sc.eventually("the set empty and its nodes gone", 3*time.Minute, func() (bool, string) {
		vms := sc.vms(cpu)
		return len(vms) == 0 && sc.nodesOf()[cpu] == 0, fmt.Sprintf("VMs %v, nodes %d\n%s", vms, sc.nodesOf()[cpu], sc.writeLog(cpu))
	})
	var refused, sent []armsim.Write
	for _, w := range sc.writesTo(cpu) {
		if w.Op != armsim.OpDeleteInstances || w.At.Before(start) || w.Caller == armsim.CallerOf("e2e-token-"+sc.prefix) {
			continue
		}
		if w.Status == http.StatusBadRequest {
			refused = append(refused, w)
		} else if accepted(w) {
			sent = append(sent, w)
		}
	}
	if len(refused) != 1 || len(refused[0].InstanceIDs) < 2 {
		t.Fatalf("refused deletions %v, want one batch of 2 or more (the fault not applied: the scenario proves nothing)\n%s", refused, sc.writeLog(cpu))
	}
	vanished := refused[0].InstanceIDs[0]
	var resent []string
	for _, w := range sent {
		if w.At.After(refused[0].At) {
			resent = append(resent, w.InstanceIDs...)
		}
	}
	for _, id := range refused[0].InstanceIDs[1:] {
		if !slices.Contains(resent, id) {
			t.Fatalf("instance %s of the refused batch never sent again (sent after it: %v)\n%s", id, resent, sc.writeLog(cpu))
		}
	}
	if slices.Contains(resent, vanished) {
		t.Fatalf("the vanished instance %s sent again: %v\n%s", vanished, resent, sc.writeLog(cpu))
	}
	_, body := sc.get(p, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_failed_scale_downs_total{node_group="`+cpu+`",step="delete"}`); got > 0 {
		t.Fatalf("%v failed scale-downs counted for a batch sent again, want none", got)
	}
}
