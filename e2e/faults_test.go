package e2e

import (
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	apiv1 "k8s.io/api/core/v1"
)

// ARM applies a scale-up's PATCH and answers 500 (twice): the capacity is
// exactly what the pods need, never the delta applied twice, and it stays
// there.
func TestCommittedWriteWithALostAnswer(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	if err := sc.s.sim.InjectFault(sc.rg, cpu, armsim.Fault{Kind: armsim.FaultCommitThenServerError, Count: 2}); err != nil {
		t.Fatal(err)
	}
	p := sc.autoscaler("one", "--nodes=0:20:"+cpu, "--node-addition-adaptive=false", "--node-addition-burst=4", "--node-addition-rate=600")
	sc.workload("web", 8, "12", 0, cpu)
	sc.eventually("8 pods Running", 2*time.Minute, allRunning(sc, 8))
	sc.steadyFor(p, 5, "capacity 8", func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 8, fmt.Sprintf("capacity %d", c)
	})
	if !sc.logContains(p, "Scale-up committed though its answer was lost") {
		t.Fatal("the autoscaler never saw a lost answer: the fault did not fire")
	}
}

// The leader is frozen (SIGSTOP) past its lease in the middle of a
// scale-up; the standby takes over and finishes it; the old leader,
// resumed (SIGCONT), sends no write to ARM and exits. The capacity ends
// exactly at what the pods need.
//
// The old leader has an ARM token of its own, so the simulator's write log
// tells its writes from the new leader's: none may come after the resume.
// (Its log cannot tell: a write that committed just before the freeze is
// logged only after the resume.)
func TestFrozenLeaderWritesNothing(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	sc.failover = true // kills or freezes a leader
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	args := []string{"--nodes=0:40:" + cpu, "--node-addition-adaptive=false", "--node-addition-rate=20", "--node-addition-burst=1"}
	tokenA, callerA := sc.ownARMToken("a")
	a := sc.autoscaler("a", append(args, tokenA)...)
	sc.eventually("a leading", 30*time.Second, func() (bool, string) {
		return sc.logContains(a, "Starting autoscaler loop"), "not yet"
	})
	b := sc.autoscaler("b", args...)
	sc.workload("web", 12, "12", 0, cpu) // 12 nodes at 20/min: about 35 s of scale-up
	sc.eventually("the scale-up under way", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c >= 2, fmt.Sprintf("capacity %d", c)
	})
	if err := syscall.Kill(a.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(a.Pid(), syscall.SIGCONT) })
	sc.eventually("b leading", time.Minute, func() (bool, string) {
		return sc.logContains(b, "Starting autoscaler loop"), "not yet"
	})
	before := sc.capacity(cpu)
	sc.eventually("b scaling", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c > before, fmt.Sprintf("capacity %d", c)
	})
	resumedAt := len(sc.s.sim.Writes())
	if err := syscall.Kill(a.Pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	sc.eventually("the old leader exits", time.Minute, func() (bool, string) {
		select {
		case <-a.Exited():
			return true, ""
		default:
			return false, "still running"
		}
	})
	writes := sc.s.sim.Writes()
	byA := 0
	for _, w := range writes[:resumedAt] {
		if w.Caller == callerA {
			byA++
		}
	}
	if byA == 0 {
		t.Fatal("no write of the first leader in the simulator's log before the freeze: its writes cannot be told apart")
	}
	for _, w := range writes[resumedAt:] {
		if w.Caller == callerA {
			t.Fatalf("the frozen leader wrote to ARM after it was resumed: %+v", w)
		}
	}
	sc.eventually("12 pods Running", 2*time.Minute, allRunning(sc, 12))
	sc.steadyFor(b, 5, "capacity 12", func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 12, fmt.Sprintf("capacity %d", c)
	})
}

// A periodic check fails on 40% of the GPU nodes at once (as the chart's
// DNS check would in a DNS outage) while 6 other nodes fail checks of their
// own (bad machines). The 8 are an incident: none stays cordoned (the
// first reported may be cordoned at once, as any node a periodic check
// failed, and are uncordoned when the incident is seen), none is drained
// or deleted, and a PreflightIncident event and metric say so. The 6 bad
// machines are replaced within the replacement brake's budget (4), the
// other 2 wait cordoned. When DNS is back and the agent passes the 8
// again, the incident is over; the pods run on exactly 20 live VMs and no
// VM of the 8 was ever deleted.
//
// The test marks the nodes one by one, as agents report, and the
// autoscaler's loops see every count between 0 and 14 failed; a failure
// is drained or deleted only once it has stood --preflight-failure-settle
// (30 s here), by when all 14 are seen, and the incident ends only once fewer
// than the threshold have failed the check for as long.
func TestPeriodicFailureOnManyNodesIsAnIncident(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, nil)
	p := sc.autoscaler("one", "--nodes=0:40:"+gpu, "--node-addition-adaptive=false", "--node-addition-rate=600",
		"--node-addition-burst=20", "--replacement-brake-min-nodes=4", "--preflight-failures-before-backoff=0",
		"--preflight-failure-settle=30s")
	sc.workload("train", 20, "80", 8, gpu)
	sc.eventually("20 pods Running", 3*time.Minute, allRunning(sc, 20))
	nodes := sc.nodeList(gpu)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	// The periodic agent marks nodes failed: label failed, its message in
	// the annotation, no taint (it never taints a passed node).
	fail := func(n apiv1.Node, msg string) {
		sc.updateNode(n.Name, false, func(n *apiv1.Node) {
			n.Labels["vmss-autoscaler.io/preflight"] = "failed"
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations["vmss-autoscaler.io/preflight-failure"] = msg
		})
	}
	outage, bad := map[string]bool{}, map[string]bool{}
	outageVMs := map[string]bool{}
	for _, n := range nodes[:8] {
		fail(n, "check dns: exit status 1: lookup kubernetes.default.svc: i/o timeout")
		outage[n.Name] = true
		outageVMs[n.Spec.ProviderID[strings.LastIndex(n.Spec.ProviderID, "/")+1:]] = true
	}
	for i, n := range nodes[8:14] {
		fail(n, fmt.Sprintf("check %s: exit status 1", []string{"ecc", "xid", "nvlink", "infiniband", "gpu-count", "dcgm"}[i]))
		bad[n.Name] = true
	}
	sc.eventually("a PreflightIncident event, 4 bad machines replaced and 2 cordoned", 2*time.Minute, func() (bool, string) {
		cordoned, gone := 0, 0
		left := map[string]bool{}
		for _, n := range sc.nodeList(gpu) {
			left[n.Name] = true
			if bad[n.Name] && n.Spec.Unschedulable {
				cordoned++
			}
		}
		for name := range bad {
			if !left[name] {
				gone++
			}
		}
		incidents := len(sc.events("PreflightIncident"))
		return incidents == 1 && gone == 4 && cordoned == 2, fmt.Sprintf("%d incident events, %d bad nodes gone, %d cordoned", incidents, gone, cordoned)
	})
	outageKept := func() (bool, string) {
		for _, n := range sc.nodeList(gpu) {
			if outage[n.Name] && n.Spec.Unschedulable {
				return false, "node " + n.Name + " cordoned during the incident"
			}
		}
		for id, st := range sc.vms(gpu) {
			if outageVMs[id] && st != armsim.StateRunning {
				return false, "VM " + id + " of the incident is " + st
			}
		}
		left := len(failedLeft(sc.nodeList(gpu), outage))
		return left == 8, fmt.Sprintf("%d of the incident's nodes left", left)
	}
	sc.steadyFor(p, 10, "the incident's nodes kept", outageKept)
	_, body := sc.get(p, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_preflight_incident_nodes{check="dns"}`); got != 8 {
		t.Fatalf("preflight_incident_nodes{check=dns} %v, want 8", got)
	}
	if got := metricValue(body, "vmss_autoscaler_replacement_brake_engaged"); got != 1 {
		t.Fatalf("replacement_brake_engaged %v, want 1: 2 bad machines wait past the budget", got)
	}
	// DNS is back: the agent's periodic re-run passes the 8.
	for _, n := range nodes[:8] {
		sc.updateNode(n.Name, false, func(n *apiv1.Node) {
			n.Labels["vmss-autoscaler.io/preflight"] = "passed"
			delete(n.Annotations, "vmss-autoscaler.io/preflight-failure")
		})
	}
	sc.eventually("a PreflightIncidentOver event", 2*time.Minute, func() (bool, string) {
		n := len(sc.events("PreflightIncidentOver"))
		return n == 1, fmt.Sprintf("%d events", n)
	})
	sc.eventually("20 pods Running", 3*time.Minute, allRunning(sc, 20))
	sc.steadyFor(p, 5, "exactly 20 live VMs, the incident's all running", func() (bool, string) {
		if ok, state := outageKept(); !ok {
			return false, state
		}
		live := 0
		for _, st := range sc.vms(gpu) {
			if st != armsim.StateDeleting {
				live++
			}
		}
		return live == 20, fmt.Sprintf("%d live VMs", live)
	})
	_, body = sc.get(p, "/metrics")
	if strings.Contains(body, "vmss_autoscaler_preflight_incident_nodes{") {
		t.Fatal("preflight_incident_nodes still exported after the incident")
	}
}

// failedLeft are the failed nodes whose Node objects are still there.
func failedLeft(nodes []apiv1.Node, failed map[string]bool) []string {
	var out []string
	for _, n := range nodes {
		if failed[n.Name] {
			out = append(out, n.Name)
		}
	}
	return out
}
