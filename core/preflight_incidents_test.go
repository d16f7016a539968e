package core

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// failCheck is the periodic agent failing a passed node: label failed, the
// agent's message in the annotation, no taint.
func (e *env) failCheck(name, check string) {
	e.updateNode(name, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValueFailed
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[preflight.DefaultFailureAnnotation] = "check " + check + ": exit status 1: it failed"
	})
}

// passAgain is the periodic agent's re-run passing a failed node.
func (e *env) passAgain(name string) {
	e.updateNode(name, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValuePassed
		delete(n.Annotations, preflight.DefaultFailureAnnotation)
	})
}

// newFleet is the incident tests' cluster: 20 registered GPU nodes, no
// scale-down (empty nodes stay: replacement is the subject), no backoff on
// preflight failures, and a replacement brake of 100 unless opts say
// otherwise (the incident is the subject, not the budget).
func newFleet(t *testing.T, acts *fakeActions, opts ...envOption) (*env, *inmemory.Group, []string) {
	t.Helper()
	base := withOptions(func(o *Options) {
		o.PreflightFailuresBeforeBackoff = 0
		o.ScaleDownEnabled = false
		o.ReplacementBrakeMinNodes = 100
	})
	e := newEnv(t, append([]envOption{withScaleDown(acts), base}, opts...)...)
	gpu := e.provider.AddGroup("gpu", 0, 40, gpuTemplate("gpu"), inmemory.WithTarget(20))
	e.start()
	e.register(gpu)
	return e, gpu, sortedNodeNames(e)
}

// syncCordons makes the nodes' spec what the API server has after the
// fake actions' cordons and uncordons, in the order they were asked.
func (e *env) syncCordons(acts *fakeActions) {
	state := map[string]bool{}
	for _, n := range acts.cordoned {
		state[n] = true
	}
	for _, n := range acts.uncordoned {
		state[n] = false
	}
	for n, on := range state {
		e.updateNode(n, func(n *apiv1.Node) { n.Spec.Unschedulable = on })
	}
}

func sortedNodeNames(e *env) []string {
	names := e.nodeNames()
	sort.Strings(names)
	return names
}

// TestPreflightIncident: 8 of 20 nodes fail the DNS check at once (a DNS
// outage), 2 fail checks of their own. The 8 are an incident: not
// cordoned, not deleted, reported by an event, a metric and the status;
// the 2 bad machines are cordoned at once (they had passed: new pods
// would land on them while their failure settles) and replaced once it
// has. When the 8 pass again the incident is over and nothing of them was
// touched.
func TestPreflightIncident(t *testing.T) {
	acts := &fakeActions{}
	e, gpu, names := newFleet(t, acts)
	for _, n := range names[:8] {
		e.failCheck(n, "dns")
	}
	e.failCheck(names[8], "gpu-count")
	e.failCheck(names[9], "ecc")
	e.run()
	if !slices.Equal(slices.Sorted(slices.Values(acts.cordoned)), []string{names[8], names[9]}) || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %v, deleted %v before any failure settled: want the 2 failing checks of their own cordoned at once, nothing deleted", acts.cordoned, gpu.Deleted())
	}
	e.syncCordons(acts)
	e.clock.Step(e.opts.PreflightFailureSettle)
	e.run()
	cordoned := map[string]bool{}
	for _, n := range acts.cordoned {
		cordoned[n] = true
	}
	for _, n := range names[:8] {
		if cordoned[n] {
			t.Fatalf("node %s cordoned for a check that fails on 8 nodes at once", n)
		}
	}
	if !cordoned[names[8]] || !cordoned[names[9]] {
		t.Fatalf("cordoned %v, want the 2 nodes failing checks of their own", acts.cordoned)
	}
	if got := len(gpu.Deleted()); got != 2 {
		t.Fatalf("deleted %d machines, want the 2 bad ones", got)
	}
	if evs := e.events(EventPreflightIncident); len(evs) != 1 || !strings.Contains(evs[0], `check "dns"`) {
		t.Fatalf("events %v, want one PreflightIncident naming the dns check", evs)
	}
	if got := testutil.ToFloat64(e.a.metrics.PreflightIncidentNodes.WithLabelValues("dns")); got != 8 {
		t.Fatalf("preflight_incident_nodes{check=dns} = %v, want 8", got)
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "preflightIncidents:\n  dns: 8") {
		t.Fatalf("status does not name the incident:\n%s", last)
	}
	// Minutes later the outage is still on: still nothing done to them.
	e.clock.Step(15 * time.Minute)
	e.run()
	if got := len(gpu.Deleted()); got != 2 {
		t.Fatalf("deleted %d machines 15 minutes into the incident, want still 2", got)
	}
	// DNS is back: the agent's re-run passes them.
	// The agents report one by one: while fewer than the threshold fail,
	// for less than the settle, the incident holds, and the last still
	// failing are not taken for bad machines.
	for _, n := range names[:6] {
		e.passAgain(n)
	}
	e.run()
	e.clock.Step(e.opts.PreflightFailureSettle - time.Second)
	e.run()
	if evs := e.events(EventPreflightIncidentOver); len(evs) != 0 {
		t.Fatalf("events %v: the incident ended before fewer failed it for the settle", evs)
	}
	for _, n := range names[6:8] {
		if slices.Contains(acts.cordoned, n) {
			t.Fatalf("node %s cordoned while the incident was ending", n)
		}
		e.passAgain(n)
	}
	e.clock.Step(time.Second)
	e.run()
	if evs := e.events(EventPreflightIncidentOver); len(evs) != 1 {
		t.Fatalf("events %v, want one PreflightIncidentOver", evs)
	}
	if n := testutil.CollectAndCount(e.a.metrics.PreflightIncidentNodes); n != 0 {
		t.Fatalf("%d preflight_incident_nodes series after the incident, want none", n)
	}
	if got := len(gpu.Deleted()); got != 2 {
		t.Fatalf("deleted %d machines, want the 2 bad ones only", got)
	}
}

// TestOutageReportedOneByOneIsOneIncident: the agents of an outage report
// one per loop, as the periodic agents of a cluster do (each on its own
// schedule). Every loop until the threshold sees fewer than it; none of
// the early reports is taken for a bad machine, because none has stood for
// --preflight-failure-settle when the incident is seen: the early ones are
// only cordoned (a node its periodic re-run failed takes no new pods),
// fewer than the threshold, and uncordoned when the incident is seen.
func TestOutageReportedOneByOneIsOneIncident(t *testing.T) {
	acts := &fakeActions{}
	e, gpu, names := newFleet(t, acts)
	threshold := e.a.incidentThreshold()
	// 8 reports, 30 s apart: the 5th (the threshold) comes 2 minutes after
	// the first, well within the default settle of 5.
	for i, n := range names[:8] {
		e.failCheck(n, "dns")
		e.run()
		e.syncCordons(acts)
		if len(gpu.Deleted()) != 0 {
			t.Fatalf("after %d reports: deleted %v; want nothing deleted", i+1, gpu.Deleted())
		}
		if want := min(i+1, threshold-1); i+1 < threshold && len(acts.cordoned) != want {
			t.Fatalf("after %d reports: cordoned %v; want the %d reported so far cordoned at once", i+1, acts.cordoned, want)
		}
		if len(acts.cordoned) >= threshold {
			t.Fatalf("after %d reports: cordoned %v; want fewer than the incident threshold %d", i+1, acts.cordoned, threshold)
		}
		e.clock.Step(30 * time.Second)
	}
	if evs := e.events(EventPreflightIncident); len(evs) != 1 {
		t.Fatalf("events %v, want one PreflightIncident", evs)
	}
	if !slices.Equal(slices.Sorted(slices.Values(acts.uncordoned)), slices.Sorted(slices.Values(acts.cordoned))) {
		t.Fatalf("uncordoned %v, want every node cordoned before the incident was seen (%v)", acts.uncordoned, acts.cordoned)
	}
	cordons := len(acts.cordoned)
	e.clock.Step(time.Hour)
	e.run()
	if len(acts.cordoned) != cordons || len(gpu.Deleted()) != 0 {
		t.Fatalf("an hour into the incident: cordoned %v, deleted %v; want nothing more done", acts.cordoned, gpu.Deleted())
	}
}

// TestIncidentTakesBackWhatWasDoneBeforeItWasSeen: reports slower than the
// settle — the first were acted on as bad machines before the threshold
// was reached. When the incident is seen, the one still cordoned (the
// replacement brake held its deletion) is uncordoned; the one already
// deleted stays deleted; the later ones are never touched.
func TestIncidentTakesBackWhatWasDoneBeforeItWasSeen(t *testing.T) {
	acts := &fakeActions{}
	e, gpu, names := newFleet(t, acts, withOptions(func(o *Options) {
		o.PreflightFailureSettle = time.Minute
		o.ReplacementBrakeMinNodes, o.ReplacementBrakeClusterShare = 1, 0
	}))
	e.failCheck(names[0], "dns")
	e.failCheck(names[1], "dns")
	e.run()
	if len(acts.cordoned) != 2 || len(gpu.Deleted()) != 0 {
		t.Fatalf("cordoned %v, deleted %v; want both cordoned at once, nothing deleted before the settle", acts.cordoned, gpu.Deleted())
	}
	e.syncCordons(acts)
	e.clock.Step(time.Minute)
	e.run()
	if len(acts.cordoned) != 2 || len(gpu.Deleted()) != 1 {
		t.Fatalf("cordoned %v, deleted %v; want both cordoned, the brake's 1 deleted", acts.cordoned, gpu.Deleted())
	}
	pid := gpu.Deleted()[0]
	held := names[0]
	if strings.HasSuffix(held, pid[strings.LastIndex(pid, "/")+1:]) {
		held = names[1]
	}
	// 4 more: with the held one, 5 fail the check (the deleted one's Node
	// may be gone).
	for _, n := range names[2:6] {
		e.failCheck(n, "dns")
	}
	e.run()
	if evs := e.events(EventPreflightIncident); len(evs) != 1 {
		t.Fatalf("events %v, want one PreflightIncident", evs)
	}
	if !slices.Equal(acts.uncordoned, []string{held}) {
		t.Fatalf("uncordoned %v, want the held node %s", acts.uncordoned, held)
	}
	if len(acts.cordoned) != 2 || len(gpu.Deleted()) != 1 {
		t.Fatalf("cordoned %v, deleted %v after the incident was seen; want no more", acts.cordoned, gpu.Deleted())
	}
}

// TestSameCheckFailingSlowlyIsNoIncident: nodes failing the same check
// one every 3 minutes are bad machines (never 5 within 10 minutes): each
// is replaced.
func TestSameCheckFailingSlowlyIsNoIncident(t *testing.T) {
	acts := &fakeActions{}
	e, gpu, names := newFleet(t, acts, actOnFailuresAtOnce())
	for i, n := range names[:8] {
		e.failCheck(n, "ecc")
		e.run()
		e.run()
		if got := len(gpu.Deleted()); got != i+1 {
			t.Fatalf("after %d failures %d deleted: a slow trickle of one check is bad machines, each replaced", i+1, got)
		}
		e.clock.Step(3 * time.Minute)
	}
	if evs := e.events(EventPreflightIncident); len(evs) != 0 {
		t.Fatalf("events %v, want no incident", evs)
	}
}

// TestHeldFailedNodeThatPassesAgainIsUncordoned: a failed node the
// replacement brake holds (cordoned, not deleted) passes the agent's
// re-run: it is uncordoned, never deleted, with an event.
func TestHeldFailedNodeThatPassesAgainIsUncordoned(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), actOnFailuresAtOnce(), withOptions(func(o *Options) {
		o.PreflightFailuresBeforeBackoff = 0
		o.ScaleDownEnabled = false
		o.ReplacementBrakeMinNodes, o.ReplacementBrakeClusterShare = 1, 0
	}))
	gpu := e.provider.AddGroup("gpu", 0, 40, gpuTemplate("gpu"), inmemory.WithTarget(10))
	e.start()
	e.register(gpu)
	names := sortedNodeNames(e)
	for i, n := range names[:3] {
		e.failCheck(n, fmt.Sprintf("nvlink-%d", i))
	}
	e.run()
	e.run()
	if got := len(gpu.Deleted()); got != 1 {
		t.Fatalf("deleted %d, want the brake's 1", got)
	}
	cordoned := map[string]bool{}
	for _, n := range acts.cordoned {
		cordoned[n] = true
		e.updateNode(n, func(n *apiv1.Node) { n.Spec.Unschedulable = true }) // as the API server has it
	}
	if len(cordoned) != 3 {
		t.Fatalf("cordoned %v, want the 3 failed nodes", acts.cordoned)
	}
	deleted := map[string]bool{}
	for _, pid := range gpu.Deleted() {
		for _, n := range names {
			if strings.HasSuffix(n, pid[strings.LastIndex(pid, "/")+1:]) {
				deleted[n] = true
			}
		}
	}
	var held []string
	for _, n := range names[:3] {
		if !deleted[n] {
			held = append(held, n)
			e.passAgain(n)
		}
	}
	e.run()
	sort.Strings(acts.uncordoned)
	if strings.Join(acts.uncordoned, ",") != strings.Join(held, ",") {
		t.Fatalf("uncordoned %v, want the held nodes that passed again %v", acts.uncordoned, held)
	}
	if evs := e.events(EventPreflightRecovered); len(evs) != 2 {
		t.Fatalf("events %v, want 2 PreflightRecovered", evs)
	}
	e.clock.Step(11 * time.Minute)
	e.run()
	if got := len(gpu.Deleted()); got != 1 {
		t.Fatalf("deleted %d after the window, want still 1: the others passed again", got)
	}
}

// TestPeriodicFailuresCordonedAtOnceBelowTheThreshold: 10 nodes that had
// passed fail 10 different checks of the agent's periodic re-run at once
// (#39: a node a periodic check failed stayed schedulable through the
// 5-minute settle). Fewer than the incident threshold of them are
// cordoned at once — a monitor failing many checks cordons no more than
// one check's incident would have — nothing is evicted or deleted before
// the settle; once it has, each is a bad machine of its own and replaced.
func TestPeriodicFailuresCordonedAtOnceBelowTheThreshold(t *testing.T) {
	acts := &fakeActions{}
	e, gpu, names := newFleet(t, acts)
	threshold := e.a.incidentThreshold()
	for i, n := range names[:10] {
		e.failCheck(n, fmt.Sprintf("check-%d", i))
	}
	e.run()
	e.syncCordons(acts)
	if len(acts.cordoned) != threshold-1 || len(gpu.Deleted()) != 0 || len(acts.evicted) != 0 {
		t.Fatalf("cordoned %v, evicted %v, deleted %v at once: want %d cordoned (below the incident threshold), nothing evicted or deleted",
			acts.cordoned, acts.evicted, gpu.Deleted(), threshold-1)
	}
	e.run()
	if len(acts.cordoned) != threshold-1 {
		t.Fatalf("cordoned %v a loop later: want still %d", acts.cordoned, threshold-1)
	}
	e.clock.Step(e.opts.PreflightFailureSettle)
	e.run()
	e.run()
	if got := len(gpu.Deleted()); got != 10 {
		t.Fatalf("deleted %d after the settle, want the 10 bad machines", got)
	}
	if evs := e.events(EventPreflightIncident); len(evs) != 0 {
		t.Fatalf("events %v, want no incident", evs)
	}
}
