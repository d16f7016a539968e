package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// preflightTags make a scale set's nodes join tainted and labelled
// pending, as a real scale set's tags (and kubelet flags) would.
func preflightTags() map[string]string {
	k := strings.ReplaceAll(preflight.DefaultTaintKey, "/", "__")
	return map[string]string{
		armsim.TaintTagPrefix + k: preflight.ValuePending + ":NoSchedule",
		armsim.LabelTagPrefix + k: preflight.ValuePending,
	}
}

// Check files for the agent: a pass that takes a moment, and a GPU count
// that comes up short, as nvidia-smi -L on a node with a lost GPU.
const (
	passingChecks = `deadline: 1m
checks:
- name: burn-in
  command: ["sh", "-c", "sleep 2; echo ok"]
  timeout: 30s
  match: '^ok$'
`
	failingChecks = `deadline: 1m
checks:
- name: gpus
  command: ["sh", "-c", "for i in 0 1 2 3 4 5 6; do echo GPU $i: NVIDIA H100; done"]
  timeout: 30s
  match: '^GPU \d+:'
  minMatches: 8
`
)

// agents are the preflight DaemonSet of a scenario (the real agent, run by
// the harness for every node of the given scale sets that joins pending).
// fails decides, per scale set and join order (1-based), which nodes get
// the failing checks.
type agents struct {
	mu     sync.Mutex
	failed map[string]bool
	procs  []*harness.Process
}

func (sc *scenario) runAgents(fails func(set string, nth int) bool, sets ...string) *agents {
	sc.t.Helper()
	dir := sc.t.TempDir()
	pass, fail := filepath.Join(dir, "pass.yaml"), filepath.Join(dir, "fail.yaml")
	if err := os.WriteFile(pass, []byte(passingChecks), 0o600); err != nil {
		sc.t.Fatal(err)
	}
	if err := os.WriteFile(fail, []byte(failingChecks), 0o600); err != nil {
		sc.t.Fatal(err)
	}
	mine := map[string]bool{}
	for _, s := range sets {
		mine[s] = true
	}
	ag := &agents{failed: map[string]bool{}}
	count := map[string]int{} // only the runner's goroutine touches it
	checksFor := func(n *apiv1.Node) string {
		set := n.Labels[armsim.NodeGroupLabel]
		if !mine[set] {
			return ""
		}
		count[set]++
		if fails(set, count[set]) {
			ag.mu.Lock()
			ag.failed[n.Name] = true
			ag.mu.Unlock()
			return fail
		}
		return pass
	}
	started := func(p *harness.Process, err error) {
		if err != nil {
			sc.t.Errorf("starting a preflight agent: %v", err)
			return
		}
		ag.mu.Lock()
		ag.procs = append(ag.procs, p)
		ag.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(sc.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc.s.cp.RunPreflightAgents(ctx, sc.s.autoscaler, preflight.DefaultLabel+"="+preflight.ValuePending, checksFor, started)
	}()
	sc.t.Cleanup(func() {
		cancel()
		<-done
		for _, p := range ag.procs {
			_ = p.Stop()
		}
	})
	return ag
}

func (ag *agents) failedCount() int {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	return len(ag.failed)
}

// nodesLabelled counts the scenario's nodes by preflight label.
func (sc *scenario) nodesLabelled(set string) map[string]int {
	out := map[string]int{}
	nodes, err := sc.s.cp.Client.CoreV1().Nodes().List(sc.ctx, metav1.ListOptions{LabelSelector: armsim.NodeGroupLabel + "=" + set})
	if err != nil {
		sc.t.Fatal(err)
	}
	for _, n := range nodes.Items {
		out[n.Labels[preflight.DefaultLabel]]++
	}
	return out
}

// Nodes join tainted; the agent passes them after a couple of seconds;
// pods wait for that and then run on them, and the pods waiting for nodes
// in preflight never cause a second scale-up.
func TestPreflightHoldsNodesUntilTheAgentPasses(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, preflightTags())
	as := sc.autoscaler("autoscaler", "--nodes=0:10:"+gpu, "--max-preflight-time=5m")
	sc.runAgents(func(string, int) bool { return false }, gpu)
	sc.workload("train", 4, "90", 8, gpu)
	sc.eventually("4 pods Running", 3*time.Minute, allRunning(sc, 4))
	if got := sc.capacity(gpu); got != 4 {
		t.Fatalf("capacity %d, want 4: pods waiting for nodes in preflight must not trigger another scale-up", got)
	}
	// The autoscaler sees the passes in its next loop.
	sc.eventually("4 preflight passes counted", 30*time.Second, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		passed := metricValue(body, `vmss_autoscaler_preflight_results_total{node_group="`+gpu+`",result="passed"}`)
		timed := metricValue(body, `vmss_autoscaler_preflight_duration_seconds_count{node_group="`+gpu+`"}`)
		return passed == 4 && timed == 4, fmt.Sprintf("passed %v, timed %v", passed, timed)
	})
	_, body := sc.get(as, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_scaled_up_nodes_total{node_group="`+gpu+`"}`); got != 4 {
		t.Fatalf("scaled_up_nodes_total %v, want 4", got)
	}
	// No pod was bound to a node before the agent passed it.
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		n, err := sc.s.cp.Client.CoreV1().Nodes().Get(sc.ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		passedAt, err := time.Parse(time.RFC3339, n.Annotations[preflight.PassedAtAnnotation])
		if err != nil || n.Labels[preflight.DefaultLabel] != preflight.ValuePassed {
			t.Fatalf("pod %s runs on node %s, which did not pass preflight (label %q, passed-at %q)",
				p.Name, n.Name, n.Labels[preflight.DefaultLabel], n.Annotations[preflight.PassedAtAnnotation])
		}
		for _, c := range p.Status.Conditions {
			if c.Type == apiv1.PodScheduled && c.Status == apiv1.ConditionTrue && c.LastTransitionTime.Time.Before(passedAt) {
				t.Fatalf("pod %s scheduled at %s, before node %s passed preflight at %s", p.Name, c.LastTransitionTime.Time, n.Name, passedAt)
			}
		}
		for _, taint := range n.Spec.Taints {
			if taint.Key == preflight.DefaultTaintKey {
				t.Fatalf("node %s still has the preflight taint", n.Name)
			}
		}
	}
}

// A third of one group's nodes fail preflight: each is replaced, the
// group is backed off at the third failure, and the other group takes the
// rest of the work.
func TestPreflightFailuresAreReplacedAndBackTheGroupOff(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	a := sc.scaleSet("a", "Standard_ND96isr_H100_v5", 0, preflightTags())
	b := sc.scaleSet("b", "Standard_ND96isr_H100_v5", 0, preflightTags())
	as := sc.autoscaler("autoscaler", "--nodes=0:20:"+a, "--nodes=0:20:"+b,
		"--preflight-failures-before-backoff=3", "--preflight-failure-window=10m", "--preflight-failure-settle=5s")
	ag := sc.runAgents(func(set string, nth int) bool { return set == a && nth%3 == 1 }, a, b)
	sc.workload("train", 10, "90", 8, a, b) // ties go to the lowest group ID: a first
	sc.eventually("10 pods Running", 4*time.Minute, allRunning(sc, 10))
	sc.eventually("failed nodes gone", time.Minute, func() (bool, string) {
		la := sc.nodesLabelled(a)
		return la[preflight.ValueFailed] == 0, fmt.Sprintf("%s: %v", a, la)
	})
	if n := ag.failedCount(); n < 3 {
		t.Fatalf("%d nodes given failing checks, want at least 3 for the backoff", n)
	}
	_, body := sc.get(as, "/metrics")
	failed := metricValue(body, `vmss_autoscaler_preflight_results_total{node_group="`+a+`",result="failed"}`)
	replaced := metricValue(body, `vmss_autoscaler_preflight_replaced_nodes_total{node_group="`+a+`"}`)
	if failed < 3 || replaced != failed {
		t.Fatalf("preflight failed %v, replaced %v in %s; want at least 3, all replaced", failed, replaced, a)
	}
	if got := metricValue(body, `vmss_autoscaler_node_group_backoff{node_group="`+a+`"}`); got != 1 {
		t.Fatalf("%s backoff %v, want 1 after 3 preflight failures", a, got)
	}
	if got := sc.capacity(b); got == 0 {
		t.Fatalf("%s never scaled up: the other group must keep scaling while %s is backed off", b, a)
	}
	evs := sc.eventsAnywhere("PreflightFailures")
	if len(evs) == 0 || !strings.Contains(evs[0].Message, "3 nodes failed preflight") {
		t.Fatalf("PreflightFailures events %v", evs)
	}
	if failedEvs := sc.eventsAnywhere("PreflightFailed"); len(failedEvs) < 3 || !strings.Contains(failedEvs[0].Message, "matched") {
		t.Fatalf("PreflightFailed events %v, want one per failed node with the agent's reason", failedEvs)
	}
	// Every running pod is on a node that passed.
	if got, want := sc.nodesLabelled(a)[preflight.ValuePassed]+sc.nodesLabelled(b)[preflight.ValuePassed], 10; got != want {
		t.Fatalf("%d passed nodes, want %d (one per pod)", got, want)
	}
}

// With 60 % of the cluster pending preflight, scale-up and scale-down of
// the rest go on, and the pending nodes are never removed.
func TestPreflightPendingMajorityDoesNotFreezeTheCluster(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 6, preflightTags())
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 4, nil)
	sc.registered(gpu, 6)
	sc.registered(cpu, 4)
	as := sc.autoscaler("autoscaler", fastScaleDown("--nodes=0:10:"+gpu, "--nodes=0:10:"+cpu, "--max-preflight-time=30m",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	// No agent runs for the GPU nodes: they stay pending throughout.
	sc.workload("web", 6, "9", 0, cpu)
	sc.eventually("6 web pods Running", 2*time.Minute, allRunning(sc, 6))
	if got := sc.capacity(cpu); got != 6 {
		t.Fatalf("cpu capacity %d, want 6", got)
	}
	if err := sc.s.cp.Client.AppsV1().Deployments(sc.ns).Delete(sc.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sc.eventually("the empty cpu nodes removed", 2*time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 0, fmt.Sprintf("cpu capacity %d", c)
	})
	sc.stays(gpu, 6, as, 3)
	_, body := sc.get(as, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_preflight_pending_nodes{node_group="`+gpu+`"}`); got != 6 {
		t.Fatalf("preflight_pending_nodes %v, want 6", got)
	}
	if got := metricValue(body, `vmss_autoscaler_nodes{node_group="`+gpu+`",state="unready"}`); got != 0 {
		t.Fatalf("%v unready gpu nodes: pending preflight must not count as unready", got)
	}
}

// eventsAnywhere lists events with a reason in the scenario's namespace
// and on its nodes (events on cluster-scoped objects live in "default").
func (sc *scenario) eventsAnywhere(reason string) []apiv1.Event {
	sc.t.Helper()
	evs, err := sc.s.cp.Client.CoreV1().Events("").List(sc.ctx, metav1.ListOptions{})
	if err != nil {
		sc.t.Fatal(err)
	}
	var out []apiv1.Event
	for _, e := range evs.Items {
		if e.Reason == reason && (e.Namespace == sc.ns || strings.HasPrefix(e.InvolvedObject.Name, sc.prefix)) {
			out = append(out, e)
		}
	}
	return out
}
