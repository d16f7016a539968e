package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// 40 pods of 3 CPUs on 16-vCPU machines: 5 per node, 8 nodes, from the CPU
// group; the GPU group must not be touched.
func TestScaleUpFromZero(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, nil)
	as := sc.autoscaler("autoscaler", "--nodes=0:20:"+cpu, "--nodes=0:20:"+gpu)
	sc.workload("web", 40, "3", 0, cpu, gpu)
	sc.eventually("40 pods Running", 3*time.Minute, allRunning(sc, 40))
	if got := sc.capacity(cpu); got != 8 {
		t.Errorf("cpu capacity %d, want 8", got)
	}
	if got := sc.capacity(gpu); got != 0 {
		t.Errorf("gpu capacity %d, want 0 (CPU pods never buy GPU machines)", got)
	}
	sc.eventually("TriggeredScaleUp events", 30*time.Second, func() (bool, string) {
		n := len(sc.events("TriggeredScaleUp"))
		return n > 0, fmt.Sprintf("%d events", n)
	})
	ev := sc.events("TriggeredScaleUp")[0]
	if !strings.Contains(ev.Message, cpu) {
		t.Errorf("TriggeredScaleUp %q does not name %s", ev.Message, cpu)
	}
	// The status ConfigMap, /metrics and /healthz.
	sc.eventually("status ConfigMap", 30*time.Second, func() (bool, string) {
		cm, err := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns).Get(sc.ctx, "vmss-autoscaler-status", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st := cm.Data["status"]
		return strings.Contains(st, "name: "+cpu) && strings.Contains(st, "ready: 8"), st
	})
	code, body := sc.get(as, "/metrics")
	for _, want := range []string{
		`vmss_autoscaler_scaled_up_nodes_total{node_group="` + cpu + `"} 8`,
		`vmss_autoscaler_arm_requests_total{code="200",operation="VirtualMachineScaleSetsClient.BeginUpdate"}`,
		`vmss_autoscaler_nodes{node_group="` + cpu + `",state="ready"} 8`,
		// The adaptive node-addition rate (on by default) reads the API
		// server's flow-control rejections from its /metrics.
		"vmss_autoscaler_apiserver_metrics_readable 1",
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %s", code, want)
		}
	}
	if code, body := sc.get(as, "/healthz"); code != 200 || !strings.Contains(body, "leader") {
		t.Errorf("/healthz = %d %q", code, body)
	}
}

func TestNoScaleUpForPodsThatFit(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 2, nil)
	sc.eventually("2 nodes registered", time.Minute, func() (bool, string) {
		n := sc.nodesOf()[cpu]
		return n == 2, fmt.Sprint(n)
	})
	as := sc.autoscaler("autoscaler", "--nodes=0:20:"+cpu)
	sc.workload("web", 8, "3", 0, cpu)
	sc.eventually("8 pods Running", time.Minute, allRunning(sc, 8))
	// Still nothing requested at every poll over the next 3 loops (counted
	// from here, not from the process start: by now it has usually run
	// more than 3, and a count from the start waited for none).
	sc.steadyFor(as, 3, "capacity 2", sc.capacityIs(cpu, 2))
}

func TestPodNoGroupCanTake(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	team := sc.scaleSet("team", "Standard_ND96isr_H100_v5", 0, map[string]string{
		"k8s.io_cluster-autoscaler_node-template_taint_openai.com__team": "rl:NoSchedule"})
	sc.autoscaler("autoscaler", "--nodes=0:20:"+cpu, "--nodes=0:20:"+team)
	sc.workload("train", 1, "8", 8, cpu, team)
	// Any of the pod's events: every autoscaler in the cluster sees the
	// pod, and those of scenarios running alongside tell it that their
	// groups' node affinity does not match.
	sc.eventually("NotTriggerScaleUp", time.Minute, func() (bool, string) {
		ev := sc.events("NotTriggerScaleUp")
		var msgs []string
		for _, e := range ev {
			m := e.Message
			if strings.Contains(m, "Insufficient nvidia.com/gpu") && strings.Contains(m, "untolerated taint") {
				return true, m
			}
			msgs = append(msgs, m)
		}
		return false, fmt.Sprintf("%d events: %q", len(ev), msgs)
	})
	if sc.capacity(cpu)+sc.capacity(team) != 0 {
		t.Fatalf("scaled up: cpu %d team %d", sc.capacity(cpu), sc.capacity(team))
	}
}

func TestQuotaErrorFallsBackToNextGroup(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	a := sc.scaleSet("a", "Standard_D16s_v5", 0, nil)
	b := sc.scaleSet("b", "Standard_D16s_v5", 0, nil)
	if err := sc.s.sim.InjectFault(sc.rg, a, armsim.Fault{Kind: armsim.FaultQuota}); err != nil {
		t.Fatal(err)
	}
	as := sc.autoscaler("autoscaler", "--nodes=0:20:"+a, "--nodes=0:20:"+b)
	sc.workload("web", 10, "3", 0, a, b)
	sc.eventually("10 pods Running", 3*time.Minute, allRunning(sc, 10))
	if sc.capacity(a) != 0 || sc.capacity(b) != 2 {
		t.Fatalf("capacities a=%d b=%d, want 0 and 2", sc.capacity(a), sc.capacity(b))
	}
	_, body := sc.get(as, "/metrics")
	for _, want := range []string{
		`vmss_autoscaler_failed_scale_ups_total{node_group="` + a + `",reason="quota"}`,
		`vmss_autoscaler_node_group_backoff{node_group="` + a + `"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestNeverRegisteredMachinesAreReplaced(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	a := sc.scaleSet("a", "Standard_D16s_v5", 0, nil)
	b := sc.scaleSet("b", "Standard_D16s_v5", 0, nil)
	sc.s.hook.silence(a)
	as := sc.autoscaler("autoscaler", "--nodes=0:20:"+a, "--nodes=0:20:"+b, "--max-node-provision-time=15s")
	sc.workload("web", 5, "3", 0, a, b)
	sc.eventually("5 pods Running", 3*time.Minute, allRunning(sc, 5))
	sc.eventually("group a's machines deleted", time.Minute, func() (bool, string) {
		st, _ := sc.s.sim.ScaleSet(sc.rg, a)
		return st.Capacity == 0, fmt.Sprintf("capacity %d", st.Capacity)
	})
	if sc.capacity(b) != 1 {
		t.Fatalf("group b capacity %d, want 1", sc.capacity(b))
	}
	_, body := sc.get(as, "/metrics")
	if !strings.Contains(body, `vmss_autoscaler_failed_scale_ups_total{node_group="`+a+`",reason="provision-timeout"} 1`) {
		t.Errorf("/metrics lacks the provision timeout of %s", a)
	}
}

// Two replicas; the leader is killed in the middle of a scale-up; the other
// takes over and the final size is what the pods need, never more.
func TestLeaderElectionTakeover(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	sc.failover = true // kills or freezes a leader
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	first := sc.autoscaler("one", "--nodes=0:40:"+cpu)
	sc.eventually("a leader", 30*time.Second, func() (bool, string) {
		return sc.logContains(first, "Starting autoscaler loop"), "no leader yet"
	})
	second := sc.autoscaler("two", "--nodes=0:40:"+cpu)
	sc.workload("web", 30, "3", 0, cpu)
	sc.eventually("a scale-up", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c > 0, fmt.Sprint(c)
	})
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	sc.eventually("the standby to lead", time.Minute, func() (bool, string) {
		return sc.logContains(second, "Starting autoscaler loop"), "standby has not taken over"
	})
	sc.eventually("30 pods Running", 3*time.Minute, allRunning(sc, 30))
	if got := sc.capacity(cpu); got != 6 {
		t.Fatalf("capacity %d, want 6 (30 pods x 3 CPU, 5 per node)", got)
	}
}

// The flags ConfigMap is followed live: a slow node-addition rate is raised
// by editing it, and the scale-up speeds up without a restart; a bad value
// is refused as a whole, with an event naming it, and changes nothing.
func TestLiveConfigMapTuning(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	cms := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns)
	cm := &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "vmss-autoscaler-config"},
		Data: map[string]string{"config.yaml": "node-addition-rate: 6\nnode-addition-burst: 1\nnode-addition-adaptive: false\n"}}
	if _, err := cms.Create(sc.ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	as := sc.autoscaler("autoscaler", "--nodes=0:20:"+cpu, "--config-map=vmss-autoscaler-config")
	sc.workload("web", 12, "9", 0, cpu)
	sc.eventually("the first node at 6 nodes/min", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c >= 1, fmt.Sprint(c)
	})
	if c := sc.capacity(cpu); c > 3 {
		t.Fatalf("capacity %d at 6 nodes/min with a burst of 1: the ConfigMap's rate is not in force", c)
	}
	edit := func(data string) {
		t.Helper()
		cur, err := cms.Get(sc.ctx, cm.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Data["config.yaml"] = data
		if _, err := cms.Update(sc.ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	edit("node-addition-rate: 600\nnode-addition-burst: 50\nnode-addition-adaptive: false\n")
	sc.eventually("12 pods Running after the rate was raised live", time.Minute, allRunning(sc, 12))
	if n := len(sc.events("ConfigApplied")); n == 0 {
		t.Fatal("no ConfigApplied event")
	}
	edit("node-addition-rate: 600\nnode-addition-burst: 0\n")
	sc.eventually("the bad value refused with an event naming it", 30*time.Second, func() (bool, string) {
		n := sc.eventsWith("ConfigRejected", "--node-addition-burst: must be at least 1, got 0")
		return n > 0, fmt.Sprintf("%d events", n)
	})
	_, body := sc.get(as, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_config_reloads_total{result="rejected"}`); got != 1 {
		t.Fatalf("rejected reloads %v, want 1", got)
	}
	if got := metricValue(body, "vmss_autoscaler_node_addition_rate_nodes_per_minute"); got != 600 {
		t.Fatalf("rate %v after a refused edit, want the last good 600", got)
	}
}
