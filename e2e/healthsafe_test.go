package e2e

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/health"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// The node-health safety bounds of issue #39 (docs/concepts/health-policy.md, "Bounds"),
// on the real control plane, kwok and the ARM simulator: the health
// signals are untrusted input, and what they can make the autoscaler do is
// bounded by the defaults. Each test runs the built-in policy, or the
// built-in policy with its rules' for: shortened (defaultPolicyFastRules),
// and the autoscaler's default flags unless it says why not. The core
// tests of the same cases (core/healthsafe_test.go) step a fake clock;
// these run in real time.

// fastFor is the for: of every rule in defaultPolicyFastRules.
const fastFor = 5 * time.Second

// ruleFor is a rule's for: line in health.DefaultYAML (rules are list
// items whose keys are indented by two spaces).
var ruleFor = regexp.MustCompile(`(?m)^(  for: )\S+$`)

// defaultPolicyFastRules is the built-in policy, health.DefaultYAML, with
// only its rules' for: shortened to fastFor. The e2e suite runs in real
// time: the built-in 2 to 10 minutes would make a test wait that long for
// the one step it is about, which the core tests step over with a fake
// clock. Everything else — maxUnhealthy, stormCooldown, the breaker's
// release, the memory tolerance, every rule's match and action — is the
// built-in policy's, checked here: the bounds under test are the defaults.
func defaultPolicyFastRules(t *testing.T) string {
	t.Helper()
	fast := ruleFor.ReplaceAllString(health.DefaultYAML, "${1}"+fastFor.String())
	p, err := health.Parse(fast)
	if err != nil {
		t.Fatalf("the built-in policy with fast rules does not parse: %v\n%s", err, fast)
	}
	def := health.Default()
	if n := len(ruleFor.FindAllString(health.DefaultYAML, -1)); n != len(def.Rules) || n == 0 {
		t.Fatalf("%d for: lines in health.DefaultYAML for its %d rules: the regexp no longer fits it", n, len(def.Rules))
	}
	for i, r := range p.Rules {
		if r.For != fastFor || i >= len(def.Rules) {
			t.Fatalf("rule %s: for %s, want %s", r.Name, r.For, fastFor)
		}
		p.Rules[i].For = def.Rules[i].For
	}
	if !reflect.DeepEqual(p, def) {
		t.Fatalf("the policy changed beyond its rules' for:\n%+v\nwant\n%+v", p, def)
	}
	if strip := func(s string) string { return ruleFor.ReplaceAllString(s, "") }; strip(fast) != strip(health.DefaultYAML) {
		t.Fatalf("the policy changed beyond its rules' for:\n%s", fast)
	}
	return fast
}

// seedNodes brings a scale set to n VMs before the autoscaler runs, as a
// set created with n (sc.scaleSet's capacity) but after sc.faultHook, so
// they register through the test's hook; it waits for them to register.
// A Go call to the simulator (an operator's resize), not an ARM request.
func (sc *scenario) seedNodes(set string, n int) {
	sc.t.Helper()
	must(sc.t, sc.s.sim.SetCapacity(sc.rg, set, n))
	sc.registered(set, n)
}

// gpusAdvertised waits for the set's n nodes to advertise GPUs (the
// device plugin, 20 s after registration) and returns their names by
// allocatable GPUs.
func (sc *scenario) gpusAdvertised(set string, n int) map[int64][]string {
	sc.t.Helper()
	var byGPUs map[int64][]string
	sc.eventually(fmt.Sprintf("%d nodes of %s advertising GPUs", n, set), 2*time.Minute, func() (bool, string) {
		byGPUs = map[int64][]string{}
		all := 0
		for _, node := range sc.nodeList(set) {
			if _, a := gpusOf(&node); a > 0 {
				byGPUs[a] = append(byGPUs[a], node.Name)
				all++
			}
		}
		return all == n, fmt.Sprintf("nodes by allocatable GPUs %v", byGPUs)
	})
	for _, names := range byGPUs {
		slices.Sort(names)
	}
	return byGPUs
}

// safeView is what these tests read of the status: the health block's
// incidents, breakers, cordons and nodes, and the groups' backoffs.
type safeView struct {
	NodeGroups []struct {
		Name    string `json:"name"`
		Backoff *struct {
			Until  time.Time `json:"until"`
			Reason string    `json:"reason"`
		} `json:"backoff"`
	} `json:"nodeGroups"`
	Health *struct {
		Unhealthy []struct {
			Node      string `json:"node"`
			NodeGroup string `json:"nodeGroup"`
			Rule      string `json:"rule"`
			Action    string `json:"action"`
			State     string `json:"state"`
		} `json:"unhealthy"`
		Breakers      []string `json:"breakers"`
		Incidents     []string `json:"incidents"`
		Cordoned      int      `json:"cordoned"`
		CordonCeiling int      `json:"cordonCeiling"`
	} `json:"health"`
}

// safeStatus reads the status the autoscaler last wrote.
func (sc *scenario) safeStatus() (*safeView, string) {
	cm, err := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns).Get(sc.ctx, statusConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, err.Error()
	}
	raw := cm.Data["status"]
	var v safeView
	if err := yaml.Unmarshal([]byte(raw), &v); err != nil {
		return nil, fmt.Sprintf("status %q: %v", raw, err)
	}
	return &v, raw
}

// states maps the nodes the status lists as unhealthy to their rule and
// state ("<rule>: <state>").
func (v *safeView) states() map[string]string {
	out := map[string]string{}
	if v != nil && v.Health != nil {
		for _, u := range v.Health.Unhealthy {
			out[u.Node] = u.Rule + ": " + u.State
		}
	}
	return out
}

// statusEvents lists the events with a reason on the scenario's status
// ConfigMap (where the autoscaler tells of breakers, incidents and
// backoffs).
func (sc *scenario) statusEvents(reason string) []apiv1.Event {
	var out []apiv1.Event
	for _, e := range sc.eventsAnywhere(reason) {
		if e.InvolvedObject.Kind == "ConfigMap" && e.InvolvedObject.Name == statusConfigMap && e.Namespace == sc.ns {
			out = append(out, e)
		}
	}
	return out
}

// TestHealthSafeFalseAlarmOnTenPercentOfThreePools (issue #39, case 3): a
// bad monitor rollout sets XIDErrors=True on 2 nodes of each of three
// 20-node H100 pools at once, every node running a whole-node 8-GPU pod.
// 2 of 20 is 10 %, within every group's breaker (maxUnhealthy 20 %: 4 of
// 20), so no breaker sees it; before, all 6 were cordoned and drained at
// the replacement brake's pace. The defaults' incident rule sees 6 nodes
// begin matching one rule (xid-error) within --health-incident-window
// (10m), at least max(--health-incident-min-nodes 5,
// --health-incident-cluster-share 1 % of the 60 judged nodes): an
// incident, its matches reported only. For 20 loops past the rule's due
// time no pod is evicted or terminating, no machine deleted, and at most
// the cluster-wide cordon ceiling (max(2, ⌈3 % of 60⌉) = 2: a loop may see
// some of the 6 before the incident, and cordons at once for a replace
// rule) is cordoned; the incident metric, the HealthIncident event and the
// status say it.
func TestHealthSafeFalseAlarmOnTenPercentOfThreePools(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	const perPool, flaggedPerPool = 20, 2
	pools := []string{sc.scaleSet("gpu-a", h100, 0, nil), sc.scaleSet("gpu-b", h100, 0, nil), sc.scaleSet("gpu-c", h100, 0, nil)}
	hook := sc.faultHook(pools...)
	sc.healthPolicy(defaultPolicyFastRules(t))
	for _, pool := range pools {
		sc.seedNodes(pool, perPool)
	}
	apps := map[string]string{} // pool → its workload
	for i, pool := range pools {
		app := fmt.Sprintf("work-%c", 'a'+i)
		apps[pool] = app
		sc.workload(app, perPool, "90", 8, pool)
	}
	sc.eventually(fmt.Sprintf("%d pods Running", len(pools)*perPool), 3*time.Minute, allRunning(sc, len(pools)*perPool))
	before := map[string]apiv1.Pod{} // node → its pod
	var flagged []string
	for _, pool := range pools {
		running, others := sc.runningByNode(apps[pool])
		if len(running) != perPool || others != 0 {
			t.Fatalf("pool %s: %d nodes run its pods, %d other pods: want one on each of its %d nodes", pool, len(running), others, perPool)
		}
		maps.Copy(before, running)
		flagged = append(flagged, slices.Sorted(maps.Keys(running))[:flaggedPerPool]...)
	}
	judged := len(pools) * perPool
	// The defaults' bounds (core/options.go, core/phase_health.go
	// cordonCeiling and updateIncidents).
	ceiling := max(2, int(math.Ceil(0.03*float64(judged))))
	threshold := max(5, int(math.Ceil(0.01*float64(judged))))
	if len(flagged) < threshold || flaggedPerPool*100/perPool >= 20 {
		t.Fatalf("%d flagged nodes (%d%% of each pool): the case is at least the incident threshold %d, within every breaker", len(flagged), flaggedPerPool*100/perPool, threshold)
	}
	// No flag but what the test cannot do without: the pools' sizes.
	var flags []string
	for _, pool := range pools {
		flags = append(flags, "--nodes=0:40:"+pool)
	}
	p := sc.autoscaler("autoscaler", flags...)
	// The policy is accepted by its first evaluation, which matches
	// nothing yet (a new policy matching more than the ceiling at once
	// would wait for confirmation instead).
	sc.eventually("the autoscaler's first loops", time.Minute, func() (bool, string) {
		n := sc.loops(p)
		return n >= 2, fmt.Sprintf("%v loops", n)
	})

	// held: every pod runs where it ran, never evicted; no machine
	// deleted or added; only flagged nodes cordoned, at most the ceiling.
	var maxCordoned int
	held := func() (bool, string) {
		for _, pool := range pools {
			running, others := sc.runningByNode(apps[pool])
			for n, pod := range running {
				if before[n].UID != pod.UID {
					return false, fmt.Sprintf("pod %s runs on %s, not the pod that ran there", pod.Name, n)
				}
			}
			if len(running) != perPool || others != 0 {
				return false, fmt.Sprintf("pool %s: %d pods Running where they ran, %d other pods (evicted, terminating or new)", pool, len(running), others)
			}
			if d := sc.deletionsOf(pool); len(d) != 0 || sc.capacity(pool) != perPool {
				return false, fmt.Sprintf("pool %s: deletions %v, capacity %d", pool, d, sc.capacity(pool))
			}
		}
		var cordoned []string
		for _, n := range sc.nodeList(pools...) {
			if !n.Spec.Unschedulable {
				continue
			}
			cordoned = append(cordoned, n.Name)
			if !slices.Contains(flagged, n.Name) {
				return false, fmt.Sprintf("node %s cordoned, not flagged (annotation %q)", n.Name, n.Annotations[actuation.CordonedAnnotation])
			}
			if rule, _, ok := healthCordon(&n); !ok || rule != "xid-error" {
				return false, fmt.Sprintf("node %s cordoned, not by health/xid-error: %q", n.Name, n.Annotations[actuation.CordonedAnnotation])
			}
		}
		maxCordoned = max(maxCordoned, len(cordoned))
		return len(cordoned) <= ceiling, fmt.Sprintf("%d nodes cordoned %v, past the cluster-wide ceiling %d", len(cordoned), cordoned, ceiling)
	}
	if ok, state := held(); !ok {
		t.Fatal(state)
	}

	setAt := time.Now()
	for _, n := range flagged {
		sc.setCondition(hook, n, xidError, apiv1.ConditionTrue, "XID79", "GPU 2: XID 79, GPU has fallen off the bus")
	}
	incidents := `vmss_autoscaler_health_incidents`
	sc.eventually("the incident reported", time.Minute, func() (bool, string) {
		if ok, state := held(); !ok {
			t.Fatalf("acted on the false alarm: %s", state)
		}
		v := sc.healthMetric(p, incidents)
		return v == 1, fmt.Sprintf("%s = %v", incidents, v)
	})
	sc.holdsPast(p, setAt.Add(fastFor), 20, "nothing evicted or deleted, at most the ceiling cordoned", func() (bool, string) {
		if ok, state := held(); !ok {
			return false, state
		}
		v := sc.healthMetric(p, incidents)
		return v == 1, fmt.Sprintf("%s = %v: the incident ended while its matches stand", incidents, v)
	})
	if d := time.Since(setAt); d < 4*fastFor {
		t.Fatalf("the hold was checked for %s only: not several times the rules' %s", d, fastFor)
	}

	_, body := sc.get(p, "/metrics")
	for _, pool := range pools {
		if v := metricValue(body, `vmss_autoscaler_health_breaker_engaged{node_group="`+pool+`"}`); v > 0 {
			t.Errorf("breaker of %s engaged (%v): 2 of 20 is within maxUnhealthy, the case is the one no breaker sees", pool, v)
		}
		if v := metricValue(body, `vmss_autoscaler_health_unhealthy_nodes{node_group="`+pool+`",rule="xid-error"}`); v != flaggedPerPool {
			t.Errorf("unhealthy_nodes of %s = %v, want %d", pool, v, flaggedPerPool)
		}
		if v := metricValue(body, `vmss_autoscaler_health_held_total{node_group="`+pool+`",reason="incident"}`); v < 1 {
			t.Errorf("held_total{%s, incident} = %v: no action held for the incident", pool, v)
		}
		for _, action := range []string{"drain", "replace"} {
			if v := metricValue(body, `vmss_autoscaler_health_actions_total{action="`+action+`",node_group="`+pool+`",rule="xid-error"}`); v > 0 {
				t.Errorf("health_actions_total{%s, %s} = %v during the incident", action, pool, v)
			}
		}
	}
	sc.eventually("HealthIncident naming the rule, the status holding the nodes for it", 30*time.Second, func() (bool, string) {
		var msgs []string
		for _, e := range sc.statusEvents(core.EventHealthIncident) {
			msgs = append(msgs, e.Message)
		}
		if len(msgs) != 1 || !strings.Contains(msgs[0], `rule "xid-error"`) {
			return false, fmt.Sprintf("HealthIncident events %q, want one naming the rule", msgs)
		}
		v, raw := sc.safeStatus()
		if v == nil || v.Health == nil {
			return false, "no health status: " + raw
		}
		if !slices.Equal(v.Health.Incidents, []string{"xid-error"}) || v.Health.CordonCeiling != ceiling || v.Health.Cordoned > ceiling {
			return false, fmt.Sprintf("status incidents %v, cordoned %d of ceiling %d (want the ceiling %d): %s", v.Health.Incidents, v.Health.Cordoned, v.Health.CordonCeiling, ceiling, raw)
		}
		states := v.states()
		for _, n := range flagged {
			if states[n] != "xid-error: held: incident" {
				return false, fmt.Sprintf("node %s is %q in the status, want held for the incident: %s", n, states[n], raw)
			}
		}
		return len(states) == len(flagged), fmt.Sprintf("status lists %v, want the %d flagged nodes", states, len(flagged))
	})
	if ok, state := held(); !ok {
		t.Fatal(state)
	}
	t.Logf("at most %d of the %d flagged nodes were cordoned at once (ceiling %d, incident threshold %d)", maxCordoned, len(flagged), ceiling, threshold)
}

// TestHealthSafeSmallPoolWithTwoDegradedNodesStillScales (issue #39, case
// 5): a pool of 7 H100 nodes of which 2 advertise only 6 of their 8 GPUs
// (dead from the start: the device plugin never advertises them), under
// the built-in policy with its rules' for: shortened (gpus-below-sku
// replaces after 5 s instead of 5m; maxUnhealthy 20 % and the rest as
// built in). 2 of 7 is over 20 % (1 node): the breaker holds
// from the first judgement, so the degraded nodes are not even cordoned
// (a replace rule cordons at once, but not under an engaged breaker).
// Before, a breaker also stopped the group scaling up and the pool's pods
// pending for good. Six whole-node 8-GPU pods then come: 5 run on the
// healthy nodes, and the group buys a node for the sixth, which the
// degraded nodes cannot take; all 6 run within minutes. For 20 loops past
// the time gpus-below-sku comes due nothing is cordoned, drained or
// deleted, and the breaker metric stays 1. (The breaker's release after
// 30m, one node at a time, is the core test's:
// TestHealthSafeSmallPoolBadNodesAreReplaced.)
func TestHealthSafeSmallPoolWithTwoDegradedNodesStillScales(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	const pool, bad, pods = 7, 2, 6
	gpu := sc.scaleSet("gpu", h100, 0, nil)
	hook := sc.faultHook(gpu)
	must(t, hook.DegradeNextGPUs(gpu, bad, 6))
	sc.seedNodes(gpu, pool)
	byGPUs := sc.gpusAdvertised(gpu, pool)
	degraded, healthy := byGPUs[6], byGPUs[8]
	if len(degraded) != bad || len(healthy) != pool-bad {
		t.Fatalf("nodes by allocatable GPUs %v: want %d with 6, %d with 8", byGPUs, bad, pool-bad)
	}
	if allowed := max(1, pool*20/100); bad <= allowed {
		t.Fatalf("%d degraded of %d is within maxUnhealthy 20%% (%d): not the case", bad, pool, allowed)
	}
	sc.healthPolicy(defaultPolicyFastRules(t))
	// The pool's size is the only flag: a max with room to buy.
	p := sc.autoscaler("autoscaler", "--nodes=0:10:"+gpu)
	breaker := `vmss_autoscaler_health_breaker_engaged{node_group="` + gpu + `"}`

	// held: no node cordoned, no machine deleted, no pod evicted or
	// terminating, the breaker engaged.
	held := func() (bool, string) {
		for _, n := range sc.nodeList(gpu) {
			if n.Spec.Unschedulable {
				return false, fmt.Sprintf("node %s cordoned (%q) under the breaker", n.Name, n.Annotations[actuation.CordonedAnnotation])
			}
		}
		for _, d := range degraded {
			if sc.node(d) == nil {
				return false, fmt.Sprintf("degraded node %s gone", d)
			}
		}
		if d := sc.deletionsOf(gpu); len(d) != 0 {
			return false, fmt.Sprintf("deletions %v", d)
		}
		for _, pod := range sc.appPods("train") {
			if pod.DeletionTimestamp != nil || evictedByAPI(&pod) {
				return false, fmt.Sprintf("pod %s evicted or terminating", pod.Name)
			}
		}
		v := sc.healthMetric(p, breaker)
		return v == 1, fmt.Sprintf("%s = %v", breaker, v)
	}
	var engagedAt time.Time
	sc.eventually("the breaker engaged", time.Minute, func() (bool, string) {
		ok, state := held()
		if !ok && !strings.HasPrefix(state, breaker) {
			t.Fatalf("before the breaker: %s", state)
		}
		engagedAt = time.Now()
		return ok, state
	})
	// The breaker counts matches, so both degraded nodes were judged by
	// now: gpus-below-sku is due within its for of this (a shortfall is
	// dated from this leader's first look at it).
	due := engagedAt.Add(fastFor)

	sc.workload("train", pods, "90", 8, gpu)
	sc.eventually(fmt.Sprintf("%d pods Running, one on a node bought under the breaker", pods), 3*time.Minute, func() (bool, string) {
		if ok, state := held(); !ok {
			t.Fatal(state)
		}
		running, others := sc.runningByNode("train")
		return len(running) == pods && others == 0, fmt.Sprintf("%d Running, %d other pods, capacity %d", len(running), others, sc.capacity(gpu))
	})
	running, _ := sc.runningByNode("train")
	for n := range running {
		if slices.Contains(degraded, n) {
			t.Fatalf("an 8-GPU pod runs on degraded node %s (6 GPUs allocatable)", n)
		}
	}
	if c := sc.capacity(gpu); c != pool+1 {
		t.Fatalf("capacity %d, want %d: one node bought for the pod the degraded nodes cannot take", c, pool+1)
	}
	sc.holdsPast(p, due, 20, "nothing cordoned, drained or deleted, the breaker engaged", func() (bool, string) {
		if ok, state := held(); !ok {
			return false, state
		}
		now, others := sc.runningByNode("train")
		for n, pod := range running {
			if now[n].UID != pod.UID {
				return false, fmt.Sprintf("pod %s no longer Running on %s (%d other pods)", pod.Name, n, others)
			}
		}
		return len(now) == pods && others == 0, fmt.Sprintf("%d Running, %d other pods", len(now), others)
	})

	_, body := sc.get(p, "/metrics")
	if got := released(body, gpu, "workload"); got != 1 {
		t.Fatalf("%v nodes bought, want 1: the sixth pod's", got)
	}
	if v := metricValue(body, `vmss_autoscaler_health_held_total{node_group="`+gpu+`",reason="breaker"}`); v < 1 {
		t.Fatalf("held_total{breaker} = %v", v)
	}
	if v := metricValue(body, `vmss_autoscaler_degraded_nodes{node_group="`+gpu+`"}`); v != bad {
		t.Fatalf("degraded_nodes = %v, want %d", v, bad)
	}
	sc.eventually("HealthBreaker on the status ConfigMap, the status holding the degraded nodes", 30*time.Second, func() (bool, string) {
		if n := len(sc.statusEvents(core.EventHealthBreaker)); n != 1 {
			return false, fmt.Sprintf("%d HealthBreaker events, want 1 (it never released)", n)
		}
		v, raw := sc.safeStatus()
		if v == nil || v.Health == nil || !slices.Equal(v.Health.Breakers, []string{gpu}) {
			return false, "status without the breaker: " + raw
		}
		var deg []string
		for n, s := range v.states() {
			if s != "gpus-below-sku: held: breaker" {
				return false, fmt.Sprintf("node %s is %q in the status: %s", n, s, raw)
			}
			deg = append(deg, n)
		}
		slices.Sort(deg)
		return slices.Equal(deg, degraded), fmt.Sprintf("status lists %v, want %v", deg, degraded)
	})
}

// TestHealthSafeBadImageBacksTheGroupOff (issue #39, case 6): a pool of 10
// healthy H100 nodes runs 10 whole-node pods; then its image goes bad —
// every node the set makes from now on advertises 6 of its 8 GPUs — and
// the workload grows by 2 pods. Policy: the built-in one with its rules'
// for: shortened (gpus-below-sku: 5 s, replace). Each new node is below
// its SKU: cordoned, replaced, and the pod it could not take buys another
// bad one. Before, that went on for good (8 cycles in 49 minutes). Now
// each such node younger than --health-failure-window (1h) admitted for
// replacement counts, and the --health-failures-before-backoff'th (3)
// within the window backs the group off like a failed scale-up:
// HealthBackoff on the status ConfigMap, failed_scale_ups_total{reason=
// "health"}, the group's backoff in the status, and the pending pods told
// why (NotTriggerScaleUp naming it). The healthy nodes and their pods are
// never touched, and the machines bought stay bounded.
//
// The bound: a pending pod has one node bought for it at a time — its next
// is bought in the loop that sees its bad node's GPUs (no longer coming
// capacity, and too few), which is the loop that judges that node; the
// node is admitted for replacement, and counted, once the rule's for has
// passed, later. So when the F-th failure backs the group off, each of the
// P pods may have one more node bought already: at most P·(⌈F/P⌉+1)
// nodes, rounds of P until F failures and the round in flight (here
// 2·(2+1) = 6). The in-flight nodes come up bad too and are replaced; no
// node is bought after them while the group is backed off (5m, doubling).
func TestHealthSafeBadImageBacksTheGroupOff(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	const seeded, more, failures = 10, 2, 3 // failures: --health-failures-before-backoff's default
	bound := more * ((failures+more-1)/more + 1)
	gpu := sc.scaleSet("gpu", h100, 0, nil)
	hook := sc.faultHook(gpu)
	sc.healthPolicy(defaultPolicyFastRules(t))
	sc.seedNodes(gpu, seeded)
	sc.workload("train", seeded, "90", 8, gpu)
	sc.eventually(fmt.Sprintf("%d pods Running", seeded), 3*time.Minute, allRunning(sc, seeded))
	before, _ := sc.runningByNode("train")
	seededVMs := sc.vms(gpu)
	// The pool's size is the only flag: room for more than the bound, so a
	// group that is never backed off shows.
	p := sc.autoscaler("autoscaler", fmt.Sprintf("--nodes=0:%d:%s", seeded+2*bound, gpu))
	sc.eventually("the autoscaler's first loops", time.Minute, func() (bool, string) {
		n := sc.loops(p)
		return n >= 2, fmt.Sprintf("%v loops", n)
	})

	// The image goes bad, and the workload grows.
	must(t, hook.DegradeNextGPUs(gpu, 1000, 6))
	sc.scaleDeployment("train", seeded+more)

	bought := map[string]bool{} // the VMs made since, ever seen
	// bounded: the healthy nodes and their pods untouched, every node
	// bought bad (never running a pod), no more bought than the bound.
	bounded := func() (bool, string) {
		for id := range sc.vms(gpu) {
			if _, old := seededVMs[id]; !old {
				bought[id] = true
			}
		}
		if len(bought) > bound {
			return false, fmt.Sprintf("%d machines bought for the %d new pods, more than %d: VMs %v", len(bought), more, bound, sc.vms(gpu))
		}
		running, _ := sc.runningByNode("train")
		for n, pod := range before {
			if running[n].UID != pod.UID {
				return false, fmt.Sprintf("pod %s on healthy node %s disturbed", pod.Name, n)
			}
			if node := sc.node(n); node == nil || node.Spec.Unschedulable {
				return false, fmt.Sprintf("healthy node %s gone or cordoned", n)
			}
		}
		if len(running) != seeded {
			return false, fmt.Sprintf("%d pods Running, want the %d on the healthy nodes: a pod runs on a bad node", len(running), seeded)
		}
		return true, ""
	}
	failed := `vmss_autoscaler_failed_scale_ups_total{node_group="` + gpu + `",reason="health"}`
	sc.eventually("the group backed off for health", 5*time.Minute, func() (bool, string) {
		if ok, state := bounded(); !ok {
			t.Fatal(state)
		}
		evs := sc.statusEvents(core.EventHealthBackoff)
		v := sc.healthMetric(p, failed)
		return len(evs) > 0 && v >= 1, fmt.Sprintf("%d HealthBackoff events, %s = %v, %d bought", len(evs), failed, v, len(bought))
	})
	sc.eventually("the bad nodes bought in flight replaced", 3*time.Minute, func() (bool, string) {
		if ok, state := bounded(); !ok {
			t.Fatal(state)
		}
		c := sc.capacity(gpu)
		return c == seeded, fmt.Sprintf("capacity %d, %d bought, VMs %v", c, len(bought), sc.vms(gpu))
	})
	// Longer than a replacement cycle (a node's boot, its GPUs 20 s after
	// registration, the rule's 5 s): a group not backed off would buy
	// again within it.
	sc.holdsPast(p, time.Now(), 60, "nothing more bought, the new pods pending", func() (bool, string) {
		if ok, state := bounded(); !ok {
			return false, state
		}
		if c := sc.capacity(gpu); c != seeded {
			return false, fmt.Sprintf("capacity %d: bought again while backed off", c)
		}
		running, others := sc.runningByNode("train")
		return len(running) == seeded && others == more, fmt.Sprintf("%d Running, %d other pods", len(running), others)
	})
	if len(bought) < failures {
		t.Fatalf("%d machines bought: the backoff needs %d failures", len(bought), failures)
	}

	_, body := sc.get(p, "/metrics")
	if got := released(body, gpu, "workload"); int(got) != len(bought) {
		t.Fatalf("released_nodes_total{workload} = %v, %d machines seen bought", got, len(bought))
	}
	if got := metricValue(body, `vmss_autoscaler_health_actions_total{action="replace",node_group="`+gpu+`",rule="gpus-below-sku"}`); int(got) != len(bought) {
		t.Fatalf("replace actions %v, want every one of the %d bad nodes bought", got, len(bought))
	}
	for _, e := range sc.statusEvents(core.EventHealthBackoff) {
		if !strings.Contains(e.Message, fmt.Sprintf("%d nodes younger than 1h0m0s failed health rules", failures)) || !strings.Contains(e.Message, `rule "gpus-below-sku"`) {
			t.Fatalf("HealthBackoff event %q: want the failures, the window and the rule named", e.Message)
		}
	}
	v, raw := sc.safeStatus()
	backoff := ""
	if v != nil {
		for _, g := range v.NodeGroups {
			if g.Name == gpu && g.Backoff != nil && g.Backoff.Until.After(time.Now()) {
				backoff = g.Backoff.Reason
			}
		}
	}
	if !strings.Contains(backoff, "failed health rules") {
		t.Fatalf("the status does not back the group off for health (reason %q):\n%s", backoff, raw)
	}
	sc.eventually("the pending pods told the health backoff", 30*time.Second, func() (bool, string) {
		told := map[string]bool{}
		var msgs []string
		for _, e := range sc.events(core.EventNotTriggerScaleUp) {
			msgs = append(msgs, e.Message)
			if strings.Contains(e.Message, "node group in backoff") && strings.Contains(e.Message, "failed health rules") {
				told[e.InvolvedObject.Name] = true
			}
		}
		_, others := sc.runningByNode("train")
		return len(told) == more && others == more, fmt.Sprintf("%d of the %d pending pods told; NotTriggerScaleUp %q", len(told), more, msgs)
	})
	t.Logf("%d machines bought for %d pods (bound %d), %d HealthBackoff events", len(bought), more, bound, len(sc.statusEvents(core.EventHealthBackoff)))
}

// TestHealthSafePodBoundInTheCordonWindowIsEvicted (issue #39, case 4): a
// replace rule already due as the node is first judged (after a failover,
// an unpause, a new rule): XIDErrors=True on an empty node of a 4-node
// H100 pool, set, and the rule's for (the built-in xid-error, shortened)
// passed, before the autoscaler starts. Before, the empty node was
// cordoned and its machine deleted in the same loop, microseconds apart,
// so a pod the scheduler bound just before it saw the cordon (a gang
// member waiting in Permit) died with the machine. Now the node waits
// --node-delete-delay-after-taint after its cordon and is looked at
// again: the test binds such a pod (spec.nodeName) as soon as it sees the
// cordon, with a 30 s grace its process takes 20 s of to exit. It is
// never killed: evicted through the Eviction API with its grace, and the
// machine deleted only once it is gone; it runs again on a node bought
// for it.
func TestHealthSafePodBoundInTheCordonWindowIsEvicted(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	// The pause, raised from its default 5 s so the test's own reaction
	// (seeing the cordon, binding the pod) cannot miss it under load; the
	// only flag changed besides the pool's size.
	const pause = 20 * time.Second
	gpu := sc.scaleSet("gpu", h100, 0, nil)
	hook := sc.faultHook(gpu)
	sc.healthPolicy(defaultPolicyFastRules(t))
	sc.seedNodes(gpu, 4)
	sc.workload("work", 3, "90", 8, gpu)
	sc.eventually("3 pods Running", 3*time.Minute, allRunning(sc, 3))
	sc.gpusAdvertised(gpu, 4)
	busy, _ := sc.runningByNode("work")
	victim := ""
	for _, n := range sc.nodeNames(gpu) {
		if _, ok := busy[n]; !ok {
			victim = n
		}
	}
	if len(busy) != 3 || victim == "" {
		t.Fatalf("pods on %v of %v: want one empty node", slices.Sorted(maps.Keys(busy)), sc.nodeNames(gpu))
	}
	victimVM := sc.vmOfNode(gpu, victim)
	sc.setCondition(hook, victim, xidError, apiv1.ConditionTrue, "XID79", "GPU 6: XID 79, GPU has fallen off the bus")
	sc.eventually("xid-error due on the empty node before the autoscaler starts", time.Minute, func() (bool, string) {
		n := sc.node(victim)
		if n == nil {
			t.Fatalf("node %s gone", victim)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == xidError && c.Status == apiv1.ConditionTrue {
				since := time.Since(c.LastTransitionTime.Time)
				return since >= fastFor, fmt.Sprintf("XIDErrors=True for %s", since)
			}
		}
		return false, "no XIDErrors=True"
	})
	p := sc.autoscaler("autoscaler", "--nodes=0:8:"+gpu, fmt.Sprintf("--node-delete-delay-after-taint=%s", pause))

	var cordonAt time.Time
	sc.eventually("the node cordoned for health/xid-error", time.Minute, func() (bool, string) {
		n := sc.node(victim)
		if n == nil {
			t.Fatalf("node %s gone before the test saw its cordon; deletions %v", victim, sc.deletionsOf(gpu))
		}
		rule, at, ok := healthCordon(n)
		cordonAt = at
		return ok && rule == "xid-error", fmt.Sprintf("unschedulable %v, annotation %q", n.Spec.Unschedulable, n.Annotations[actuation.CordonedAnnotation])
	})
	seenAt := time.Now()

	// The pod the scheduler bound just before it saw the cordon: a
	// ReplicaSet's (so it may be evicted and comes back), bound by its
	// template's nodeName, which is then taken out so its replacement is
	// scheduled (a pod bound to the cordoned node again would hold it for
	// good).
	d := sc.deployment("late", 1, "90", 8, gpu)
	tmpl := d.Spec.Template
	tmpl.Spec.TerminationGracePeriodSeconds = ptr(int64(30))
	tmpl.Annotations = map[string]string{harness.PodDeleteDelayAnnotation: "20s"} // its process takes 20 s to exit
	tmpl.Spec.NodeName = victim
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: sc.ns},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr(int32(1)), Selector: d.Spec.Selector, Template: tmpl}}
	rss := sc.s.cp.Client.AppsV1().ReplicaSets(sc.ns)
	_, err := rss.Create(sc.ctx, rs, metav1.CreateOptions{})
	must(t, err)
	var late apiv1.Pod
	sc.eventually("the late pod bound to the cordoned node", 10*time.Second, func() (bool, string) {
		pods := sc.appPods("late")
		if len(pods) != 1 {
			return false, fmt.Sprintf("%d pods", len(pods))
		}
		late = pods[0]
		return late.Spec.NodeName == victim, "bound to " + late.Spec.NodeName
	})
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := rss.Get(sc.ctx, "late", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.Template.Spec.NodeName = ""
		_, err = rss.Update(sc.ctx, cur, metav1.UpdateOptions{})
		return err
	}))
	// The cordon annotation's time is whole seconds.
	if bound := late.CreationTimestamp.Time; bound.After(cordonAt.Add(pause - 2*time.Second)) {
		t.Fatalf("the pod was bound at %s, the cordon at %s, seen at %s: outside the %s pause, the test proves nothing",
			bound.Format("15:04:05.000"), cordonAt.Format("15:04:05"), seenAt.Format("15:04:05.000"), pause)
	}

	// The machine is never deleted while the pod exists: the deletions are
	// read before the pod at every poll.
	var lastAlive time.Time
	alive := func() (*apiv1.Pod, bool) {
		t.Helper()
		dels := sc.deletionsOf(gpu)
		at := time.Now()
		cur, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, late.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, false
		}
		must(t, err)
		if cur.UID != late.UID {
			t.Fatalf("pod %s has another UID", late.Name)
		}
		if len(dels) > 0 {
			t.Fatalf("the machine of node %s deleted at %s while pod %s is still there (%s, terminating %v, evicted %v):\n%s",
				victim, dels[0].Format("15:04:05.000"), cur.Name, cur.Status.Phase, cur.DeletionTimestamp != nil, evictedByAPI(cur), sc.writeLog(gpu))
		}
		lastAlive = at
		return cur, true
	}
	var evicted apiv1.Pod
	sc.eventually("the late pod evicted", pause+time.Minute, func() (bool, string) {
		cur, ok := alive()
		if !ok {
			t.Fatalf("pod %s gone without having been seen terminating: deleted without its grace", late.Name)
		}
		evicted = *cur
		return cur.DeletionTimestamp != nil, fmt.Sprintf("%s on %s, not terminating", cur.Status.Phase, cur.Spec.NodeName)
	})
	if !evictedByAPI(&evicted) {
		t.Fatalf("pod %s terminating without the Eviction API's DisruptionTarget condition: %v", evicted.Name, evicted.Status.Conditions)
	}
	if g := evicted.DeletionGracePeriodSeconds; g == nil || *g != 30 {
		t.Fatalf("pod %s evicted with grace %v, want its 30 s", evicted.Name, g)
	}
	sc.eventually("the pod gone, then the node's machine deleted", 2*time.Minute, func() (bool, string) {
		if _, ok := alive(); ok {
			return false, "the pod terminating"
		}
		dels := sc.deletionsOf(gpu)
		_, left := sc.vms(gpu)[victimVM]
		return len(dels) > 0 && !left, fmt.Sprintf("deletions %v, VM %s there %v", dels, victimVM, left)
	})
	dels := sc.deletionsOf(gpu)
	if len(dels) != 1 || dels[0].Before(lastAlive) || dels[0].Before(cordonAt.Add(pause)) {
		t.Fatalf("deletions %v: want one, after the pod was last seen at %s and the pause after the cordon at %s\n%s",
			dels, lastAlive.Format("15:04:05.000"), cordonAt.Format("15:04:05"), sc.writeLog(gpu))
	}
	sc.eventually("the late pod's replacement Running on a node bought for it", 3*time.Minute, func() (bool, string) {
		running, others := sc.runningByNode("late")
		for n := range running {
			if n == victim {
				t.Fatalf("the replacement pod runs on the replaced node %s", n)
			}
		}
		return len(running) == 1 && others == 0, fmt.Sprintf("%d Running, %d other pods, capacity %d", len(running), others, sc.capacity(gpu))
	})
	sc.eventually("HealthReplace on the node, the action counted", 30*time.Second, func() (bool, string) {
		n := sc.nodeEvents(core.EventHealthReplace, victim)
		m := sc.healthMetric(p, `vmss_autoscaler_health_actions_total{action="replace",node_group="`+gpu+`",rule="xid-error"}`)
		return n > 0 && m == 1, fmt.Sprintf("%d HealthReplace events, actions_total{replace} %v", n, m)
	})
	for n, pod := range busy {
		cur, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, pod.Name, metav1.GetOptions{})
		if err != nil || cur.UID != pod.UID || cur.DeletionTimestamp != nil || cur.Spec.NodeName != n {
			t.Fatalf("pod %s on healthy node %s disturbed: %v", pod.Name, n, err)
		}
	}
}
