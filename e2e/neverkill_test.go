package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// A VM running a pod turns Failed in Azure (its extension failed; it runs
// on, as ARM reports: provisioningState Failed, PowerState/running). The
// autoscaler tells of it (FailedVMRunning on the node) and leaves it: the
// pod keeps running on the same node and no deletion reaches ARM. A
// repaired model brings it back (FailedVMRecovered).
func TestNeverKillAFailedVMThatRuns(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	p := sc.autoscaler("autoscaler", fastScaleDown("--nodes=0:5:"+cpu, "--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	sc.workload("train", 1, "12", 0, cpu)
	sc.eventually("the pod Running", 2*time.Minute, allRunning(sc, 1))
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=train"})
	must(t, err)
	pod := pods.Items[0]
	st, err := sc.s.sim.ScaleSet(sc.rg, cpu)
	must(t, err)
	if len(st.VMs) != 1 {
		t.Fatalf("scale set has %d VMs, want 1", len(st.VMs))
	}
	vm := st.VMs[0]
	must(t, sc.s.sim.FailRunningVM(sc.rg, cpu, vm.InstanceID, armsim.CodeVMExtensionProvisioningError))
	failedAt := time.Now()
	sc.steadyFor(p, 10, "the pod and its VM kept", func() (bool, string) {
		cur, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("pod %s: %v", pod.Name, err)
		}
		if cur.UID != pod.UID || cur.Status.Phase != apiv1.PodRunning || cur.DeletionTimestamp != nil || cur.Spec.NodeName != pod.Spec.NodeName {
			return false, fmt.Sprintf("pod %s %s on %s, deleting %v", cur.Name, cur.Status.Phase, cur.Spec.NodeName, cur.DeletionTimestamp != nil)
		}
		vms := sc.vms(cpu)
		return vms[vm.InstanceID] == armsim.StateFailed && len(vms) == 1, fmt.Sprintf("VMs %v", vms)
	})
	sc.noDeletionSince(cpu, failedAt, pod.UID)
	sc.eventually("FailedVMRunning on the node", time.Minute, func() (bool, string) {
		for _, e := range sc.eventsAnywhere(core.EventFailedVMRunning) {
			if e.InvolvedObject.Name == pod.Spec.NodeName {
				return true, e.Message
			}
		}
		return false, "no event"
	})
	_, body := sc.get(p, "/metrics")
	if v := metricValue(body, `vmss_autoscaler_failed_running_instances{code="`+armsim.CodeVMExtensionProvisioningError+`",node_group="`+cpu+`"}`); v != 1 {
		t.Fatalf("failed_running_instances = %v, want 1", v)
	}
	must(t, sc.s.sim.RepairVM(sc.rg, cpu, vm.InstanceID))
	sc.eventually("FailedVMRecovered on the node", time.Minute, func() (bool, string) {
		n := len(sc.eventsAnywhere(core.EventFailedVMRecovered))
		return n == 1, fmt.Sprintf("%d events", n)
	})
	sc.noDeletionSince(cpu, failedAt, pod.UID)
}

// noDeletionSince fails when ARM was asked to delete a machine of the set
// since from (the pod named is the one that would have died with it).
func (sc *scenario) noDeletionSince(set string, from time.Time, pod types.UID) {
	sc.t.Helper()
	for _, w := range sc.writesTo(set) {
		if w.Op == armsim.OpDeleteInstances && !w.At.Before(from) {
			sc.t.Fatalf("a deletion sent to ARM at %s while pod %s ran on its failed-but-running VM:\n%s", w.At.Format("15:04:05.000"), pod, sc.writeLog(set))
		}
	}
}

// podOf returns the single pod of an app, failing the test otherwise.
func (sc *scenario) podOf(app string) apiv1.Pod {
	sc.t.Helper()
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	must(sc.t, err)
	if len(pods.Items) != 1 {
		sc.t.Fatalf("%d pods of %s, want 1", len(pods.Items), app)
	}
	return pods.Items[0]
}

// failPreflight marks a node failed as the preflight agent's periodic
// re-run does when a check fails on a node that already runs work.
func (sc *scenario) failPreflight(node, why string) {
	sc.t.Helper()
	sc.updateNode(node, false, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValueFailed
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[preflight.DefaultFailureAnnotation] = why
	})
}

// deletionsOf returns the times ARM accepted a deletion of the set's VMs.
func (sc *scenario) deletionsOf(set string) []time.Time {
	var out []time.Time
	for _, w := range sc.writesTo(set) {
		if w.Op == armsim.OpDeleteInstances && w.Status < 300 {
			out = append(out, w.At)
		}
	}
	return out
}

// (a) A pod bound to an empty node after scale-down decided to remove it
// — here between the ToBeDeleted taint and the deletion, which
// --node-delete-delay-after-taint holds 10 s apart so the test can land it
// there every time; a real scheduler does it within the loop's
// milliseconds — keeps the node: the autoscaler looks at the node's pods
// again when it deletes, gives the removal up (ScaleDownFailed naming the
// pod), takes the taint back, and no deletion reaches ARM.
func TestNeverKillAPodBoundAfterTheScaleDownDecision(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 1, nil)
	sc.registered(cpu, 1)
	node := sc.nodeNames(cpu)[0]
	p := sc.autoscaler("autoscaler", fastScaleDown("--nodes=0:5:"+cpu, "--node-delete-delay-after-taint=10s",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	var tainted time.Time
	sc.eventually("the empty node tainted ToBeDeleted", 2*time.Minute, func() (bool, string) {
		n, err := sc.s.cp.Client.CoreV1().Nodes().Get(sc.ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, tn := range n.Spec.Taints {
			if tn.Key == scaledown.ToBeDeletedTaint {
				tainted = time.Now()
				return true, ""
			}
		}
		return false, fmt.Sprintf("taints %v", n.Spec.Taints)
	})
	// Bound straight to the node, as the scheduler binds: a pod the
	// autoscaler's decision never saw.
	pod := &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: sc.ns},
		Spec: apiv1.PodSpec{NodeName: node, Containers: []apiv1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
			Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("1")}}}}},
	}
	created, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Create(sc.ctx, pod, metav1.CreateOptions{})
	must(t, err)
	if d := time.Since(tainted); d > 8*time.Second {
		t.Fatalf("the pod landed %s after the taint: outside the 10 s delay, the test proves nothing", d)
	}
	sc.eventually("the removal given up, naming the pod", time.Minute, func() (bool, string) {
		n := sc.eventsAnywhereWith(core.EventScaleDownFailed, "pod "+sc.ns+"/late runs on the node")
		return n > 0, fmt.Sprintf("%d events", n)
	})
	sc.steadyFor(p, 10, "the node kept, untainted, the pod Running", func() (bool, string) {
		n, err := sc.s.cp.Client.CoreV1().Nodes().Get(sc.ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, tn := range n.Spec.Taints {
			if tn.Key == scaledown.ToBeDeletedTaint {
				return false, "still tainted ToBeDeleted"
			}
		}
		cur, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, "late", metav1.GetOptions{})
		if err != nil || cur.UID != created.UID || cur.Status.Phase != apiv1.PodRunning {
			return false, fmt.Sprintf("pod: %v", err)
		}
		return len(sc.vms(cpu)) == 1, fmt.Sprintf("VMs %v", sc.vms(cpu))
	})
	if d := sc.deletionsOf(cpu); len(d) != 0 {
		t.Fatalf("ARM was asked to delete the node's VM at %v:\n%s", d, sc.writeLog(cpu))
	}
	_, body := sc.get(p, "/metrics")
	if v := metricValue(body, `vmss_autoscaler_failed_scale_downs_total{node_group="`+cpu+`",step="recheck"}`); v < 1 {
		t.Fatalf("failed_scale_downs_total{step=recheck} = %v, want at least 1", v)
	}
}

// (c) A periodic preflight re-run fails a node that runs a pod with a 60 s
// grace period whose process takes all of it to exit (a checkpoint on
// SIGTERM): the pod is evicted with its 60 s, and the machine is deleted
// only once they are over — never one loop after the eviction.
func TestNeverKillAPodThroughItsGraceOnReplacement(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	sc.autoscaler("autoscaler", "--nodes=0:5:"+cpu, "--preflight-failure-settle=1s")
	d := sc.deployment("train", 1, "12", 0, cpu)
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr(int64(60))
	d.Spec.Template.Annotations = map[string]string{harness.PodDeleteDelayAnnotation: "60s"} // its process takes all its grace to exit
	sc.create(d)
	sc.eventually("the pod Running", 2*time.Minute, allRunning(sc, 1))
	first := sc.podOf("train")
	sc.failPreflight(first.Spec.NodeName, "ib-loopback: link down")
	var evicted apiv1.Pod
	sc.eventually("the pod evicted", time.Minute, func() (bool, string) {
		cur, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, first.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		evicted = *cur
		return cur.DeletionTimestamp != nil, "not terminating"
	})
	if g := evicted.DeletionGracePeriodSeconds; g == nil || *g != 60 {
		t.Fatalf("evicted with grace %v, want its 60 s", g)
	}
	if !evictedByAPI(&evicted) {
		t.Fatalf("the pod is terminating without the Eviction API's DisruptionTarget condition: %v", evicted.Status.Conditions)
	}
	graceEnds := evicted.DeletionTimestamp.Time
	sc.eventually("the failed machine deleted", 3*time.Minute, func() (bool, string) {
		n := len(sc.deletionsOf(cpu))
		return n == 1, fmt.Sprintf("%d deletions", n)
	})
	if at := sc.deletionsOf(cpu)[0]; at.Before(graceEnds) {
		t.Fatalf("the machine was deleted at %s, %s before the pod's grace ran out at %s",
			at.Format("15:04:05.000"), graceEnds.Sub(at).Round(time.Millisecond), graceEnds.Format("15:04:05"))
	}
	sc.eventually("the replacement pod Running", 3*time.Minute, allRunning(sc, 1))
}

// (d) A failed node running a pod annotated safe-to-evict=false is not
// replaced: it stays cordoned, the pod keeps running, an event and the
// status say why, and no deletion reaches ARM.
func TestNeverKillAnUnevictablePodOnAFailedNode(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	p := sc.autoscaler("autoscaler", "--nodes=0:5:"+cpu, "--preflight-failure-settle=1s")
	d := sc.deployment("train", 1, "12", 0, cpu)
	d.Spec.Template.Annotations = map[string]string{scaledown.SafeToEvictAnnotation: "false"}
	sc.create(d)
	sc.eventually("the pod Running", 2*time.Minute, allRunning(sc, 1))
	pod := sc.podOf("train")
	node := pod.Spec.NodeName
	failedAt := time.Now()
	sc.failPreflight(node, "gpu-burn: 7 of 8 GPUs")
	sc.eventually("ReplacementBlocked naming the pod", time.Minute, func() (bool, string) {
		n := sc.eventsAnywhereWith(core.EventReplacementBlocked, "pod "+sc.ns+"/"+pod.Name)
		return n > 0, fmt.Sprintf("%d events", n)
	})
	sc.steadyFor(p, 10, "the node cordoned, the pod Running on it", func() (bool, string) {
		n, err := sc.s.cp.Client.CoreV1().Nodes().Get(sc.ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cur, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, pod.Name, metav1.GetOptions{})
		if err != nil || cur.UID != pod.UID || cur.DeletionTimestamp != nil || cur.Status.Phase != apiv1.PodRunning {
			return false, fmt.Sprintf("pod: %v", err)
		}
		return n.Spec.Unschedulable, "not cordoned"
	})
	sc.noDeletionSince(cpu, failedAt, pod.UID)
	sc.eventually("the status saying the node is kept", 30*time.Second, func() (bool, string) {
		st, err := sc.status("--kubeconfig="+sc.s.cp.Kubeconfig, "--namespace="+sc.ns)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(st, "not replaced, kept cordoned: "+node), st
	})
}

// eventsAnywhereWith counts the scenario's events with a reason whose
// message has text, on its nodes too.
func (sc *scenario) eventsAnywhereWith(reason, text string) int {
	n := 0
	for _, e := range sc.eventsAnywhere(reason) {
		if strings.Contains(e.Message, text) {
			n++
		}
	}
	return n
}

// evictedByAPI says the pod carries the condition the Eviction API sets.
func evictedByAPI(p *apiv1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == apiv1.DisruptionTarget && c.Reason == "EvictionByEvictionAPI" {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }
