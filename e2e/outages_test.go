package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// supervised is an autoscaler run as a Deployment's pod is: started again
// whenever it exits (the kubelet's restartPolicy Always), 1 s after.
type supervised struct {
	sc   *scenario
	name string
	args []string

	mu       sync.Mutex
	cur      *harness.Process
	restarts int
	exits    []time.Time
}

func (sc *scenario) supervise(name string, args ...string) *supervised {
	sc.t.Helper()
	s := &supervised{sc: sc, name: name, args: args, cur: sc.autoscaler(name, args...)}
	go s.watch()
	return s
}

func (s *supervised) watch() {
	for {
		p := s.current()
		select {
		case <-s.sc.ctx.Done():
			return
		case <-p.Exited():
		}
		s.mu.Lock()
		s.exits = append(s.exits, time.Now())
		s.restarts++
		n := s.restarts
		s.mu.Unlock()
		select {
		case <-s.sc.ctx.Done():
			return
		case <-time.After(time.Second): // the kubelet's restart delay, not a synchronisation
		}
		next, err := s.sc.startAutoscaler(fmt.Sprintf("%s-%d", s.name, n), s.args...)
		if err != nil {
			s.sc.t.Errorf("restarting %s: %v", s.name, err)
			return
		}
		s.mu.Lock()
		s.cur = next
		s.mu.Unlock()
	}
}

func (s *supervised) current() *harness.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// exited says how many times the autoscaler exited so far.
func (s *supervised) exited() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.exits)
}

// firstExit is when the autoscaler first exited (the zero time if it has not).
func (s *supervised) firstExit() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.exits) == 0 {
		return time.Time{}
	}
	return s.exits[0]
}

// serving waits until the current process answers /metrics.
func (s *supervised) serving(timeout time.Duration) *harness.Process {
	s.sc.t.Helper()
	var p *harness.Process
	s.sc.eventually("the autoscaler serving", timeout, func() (bool, string) {
		p = s.current()
		code, _ := s.sc.get(p, "/metrics")
		return code == http.StatusOK, fmt.Sprintf("%s: %d", p.Name, code)
	})
	return p
}

// writesTo are the simulator's write requests about a scale set.
func (sc *scenario) writesTo(set string) []armsim.Write {
	var out []armsim.Write
	for _, w := range sc.s.sim.Writes() {
		if strings.EqualFold(w.ScaleSet, set) && strings.EqualFold(w.ResourceGroup, sc.rg) {
			out = append(out, w)
		}
	}
	return out
}

// accepted says whether ARM took the write (2xx).
func accepted(w armsim.Write) bool { return w.Status >= 200 && w.Status < 300 }

// increasesOnce checks that no scale-up was applied twice: every capacity
// ARM accepted is above the one before and at most max, and no machine was
// deleted unless deletions are allowed.
func (sc *scenario) increasesOnce(set string, max int, deletions bool) {
	sc.t.Helper()
	last := -1
	for _, w := range sc.writesTo(set) {
		if !accepted(w) {
			continue
		}
		switch w.Op {
		case armsim.OpUpdateScaleSet:
			if w.Capacity >= 0 && (w.Capacity <= last || w.Capacity > max) {
				sc.t.Fatalf("ARM accepted capacity %d after %d (at most %d): an increase applied twice or a decrease\n%s", w.Capacity, last, max, sc.writeLog(set))
			}
			if w.Capacity >= 0 {
				last = w.Capacity
			}
		case armsim.OpDeleteInstances:
			if !deletions {
				sc.t.Fatalf("ARM accepted a deletion:\n%s", sc.writeLog(set))
			}
		}
	}
}

func (sc *scenario) writeLog(set string) string {
	var b strings.Builder
	for _, w := range sc.writesTo(set) {
		fmt.Fprintf(&b, "%s %s %s capacity=%d -> %d\n", w.At.Format("15:04:05.000"), w.Method, w.Op, w.Capacity, w.Status)
	}
	return b.String()
}

// silentBetween fails when ARM received a write about the set in [from, to].
func (sc *scenario) silentBetween(set string, from, to time.Time, why string) {
	sc.t.Helper()
	for _, w := range sc.writesTo(set) {
		if !w.At.Before(from) && !w.At.After(to) {
			sc.t.Fatalf("a write to ARM at %s while %s (%s to %s):\n%s", w.At.Format("15:04:05.000"), why,
				from.Format("15:04:05.000"), to.Format("15:04:05.000"), sc.writeLog(set))
		}
	}
}

func (sc *scenario) capacityIs(set string, want int) func() (bool, string) {
	return func() (bool, string) {
		c := sc.capacity(set)
		return c == want, fmt.Sprintf("capacity %d", c)
	}
}

// leaseLockError is what client-go's leader election logs when it cannot
// read the lease (the API server unreachable).
const leaseLockError = "Error retrieving lease lock"

// logCount counts the occurrences of s in a process's log.
func (sc *scenario) logCount(p *harness.Process, s string) int {
	b, err := os.ReadFile(p.LogFile)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
}

// flagDuration reads a duration flag a process was started with, from the
// command line its log begins with (the last value given wins).
func (sc *scenario) flagDuration(p *harness.Process, flag string) time.Duration {
	sc.t.Helper()
	f, err := os.Open(p.LogFile)
	if err != nil {
		sc.t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		sc.t.Fatalf("reading the command line of %s: %v", p.Name, err)
	}
	var d time.Duration
	found := false
	for _, arg := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(arg, flag+"="); ok {
			if d, err = time.ParseDuration(v); err != nil {
				sc.t.Fatalf("%s: %s: %v", p.Name, arg, err)
			}
			found = true
		}
	}
	if !found {
		sc.t.Fatalf("%s was not started with %s: %s", p.Name, flag, line)
	}
	return d
}

// The API server is killed (SIGKILL) in the middle of a scale-up and
// started again. The autoscaler loses its lease and exits; it makes no ARM
// write from its renew deadline after the kill (or its exit, if later)
// until the API server is back (neither it nor its replacement holds a
// renewed lease); restarted,
// it finishes the scale-up: exactly what the pods need, no increase
// applied twice.
func TestAPIServerKilledMidScaleUp(t *testing.T) {
	sc := newScenario(t)
	sc.failover = true // kills or freezes a leader
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	as := sc.supervise("one", "--nodes=0:40:"+cpu, "--node-addition-adaptive=false", "--node-addition-rate=20", "--node-addition-burst=1")
	sc.workload("web", 12, "12", 0, cpu) // 12 nodes at 20/min: about 35 s of scale-up
	sc.eventually("the scale-up under way", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c >= 2, fmt.Sprintf("capacity %d", c)
	})
	leader := as.current()
	renewDeadline := sc.flagDuration(leader, "--leader-elect-renew-deadline")
	cp := sc.s.cp
	if err := cp.KillComponent(harness.APIServer); err != nil {
		t.Fatal(err)
	}
	// KillComponent returns once the API server has exited: no renewal of
	// the lease succeeds after killed, so from killed+renewDeadline on the
	// leader's fence (the lease renewed within the renew deadline) lets no
	// write start.
	killed := time.Now()
	deadline := killed.Add(renewDeadline)
	restarted := false
	t.Cleanup(func() {
		if !restarted { // the rest of the suite needs an API server
			_ = cp.StartComponent(sc.ctx, harness.APIServer)
		}
	})
	// The API server stays down until the leader has exited on its lost
	// lease and its replacement (started 1 s later) has tried for the
	// lease and failed minLeaseFailures times, 0.5-1.1 s apart: the window
	// checked below covers a process that does not hold the lease.
	const minLeaseFailures = 3
	sc.eventually("the leader exited on its lost lease and its replacement failing to get the lease", time.Minute, func() (bool, string) {
		p := as.current()
		if p == leader {
			return false, fmt.Sprintf("%s, the leader, not replaced yet (%d exits)", p.Name, as.exited())
		}
		n := sc.logCount(p, leaseLockError)
		return n >= minLeaseFailures, fmt.Sprintf("%s: %d failed attempts at the lease", p.Name, n)
	})
	// Down until it is started: it serves requests before its /readyz,
	// which StartComponent waits for, says ready.
	back := time.Now()
	if err := cp.StartComponent(sc.ctx, harness.APIServer); err != nil {
		t.Fatal(err)
	}
	restarted = true
	// The window starts at the renew deadline, or at the leader's exit if
	// that is later: the fence is checked before a write is sent, so a
	// write let through just before the deadline reaches ARM a request's
	// latency after it; one sent before the leader exited, before its exit.
	// The leader exits a retry period (0.5 s) or more after its fence shut.
	from, exited := deadline, as.firstExit()
	if exited.After(from) {
		from = exited
	}
	// At least the restart delay and two retry periods.
	if w := back.Sub(from); w < time.Second {
		t.Fatalf("the API server came back %s after the window opened (killed %s, renew deadline %s, leader exited %s, back %s): too short a window to check",
			w, killed.Format("15:04:05.000"), deadline.Format("15:04:05.000"), exited.Format("15:04:05.000"), back.Format("15:04:05.000"))
	}
	t.Logf("no write from %s to %s (%s; killed %s, renew deadline %s, leader exited %s)", from.Format("15:04:05.000"), back.Format("15:04:05.000"),
		back.Sub(from), killed.Format("15:04:05.000"), deadline.Format("15:04:05.000"), exited.Format("15:04:05.000"))
	sc.silentBetween(cpu, from, back, "no process held a renewed lease (the API server down)")
	sc.eventually("12 pods Running", 3*time.Minute, allRunning(sc, 12))
	p := as.serving(time.Minute)
	sc.steadyFor(p, 5, "capacity 12", sc.capacityIs(cpu, 12))
	sc.increasesOnce(cpu, 12, false)
}

// etcd freezes (every request hangs) and the kubelets stop heartbeating
// (kwok killed) until every node is NotReady; with scale-down set to remove
// unready nodes after 3 s, not one machine is deleted — not while etcd is
// frozen, not while the nodes are NotReady — and the ClusterUnhealthy event
// says why. Then the nodes come back and a new workload scales up to
// exactly what it needs.
func TestEtcdFrozenUntilEveryNodeIsNotReady(t *testing.T) {
	sc := newScenario(t)
	sc.failover = true // kills or freezes a leader
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	// Nodes younger than --max-node-startup-time are still starting, not
	// unready: 20 s, so that the nodes of this scenario are past it.
	as := sc.supervise("one", fastScaleDown("--nodes=0:40:"+cpu, "--node-addition-adaptive=false",
		"--node-addition-rate=600", "--node-addition-burst=10", "--max-node-startup-time=20s")...)
	sc.workload("web", 6, "12", 0, cpu)
	sc.eventually("6 pods Running", 2*time.Minute, allRunning(sc, 6))
	p := as.serving(time.Minute)
	sc.steadyFor(p, 3, "capacity 6", sc.capacityIs(cpu, 6))
	cp := sc.s.cp
	frozen := time.Now()
	cp.FreezeEtcd()
	if err := cp.KillComponent(harness.Kwok); err != nil {
		cp.ThawEtcd()
		t.Fatal(err)
	}
	kwokBack := false
	t.Cleanup(func() {
		cp.ThawEtcd()
		if !kwokBack {
			_ = cp.StartComponent(sc.ctx, harness.Kwok)
		}
	})
	sc.eventually("the autoscaler exits on its lost lease", time.Minute, func() (bool, string) {
		return as.exited() >= 1, "still running"
	})
	cp.ThawEtcd()
	thawed := time.Now()
	// The controller manager marks every node NotReady once their leases
	// are older than its grace period.
	sc.eventually("every node of the set NotReady", 3*time.Minute, func() (bool, string) {
		ready := 0
		nodes := sc.nodeList(cpu)
		for _, n := range nodes {
			for _, c := range n.Status.Conditions {
				if c.Type == apiv1.NodeReady && c.Status == apiv1.ConditionTrue {
					ready++
				}
			}
		}
		return len(nodes) == 6 && ready == 0, fmt.Sprintf("%d of %d Ready", ready, len(nodes))
	})
	p = as.serving(time.Minute)
	sc.eventually("a ClusterUnhealthy event", time.Minute, func() (bool, string) {
		n := len(sc.events("ClusterUnhealthy"))
		return n > 0, fmt.Sprintf("%d events", n)
	})
	sc.steadyFor(p, 10, "all 6 machines kept", func() (bool, string) {
		_, body := sc.get(p, "/metrics")
		if v := metricValue(body, "vmss_autoscaler_cluster_unhealthy"); v == 0 {
			return false, "cluster_unhealthy 0 with every node NotReady"
		}
		running := 0
		for _, st := range sc.vms(cpu) {
			if st == armsim.StateRunning {
				running++
			}
		}
		return running == 6, fmt.Sprintf("%d VMs running", running)
	})
	if err := cp.StartComponent(sc.ctx, harness.Kwok); err != nil {
		t.Fatal(err)
	}
	kwokBack = true
	sc.silentBetween(cpu, frozen, thawed, "etcd was frozen")
	sc.eventually("the nodes Ready again", 2*time.Minute, func() (bool, string) {
		n := sc.readyNodesOf()[cpu]
		return n == 6, fmt.Sprintf("%d Ready", n)
	})
	sc.workload("more", 3, "12", 0, cpu)
	sc.eventually("9 pods Running", 3*time.Minute, allRunning(sc, 9))
	p = as.serving(time.Minute)
	sc.steadyFor(p, 5, "capacity 9", sc.capacityIs(cpu, 9))
	sc.increasesOnce(cpu, 9, false)
}

// ARM throttles every write (429, Retry-After) for two minutes in the
// middle of a scale-up, and every read for the first of them. The
// autoscaler honours Retry-After — a handful of throttled writes, not one
// per loop — and finishes the scale-up once ARM recovers: exactly what the
// pods need, no increase applied twice.
func TestARMThrottledForMinutesDuringAScaleUp(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	// ARM throttles per principal and subscription: the autoscaler has a
	// token of its own, so scenarios running alongside are not throttled.
	token, caller := sc.ownARMToken("one")
	p := sc.autoscaler("one", "--nodes=0:40:"+cpu, "--node-addition-adaptive=false", "--node-addition-rate=20", "--node-addition-burst=1", token)
	sc.workload("web", 10, "12", 0, cpu)
	sc.eventually("the scale-up under way", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c >= 2, fmt.Sprintf("capacity %d", c)
	})
	until := sc.s.sim.ThrottleCaller(caller, "write", 2*time.Minute)
	start := until.Add(-2 * time.Minute)
	sc.s.sim.ThrottleCaller(caller, "read", time.Minute)
	sc.eventually("the throttling over", 3*time.Minute, func() (bool, string) {
		return time.Now().After(until), "ARM still throttling"
	})
	// The simulator's log, not the capacity read after the window: the
	// autoscaler may write the moment the window ends.
	throttled := 0
	for _, w := range sc.writesTo(cpu) {
		if w.At.Before(start) || !w.At.Before(until) {
			continue
		}
		if w.Status != http.StatusTooManyRequests {
			t.Fatalf("a write answered %d while every write was throttled:\n%s", w.Status, sc.writeLog(cpu))
		}
		throttled++
	}
	// A loop a second for two minutes: honouring Retry-After (120 s, then
	// what is left) is a few attempts, not 120.
	if throttled == 0 || throttled > 6 {
		t.Fatalf("%d throttled writes in two minutes, want between 1 and 6:\n%s", throttled, sc.writeLog(cpu))
	}
	sc.eventually("10 pods Running", 3*time.Minute, allRunning(sc, 10))
	sc.steadyFor(p, 5, "capacity 10", sc.capacityIs(cpu, 10))
	sc.increasesOnce(cpu, 10, false)
	t.Logf("%d throttled writes in 2 minutes of write throttling", throttled)
}

// A scale-up's VMs fail to allocate (AllocationFailed): the failed
// machines are deleted, the group backs off, and a later scale-up brings
// what the pods need. Then the workload goes, and the first deletion of
// the empty nodes fails (the operation fails, the VMs run again): the
// nodes are untainted, the failure counted, and the deletion retried
// until the set is empty.
func TestFailedCreateAndDeleteOperations(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	if err := sc.s.sim.InjectFault(sc.rg, cpu, armsim.Fault{Kind: armsim.FaultAllocation, Count: 1}); err != nil {
		t.Fatal(err)
	}
	p := sc.autoscaler("one", fastScaleDown("--nodes=0:20:"+cpu, "--node-addition-adaptive=false", "--node-addition-rate=600",
		"--node-addition-burst=10", "--initial-node-group-backoff-duration=5s",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...) // the brake is not the subject
	sc.workload("web", 4, "12", 0, cpu)
	sc.eventually("4 pods Running", 3*time.Minute, allRunning(sc, 4))
	sc.steadyFor(p, 5, "capacity 4", sc.capacityIs(cpu, 4))
	failedGone := true
	for _, st := range sc.vms(cpu) {
		if st == armsim.StateFailed {
			failedGone = false
		}
	}
	if !failedGone {
		t.Fatalf("VMs %v: a failed machine is still there", sc.vms(cpu))
	}
	if n := len(sc.eventsAnywhere("FailedScaleUp")); n == 0 {
		t.Fatal("no FailedScaleUp event for the allocation failure")
	}
	// The workload goes; the first deletion of its empty nodes fails.
	if err := sc.s.sim.InjectFault(sc.rg, cpu, armsim.Fault{Kind: armsim.FaultDeleteFails, Count: 1}); err != nil {
		t.Fatal(err)
	}
	injected := time.Now()
	sc.scaleDeployment("web", 0)
	// Capacity alone cannot tell the two deletions apart: ARM's capacity
	// leaves out Deleting VMs, so it reads 0 while the failing deletion is
	// still in flight. Wait for the failure to be counted, then for the
	// scale set to hold no VM at all, then for a second deletion in the log.
	failedDelete := `vmss_autoscaler_failed_scale_downs_total{node_group="` + cpu + `",step="delete"}`
	sc.eventually("the failed deletion counted", 3*time.Minute, func() (bool, string) {
		_, body := sc.get(p, "/metrics")
		got := metricValue(body, failedDelete)
		return got >= 1, fmt.Sprintf("%s %v, VMs %v\n%s", failedDelete, got, sc.vms(cpu), sc.writeLog(cpu))
	})
	sc.eventually("the deletion retried: no VM left", 3*time.Minute, func() (bool, string) {
		vms := sc.vms(cpu)
		return len(vms) == 0, fmt.Sprintf("VMs %v", vms)
	})
	deletes := 0
	for _, w := range sc.writesTo(cpu) {
		if w.At.After(injected) && w.Op == "DeleteInstances" && accepted(w) {
			deletes++
		}
	}
	if deletes < 2 {
		t.Fatalf("%d accepted deletions after the fault, want the failed one and its retry:\n%s", deletes, sc.writeLog(cpu))
	}
	sc.steadyFor(p, 3, "capacity 0", sc.capacityIs(cpu, 0))
}
