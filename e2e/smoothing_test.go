package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// smoothingFlags are a fixed node-addition rate for the scenarios: no
// adaptive mode (it would move the rate), no scale-down (it would remove
// nodes being counted).
func smoothingFlags(set string, rate, burst int) []string {
	return []string{
		"--nodes=0:400:" + set,
		fmt.Sprintf("--node-addition-rate=%d", rate),
		fmt.Sprintf("--node-addition-burst=%d", burst),
		"--max-nodes-in-flight=1000",
		"--node-addition-adaptive=false",
		"--scale-down-enabled=false",
	}
}

// nodeCreations are the creation times of the Node objects of a scale set,
// as the API server stamped them, sorted.
func (sc *scenario) nodeCreations(set string) []time.Time {
	sc.t.Helper()
	nodes, err := sc.s.cp.Client.CoreV1().Nodes().List(sc.ctx, metav1.ListOptions{LabelSelector: armsim.NodeGroupLabel + "=" + set})
	if err != nil {
		sc.t.Fatal(err)
	}
	out := make([]time.Time, 0, len(nodes.Items))
	for _, n := range nodes.Items {
		out = append(out, n.CreationTimestamp.Time)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// busiestMinute is the most Node objects created within any 60 s window
// (timestamps have one-second resolution: [t, t+60 s) of stamps).
func busiestMinute(ts []time.Time) (int, time.Time) {
	best, at := 0, time.Time{}
	j := 0
	for i := range ts {
		for j < len(ts) && ts[j].Before(ts[i].Add(time.Minute)) {
			j++
		}
		if j-i > best {
			best, at = j-i, ts[i]
		}
	}
	return best, at
}

// removeNodesAfter empties the scale set when the test ends, so its
// hundreds of nodes do not weigh on the tests after it.
func (sc *scenario) removeNodesAfter(set string) {
	sc.t.Cleanup(func() {
		if err := sc.s.sim.SetCapacity(sc.rg, set, 0); err != nil {
			sc.t.Logf("emptying %s: %v", set, err)
		}
	})
}

// 0 → 200 nodes at 120 nodes a minute, the autoscaler killed half-way and
// restarted: no minute sees more than the limit (±10 %), every pod runs,
// and the restarted autoscaler requests exactly what is still needed.
// (200, not the 300 it was: the minutes before and after the failover
// are the ones that could break the limit, and 100 nodes each side cover
// them; the 100 more cost 50 s of a test that runs alone.)
func TestSmoothingSpreadsNodeAdditions(t *testing.T) {
	const pods, rate, burst = 200, 120, 5
	sc := newScenario(t)
	sc.failover = true // kills or freezes a leader
	set := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	sc.removeNodesAfter(set)
	first := sc.autoscaler("one", smoothingFlags(set, rate, burst)...)
	sc.workload("web", pods, "9", 0, set) // one pod per 16-CPU node
	sc.eventually("the queue to hold nodes back", 2*time.Minute, func() (bool, string) {
		_, body := sc.get(first, "/metrics")
		held := strings.Contains(body, `vmss_autoscaler_node_addition_queue_depth{class="workload",node_group="`+set+`"}`)
		return held, fmt.Sprintf("capacity %d", sc.capacity(set))
	})
	sc.eventually("the status ConfigMap to show the queue", 30*time.Second, func() (bool, string) {
		cm, err := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns).Get(sc.ctx, "vmss-autoscaler-status", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st := cm.Data["status"]
		return strings.Contains(st, "heldBy: rate") && strings.Contains(st, "nodeGroup: "+set), st
	})
	sc.eventually("half the nodes requested", 3*time.Minute, func() (bool, string) {
		c := sc.capacity(set)
		return c >= pods/2, fmt.Sprintf("capacity %d", c)
	})
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	killedAt := sc.capacity(set)
	second := sc.autoscaler("two", smoothingFlags(set, rate, burst)...)
	sc.eventually(fmt.Sprintf("%d pods Running", pods), 6*time.Minute, allRunning(sc, pods))
	if got := sc.capacity(set); got != pods {
		t.Fatalf("capacity %d after the restart (killed at %d), want exactly %d: nothing requested twice", got, killedAt, pods)
	}
	sc.stays(set, pods, second, 3)
	ts := sc.nodeCreations(set)
	if len(ts) != pods {
		t.Fatalf("%d Node objects, want %d", len(ts), pods)
	}
	most, at := busiestMinute(ts)
	t.Logf("%d nodes created from %s to %s; busiest minute %d nodes from %s; killed at capacity %d",
		len(ts), ts[0].Format(time.TimeOnly), ts[len(ts)-1].Format(time.TimeOnly), most, at.Format(time.TimeOnly), killedAt)
	if limit := rate * 11 / 10; most > limit {
		t.Fatalf("%d nodes created in the minute from %s, over the limit %d nodes/min (+10%% = %d)", most, at.Format(time.TimeOnly), rate, limit)
	}
	_, body := sc.get(second, "/metrics")
	for _, want := range []string{
		"vmss_autoscaler_node_addition_rate_nodes_per_minute 120",
		`vmss_autoscaler_node_addition_rate_reason{reason="configured"} 1`,
		`vmss_autoscaler_node_addition_released_nodes_total{class="workload",node_group="` + set + `"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The control for the test above: the same scale-up with smoothing off
// reaches the API server as one burst, which the rate check would refuse.
func TestWithoutSmoothingNodesArriveInABurst(t *testing.T) {
	const pods, rate = 200, 120
	sc := newScenario(t)
	set := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	sc.removeNodesAfter(set)
	sc.autoscaler("autoscaler", append(smoothingFlags(set, rate, 5), "--node-addition-smoothing=false")...)
	sc.workload("web", pods, "9", 0, set)
	sc.eventually(fmt.Sprintf("%d pods Running", pods), 5*time.Minute, allRunning(sc, pods))
	most, at := busiestMinute(sc.nodeCreations(set))
	t.Logf("busiest minute without smoothing: %d nodes from %s", most, at.Format(time.TimeOnly))
	if most <= rate*11/10 {
		t.Fatalf("busiest minute %d nodes without smoothing: no burst over %d, so the smoothing test could not fail", most, rate*11/10)
	}
}

// Half the pods are deleted while their nodes wait in the queue: those
// nodes are never created.
func TestCancelledQueuedNodesAreNeverCreated(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	set := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	sc.removeNodesAfter(set)
	as := sc.autoscaler("autoscaler", smoothingFlags(set, 30, 2)...)
	d := sc.deployment("web", 60, "9", 0, set)
	sc.create(d)
	depth := `vmss_autoscaler_node_addition_queue_depth{class="workload",node_group="` + set + `"}`
	// Every pod's node must be planned (queued or requested) before the
	// scale-down: what is cancelled is what was planned less the 30 pods
	// kept, and a pod the scheduler has not yet marked unschedulable is
	// not planned.
	sc.eventually("all 60 pods' nodes planned, most of them queued", 2*time.Minute, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		q, c := metricValue(body, depth), sc.capacity(set)
		return q >= 40 && q+float64(c) >= 60, fmt.Sprintf("queued %v, capacity %d", q, c)
	})
	// Scaling the Deployment down deletes the pods that are not running
	// first: the ones whose nodes are queued.
	scale, err := sc.s.cp.Client.AppsV1().Deployments(sc.ns).GetScale(sc.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = 30
	if _, err := sc.s.cp.Client.AppsV1().Deployments(sc.ns).UpdateScale(sc.ctx, "web", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if c := sc.capacity(set); c >= 30 {
		t.Fatalf("capacity already %d when the pods were deleted; the test needs them queued", c)
	}
	sc.eventually("30 pods Running", 4*time.Minute, allRunning(sc, 30))
	sc.stays(set, 30, as, 5)
	_, body := sc.get(as, "/metrics")
	cancelled := metricValue(body, `vmss_autoscaler_node_addition_cancelled_nodes_total{class="workload",node_group="`+set+`"}`)
	if cancelled < 20 {
		t.Fatalf("cancelled nodes %v, want about 30 (the deleted pods' queued nodes)", cancelled)
	}
	t.Logf("%v queued nodes cancelled", cancelled)
	if n := len(sc.nodeCreations(set)); n != 30 {
		t.Fatalf("%d Node objects, want 30", n)
	}
}
