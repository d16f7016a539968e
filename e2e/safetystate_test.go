package e2e

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// The leader is killed in the middle of a replacement storm: 8 of 12 nodes
// failed a periodic preflight re-run, the replacement brake (at most 3 per
// 10 minutes here) let 3 machines be deleted and holds the other 5
// cordoned. The standby takes over and reads the brake's window back from
// the status ConfigMap's safety-state: it deletes nothing more (a fresh
// brake would delete 3 more). It also takes over the preflight cordons: 2
// of the held nodes pass again and the new leader uncordons them, while
// the 3 still failed stay cordoned.
func TestSafetyStateFailoverMidReplacementStorm(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	sc.failover = true // kills a leader
	const (
		total  = 12
		failed = 8
		budget = 3 // --replacement-brake-min-nodes: max(0.02 × 12, 3)
	)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", total, nil)
	sc.registered(cpu, total)
	args := []string{"--nodes=0:40:" + cpu, fmt.Sprintf("--replacement-brake-min-nodes=%d", budget), "--replacement-brake-window=10m",
		"--preflight-failure-settle=1s",
		// Only the replacement of failed nodes deletes machines here: the
		// nodes are empty, and scale-down would remove them too.
		"--scale-down-enabled=false"}
	a := sc.autoscaler("a", args...)
	b := sc.autoscaler("b", args...)
	var leader, standby *harness.Process
	sc.eventually("one replica leading", time.Minute, func() (bool, string) {
		la, lb := sc.loops(a), sc.loops(b)
		switch {
		case la > 0 && lb <= 0:
			leader, standby = a, b
		case lb > 0 && la <= 0:
			leader, standby = b, a
		default:
			return false, fmt.Sprintf("loops: a %v, b %v", la, lb)
		}
		return true, ""
	})

	nodes := sc.nodeList(cpu)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	isFailed, vmOf := map[string]bool{}, map[string]string{}
	for i, n := range nodes[:failed] {
		isFailed[n.Name] = true
		vmOf[n.Name] = n.Spec.ProviderID[strings.LastIndex(n.Spec.ProviderID, "/")+1:]
		// A check of its own per node: bad machines, not an incident.
		sc.failPreflight(n.Name, fmt.Sprintf("check hw-%d: exit status 1", i))
	}

	// storm describes the failed nodes: those whose machines were deleted
	// (VM gone or deleting in ARM), and those still there, cordoned by the
	// autoscaler for preflight or not.
	type storm struct {
		deleted  []string
		cordoned []string // by the autoscaler, for preflight
		other    []string // present, not cordoned so
		live     int      // VMs of the set not being deleted
	}
	look := func() storm {
		var s storm
		vms := sc.vms(cpu)
		for _, st := range vms {
			if st != armsim.StateDeleting {
				s.live++
			}
		}
		present := map[string]apiv1.Node{}
		for _, n := range sc.nodeList(cpu) {
			present[n.Name] = n
		}
		for _, n := range nodes[:failed] {
			if st, ok := vms[vmOf[n.Name]]; !ok || st == armsim.StateDeleting {
				s.deleted = append(s.deleted, n.Name)
				continue
			}
			cur, ok := present[n.Name]
			if ok && preflightCordoned(&cur) {
				s.cordoned = append(s.cordoned, n.Name)
			} else {
				s.other = append(s.other, n.Name)
			}
		}
		return s
	}
	describe := func(s storm) string {
		return fmt.Sprintf("%d live VMs; failed nodes deleted %v, cordoned for preflight %v, neither %v", s.live, s.deleted, s.cordoned, s.other)
	}
	held := func(s storm) bool {
		return len(s.deleted) == budget && len(s.cordoned) == failed-budget && s.live == total-budget
	}

	sc.eventually(fmt.Sprintf("%d failed machines deleted, the other %d cordoned, the brake engaged", budget, failed-budget), 2*time.Minute, func() (bool, string) {
		s := look()
		if len(s.deleted) > budget {
			sc.t.Fatalf("the replacement brake let more than %d deletions through: %s\n%s", budget, describe(s), sc.writeLog(cpu))
		}
		_, body := sc.get(leader, "/metrics")
		engaged := metricValue(body, "vmss_autoscaler_replacement_brake_engaged")
		return held(s) && engaged == 1, fmt.Sprintf("%s; brake engaged %v", describe(s), engaged)
	})
	// The brake's window as saved for the next leader, before it is
	// killed: it is saved at the end of the loop that deleted.
	sc.eventually(fmt.Sprintf("%d replacements saved in the safety state", budget), 30*time.Second, func() (bool, string) {
		n, raw := sc.savedReplacements()
		return n == budget, raw
	})
	before := len(sc.deletionsOf(cpu))
	_, saved := sc.savedReplacements()
	t.Logf("killing the leader %s (standby %s); %s", leader.Name, standby.Name, saved)

	must(t, leader.Kill())
	sc.eventually("the standby leading", time.Minute, func() (bool, string) {
		n := sc.loops(standby)
		return n > 0, fmt.Sprintf("%s: %v loops", standby.Name, n)
	})
	noMore := func() (bool, string) {
		s := look()
		if n := len(sc.deletionsOf(cpu)); n != before {
			return false, fmt.Sprintf("%d deletions sent to ARM since the failover: %s\n%s", n-before, describe(s), sc.writeLog(cpu))
		}
		return held(s), describe(s)
	}
	engagedSeen := false
	sc.steadyFor(standby, 15, "no deletion by the new leader past the brake's saved window", func() (bool, string) {
		ok, state := noMore()
		_, body := sc.get(standby, "/metrics")
		engagedSeen = engagedSeen || metricValue(body, "vmss_autoscaler_replacement_brake_engaged") == 1
		return ok, state
	})
	if !engagedSeen {
		t.Fatalf("the new leader never engaged its replacement brake: it did not look at the %d failed nodes it held", failed-budget)
	}

	// The agent's periodic re-run passes 2 of the held nodes again.
	s := look()
	recovered, still := s.cordoned[:2], s.cordoned[2:]
	for _, name := range recovered {
		sc.updateNode(name, false, func(n *apiv1.Node) {
			n.Labels[preflight.DefaultLabel] = preflight.ValuePassed
			delete(n.Annotations, preflight.DefaultFailureAnnotation)
		})
	}
	cordonState := func() (uncordoned, cordoned []string, state string) {
		present := map[string]apiv1.Node{}
		for _, n := range sc.nodeList(cpu) {
			present[n.Name] = n
		}
		var desc []string
		for _, name := range append(append([]string(nil), recovered...), still...) {
			n, ok := present[name]
			if !ok {
				desc = append(desc, name+": gone")
				continue
			}
			ann, has := n.Annotations[actuation.CordonedAnnotation]
			desc = append(desc, fmt.Sprintf("%s: unschedulable %v, %s %q (present %v)", name, n.Spec.Unschedulable, actuation.CordonedAnnotation, ann, has))
			switch {
			case !n.Spec.Unschedulable && !has:
				uncordoned = append(uncordoned, name)
			case preflightCordoned(&n):
				cordoned = append(cordoned, name)
			}
		}
		return uncordoned, cordoned, strings.Join(desc, "; ")
	}
	isIn := func(set []string, names ...string) bool {
		in := map[string]bool{}
		for _, n := range set {
			in[n] = true
		}
		for _, n := range names {
			if !in[n] {
				return false
			}
		}
		return true
	}
	sc.eventually("the new leader uncordoning the 2 nodes that passed again", time.Minute, func() (bool, string) {
		if n := len(sc.deletionsOf(cpu)); n != before {
			sc.t.Fatalf("%d deletions sent to ARM since the failover\n%s", n-before, sc.writeLog(cpu))
		}
		unc, cor, state := cordonState()
		if !isIn(cor, still...) {
			sc.t.Fatalf("a node still failed is no longer cordoned for preflight: %s", state)
		}
		return len(unc) == len(recovered) && isIn(unc, recovered...), state
	})
	sc.steadyFor(standby, 5, "the recovered nodes schedulable, the failed ones cordoned, no deletion", func() (bool, string) {
		unc, cor, state := cordonState()
		if !isIn(unc, recovered...) || !isIn(cor, still...) {
			return false, state
		}
		if n := len(sc.deletionsOf(cpu)); n != before {
			return false, fmt.Sprintf("%d deletions sent to ARM since the failover\n%s", n-before, sc.writeLog(cpu))
		}
		return true, state
	})
	if n := sc.eventsAnywhereWith(core.EventPreflightRecovered, "uncordoned"); n < len(recovered) {
		t.Fatalf("%d PreflightRecovered events, want %d", n, len(recovered))
	}
}

// preflightCordoned says the autoscaler cordoned the node for failing preflight.
func preflightCordoned(n *apiv1.Node) bool {
	why, ok := actuation.CordonedBy(n)
	return ok && strings.HasPrefix(why, "preflight-failed ")
}

// savedReplacements counts the replacement brake's deletions in the safety
// state the leader saved in the status ConfigMap (and returns it raw).
func (sc *scenario) savedReplacements() (int, string) {
	cm, err := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns).Get(sc.ctx, "vmss-autoscaler-status", metav1.GetOptions{})
	if err != nil {
		return -1, err.Error()
	}
	raw := cm.Data[core.SafetyStateKey]
	var st struct {
		Replacements []json.RawMessage `json:"replacements"`
	}
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			return -1, fmt.Sprintf("%q: %v", raw, err)
		}
	}
	return len(st.Replacements), fmt.Sprintf("%s: %q", core.SafetyStateKey, raw)
}
