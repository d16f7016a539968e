package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/health"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// Event reasons of passive node health (docs/concepts/health-policy.md).
const (
	// EventNodeUnhealthy is on a node that matches a rule of the policy.
	EventNodeUnhealthy = "NodeUnhealthy"
	// EventHealthCordon is on a node health handling cordoned.
	EventHealthCordon = "HealthCordon"
	// EventHealthDrain is on a node whose pods health handling evicts.
	EventHealthDrain = "HealthDrain"
	// EventHealthReplace is on a node whose machine health handling deleted.
	EventHealthReplace = "HealthReplace"
	// EventHealthRecovered is on a node whose match cleared: uncordoned.
	EventHealthRecovered = "HealthRecovered"
	// EventHealthHeld is on a node whose health action waits (the breaker,
	// the pause, the unready guard, its gang, the replacement brake).
	EventHealthHeld = "HealthHeld"
	// EventHealthBreaker is on the status ConfigMap when a group's breaker engages.
	EventHealthBreaker = "HealthBreaker"
	// EventInvalidHealthPolicy is on the policy ConfigMap when it is refused.
	EventInvalidHealthPolicy = "InvalidHealthPolicy"
	// EventHealthPolicyUnconfirmed is on the policy ConfigMap when a new
	// policy's first evaluation matched too many nodes: it reports only
	// until confirmed (HealthConfirmAnnotation).
	EventHealthPolicyUnconfirmed = "HealthPolicyUnconfirmed"
	// EventHealthIncident is on the status ConfigMap when many nodes begin
	// matching one rule at once; EventHealthIncidentOver when it ends.
	EventHealthIncident     = "HealthIncident"
	EventHealthIncidentOver = "HealthIncidentOver"
)

// HealthPausedAnnotation on the health policy's ConfigMap pauses health
// actions: any value but "false" (kubectl annotate … =true).
const HealthPausedAnnotation = "vmss-autoscaler.io/health-paused"

// HealthConfirmAnnotation on the health policy's ConfigMap confirms a
// policy whose first evaluation matched more nodes than the cordon
// ceiling: its value must be the policy's hash, as the
// HealthPolicyUnconfirmed event and the status give it, so a later edit
// is evaluated again.
const HealthConfirmAnnotation = "vmss-autoscaler.io/health-policy-confirmed"

// cordonHealth prefixes the reason on health cordons: "health/<rule>".
const cordonHealth = actuation.HealthCordonPrefix

// Reasons a health action is held, for the metric, events and status.
const (
	heldPaused  = "paused"
	heldGuard   = "unready-guard"
	heldBreaker = "breaker"
	heldGang    = "gang"
	heldBrake   = "brake"
	heldBlocked = "blocked"
	heldMinSize = "min-size"
	// heldIncident: the node's rule is in a health incident.
	heldIncident = "incident"
	// heldCeiling: the cluster-wide ceiling on health cordons is reached.
	heldCeiling = "cordon-ceiling"
	// heldUnconfirmed: a new policy awaits confirmation.
	heldUnconfirmed = "unconfirmed"
	// heldCordonCap: past maxHealthCordonsPerLoop cordons, the next loop
	// cordons more (a mass report is not thousands of writes at once).
	heldCordonCap = "cordon-cap"
)

// maxHealthCordonsPerLoop caps the cordons health handling writes in one
// loop.
const maxHealthCordonsPerLoop = 50

// maxHealthListed caps the nodes named in the status.
const maxHealthListed = 20

// healthState is what health handling remembers between loops. The
// cordons are also on the nodes (actuation.CordonedAnnotation), the
// breakers and the last good policy in the safety state, so a new leader
// takes them over.
type healthState struct {
	policy *health.Policy
	// lastGood is the text of the last policy accepted (here or by an
	// earlier leader): "" while none was, when a refused ConfigMap leaves
	// actions paused rather than falling back to the built-in policy.
	lastGood  string
	version   string // resourceVersion of the ConfigMap last parsed
	seen      bool   // the ConfigMap was read at least once
	paused    bool   // the pause annotation as last read
	policyErr string // why the ConfigMap was refused, or why the last good policy is in force, for the status
	// firstSeen: node → rule → when this process first saw a match the
	// node does not date (a shortfall, a taint without timeAdded).
	firstSeen map[string]map[string]time.Time
	told      map[string]string    // node → rule last told by NodeUnhealthy
	heldTold  map[string]string    // node → reason last told by HealthHeld
	cordoned  map[string]string    // node → rule: cordoned by health handling
	admitted  map[string]bool      // drains and replacements the brake admitted
	deleted   map[string]time.Time // machines deleted, until their Nodes go
	// boughtFirst: node → its replacement bought first, the group being
	// at its minimum (replacementFirst): its drain waits until the group
	// keeps its minimum of Ready nodes without it.
	boughtFirst map[string]boughtFirst
	// repairs are the repair ladders in progress, by node (health_repair.go);
	// repairWhy why a node's due step is not asked yet; repairsAdopted:
	// this leader read the ladders its predecessor left on the nodes.
	repairs        map[string]*RepairRun
	repairWhy      map[string]string
	repairsAdopted bool
	// breakers: group → end of its storm cooldown; zero while the group
	// is over maxUnhealthy. Absent: not engaged. breakerSince: when each
	// engaged (the release counts from it).
	breakers     map[string]time.Time
	breakerSince map[string]time.Time
	// incidents: rule → zero while at least the threshold match it, else
	// when fewer began to (it ends after the policy's stormCooldown).
	incidents map[string]time.Time
	// pending is the text of a policy read and parsed but not yet accepted
	// as the last good one: it waits for its first evaluation (evaluated
	// false) or, having matched too many nodes then, for the ConfigMap's
	// HealthConfirmAnnotation to carry pendingHash (actions held).
	pending, pendingHash string
	evaluated            bool
	// confirmed is HealthConfirmAnnotation as last read.
	confirmed string
	// incidentsSeen: this leader judged the incidents once (its first
	// judgement counts every match, updateIncidents).
	incidentsSeen bool
	// youngFailures: group → its nodes younger than
	// --health-failure-window admitted for a drain or replacement within
	// that window, and when (the health backoff). A node counts once: a
	// new leader admits again the nodes the last one had admitted.
	youngFailures map[string][]YoungFailure
	// unhealthySeries are the (group, rule) series of the unhealthy gauge
	// set last loop: the ones not set again are deleted (never a Reset,
	// which a scrape could see empty).
	unhealthySeries map[[2]string]bool
}

func newHealthState() *healthState {
	return &healthState{policy: health.Default(), firstSeen: map[string]map[string]time.Time{},
		told: map[string]string{}, heldTold: map[string]string{}, cordoned: map[string]string{},
		admitted: map[string]bool{}, deleted: map[string]time.Time{}, boughtFirst: map[string]boughtFirst{}, repairs: map[string]*RepairRun{}, repairWhy: map[string]string{}, breakers: map[string]time.Time{},
		breakerSince: map[string]time.Time{}, incidents: map[string]time.Time{}, unhealthySeries: map[[2]string]bool{}}
}

// release forgets what was done to a node no longer unhealthy.
func (hs *healthState) release(name string) {
	delete(hs.cordoned, name)
	delete(hs.admitted, name)
	delete(hs.heldTold, name)
	delete(hs.boughtFirst, name)
}

// restoreLastGood takes the last good policy an earlier leader saved.
func (hs *healthState) restoreLastGood(ctx context.Context, raw string) {
	if raw == "" {
		return
	}
	p, err := health.Parse(raw)
	if err != nil {
		klog.FromContext(ctx).Error(err, "The saved last good health policy is unreadable; ignored")
		return
	}
	hs.policy, hs.lastGood = p, raw
}

// healthReport is one loop's health findings, for the status and metrics.
type healthReport struct {
	paused   bool
	nodes    []HealthNode
	more     int
	breakers []string
	degraded map[string][]string // group → degraded nodes (capped)
	// incidents are the rules in an incident; cordoned the health cordons
	// held, ceiling their cluster-wide bound.
	incidents         []string
	cordoned, ceiling int
	// notJudged are nodes whose shortfall belowSKU rules cannot judge
	// (health.Unjudged), capped, and how many more.
	notJudged     []string
	notJudgedMore int
	// repairs are the repair ladders in progress (capped), and how many more.
	repairs     []HealthRepair
	repairsMore int
}

// healthPolicy reads the policy's ConfigMap from the cache, parsing it
// again only when it changed, and says whether actions are paused. A
// refused ConfigMap keeps the last good policy (this leader's or an
// earlier one's, from the safety state); with none, actions are paused
// until a good one is read — never the built-in policy in place of a
// user's. The built-in policy applies only while no ConfigMap was ever
// accepted or seen; one that goes away leaves the last good policy (and
// the last pause) in force.
func (a *Autoscaler) healthPolicy(ctx context.Context) (*health.Policy, bool) {
	hs := a.health
	name := a.opts.HealthPolicyConfigMapName
	if a.listers.ConfigMaps == nil || name == "" {
		return hs.policy, false
	}
	cm, err := a.listers.ConfigMaps.Get(name)
	if err != nil {
		return a.policyUnread(ctx, name, err)
	}
	hs.seen = true
	v, set := cm.Annotations[HealthPausedAnnotation]
	hs.paused = set && v != "false"
	hs.confirmed = cm.Annotations[HealthConfirmAnnotation]
	if cm.ResourceVersion == hs.version {
		return hs.policy, hs.paused || hs.noPolicy()
	}
	hs.version = cm.ResourceVersion
	raw := cm.Data["policy"]
	p, err := health.Parse(raw)
	if err != nil {
		return a.refusePolicy(ctx, cm, err)
	}
	hs.policy, hs.policyErr = p, ""
	hs.takePolicy(raw)
	klog.FromContext(ctx).Info("Health policy loaded", "configmap", klog.KObj(cm), "rules", len(p.Rules), "paused", hs.paused, "hash", policyHash(raw))
	return p, hs.paused
}

// policyUnread is the policy in force when its ConfigMap could not be
// read: the last one, as the last pause says, while the cache errs or no
// ConfigMap was ever seen or accepted; one that went away leaves the last
// good policy in force.
func (a *Autoscaler) policyUnread(ctx context.Context, name string, err error) (*health.Policy, bool) {
	hs := a.health
	if !apierrors.IsNotFound(err) || (!hs.seen && hs.lastGood == "") {
		return hs.policy, hs.paused
	}
	if hs.version != "" {
		klog.FromContext(ctx).Info("Health policy ConfigMap gone; the last good policy stays in force", "configmap", name)
		hs.version = ""
	}
	hs.policyErr = fmt.Sprintf("health policy ConfigMap %s gone: the last good policy stays in force", name)
	hs.dropPending()
	return hs.policy, hs.paused || hs.noPolicy()
}

// refusePolicy keeps the last good policy in place of one that does not
// parse (with none, actions pause), and says so: the status, the log and
// an event on the ConfigMap.
func (a *Autoscaler) refusePolicy(ctx context.Context, cm *apiv1.ConfigMap, err error) (*health.Policy, bool) {
	hs := a.health
	err = fmt.Errorf("health policy ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	what := "the last good policy stays"
	if hs.lastGood == "" {
		what = "no policy was accepted yet: health actions are paused (reports only) until one is"
	}
	hs.policyErr = err.Error() + "; " + what
	klog.FromContext(ctx).Error(err, "Ignoring the health policy", "resourceVersion", cm.ResourceVersion, "then", what)
	if a.rec != nil {
		a.rec.Event(cm, apiv1.EventTypeWarning, EventInvalidHealthPolicy, hs.policyErr)
	}
	hs.dropPending()
	return hs.policy, hs.paused || hs.noPolicy()
}

// takePolicy takes a newly parsed policy's text: the last good one again,
// or one accepted as the last good one after its first evaluation
// (firstEvaluation), or once confirmed.
func (hs *healthState) takePolicy(raw string) {
	if raw == hs.lastGood {
		hs.pending = ""
	} else {
		hs.pending, hs.pendingHash, hs.evaluated = raw, policyHash(raw), false
	}
}

// policyHash names a policy's text for HealthConfirmAnnotation: the first
// 12 hex digits of its SHA-256.
func policyHash(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:6])
}

// noPolicy says no policy was ever accepted and none waits for its first
// evaluation or confirmation: actions pause (never the built-in policy
// in place of a user's refused one).
func (hs *healthState) noPolicy() bool { return hs.lastGood == "" && hs.pending == "" }

// dropPending forgets a policy that waited for its first evaluation or
// confirmation when its ConfigMap is gone or refused since: the last good
// policy is in force again, as a new leader would have it.
func (hs *healthState) dropPending() {
	if hs.pending == "" {
		return
	}
	hs.pending, hs.evaluated = "", false
	if hs.lastGood == "" {
		return
	}
	if p, err := health.Parse(hs.lastGood); err == nil {
		hs.policy = p
	}
}

// unconfirmed says a new policy's first evaluation matched too many
// nodes and it waits for confirmation: actions are held.
func (hs *healthState) unconfirmed() bool { return hs.pending != "" && hs.evaluated }

// firstEvaluation accepts a newly read policy as the last good one once
// its first evaluation finds its drain and replace rules matching no more
// nodes than the cordon ceiling, or once the ConfigMap confirms its hash.
// Otherwise it reports only, with an event on the ConfigMap saying how
// to confirm it: a typo that matches healthy nodes (a condition's
// healthy status on a type the parser does not know) must not cordon the
// fleet before anyone looked. Until then a new leader keeps the previous
// last good policy saved (the pending one is not), and judges the
// pending one again.
func (a *Autoscaler) firstEvaluation(ctx context.Context, j judgement) {
	hs := a.health
	if hs.pending == "" {
		return
	}
	accept := func() {
		hs.lastGood, hs.pending, hs.evaluated = hs.pending, "", false
	}
	if hs.confirmed == hs.pendingHash {
		if hs.evaluated {
			klog.FromContext(ctx).Info("Health policy confirmed", "hash", hs.pendingHash)
		}
		accept()
		return
	}
	if hs.evaluated {
		return
	}
	hs.evaluated = true
	n := 0
	for _, c := range j.over {
		n += c
	}
	ceiling := a.cordonCeiling(j)
	if n <= ceiling {
		accept()
		return
	}
	name := a.opts.HealthPolicyConfigMapName
	msg := fmt.Sprintf("the new health policy's drain and replace rules match %d nodes on its first evaluation, more than the cordon ceiling (%d, --health-max-cordoned-share): it reports only until confirmed: kubectl -n %s annotate configmap %s %s=%s",
		n, ceiling, a.opts.Namespace, name, HealthConfirmAnnotation, hs.pendingHash)
	hs.policyErr = msg
	klog.FromContext(ctx).Info("Health policy unconfirmed", "matching", n, "ceiling", ceiling, "hash", hs.pendingHash)
	if a.rec != nil {
		a.rec.Event(&apiv1.ObjectReference{Kind: "ConfigMap", APIVersion: "v1", Namespace: a.opts.Namespace, Name: name},
			apiv1.EventTypeWarning, EventHealthPolicyUnconfirmed, msg)
	}
}

// healthCordonsHeld counts the nodes health handling holds — its own
// cordons, and nodes cordoned by someone else it admitted for a drain or
// replacement — whose machines live: a replaced node's lingering Node
// object holds nothing.
func (a *Autoscaler) healthCordonsHeld() int {
	hs := a.health
	n := 0
	for name := range hs.cordoned {
		if !a.machineDeleted(name) {
			n++
		}
	}
	for name := range hs.admitted {
		if _, ours := hs.cordoned[name]; !ours && !a.machineDeleted(name) {
			n++
		}
	}
	return n
}

// cordonCeiling is the most health cordons held at once: the share of
// the judged nodes (--health-max-cordoned-share), rounded up, and at
// least 2.
func (a *Autoscaler) cordonCeiling(j judgement) int {
	return max(2, int(math.Ceil(a.opts.HealthMaxCordonedShare*float64(len(j.judged)))))
}

// skuTemplate is the group's template as its VM size describes it (not
// learned from a node), once per loop; nil when the size is unknown.
func (a *Autoscaler) skuTemplate(l *loop, g cloudprovider.NodeGroup) *apiv1.Node {
	if t, ok := l.skuTemplates[g.ID()]; ok {
		return t
	}
	t, err := g.TemplateNode()
	if err != nil {
		t = nil
	}
	if l.skuTemplates == nil {
		l.skuTemplates = map[string]*apiv1.Node{}
	}
	l.skuTemplates[g.ID()] = t
	return t
}

// degraded says what a node advertises less of than its VM size (a GPU
// the device plugin marked unhealthy): such a node is never a template. A
// node still starting up (GPUs not advertised yet, within
// --max-node-startup-time) is not degraded, nor is one of an unknown size;
// one whose GPUs never came, past that time, is.
func (a *Autoscaler) degraded(l *loop, n *apiv1.Node) []apiv1.ResourceName {
	if s, ok := l.degraded[n.Name]; ok {
		return s
	}
	var short []apiv1.ResourceName
	if g, ok := l.groupOf[n.Name]; ok && !a.startingUp(l, n) {
		short = health.Shortfall(n, a.skuTemplate(l, g), a.health.policy.MemoryTolerance)
	}
	if l.degraded == nil {
		l.degraded = map[string][]apiv1.ResourceName{}
	}
	l.degraded[n.Name] = short
	return short
}

// machineDeleted says a node's machine was deleted (by scale-down,
// preflight or health handling) while its Node object lingers: it is no
// template, no destination for moved pods, and nothing more is done to it.
func (a *Autoscaler) machineDeleted(name string) bool {
	if _, gone := a.health.deleted[name]; gone {
		return true
	}
	if _, gone := a.preflight.deleted[name]; gone {
		return true
	}
	return a.scaleDown.actuator != nil && a.scaleDown.actuator.IsGone(name)
}

// healthCandidate is an unhealthy node of this loop.
type healthCandidate struct {
	node    *apiv1.Node
	group   string
	verdict health.Verdict
	entry   *HealthNode
	// began is when its earliest drain or replace match began (as the node
	// says, else as this process first saw it); zero without one.
	began time.Time
}

// cordonWanted says a match still asks for the node to be cordoned, now or
// once its time comes (a rule whose action is cordon or stronger).
func (c *healthCandidate) cordonWanted() bool {
	for _, m := range c.verdict.Matches {
		if m.Rule != nil && m.Rule.Action >= health.Cordon {
			return true
		}
	}
	return false
}

// judgement is what the health phase found this loop.
type judgement struct {
	cands  map[string]*healthCandidate // the judged nodes that match a rule
	judged map[string]bool             // every node judged
	live   map[string]int              // judged nodes per group: the breaker's denominator
	all    map[string]int              // nodes per group, judged or not: the cap on a count
	over   map[string]int              // judged nodes per group matching a drain or replace rule
	// ruleAll and ruleRecent count, per rule that cordons or more, the
	// judged nodes matching it, and those whose match began within
	// --health-incident-window (the incident rule).
	ruleAll, ruleRecent map[string]int
}

// nodeHealth is the passive health phase: it reads what node-problem-
// detector, the GPU monitors and the device plugin say on the nodes,
// judges each node by the policy and acts within the bounds — the pause,
// the unready guard, the group's breaker, one node per gang, the
// replacement brake — through the one deletion path. Nodes whose match
// cleared are uncordoned. The scale-up phase of this same loop buys what
// the evicted pods need.
func (a *Autoscaler) nodeHealth(ctx context.Context, l *loop) error {
	// The replacement brake's report covers this phase's admissions, the
	// preflight phase's and the cluster state's, which ran before it.
	defer a.reportReplacements(ctx, l)
	pol, paused := a.healthPolicy(ctx)
	hs := a.health
	rep := &healthReport{paused: paused, degraded: map[string][]string{}}
	l.health = rep
	defer func() { rep.repairs, rep.repairsMore = a.repairReport(l, pol) }()
	v := 0.0
	if paused {
		v = 1
	}
	a.metrics.HealthPaused.Set(v)

	// The ladders an earlier leader left on the nodes, read back before
	// anything counts or releases them (paused or not).
	a.adoptRepairs(ctx, l)
	j := a.judgeNodes(ctx, l, pol, rep)
	a.countRepairing(l, j)
	a.firstEvaluation(ctx, j)
	a.updateBreakers(ctx, l, pol, j)
	a.updateIncidents(ctx, l, pol, j)
	rep.incidents = sortedKeys(hs.incidents)
	rep.cordoned, rep.ceiling = a.healthCordonsHeld(), a.cordonCeiling(j)
	for id := range hs.breakers {
		rep.breakers = append(rep.breakers, id)
	}
	slices.Sort(rep.breakers)
	if a.actions == nil {
		return nil
	}
	var toDelete []actuation.Machine
	if !paused {
		toDelete = a.followRepairs(ctx, l, pol, j)
	}
	a.recoverHealthy(ctx, l, j)
	a.retryLostDeletions(ctx, l, hs.deleted, "health")
	if len(j.cands) > 0 {
		toDelete = append(toDelete, a.actOnUnhealthy(ctx, l, pol, paused, j)...)
	}
	a.replaceUnhealthy(ctx, l, toDelete, j.cands)
	a.pruneHealth(l)
	return nil
}

// judgeNodes evaluates every node of a managed group that is Ready and past
// startup and preflight (preflight, the unready path and startup own the
// others): the nodes that match a rule, per group how many were judged
// and how many match a drain or replace rule (the breaker's count). It
// tells NodeUnhealthy once per node and rule, sets the gauges and fills the
// report in node name order (the status is written only when it changes).
func (a *Autoscaler) judgeNodes(ctx context.Context, l *loop, pol *health.Policy, rep *healthReport) judgement {
	hs := a.health
	j := judgement{cands: map[string]*healthCandidate{}, judged: map[string]bool{}, live: map[string]int{}, all: map[string]int{}, over: map[string]int{},
		ruleAll: map[string]int{}, ruleRecent: map[string]int{}}
	unhealthy := map[[2]string]int{}
	degraded := map[string][]string{}
	for _, n := range l.nodes {
		g, ok := l.groupOf[n.Name]
		if ok {
			j.all[g.ID()]++
		}
		if !ok || !a.judgeable(l, n) {
			continue
		}
		j.judged[n.Name] = true
		j.live[g.ID()]++
		short := a.degraded(l, n)
		if len(short) > 0 {
			degraded[g.ID()] = append(degraded[g.ID()], n.Name)
		}
		matches := pol.Evaluate(n, rep.judgedShortfall(n, short))
		if len(matches) == 0 {
			delete(hs.firstSeen, n.Name)
			delete(hs.told, n.Name)
			continue
		}
		c := a.judgeCandidate(l, pol, j, n, g.ID(), matches)
		unhealthy[[2]string{g.ID(), c.verdict.Rule}]++
	}
	rep.listDegraded(degraded)
	rep.nodes = a.listUnhealthy(ctx, l, rep, j)
	a.publishUnhealthy(unhealthy)
	for _, g := range l.groups {
		a.metrics.DegradedNodes.WithLabelValues(g.ID()).Set(float64(len(degraded[g.ID()])))
	}
	return j
}

// judgeable says a managed node is judged: Ready, not on its way out,
// past startup and preflight (preflight, the unready path and startup own
// the others).
func (a *Autoscaler) judgeable(l *loop, n *apiv1.Node) bool {
	if !clusterstate.IsReady(n) || a.healthExempt(n) || a.startingUp(l, n) {
		return false
	}
	st, _ := a.opts.Preflight.Classify(n, l.now)
	return st == preflight.Passed
}

// judgedShortfall is the node's shortfall the rules judge: one the node's
// other resources explain is reported, never a belowSKU match
// (health.Unjudged).
func (rep *healthReport) judgedShortfall(n *apiv1.Node, short []apiv1.ResourceName) []apiv1.ResourceName {
	judged := short[:0:0]
	for _, r := range short {
		if why := health.Unjudged(n, r); why != "" {
			if len(rep.notJudged) < maxHealthListed {
				rep.notJudged = append(rep.notJudged, n.Name+": "+why)
			} else {
				rep.notJudgedMore++
			}
			continue
		}
		judged = append(judged, r)
	}
	return judged
}

// judgeCandidate judges a node that matches rules: its verdict, when its
// earliest drain or replace match began, and its part in the counts of
// the rules (the incidents') and of its group (the breaker's).
func (a *Autoscaler) judgeCandidate(l *loop, pol *health.Policy, j judgement, n *apiv1.Node, group string, matches []health.Match) *healthCandidate {
	firstSeen := a.health.firstSeenOf(n.Name, matches, l.now)
	verdict := pol.Judge(matches, l.now, firstSeen)
	c := &healthCandidate{node: n, group: group, verdict: verdict}
	j.cands[n.Name] = c
	j.countRuleMatches(c, matches, firstSeen, l.now, a.opts.HealthIncidentWindow)
	for _, m := range matches {
		if m.Rule.Action >= health.Drain {
			j.over[group]++
			break
		}
	}
	return c
}

// countRuleMatches counts the candidate's matches of rules that cordon or
// more, and those that began within the incident window, and dates when
// its earliest drain or replace match began.
func (j judgement) countRuleMatches(c *healthCandidate, matches []health.Match, firstSeen func(string) time.Time, now time.Time, window time.Duration) {
	for _, m := range matches {
		if m.Rule.Action < health.Cordon {
			continue
		}
		j.ruleAll[m.Rule.Name]++
		since := m.Since
		if since.IsZero() {
			since = firstSeen(m.Rule.Name)
		}
		if m.Rule.Action >= health.Drain && (c.began.IsZero() || since.Before(c.began)) {
			c.began = since
		}
		if now.Sub(since) <= window {
			j.ruleRecent[m.Rule.Name]++
		}
	}
}

// listDegraded keeps each group's degraded nodes for the status, the
// first maxHealthListed by name.
func (rep *healthReport) listDegraded(degraded map[string][]string) {
	for id, names := range degraded {
		slices.Sort(names)
		rep.degraded[id] = names[:min(len(names), maxHealthListed)]
	}
}

// listUnhealthy lists the candidates for the status, the first
// maxHealthListed by node name (each candidate's entry is where its
// state is written), and tells NodeUnhealthy once per node and rule.
func (a *Autoscaler) listUnhealthy(ctx context.Context, l *loop, rep *healthReport, j judgement) []HealthNode {
	hs := a.health
	nodes := make([]HealthNode, 0, min(len(j.cands), maxHealthListed))
	for _, name := range sortedKeys(j.cands) {
		c := j.cands[name]
		v := c.verdict
		action := ruleAction(v)
		e := HealthNode{Node: name, NodeGroup: c.group, Rule: v.Rule, Action: action.String(), State: "matched"}
		if !v.Due {
			// A time, not a countdown: the status is written only when it changes.
			e.State = fmt.Sprintf("matched; %s due at %s", action, l.now.Add(v.Next).UTC().Format(time.RFC3339))
		}
		if len(nodes) < maxHealthListed {
			// Within its capacity: the entry's address stays valid.
			nodes = append(nodes, e)
			c.entry = &nodes[len(nodes)-1]
		} else {
			rep.more++
		}
		if hs.told[name] != v.Rule {
			hs.told[name] = v.Rule
			a.tellUnhealthy(ctx, c.node, c.group, v)
		}
	}
	return nodes
}

// publishUnhealthy sets the unhealthy nodes' gauge by group and rule,
// deleting the series of pairs with none left.
func (a *Autoscaler) publishUnhealthy(unhealthy map[[2]string]int) {
	hs := a.health
	for k := range hs.unhealthySeries {
		if _, ok := unhealthy[k]; !ok {
			a.metrics.HealthUnhealthy.DeleteLabelValues(k[0], k[1])
			delete(hs.unhealthySeries, k)
		}
	}
	for k, c := range unhealthy {
		a.metrics.HealthUnhealthy.WithLabelValues(k[0], k[1]).Set(float64(c))
		hs.unhealthySeries[k] = true
	}
}

// healthExempt says a node is already on its way out: scale-down's taint,
// a machine deleted by any path.
func (a *Autoscaler) healthExempt(n *apiv1.Node) bool {
	return actuation.HasTaintKey(n, scaledown.ToBeDeletedTaint) || a.machineDeleted(n.Name)
}

// firstSeenOf returns the firstSeen function of Judge for a node: when
// this process first saw each undated match, remembered from now on.
func (hs *healthState) firstSeenOf(node string, matches []health.Match, now time.Time) func(string) time.Time {
	seen := hs.firstSeen[node]
	if seen == nil {
		seen = map[string]time.Time{}
		hs.firstSeen[node] = seen
	}
	live := map[string]bool{}
	for _, m := range matches {
		live[m.Rule.Name] = true
		if _, ok := seen[m.Rule.Name]; !ok && m.Since.IsZero() {
			seen[m.Rule.Name] = now
		}
	}
	for r := range seen {
		if !live[r] {
			delete(seen, r) // the match cleared: its clock starts again
		}
	}
	return func(rule string) time.Time {
		if t, ok := seen[rule]; ok {
			return t
		}
		return now
	}
}

// verdictRule is the verdict's rule (a zero Rule when it has none).
func verdictRule(v health.Verdict) health.Rule {
	for _, m := range v.Matches {
		if m.Rule != nil && m.Rule.Name == v.Rule {
			return *m.Rule
		}
	}
	return health.Rule{}
}

// ruleAction is the action of the verdict's rule: the one taken, or the
// one the node waits for when nothing is due yet.
func ruleAction(v health.Verdict) health.Action {
	for _, m := range v.Matches {
		if m.Rule != nil && m.Rule.Name == v.Rule {
			return m.Rule.Action
		}
	}
	return v.Action
}

// tellUnhealthy logs and records that a node matches a rule.
func (a *Autoscaler) tellUnhealthy(ctx context.Context, n *apiv1.Node, group string, v health.Verdict) {
	what := ""
	for _, m := range v.Matches {
		if m.Rule.Name == v.Rule {
			what = m.Detail
		}
	}
	when := "now"
	if !v.Due {
		when = "in " + v.Next.Round(time.Second).String() + " if it lasts"
	}
	action := ruleAction(v)
	klog.FromContext(ctx).Info("Node unhealthy", "node", klog.KObj(n), "nodeGroup", group, "rule", v.Rule, "match", what, "action", action.String(), "when", when)
	if a.rec != nil {
		a.rec.Event(nodeRef(n), apiv1.EventTypeWarning, EventNodeUnhealthy,
			fmt.Sprintf("health rule %q matches: %s; action %s %s", v.Rule, what, action, when))
	}
}

// updateBreakers engages a group's breaker when more of its judged nodes
// (Ready, past startup and preflight) match drain or replace rules than
// maxUnhealthy allows of them, and releases it once the count has been
// back within bounds for the storm cooldown. Groups gone from the cloud
// are forgotten.
func (a *Autoscaler) updateBreakers(ctx context.Context, l *loop, pol *health.Policy, j judgement) {
	for _, g := range l.groups {
		a.updateBreaker(ctx, l, pol, j, g.ID())
	}
	a.forgetGoneBreakers(l)
}

// updateBreaker engages, arms the release of, or releases one group's
// breaker, and sets its gauge.
func (a *Autoscaler) updateBreaker(ctx context.Context, l *loop, pol *health.Policy, j judgement, id string) {
	hs := a.health
	allowed := pol.AllowedOf(j.live[id], j.all[id])
	until, on := hs.breakers[id]
	if _, ok := hs.breakerSince[id]; on && !ok {
		// Taken over from an earlier leader (the safety state keeps
		// the breakers, not when they engaged): the release counts
		// from now, one release time more, never less.
		hs.breakerSince[id] = l.now
	}
	switch {
	case j.over[id] > allowed:
		if !on {
			msg := fmt.Sprintf("health breaker engaged for node group %s: %d of its %d nodes are unhealthy, more than maxUnhealthy allows (%d); nodes not yet cordoned are reported only, none is drained or replaced (the group still scales up), until at most %d are for %s, or until %d or fewer have held it for %s (then they are replaced one at a time)",
				id, j.over[id], j.live[id], allowed, allowed, pol.StormCooldown, pol.BreakerReleaseNodes, pol.BreakerReleaseAfter)
			klog.FromContext(ctx).Info("Health breaker engaged", "nodeGroup", id, "unhealthy", j.over[id], "nodes", j.live[id], "allowed", allowed)
			a.groupEvent(apiv1.EventTypeWarning, EventHealthBreaker, msg)
			hs.breakerSince[id] = l.now
		}
		hs.breakers[id] = time.Time{}
	case on && until.IsZero():
		hs.breakers[id] = l.now.Add(pol.StormCooldown)
	case on && !l.now.Before(until):
		delete(hs.breakers, id)
		delete(hs.breakerSince, id)
		klog.FromContext(ctx).Info("Health breaker released", "nodeGroup", id, "unhealthy", j.over[id], "allowed", allowed)
	}
	v := 0.0
	if _, on := hs.breakers[id]; on {
		v = 1
	}
	a.metrics.HealthBreaker.WithLabelValues(id).Set(v)
}

// forgetGoneBreakers forgets the breakers of groups gone from the cloud,
// and their series.
func (a *Autoscaler) forgetGoneBreakers(l *loop) {
	hs := a.health
	for id := range hs.breakers {
		if _, ok := l.byID[id]; !ok {
			delete(hs.breakers, id)
			delete(hs.breakerSince, id)
			a.metrics.HealthBreaker.DeleteLabelValues(id)
			a.metrics.DegradedNodes.DeleteLabelValues(id)
		}
	}
}

// breakerReleased says a group's breaker has held for the policy's
// breakerReleaseAfter with at most breakerReleaseNodes of its nodes due
// for a drain or replacement: they go, one at a time. A small pool's few
// bad machines held it for good (2 bad nodes of 7 over its 20%), and its
// breaker, which never stops provisioning, would keep them forever.
func (a *Autoscaler) breakerReleased(l *loop, pol *health.Policy, j judgement, group string) bool {
	hs := a.health
	until, on := hs.breakers[group]
	since, ok := hs.breakerSince[group]
	return on && until.IsZero() && ok && pol.BreakerReleaseNodes > 0 &&
		j.over[group] <= pol.BreakerReleaseNodes && l.now.Sub(since) >= pol.BreakerReleaseAfter
}

// updateIncidents starts a health incident for a rule when at least the
// threshold of the judged nodes (--health-incident-min-nodes, and
// --health-incident-cluster-share of them) began matching it within
// --health-incident-window, across any groups: many nodes going bad the
// same way at once is more likely the signal than the machines (a
// monitor's bad rollout flagging 10 % of every pool tripped no group's
// breaker and drained nodes at the replacement brake's pace). While it
// lasts the rule's matches are reported only; it ends once fewer than the
// threshold have matched it for the policy's stormCooldown. Like the
// preflight incident rule (preflight_incidents.go).
func (a *Autoscaler) updateIncidents(ctx context.Context, l *loop, pol *health.Policy, j judgement) {
	hs := a.health
	o := a.opts
	threshold := max(o.HealthIncidentMinNodes, int(math.Ceil(o.HealthIncidentClusterShare*float64(len(j.judged)))))
	counts := j.ruleRecent
	if !hs.incidentsSeen {
		// A leader's first judgement: an incident of its predecessor is
		// not kept (its matches may be older than the window by now), so
		// every match counts, not only recent ones. Many nodes matching
		// one rule at a failover is held as an incident again, never
		// drained at the brake's pace by the new leader.
		counts = j.ruleAll
		hs.incidentsSeen = true
	}
	for _, rule := range sortedKeys(counts) {
		if _, on := hs.incidents[rule]; on || counts[rule] < threshold {
			continue
		}
		hs.incidents[rule] = time.Time{}
		msg := fmt.Sprintf("health incident: %d nodes began matching rule %q within %s (%d match it; threshold %d): more likely the signal than the machines; its matches are reported only, nothing cordoned, drained or replaced, until fewer than %d match it for %s",
			counts[rule], rule, o.HealthIncidentWindow, j.ruleAll[rule], threshold, threshold, pol.StormCooldown)
		klog.FromContext(ctx).Info("Health incident", "rule", rule, "recent", j.ruleRecent[rule], "matching", j.ruleAll[rule], "threshold", threshold)
		a.groupEvent(apiv1.EventTypeWarning, EventHealthIncident, msg)
	}
	for _, rule := range sortedKeys(hs.incidents) {
		since := hs.incidents[rule]
		switch {
		case j.ruleAll[rule] >= threshold:
			hs.incidents[rule] = time.Time{}
		case since.IsZero():
			hs.incidents[rule] = l.now
		case l.now.Sub(since) >= pol.StormCooldown:
			delete(hs.incidents, rule)
			klog.FromContext(ctx).Info("Health incident over", "rule", rule, "matching", j.ruleAll[rule], "threshold", threshold)
			a.groupEvent(apiv1.EventTypeNormal, EventHealthIncidentOver,
				fmt.Sprintf("health incident over: %d nodes match rule %q, fewer than %d for %s", j.ruleAll[rule], rule, threshold, pol.StormCooldown))
		}
	}
	a.metrics.HealthIncidents.Set(float64(len(hs.incidents)))
}

// EventHealthBackoff is on the status ConfigMap when a group is backed
// off because its new nodes keep failing health rules.
const EventHealthBackoff = "HealthBackoff"

// YoungFailure is a node younger than --health-failure-window admitted
// for a drain or replacement, and when: one count towards its group's
// health backoff, kept in the safety state.
type YoungFailure struct {
	Node string    `json:"node"`
	At   time.Time `json:"at"`
	// Spent: counted into a backoff already.
	Spent bool `json:"spent,omitempty"`
	// Seen: held by the breaker, and created before the group's first
	// failure in the window: it marks when the group was first seen
	// failing, and counts for nothing.
	Seen bool `json:"seen,omitempty"`
}

// countYoungFailure counts a node due for a drain or replacement towards
// its group's health backoff, once, when it is younger than
// --health-failure-window: --health-failures-before-backoff such within
// the window, not counted into a backoff before, back the group off like
// failed scale-ups (its pods' next nodes come from other groups; the
// backoff doubles while it goes on). A bad image whose every new node
// throws XIDs under load made 8 replacement cycles in 49 minutes, 8
// machines bought and deleted, 8 running pods evicted; preflight backs off
// after 3 failures, health did not.
//
// admitted says the node was admitted for its drain or replacement; a node
// the group's breaker holds (not admitted) counts only when it was created
// after the group was first seen failing — a replacement, or a node bought
// into a group already known bad, failing again. A bad image in a pool
// that starts empty holds the breaker with its first nodes, which are then
// never admitted, while scale-up (which the breaker never stops) bought
// bad nodes up to the group's max; a monitor flagging every node of a
// group at once holds it too, and backs nothing off.
func (a *Autoscaler) countYoungFailure(ctx context.Context, l *loop, c *healthCandidate, admitted bool) {
	o := a.opts
	if o.HealthFailuresBeforeBackoff <= 0 || l.now.Sub(c.node.CreationTimestamp.Time) >= o.HealthFailureWindow {
		return
	}
	hs := a.health
	if hs.youngFailures == nil {
		hs.youngFailures = map[string][]YoungFailure{}
	}
	recent, fresh, first, counted := youngFailuresWithin(hs.youngFailures[c.group], c.node.Name, l.now, o.HealthFailureWindow)
	if counted {
		return // counted already (by this leader, or the last)
	}
	if !admitted && (first.IsZero() || c.node.CreationTimestamp.Time.Before(first)) {
		// Dated from when its match began: a node bought while the first
		// ones' rules ran their course was bought into a group already
		// failing.
		hs.youngFailures[c.group] = append(recent, YoungFailure{Node: c.node.Name, At: matchBegan(c, l.now).UTC(), Seen: true})
		return
	}
	recent = append(recent, YoungFailure{Node: c.node.Name, At: l.now.UTC()})
	hs.youngFailures[c.group] = recent
	if fresh < o.HealthFailuresBeforeBackoff {
		return
	}
	a.backOffYoungFailures(ctx, l, c, recent, fresh)
}

// youngFailuresWithin returns a group's young failures within the window,
// in a new slice; fresh counts them, plus the one being counted, but those
// spent or only seen, and first is the earliest. counted says node is
// among them already. failures is never changed: filtering it in place
// before returning counted left a failure twice in the group's list (the
// later ones shifted over an expired one), which backed the group off
// one distinct failure early.
func youngFailuresWithin(failures []YoungFailure, node string, now time.Time, window time.Duration) (recent []YoungFailure, fresh int, first time.Time, counted bool) {
	recent, fresh = make([]YoungFailure, 0, len(failures)+1), 1
	for _, f := range failures {
		if now.Sub(f.At) < window {
			if f.Node == node {
				return recent, fresh, first, true
			}
			recent = append(recent, f)
			if !f.Spent && !f.Seen {
				fresh++
			}
			if first.IsZero() || f.At.Before(first) {
				first = f.At
			}
		}
	}
	return recent, fresh, first, false
}

// matchBegan is when the candidate's match began, no later than now (now
// when it is not known).
func matchBegan(c *healthCandidate, now time.Time) time.Time {
	began := c.began
	if began.IsZero() || began.After(now) {
		began = now
	}
	return began
}

// backOffYoungFailures backs the candidate's group off: fresh of its
// young failures (recent) within the window reached
// --health-failures-before-backoff. They are spent, not forgotten: a node
// still due next loop is not counted again, and only failures after this
// backoff count towards the next.
func (a *Autoscaler) backOffYoungFailures(ctx context.Context, l *loop, c *healthCandidate, recent []YoungFailure, fresh int) {
	o := a.opts
	for i := range recent {
		recent[i].Spent = true
	}
	msg := fmt.Sprintf("%d nodes younger than %s failed health rules within it (last: node %s, rule %q): its new nodes keep going bad; backed off", fresh, o.HealthFailureWindow, c.node.Name, c.verdict.Rule)
	a.registry.RegisterFailedScaleUp(c.group, cloudprovider.ClassOther, msg, l.now)
	a.metrics.FailedScaleUps.WithLabelValues(c.group, "health").Inc()
	klog.FromContext(ctx).Info("Node group backed off: its new nodes keep failing health rules", "nodeGroup", c.group, "failures", fresh, "window", o.HealthFailureWindow, "rule", c.verdict.Rule)
	a.groupEvent(apiv1.EventTypeWarning, EventHealthBackoff, fmt.Sprintf("node group %s: %s", c.group, msg))
}

// inIncident names a rule the candidate matches, for a cordon or more,
// that is in a health incident; "" when none is.
func (hs *healthState) inIncident(c *healthCandidate) string {
	for _, m := range c.verdict.Matches {
		if m.Rule == nil || m.Rule.Action < health.Cordon {
			continue
		}
		if _, on := hs.incidents[m.Rule.Name]; on {
			return m.Rule.Name
		}
	}
	return ""
}

// recoverHealthy uncordons the nodes health handling cordoned that were
// judged this loop and no longer match a rule asking for a cordon (the
// condition cleared, or the policy changed), unless their machines were
// deleted, and forgets what was admitted for them. A node not judged
// this loop (NotReady, failed preflight, on its way out) keeps its cordon
// and its admission: its match is unknown, not gone.
func (a *Autoscaler) recoverHealthy(ctx context.Context, l *loop, j judgement) {
	a.forgetRecovered(ctx, l, j)
	hs := a.health
	for _, name := range sortedKeys(hs.cordoned) {
		if !a.judgedVerified(l, j, name) {
			continue
		}
		if c, ok := j.cands[name]; ok && c.cordonWanted() {
			continue
		}
		a.uncordonRecoveredNode(ctx, l, name)
	}
}

// forgetRecovered forgets the admissions of judged nodes no drain or
// replacement is due for any more, and ends their repair ladders.
func (a *Autoscaler) forgetRecovered(ctx context.Context, l *loop, j judgement) {
	hs := a.health
	for _, name := range sortedKeys(hs.admitted) {
		if !a.judgedVerified(l, j, name) {
			continue
		}
		if !j.drainDue(name) {
			delete(hs.admitted, name)
			a.replace.brake.Dropped(name) // not replaced: counted from its admission
			a.repaired(ctx, l, name)
		}
	}
	for _, name := range sortedKeys(hs.repairs) {
		// A run restored by a failover whose node recovered meanwhile
		// (no admission of this leader to drop) ends here.
		if a.judgedVerified(l, j, name) && !j.drainDue(name) {
			a.repaired(ctx, l, name)
		}
	}
}

// judgedVerified says the node was judged this loop and no repair ladder
// waits for it to pass preflight again: what its rules say of it holds.
func (a *Autoscaler) judgedVerified(l *loop, j judgement, name string) bool {
	return j.judged[name] && !a.repairUnverified(name, nodeOf(l, name))
}

// drainDue says the node matches a rule whose drain or replacement is due.
func (j judgement) drainDue(name string) bool {
	c, ok := j.cands[name]
	return ok && c.verdict.Due && c.verdict.Action >= health.Drain
}

// uncordonRecoveredNode uncordons a node health handling cordoned that no
// rule asks to keep cordoned any more, and forgets its cordon.
func (a *Autoscaler) uncordonRecoveredNode(ctx context.Context, l *loop, name string) {
	hs := a.health
	idx, ok := l.snap.Index(name)
	if !ok {
		return
	}
	n := l.snap.NodeInfo(idx).Node()
	if n.Spec.Unschedulable {
		if err := a.actions.Uncordon(ctx, name); err != nil {
			klog.FromContext(ctx).Error(err, "Uncordoning a node that recovered", "node", klog.KObj(n))
			return
		}
	}
	rule := hs.cordoned[name]
	hs.release(name)
	a.replace.brake.Dropped(name)
	group := ""
	if g, ok := l.groupOf[name]; ok {
		group = g.ID()
	}
	a.metrics.HealthActions.WithLabelValues(group, rule, "uncordon").Inc()
	klog.FromContext(ctx).Info("Node recovered; uncordoned", "node", klog.KObj(n), "rule", rule)
	if a.rec != nil {
		a.rec.Event(nodeRef(n), apiv1.EventTypeNormal, EventHealthRecovered,
			fmt.Sprintf("health rule %q no longer matches; uncordoned", rule))
	}
}

// actOnUnhealthy cordons, drains and admits for replacement, in node name
// order, within the bounds; it returns the machines ready to be deleted.
// What the signals can make it do is bounded before any of it: nothing
// while paused, while the unready guard holds or while a new policy
// awaits confirmation; nothing for a rule in an incident; no new cordon
// in a group whose breaker holds, nor past the cluster-wide ceiling on
// health cordons held; drains and replacements within the breaker, one
// node per gang, the replacement brake and the group's minimum.
func (a *Autoscaler) actOnUnhealthy(ctx context.Context, l *loop, pol *health.Policy, paused bool, j judgement) []actuation.Machine {
	h := &healthActing{pol: pol, j: j, gangs: newGangClaims(a, l), ceiling: a.cordonCeiling(j), planned: map[string]int{}, released: a.releasedByGroup(l)}
	for _, name := range sortedKeys(j.cands) {
		a.actOnCandidate(ctx, l, h, j.cands[name], paused)
	}
	return h.toDelete
}

// healthActing is what actOnUnhealthy keeps across one loop's candidates.
type healthActing struct {
	pol      *health.Policy
	j        judgement
	gangs    *gangClaims
	ceiling  int                 // the most health cordons held at once
	cordons  int                 // health cordons written this loop
	planned  map[string]int      // replacements sent per group this loop
	released map[string]int      // nodes a released breaker lets go, per group
	toDelete []actuation.Machine // the machines ready to be deleted
}

// releasedByGroup counts the nodes admitted for a drain or replacement
// per group: a released breaker lets one go at a time.
func (a *Autoscaler) releasedByGroup(l *loop) map[string]int {
	released := map[string]int{}
	for name := range a.health.admitted {
		if g, ok := l.groupOf[name]; ok {
			released[g.ID()]++
		}
	}
	return released
}

// actOnCandidate takes one unhealthy node as far as the bounds let it go
// this loop: cordoned, admitted, drained, repaired or replaced.
func (a *Autoscaler) actOnCandidate(ctx context.Context, l *loop, h *healthActing, c *healthCandidate, paused bool) {
	if a.actionsHeld(ctx, l, c, paused) {
		return
	}
	_, breaker := a.health.breakers[c.group]
	releasing := breaker && a.breakerReleased(l, h.pol, h.j, c.group)
	if !a.cordonUnhealthy(ctx, l, h, c, breaker, releasing) || !a.drainAdmitted(ctx, l, h, c, breaker, releasing) {
		return
	}
	a.drainUnhealthy(ctx, l, h, c)
}

// actionsHeld says nothing is done for a candidate this loop: its rule
// only reports, or a bound on every health action holds it (told): the
// pause, the unready guard, a new policy awaiting confirmation, an
// incident of one of its rules.
func (a *Autoscaler) actionsHeld(ctx context.Context, l *loop, c *healthCandidate, paused bool) bool {
	hs := a.health
	if !c.verdict.Cordon && c.verdict.Action < health.Cordon {
		return true // report only
	}
	switch {
	case paused:
		a.holdHealth(ctx, l, c, heldPaused, "health actions are paused (annotation "+HealthPausedAnnotation+")")
	case l.unhealthy != "":
		a.holdHealth(ctx, l, c, heldGuard, "the cluster-wide unready guard holds: "+l.unhealthy)
	case hs.unconfirmed():
		a.holdHealth(ctx, l, c, heldUnconfirmed, "the new health policy awaits confirmation: "+hs.policyErr)
	default:
		rule := hs.inIncident(c)
		if rule == "" {
			return false
		}
		a.holdHealth(ctx, l, c, heldIncident, fmt.Sprintf("rule %q is in a health incident (many nodes began matching it at once)", rule))
	}
	return true
}

// cordonUnhealthy cordons a node whose verdict asks for it, within the
// group's breaker, the cluster-wide ceiling and the per-loop cap; false
// when the node goes no further this loop (held, or its cordon failed).
func (a *Autoscaler) cordonUnhealthy(ctx context.Context, l *loop, h *healthActing, c *healthCandidate, breaker, releasing bool) bool {
	n, v := c.node, c.verdict
	if !v.Cordon || n.Spec.Unschedulable {
		if n.Spec.Unschedulable {
			a.setHealthState(c, "cordoned")
		}
		return true
	}
	if a.newCordonHeld(ctx, l, h, c, breaker, releasing) {
		return false
	}
	h.cordons++
	if err := a.cordonForReplacement(ctx, l, n.Name, cordonHealth+v.Rule); err != nil {
		klog.FromContext(ctx).Error(err, "Cordoning an unhealthy node", "node", klog.KObj(n))
		return false
	}
	a.health.cordoned[n.Name] = v.Rule
	a.metrics.HealthActions.WithLabelValues(c.group, v.Rule, "cordon").Inc()
	a.setHealthState(c, "cordoned")
	if a.rec != nil {
		a.rec.Event(nodeRef(n), apiv1.EventTypeWarning, EventHealthCordon, fmt.Sprintf("cordoned: health rule %q", v.Rule))
	}
	return true
}

// newCordonHeld holds a new cordon (told) that the group's breaker (one
// not releasing: a node due for a drain or replacement still counts
// towards the group's health backoff), the cluster-wide ceiling or the
// per-loop cap refuses.
func (a *Autoscaler) newCordonHeld(ctx context.Context, l *loop, h *healthActing, c *healthCandidate, breaker, releasing bool) bool {
	v := c.verdict
	if breaker && !releasing {
		if v.Due && v.Action >= health.Drain {
			a.countYoungFailure(ctx, l, c, false)
		}
		a.holdHealth(ctx, l, c, heldBreaker, fmt.Sprintf("node group %s's health breaker holds (maxUnhealthy %s): no new cordon", c.group, h.pol.MaxUnhealthy.String()))
		return true
	}
	if held := a.healthCordonsHeld(); held >= h.ceiling {
		a.holdHealth(ctx, l, c, heldCeiling, fmt.Sprintf("%d nodes hold a health cordon, the cluster-wide ceiling (--health-max-cordoned-share)", held))
		return true
	}
	if h.cordons == maxHealthCordonsPerLoop {
		a.holdHealth(ctx, l, c, heldCordonCap, fmt.Sprintf("at most %d health cordons a loop", maxHealthCordonsPerLoop))
		return true
	}
	return false
}

// drainAdmitted says a node due for a drain or replacement is admitted
// for it: not held by its group's breaker, its gang, its group's minimum
// or the ceiling on held nodes, and admitted by the replacement brake (now
// or in an earlier loop).
func (a *Autoscaler) drainAdmitted(ctx context.Context, l *loop, h *healthActing, c *healthCandidate, breaker, releasing bool) bool {
	v := c.verdict
	if !v.Due || v.Action < health.Drain {
		return false
	}
	if a.breakerHoldsDrain(ctx, l, h, c, breaker, releasing) || a.drainBoundHeld(ctx, l, h, c) {
		return false
	}
	return a.health.admitted[c.node.Name] || a.admitUnhealthy(ctx, l, h, c)
}

// breakerHoldsDrain holds (told) a drain or replacement the group's
// breaker holds, and says so. A node drained before the breaker engaged
// goes on with its repair ladder (a step on a drained machine disrupts
// nothing); its replacement waits like any other. A released breaker lets
// its nodes go one at a time.
func (a *Autoscaler) breakerHoldsDrain(ctx context.Context, l *loop, h *healthActing, c *healthCandidate, breaker, releasing bool) bool {
	hs := a.health
	n := c.node
	if breaker && !releasing {
		if hs.admitted[n.Name] && a.repairOwns(n.Name) && a.repairInPlace(ctx, l, c, verdictRule(c.verdict)) {
			return true
		}
		a.countYoungFailure(ctx, l, c, false)
		a.holdHealth(ctx, l, c, heldBreaker, fmt.Sprintf("node group %s's health breaker holds (maxUnhealthy %s)", c.group, h.pol.MaxUnhealthy.String()))
		return true
	}
	if releasing && !hs.admitted[n.Name] && h.released[c.group] > 0 {
		a.holdHealth(ctx, l, c, heldBreaker, fmt.Sprintf("node group %s's health breaker lets its %d unhealthy nodes go one at a time", c.group, h.j.over[c.group]))
		return true
	}
	return false
}

// drainBoundHeld holds (told) a drain or replacement that another node of
// its gang being drained, its group's minimum (the replacement is bought
// first) or the ceiling on held nodes refuses, and says so.
func (a *Autoscaler) drainBoundHeld(ctx context.Context, l *loop, h *healthActing, c *healthCandidate) bool {
	hs := a.health
	n := c.node
	if other := h.gangs.conflict(n.Name); other != "" {
		a.holdHealth(ctx, l, c, heldGang, "another node of its gang is being drained: "+other)
		return true
	}
	if c.verdict.Action == health.Replace {
		if why := a.replacementFirst(ctx, l, c, h.planned[c.group]); why != "" {
			a.holdHealth(ctx, l, c, heldMinSize, why)
			return true
		}
	}
	if _, ours := hs.cordoned[n.Name]; !ours && !hs.admitted[n.Name] {
		// Cordoned by someone else (an upgrade, kured, an operator):
		// it counts towards the ceiling like a health cordon.
		if held := a.healthCordonsHeld(); held >= h.ceiling {
			a.holdHealth(ctx, l, c, heldCeiling, fmt.Sprintf("%d nodes are held by health handling, the cluster-wide ceiling (--health-max-cordoned-share)", held))
			return true
		}
	}
	return false
}

// admitUnhealthy admits a node for its drain within the replacement
// brake's budget (held, told, when it is spent), counts it towards its
// group's health backoff and tells the drain.
func (a *Autoscaler) admitUnhealthy(ctx context.Context, l *loop, h *healthActing, c *healthCandidate) bool {
	n, v := c.node, c.verdict
	if !a.allowReplacement(l, c.group, n.Name) {
		a.holdHealth(ctx, l, c, heldBrake, "the replacement brake's budget is spent")
		return false
	}
	a.health.admitted[n.Name] = true
	h.released[c.group]++
	a.countYoungFailure(ctx, l, c, true)
	a.metrics.HealthActions.WithLabelValues(c.group, v.Rule, "drain").Inc()
	klog.FromContext(ctx).Info("Draining an unhealthy node", "node", klog.KObj(n), "nodeGroup", c.group, "rule", v.Rule, "action", v.Action.String())
	if a.rec != nil {
		a.rec.Event(nodeRef(n), apiv1.EventTypeWarning, EventHealthDrain,
			fmt.Sprintf("draining (health rule %q, action %s): pods evicted with their grace periods", v.Rule, v.Action))
	}
	return true
}

// drainUnhealthy drains an admitted node. Once nothing is left to evict,
// a drain rule's node is done (drained, its machine kept); a replace
// rule's goes to its repair ladder, or its machine to deletion.
func (a *Autoscaler) drainUnhealthy(ctx context.Context, l *loop, h *healthActing, c *healthCandidate) {
	n, v := c.node, c.verdict
	delete(a.health.heldTold, n.Name) // no longer held: a later hold is told again
	h.gangs.claim(n.Name)
	if !a.drainForReplacement(ctx, l, n, verdictRule(v).EvictLocalScratch) {
		if why, blocked := a.preflight.blocked[n.Name]; blocked {
			a.holdHealth(ctx, l, c, heldBlocked, why)
		} else {
			a.setHealthState(c, "draining")
		}
		return
	}
	if v.Action == health.Drain {
		a.setHealthState(c, "drained")
		a.replace.brake.Dropped(n.Name) // nothing deleted: counted from its admission
		return
	}
	if a.repairInPlace(ctx, l, c, verdictRule(v)) {
		return
	}
	a.setHealthState(c, "deleting")
	h.planned[c.group]++
	h.toDelete = append(h.toDelete, actuation.MachineOf(c.group, n))
}

// boughtFirst is a replacement bought first: when.
type boughtFirst struct {
	at time.Time
}

// EventHealthReplacementFirst is on an unhealthy node due for replacement
// in a group at its minimum: its replacement was bought first.
const EventHealthReplacementFirst = "HealthReplacementFirst"

// replacementFirst says why a node due for replacement must wait ("" when
// it may go on): a group at its minimum (planned: replacements already
// sent this loop) cannot lose a machine, so its replacement is bought
// first, one more node (through the loop's scale-up write, its failures
// backing the group off as any scale-up's), and the drain waits until the
// group has that many Ready nodes; the group is below its minimum of
// usable nodes never, or for at most a boot when a new leader takes over
// meanwhile. Before, such a node was held for ever, cordoned, its pods on
// a broken machine. A group at its maximum too, backed off, or of unknown
// size buys nothing and waits, saying why.
func (a *Autoscaler) replacementFirst(ctx context.Context, l *loop, c *healthCandidate, planned int) string {
	gs := a.registry.Group(c.group)
	if gs == nil {
		return ""
	}
	name, r := c.node.Name, gs.Readiness
	if !r.TargetKnown {
		return fmt.Sprintf("node group %s's size is unknown: its machine cannot be deleted; the node stays cordoned, its pods run on", c.group)
	}
	hs := a.health
	leaving := a.leavingNodes(l, c, planned)
	rebuy := false
	if b, ok := hs.boughtFirst[name]; ok {
		switch {
		case r.Ready-1-leaving >= gs.Min:
			return "" // without it, the group keeps its minimum of Ready nodes
		case l.now.Sub(b.at) > a.opts.MaxNodeProvisionTime+a.opts.Preflight.MaxPreflightTime:
			// The bought machine failed or never became Ready (it may
			// still count in the target): bought again below, the
			// group's backoff applying.
			delete(hs.boughtFirst, name)
			rebuy = true
		default:
			return fmt.Sprintf("node group %s is at its minimum size (%d): its replacement was bought first; the drain waits for it to be Ready (%d Ready, %d of them leaving)", c.group, gs.Min, r.Ready, leaving+1)
		}
	}
	if !rebuy && enoughWithout(r, gs.Min, leaving) {
		return ""
	}
	if other := a.otherBoughtFirst(l, c); other != "" {
		return fmt.Sprintf("node group %s is at its minimum size (%d): another of its nodes (%s) waits for the replacement bought for it first; one at a time", c.group, gs.Min, other)
	}
	return a.buyReplacementFirst(ctx, l, c, gs)
}

// leavingNodes counts the nodes of the candidate's group already on their
// way out: admitted for a replacement and not deleted yet, or waiting for
// the replacement bought for them; planned are the replacements already
// sent this loop.
func (a *Autoscaler) leavingNodes(l *loop, c *healthCandidate, planned int) int {
	hs := a.health
	leaving := planned
	for other := range hs.admitted {
		if otherOfGroup(l, other, c) && hs.deleted[other].IsZero() {
			leaving++
		}
	}
	for other := range hs.boughtFirst {
		if otherOfGroup(l, other, c) && !hs.admitted[other] {
			leaving++
		}
	}
	return leaving
}

// otherOfGroup says node other is another node of the candidate's group.
func otherOfGroup(l *loop, other string, c *healthCandidate) bool {
	g, ok := l.groupOf[other]
	return ok && other != c.node.Name && g.ID() == c.group
}

// enoughWithout says a group has enough machines without one more: more
// than its minimum in the target, and the minimum Ready without it or
// machines still coming (a machine that never came is in the target, not
// coming).
func enoughWithout(r clusterstate.Readiness, minSize, leaving int) bool {
	return r.Target-leaving > minSize && (r.Ready-1-leaving >= minSize || r.Upcoming > 0)
}

// otherBoughtFirst names another node of the candidate's group, not
// admitted yet, that waits for the replacement bought for it first; ""
// when none does.
func (a *Autoscaler) otherBoughtFirst(l *loop, c *healthCandidate) string {
	hs := a.health
	for other := range hs.boughtFirst {
		if otherOfGroup(l, other, c) && !hs.admitted[other] {
			return other
		}
	}
	return ""
}

// buyReplacementFirst buys the candidate's replacement, one more node of
// its group at its minimum, and says why the drain waits: for the node
// bought, or, at its maximum or backed off, for ever or until the backoff
// ends.
func (a *Autoscaler) buyReplacementFirst(ctx context.Context, l *loop, c *healthCandidate, gs *clusterstate.GroupState) string {
	r := gs.Readiness
	switch {
	case r.Target >= gs.Max:
		return fmt.Sprintf("node group %s is at its minimum and maximum size (%d): no replacement can be bought first and its machine cannot be deleted; the node stays cordoned, its pods run on", c.group, gs.Min)
	case gs.Backoff.Active:
		return fmt.Sprintf("node group %s is at its minimum size (%d) and backed off (%s) until %s: its replacement cannot be bought first yet; the node stays cordoned, its pods run on",
			c.group, gs.Min, backoffWhy(gs.Backoff), gs.Backoff.Until.UTC().Format(time.RFC3339))
	}
	if err := (increaser{a: a, l: l}).IncreaseSize(ctx, c.group, 1); err != nil {
		return fmt.Sprintf("node group %s is at its minimum size (%d): buying its replacement first failed (retried next loop): %v", c.group, gs.Min, err)
	}
	want := a.registry.Group(c.group).Readiness.Target
	a.health.boughtFirst[c.node.Name] = boughtFirst{at: l.now}
	a.metrics.HealthActions.WithLabelValues(c.group, c.verdict.Rule, "buy-first").Inc()
	klog.FromContext(ctx).Info("Bought an unhealthy node's replacement first: its group is at its minimum", "node", klog.KObj(c.node), "nodeGroup", c.group, "target", want)
	if a.rec != nil {
		a.rec.Event(nodeRef(c.node), apiv1.EventTypeNormal, EventHealthReplacementFirst,
			fmt.Sprintf("node group %s is at its minimum size (%d): its replacement is bought first (target %d); the node is drained and replaced once it is Ready", c.group, gs.Min, want))
	}
	return fmt.Sprintf("node group %s is at its minimum size (%d): its replacement was bought first (target %d); the drain waits for it to be Ready", c.group, gs.Min, want)
}

// replaceUnhealthy deletes the machines of drained unhealthy nodes
// through the Remover, after the brake's count is saved.
func (a *Autoscaler) replaceUnhealthy(ctx context.Context, l *loop, toDelete []actuation.Machine, cands map[string]*healthCandidate) {
	if len(toDelete) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	if err := a.persistSafetyState(ctx, l.now); err != nil {
		logger.Error(err, "Unhealthy machines not deleted: the brake's count could not be saved first; retried next loop")
		return
	}
	for _, o := range a.remover.Remove(ctx, l.byID, toDelete) {
		switch {
		case o.Deleted:
			a.health.deleted[o.Node.Name] = l.now
			rule := ""
			if c := cands[o.Node.Name]; c != nil {
				rule = c.verdict.Rule
				a.setHealthState(c, "deleted")
			}
			if !a.firstDeletion(l.now, o.Node.Name, "health") {
				logger.Info("Deleted the machine of an unhealthy node again (its first deletion was lost)", "node", klog.KObj(o.Node), "nodeGroup", o.Group, "rule", rule)
				continue
			}
			a.replacementSent(l, o.Machine)
			a.metrics.HealthActions.WithLabelValues(o.Group, rule, "replace").Inc()
			logger.Info("Deleted the machine of an unhealthy node", "node", klog.KObj(o.Node), "nodeGroup", o.Group, "rule", rule)
			if a.rec != nil {
				a.rec.Event(nodeRef(o.Node), apiv1.EventTypeWarning, EventHealthReplace,
					fmt.Sprintf("machine deleted (health rule %q); its pods' new node comes through the node-addition queue", rule))
			}
		case o.Err != nil:
			logger.Error(o.Err, "Deleting the machine of an unhealthy node; retried next loop", "node", klog.KObj(o.Node), "nodeGroup", o.Group)
		default:
			logger.V(2).Info("Unhealthy node's machine waits for its pods", "node", klog.KObj(o.Node), "holder", o.Held.String())
		}
	}
}

// holdHealth records that a node's action waits, telling it once per reason.
func (a *Autoscaler) holdHealth(ctx context.Context, l *loop, c *healthCandidate, reason, why string) {
	a.metrics.HealthHeld.WithLabelValues(c.group, reason).Inc()
	a.setHealthState(c, "held: "+reason)
	if a.health.heldTold[c.node.Name] == reason {
		return
	}
	a.health.heldTold[c.node.Name] = reason
	klog.FromContext(ctx).V(2).Info("Health action held", "node", klog.KObj(c.node), "rule", c.verdict.Rule, "reason", reason, "why", why)
	if a.rec != nil {
		a.rec.Event(nodeRef(c.node), apiv1.EventTypeWarning, EventHealthHeld,
			fmt.Sprintf("health rule %q asks to %s; held: %s", c.verdict.Rule, c.verdict.Action, why))
	}
}

// nodeOf is the node of that name in the loop's snapshot, nil when none.
func nodeOf(l *loop, name string) *apiv1.Node {
	if idx, ok := l.snap.Index(name); ok {
		return l.snap.NodeInfo(idx).Node()
	}
	return nil
}

func (a *Autoscaler) setHealthState(c *healthCandidate, state string) {
	if c.entry != nil {
		c.entry.State = state
	}
}

// pruneHealth forgets nodes whose Node objects are gone.
func (a *Autoscaler) pruneHealth(l *loop) {
	hs := a.health
	gone := func(name string) bool { _, ok := l.snap.Index(name); return !ok }
	for _, m := range []map[string]string{hs.told, hs.heldTold, hs.cordoned} {
		deleteGone(m, gone)
	}
	deleteGone(hs.deleted, gone)
	deleteGone(hs.boughtFirst, gone)
	for name := range hs.repairs {
		if gone(name) {
			delete(hs.repairs, name)
			delete(hs.repairWhy, name)
		}
	}
	for name := range hs.admitted {
		if gone(name) {
			delete(hs.admitted, name)
			a.replace.brake.Dropped(name) // gone: counted from its admission if never sent
		}
	}
	deleteGone(hs.firstSeen, gone)
}

// deleteGone deletes from m the nodes gone says are gone.
func deleteGone[V any](m map[string]V, gone func(string) bool) {
	for name := range m {
		if gone(name) {
			delete(m, name)
		}
	}
}

// adoptHealthCordon takes over a health cordon an earlier leader put on a
// node (it carries actuation.CordonedAnnotation "health/<rule> <time>").
func (hs *healthState) adoptHealthCordon(n *apiv1.Node) {
	if _, ok := hs.cordoned[n.Name]; ok {
		return
	}
	why, ok := actuation.CordonedBy(n)
	if !ok || !strings.HasPrefix(why, cordonHealth) {
		return
	}
	rule, at, _ := strings.Cut(strings.TrimPrefix(why, cordonHealth), " ")
	hs.cordoned[n.Name] = rule
	// The rule's clock for matches the node does not date goes on from the
	// cordon, not from this leader's first look (no later: conservative).
	if t, err := time.Parse(time.RFC3339, at); err == nil {
		if hs.firstSeen[n.Name] == nil {
			hs.firstSeen[n.Name] = map[string]time.Time{}
		}
		if _, ok := hs.firstSeen[n.Name][rule]; !ok {
			hs.firstSeen[n.Name][rule] = t
		}
	}
}

// gangClaims keeps one node at a time per gang: a node whose pods belong
// to a gang another node being drained also runs is held, unless the
// gang is already broken (one of its pods pending, failed or
// terminating: its job stops anyway, and draining its other bad nodes
// now restarts it once, not twice).
type gangClaims struct {
	a       *Autoscaler
	l       *loop
	claimed map[gang.Key]string // gang → node being drained that runs one of its pods
	broken  map[gang.Key]bool   // computed on first need
}

func newGangClaims(a *Autoscaler, l *loop) *gangClaims {
	gc := &gangClaims{a: a, l: l, claimed: map[gang.Key]string{}}
	// Nodes admitted in earlier loops still running gang pods hold their gangs.
	for _, name := range sortedKeys(a.health.admitted) {
		gc.claim(name)
	}
	return gc
}

// gangsOn are the gangs of the pods running (not terminating) on a node.
func (gc *gangClaims) gangsOn(name string) []gang.Key {
	idx, ok := gc.l.snap.Index(name)
	if !ok {
		return nil
	}
	var keys []gang.Key
	for _, p := range gc.l.snap.Pods(idx) {
		if h := actuation.HolderOf(p, gc.l.now); h == nil || h.Terminating {
			continue
		}
		if k, ok := gang.KeyOf(p); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

func (gc *gangClaims) claim(name string) {
	for _, k := range gc.gangsOn(name) {
		if _, ok := gc.claimed[k]; !ok {
			gc.claimed[k] = name
		}
	}
}

// conflict names the node holding one of this node's unbroken gangs, or "".
func (gc *gangClaims) conflict(name string) string {
	for _, k := range gc.gangsOn(name) {
		other, ok := gc.claimed[k]
		if !ok || other == name || gc.isBroken(k) {
			continue
		}
		return other + " (gang " + k.String() + ")"
	}
	return ""
}

// isBroken says one of the gang's pods is pending (unbound), failed or
// terminating.
// The first call scans the snapshot's pods once.
func (gc *gangClaims) isBroken(k gang.Key) bool {
	if gc.broken == nil {
		gc.broken = map[gang.Key]bool{}
		mark := func(p *apiv1.Pod) {
			if key, ok := gang.KeyOf(p); ok {
				if _, claimed := gc.claimed[key]; claimed {
					gc.broken[key] = true
				}
			}
		}
		for _, p := range gc.l.unbound {
			mark(p)
		}
		for i := 0; i < gc.l.snap.Len(); i++ {
			for _, p := range gc.l.snap.Pods(i) {
				if p.DeletionTimestamp != nil || p.Status.Phase == apiv1.PodFailed {
					mark(p)
				}
			}
		}
	}
	return gc.broken[k]
}
