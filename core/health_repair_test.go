package core

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// repairPolicy replaces an XID node after trying a reboot, then a
// reimage, each given 10 minutes.
const repairPolicy = `
maxUnhealthy: 1
rules:
- name: xid-error
  condition: {type: XIDErrors, status: "True"}
  for: 1m
  action: replace
  repair: [reboot, reimage]
  repairTimeout: 10m
`

// drainedForRepair brings node 3 of an 8-node gang to the ladder: its XID
// lasted the rule's minute, its pod was evicted with its 30 s and is gone.
func drainedForRepair(t *testing.T, e *env, acts *fakeActions, g *inmemory.Group) {
	nodes := groupNodes(g)
	t.Helper()
	e.gangOnNodes("train", nodes, grace(30))
	e.condition(nodes[3], "XIDErrors", apiv1.ConditionTrue)
	e.run()
	e.clock.Step(time.Minute)
	e.run()
	if fmt.Sprint(acts.evicted) != "[train-3]" {
		t.Fatalf("evicted %v, want the bad node's pod", acts.evicted)
	}
	e.clock.Step(10 * time.Second)
	e.run()
	if got := g.Repairs(); len(got) != 0 {
		t.Fatalf("repairs %v while the evicted pod is within its grace: a reboot would kill it", got)
	}
	e.clock.Step(20*time.Second + actuation.GraceMargin)
	e.run()
}

// passPreflightOf plays the preflight agent passing a node: its taint
// removed, its label passed.
func (e *env) passPreflightOf(node string) {
	e.updateNode(node, func(n *apiv1.Node) {
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t apiv1.Taint) bool { return t.Key == preflight.DefaultTaintKey })
		n.Labels[preflight.DefaultLabel] = preflight.ValuePassed
	})
}

// nodeObj is the node as the API server has it.
func (e *env) nodeObj(name string) *apiv1.Node {
	e.t.Helper()
	obj, ok, err := e.nodes.GetByKey(name)
	if err != nil || !ok {
		e.t.Fatalf("node %s: %v", name, err)
	}
	return obj.(*apiv1.Node)
}

// sentThroughPreflight says the node carries the preflight taint and the
// pending label again.
func sentThroughPreflight(e *env, node string) bool {
	obj, ok, _ := e.nodes.GetByKey(node)
	if !ok {
		return false
	}
	n := obj.(*apiv1.Node)
	return n.Labels[preflight.DefaultLabel] == preflight.ValuePending &&
		slices.ContainsFunc(n.Spec.Taints, func(t apiv1.Taint) bool { return t.Key == preflight.DefaultTaintKey })
}

// TestRepairLadderKeepsTheMachineARebootOrReimageFixes (#42): a drained
// XID node is rebooted, not replaced; the reboot does not fix it within
// its 10 minutes, so it is reimaged; the reimage does: the node stops
// matching, is uncordoned and kept (HealthRepaired), its machine never
// deleted. Before, its machine was deleted at once.
func TestRepairLadderKeepsTheMachineARebootOrReimageFixes(t *testing.T) {
	e, acts, gpu := healthEnvWithSafety(t, 8, repairPolicy)
	nodes, pids := groupNodes(gpu), gpu.ProviderIDs()
	drainedForRepair(t, e, acts, gpu)
	if got := gpu.Repairs(); fmt.Sprint(got) != fmt.Sprint([]string{pids[3] + " reboot"}) || len(gpu.Deleted()) != 0 {
		t.Fatalf("repairs %v, deleted %v once drained: want a reboot, no deletion", got, gpu.Deleted())
	}
	if ev := e.events(EventHealthRepair); len(ev) != 1 {
		t.Fatalf("HealthRepair events %q, want 1", ev)
	}
	if rec := readRepairRecord(e.nodeObj(nodes[3])); rec.Run == nil || rec.Run.Action != "reboot" || rec.Run.Started.IsZero() {
		t.Fatalf("repair record %+v: want the reboot written on the node before it was sent", rec)
	}
	e.clock.Step(5 * time.Minute)
	gpu.FinishRepair(pids[3], nil) // the reboot ran; the XID stays
	e.run()
	if !sentThroughPreflight(e, nodes[3]) {
		t.Fatalf("node %s after its reboot: want the preflight taint and pending label back", nodes[3])
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "step: 1/2 reboot") || !strings.Contains(last, "state: preflight again") {
		t.Fatalf("status lacks the node's repair (step 1/2 reboot, preflight again):\n%s", last)
	}
	e.failover() // a new leader goes on with the ladder where it was, from the node
	e.run()
	if got := gpu.Repairs(); len(got) != 1 || len(gpu.Deleted()) != 0 {
		t.Fatalf("repairs %v, deleted %v within the reboot's 10 minutes (and across a failover)", got, gpu.Deleted())
	}
	e.passPreflightOf(nodes[3]) // the agent passes it; the XID is still there
	e.clock.Step(5 * time.Minute)
	e.run()
	e.clock.Step(DefaultOptions().NodeDeleteDelayAfterTaint)
	e.run() // this leader's pause after the cordon, as before any deletion, ends
	if got := gpu.Repairs(); fmt.Sprint(got) != fmt.Sprint([]string{pids[3] + " reboot", pids[3] + " reimage"}) || len(gpu.Deleted()) != 0 {
		t.Fatalf("repairs %v, deleted %v after the reboot's 10 minutes: want a reimage next", got, gpu.Deleted())
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthRepairs.WithLabelValues("gpu", "reboot", "timeout")); got != 1 {
		t.Fatalf("reboot timeouts %v, want 1", got)
	}
	gpu.FinishRepair(pids[3], nil)
	e.condition(nodes[3], "XIDErrors", apiv1.ConditionFalse) // the reimage fixed it
	e.clock.Step(time.Minute)
	e.run()
	if slices.Contains(acts.uncordoned, nodes[3]) || !sentThroughPreflight(e, nodes[3]) {
		t.Fatalf("uncordoned %v before the reimaged node passed preflight again", acts.uncordoned)
	}
	e.passPreflightOf(nodes[3])
	e.clock.Step(time.Minute)
	e.run()
	if len(gpu.Deleted()) != 0 || !slices.Contains(acts.uncordoned, nodes[3]) {
		t.Fatalf("deleted %v, uncordoned %v: want the fixed node kept and uncordoned", gpu.Deleted(), acts.uncordoned)
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthRepairs.WithLabelValues("gpu", "reimage", "fixed")); got != 1 {
		t.Fatalf("reimage fixes %v, want 1", got)
	}
	if ev := e.events(EventHealthRepaired); len(ev) != 1 {
		t.Fatalf("HealthRepaired events %q, want 1", ev)
	}
	rec := readRepairRecord(e.nodeObj(nodes[3]))
	var outcomes []string
	for _, h := range rec.History {
		outcomes = append(outcomes, h.Action+" "+h.Outcome)
	}
	if rec.Run != nil || fmt.Sprint(outcomes) != "[reboot timeout reimage fixed]" {
		t.Fatalf("repair record %+v: want no run, the history [reboot timeout reimage fixed]", rec)
	}
}

// TestRepairPreflightFailureIsTheNextStep: a rebooted node that fails
// preflight again is the ladder's, not the preflight gate's: it is
// reimaged next, not replaced (and not uncordoned); and it is a broken
// machine, not the group's new machines going bad: with the group's
// backoff at the first preflight failure, the group still scales up.
func TestRepairPreflightFailureIsTheNextStep(t *testing.T) {
	e, acts, gpu := newHealthEnv(t, 8, repairPolicy, false, func(o *Options) { o.PreflightFailuresBeforeBackoff = 1 })
	nodes, pids := groupNodes(gpu), gpu.ProviderIDs()
	drainedForRepair(t, e, acts, gpu)
	gpu.FinishRepair(pids[3], nil)
	e.run()
	e.updateNode(nodes[3], func(n *apiv1.Node) { n.Labels[preflight.DefaultLabel] = preflight.ValueFailed })
	e.clock.Step(10 * time.Second)
	e.run()
	if got := gpu.Repairs(); fmt.Sprint(got) != fmt.Sprint([]string{pids[3] + " reboot", pids[3] + " reimage"}) || len(gpu.Deleted()) != 0 {
		t.Fatalf("repairs %v, deleted %v after the rebooted node failed preflight: want a reimage, no deletion", got, gpu.Deleted())
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthRepairs.WithLabelValues("gpu", "reboot", "preflight-failed")); got != 1 {
		t.Fatalf("reboot preflight failures %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.Backoff.WithLabelValues("gpu")); got != 0 {
		t.Fatalf("gpu backoff %v after a repaired node failed preflight, want 0", got)
	}
	before := len(gpu.Increases())
	e.add(pendingPods(1, "more", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != before+1 {
		t.Fatalf("increases %v: want the group to scale up for a new pod", got)
	}
	// The reimage fails preflight too: the last step, the gate replaces it.
	gpu.FinishRepair(pids[3], nil)
	e.run()
	if !sentThroughPreflight(e, nodes[3]) {
		t.Fatalf("node %s after its reimage: want it sent through preflight again", nodes[3])
	}
	e.updateNode(nodes[3], func(n *apiv1.Node) { n.Labels[preflight.DefaultLabel] = preflight.ValueFailed })
	for i := 0; i < 5 && len(gpu.Deleted()) == 0; i++ {
		e.clock.Step(time.Minute)
		e.run()
	}
	if got := gpu.Deleted(); fmt.Sprint(got) != fmt.Sprint([]string{pids[3]}) || slices.Contains(acts.uncordoned, nodes[3]) {
		t.Fatalf("deleted %v, uncordoned %v after every step failed preflight: want the machine replaced", got, acts.uncordoned)
	}
}

// TestRepairConditionClearedWhileTheMachineIsDownIsNotAFix: the XID
// condition clears while the reboot still runs (the monitor lost the GPU
// with the machine): the node stays cordoned until the machine is back
// and passed preflight again.
func TestRepairConditionClearedWhileTheMachineIsDownIsNotAFix(t *testing.T) {
	e, acts, gpu := healthEnv(t, 8, repairPolicy)
	nodes, pids := groupNodes(gpu), gpu.ProviderIDs()
	drainedForRepair(t, e, acts, gpu)
	e.condition(nodes[3], "XIDErrors", apiv1.ConditionFalse)
	e.clock.Step(time.Minute)
	e.run()
	if slices.Contains(acts.uncordoned, nodes[3]) {
		t.Fatalf("uncordoned %v while its reboot runs", acts.uncordoned)
	}
	gpu.FinishRepair(pids[3], nil)
	e.run()
	e.run()
	if slices.Contains(acts.uncordoned, nodes[3]) || !sentThroughPreflight(e, nodes[3]) {
		t.Fatalf("uncordoned %v before preflight passed again", acts.uncordoned)
	}
	e.passPreflightOf(nodes[3])
	e.run()
	if !slices.Contains(acts.uncordoned, nodes[3]) || len(gpu.Deleted()) != 0 {
		t.Fatalf("uncordoned %v, deleted %v once it passed: want it kept and uncordoned", acts.uncordoned, gpu.Deleted())
	}
}

// TestRepairLadderEndsInAReplacement: the reboot fails in the cloud (the
// next step at once), the reimage does not fix the node within its 10
// minutes: the machine is replaced as without a ladder.
func TestRepairLadderEndsInAReplacement(t *testing.T) {
	e, acts, gpu := healthEnv(t, 8, repairPolicy)
	pids := gpu.ProviderIDs()
	drainedForRepair(t, e, acts, gpu)
	gpu.FinishRepair(pids[3], errors.New("restart of 3 failed: InternalExecutionError"))
	e.run()
	if got := gpu.Repairs(); len(got) != 2 || got[1] != pids[3]+" reimage" {
		t.Fatalf("repairs %v after the reboot failed: want the reimage next", got)
	}
	e.clock.Step(10 * time.Minute)
	e.run()
	if got := gpu.Deleted(); fmt.Sprint(got) != fmt.Sprint([]string{pids[3]}) {
		t.Fatalf("deleted %v after the last step timed out, want the bad node's machine", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthRepairs.WithLabelValues("gpu", "reboot", "failed")); got != 1 {
		t.Fatalf("reboot failures %v, want 1", got)
	}
}

// TestRepairLadderNotForGroupsThatCannotRepair: a group whose machines
// cannot be repaired in place (a Flexible scale set's) replaces its
// broken node at once; before, the ladder asked again every loop, and
// the node stayed drained for good.
func TestRepairLadderNotForGroupsThatCannotRepair(t *testing.T) {
	e, acts, gpu := healthEnv(t, 8, repairPolicy)
	gpu.SetCannotRepair(true)
	drainedForRepair(t, e, acts, gpu)
	if got := gpu.Deleted(); len(got) != 1 || len(gpu.Repairs()) != 0 {
		t.Fatalf("deleted %v, repairs %v: want the machine replaced at once", got, gpu.Repairs())
	}
}

// TestRepairStepTheCloudNeverTakesIsGivenUp: a step the cloud never
// reports done, then never takes (the next one refused while the first
// still runs), is given up after the rule's repairTimeout each: the
// machine is replaced within the ladder's time, not held for ever.
func TestRepairStepTheCloudNeverTakesIsGivenUp(t *testing.T) {
	e, acts, gpu := healthEnv(t, 8, repairPolicy)
	drainedForRepair(t, e, acts, gpu)
	for i := 0; i < 5 && len(gpu.Deleted()) == 0; i++ {
		e.clock.Step(10 * time.Minute)
		e.run()
	}
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v 50 minutes into a ladder of 2 × 10 minutes whose reboot never ends", got)
	}
}

// TestRepairRunOfARecoveredNodeIsForgotten: a node a reboot fixed that
// breaks again within repairMemory starts its next ladder at the reimage
// (a flaky GPU is not rebooted for ever); one that breaks again weeks
// later starts from the reboot.
func TestRepairRunOfARecoveredNodeIsForgotten(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration
		want  string
	}{
		{"a day later: the reimage", 24 * time.Hour, "reimage"},
		{"a month later: the reboot again", 30 * 24 * time.Hour, "reboot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, acts, gpu := healthEnvWithSafety(t, 8, repairPolicy)
			nodes, pids := groupNodes(gpu), gpu.ProviderIDs()
			drainedForRepair(t, e, acts, gpu)
			e.failover() // the run is read back from the node; this leader admitted nothing
			e.condition(nodes[3], "XIDErrors", apiv1.ConditionFalse)
			gpu.FinishRepair(pids[3], nil)
			e.run()
			e.passPreflightOf(nodes[3])
			e.run()
			if !slices.Contains(acts.uncordoned, nodes[3]) {
				t.Fatalf("uncordoned %v: want the rebooted node back", acts.uncordoned)
			}
			e.clock.Step(tc.after)
			e.condition(nodes[3], "XIDErrors", apiv1.ConditionTrue)
			e.run()
			e.clock.Step(time.Minute)
			e.run()
			e.clock.Step(30*time.Second + actuation.GraceMargin)
			e.run()
			if got := gpu.Deleted(); len(got) != 0 {
				t.Fatalf("deleted %v when the node broke again: the ladder was skipped", got)
			}
			if got := gpu.Repairs(); len(got) != 2 || got[1] != pids[3]+" "+tc.want {
				t.Fatalf("repairs %v: want a %s next", got, tc.want)
			}
		})
	}
}

// TestReplacementFirstTwoBrokenNodesAtTheMinimum: two broken nodes of a
// group at its minimum of 4 are replaced one at a time, each with its own
// purchase, the group never below its minimum; and a bought
// node that never becomes Ready is bought again after the provision and
// preflight times, not waited on for ever.
func TestReplacementFirstTwoBrokenNodesAtTheMinimum(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withNodeWrites(acts), withOptions(func(o *Options) { o.ScaleDownEnabled = false }))
	acts.graceful = e.clock
	gpu := e.provider.AddGroup("gpu", 4, 20, gpuTemplate("gpu"), inmemory.WithTarget(4))
	e.start()
	e.register(gpu)
	e.setPolicy("maxUnhealthy: 2\n"+strings.TrimPrefix(xidPolicy, "\nmaxUnhealthy: 1\n"), nil)
	nodes, pids := groupNodes(gpu), gpu.ProviderIDs()
	e.gangOnNodes("train", nodes[:1], grace(30))
	e.gangOnNodes("eval", nodes[1:2], grace(30))
	for _, n := range nodes[:2] {
		e.condition(n, "XIDErrors", apiv1.ConditionTrue)
	}
	e.clock.Step(2 * time.Minute)
	e.run()
	e.run()
	if got := fmt.Sprint(gpu.Increases()); got != "[1]" || len(acts.evicted) != 0 {
		t.Fatalf("scale-ups %s, evicted %v: want one purchase at a time, nothing evicted before it is Ready", got, acts.evicted)
	}
	// The first purchase never registers: bought again once the
	// provision and preflight times have passed and the group's backoff
	// for the machine that never came has run out; nothing evicted
	// meanwhile.
	e.clock.Step(DefaultOptions().MaxNodeProvisionTime + DefaultOptions().Preflight.MaxPreflightTime)
	for i := 0; i < 60 && len(gpu.Increases()) < 2; i++ {
		e.clock.Step(time.Minute)
		e.run()
		if len(acts.evicted) != 0 {
			t.Fatalf("evicted %v while the group lacks the machine bought for it", acts.evicted)
		}
	}
	if got := fmt.Sprint(gpu.Increases()); got != "[1 1]" {
		t.Fatalf("scale-ups %s an hour after the first purchase never came: want it bought again", got)
	}
	e.register(gpu) // both bought machines register, Ready
	both := func() bool { d := gpu.Deleted(); return slices.Contains(d, pids[0]) && slices.Contains(d, pids[1]) }
	for i := 0; i < 30 && !both(); i++ {
		e.clock.Step(time.Minute)
		e.run()
		e.register(gpu)
	}
	if !both() {
		t.Fatalf("deleted %v, want both broken machines (and the one that never came)", gpu.Deleted())
	}
	if n, _ := gpu.TargetSize(); n < 4 {
		t.Fatalf("target %d, below the minimum", n)
	}
}

// TestRepairingNodesCountForTheBreaker: under the default maxUnhealthy
// (20 %: one node of 8), a node whose machine is going through preflight
// again after its reboot is still an unhealthy node of its group: a
// second node turning bad meanwhile engages the breaker and is not
// drained. Before, the repairing node dropped out of the count and the
// second was drained too, and so on, a node at a time. The ladder itself
// goes on under the breaker.
func TestRepairingNodesCountForTheBreaker(t *testing.T) {
	e, acts, gpu := healthEnv(t, 8, strings.TrimPrefix(repairPolicy, "\nmaxUnhealthy: 1"))
	nodes, pids := groupNodes(gpu), gpu.ProviderIDs()
	drainedForRepair(t, e, acts, gpu)
	gpu.FinishRepair(pids[3], nil)
	e.run()
	if !sentThroughPreflight(e, nodes[3]) {
		t.Fatalf("node %s not sent through preflight again", nodes[3])
	}
	e.gangOnNodes("eval", nodes[5:6], grace(30))
	e.condition(nodes[5], "XIDErrors", apiv1.ConditionTrue)
	for range 3 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if slices.Contains(acts.evicted, "eval-0") || slices.Contains(acts.evicted, "train-5") {
		t.Fatalf("evicted %v: a second node drained while the first is in its repair ladder", acts.evicted)
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthBreaker.WithLabelValues("gpu")); got != 1 {
		t.Fatalf("breaker %v, want engaged", got)
	}
	// The rebooted node passes preflight with its XID still there: its
	// ladder goes on under the breaker (a step on a drained machine
	// disrupts nothing), the reimage asked after the reboot's 10 minutes.
	e.passPreflightOf(nodes[3])
	for range 8 {
		e.clock.Step(time.Minute)
		e.run()
	}
	if got := gpu.Repairs(); fmt.Sprint(got) != fmt.Sprint([]string{pids[3] + " reboot", pids[3] + " reimage"}) || len(gpu.Deleted()) != 0 {
		t.Fatalf("repairs %v, deleted %v under the breaker: want the ladder to go on (a reimage), nothing deleted", got, gpu.Deleted())
	}
}

// TestRepairThrottledIsAskedAgain: a reboot answered 429 (ARM's or the
// VM's Compute policy) ran nothing: it is asked again, not counted as a
// failed step (before, the ladder skipped to the reimage).
func TestRepairThrottledIsAskedAgain(t *testing.T) {
	e, acts, gpu := healthEnv(t, 8, repairPolicy)
	pids := gpu.ProviderIDs()
	gpu.FailNextRepairs(cloudprovider.NewError(cloudprovider.ClassThrottled, "TooManyRequests", "", errors.New("429 UpdateVMScaleSetVMResource")))
	drainedForRepair(t, e, acts, gpu)
	if got := gpu.Repairs(); len(got) != 0 {
		t.Fatalf("repairs %v: the throttled reboot ran", got)
	}
	e.clock.Step(10 * time.Second)
	e.run()
	if got := gpu.Repairs(); fmt.Sprint(got) != fmt.Sprint([]string{pids[3] + " reboot"}) {
		t.Fatalf("repairs %v after a throttled reboot: want the reboot asked again", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.HealthRepairs.WithLabelValues("gpu", "reboot", "failed")); got != 0 {
		t.Fatalf("reboot failures %v, want 0", got)
	}
}

// TestRepairNodeIsVerifiedBeforeItTakesWork: however a ladder leaves a
// node whose machine a step touched — the step failed in the cloud and
// the next one is throttled, the health policy paused across a failover,
// the rule's repair steps changed — a node whose XID cleared stays
// cordoned until it passed preflight again. Before, each was uncordoned
// at once, without preflight.
func TestRepairNodeIsVerifiedBeforeItTakesWork(t *testing.T) {
	throttled := cloudprovider.NewError(cloudprovider.ClassThrottled, "TooManyRequests", "", errors.New("429"))
	for _, tc := range []struct {
		name string
		// after runs once the reboot was asked, before the XID clears.
		after func(e *env, gpu *inmemory.Group, pid string)
	}{
		{"the reboot failed, the reimage throttled", func(e *env, gpu *inmemory.Group, pid string) {
			gpu.FailNextRepairs(throttled, throttled, throttled)
			gpu.FinishRepair(pid, errors.New("restart failed: InternalExecutionError"))
			e.run()
		}},
		{"paused across a failover", func(e *env, gpu *inmemory.Group, pid string) {
			gpu.FinishRepair(pid, nil)
			e.setPolicy(repairPolicy, map[string]string{HealthPausedAnnotation: "true"})
			e.failover()
		}},
		{"the repair steps changed", func(e *env, gpu *inmemory.Group, pid string) {
			gpu.FinishRepair(pid, nil)
			e.setPolicy(strings.Replace(repairPolicy, "[reboot, reimage]", "[reimage]", 1), nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, acts, gpu := healthEnvWithSafety(t, 8, repairPolicy)
			nodes, pids := groupNodes(gpu), gpu.ProviderIDs()
			drainedForRepair(t, e, acts, gpu)
			tc.after(e, gpu, pids[3])
			e.condition(nodes[3], "XIDErrors", apiv1.ConditionFalse)
			for range 3 {
				e.clock.Step(time.Minute)
				e.run()
			}
			if slices.Contains(acts.uncordoned, nodes[3]) || len(gpu.Deleted()) != 0 {
				t.Fatalf("uncordoned %v, deleted %v: want node %s kept cordoned until it passed preflight again", acts.uncordoned, gpu.Deleted(), nodes[3])
			}
			if strings.HasPrefix(tc.name, "paused") {
				e.setPolicy(repairPolicy, nil)
				e.run()
			}
			if !sentThroughPreflight(e, nodes[3]) {
				t.Fatalf("node %s not sent through preflight again", nodes[3])
			}
			e.passPreflightOf(nodes[3])
			e.run()
			e.run()
			if !slices.Contains(acts.uncordoned, nodes[3]) || len(gpu.Deleted()) != 0 {
				t.Fatalf("uncordoned %v, deleted %v once it passed: want it back", acts.uncordoned, gpu.Deleted())
			}
		})
	}
}

// TestRepairNotForANodeCordonedByAnOperator: a node an operator (an
// upgrade, kured) had cordoned is replaced as before, not repaired: the
// autoscaler may not write its repair record or preflight on it. Before,
// the ladder waited out every step timeout, asking nothing.
func TestRepairNotForANodeCordonedByAnOperator(t *testing.T) {
	e, _, gpu := healthEnv(t, 8, repairPolicy)
	nodes := groupNodes(gpu)
	e.updateNode(nodes[3], func(n *apiv1.Node) { n.Spec.Unschedulable = true })
	e.condition(nodes[3], "XIDErrors", apiv1.ConditionTrue)
	for i := 0; i < 10 && len(gpu.Deleted()) == 0; i++ {
		e.clock.Step(time.Minute)
		e.run()
	}
	if got := gpu.Repairs(); len(got) != 0 || len(gpu.Deleted()) != 1 {
		t.Fatalf("repairs %v, deleted %v: want the operator's cordoned node replaced, not repaired", got, gpu.Deleted())
	}
}

// TestRepairNotReadyAfterTheLastStepWithoutTheGate: with the preflight
// gate off, a node left NotReady by its ladder (the reboot never ends,
// the reimage never taken) is replaced once the ladder is over, not kept
// cordoned for ever.
func TestRepairNotReadyAfterTheLastStepWithoutTheGate(t *testing.T) {
	e, acts, gpu := newHealthEnv(t, 8, repairPolicy, false, func(o *Options) { o.Preflight.Enabled = false })
	nodes, pids := groupNodes(gpu), gpu.ProviderIDs()
	drainedForRepair(t, e, acts, gpu)
	e.updateNode(nodes[3], func(n *apiv1.Node) {
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == apiv1.NodeReady {
				n.Status.Conditions[i].Status = apiv1.ConditionFalse
			}
		}
	})
	for i := 0; i < 40 && len(gpu.Deleted()) == 0; i++ {
		e.clock.Step(time.Minute)
		e.run()
	}
	if got := gpu.Deleted(); fmt.Sprint(got) != fmt.Sprint([]string{pids[3]}) {
		t.Fatalf("deleted %v 40 minutes into a ladder of 2 × 10 minutes, its node NotReady: want its machine replaced", got)
	}
}
