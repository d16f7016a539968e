package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// spotCase is a Spot scale set of 8-GPU VMs preferred by the priority
// expander over a regular one, with a Deployment of 6 whole-node pods that
// tolerate Spot running on 6 Spot VMs.
type spotCase struct {
	*scenario
	spot, regular string
	as            *harness.Process
}

// trainReplicas is the Deployment's size: 6 Spot VMs, 3 of them evicted.
const trainReplicas = 6

func newSpotCase(t *testing.T, policy string) *spotCase {
	sc := &spotCase{scenario: newScenario(t)}
	sc.spot, sc.regular = sc.prefix+"-spot", sc.prefix+"-regular"
	must(t, sc.s.sim.AddScaleSet(armsim.ScaleSetSpec{ResourceGroup: sc.rg, Name: sc.spot, SKU: "Standard_ND96isr_H100_v5",
		Zones: []string{"1"}, Spot: true, EvictionPolicy: policy}))
	must(t, sc.s.sim.AddScaleSet(armsim.ScaleSetSpec{ResourceGroup: sc.rg, Name: sc.regular, SKU: "Standard_ND96isr_H100_v5", Zones: []string{"1"}}))
	sc.sets = append(sc.sets, sc.spot, sc.regular)
	// The priority expander's ConfigMap, in the autoscaler's namespace:
	// Spot first, the regular scale set as its fallback.
	cm := &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "vmss-autoscaler-priority-expander", Namespace: sc.ns},
		Data: map[string]string{"priorities": fmt.Sprintf("50:\n  - ^%s$\n10:\n  - ^%s$\n", sc.spot, sc.regular)}}
	_, err := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns).Create(sc.ctx, cm, metav1.CreateOptions{})
	must(t, err)
	sc.as = sc.autoscaler("autoscaler", "--expander=priority,least-waste",
		fmt.Sprintf("--nodes=0:%d:%s", trainReplicas, sc.spot), fmt.Sprintf("--nodes=0:%d:%s", trainReplicas, sc.regular))
	d := sc.deployment("train", trainReplicas, "90", 8, sc.spot, sc.regular)
	d.Spec.Template.Spec.Tolerations = []apiv1.Toleration{{Key: armsim.ScaleSetPriorityLabel, Operator: apiv1.TolerationOpEqual,
		Value: armsim.ScaleSetPrioritySpot, Effect: apiv1.TaintEffectNoSchedule}}
	sc.create(d)
	sc.eventually(fmt.Sprintf("%d pods Running on Spot VMs", trainReplicas), 3*time.Minute, func() (bool, string) {
		ok, state := allRunning(sc.scenario, trainReplicas)()
		return ok && sc.nodesOf()[sc.spot] == trainReplicas, state
	})
	if c := sc.capacity(sc.regular); c != 0 {
		t.Fatalf("regular capacity %d, want 0: the priority expander prefers Spot", c)
	}
	return sc
}

// evictHalf evicts 3 of the 6 Spot VMs with 5 s of notice, and returns
// their instance IDs and node names and the time of the notice.
func (sc *spotCase) evictHalf() (ids, nodes []string, at time.Time) {
	sc.t.Helper()
	st, err := sc.s.sim.ScaleSet(sc.rg, sc.spot)
	must(sc.t, err)
	for _, vm := range st.VMs[:3] {
		ids = append(ids, vm.InstanceID)
		nodes = append(nodes, strings.ToLower(vm.ComputerName))
	}
	at = time.Now()
	must(sc.t, sc.s.sim.EvictSpotVMs(sc.rg, sc.spot, 5*time.Second, ids...))
	return ids, nodes, at
}

// toldOfEvictions waits for the one SpotEvicted event of the 3 evictions,
// which says how many Azure deleted and deallocated ("3 deleted, 0
// deallocated").
func (sc *spotCase) toldOfEvictions(how string) {
	sc.t.Helper()
	sc.eventually("SpotEvicted told of", time.Minute, func() (bool, string) {
		n := sc.eventsWith(core.EventSpotEvicted, "node group "+sc.spot+": 3 machines evicted by the cloud ("+how)
		return n == 1, fmt.Sprintf("%d events", n)
	})
}

// replacedFromTheFallback checks what follows the eviction of 3 Spot VMs
// running pods: their pods go back to pending (their nodes are gone; the
// pod garbage collector and the Deployment make them anew), the Spot group
// is backed off by its 3 evictions (an event, spot_evictions_total, the
// backoff gauge), and the pods run again on 3 VMs of the regular group
// bought per the priority expander's fallback, the Spot group never
// scaled up again.
func (sc *spotCase) replacedFromTheFallback(nodes []string, evictedAt time.Time) {
	sc.t.Helper()
	sc.eventually("the evicted nodes' pods pending again", 3*time.Minute, func() (bool, string) {
		pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=train"})
		must(sc.t, err)
		onEvicted, pending := 0, 0
		for _, p := range pods.Items {
			if slices.Contains(nodes, p.Spec.NodeName) {
				onEvicted++
			}
			if p.Status.Phase == apiv1.PodPending && p.Spec.NodeName == "" {
				pending++
			}
		}
		return onEvicted == 0 && pending > 0, fmt.Sprintf("%d pods on the evicted nodes, %d pending", onEvicted, pending)
	})
	sc.exported(sc.as,
		`vmss_autoscaler_spot_evictions_total{node_group="`+sc.spot+`"} 3`,
		`vmss_autoscaler_node_group_backoff{node_group="`+sc.spot+`"} 1`,
		`vmss_autoscaler_spot_evictions_total{node_group="`+sc.regular+`"} 0`)
	sc.eventually("SpotEvictionBackoff told of", 30*time.Second, func() (bool, string) {
		n := sc.eventsWith(core.EventSpotEvictionBackoff, "node group "+sc.spot+" backed off until")
		return n == 1, fmt.Sprintf("%d events", n)
	})
	sc.eventually(fmt.Sprintf("%d pods Running again, 3 on the fallback", trainReplicas), 3*time.Minute, func() (bool, string) {
		ok, state := allRunning(sc.scenario, trainReplicas)()
		return ok && sc.capacity(sc.regular) == 3 && sc.nodesOf()[sc.regular] == 3, state
	})
	if c := sc.capacity(sc.spot); c != 3 {
		sc.t.Fatalf("Spot capacity %d, want the 3 not evicted", c)
	}
	for _, w := range sc.writesTo(sc.spot) {
		if w.Op == armsim.OpUpdateScaleSet && w.At.After(evictedAt) {
			sc.t.Fatalf("the Spot group was scaled after its evictions:\n%s", sc.writeLog(sc.spot))
		}
	}
	sc.increasesOnce(sc.regular, 3, false)
}

// TestSpotEvictionFallsBackToRegularCapacity: Azure evicts 3 of a Spot
// group's 6 VMs (policy Delete: the VMs vanish, the scale set's capacity
// drops by itself) with the 5 s notice of a Preempt, while their pods run.
// The pods are pending again, the group backs off after its 3 evictions
// (--spot-eviction-backoff-count 3 within --spot-eviction-window 10m), and
// the pods are replaced from the regular group, per the priority
// expander's fallback. The autoscaler sends no deletion for the evicted
// VMs (nor any other), and the evictions are not taken for its kills (the
// never-kill invariant at cleanup).
func TestSpotEvictionFallsBackToRegularCapacity(t *testing.T) {
	t.Parallel()
	sc := newSpotCase(t, armsim.EvictionDelete)
	_, nodes, at := sc.evictHalf()
	sc.toldOfEvictions("3 deleted, 0 deallocated")
	sc.replacedFromTheFallback(nodes, at)
	for _, w := range sc.writesTo(sc.spot) {
		if w.Op == armsim.OpDeleteInstances {
			t.Fatalf("the autoscaler sent a deletion to the Spot group:\n%s", sc.writeLog(sc.spot))
		}
	}
}

// TestSpotDeallocatedVMsAreDeleted: the same eviction under policy
// Deallocate: the 3 VMs stop and stay in the scale set, running nothing
// and holding their cores in the quota. The autoscaler deletes exactly
// those 3 (no running VM), and the pods are replaced from the fallback as
// under Delete.
func TestSpotDeallocatedVMsAreDeleted(t *testing.T) {
	t.Parallel()
	sc := newSpotCase(t, armsim.EvictionDeallocate)
	ids, nodes, at := sc.evictHalf()
	sc.toldOfEvictions("0 deleted, 3 deallocated")
	sc.eventually("the deallocated VMs deleted", time.Minute, func() (bool, string) {
		st, err := sc.s.sim.ScaleSet(sc.rg, sc.spot)
		must(t, err)
		var left []string
		for _, vm := range st.VMs {
			if vm.State != armsim.StateRunning {
				left = append(left, vm.InstanceID+"="+vm.State)
			}
		}
		return len(st.VMs) == 3 && len(left) == 0, fmt.Sprintf("%d VMs, not running: %v", len(st.VMs), left)
	})
	var deleted []string
	for _, w := range sc.writesTo(sc.spot) {
		if w.Op == armsim.OpDeleteInstances && accepted(w) {
			deleted = append(deleted, w.InstanceIDs...)
		}
	}
	slices.Sort(deleted)
	if want := slices.Sorted(slices.Values(ids)); !slices.Equal(deleted, want) {
		t.Fatalf("deletions sent for %v, want exactly the deallocated %v:\n%s", deleted, want, sc.writeLog(sc.spot))
	}
	sc.replacedFromTheFallback(nodes, at)
}

// TestSameNameScaleSetsScaleIndependently: two scale sets named alike in
// two resource groups (as when one cluster spans node resource groups),
// each with its own computer name prefix as AKS gives them, are two node
// groups, given as --nodes=0:4:<rg>/<name>, reported as <rg>/<name>: each
// is scaled for its own pods (3 and 2), and one scales back to 0 while the
// other keeps its 3.
func TestSameNameScaleSetsScaleIndependently(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	name := sc.prefix + "-gpu"
	rgA, rgB := sc.rg, strings.TrimSuffix(sc.rg, "_eastus")+"_b_eastus"
	const rgLabel = "e2e.vmss-autoscaler.io/rg"
	for _, s := range []struct{ rg, prefix, label string }{{rgA, "aks-" + sc.prefix + "-a-vmss", "a"}, {rgB, "aks-" + sc.prefix + "-b-vmss", "b"}} {
		must(t, sc.s.sim.AddScaleSet(armsim.ScaleSetSpec{ResourceGroup: s.rg, Name: name, SKU: "Standard_ND96isr_H100_v5", Zones: []string{"1"},
			ComputerNamePrefix: s.prefix, Tags: map[string]string{armsim.LabelTagPrefix + strings.ReplaceAll(rgLabel, "/", "__"): s.label}}))
	}
	sc.sets = append(sc.sets, name)
	as := sc.autoscaler("autoscaler", fastScaleDown("--azure-resource-groups="+rgB,
		"--nodes=0:4:"+rgA+"/"+name, "--nodes=0:4:"+rgB+"/"+name,
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	for _, w := range []struct {
		app   string
		n     int32
		label string
	}{{"train-a", 3, "a"}, {"train-b", 2, "b"}} {
		d := sc.deployment(w.app, w.n, "90", 8, name)
		d.Spec.Template.Spec.NodeSelector = map[string]string{rgLabel: w.label}
		sc.create(d)
	}
	capacity := func(rg string) int {
		st, err := sc.s.sim.ScaleSet(rg, name)
		must(t, err)
		return st.Capacity
	}
	sc.eventually("5 pods Running, 3 in one resource group and 2 in the other", 3*time.Minute, func() (bool, string) {
		ok, state := allRunning(sc, 5)()
		return ok && capacity(rgA) == 3 && capacity(rgB) == 2, fmt.Sprintf("%s; capacities %d, %d", state, capacity(rgA), capacity(rgB))
	})
	seen := map[string]bool{}
	for _, n := range sc.nodeList(name) {
		rg, prefix := rgA, "aks-"+sc.prefix+"-a-vmss"
		if n.Labels[rgLabel] == "b" {
			rg, prefix = rgB, "aks-"+sc.prefix+"-b-vmss"
		}
		if !strings.HasPrefix(n.Name, prefix) || !strings.Contains(n.Spec.ProviderID, "/resourceGroups/"+strings.ToLower(rg)+"/") || seen[n.Name] {
			t.Fatalf("node %s (providerID %s, label %s) is not one of %s's, named %s…", n.Name, n.Spec.ProviderID, n.Labels[rgLabel], rg, prefix)
		}
		seen[n.Name] = true
	}
	if len(seen) != 5 {
		t.Fatalf("%d nodes, want 5", len(seen))
	}
	sc.exported(as,
		`vmss_autoscaler_nodes{node_group="`+rgA+"/"+name+`",state="ready"} 3`,
		`vmss_autoscaler_nodes{node_group="`+rgB+"/"+name+`",state="ready"} 2`)

	must(t, sc.s.cp.Client.AppsV1().Deployments(sc.ns).Delete(sc.ctx, "train-b", metav1.DeleteOptions{}))
	sc.eventually("the second resource group's scale set back to 0", 3*time.Minute, func() (bool, string) {
		return capacity(rgB) == 0, fmt.Sprintf("capacities %d, %d", capacity(rgA), capacity(rgB))
	})
	if c := capacity(rgA); c != 3 || sc.running("train-a") != 3 {
		t.Fatalf("first resource group's capacity %d, %d pods running; want 3 and 3", c, sc.running("train-a"))
	}
	for _, w := range sc.s.sim.Writes() {
		if strings.EqualFold(w.ResourceGroup, rgA) && strings.EqualFold(w.ScaleSet, name) && w.Op == armsim.OpDeleteInstances {
			t.Fatalf("a deletion sent to %s/%s, whose pods run: %+v", rgA, name, w)
		}
	}
}
