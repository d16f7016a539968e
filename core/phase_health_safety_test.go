package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// The health signals are untrusted input (issue #39): a monitor's false
// alarm, a typo in the policy, a stolen node-problem-detector token. These
// tests run the built-in policy and the default bounds unless they say
// why not, and each says what today's main did instead.

// busy puts a whole-node pod on every node given.
func (e *env) busy(prefix string, nodes []string) {
	for i, n := range nodes {
		p := to.Pod(fmt.Sprintf("%s-%d", prefix, i), append(wholeGPU(), to.OnNode(n), to.ControlledBy("ReplicaSet", prefix, types.UID("rs-"+prefix)))...)
		p.Status.Phase = apiv1.PodRunning
		e.add(p)
	}
}

// TestHealthSafeMonitorFlaggingAGroupCordonsNothing: a monitor sets
// XIDErrors=True on every node of a 16-node group at once. Before: all
// cordoned (the breaker stopped drains, not cordons) and the group
// never scaled up while it held. Now: nothing cordoned, drained or
// deleted for an hour, the breaker and the incident say why, and a new
// pod still gets a new node from the group.
func TestHealthSafeMonitorFlaggingAGroupCordonsNothing(t *testing.T) {
	e, acts, gpu := healthEnv(t, 16, "") // the built-in policy; the group's max is 20
	nodes := groupNodes(gpu)
	e.busy("w", nodes)
	for _, n := range nodes {
		e.condition(n, "XIDErrors", apiv1.ConditionTrue)
	}
	for range 60 {
		e.run()
		e.clock.Step(time.Minute)
	}
	if len(acts.cordoned) != 0 || len(acts.evicted) != 0 || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %d, evicted %d, deleted %d in an hour: want nothing", len(acts.cordoned), len(acts.evicted), len(gpu.Deleted()))
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthBreaker.WithLabelValues("gpu")); got != 1 {
		t.Errorf("breaker metric %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthIncidents); got != 1 {
		t.Errorf("incidents %v, want 1 (16 nodes began matching xid-error at once)", got)
	}
	if ev := e.events(EventHealthIncident); len(ev) != 1 || !strings.Contains(ev[0], `rule "xid-error"`) {
		t.Errorf("incident events %q, want one naming the rule", ev)
	}
	e.add(pendingPods(1, "train", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); fmt.Sprint(got) != "[1]" {
		t.Fatalf("increases %v, want [1]: the group still scales up", got)
	}
}

// TestHealthSafeMonitorFlaggingASmallGroupBacksNothingOff: the same on a
// group of 4 young nodes (under the incident rule's 5: the breaker alone
// holds). Its nodes were there before the group was seen failing: they
// count towards no health backoff (a first version of the count for a bad
// image in an empty pool backed this group off, and the e2e test's new
// pod waited), and a new pod gets a new node.
func TestHealthSafeMonitorFlaggingASmallGroupBacksNothingOff(t *testing.T) {
	e, acts, gpu := healthEnv(t, 4, "")
	nodes := groupNodes(gpu)
	e.busy("w", nodes)
	e.run()
	e.clock.Step(10 * time.Minute) // the nodes ran a while before the monitor went bad
	for _, n := range nodes {
		e.condition(n, "XIDErrors", apiv1.ConditionTrue)
	}
	// 4 minutes: xid-error (2m) is due, well within a backoff's 5.
	for range 4 {
		e.run()
		e.clock.Step(time.Minute)
	}
	if len(acts.cordoned) != 0 || len(acts.evicted) != 0 || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %d, evicted %d, deleted %d: want nothing", len(acts.cordoned), len(acts.evicted), len(gpu.Deleted()))
	}
	if gs := e.a.registry.Group("gpu"); gs == nil || gs.Backoff.Active {
		t.Fatal("group backed off: its nodes were there before it was seen failing")
	}
	e.add(pendingPods(1, "train", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); fmt.Sprint(got) != "[1]" {
		t.Fatalf("increases %v, want [1]: the group still scales up", got)
	}
}

// threePoolsFlagged makes three 20-node pools, every node busy, and sets
// XIDErrors=True on 2 nodes of each (10 %: within every group's breaker);
// with safety, a safety state a failover keeps.
func threePoolsFlagged(t *testing.T, safety bool) (*env, *fakeActions, []*inmemory.Group, []string) {
	acts := &fakeActions{}
	e := newEnv(t, withNodeWrites(acts), withOptions(func(o *Options) {
		o.ScaleDownEnabled = false
		o.ReplacementBrakeMinNodes = 100
	}))
	if safety {
		e.safety = &memSafety{}
	}
	acts.graceful = e.clock
	var pools []*inmemory.Group
	for _, name := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		pools = append(pools, e.provider.AddGroup(name, 0, 40, gpuTemplate(name), inmemory.WithTarget(20)))
	}
	e.start()
	var flagged []string
	for _, g := range pools {
		e.register(g)
		nodes := groupNodes(g)
		e.busy(g.ID(), nodes)
		flagged = append(flagged, nodes[:2]...)
	}
	for _, n := range flagged {
		e.condition(n, "XIDErrors", apiv1.ConditionTrue)
	}
	return e, acts, pools, flagged
}

// TestHealthSafeFalseAlarmAcrossPoolsIsAnIncident: a bad monitor rollout
// flags 2 nodes of each of three 20-node pools (10 %: within every
// group's breaker, 4 of 20). Before: all 6 cordoned and drained at the
// replacement brake's pace. Now: 6 nodes began matching one rule within
// the window, over the incident threshold (5): reported only. Once the
// alarm clears and the cooldown passes, the incident ends.
func TestHealthSafeFalseAlarmAcrossPoolsIsAnIncident(t *testing.T) {
	e, acts, pools, flagged := threePoolsFlagged(t, false)
	for range 15 {
		e.run()
		e.clock.Step(time.Minute)
	}
	if len(acts.cordoned) != 0 || len(acts.evicted) != 0 {
		t.Fatalf("cordoned %v, evicted %v: want nothing during the incident", acts.cordoned, acts.evicted)
	}
	for _, g := range pools {
		if got := testutil.ToFloat64(e.a.metrics.HealthBreaker.WithLabelValues(g.ID())); got != 0 {
			t.Fatalf("breaker of %s engaged: the case is the one no breaker sees", g.ID())
		}
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "- xid-error") || !strings.Contains(last, "held: incident") {
		t.Fatalf("status does not show the incident:\n%s", last)
	}
	for _, n := range flagged {
		e.condition(n, "XIDErrors", apiv1.ConditionFalse)
	}
	for range 11 {
		e.run()
		e.clock.Step(time.Minute)
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthIncidents); got != 0 {
		t.Fatalf("incidents %v after the alarm cleared for the cooldown, want 0", got)
	}
	if ev := e.events(EventHealthIncidentOver); len(ev) != 1 {
		t.Fatalf("incident-over events %q, want 1", ev)
	}
}

// TestHealthSafeCordonCeiling: nodes going bad one by one, too slowly for
// an incident and too few for the group's breaker (4 of 100, spread over
// an hour): the cluster-wide ceiling on health cordons held (3 % of the
// judged nodes: 3) cordons the first 3 and reports the 4th. Before: 4.
func TestHealthSafeCordonCeiling(t *testing.T) {
	e, acts, gpu := healthEnv(t, 100, "rules:\n- {name: xid-error, condition: {type: XIDErrors, status: \"True\"}, action: cordon}\n")
	nodes := groupNodes(gpu)
	e.busy("w", nodes)
	for i := range 4 {
		e.condition(nodes[i], "XIDErrors", apiv1.ConditionTrue)
		e.run()
		e.clock.Step(15 * time.Second)
		e.run()
		e.clock.Step(15 * time.Minute)
	}
	if len(acts.cordoned) != 3 {
		t.Fatalf("cordoned %v, want the first 3 (the ceiling)", acts.cordoned)
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthHeld.WithLabelValues("gpu", heldCeiling)); got == 0 {
		t.Fatal("no hold counted for the ceiling")
	}
}

// TestHealthSafeHealthyStatusPolicyRefused: a policy whose rule matches a
// well-known condition's healthy status (KernelDeadlock=False: what
// node-problem-detector reports on every healthy node) with maxUnhealthy
// 100 %. Before: accepted, all 20 nodes cordoned in one loop, every
// machine deleted within 23 minutes. Now: refused, naming the field, and
// with no good policy before it, actions stay paused.
func TestHealthSafeHealthyStatusPolicyRefused(t *testing.T) {
	e, acts, gpu := healthEnv(t, 20, `maxUnhealthy: "100%"
rules:
- name: deadlock
  condition: {type: KernelDeadlock, status: "False"}
  action: replace
`)
	nodes := groupNodes(gpu)
	e.busy("w", nodes)
	for _, n := range nodes {
		e.condition(n, "KernelDeadlock", apiv1.ConditionFalse)
	}
	for range 30 {
		e.run()
		e.clock.Step(time.Minute)
	}
	if len(acts.cordoned) != 0 || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %d, deleted %d: want nothing", len(acts.cordoned), len(gpu.Deleted()))
	}
	ev := e.events(EventInvalidHealthPolicy)
	if len(ev) == 0 || !strings.Contains(ev[0], "KernelDeadlock=False is what a healthy node reports") || !strings.Contains(ev[0], `maxUnhealthy: "100%"`) {
		t.Fatalf("InvalidHealthPolicy events %q, want the healthy status and the cap named", ev)
	}
}

// TestHealthSafeNewPolicyMatchingManyReportsUntilConfirmed: a new policy
// on a condition the parser does not know (so it cannot refuse its
// healthy status) matches 4 of 20 nodes on its first evaluation, more
// than the cordon ceiling (2), fewer than the breaker (5) and the
// incident rule (5): it reports only, and the event says how to confirm
// it. Confirmed with its hash, it acts, within the ceiling.
func TestHealthSafeNewPolicyMatchingManyReportsUntilConfirmed(t *testing.T) {
	e, acts, gpu := healthEnv(t, 20, "")
	nodes := groupNodes(gpu)
	e.busy("w", nodes)
	for _, n := range nodes[:4] {
		e.condition(n, "VendorGPUCheck", apiv1.ConditionFalse)
	}
	e.run()
	policy := "maxUnhealthy: 5\nrules:\n- name: vendor\n  condition: {type: VendorGPUCheck, status: \"False\"}\n  action: cordon\n- name: vendor-replace\n  condition: {type: VendorGPUCheck, status: \"False\"}\n  for: 1h\n  action: replace\n"
	e.setPolicy(policy, nil)
	for range 3 {
		e.run()
		e.clock.Step(time.Minute)
	}
	if len(acts.cordoned) != 0 {
		t.Fatalf("cordoned %v before the policy was confirmed", acts.cordoned)
	}
	ev := e.events(EventHealthPolicyUnconfirmed)
	hash := policyHash(policy)
	if len(ev) != 1 || !strings.Contains(ev[0], "match 4 nodes") || !strings.Contains(ev[0], HealthConfirmAnnotation+"="+hash) {
		t.Fatalf("unconfirmed events %q, want one with the count and the command", ev)
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthHeld.WithLabelValues("gpu", heldUnconfirmed)); got == 0 {
		t.Fatal("no hold counted while unconfirmed")
	}
	e.setPolicy(policy, map[string]string{HealthConfirmAnnotation: hash})
	e.run()
	if len(acts.cordoned) != 2 {
		t.Fatalf("cordoned %v once confirmed, want 2 (the ceiling)", acts.cordoned)
	}
	if e.a.health.lastGood != policy {
		t.Fatal("the confirmed policy is not the last good one")
	}
}

// TestHealthSafeSmallPoolBadNodesAreReplaced: a pool of 7 with 2 nodes
// that keep reporting XIDErrors, over its breaker (20 % of 7: 1). Before:
// held for good, the pool never scaled up, a pod pending for ever. Now:
// the pool scales up for the pod at once, and once the breaker has held
// 30 minutes with no more than 2 bad nodes, they are replaced one at a
// time.
func TestHealthSafeSmallPoolBadNodesAreReplaced(t *testing.T) {
	e, acts, gpu := healthEnv(t, 7, "")
	nodes := groupNodes(gpu)
	e.busy("w", nodes)
	bad := nodes[:2]
	for _, n := range bad {
		e.condition(n, "XIDErrors", apiv1.ConditionTrue)
	}
	e.add(pendingPods(1, "train", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); fmt.Sprint(got) != "[1]" {
		t.Fatalf("increases %v, want [1] under the breaker", got)
	}
	for range 29 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if len(acts.cordoned) != 0 || len(acts.evicted) != 0 {
		t.Fatalf("cordoned %v, evicted %v within the release's 30 minutes", acts.cordoned, acts.evicted)
	}
	e.clock.Step(time.Minute)
	e.run() // released: cordoned, the cordon's pause starts
	e.clock.Step(e.a.opts.NodeDeleteDelayAfterTaint)
	e.run()
	if len(acts.evicted) != 1 {
		t.Fatalf("evicted %v once the breaker held 30 minutes, want one node's pod (one at a time)", acts.evicted)
	}
	for range 10 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if got := len(gpu.Deleted()); got != 2 {
		t.Fatalf("%d machines deleted, want both bad ones, one after the other", got)
	}
}

// TestHealthSafePodBoundInTheCordonWindowIsEvicted: a replace rule already
// due as the node is first judged (for: 0s; after a failover, an unpause,
// a new rule) on an empty node. Before: cordoned and deleted in the same
// loop, microseconds apart, so a pod the scheduler bound just before it
// saw the cordon (a gang member waiting in Permit) died with the machine.
// Now: the node waits --node-delete-delay-after-taint after its cordon,
// the pod bound meanwhile is seen and evicted with its grace, and only
// then is the machine deleted.
func TestHealthSafePodBoundInTheCordonWindowIsEvicted(t *testing.T) {
	e, acts, gpu := healthEnv(t, 8, strings.Replace(xidPolicy, "for: 1m", "for: 0s", 1))
	nodes := groupNodes(gpu)
	e.busy("w", nodes[1:])
	bad := nodes[0]
	e.condition(bad, "XIDErrors", apiv1.ConditionTrue)
	e.run()
	if fmt.Sprint(acts.cordoned) != fmt.Sprint([]string{bad}) || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %v, deleted %v in the first loop: want the cordon only", acts.cordoned, gpu.Deleted())
	}
	// The scheduler bound a gang member just before it saw the cordon.
	p := to.Pod("gang-0", append(wholeGPU(), to.OnNode(bad), to.ControlledBy("Job", "gang", "job-gang"), grace(30))...)
	p.Status.Phase = apiv1.PodRunning
	e.add(p)
	e.clock.Step(e.a.opts.NodeDeleteDelayAfterTaint)
	e.run()
	if fmt.Sprint(acts.evicted) != "[gang-0]" || len(gpu.Deleted()) != 0 {
		t.Fatalf("evicted %v, deleted %v after the pause: want the pod evicted, the machine kept while it terminates", acts.evicted, gpu.Deleted())
	}
	e.clock.Step(30*time.Second + time.Minute)
	e.run()
	if len(gpu.Deleted()) != 1 {
		t.Fatalf("deleted %v once the pod's grace ran out, want the bad node's machine", gpu.Deleted())
	}
}

// TestHealthSafeMIGNodeIsNotBelowItsSKU: a healthy node whose GPUs the
// device plugin advertises as MIG devices (nvidia.com/mig-1g.10gb, the
// mixed strategy) and none as nvidia.com/gpu. Before: "below the VM size"
// for the built-in gpus-below-sku rule, cordoned and replaced after 5
// minutes. Now: not judged by belowSKU (never cordoned), said in the
// status; it is still never the group's template.
func TestHealthSafeMIGNodeIsNotBelowItsSKU(t *testing.T) {
	e, acts, gpu := healthEnv(t, 2, "") // the built-in policy
	node := nodeName(gpu, 0)
	e.updateNode(node, func(n *apiv1.Node) {
		delete(n.Status.Allocatable, to.GPU)
		n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = resource.MustParse("56")
	})
	for range 30 { // past --max-node-startup-time (15m): GPUs not advertised, the node is judged
		e.run()
		e.clock.Step(time.Minute)
	}
	if len(acts.cordoned) != 0 || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %v, deleted %v: a MIG node is not below its VM size", acts.cordoned, gpu.Deleted())
	}
	last := e.status.writes[len(e.status.writes)-1]
	if !strings.Contains(last, node+": nvidia.com/gpu advertised as nvidia.com/mig-1g.10gb") {
		t.Fatalf("status does not say the node is not judged:\n%s", last)
	}
}

// TestHealthSafeLostDeletionIsAskedAgain: ARM accepts the deletion of an
// unhealthy node's machine and its operation fails: the VM runs on, its
// node Ready and cordoned. Before: never asked again (health.deleted), an
// 8-GPU VM cordoned for good. Now: 15 minutes later the node is still
// Ready, the deletion is asked again, counted, and not charged to the
// replacement brake twice.
func TestHealthSafeLostDeletionIsAskedAgain(t *testing.T) {
	e, _, gpu := healthEnv(t, 4, strings.Replace(xidPolicy, "for: 1m", "for: 0s", 1))
	nodes := groupNodes(gpu)
	e.condition(nodes[0], "XIDErrors", apiv1.ConditionTrue)
	gpu.SetLostDeletes(true)
	e.run()
	e.clock.Step(e.a.opts.NodeDeleteDelayAfterTaint)
	e.run() // the deletion is accepted, and lost
	if _, ok := e.a.health.deleted[nodes[0]]; !ok || len(gpu.Deleted()) != 0 {
		t.Fatalf("deleted %v, recorded %v: want a deletion accepted and lost", gpu.Deleted(), e.a.health.deleted)
	}
	if got := e.a.replace.brake.Recent(e.clock.Now()); got != 1 {
		t.Fatalf("the brake counts %d deletions, want 1", got)
	}
	gpu.SetLostDeletes(false)
	for range 14 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if len(gpu.Deleted()) != 0 {
		t.Fatalf("asked again after %v, before the lost-deletion delay", 14*time.Minute)
	}
	e.clock.Step(time.Minute)
	e.run() // found lost
	e.run() // asked again
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v 15 minutes after the lost deletion, want the machine", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.ReplacementsLost.WithLabelValues("gpu", "health")); got != 1 {
		t.Fatalf("lost deletions counted %v, want 1", got)
	}
	// The first charge is older than the brake's window (10m): a second
	// charge would show.
	if got := e.a.replace.brake.Recent(e.clock.Now()); got != 0 {
		t.Fatalf("the brake counts %d deletions in its window after the retry: charged again", got)
	}
	// One replacement, asked twice: counted and told once (the e2e run
	// found it counted twice).
	if got := testutil.ToFloat64(e.a.metrics.HealthActions.WithLabelValues("gpu", "xid-error", "replace")); got != 1 {
		t.Fatalf("health_actions_total{replace} = %v, want 1: the deletion asked again is no new replacement", got)
	}
	if evs := e.events(EventHealthReplace); len(evs) != 1 {
		t.Fatalf("HealthReplace events %v, want 1", evs)
	}
}

// TestHealthSafeSlowDeletionIsNotLost: a GPU VM's deletion runs for
// longer than --deletion-lost-after while its node is still Ready (the
// cloud lists the machine deleting): it is not lost, and not asked again
// (the second reader: "node Ready" alone took a slow deletion for a lost
// one).
func TestHealthSafeSlowDeletionIsNotLost(t *testing.T) {
	e, _, gpu := healthEnv(t, 4, strings.Replace(xidPolicy, "for: 1m", "for: 0s", 1))
	nodes := groupNodes(gpu)
	e.condition(nodes[0], "XIDErrors", apiv1.ConditionTrue)
	gpu.SetSlowDeletes(true)
	e.run()
	e.clock.Step(e.a.opts.NodeDeleteDelayAfterTaint)
	e.run()
	if _, ok := e.a.health.deleted[nodes[0]]; !ok {
		t.Fatalf("no deletion sent: recorded %v", e.a.health.deleted)
	}
	for range 20 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if got := testutil.ToFloat64(e.a.metrics.ReplacementsLost.WithLabelValues("gpu", "health")); got != 0 {
		t.Fatalf("lost deletions counted %v while the machine was listed deleting, want 0", got)
	}
	if evs := e.events(EventReplacementLost); len(evs) != 0 {
		t.Fatalf("ReplacementLost events %v for a deletion still running", evs)
	}
}

// TestHealthSafeBadImageBacksTheGroupOff: every new node of a group goes
// bad soon after it joins (a bad image throwing XIDs under load). Before:
// replaced again and again (8 cycles in 49 minutes, 8 machines bought and
// deleted, 8 running pods evicted), never backed off. Now: the third node
// younger than --health-failure-window admitted for replacement within it
// backs the group off, and its pods are told why.
func TestHealthSafeBadImageBacksTheGroupOff(t *testing.T) {
	e, _, gpu := healthEnv(t, 4, strings.Replace(xidPolicy, "for: 1m", "for: 0s", 1))
	nodes := groupNodes(gpu)
	e.busy("w", nodes[3:]) // the pending pod below needs a new node
	for i := range 3 {
		if i > 0 {
			e.clock.Step(5 * time.Minute)
		}
		e.condition(nodes[i], "XIDErrors", apiv1.ConditionTrue)
		e.run()
		e.clock.Step(e.a.opts.NodeDeleteDelayAfterTaint)
		e.run()
	}
	if got := len(gpu.Deleted()); got != 3 {
		t.Fatalf("%d machines replaced, want 3", got)
	}
	gs := e.a.registry.Group("gpu")
	if gs == nil || !gs.Backoff.Active {
		t.Fatal("group not backed off after 3 new nodes failed health within the window")
	}
	if ev := e.events(EventHealthBackoff); len(ev) != 1 || !strings.Contains(ev[0], "3 nodes younger than 1h0m0s failed health rules") {
		t.Fatalf("HealthBackoff events %q", ev)
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedScaleUps.WithLabelValues("gpu", "health")); got != 1 {
		t.Fatalf("failed scale-ups{health} %v, want 1", got)
	}
	e.add(pendingPods(1, "train", wholeGPU()...))
	e.run()
	if ev := e.events("NotTriggerScaleUp"); len(ev) == 0 || !strings.Contains(ev[len(ev)-1], "failed health rules") {
		t.Fatalf("NotTriggerScaleUp events %q, want the pods told the health backoff", ev)
	}
}

// TestHealthSafeBadImageBackoffSurvivesAFailover: two young nodes of a
// bad image failed health, then the leader changes; the third backs the
// group off on the new leader. Before: the count lived in memory, and
// every new leader allowed --health-failures-before-backoff more cycles.
func TestHealthSafeBadImageBackoffSurvivesAFailover(t *testing.T) {
	e, _, gpu := healthEnvWithSafety(t, 4, "")
	e.setPolicy(strings.Replace(xidPolicy, "for: 1m", "for: 0s", 1), nil)
	nodes := groupNodes(gpu)
	e.busy("w", nodes[3:])
	for i := range 3 {
		if i == 2 {
			e.failover()
		}
		if i > 0 {
			e.clock.Step(5 * time.Minute)
		}
		e.condition(nodes[i], "XIDErrors", apiv1.ConditionTrue)
		e.run()
		e.clock.Step(e.a.opts.NodeDeleteDelayAfterTaint)
		e.run()
	}
	if got := len(gpu.Deleted()); got != 3 {
		t.Fatalf("%d machines replaced, want 3", got)
	}
	if gs := e.a.registry.Group("gpu"); gs == nil || !gs.Backoff.Active {
		t.Fatal("group not backed off by the third young failure, the first two counted by the leader before")
	}
	if ev := e.events(EventHealthBackoff); len(ev) != 1 {
		t.Fatalf("HealthBackoff events %q, want 1", ev)
	}
}

// TestHealthSafeYoungFailureCountedOnceAcrossAFailover: two young nodes
// a drain rule keeps (cordoned, drained, their machines kept) count 2
// towards the health backoff; a new leader admits them again, which must
// not count them again (the second reader found 2 young bad nodes and a
// failover backing a healthy group off); a third young node then backs
// the group off.
func TestHealthSafeYoungFailureCountedOnceAcrossAFailover(t *testing.T) {
	e, _, gpu := healthEnvWithSafety(t, 15, "")
	e.setPolicy(`maxUnhealthy: "20%"
rules:
- name: plugin
  condition: {type: UnhealthyNvidiaDevicePlugin, status: "True"}
  for: 0s
  action: drain
`, nil)
	nodes := groupNodes(gpu)
	bad := func(n string) {
		e.condition(n, "UnhealthyNvidiaDevicePlugin", apiv1.ConditionTrue)
		e.run()
		e.clock.Step(e.a.opts.NodeDeleteDelayAfterTaint)
		e.run()
	}
	bad(nodes[0])
	bad(nodes[1])
	backedOff := func() bool { gs := e.a.registry.Group("gpu"); return gs != nil && gs.Backoff.Active }
	if backedOff() {
		t.Fatal("backed off after 2 young failures, want 3")
	}
	e.failover()
	for range 3 {
		e.clock.Step(e.a.opts.NodeDeleteDelayAfterTaint)
		e.run()
	}
	if backedOff() {
		t.Fatal("backed off after a failover with the same 2 young failures: the new leader counted them again")
	}
	// The first recovers (the cordon ceiling of this small cluster, 2,
	// has room again); a third young node goes bad.
	e.condition(nodes[0], "UnhealthyNvidiaDevicePlugin", apiv1.ConditionFalse)
	e.run()
	e.run()
	bad(nodes[2])
	if !backedOff() {
		t.Fatal("not backed off by the third young failure")
	}
	if got := len(gpu.Deleted()); got != 0 {
		t.Fatalf("deleted %v: a drain rule keeps the machines", gpu.Deleted())
	}
}

// TestHealthSafeBadImageInAnEmptyPoolBacksItOff: a pool starting empty
// whose every new node comes up with 6 of its 8 GPUs (a bad image), the
// built-in policy (no ConfigMap), 2 whole-node pods pending. Its first bad
// nodes are all it has judged, so its breaker holds at once and they are
// never admitted for replacement. Before (the e2e helper's throwaway
// test): failures were counted only on admission, so the group was never
// backed off, and scale-up (which the breaker never stops) bought bad
// nodes up to its max. Now a young node the breaker holds counts too,
// once, when it was bought after the group was first seen failing: the
// third such backs the group off.
func TestHealthSafeBadImageInAnEmptyPoolBacksItOff(t *testing.T) {
	e, _, gpu := healthEnv(t, 0, "")
	e.add(pendingPods(2, "train", wholeGPU()...))
	bad := func(n *apiv1.Node) {
		n.Status.Allocatable["nvidia.com/gpu"] = resource.MustParse("6")
	}
	bought := func() int {
		n := 0
		for _, d := range gpu.Increases() {
			n += d
		}
		return n
	}
	backedOff := func() bool { gs := e.a.registry.Group("gpu"); return gs != nil && gs.Backoff.Active }
	for round := 0; !backedOff(); round++ {
		if round == 10 {
			t.Fatalf("not backed off after %d rounds, %d bad nodes bought (%v)", round, bought(), gpu.Increases())
		}
		e.run()
		e.register(gpu, bad)
		e.clock.Step(5*time.Minute + time.Second) // gpus-below-sku's for
		e.run()
	}
	// P = 2 pods pending, F = 3 failures. The first P bad nodes, held by
	// the breaker and bought before the group was seen failing, only mark
	// it failing (a monitor flagging a whole group at once is no bad
	// image); the nodes bought after them count, F of them in ⌈F/P⌉
	// rounds of P; and a pod's next node is bought in the loop that judges
	// its last: P·(⌈F/P⌉+2) = 8 at most.
	if got := bought(); got > 8 {
		t.Fatalf("%d nodes bought (%v) before the backoff, want at most 8", got, gpu.Increases())
	}
	if ev := e.events(EventHealthBackoff); len(ev) == 0 {
		t.Fatal("no HealthBackoff event")
	}
	before := bought()
	for range 4 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if got := bought(); got != before {
		t.Fatalf("%d nodes bought during the backoff", got-before)
	}
}

// TestHealthSafeScratchEmptyDirDoesNotBlockAReplacement: an XID node runs
// a training pod with a scratch emptyDir (most do). Before: cordoned and
// never drained (local storage), the gang hanging on a dead GPU. Now: the
// built-in replace rule evicts it (evictLocalScratch, on for replace
// rules: the data goes with the broken node anyway); a pod with a
// hostPath, or annotated safe-to-evict=false, still holds the node.
func TestHealthSafeScratchEmptyDirDoesNotBlockAReplacement(t *testing.T) {
	for _, tc := range []struct {
		name    string
		volume  apiv1.VolumeSource
		annot   map[string]string
		evicted bool
	}{
		{"emptyDir scratch", apiv1.VolumeSource{EmptyDir: &apiv1.EmptyDirVolumeSource{}}, nil, true},
		{"hostPath", apiv1.VolumeSource{HostPath: &apiv1.HostPathVolumeSource{Path: "/data"}}, nil, false},
		{"emptyDir, safe-to-evict=false", apiv1.VolumeSource{EmptyDir: &apiv1.EmptyDirVolumeSource{}},
			map[string]string{"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, acts, gpu := healthEnv(t, 4, "") // the built-in policy
			nodes := groupNodes(gpu)
			p := to.Pod("train-0", append(wholeGPU(), to.OnNode(nodes[0]), to.ControlledBy("Job", "train", "job-train"))...)
			p.Status.Phase = apiv1.PodRunning
			p.Spec.Volumes = []apiv1.Volume{{Name: "scratch", VolumeSource: tc.volume}}
			p.Annotations = tc.annot
			e.add(p)
			e.condition(nodes[0], "XIDErrors", apiv1.ConditionTrue)
			for range 4 {
				e.run()
				e.clock.Step(time.Minute)
			}
			if got := len(acts.evicted) == 1; got != tc.evicted {
				t.Fatalf("evicted %v, want evicted %v", acts.evicted, tc.evicted)
			}
		})
	}
}

// TestHealthSafeDrainedNodeIsKeptFromScaleDown: a drain rule keeps the
// machine (its pods evicted, the node cordoned for someone to look at).
// Before: the empty node was scale-down's after its unneeded time, and
// its machine deleted. Now: a health-cordoned node is no scale-down
// candidate.
func TestHealthSafeDrainedNodeIsKeptFromScaleDown(t *testing.T) {
	e, acts, gpu := healthEnv(t, 3, "rules:\n- {name: plugin, condition: {type: UnhealthyNvidiaDevicePlugin, status: \"True\"}, action: drain}\n")
	o := e.a.opts
	o.ScaleDownEnabled = true
	if err := e.a.Reconfigure(o); err != nil {
		t.Fatal(err)
	}
	nodes := groupNodes(gpu)
	e.busy("w", nodes[1:])
	e.condition(nodes[0], "UnhealthyNvidiaDevicePlugin", apiv1.ConditionTrue)
	for range 30 {
		e.run()
		e.clock.Step(time.Minute)
	}
	if fmt.Sprint(acts.cordoned) != fmt.Sprint([]string{nodes[0]}) {
		t.Fatalf("cordoned %v, want the drained node", acts.cordoned)
	}
	if got := gpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v: scale-down removed the machine a drain rule keeps", got)
	}
}

// TestHealthSafeBreakerReleaseSurvivesAFailover: a new leader takes over a
// breaker held by 2 bad nodes of a pool of 7 (the safety state keeps the
// breaker, not when it engaged). Before the second reader's fix: the
// release never came on the new leader (it needs the engage time). Now:
// it counts from the new leader's first look, and the nodes go.
func TestHealthSafeBreakerReleaseSurvivesAFailover(t *testing.T) {
	e, _, gpu := healthEnvWithSafety(t, 7, "")
	nodes := groupNodes(gpu)
	for _, n := range nodes[:2] {
		e.condition(n, "XIDErrors", apiv1.ConditionTrue)
	}
	e.run()
	e.clock.Step(10 * time.Minute)
	e.run()
	e.failover()
	// The release 30 minutes after the new leader's first look takes the
	// first node; the second follows the breaker's cooldown once the
	// group is back within maxUnhealthy.
	for range 60 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if got := len(gpu.Deleted()); got != 2 {
		t.Fatalf("%d machines replaced an hour after a failover under a breaker held by 2 bad nodes, want both", got)
	}
}

// TestHealthSafeIncidentSurvivesAFailover: an incident's matches began
// long before a new leader's first look (outside the window): the new
// leader holds it as an incident again rather than draining its nodes at
// the brake's pace.
func TestHealthSafeIncidentSurvivesAFailover(t *testing.T) {
	e, acts, _, _ := threePoolsFlagged(t, true)
	e.run()
	e.clock.Step(20 * time.Minute)
	e.run()
	e.failover()
	for range 10 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if len(acts.cordoned) != 0 || len(acts.evicted) != 0 {
		t.Fatalf("cordoned %v, evicted %v after the failover: the new leader forgot the incident", acts.cordoned, acts.evicted)
	}
}

// TestHealthSafeForeignCordonCountsTowardsTheCeiling: nodes cordoned by
// someone else (an upgrade, kured) that match a replace rule are admitted
// within the cordon ceiling too: before, they skipped it.
func TestHealthSafeForeignCordonCountsTowardsTheCeiling(t *testing.T) {
	e, acts, gpu := healthEnv(t, 40, "rules:\n- {name: xid-error, condition: {type: XIDErrors, status: \"True\"}, action: drain}\n")
	nodes := groupNodes(gpu)
	e.busy("w", nodes)
	for i, n := range nodes[:4] {
		e.updateNode(n, func(n *apiv1.Node) { n.Spec.Unschedulable = true }) // an operator's cordon
		e.condition(n, "XIDErrors", apiv1.ConditionTrue)
		e.run()
		e.clock.Step(15 * time.Minute) // too slow for an incident
		_ = i
	}
	// The ceiling: max(2, 3% of 40) = 2 nodes held at once.
	if len(acts.evicted) != 2 {
		t.Fatalf("evicted %v, want 2 (the ceiling) of the 4 foreign-cordoned nodes", acts.evicted)
	}
}

// TestYoungFailuresWithinLeavesTheListAlone: a node counted already
// changes nothing in its group's list of young failures. Before, the list
// was filtered in place and the filtering stopped at the counted node:
// [expired, A, N] became [A, A, N], and A counted twice towards the
// group's health backoff.
func TestYoungFailuresWithinLeavesTheListAlone(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	window := 30 * time.Minute
	failures := []YoungFailure{
		{Node: "expired", At: now.Add(-time.Hour)},
		{Node: "a", At: now.Add(-time.Minute)},
		{Node: "n", At: now.Add(-time.Minute)},
	}
	before := slices.Clone(failures)
	if _, _, _, counted := youngFailuresWithin(failures, "n", now, window); !counted {
		t.Fatal("node n not seen as counted")
	}
	if !slices.Equal(failures, before) {
		t.Fatalf("the group's failures became %v, want them unchanged %v", failures, before)
	}
	recent, fresh, first, counted := youngFailuresWithin(failures, "b", now, window)
	if counted || fresh != 3 || len(recent) != 2 || !first.Equal(now.Add(-time.Minute)) {
		t.Fatalf("for a new node: recent %v, fresh %d, first %v, counted %v; want a and n, 3 (them and b), a minute ago, false", recent, fresh, first, counted)
	}
}
