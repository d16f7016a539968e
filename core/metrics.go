package core

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/trigger"
)

// Metrics are the autoscaler's Prometheus metrics, all prefixed
// vmss_autoscaler_. They are registered on the registry given to
// NewMetrics, never on a global one.
type Metrics struct {
	LoopDuration  prometheus.Histogram
	PhaseDuration *prometheus.HistogramVec
	LoopErrors    *prometheus.CounterVec
	// CapacityBuffersSkipped are the buffers over the caps, last loop.
	CapacityBuffersSkipped prometheus.Gauge
	// StatusWriteFailures counts status ConfigMap writes that failed
	// (never a failed loop).
	StatusWriteFailures prometheus.Counter
	LastSuccessfulLoop  prometheus.Gauge
	UnschedulablePods   prometheus.Gauge
	ExpectedPods        prometheus.Gauge
	PodsAwaitingNodes   prometheus.Gauge
	Nodes               *prometheus.GaugeVec
	TargetSize          *prometheus.GaugeVec
	MinSize             *prometheus.GaugeVec
	MaxSize             *prometheus.GaugeVec
	ScaleUps            *prometheus.CounterVec
	ScaledUpNodes       *prometheus.CounterVec
	FailedScaleUps      *prometheus.CounterVec
	FailedRunning       *prometheus.GaugeVec
	Backoff             *prometheus.GaugeVec
	SizeUnknown         *prometheus.CounterVec
	SnapshotRebuilt     prometheus.Gauge
	UnneededNodes       prometheus.Gauge
	KeptNodes           *prometheus.GaugeVec
	// PodsWithoutScaleUp counts the last loop's pods no group was asked
	// for, by reason (scaleup.ReasonCode).
	PodsWithoutScaleUp *prometheus.GaugeVec
	ScaledDownNodes    *prometheus.CounterVec
	FailedScaleDowns   *prometheus.CounterVec
	Evictions          *prometheus.CounterVec
	BrakeEngaged       prometheus.Gauge
	ClusterUnhealthy   prometheus.Gauge
	// ReplacementBrakeEngaged is 1 when the replacement brake held a deletion.
	ReplacementBrakeEngaged prometheus.Gauge
	// ReplacementsLost counts replacement deletions found lost (the node
	// still Ready long after) and asked again, by group and path.
	ReplacementsLost *prometheus.CounterVec
	DrainsInFlight   prometheus.Gauge
	// GateRefused counts writes the actuation gate stopped {rule, action}.
	GateRefused *prometheus.CounterVec

	QueueDepth         *prometheus.GaugeVec
	NodesReleased      *prometheus.CounterVec
	NodesCancelled     *prometheus.CounterVec
	NodesInFlight      prometheus.Gauge
	AdditionRate       prometheus.Gauge
	AdditionRateReason *prometheus.GaugeVec
	RateChanges        *prometheus.CounterVec
	AdditionTokens     prometheus.Gauge

	PreflightPending  *prometheus.GaugeVec
	PreflightResults  *prometheus.CounterVec
	PreflightDuration *prometheus.HistogramVec
	PreflightReplaced *prometheus.CounterVec
	// PreflightIncidentNodes are the nodes failing a check in an incident {check}.
	PreflightIncidentNodes *prometheus.GaugeVec

	WarmTarget      *prometheus.GaugeVec
	WarmReady       *prometheus.GaugeVec
	BalloonsPending *prometheus.GaugeVec

	ConfigReloads         *prometheus.CounterVec
	ConfigRestartRequired prometheus.Gauge
	ConfigFallback        prometheus.Gauge

	// Passive node health (docs/concepts/health-policy.md).
	HealthUnhealthy *prometheus.GaugeVec
	HealthActions   *prometheus.CounterVec
	HealthRepairs   *prometheus.CounterVec
	HealthRepairing *prometheus.GaugeVec
	HealthHeld      *prometheus.CounterVec
	HealthBreaker   *prometheus.GaugeVec
	DegradedNodes   *prometheus.GaugeVec
	HealthPaused    prometheus.Gauge
	// HealthIncidents is the health rules in an incident now.
	HealthIncidents prometheus.Gauge

	// ProvReq are the ProvisioningRequest metrics (phase_provisioning_requests.go).
	ProvReq provreqMetrics
	// Buffers are the CapacityBuffer metrics (phase_capacity_buffers.go).
	Buffers buffersMetrics
	// SpotEvictions counts machines the cloud took back {node_group} (cluster_state_spot.go).
	SpotEvictions *prometheus.CounterVec
	// Loops counts loops by what woke them {trigger} (package trigger).
	Loops *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "vmss_autoscaler"
	loopBuckets := []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}
	m := &Metrics{
		LoopDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "loop_duration_seconds",
			Help: "Duration of one autoscaler loop.", Buckets: loopBuckets}),
		PhaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "phase_duration_seconds",
			Help: "Duration of each phase of the loop.", Buckets: loopBuckets}, []string{"phase"}),
		Loops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "loops_total",
			Help: "Loops run, by what woke them: periodic (the scan interval), pods (new unschedulable pods, after the batching window), node-ready (a node turned usable while nodes were queued), cloud-failure (a scale-up the cloud refused), config (a live reload). Triggers that arrive during a loop or the minimum gap make one loop, counted under the first."},
			[]string{"trigger"}),
		LoopErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "loop_errors_total",
			Help: "Loops that ended in error, by the phase that failed."}, []string{"phase"}),
		LastSuccessfulLoop: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "last_successful_loop_timestamp_seconds",
			Help: "Unix time of the last loop that completed without error."}),
		UnschedulablePods: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "unschedulable_pods",
			Help: "Pods the scheduler marked unschedulable, past the scale-up delay."}),
		ExpectedPods: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "expected_pods",
			Help: "Pods ReplicaSets are about to create that the last loop planned, copies of their unschedulable pods (--scale-up-for-expected-pods)."}),
		PodsAwaitingNodes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "pods_awaiting_upcoming_nodes",
			Help: "Unschedulable pods that fit on nodes already requested (with the copies standing for expected pods that do)."}),
		Nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "nodes",
			Help: "Nodes and machines per node group by state (ready, unready, not_started, unregistered, long_unregistered, in_error, deleting, upcoming)."},
			[]string{"node_group", "state"}),
		TargetSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "node_group_target_size",
			Help: "Target size of each node group; absent while unknown."}, []string{"node_group"}),
		MinSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "node_group_min_size",
			Help: "Minimum size of each node group."}, []string{"node_group"}),
		MaxSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "node_group_max_size",
			Help: "Maximum size of each node group."}, []string{"node_group"}),
		ScaleUps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scale_ups_total",
			Help: "Successful scale-up requests per node group."}, []string{"node_group"}),
		ScaledUpNodes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scaled_up_nodes_total",
			Help: "Nodes requested by successful scale-ups per node group."}, []string{"node_group"}),
		FailedRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "failed_running_instances",
			Help: "Machines the cloud reports failed while they run (an Azure VM whose extension, data-disk attach or model update failed), per node group and error code: kept, never deleted for it."},
			[]string{"node_group", "code"}),
		FailedScaleUps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "failed_scale_ups_total",
			Help: "Failed scale-ups per node group and reason (quota, out-of-capacity, provision-timeout, instance-error, throttled, conflict, other)."},
			[]string{"node_group", "reason"}),
		Backoff: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "node_group_backoff",
			Help: "1 while a node group is backed off after a failed scale-up."}, []string{"node_group"}),
		SizeUnknown: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "node_group_size_unknown_total",
			Help: "Loops that skipped a node group because its size was unknown."}, []string{"node_group"}),
		SnapshotRebuilt: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "snapshot_rebuilt_nodes",
			Help: "Nodes whose scheduler view was rebuilt in the last loop (the rest were unchanged)."}),
	}
	m.UnneededNodes = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "unneeded_nodes",
		Help: "Nodes currently unneeded (under the utilisation threshold with every pod movable)."})
	m.KeptNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "scale_down_kept_nodes",
		Help: "Managed nodes kept in the last scale-down pass, by reason."}, []string{"reason"})
	m.PodsWithoutScaleUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "pods_without_scale_up",
		Help: "Pending pods no node group was asked for in the last loop, by the reason most groups gave: group-not-registered, size-unknown, no-template, backoff, failed-this-loop, max-size, max-nodes-total, gpu-group-only, team-group, does-not-fit, gang-does-not-fit, no-node-groups."}, []string{"reason"})
	m.ScaledDownNodes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scaled_down_nodes_total",
		Help: "Nodes removed, by node group and reason (empty, underutilized, unready)."}, []string{"node_group", "reason"})
	m.FailedScaleDowns = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "failed_scale_downs_total",
		Help: "Node removals that failed, by node group and step (taint, evict, drain-timeout, delete)."}, []string{"node_group", "step"})
	m.Evictions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "evictions_total",
		Help: "Pod evictions for scale-down and replacement, by result (ok; blocked: refused by the API server, e.g. a PodDisruptionBudget; refused: stopped by the gate, never sent)."}, []string{"result"})
	m.BrakeEngaged = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "scale_down_brake_engaged",
		Help: "1 when the safety brake refused a removal in the last pass."})
	m.ClusterUnhealthy = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "cluster_unhealthy",
		Help: "1 while the cluster-wide unready guard holds: too many managed nodes unready, so nothing is deleted, cordoned or drained."})
	m.ReplacementBrakeEngaged = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "replacement_brake_engaged",
		Help: "1 when the replacement brake held back a deletion that is not scale-down (failed preflight, machines in error or never registered) in the last loop."})
	m.ReplacementsLost = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "replacement_deletions_lost_total",
		Help: "Machine deletions of replacement paths that the cloud accepted but whose machine still ran --deletion-lost-after (15 minutes) later (the operation failed: the VM runs on), asked again, by path: health and preflight (the node still Ready; not charged to the replacement brake again) and failed-machine (still listed, not deleting; charged again when its node is gone)."},
		[]string{"node_group", "path"})
	m.GateRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "gate_refused_writes_total",
		Help: "Writes the last check before every write stopped, by rule (fence: this replica may not write; hold: the cluster-wide unready guard) and action (taint, untaint, cordon, evict, delete)."},
		[]string{"rule", "action"})
	m.DrainsInFlight = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "scale_down_drains_in_flight",
		Help: "Nodes being drained now."})
	m.QueueDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "node_addition_queue_depth",
		Help: "Nodes planned but held back by the node-addition queue, by node group and class (workload, balloon)."}, []string{"node_group", "class"})
	m.NodesReleased = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "node_addition_released_nodes_total",
		Help: "Nodes the queue released and the cloud accepted, by node group and class."}, []string{"node_group", "class"})
	m.NodesCancelled = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "node_addition_cancelled_nodes_total",
		Help: "Queued nodes whose demand disappeared before they were requested, by node group and class."}, []string{"node_group", "class"})
	m.NodesInFlight = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "nodes_in_flight",
		Help: "Nodes requested from the cloud and not yet ready (the in-flight cap counts these)."})
	m.AdditionRate = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "node_addition_rate_nodes_per_minute",
		Help: "Current node-addition rate."})
	m.AdditionRateReason = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "node_addition_rate_reason",
		Help: "1 for the reason the node-addition rate is what it is (configured, healthy, steady, at-max, client-429, client-5xx, client-latency, apiserver-flowcontrol-rejected)."}, []string{"reason"})
	m.RateChanges = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "node_addition_rate_changes_total",
		Help: "Changes of the node-addition rate by the adaptive controller, by reason."}, []string{"reason"})
	m.AdditionTokens = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "node_addition_tokens",
		Help: "Fill of the node-addition token bucket (nodes that may be requested at once)."})
	m.PreflightPending = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "preflight_pending_nodes",
		Help: "Registered nodes waiting for the preflight agent, per node group (coming capacity)."}, []string{"node_group"})
	m.PreflightResults = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "preflight_results_total",
		Help: "Preflight outcomes per node group: passed, failed (the agent said so), timeout (not passed within --max-preflight-time)."}, []string{"node_group", "result"})
	m.PreflightDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "preflight_duration_seconds",
		Help:    "Time from a node's registration to passing preflight, per node group.",
		Buckets: []float64{15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600}}, []string{"node_group"})
	m.PreflightReplaced = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "preflight_replaced_nodes_total",
		Help: "Machines deleted because their node failed preflight, per node group."}, []string{"node_group"})
	m.PreflightIncidentNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "preflight_incident_nodes",
		Help: "Nodes failing a preflight check that is in an incident (many nodes failed it at once: they are kept, not replaced), by check; absent when none."}, []string{"check"})
	m.WarmTarget = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "warm_pool_target_nodes",
		Help: "Warm nodes each node group's policy asks for (balloon Deployment replicas)."}, []string{"node_group"})
	m.WarmReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "warm_pool_ready_nodes",
		Help: "Ready nodes of each group holding a balloon pod."}, []string{"node_group"})
	m.BalloonsPending = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "balloon_pods_pending",
		Help: "Balloon pods of each group waiting for a node."}, []string{"node_group"})
	reg.MustRegister(m.WarmTarget, m.WarmReady, m.BalloonsPending)
	m.ConfigReloads = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "config_reloads_total",
		Help: "Edits of the flags ConfigMap, by result: applied, rejected (a bad value; the last good configuration stays)."}, []string{"result"})
	m.ConfigRestartRequired = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "config_restart_required",
		Help: "1 when the flags ConfigMap changed keys that take effect only after a restart."})
	m.ConfigFallback = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "config_fallback",
		Help: "1 while the process runs on a fallback configuration (its flags file was refused at start: the last good configuration, or the command line alone); 0 once a flags ConfigMap is accepted."})
	reg.MustRegister(m.ConfigReloads, m.ConfigRestartRequired, m.ConfigFallback)
	m.HealthUnhealthy = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "health_unhealthy_nodes",
		Help: "Nodes matching a rule of the health policy now, by node group and rule (the strongest rule a node matches); absent when none."}, []string{"node_group", "rule"})
	m.HealthRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "health_repairs_total",
		Help: "In-place repair steps of unhealthy nodes (a replace rule's repair: reboot, reimage, redeploy) by outcome: started, fixed (the node stopped matching), timeout (it still matched after the rule's repairTimeout), failed (the cloud's operation failed or was refused)."}, []string{"node_group", "action", "outcome"})
	m.HealthActions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "health_actions_total",
		Help: "What the health policy did to nodes: cordon, drain (evictions begun), replace (machine deleted), uncordon (recovered), buy-first (its replacement bought first, the group at its minimum)."}, []string{"node_group", "rule", "action"})
	m.HealthHeld = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "health_held_total",
		Help: "Health actions held back, per loop and node, by reason: paused, unready-guard, unconfirmed, incident, breaker, cordon-ceiling, cordon-cap, gang, min-size, brake, blocked."}, []string{"node_group", "reason"})
	m.HealthBreaker = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "health_breaker_engaged",
		Help: "1 while a node group's health breaker holds new cordons, drains and replacements (more nodes unhealthy than maxUnhealthy, or its storm cooldown); never scale-up."}, []string{"node_group"})
	m.DegradedNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "degraded_nodes",
		Help: "Nodes of each node group advertising less than their VM size (a GPU the device plugin marked unhealthy, say): never templates."}, []string{"node_group"})
	m.HealthPaused = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "health_paused",
		Help: "1 while the health policy's ConfigMap carries the pause annotation: reports only."})
	m.HealthIncidents = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "health_incidents",
		Help: "Health rules in an incident now: many nodes began matching the rule at once (--health-incident-min-nodes); their matches are reported only."})
	m.ProvReq = newProvreqMetrics(reg, ns)
	m.Buffers = newBuffersMetrics(reg, ns)
	m.SpotEvictions = newSpotMetrics(reg, ns)
	m.HealthRepairing = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "health_repairing_nodes",
		Help: "Nodes in a repair ladder now, by the step they are at: due (waiting to be asked: pods still terminating, throttled), cloud (the machine's operation runs), preflight (sent through preflight again, waiting to pass and for the rule to clear), replace (no step fixed it)."}, []string{"node_group", "stage"})
	reg.MustRegister(m.HealthUnhealthy, m.HealthActions, m.HealthRepairs, m.HealthRepairing, m.HealthHeld, m.HealthBreaker, m.DegradedNodes, m.HealthPaused, m.HealthIncidents)
	reg.MustRegister(m.PreflightPending, m.PreflightResults, m.PreflightDuration, m.PreflightReplaced, m.PreflightIncidentNodes)
	reg.MustRegister(m.QueueDepth, m.NodesReleased, m.NodesCancelled, m.NodesInFlight, m.AdditionRate, m.AdditionRateReason, m.RateChanges, m.AdditionTokens)
	reg.MustRegister(m.UnneededNodes, m.KeptNodes, m.PodsWithoutScaleUp, m.ScaledDownNodes, m.FailedScaleDowns, m.Evictions, m.BrakeEngaged, m.DrainsInFlight, m.ClusterUnhealthy, m.ReplacementBrakeEngaged, m.ReplacementsLost, m.GateRefused)
	for _, code := range scaleup.ReasonCodes() {
		m.PodsWithoutScaleUp.WithLabelValues(string(code))
	}
	// Every trigger's series exists from the start, at zero.
	for _, r := range trigger.Reasons() {
		m.Loops.WithLabelValues(r.String())
	}
	m.StatusWriteFailures = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "status_write_failures_total",
		Help: "Writes of the status ConfigMap that failed (the API server, a refused object); the loop goes on, and the write is tried again next loop."})
	m.CapacityBuffersSkipped = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "capacity_buffers_skipped",
		Help: "CapacityBuffers not planned last loop: over --max-capacity-buffers or --max-capacity-buffers-per-namespace (the namespaces take turns, oldest first)."})
	reg.MustRegister(m.StatusWriteFailures, m.CapacityBuffersSkipped)
	reg.MustRegister(m.LoopDuration, m.PhaseDuration, m.LoopErrors, m.Loops, m.LastSuccessfulLoop, m.UnschedulablePods, m.ExpectedPods,
		m.PodsAwaitingNodes, m.Nodes, m.TargetSize, m.MinSize, m.MaxSize, m.ScaleUps, m.ScaledUpNodes,
		m.FailedScaleUps, m.FailedRunning, m.Backoff, m.SizeUnknown, m.SnapshotRebuilt)
	return m
}
