package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// An operator gives a group a max its scale set cannot hold (a single
// placement group holds 100 VMs): the binary says so at start, in its log
// and in the status ConfigMap (max 100 with a maxWarning, what `status`
// prints), and scales within the limit.
func TestScaleSetLimitClampsMax(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	name := sc.prefix + "-spg"
	if err := sc.s.sim.AddScaleSet(armsim.ScaleSetSpec{ResourceGroup: sc.rg, Name: name, SKU: "Standard_D16s_v5", SinglePlacementGroup: true}); err != nil {
		t.Fatal(err)
	}
	sc.sets = append(sc.sets, name)
	as := sc.autoscaler("autoscaler", "--nodes=0:150:"+name)
	sc.workload("web", 2, "9", 0, name)
	sc.eventually("the warning in the log", time.Minute, func() (bool, string) {
		return sc.logContains(as, "node group max is more than its scale set can hold"), "not logged"
	})
	want := "configured max 150 is more than the node group can hold (100: single placement group); max is 100"
	sc.eventually("the status to show the clamped max and why", time.Minute, func() (bool, string) {
		v, err := sc.statusView("--kubeconfig="+sc.s.cp.Kubeconfig, "--namespace="+sc.ns)
		if err != nil {
			return false, err.Error()
		}
		g, ok := group(v, name)
		if !ok || g.Max != 100 || g.MaxWarning != want {
			return false, fmt.Sprintf("group %+v", g)
		}
		return true, ""
	})
	sc.eventually("2 pods Running", 2*time.Minute, allRunning(sc, 2))
	if got := sc.capacity(name); got != 2 {
		t.Fatalf("capacity %d, want 2", got)
	}
}
