package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// loops is the number of loops an autoscaler has finished.
func (sc *scenario) loops(p *harness.Process) float64 {
	_, body := sc.get(p, "/metrics")
	return metricValue(body, "vmss_autoscaler_loop_duration_seconds_count")
}

// steadyFor checks cond at every poll until the autoscaler has run n more
// loops: an invariant over loops, not over wall-clock time.
func (sc *scenario) steadyFor(p *harness.Process, n float64, what string, cond func() (bool, string)) {
	sc.t.Helper()
	start := sc.loops(p)
	sc.eventually(fmt.Sprintf("%v more loops with %s", n, what), 2*time.Minute, func() (bool, string) {
		if ok, state := cond(); !ok {
			sc.t.Fatalf("%s broken after %v loops: %s", what, sc.loops(p)-start, state)
		}
		done := sc.loops(p) - start
		return done >= n, fmt.Sprintf("%v loops", done)
	})
}

// vms lists a scale set's VMs by instance ID and state.
func (sc *scenario) vms(set string) map[string]string {
	st, err := sc.s.sim.ScaleSet(sc.rg, set)
	if err != nil {
		sc.t.Fatal(err)
	}
	out := map[string]string{}
	for _, vm := range st.VMs {
		out[vm.InstanceID] = vm.State
	}
	return out
}

// A warm pool of 3 whole-node balloons on nodes whose allocatable is below
// the VM size: exactly 3 warm nodes, and no more bought over 10 loops (the
// balloons are sized from a node of the group, so each fits the node it
// buys).
func TestWarmPoolOnRealNodesStaysAtItsSize(t *testing.T) {
	t.Parallel()
	bs := newBalloonScenario(t)
	p := bs.autoscaler("one", "--warm-pool="+bs.gpu+":3")
	bs.warm(3, p)
	bs.steadyFor(p, 10, "3 warm nodes", func() (bool, string) {
		running, _ := bs.balloonsRunning()
		c := bs.capacity(bs.gpu)
		return c == 3 && running == 3, fmt.Sprintf("capacity %d, balloons running %d", c, running)
	})
	st, err := bs.s.cp.Client.CoreV1().ConfigMaps(bs.ns).Get(bs.ctx, "vmss-autoscaler-status", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Data["status"], "templateSource: node/") {
		t.Fatalf("status does not say the template is learned from a node:\n%s", st.Data["status"])
	}
}

// 8 whole-node GPU pods on nodes that advertise their GPUs 20 s after they
// register buy exactly 8 nodes: a node waiting for its device plugin is
// coming capacity, not a reason to buy another.
func TestGPUsAdvertisedLateBuyOneNodeEach(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, nil)
	p := sc.autoscaler("one", "--nodes=0:20:"+gpu, "--node-addition-adaptive=false")
	sc.workload("train", 8, "90", 8, gpu)
	sc.eventually("8 pods Running", 3*time.Minute, allRunning(sc, 8))
	if c := sc.capacity(gpu); c != 8 {
		t.Fatalf("capacity %d for 8 whole-node pods, want 8", c)
	}
	_, body := sc.get(p, "/metrics")
	if got := released(body, gpu, "workload"); got != 8 {
		t.Fatalf("released %v nodes, want 8", got)
	}
}

// With the resource group lower-cased in the nodes' providerIDs (an MC_
// resource group, as on AKS), no VM is ever counted unregistered or
// deleted, past a short provision time; scale-down still removes the empty
// nodes.
func TestLowerCasedResourceGroupInProviderIDs(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	if strings.ToLower(sc.rg) == sc.rg {
		t.Fatalf("resource group %s has no capitals: the test proves nothing", sc.rg)
	}
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	p := sc.autoscaler("one", fastScaleDown("--nodes=0:10:"+cpu, "--max-node-provision-time=15s",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1", "--node-addition-adaptive=false")...)
	sc.workload("web", 3, "12", 0, cpu)
	sc.eventually("3 pods Running", 2*time.Minute, allRunning(sc, 3))
	nodes, err := sc.s.cp.Client.CoreV1().Nodes().List(sc.ctx, metav1.ListOptions{LabelSelector: armsim.NodeGroupLabel + "=" + cpu})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if strings.Contains(n.Spec.ProviderID, sc.rg) {
			t.Fatalf("node %s providerID %s has the resource group as ARM spells it", n.Name, n.Spec.ProviderID)
		}
	}
	vms := sc.vms(cpu)
	unregistered := func() float64 {
		_, body := sc.get(p, "/metrics")
		return metricValue(body, `vmss_autoscaler_nodes{node_group="`+cpu+`",state="long_unregistered"}`) +
			metricValue(body, `vmss_autoscaler_nodes{node_group="`+cpu+`",state="unregistered"}`)
	}
	// Once every node has registered (the metric lags by a loop), each VM
	// is matched to its node: with IDs compared exactly, none ever would be.
	sc.eventually("every VM matched to its node", 30*time.Second, func() (bool, string) {
		n := unregistered()
		return n == 0, fmt.Sprintf("%v unregistered", n)
	})
	// 20 loops of 1 s: past the 15 s provision time of every VM.
	sc.steadyFor(p, 20, "no VM unregistered or deleted", func() (bool, string) {
		unreg := unregistered()
		now := sc.vms(cpu)
		for id := range vms {
			if now[id] != armsim.StateRunning {
				return false, fmt.Sprintf("VM %s is %q", id, now[id])
			}
		}
		return unreg == 0, fmt.Sprintf("%v unregistered", unreg)
	})
	if err := sc.s.cp.Client.AppsV1().Deployments(sc.ns).Delete(sc.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sc.eventually("the empty nodes removed", 2*time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 0, fmt.Sprintf("capacity %d", c)
	})
}

// A node whose network agent keeps a startup taint on it for 20 s is coming
// capacity: its pod buys no second node, and while it is empty and tainted
// it is never removed.
func TestStartupTaintedNodesAreComingCapacity(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	hook := realisticHook(sc.s.cp)
	hook.Realism.StartupTaints = []apiv1.Taint{{Key: "node.cilium.io/agent-not-ready", Value: "true", Effect: apiv1.TaintEffectNoSchedule}}
	hook.Realism.StartupTaintDelay = 20 * time.Second
	sc.s.hook.use(cpu, hook)
	t.Cleanup(func() { sc.s.hook.use(cpu, sc.s.hook.inner) })
	p := sc.autoscaler("one", fastScaleDown("--nodes=0:10:"+cpu, "--scale-down-brake-cluster-share=1",
		"--scale-down-brake-group-share=1", "--node-addition-adaptive=false")...)
	sc.workload("web", 2, "12", 0, cpu)
	sc.eventually("2 tainted nodes registered", time.Minute, func() (bool, string) {
		nodes, err := sc.s.cp.Client.CoreV1().Nodes().List(sc.ctx, metav1.ListOptions{LabelSelector: armsim.NodeGroupLabel + "=" + cpu})
		if err != nil {
			t.Fatal(err)
		}
		tainted := 0
		for _, n := range nodes.Items {
			for _, tt := range n.Spec.Taints {
				if tt.Key == "node.cilium.io/agent-not-ready" {
					tainted++
				}
			}
		}
		return tainted == 2, fmt.Sprintf("%d tainted of %d", tainted, len(nodes.Items))
	})
	// Empty, Ready and tainted for 20 s against a 3 s unneeded time.
	sc.steadyFor(p, 8, "2 nodes, none removed", func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 2, fmt.Sprintf("capacity %d", c)
	})
	sc.eventually("2 pods Running", time.Minute, allRunning(sc, 2))
	if c := sc.capacity(cpu); c != 2 {
		t.Fatalf("capacity %d, want 2", c)
	}
	_, body := sc.get(p, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_scaled_down_nodes_total{node_group="`+cpu+`",reason="empty"}`); got != 0 {
		t.Fatalf("%v empty nodes removed while their startup taint was on", got)
	}
}
