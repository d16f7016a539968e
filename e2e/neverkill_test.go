package e2e

import (
	"fmt"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
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
