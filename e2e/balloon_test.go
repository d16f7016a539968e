package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// balloonScenario is a GPU group with a warm pool, its balloons in their
// own namespace so the scenario's pod counts are the job's alone.
type balloonScenario struct {
	*scenario
	gpu, balloonNS string
}

func newBalloonScenario(t *testing.T) *balloonScenario {
	sc := newScenario(t)
	ns := sc.restrictedNamespace("e2e-balloons")
	return &balloonScenario{scenario: sc, gpu: sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, nil), balloonNS: ns}
}

func (bs *balloonScenario) autoscaler(name string, extra ...string) *harness.Process {
	return bs.scenario.autoscaler(name, fastScaleDown(append([]string{
		"--nodes=0:10:" + bs.gpu, "--balloon-namespace=" + bs.balloonNS,
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1",
		"--node-addition-adaptive=false",
	}, extra...)...)...)
}

// balloonsRunning counts Running balloon pods and the nodes they hold.
func (bs *balloonScenario) balloonsRunning() (int, map[string]bool) {
	pods, err := bs.s.cp.Client.CoreV1().Pods(bs.balloonNS).List(bs.ctx, metav1.ListOptions{LabelSelector: balloon.DefaultLabel})
	if err != nil {
		bs.t.Fatal(err)
	}
	n, nodes := 0, map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase == apiv1.PodRunning && p.DeletionTimestamp == nil {
			n++
			nodes[p.Spec.NodeName] = true
		}
	}
	return n, nodes
}

func (bs *balloonScenario) warm(n int, p *harness.Process) {
	bs.t.Helper()
	bs.eventually(fmt.Sprintf("%d warm nodes holding balloons", n), 3*time.Minute, func() (bool, string) {
		running, _ := bs.balloonsRunning()
		_, body := bs.get(p, "/metrics")
		ready := metricValue(body, `vmss_autoscaler_warm_pool_ready_nodes{node_group="`+bs.gpu+`"}`)
		return running == n && ready == float64(n), fmt.Sprintf("balloons running %d, warm ready %v, capacity %d", running, ready, bs.capacity(bs.gpu))
	})
}

func released(body, set, class string) float64 {
	return max(0, metricValue(body, `vmss_autoscaler_node_addition_released_nodes_total{class="`+class+`",node_group="`+set+`"}`))
}

// A warm pool of 3: the nodes come up holding balloons; a job of 2
// whole-node pods runs on them at once by preempting balloons, and no node
// is requested for the job; the displaced balloons bring 2 nodes at
// balloon class; lowering the target removes the surplus; a deleted balloon
// Deployment comes back.
func TestBalloonsKeepWarmNodes(t *testing.T) {
	t.Parallel()
	bs := newBalloonScenario(t)
	bs.failover = true // kills its leader
	first := bs.autoscaler("one", "--warm-pool="+bs.gpu+":3")
	bs.warm(3, first)
	_, warmNodes := bs.balloonsRunning()
	_, body := bs.get(first, "/metrics")
	if got := released(body, bs.gpu, "balloon"); got != 3 {
		t.Fatalf("balloon nodes released %v, want 3", got)
	}
	start := time.Now()
	bs.workload("train", 2, "90", 8, bs.gpu)
	bs.eventually("the job's 2 pods Running", time.Minute, allRunning(bs.scenario, 2))
	t.Logf("job Running %s after it was created, on warm nodes", time.Since(start).Round(100*time.Millisecond))
	pods, err := bs.s.cp.Client.CoreV1().Pods(bs.ns).List(bs.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if !warmNodes[p.Spec.NodeName] {
			t.Fatalf("job pod %s runs on %s, not on a warm node %v", p.Name, p.Spec.NodeName, warmNodes)
		}
	}
	// The displaced balloons come back on 2 new nodes: the pool is whole.
	bs.warm(3, first)
	if got := bs.capacity(bs.gpu); got != 5 {
		t.Fatalf("capacity %d, want 5 (2 for the job, 3 warm)", got)
	}
	_, body = bs.get(first, "/metrics")
	if got := released(body, bs.gpu, "workload"); got != 0 {
		t.Fatalf("%v nodes requested for the job's pods, want none: they fit by displacing balloons", got)
	}
	if got := released(body, bs.gpu, "balloon"); got != 5 {
		t.Fatalf("balloon nodes released %v, want 3 + the 2 displaced", got)
	}
	// Lower the target to 1: the surplus warm nodes go.
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	second := bs.autoscaler("two", "--warm-pool="+bs.gpu+":1")
	bs.eventually("the surplus warm nodes removed", 3*time.Minute, func() (bool, string) {
		c := bs.capacity(bs.gpu)
		running, _ := bs.balloonsRunning()
		return c == 3 && running == 1, fmt.Sprintf("capacity %d, balloons running %d", c, running)
	})
	bs.eventually("the job still Running", 30*time.Second, allRunning(bs.scenario, 2))
	// Someone deletes the balloon Deployment: it is recreated.
	name := balloon.DeploymentName(bs.gpu)
	deps := bs.s.cp.Client.AppsV1().Deployments(bs.balloonNS)
	old, err := deps.Get(bs.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := deps.Delete(bs.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	bs.eventually("the balloon Deployment recreated", time.Minute, func() (bool, string) {
		d, err := deps.Get(bs.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && d.UID == old.UID) {
			return false, "not recreated yet"
		}
		if err != nil {
			return false, err.Error()
		}
		return *d.Spec.Replicas == 1, fmt.Sprintf("replicas %d", *d.Spec.Replicas)
	})
	_, body = bs.get(second, "/metrics")
	if !strings.Contains(body, `vmss_autoscaler_warm_pool_target_nodes{node_group="`+bs.gpu+`"} 1`) {
		t.Errorf("/metrics lacks the warm target 1")
	}
}

// The control: the same scenario with balloon awareness off counts the
// balloons as real work, so the nodes they bring are workload nodes and the
// test above would fail on them.
func TestBalloonAwarenessOffCountsBalloonsAsWork(t *testing.T) {
	t.Parallel()
	bs := newBalloonScenario(t)
	as := bs.autoscaler("autoscaler", "--warm-pool="+bs.gpu+":3", "--balloon-aware=false")
	bs.eventually("3 balloons Running", 3*time.Minute, func() (bool, string) {
		running, _ := bs.balloonsRunning()
		return running == 3, fmt.Sprintf("balloons running %d, capacity %d", running, bs.capacity(bs.gpu))
	})
	bs.workload("train", 2, "90", 8, bs.gpu)
	bs.eventually("the job's 2 pods Running", time.Minute, allRunning(bs.scenario, 2))
	bs.eventually("5 nodes", 2*time.Minute, func() (bool, string) {
		c := bs.capacity(bs.gpu)
		return c == 5, fmt.Sprintf("capacity %d", c)
	})
	_, body := bs.get(as, "/metrics")
	if got := released(body, bs.gpu, "workload"); got < 5 {
		t.Fatalf("workload nodes released %v without balloon awareness, want all 5", got)
	}
	if got := released(body, bs.gpu, "balloon"); got != 0 {
		t.Fatalf("balloon nodes released %v without balloon awareness, want 0", got)
	}
}
