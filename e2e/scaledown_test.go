package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// fastScaleDown compresses scale-down's timings as a user would.
func fastScaleDown(extra ...string) []string {
	return append([]string{
		"--scale-down-unneeded-time=3s",
		"--scale-down-unready-time=3s",
		"--scale-down-delay-after-add=0s",
		"--scale-down-delay-after-failure=2s",
	}, extra...)
}

// registered waits for n Ready nodes of the set.
func (sc *scenario) registered(set string, n int) {
	sc.t.Helper()
	sc.eventually(fmt.Sprintf("%d nodes of %s", n, set), time.Minute, func() (bool, string) {
		got := sc.nodesOf()[set]
		return got == n, fmt.Sprint(got)
	})
}

func (sc *scenario) nodeNames(set string) []string {
	var out []string
	for _, n := range sc.nodeList(set) {
		out = append(out, n.Name)
	}
	return out
}

// updateNode changes a node (or its status), retrying on conflicts.
func (sc *scenario) updateNode(name string, status bool, change func(*apiv1.Node)) {
	sc.t.Helper()
	nodes := sc.s.cp.Client.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(sc.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(n)
		if status {
			_, err = nodes.UpdateStatus(sc.ctx, n, metav1.UpdateOptions{})
		} else {
			_, err = nodes.Update(sc.ctx, n, metav1.UpdateOptions{})
		}
		return err
	})
	if err != nil {
		sc.t.Fatalf("updating node %s: %v", name, err)
	}
}

// stays checks that the set keeps n VMs while the autoscaler runs the
// given number of further loops (read from its own loop counter).
func (sc *scenario) stays(set string, n int, p *harness.Process, loops float64) {
	sc.t.Helper()
	_, body := sc.get(p, "/metrics")
	until := metricValue(body, "vmss_autoscaler_loop_duration_seconds_count") + loops
	sc.eventually(fmt.Sprintf("%v more loops with %s at %d", loops, set, n), time.Minute, func() (bool, string) {
		if got := sc.capacity(set); got != n {
			sc.t.Fatalf("%s capacity %d, want it to stay %d", set, got, n)
		}
		_, body := sc.get(p, "/metrics")
		v := metricValue(body, "vmss_autoscaler_loop_duration_seconds_count")
		return v >= until, fmt.Sprintf("%v loops", v)
	})
}

func TestScaleDownEmptyNodes(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 3, nil)
	sc.registered(cpu, 3)
	as := sc.autoscaler("autoscaler", fastScaleDown("--nodes=1:10:"+cpu,
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	sc.eventually("scale-down to the min size", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 1, fmt.Sprintf("capacity %d", c)
	})
	sc.registered(cpu, 1)
	sc.exported(as, `vmss_autoscaler_scaled_down_nodes_total{node_group="`+cpu+`",reason="empty"} 2`)
}

// exported waits until the process's /metrics has every line. For
// counters counted after the write they count (a deletion is counted once
// ARM answered it, and the simulator may delete the Node first): waiting
// for the value is safe, a counter never goes back.
func (sc *scenario) exported(p *harness.Process, lines ...string) {
	sc.t.Helper()
	sc.eventually(fmt.Sprintf("/metrics with %s", strings.Join(lines, ", ")), 30*time.Second, func() (bool, string) {
		_, body := sc.get(p, "/metrics")
		for _, l := range lines {
			if !strings.Contains(body, l) {
				return false, "lacks " + l
			}
		}
		return true, ""
	})
}

// Three nodes: one empty but annotated scale-down-disabled, one whose only
// pod is covered by a PDB that allows no disruption (the pod could run on
// either other node: only the PDB keeps it), one empty. Only the last goes.
func TestScaleDownRespectsPDBAndDisabledAnnotation(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 3, nil)
	sc.registered(cpu, 3)
	names := sc.nodeNames(cpu)
	disabled, guarded, free := names[0], names[1], names[2]
	// One node is annotated scale-down-disabled.
	sc.updateNode(disabled, false, func(n *apiv1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations["cluster-autoscaler.kubernetes.io/scale-down-disabled"] = "true"
	})
	// One pod guarded by a PDB that allows no disruption runs on another.
	zero := intstr.FromInt32(0)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: sc.ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &zero, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}
	if _, err := sc.s.cp.Client.PolicyV1().PodDisruptionBudgets(sc.ns).Create(sc.ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The pod is placed on the guarded node by cordoning the two others
	// while it is scheduled, not by a node selector: pinned, it would have
	// no place to move, and that alone would keep its node.
	sc.scheduledOn("web", "1", guarded, disabled, free)
	as := sc.autoscaler("autoscaler", fastScaleDown("--nodes=0:10:"+cpu,
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	sc.eventually("the free node removed", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 2, fmt.Sprintf("capacity %d", c)
	})
	sc.stays(cpu, 2, as, 5)
	// The Node object goes when the simulator finishes deleting the VM.
	sc.eventually("the disabled and the PDB-guarded nodes left", time.Minute, func() (bool, string) {
		left := map[string]bool{}
		for _, n := range sc.nodeNames(cpu) {
			left[n] = true
		}
		return len(left) == 2 && left[disabled] && left[guarded], fmt.Sprintf("nodes %v, want %s (scale-down-disabled) and %s (PDB)", left, disabled, guarded)
	})
	sc.onNode("web", guarded)
	sc.exported(as, `vmss_autoscaler_scale_down_kept_nodes{reason="pdb"} 1`,
		`vmss_autoscaler_scale_down_kept_nodes{reason="scale-down-disabled"} 1`)
}

// scheduledOn runs a replicated pod (label app=name) of the scenario's
// sets on node, with the others cordoned while it is scheduled and
// uncordoned after: nothing in the pod ties it to the node.
func (sc *scenario) scheduledOn(name, cpu, node string, others ...string) {
	sc.t.Helper()
	for _, o := range others {
		sc.updateNode(o, false, func(n *apiv1.Node) { n.Spec.Unschedulable = true })
	}
	sc.workload(name, 1, cpu, 0, sc.sets...)
	sc.eventually(name+" Running on "+node, time.Minute, func() (bool, string) {
		pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == node && p.Status.Phase == apiv1.PodRunning {
				return true, ""
			}
			if p.Spec.NodeName != "" && p.Spec.NodeName != node && p.DeletionTimestamp == nil {
				// The scheduler had not seen a cordon yet: schedule it again.
				sc.t.Logf("%s scheduled on %s, not %s: deleting it", p.Name, p.Spec.NodeName, node)
				_ = sc.s.cp.Client.CoreV1().Pods(sc.ns).Delete(sc.ctx, p.Name, metav1.DeleteOptions{})
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items))
	})
	for _, o := range others {
		sc.updateNode(o, false, func(n *apiv1.Node) { n.Spec.Unschedulable = false })
	}
	// The controller manager removes the unschedulable taint it added.
	sc.eventually("the nodes uncordoned", time.Minute, func() (bool, string) {
		for _, n := range sc.nodeList() {
			for _, t := range n.Spec.Taints {
				if t.Key == apiv1.TaintNodeUnschedulable {
					return false, n.Name + " tainted " + t.Key
				}
			}
		}
		return true, ""
	})
}

// onNode checks that the app's pods run on node, and only there.
func (sc *scenario) onNode(app, node string) {
	sc.t.Helper()
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		sc.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != node || p.Status.Phase != apiv1.PodRunning {
			sc.t.Fatalf("pod %s %s on %q, want Running on %s", p.Name, p.Status.Phase, p.Spec.NodeName, node)
		}
	}
	if len(pods.Items) != 1 {
		sc.t.Fatalf("%d pods of %s, want 1", len(pods.Items), app)
	}
}

// Most nodes go NotReady at once (as when etcd or the network fails): the
// brake lets at most half the group go within its window.
func TestBrakeStopsMassDeletion(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 6, nil)
	sc.registered(cpu, 6)
	for _, name := range sc.nodeNames(cpu) {
		// kwok stops reporting the node healthy, then the node reports NotReady.
		sc.updateNode(name, false, func(n *apiv1.Node) { delete(n.Annotations, "kwok.x-k8s.io/node") })
		sc.updateNode(name, true, func(n *apiv1.Node) {
			n.Status.Conditions = []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionFalse, Reason: "KubeletDown",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		})
	}
	as := sc.autoscaler("autoscaler", fastScaleDown("--nodes=0:10:"+cpu,
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=0.5",
		// The per-group health rule would stop this group outright; here the brake is under test.
		"--scale-down-max-unready-share=1")...)
	sc.eventually("half the group removed", time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 3, fmt.Sprintf("capacity %d", c)
	})
	sc.stays(cpu, 3, as, 5)
	_, body := sc.get(as, "/metrics")
	if !strings.Contains(body, "vmss_autoscaler_scale_down_brake_engaged 1") {
		t.Error("/metrics does not show the brake engaged")
	}
	cm, err := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns).Get(sc.ctx, "vmss-autoscaler-status", metav1.GetOptions{})
	if err != nil || !strings.Contains(cm.Data["status"], "brakeEngaged: true") {
		t.Errorf("status ConfigMap does not say the brake is engaged: %v %v", err, cm)
	}
	evs, _ := sc.s.cp.Client.CoreV1().Events(sc.ns).List(sc.ctx, metav1.ListOptions{})
	found := false
	for _, e := range evs.Items {
		found = found || e.Reason == "ScaleDownBrake"
	}
	if !found {
		t.Error("no ScaleDownBrake event")
	}
}

// A busy node's pod is evicted through the Eviction API (a PDB that allows
// one disruption holds), lands on a node that stays, and the drained node
// is deleted.
func TestScaleDownDrainsThroughEvictionAPI(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 2, nil)
	sc.registered(cpu, 2)
	names := sc.nodeNames(cpu)
	keep, drain := names[0], names[1]
	// The busy node stays (10 of 16 CPUs requested, above the threshold).
	sc.pinnedPod("db", keep, "10")
	// The small pod prefers the other node, which is then unneeded.
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: sc.ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}
	if _, err := sc.s.cp.Client.PolicyV1().PodDisruptionBudgets(sc.ns).Create(sc.ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc.workload("web", 1, "1", 0, cpu)
	sc.eventually("web on the node to drain", time.Minute, func() (bool, string) {
		pods, _ := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=web"})
		for _, p := range pods.Items {
			if p.Status.Phase == apiv1.PodRunning && p.Spec.NodeName == drain {
				return true, ""
			}
			if p.Spec.NodeName == keep {
				// The scheduler chose the busy node: move it by deleting once.
				_ = sc.s.cp.Client.CoreV1().Pods(sc.ns).Delete(sc.ctx, p.Name, metav1.DeleteOptions{})
			}
		}
		return false, fmt.Sprintf("%d web pods", len(pods.Items))
	})
	as := sc.autoscaler("autoscaler", fastScaleDown("--nodes=0:10:"+cpu, "--max-graceful-termination-sec=5",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	sc.eventually("the drained node deleted", 2*time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 1, fmt.Sprintf("capacity %d", c)
	})
	sc.eventually("web Running on the node that stays", time.Minute, func() (bool, string) {
		pods, _ := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=web"})
		for _, p := range pods.Items {
			if p.Status.Phase == apiv1.PodRunning && p.Spec.NodeName == keep {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d web pods", len(pods.Items))
	})
	// The Node object goes when the simulator finishes deleting the VM.
	sc.eventually("only the busy node left", time.Minute, func() (bool, string) {
		left := sc.nodeNames(cpu)
		return len(left) == 1 && left[0] == keep, fmt.Sprintf("nodes %v", left)
	})
	sc.exported(as, `vmss_autoscaler_evictions_total{result="ok"} 1`,
		`vmss_autoscaler_scaled_down_nodes_total{node_group="`+cpu+`",reason="underutilized"} 1`)
}

// pinnedPod runs a replicated pod on one node (by hostname).
func (sc *scenario) pinnedPod(name, node, cpu string) {
	sc.t.Helper()
	d := sc.deployment(name, 1, cpu, 0, sc.sets...)
	d.Spec.Template.Spec.NodeSelector = map[string]string{apiv1.LabelHostname: node}
	sc.create(d)
	sc.eventually(name+" Running on "+node, time.Minute, func() (bool, string) {
		pods, _ := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		for _, p := range pods.Items {
			if p.Status.Phase == apiv1.PodRunning && p.Spec.NodeName == node {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items))
	})
}
