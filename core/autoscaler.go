package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/trigger"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/quota"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// Listers are the informer caches the loop reads. The loop never lists
// from the API server.
type Listers struct {
	Nodes      corelisters.NodeLister
	Pods       corelisters.PodLister
	DaemonSets appslisters.DaemonSetLister
	// ConfigMaps lists ConfigMaps in the autoscaler's namespace (priority
	// expander); nil when not watched.
	ConfigMaps corelisters.ConfigMapNamespaceLister
	// PDBs lists PodDisruptionBudgets for scale-down; nil disables PDB checks
	// only in tests that have no budgets.
	PDBs policylisters.PodDisruptionBudgetLister
	// ReplicaSets finds the pods a ReplicaSet is about to create
	// (scale_up_pods_to_come.go); nil: none are expected.
	ReplicaSets appslisters.ReplicaSetLister
}

// Deps are what the autoscaler is built from.
type Deps struct {
	Options   Options
	Provider  cloudprovider.CloudProvider
	Listers   Listers
	Simulator *simulator.Simulator
	Recorder  record.EventRecorder
	Status    StatusWriter // nil: no status ConfigMap
	// Actions are the loop's Kubernetes writes to nodes and pods; nil
	// disables scale-down and the replacement of failed nodes.
	Actions actuation.NodeActions
	// Safety keeps the brakes' and backoffs' state across a failover (the
	// status ConfigMap); nil: each leader starts with empty ones.
	Safety SafetyStore
	// Pods reads a node's pods again when its machine is deleted: the
	// informer's cache, then the API server. Required with Actions.
	Pods    actuation.PodReader
	Metrics *Metrics
	// APIServer feeds the adaptive node-addition rate; nil: no signals.
	APIServer APIServerSignals
	// Balloons keeps the balloon Deployments; nil: no controller (the
	// warm pools are still reported).
	Balloons BalloonController
	// Gangs finds gangs' minimum member counts (PodGroup objects); nil:
	// a gang's minimum is all its members.
	Gangs gang.MinCounts
	// ProvisioningRequests reads and writes ProvisioningRequests; nil (or
	// Options.ProvisioningRequests off): they are not handled.
	ProvisioningRequests provreq.API
	// CapacityBuffers reads buffers and writes their status; nil (or
	// Options.CapacityBuffers off): they are not handled.
	CapacityBuffers capacitybuffer.API

	Clock clock.Clock
	Rand  *rand.Rand
	// Fence, when set, says whether this replica may act now (it holds the
	// lease, renewed within the renew deadline): a loop starts only when it
	// does, and every cloud write is checked against it again.
	Fence cloudprovider.Fence
}

// Autoscaler runs the loop. RunOnce must not be called concurrently.
type Autoscaler struct {
	opts     Options
	provider cloudprovider.CloudProvider
	listers  Listers
	sim      *simulator.Simulator
	rec      record.EventRecorder
	status   StatusWriter
	metrics  *Metrics
	clock    clock.Clock
	builder  *snapshot.Builder
	registry *clusterstate.Registry
	planner  *scaleup.Planner
	// orchestrator runs the scale-up phase with planner.
	orchestrator *scaleup.Orchestrator
	templates    *templates
	events       *podEvents
	priority     priorityCache
	epoch        uint64
	actions      actuation.NodeActions
	evictor      actuation.Evictor
	// safety keeps the safety state for the next leader (nil: not kept);
	// restored says it was read back, lastSafety is what was last saved.
	safety     SafetyStore
	restored   bool
	lastSafety string
	// lastDecision sums up the last scale-up decision that bought nothing
	// (its pods without a scale-up, queued nodes, the queue's hold): the
	// same again is logged at -v=2 only.
	lastDecision string
	// remover is the only way this process deletes machines.
	remover   *actuation.Remover
	scaleDown *scaleDownState
	nodeAdd   *nodeAddition
	preflight *preflightState
	health    *healthState
	balloons  BalloonController
	gangs     gang.MinCounts
	provreq   *provreqState
	buffers   *buffersState
	fence     cloudprovider.Fence
	// gate is the last check before every write to nodes, pods and
	// machines: the fence, and the unready guard's hold.
	gate    *actuation.Gate
	replace replacements
	// spot counts the machines the cloud takes back (cluster_state_spot.go).
	spot *spotState

	lastStatus string
	// lastStatusErr is the last status write's failure ("" when it
	// succeeded): the event is told once per run of failures.
	lastStatusErr string
	// unhealthy is the unready guard's reason in the previous loop, for
	// events on its transitions.
	unhealthy string

	mu          sync.Mutex
	fallback    string   // why the process runs on a fallback configuration, for the status
	pending     *Options // from Reconfigure, applied before the next loop
	lastSuccess time.Time
	lastRun     time.Time

	// driver decides when Run's loops start (loop_triggers.go).
	driver *trigger.Driver
	// nodeRules are the options the node handler reads, set at each
	// loop's start; additionQueued says the last loop left nodes queued
	// by the in-flight cap.
	nodeRules      atomic.Pointer[nodeRules]
	additionQueued atomic.Bool
	// expecting says the last loop left pending pods to nodes that are
	// usable or coming (it bought nothing for them): a pod the scheduler
	// marks unschedulable again then wakes a loop (PodHandler).
	expecting atomic.Bool
	// lastRelease is the start of the last loop that released nodes to
	// the cloud, in Unix nanoseconds on the autoscaler's clock (followUp).
	lastRelease atomic.Int64
	// lastStart is the start of the last loop, the same way (remarked).
	lastStart atomic.Int64
	// writeGap is --node-group-write-interval in force, in nanoseconds
	// (followUp).
	writeGap atomic.Int64
}

// New builds an autoscaler.
func New(d Deps) (*Autoscaler, error) {
	if err := d.Options.Validate(); err != nil {
		return nil, err
	}
	fillDefaults(&d)
	gate := actuation.NewGate(d.Fence, d.Metrics.GateRefused)
	a := &Autoscaler{
		opts:      d.Options,
		provider:  cloudprovider.WithGuards(d.Provider, cloudprovider.Guards{Writes: d.Fence, Deletions: gate.DeletionsAllowed}),
		fence:     d.Fence,
		gate:      gate,
		listers:   d.Listers,
		sim:       d.Simulator,
		rec:       d.Recorder,
		status:    d.Status,
		metrics:   d.Metrics,
		clock:     d.Clock,
		builder:   snapshot.NewBuilder(d.Options.GPUResourceName),
		templates: newTemplates(),
		events:    newPodEvents(d.Recorder, d.Options.MaxPodEventsPerLoop, d.Options.PodEventInterval),
		preflight: newPreflightState(),
		health:    newHealthState(),
		balloons:  d.Balloons,
		gangs:     d.Gangs,
		safety:    d.Safety,
	}
	a.registry = clusterstate.NewRegistry(d.Options.registryOptions())
	chain, err := scaleup.NewChain(d.Options.Expanders, d.Options.GPUResourceName, a.priorities, d.Rand)
	if err != nil {
		return nil, err
	}
	a.planner = &scaleup.Planner{Estimator: &scaleup.Estimator{Sim: d.Simulator}, Expander: chain}
	a.orchestrator = &scaleup.Orchestrator{Planner: a.planner, GPU: d.Options.GPUResourceName}
	// Every Kubernetes write of the loop and its drains passes the gate.
	d.Actions = actuation.Guarded(d.Actions, gate)
	a.actions = d.Actions
	a.evictor = actuation.Evictor{Actions: d.Actions, Results: d.Metrics.Evictions}
	if d.Actions != nil && d.Pods == nil {
		return nil, errors.New("Deps.Pods is required with Deps.Actions: no machine is deleted without a fresh look at its pods")
	}
	a.remover = actuation.NewRemover(d.Pods, d.Recorder, d.Clock)
	a.scaleDown = newScaleDownState(d, d.Metrics, a.remover)
	a.replace.brake = scaledown.NewBrake(d.Options.replacementBrakeOptions())
	a.spot = newSpotState(d.Provider)
	if a.nodeAdd, err = newNodeAddition(d.Options, d.APIServer); err != nil {
		return nil, err
	}
	a.takeObjectAPIs(d)
	// Every phase's error count exists from the start, at zero, so a
	// dashboard or an alert on its rate has a series before the first error.
	for _, p := range a.phases() {
		a.metrics.LoopErrors.WithLabelValues(p.name)
	}
	a.nodeRules.Store(d.Options.nodeRules())
	a.writeGap.Store(int64(d.Options.NodeGroupWriteInterval))
	a.driver = trigger.New(d.Clock, a.triggerTiming)
	return a, nil
}

// fillDefaults gives d the real clock and a seeded random source where it
// has none.
func fillDefaults(d *Deps) {
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	if d.Rand == nil {
		d.Rand = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	}
}

// takeObjectAPIs keeps the ProvisioningRequest and CapacityBuffer APIs
// when their options turn them on.
func (a *Autoscaler) takeObjectAPIs(d Deps) {
	if d.Options.ProvisioningRequests && d.ProvisioningRequests != nil {
		a.provreq = &provreqState{api: d.ProvisioningRequests, tracker: provreq.NewTracker(provreq.DefaultOptions())}
	}
	if d.Options.CapacityBuffers && d.CapacityBuffers != nil {
		a.buffers = &buffersState{api: d.CapacityBuffers, lastEvent: map[types.UID]string{}, lastGood: map[types.UID]goodChunks{}}
	}
}

func (o Options) registryOptions() clusterstate.Options {
	return clusterstate.Options{
		MaxNodeProvisionTime: o.MaxNodeProvisionTime,
		MaxNodeStartupTime:   o.MaxNodeStartupTime,
		Backoff: clusterstate.BackoffOptions{
			Initial: o.InitialNodeGroupBackoffDuration,
			Max:     o.MaxNodeGroupBackoffDuration,
			Reset:   o.NodeGroupBackoffResetTimeout,
		},
		GroupDefaults:                  cloudprovider.GroupOptions{MaxNodeProvisionTime: o.MaxNodeProvisionTime},
		Preflight:                      o.Preflight,
		PreflightFailuresBeforeBackoff: o.PreflightFailuresBeforeBackoff,
		PreflightFailureWindow:         o.PreflightFailureWindow,
		Startup:                        o.startupOptions(),
		LostDeletionAfter:              o.DeletionLostAfter,
	}
}

func (o Options) startupOptions() clusterstate.StartupOptions {
	return clusterstate.StartupOptions{TaintKeys: o.StartupTaints, GPUResource: o.GPUResourceName, GPULabel: o.GPULabel}
}

// loop is the state of one RunOnce, handed from phase to phase.
type loop struct {
	now   time.Time
	epoch uint64
	// replacePDBs is the loop's PodDisruptionBudgets for the replacement
	// paths' drains, built once (replacementPDBs): every draining node
	// takes its evictions from the same budgets.
	replacePDBs *scaledown.PDBs
	nodes       []*apiv1.Node
	snap        *snapshot.Snapshot
	unbound     []*apiv1.Pod
	groupOf     map[string]cloudprovider.NodeGroup // node name → group
	nodesOf     map[string][]*apiv1.Node           // group ID → its nodes
	groups      []cloudprovider.NodeGroup
	byID        map[string]cloudprovider.NodeGroup // group ID → group
	actions     clusterstate.Actions
	// unhealthy, when set, says why the cluster-wide unready guard holds:
	// nothing is deleted, cordoned or drained this loop.
	unhealthy string
	// claimed are usable nodes pending pods fit on (the scale-up phase's
	// simulation): no scale-down candidates.
	claimed map[string]bool
	// replacementsHeld counts deletions the replacement brake held.
	replacementsHeld int
	// replacementsBlocked are nodes being replaced that a pod which may not
	// be evicted keeps, as "node: why".
	replacementsBlocked []string
	// incidents are the preflight checks in an incident, with the nodes
	// failing them; incidentKept counts the failed nodes kept for them.
	incidents    map[string]int
	incidentKept int
	// failuresSettling counts the failed nodes left alone because their
	// failure is younger than --preflight-failure-settle.
	failuresSettling int
	// health is the health phase's findings; skuTemplates are the groups'
	// VM-size templates and degraded the nodes' shortfalls against them,
	// each computed once per loop.
	health       *healthReport
	skuTemplates map[string]*apiv1.Node
	degraded     map[string][]apiv1.ResourceName
	// provreq is the loop's ProvisioningRequests (nil: not handled).
	provreq *provreqLoop
	// buffers is the loop's CapacityBuffers (nil: not handled).
	buffers *buffersLoop
	// results for status and metrics
	unschedulable int
	awaiting      int
	// noScaleUp counts the loop's pods no group was asked for, by the
	// reason most groups gave.
	noScaleUp map[scaleup.ReasonCode]int
	// expected counts the copies planned for pods ReplicaSets are about
	// to create (scale_up_pods_to_come.go).
	expected  int
	scaleUp   scaleup.Result
	addition  additionReport
	warm      map[string]*warmPool
	scaleDown scaleDownReport
	// quotas are the namespaces' ResourceQuota ledgers of this loop,
	// spent by ProvisioningRequests' bookings, then new requests, then
	// CapacityBuffers' chunks (quotaLedger).
	quotas map[string]*quota.Ledger
}

// quotaLedger is namespace ns's ResourceQuota ledger of the loop, made on
// first use from the quotas in the cache: one ledger for every kind of
// virtual pod, so a tenant's requests and buffers share its quota rather
// than each getting all of it.
func (a *Autoscaler) quotaLedger(l *loop, ns string) *quota.Ledger {
	if led, ok := l.quotas[ns]; ok {
		return led
	}
	var qs []*apiv1.ResourceQuota
	switch {
	case a.provreq != nil:
		qs = a.provreq.api.Quotas(ns)
	case a.buffers != nil:
		qs, _ = a.buffers.api.Quotas(ns)
	}
	if l.quotas == nil {
		l.quotas = map[string]*quota.Ledger{}
	}
	led := quota.New(qs)
	l.quotas[ns] = led
	return led
}

// phases are the loop's steps, in order.
func (a *Autoscaler) phases() []phase {
	return []phase{
		{"cloud-refresh", a.refreshCloud},
		{"snapshot", a.takeSnapshot},
		{"cluster-state", a.updateClusterState},
		{"preflight", a.replaceFailedPreflight},
		{"health", a.nodeHealth},
		{"balloons", a.syncBalloons},
		{"provisioning-requests", a.provisioningRequests},
		{"capacity-buffers", a.capacityBuffers},
		{"scale-up", a.scaleUp},
		{"scale-down", a.scaleDownPhase},
		{"status", a.writeStatus},
		{"safety-state", a.saveSafetyState},
	}
}

type phase struct {
	name string
	run  func(context.Context, *loop) error
}

// RunOnce runs one loop: read the cloud and the cluster, update the
// cluster state and act on failures, scale up, write the status.
func (a *Autoscaler) RunOnce(ctx context.Context) error {
	if a.fence != nil {
		if err := a.fence(); err != nil {
			return fmt.Errorf("not acting: %w", err)
		}
	}
	a.applyPending(ctx)
	a.nodeRules.Store(a.opts.nodeRules())
	a.writeGap.Store(int64(a.opts.NodeGroupWriteInterval))
	if err := a.restoreSafetyState(ctx); err != nil {
		return fmt.Errorf("not acting: %w", err)
	}
	start := a.clock.Now()
	a.lastStart.Store(start.UnixNano())
	a.epoch++
	l := &loop{now: start, epoch: a.epoch}
	phases := a.phases()
	for _, p := range phases {
		t := a.clock.Now()
		err := p.run(ctx, l)
		a.metrics.PhaseDuration.WithLabelValues(p.name).Observe(a.clock.Since(t).Seconds())
		if err != nil {
			a.metrics.LoopErrors.WithLabelValues(p.name).Inc()
			// What the phases before it did (a release) still paces and
			// wakes the next loops.
			a.afterLoop(l)
			a.recordRun(start, false)
			return fmt.Errorf("phase %s: %w", p.name, err)
		}
	}
	a.metrics.LoopDuration.Observe(a.clock.Since(start).Seconds())
	a.afterLoop(l)
	a.recordRun(start, true)
	return nil
}

// afterLoop tells the event triggers what loop l left: nodes queued, pods
// left to coming nodes, a release (the follow-up pace), and asks for the
// loop that releases what the rate or the pace held.
func (a *Autoscaler) afterLoop(l *loop) {
	// A node turning usable frees a place under the in-flight cap: worth
	// a loop only when that cap held nodes back. Nodes the rate holds wait
	// for tokens, not nodes; waking on every ready node then sent a write
	// per loop of a few nodes each, more writes than a scale set's Update
	// policy refills (4 a minute, 12 at most: Microsoft, "Compute
	// throttling limits"; the scale harness at 7,500 nodes: 104 refused
	// with 429).
	a.additionQueued.Store(queuedNodes(l.addition) > 0 && l.addition.Limit == ratelimit.LimitInFlight)
	a.expecting.Store(l.awaiting > 0 || len(l.claimed) > 0)
	// Nodes the rate held wait for tokens: a loop when the bucket holds
	// them (or the burst's worth), no sooner than a follow-up may come
	// and at most half a scan interval later — not the next periodic
	// loop, nor a write per token.
	if releasedNodes(l.addition) > 0 {
		a.lastRelease.Store(l.now.UnixNano())
	}
	switch held := queuedNodes(l.addition); {
	case held > 0 && l.addition.Limit == ratelimit.LimitRate:
		a.driver.WakeAfter(trigger.Queue, min(max(a.nodeAdd.refillWait(held), a.followUp()), a.opts.ScanInterval/2))
	case held > 0 && l.addition.Limit == ratelimit.LimitPaced:
		a.driver.WakeAfter(trigger.Queue, max(a.followUp(), a.nodeAdd.paceWait(a.clock.Now())))
	}
}

func (a *Autoscaler) recordRun(t time.Time, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastRun = t
	if ok {
		a.lastSuccess = t
		a.metrics.LastSuccessfulLoop.Set(float64(t.Unix()))
	}
}

// SetConfigFallback says the process runs on a fallback configuration, and
// why ("" when a flags ConfigMap was accepted since): the status says so.
func (a *Autoscaler) SetConfigFallback(why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fallback = why
}

func (a *Autoscaler) configFallback() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fallback
}

// LastSuccess is the start time of the last loop that completed.
func (a *Autoscaler) LastSuccess() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastSuccess
}

// LastRun is the start time of the last loop, successful or not.
func (a *Autoscaler) LastRun() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastRun
}

// Run calls RunOnce until ctx ends: at once, then at least every
// ScanInterval and, with FrequentLoops, sooner when woken (Wake: new
// unschedulable pods after their batching window, a node turning usable,
// a failed scale-up, a configuration change), never two at once nor two
// starts closer than MinLoopInterval (package trigger). It counts each
// loop under the reason that woke it, and calls completed (when not nil)
// after every loop that completed: the leader stores the last good
// configuration at its first.
func (a *Autoscaler) Run(ctx context.Context, completed func(context.Context)) {
	a.driver.Run(ctx, func(ctx context.Context, r trigger.Reason) {
		a.metrics.Loops.WithLabelValues(r.String()).Inc()
		klog.FromContext(ctx).V(4).Info("Loop", "trigger", r.String())
		if err := a.RunOnce(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Autoscaler loop failed")
		} else if completed != nil {
			completed(ctx)
		}
	})
}
