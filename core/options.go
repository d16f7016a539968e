package core

import (
	"fmt"
	"time"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/bounds"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// Options are the autoscaler's settings. Flag names (in main) follow
// cluster-autoscaler's where the meaning is the same.
type Options struct {
	// ScanInterval is the most time between loop starts (--scan-interval):
	// the floor under the loops woken by events.
	ScanInterval time.Duration
	// FrequentLoops wakes the loop on events (--frequent-loops-enabled):
	// new unschedulable pods, a node turning usable while nodes are
	// queued, a failed scale-up, a configuration change (package trigger).
	FrequentLoops bool
	// MinLoopInterval is the least time between loop starts
	// (--min-loop-interval); a shorter ScanInterval wins.
	MinLoopInterval time.Duration
	// PodBatchIdleDuration and PodBatchMaxDuration are the batching window
	// of new unschedulable pods: a loop is woken once none came for the
	// idle duration, or the max duration after the first, whichever comes
	// first, so a Job's or a gang's pods are planned together
	// (--pod-batch-idle-duration, --pod-batch-max-duration; shorter than
	// Karpenter's 1 s and 10 s: a ReplicaSet's pods still to come or not
	// yet tried are planned with its first (scale_up_pods_to_come.go), a gang is
	// bought whole once its members exist, and follow-up releases are
	// paced (NodeGroupWriteInterval)).
	PodBatchIdleDuration time.Duration
	PodBatchMaxDuration  time.Duration
	// NodeGroupWriteInterval paces follow-ups: the least time between two
	// releases of single-node demand to one node group (each a scale-set
	// write), and between a loop that asked the cloud for nodes and a
	// follow-up loop (loop_triggers.go); 0 turns pacing off
	// (--node-group-write-interval).
	NodeGroupWriteInterval time.Duration
	// ScaleUpForExpectedPods plans the pods a ReplicaSet is about to
	// create, once some of its pods are unschedulable (scale_up_pods_to_come.go;
	// --scale-up-for-expected-pods).
	ScaleUpForExpectedPods bool
	// MaxNodesTotal caps the cluster's node count, 0 for no cap (--max-nodes-total).
	MaxNodesTotal int
	// Expanders is the expander chain (--expander=priority,least-waste).
	Expanders []string
	// NewPodScaleUpDelay is how long a pod must have existed before it may
	// trigger a scale-up (--new-pod-scale-up-delay, cluster-autoscaler's
	// meaning and default, 0). The pod batching window is what lets a
	// burst (a gang, a Job) arrive whole: it waits for the burst to end,
	// where an age filter delays every pod by the same amount.
	NewPodScaleUpDelay time.Duration
	// MaxNodeProvisionTime is how long a new machine may take to register
	// before its scale-up counts as failed (--max-node-provision-time).
	MaxNodeProvisionTime time.Duration
	// MaxNodeStartupTime is how long a registered node may stay not ready
	// and still count as starting (--max-node-startup-time).
	MaxNodeStartupTime time.Duration
	// Backoff of groups whose scale-up failed.
	InitialNodeGroupBackoffDuration time.Duration
	MaxNodeGroupBackoffDuration     time.Duration
	NodeGroupBackoffResetTimeout    time.Duration
	// GPUResourceName is the extended resource counted as GPUs.
	GPUResourceName apiv1.ResourceName
	// GPUGroupsForGPUPodsOnly keeps pods that request no GPU from scaling up
	// groups of GPU machines (--gpu-groups-for-gpu-pods-only).
	GPUGroupsForGPUPodsOnly bool
	// Namespace holds the status and priority ConfigMaps.
	Namespace string
	// StatusConfigMapName is the status ConfigMap; WriteStatusConfigMap turns it on.
	StatusConfigMapName  string
	WriteStatusConfigMap bool
	// PriorityConfigMapName is the priority expander's ConfigMap.
	PriorityConfigMapName string
	// HealthPolicyConfigMapName is the health policy's ConfigMap (key
	// "policy", docs/concepts/health-policy.md); without it the built-in policy applies.
	HealthPolicyConfigMapName string
	// Bounds on what node health signals can make the autoscaler do,
	// whatever the policy says (docs/concepts/health-policy.md): at most
	// HealthMaxCordonedShare of the judged nodes (and at least 2) hold a
	// health cordon at once; a rule matched by at least
	// HealthIncidentMinNodes and HealthIncidentClusterShare of the judged
	// nodes, their matches begun within HealthIncidentWindow, is an
	// incident (a monitor's false alarm, a bad rollout): its matches are
	// reported, never cordoned, drained or replaced, until fewer match it
	// for the policy's stormCooldown. A newly accepted policy whose drain
	// or replace rules match more nodes than the cordon ceiling on its
	// first evaluation reports only until it is confirmed.
	HealthMaxCordonedShare     float64
	HealthIncidentMinNodes     int
	HealthIncidentClusterShare float64
	HealthIncidentWindow       time.Duration
	// HealthFailuresBeforeBackoff drains or replacements, in a group
	// within HealthFailureWindow, of nodes younger than that window back
	// the group off: its new nodes keep going bad (a bad image, a bad
	// batch), and replacing them loops. 0 never backs off for health.
	HealthFailuresBeforeBackoff int
	HealthFailureWindow         time.Duration
	// MaxPodEventsPerLoop caps pod events (TriggeredScaleUp,
	// NotTriggerScaleUp) written per loop; an unchanged event for a pod is
	// repeated at most every PodEventInterval.
	MaxPodEventsPerLoop int
	PodEventInterval    time.Duration

	// Scale-down, with CA's flag names.
	ScaleDownEnabled                 bool
	ScaleDownUtilizationThreshold    float64
	ScaleDownGPUUtilizationThreshold float64
	ScaleDownUnneededTime            time.Duration
	ScaleDownUnreadyTime             time.Duration
	ScaleDownDelayAfterAdd           time.Duration
	ScaleDownDelayAfterDelete        time.Duration
	ScaleDownDelayAfterFailure       time.Duration
	MaxScaleDownParallelism          int
	MaxEmptyBulkDelete               int
	MaxGracefulTerminationSec        int
	// NodeDeleteDelayAfterTaint is how long a node removed by scale-down
	// carries its ToBeDeleted taint before its machine is deleted: a pod
	// bound to it before the taint arrived shows up, and the removal is
	// given up (CA's --node-delete-delay-after-taint).
	NodeDeleteDelayAfterTaint time.Duration
	// DeletionLostAfter is how long a machine whose deletion the cloud
	// accepted may still run (listed, not deleting; or its node Ready and
	// its machine not listed deleting) before the deletion is taken as
	// lost and asked again, on every replacement path: health, preflight,
	// failed machines (--deletion-lost-after).
	DeletionLostAfter         time.Duration
	SkipNodesWithSystemPods   bool
	SkipNodesWithLocalStorage bool
	// The safety brake: at most this share of the cluster, and of a group,
	// deleted within the window.
	ScaleDownBrakeClusterShare float64
	ScaleDownBrakeGroupShare   float64
	ScaleDownBrakeWindow       time.Duration
	// A group whose unready nodes exceed both this share and 3 nodes is not
	// scaled down (the rest of the cluster is).
	ScaleDownMaxUnreadyShare float64
	// MaxSoftTaintsPerLoop caps the DeletionCandidate taint writes per loop.
	MaxSoftTaintsPerLoop int
	// The cluster-wide unready guard (CA's names and defaults): when more
	// than OkTotalUnreadyCount managed nodes and more than
	// MaxTotalUnreadyPercentage of them are unready, something is wrong
	// with the cluster rather than with machines (an etcd or DNS incident,
	// a network partition): nothing is deleted, cordoned or drained —
	// no scale-down, no replacement — and only scale-up goes on.
	MaxTotalUnreadyPercentage float64
	OkTotalUnreadyCount       int
	// The replacement brake: deletions that are not scale-down (nodes that
	// failed preflight, machines in error or never registered) are at most
	// ReplacementBrakeClusterShare of the cluster's target, or
	// ReplacementBrakeMinNodes, per ReplacementBrakeWindow. Past it they
	// wait, cordoned: a failing check everywhere at once (a DNS outage) is
	// an incident, not thousands of bad machines.
	ReplacementBrakeClusterShare float64
	ReplacementBrakeMinNodes     int
	ReplacementBrakeWindow       time.Duration
	// A preflight incident: when more than PreflightIncidentMinNodes and
	// PreflightIncidentClusterShare of the cluster's target fail the same
	// check within PreflightIncidentWindow, the check (or what it tests:
	// DNS, the API server, a shared filesystem) is broken, not the
	// machines. Nodes failing it are not cordoned, drained or deleted
	// while it lasts: until fewer than the threshold fail it.
	PreflightIncidentMinNodes     int
	PreflightIncidentClusterShare float64
	PreflightIncidentWindow       time.Duration
	// PreflightFailureSettle is how long a node's preflight failure stands
	// before anything is done to the node (cordon, eviction, deletion), and
	// how long fewer than the threshold must fail a check before its
	// incident ends. Agents report one by one: an outage's failures arrive
	// over seconds or minutes, and without it the first to arrive would be
	// taken for bad machines before the incident is seen, and the last
	// still failing when it ends. 0 acts at once.
	PreflightFailureSettle time.Duration

	// The node-addition queue (smoothing): nodes are requested from the
	// cloud at most NodeAdditionRate per minute with NodeAdditionBurst at
	// once, and never more than MaxNodesInFlight requested and not yet ready.
	NodeAdditionSmoothing bool
	NodeAdditionRate      float64
	NodeAdditionBurst     int
	MaxNodesInFlight      int
	// NodeAdditionAdaptive moves the rate within NodeAdditionAdaptiveOptions'
	// bounds from the API server's health.
	NodeAdditionAdaptive        bool
	NodeAdditionAdaptiveOptions ratelimit.AdaptiveOptions

	// Preflight is the readiness gate (taint, label, deadline).
	Preflight preflight.Options
	// PreflightFailuresBeforeBackoff failures in a group within
	// PreflightFailureWindow back it off; 0 never.
	PreflightFailuresBeforeBackoff int
	PreflightFailureWindow         time.Duration
	// SpotEvictionBackoffCount machines of a group evicted by the cloud
	// (Spot) within SpotEvictionWindow back it off; 0 never (cluster_state_spot.go).
	SpotEvictionBackoffCount int
	SpotEvictionWindow       time.Duration

	// BalloonAware makes balloon pods' room free to real pods in scale-up
	// and in scale-down's utilisation (--balloon-aware).
	BalloonAware bool
	// Balloons names the balloon label, PriorityClass and image.
	Balloons balloon.Options
	// WarmPools are the warm-pool policies by node group (--warm-pool).
	WarmPools map[string]balloon.Policy

	// BorrowersScaleTeamGroups lets pods that tolerate a team's taint only
	// through a catch-all toleration grow the team's group.
	BorrowersScaleTeamGroups bool
	// StatusTaints are taint keys stripped from templates (--status-taint).
	StatusTaints []string
	// StartupTaints are taint keys an agent removes once a new node is set
	// up (--startup-taint; keys with clusterstate.StartupTaintPrefix are
	// too): a node carrying one is coming capacity, and templates never
	// carry them.
	StartupTaints []string
	// GPULabel marks GPU nodes before their GPUs are advertised.
	GPULabel string
	// GangSplit lets a gang span several node groups when no single group
	// can take it (--gang-allow-split).
	GangSplit bool
	// ProvisioningRequests turns on the ProvisioningRequest API
	// (--enable-provisioning-requests): check-capacity and
	// best-effort-atomic-scale-up requests, and their booked capacity.
	ProvisioningRequests bool
	// CapacityBuffers turns on the CapacityBuffer API
	// (autoscaling.x-k8s.io/v1beta1): buffers of the active-capacity
	// strategy hold room on ready nodes or buy it (phase_capacity_buffers.go).
	CapacityBuffers bool
	// MaxCapacityBuffers and MaxCapacityBuffersPerNamespace bound the
	// buffers a loop plans, in all and per namespace, taken oldest first
	// with the namespaces in turn (--max-capacity-buffers,
	// --max-capacity-buffers-per-namespace): each buffer costs loop time
	// and memory for its chunks, and tenants create them.
	MaxCapacityBuffers             int
	MaxCapacityBuffersPerNamespace int
	// MaxProvisioningRequests and MaxProvisioningRequestsPerNamespace
	// bound the live ProvisioningRequests a loop plans, in all and per
	// namespace (--max-provisioning-requests,
	// --max-provisioning-requests-per-namespace): booked ones always, the
	// rest oldest first with the namespaces in turn; those left out say
	// so (Provisioned=False, RequestLimitReached) and wait.
	MaxProvisioningRequests             int
	MaxProvisioningRequestsPerNamespace int
}

// DefaultOptions returns the defaults, safe for a 7,500-node cluster.
func DefaultOptions() Options {
	return Options{
		MaxCapacityBuffers:                  1000,
		MaxCapacityBuffersPerNamespace:      100,
		MaxProvisioningRequests:             1000,
		MaxProvisioningRequestsPerNamespace: 100,
		ScanInterval:                        10 * time.Second,
		FrequentLoops:                       true,
		MinLoopInterval:                     time.Second,
		PodBatchIdleDuration:                500 * time.Millisecond,
		PodBatchMaxDuration:                 time.Second,
		NodeGroupWriteInterval:              5 * time.Second,
		ScaleUpForExpectedPods:              true,
		Expanders:                           []string{"least-waste"},
		NewPodScaleUpDelay:                  0,
		MaxNodeProvisionTime:                15 * time.Minute,
		MaxNodeStartupTime:                  15 * time.Minute,
		InitialNodeGroupBackoffDuration:     5 * time.Minute,
		MaxNodeGroupBackoffDuration:         30 * time.Minute,
		NodeGroupBackoffResetTimeout:        3 * time.Hour,
		GPUResourceName:                     "nvidia.com/gpu",
		GPUGroupsForGPUPodsOnly:             true,
		Namespace:                           "kube-system",
		StatusConfigMapName:                 "vmss-autoscaler-status",
		WriteStatusConfigMap:                true,
		PriorityConfigMapName:               "vmss-autoscaler-priority-expander",
		HealthPolicyConfigMapName:           "vmss-autoscaler-health-policy",
		MaxPodEventsPerLoop:                 200,
		PodEventInterval:                    10 * time.Minute,

		ScaleDownEnabled:                 true,
		ScaleDownUtilizationThreshold:    0.5,
		ScaleDownGPUUtilizationThreshold: 0.5,
		ScaleDownUnneededTime:            10 * time.Minute,
		ScaleDownUnreadyTime:             20 * time.Minute,
		ScaleDownDelayAfterAdd:           10 * time.Minute,
		ScaleDownDelayAfterDelete:        0,
		ScaleDownDelayAfterFailure:       3 * time.Minute,
		MaxScaleDownParallelism:          10,
		MaxEmptyBulkDelete:               10,
		MaxGracefulTerminationSec:        600,
		NodeDeleteDelayAfterTaint:        5 * time.Second,
		DeletionLostAfter:                clusterstate.DefaultLostDeletionAfter,
		SkipNodesWithSystemPods:          true,
		SkipNodesWithLocalStorage:        true,
		ScaleDownBrakeClusterShare:       0.5,
		ScaleDownBrakeGroupShare:         0.5,
		ScaleDownBrakeWindow:             10 * time.Minute,
		ScaleDownMaxUnreadyShare:         0.45,
		MaxSoftTaintsPerLoop:             50,
		MaxTotalUnreadyPercentage:        45,
		OkTotalUnreadyCount:              3,
		ReplacementBrakeClusterShare:     0.02,
		ReplacementBrakeMinNodes:         10,
		ReplacementBrakeWindow:           10 * time.Minute,
		PreflightIncidentMinNodes:        5,
		PreflightIncidentClusterShare:    0.01,
		PreflightIncidentWindow:          10 * time.Minute,
		HealthMaxCordonedShare:           0.03,
		HealthIncidentMinNodes:           5,
		HealthIncidentClusterShare:       0.01,
		HealthIncidentWindow:             10 * time.Minute,
		HealthFailuresBeforeBackoff:      3,
		HealthFailureWindow:              time.Hour,
		PreflightFailureSettle:           5 * time.Minute,

		// About 1.7 joins a second to start: each join costs the API
		// server a Node, a Lease, DaemonSet pods and the kubelet's first
		// LISTs. Slow start doubles it every 5 s while the API server
		// stays healthy, up to 600 a minute (docs/concepts/smoothing.md).
		NodeAdditionSmoothing:       true,
		NodeAdditionRate:            100,
		NodeAdditionBurst:           50,
		MaxNodesInFlight:            300,
		NodeAdditionAdaptive:        true,
		NodeAdditionAdaptiveOptions: ratelimit.DefaultAdaptiveOptions(),

		Preflight:                      preflight.DefaultOptions(),
		PreflightFailuresBeforeBackoff: 3,
		PreflightFailureWindow:         30 * time.Minute,
		SpotEvictionBackoffCount:       3,
		SpotEvictionWindow:             10 * time.Minute,

		BalloonAware: true,
		Balloons:     balloon.DefaultOptions(),

		// Cilium's agent taint (its documented way to keep pods off a node
		// until the agent runs) and the node lifecycle's no-network taint.
		StartupTaints: []string{"node.cilium.io/agent-not-ready", apiv1.TaintNodeNetworkUnavailable},
		GPULabel:      "kubernetes.azure.com/accelerator",
	}
}

// Validate checks the options and names the flag at fault.
func (o Options) Validate() error {
	for _, validate := range []func() error{o.validateDurations, o.validateShares, o.validateCounts,
		o.validateRelations, o.validateBounds, o.validateParts} {
		if err := validate(); err != nil {
			return err
		}
	}
	return nil
}

// validateDurations checks the durations that must be positive, then
// those that must not be negative.
func (o Options) validateDurations() error {
	for _, d := range []flagDuration{
		{"--scan-interval", o.ScanInterval},
		{"--max-node-provision-time", o.MaxNodeProvisionTime},
		{"--max-node-startup-time", o.MaxNodeStartupTime},
		{"--initial-node-group-backoff-duration", o.InitialNodeGroupBackoffDuration},
		{"--max-node-group-backoff-duration", o.MaxNodeGroupBackoffDuration},
		{"--node-group-backoff-reset-timeout", o.NodeGroupBackoffResetTimeout},
		{"--scale-down-brake-window", o.ScaleDownBrakeWindow},
		{"--replacement-brake-window", o.ReplacementBrakeWindow},
		{"--preflight-incident-window", o.PreflightIncidentWindow},
		{"--health-incident-window", o.HealthIncidentWindow},
	} {
		if d.v <= 0 {
			return fmt.Errorf("%s: must be positive, got %s", d.flag, d.v)
		}
	}
	for _, d := range []flagDuration{
		{"--new-pod-scale-up-delay", o.NewPodScaleUpDelay},
		{"--scale-down-unneeded-time", o.ScaleDownUnneededTime},
		{"--scale-down-unready-time", o.ScaleDownUnreadyTime},
		{"--scale-down-delay-after-add", o.ScaleDownDelayAfterAdd},
		{"--scale-down-delay-after-delete", o.ScaleDownDelayAfterDelete},
		{"--scale-down-delay-after-failure", o.ScaleDownDelayAfterFailure},
		{"--node-delete-delay-after-taint", o.NodeDeleteDelayAfterTaint},
	} {
		if d.v < 0 {
			return fmt.Errorf("%s: must not be negative, got %s", d.flag, d.v)
		}
	}
	return nil
}

// validateShares checks the shares, each between 0 and 1 (a share that is
// not a number is refused).
func (o Options) validateShares() error {
	for _, f := range []struct {
		flag string
		v    float64
	}{
		{"--scale-down-utilization-threshold", o.ScaleDownUtilizationThreshold},
		{"--scale-down-gpu-utilization-threshold", o.ScaleDownGPUUtilizationThreshold},
		{"--scale-down-brake-cluster-share", o.ScaleDownBrakeClusterShare},
		{"--scale-down-brake-group-share", o.ScaleDownBrakeGroupShare},
		{"--scale-down-max-unready-share", o.ScaleDownMaxUnreadyShare},
		{"--replacement-brake-cluster-share", o.ReplacementBrakeClusterShare},
		{"--preflight-incident-cluster-share", o.PreflightIncidentClusterShare},
		{"--health-incident-cluster-share", o.HealthIncidentClusterShare},
	} {
		if !(f.v >= 0 && f.v <= 1) {
			return fmt.Errorf("%s: must be between 0 and 1, got %v", f.flag, f.v)
		}
	}
	return nil
}

// validateCounts checks the counts' least values.
func (o Options) validateCounts() error {
	for _, n := range []struct {
		flag     string
		v, least int
	}{
		{"--max-nodes-total", o.MaxNodesTotal, 0},
		{"--max-pod-events-per-loop", o.MaxPodEventsPerLoop, 0},
		{"--health-failures-before-backoff", o.HealthFailuresBeforeBackoff, 0},
		{"--ok-total-unready-count", o.OkTotalUnreadyCount, 0},
		{"--max-graceful-termination-sec", o.MaxGracefulTerminationSec, 0},
		{"--preflight-failures-before-backoff", o.PreflightFailuresBeforeBackoff, 0},
		{"--replacement-brake-min-nodes", o.ReplacementBrakeMinNodes, 1},
		{"--preflight-incident-min-nodes", o.PreflightIncidentMinNodes, 1},
		{"--health-incident-min-nodes", o.HealthIncidentMinNodes, 2},
	} {
		switch {
		case n.v < n.least && n.least == 0:
			return fmt.Errorf("%s: must not be negative, got %d", n.flag, n.v)
		case n.v < n.least:
			return fmt.Errorf("%s: must be at least %d, got %d", n.flag, n.least, n.v)
		}
	}
	return nil
}

// flagDuration is a duration flag's name and value, for a check's table.
type flagDuration struct {
	flag string
	v    time.Duration
}

// validateRelations checks what one flag must be beside another.
func (o Options) validateRelations() error {
	switch {
	case o.PodBatchIdleDuration > o.PodBatchMaxDuration:
		return fmt.Errorf("--pod-batch-idle-duration %s: longer than --pod-batch-max-duration %s", o.PodBatchIdleDuration, o.PodBatchMaxDuration)
	case o.MaxNodeGroupBackoffDuration < o.InitialNodeGroupBackoffDuration:
		return fmt.Errorf("--max-node-group-backoff-duration: %s is shorter than --initial-node-group-backoff-duration %s",
			o.MaxNodeGroupBackoffDuration, o.InitialNodeGroupBackoffDuration)
	case o.MaxScaleDownParallelism < 1 || o.MaxEmptyBulkDelete < 1:
		return fmt.Errorf("--max-scale-down-parallelism %d, --max-empty-bulk-delete %d: must be at least 1", o.MaxScaleDownParallelism, o.MaxEmptyBulkDelete)
	case o.MaxTotalUnreadyPercentage < 0 || o.MaxTotalUnreadyPercentage > 100:
		return fmt.Errorf("--max-total-unready-percentage: must be between 0 and 100, got %v", o.MaxTotalUnreadyPercentage)
	}
	return nil
}

// validateBounds checks the bounds with messages of their own.
func (o Options) validateBounds() error {
	for _, validate := range []func() error{o.validateObjectLimits, o.validateHealthBounds} {
		if err := validate(); err != nil {
			return err
		}
	}
	switch {
	case o.GPUResourceName == "":
		return fmt.Errorf("--gpu-resource-name: must not be empty")
	case o.Namespace == "":
		return fmt.Errorf("--namespace: must not be empty")
	case o.PreflightFailuresBeforeBackoff > 0 && o.PreflightFailureWindow <= 0:
		return fmt.Errorf("--preflight-failure-window: must be positive, got %s", o.PreflightFailureWindow)
	}
	return nil
}

// validateObjectLimits checks the limits on the capacity buffers and the
// provisioning requests the autoscaler takes.
func (o Options) validateObjectLimits() error {
	switch {
	case o.MaxCapacityBuffers < 1 || o.MaxCapacityBuffersPerNamespace < 1:
		return fmt.Errorf("--max-capacity-buffers %d, --max-capacity-buffers-per-namespace %d: must be at least 1", o.MaxCapacityBuffers, o.MaxCapacityBuffersPerNamespace)
	case o.MaxProvisioningRequests < 1 || o.MaxProvisioningRequestsPerNamespace < 1:
		return fmt.Errorf("--max-provisioning-requests %d, --max-provisioning-requests-per-namespace %d: must be at least 1", o.MaxProvisioningRequests, o.MaxProvisioningRequestsPerNamespace)
	}
	return nil
}

// validateHealthBounds checks node health's cordoned share and failure
// window.
func (o Options) validateHealthBounds() error {
	switch {
	case !(o.HealthMaxCordonedShare > 0 && o.HealthMaxCordonedShare <= 0.5):
		return fmt.Errorf("--health-max-cordoned-share: must be above 0 and at most 0.5, got %v", o.HealthMaxCordonedShare)
	case o.HealthFailureWindow <= 0 || o.HealthFailureWindow > 24*time.Hour:
		return fmt.Errorf("--health-failure-window: must be positive and at most 24h, got %s", o.HealthFailureWindow)
	}
	return nil
}

// validateParts checks what the loop's parts validate themselves: the
// queue, the balloons (recognised only in their namespace, which must not
// be one where the autoscaler's Deployment rights reach further), the
// preflight gate, the adaptive rate, Spot, the ranges.
func (o Options) validateParts() error {
	checks := []func() error{o.queueOptions().Validate, o.Balloons.Validate,
		func() error { return o.Balloons.ValidateNamespace(o.Namespace) }, o.Preflight.Validate}
	if o.NodeAdditionAdaptive {
		checks = append(checks, func() error { return o.NodeAdditionAdaptiveOptions.Validate(o.NodeAdditionRate) })
	}
	checks = append(checks, o.validateSpot, o.validateRanges)
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// Upper ends of the ranges validateRanges checks: far above any sane value,
// low enough that a wrong unit (10h for 10m, 1500000 for 150) is refused.
const (
	maxWait  = 7 * 24 * time.Hour // timeouts, delays, windows
	maxCount = 100_000            // node and event counts (a 7,500-node cluster is far inside)
)

// validateRanges checks every duration and count, at both ends, after the
// checks above named the common mistakes in their own words.
func (o Options) validateRanges() error {
	ad := o.NodeAdditionAdaptiveOptions
	return bounds.First(
		func() error { return bounds.Duration("--scan-interval", o.ScanInterval, time.Millisecond, time.Hour) },
		func() error { return bounds.Duration("--min-loop-interval", o.MinLoopInterval, 0, time.Hour) },
		func() error {
			return bounds.Duration("--pod-batch-idle-duration", o.PodBatchIdleDuration, 0, time.Hour)
		},
		func() error {
			return bounds.Duration("--pod-batch-max-duration", o.PodBatchMaxDuration, 0, time.Hour)
		},
		func() error {
			return bounds.Duration("--node-group-write-interval", o.NodeGroupWriteInterval, 0, 10*time.Minute)
		},
		func() error { return bounds.Int("--max-nodes-total", o.MaxNodesTotal, 0, maxCount) },
		func() error { return bounds.Duration("--new-pod-scale-up-delay", o.NewPodScaleUpDelay, 0, time.Hour) },
		func() error {
			return bounds.Duration("--max-node-provision-time", o.MaxNodeProvisionTime, time.Millisecond, maxWait)
		},
		func() error {
			return bounds.Duration("--max-node-startup-time", o.MaxNodeStartupTime, time.Millisecond, maxWait)
		},
		func() error {
			return bounds.Duration("--initial-node-group-backoff-duration", o.InitialNodeGroupBackoffDuration, time.Millisecond, maxWait)
		},
		func() error {
			return bounds.Duration("--max-node-group-backoff-duration", o.MaxNodeGroupBackoffDuration, time.Millisecond, maxWait)
		},
		func() error {
			return bounds.Duration("--node-group-backoff-reset-timeout", o.NodeGroupBackoffResetTimeout, time.Millisecond, maxWait)
		},
		func() error { return bounds.Int("--max-pod-events-per-loop", o.MaxPodEventsPerLoop, 0, maxCount) },
		func() error { return bounds.Duration("--pod-event-interval", o.PodEventInterval, 0, maxWait) },
		func() error {
			return bounds.Duration("--scale-down-unneeded-time", o.ScaleDownUnneededTime, 0, maxWait)
		},
		func() error { return bounds.Duration("--scale-down-unready-time", o.ScaleDownUnreadyTime, 0, maxWait) },
		func() error {
			return bounds.Duration("--scale-down-delay-after-add", o.ScaleDownDelayAfterAdd, 0, maxWait)
		},
		func() error {
			return bounds.Duration("--scale-down-delay-after-delete", o.ScaleDownDelayAfterDelete, 0, maxWait)
		},
		func() error {
			return bounds.Duration("--scale-down-delay-after-failure", o.ScaleDownDelayAfterFailure, 0, maxWait)
		},
		func() error {
			return bounds.Int("--max-scale-down-parallelism", o.MaxScaleDownParallelism, 1, maxCount)
		},
		func() error { return bounds.Int("--max-empty-bulk-delete", o.MaxEmptyBulkDelete, 1, maxCount) },
		// A day: far past any real grace period (CA's default is 10 minutes).
		func() error {
			return bounds.Int("--max-graceful-termination-sec", o.MaxGracefulTerminationSec, 0, 86_400)
		},
		func() error {
			return bounds.Duration("--node-delete-delay-after-taint", o.NodeDeleteDelayAfterTaint, 0, time.Hour)
		},
		// At least a minute: a deletion's operation lasts until its VMs
		// are gone; asked again sooner, a slow deletion is sent twice.
		func() error {
			return bounds.Duration("--deletion-lost-after", o.DeletionLostAfter, time.Minute, 24*time.Hour)
		},
		func() error {
			return bounds.Duration("--scale-down-brake-window", o.ScaleDownBrakeWindow, time.Millisecond, maxWait)
		},
		func() error { return bounds.Int("--max-soft-taints-per-loop", o.MaxSoftTaintsPerLoop, 0, maxCount) },
		func() error { return bounds.Int("--ok-total-unready-count", o.OkTotalUnreadyCount, 0, maxCount) },
		func() error {
			return bounds.Int("--replacement-brake-min-nodes", o.ReplacementBrakeMinNodes, 1, maxCount)
		},
		func() error {
			return bounds.Duration("--replacement-brake-window", o.ReplacementBrakeWindow, time.Millisecond, maxWait)
		},
		func() error {
			return bounds.Duration("--preflight-failure-settle", o.PreflightFailureSettle, 0, time.Hour)
		},
		func() error { return bounds.Float("--node-addition-rate", o.NodeAdditionRate, 0, maxCount) },
		func() error { return bounds.Int("--node-addition-burst", o.NodeAdditionBurst, 1, maxCount) },
		func() error { return bounds.Int("--max-nodes-in-flight", o.MaxNodesInFlight, 1, maxCount) },
		func() error { return bounds.Float("--node-addition-rate-min", ad.Min, 0, maxCount) },
		func() error { return bounds.Float("--node-addition-rate-max", ad.Max, 0, maxCount) },
		func() error { return bounds.Float("--node-addition-rate-increase-step", ad.IncreaseStep, 0, maxCount) },
		func() error {
			return bounds.Duration("--node-addition-adaptive-interval", ad.Interval, time.Millisecond, 24*time.Hour)
		},
		func() error {
			return bounds.Duration("--node-addition-latency-threshold", ad.LatencyThreshold, time.Millisecond, time.Hour)
		},
		func() error {
			return bounds.Duration("--max-preflight-time", o.Preflight.MaxPreflightTime, 0, maxWait)
		},
		func() error {
			return bounds.Int("--preflight-failures-before-backoff", o.PreflightFailuresBeforeBackoff, 0, maxCount)
		},
		func() error {
			return bounds.Duration("--preflight-failure-window", o.PreflightFailureWindow, 0, maxWait)
		},
	)
}
