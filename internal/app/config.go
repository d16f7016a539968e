package app

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	apiv1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/bounds"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// Values of --kube-api-content-type and --standby-informers.
const (
	contentTypeProtobuf = "application/vnd.kubernetes.protobuf"
	contentTypeJSON     = "application/json"
	standbyOnLead       = "on-lead"
	standbyWarm         = "warm"
)

// config is everything the binary is configured with.
type config struct {
	core core.Options

	kubeconfig      string
	configFile      string
	configMap       string
	configMapKey    string
	cloudProvider   string
	nodes           []string
	nodeGroupSpecs  []cloudprovider.NodeGroupSpec
	expander        string
	gpuResourceName string
	kubeClientQPS   float32
	kubeClientBurst int
	// kubeAPIContentType is what the clients of built-in types speak;
	// CRDs and dynamic clients always speak JSON.
	kubeAPIContentType string
	// standbyInformers says when a replica that is not the leader starts
	// its pod, node and other informers: standbyWarm at start,
	// standbyOnLead when it becomes the leader.
	standbyInformers string

	apiserverMetricsInterval time.Duration
	preflightTaint           string
	warmPools                []string

	address        string
	secureAddress  string
	tlsCertFile    string
	tlsKeyFile     string
	maxInactivity  time.Duration
	maxFailingTime time.Duration

	leaderElect         bool
	leaseDuration       time.Duration
	renewDeadline       time.Duration
	retryPeriod         time.Duration
	leaderElectResource string
}

// newFlagSet defines the flags. Names follow cluster-autoscaler's where the
// meaning is the same.
func newFlagSet(c *config) *pflag.FlagSet {
	d := core.DefaultOptions()
	c.core = d
	// Each flag is defined on fs, restart-only, or on live: a new value of
	// a live flag in the flags ConfigMap takes effect at the next loop; any
	// other needs a restart (it is bound to informers, clients or objects
	// made at start).
	fs := pflag.NewFlagSet("vmss-autoscaler", pflag.ContinueOnError)
	fs.SortFlags = false
	live := pflag.NewFlagSet("live", pflag.ContinueOnError)
	live.SortFlags = false
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage:
  vmss-autoscaler [flags]             run the autoscaler
  vmss-autoscaler preflight [flags]   run the preflight agent on a node (preflight --help)
  vmss-autoscaler status [flags]      print what the autoscaler thinks, per node group (status --help)
  vmss-autoscaler --version           print the version and commit

Flags (each may also be a key of the --config file or of the --config-map
YAML, except those marked "command line only"):
`)
		fs.PrintDefaults()
	}
	for _, add := range []func(fs, live *pflag.FlagSet, c *config, d core.Options){
		commandFlags,
		loopFlags,
		statusAndHealthFlags,
		scaleDownFlags,
		nodeAdditionFlags,
		readinessAndBalloonFlags,
		apiAndServingFlags,
	} {
		add(fs, live, c, d)
	}
	markLive(live)
	fs.AddFlagSet(live)
	return fs
}

// commandFlags defines the flags of where the autoscaler runs: its configuration, the API server, the cloud and its node groups.
func commandFlags(fs, live *pflag.FlagSet, c *config, d core.Options) {
	fs.StringVar(&c.configFile, "config", "", "YAML file whose keys are flag names (the Helm chart mounts its ConfigMap here); flags given on the command line win; a command-line-only key refuses the file")
	fs.StringVar(&c.configMap, "config-map", "", "ConfigMap (in --namespace) of flag values, watched through the API: live keys take effect on the next loop without a restart; empty: not watched")
	fs.StringVar(&c.configMapKey, "config-map-key", "config.yaml", "key of --config-map holding the YAML of flag values")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file; empty for in-cluster configuration")
	fs.Float32Var(&c.kubeClientQPS, "kube-client-qps", 20, "QPS of the Kubernetes client")
	fs.IntVar(&c.kubeClientBurst, "kube-client-burst", 40, "burst of the Kubernetes client")
	fs.StringVar(&c.kubeAPIContentType, "kube-api-content-type", contentTypeProtobuf, "content type of requests for built-in types: "+contentTypeProtobuf+" or "+contentTypeJSON+" (CRDs always use JSON)")
	fs.StringVar(&c.cloudProvider, "cloud-provider", "azure", "cloud provider (azure)")
	fs.StringArrayVar(&c.nodes, "nodes", nil, "node group as min:max:<scale set>, or min:max:<resource group>/<scale set> where scale sets of that name are in several resource groups; repeat for each group")
}

// loopFlags defines the flags of the loop and scale-up.
func loopFlags(fs, live *pflag.FlagSet, c *config, d core.Options) {
	live.DurationVar(&c.core.ScanInterval, "scan-interval", d.ScanInterval, "most time between loop starts: the floor under the loops woken by events")
	live.BoolVar(&c.core.FrequentLoops, "frequent-loops-enabled", d.FrequentLoops, "wake the loop on events besides --scan-interval: new unschedulable pods (after the batching window), a node turning usable while nodes are queued, a scale-up the cloud refused, a live reload")
	live.DurationVar(&c.core.MinLoopInterval, "min-loop-interval", d.MinLoopInterval, "least time between loop starts, whatever wakes them (a shorter --scan-interval wins)")
	live.DurationVar(&c.core.PodBatchIdleDuration, "pod-batch-idle-duration", d.PodBatchIdleDuration, "new unschedulable pods wake a loop once none came for this long (so a Job's or a gang's pods are planned together)...")
	live.DurationVar(&c.core.PodBatchMaxDuration, "pod-batch-max-duration", d.PodBatchMaxDuration, "...or this long after the first of them, whichever comes first")
	live.DurationVar(&c.core.NodeGroupWriteInterval, "node-group-write-interval", d.NodeGroupWriteInterval, "least time between two releases of single-node demand to one node group with smoothing on (each a scale-set write, charged to the scale set's Update policy: 12 refilled 4 a minute), and between a loop that asked for nodes and a follow-up loop; 0 for no pacing")
	live.BoolVar(&c.core.ScaleUpForExpectedPods, "scale-up-for-expected-pods", d.ScaleUpForExpectedPods, "once some of a ReplicaSet's pods are unschedulable, plan nodes for the replicas it has yet to create too (copies of those pods)")
	live.IntVar(&c.core.MaxNodesTotal, "max-nodes-total", d.MaxNodesTotal, "maximum number of nodes in the cluster, 0 for no limit")
	live.StringVar(&c.expander, "expander", strings.Join(d.Expanders, ","), "expander chain, comma-separated: "+strings.Join(scaleup.ValidExpanders(), ", "))
	live.DurationVar(&c.core.NewPodScaleUpDelay, "new-pod-scale-up-delay", d.NewPodScaleUpDelay, "pods younger than this do not trigger a scale-up yet (the pod batching window already waits for a burst to end)")
	live.DurationVar(&c.core.MaxNodeProvisionTime, "max-node-provision-time", d.MaxNodeProvisionTime, "time a new machine may take to register as a node")
	live.DurationVar(&c.core.MaxNodeStartupTime, "max-node-startup-time", d.MaxNodeStartupTime, "time a registered node may stay not ready before it counts as unready")
	live.DurationVar(&c.core.InitialNodeGroupBackoffDuration, "initial-node-group-backoff-duration", d.InitialNodeGroupBackoffDuration, "first backoff of a group after a failed scale-up")
	live.DurationVar(&c.core.MaxNodeGroupBackoffDuration, "max-node-group-backoff-duration", d.MaxNodeGroupBackoffDuration, "longest backoff of a group (quota errors go straight to it)")
	live.DurationVar(&c.core.NodeGroupBackoffResetTimeout, "node-group-backoff-reset-timeout", d.NodeGroupBackoffResetTimeout, "a group with no failure for this long starts its backoff afresh")
	fs.StringVar(&c.gpuResourceName, "gpu-resource-name", string(d.GPUResourceName), "extended resource counted as GPUs")
	live.BoolVar(&c.core.GPUGroupsForGPUPodsOnly, "gpu-groups-for-gpu-pods-only", d.GPUGroupsForGPUPodsOnly, "pods that request no GPU never scale up groups of GPU machines")
}

// statusAndHealthFlags defines the flags of the status, the expander and health policy ConfigMaps, node health and pod events.
func statusAndHealthFlags(fs, live *pflag.FlagSet, c *config, d core.Options) {
	fs.StringVar(&c.core.Namespace, "namespace", d.Namespace, "namespace of the status, priority and leader-election objects")
	fs.StringVar(&c.core.StatusConfigMapName, "status-config-map-name", d.StatusConfigMapName, "name of the status ConfigMap")
	fs.BoolVar(&c.core.WriteStatusConfigMap, "write-status-configmap", d.WriteStatusConfigMap, "write the status ConfigMap")
	fs.StringVar(&c.core.PriorityConfigMapName, "priority-expander-configmap", d.PriorityConfigMapName, "ConfigMap of the priority expander (key \"priorities\", CA's format)")
	fs.StringVar(&c.core.HealthPolicyConfigMapName, "health-policy-configmap", d.HealthPolicyConfigMapName, "ConfigMap of the passive node health policy (key \"policy\", docs/concepts/health-policy.md), read live; absent: the built-in policy; annotated vmss-autoscaler.io/health-paused=true: reports only")
	live.Float64Var(&c.core.HealthMaxCordonedShare, "health-max-cordoned-share", d.HealthMaxCordonedShare, "at most this share of the nodes health handling judges (and at least 2) hold a health cordon at once; past it, matches are reported only, with an event")
	live.IntVar(&c.core.HealthIncidentMinNodes, "health-incident-min-nodes", d.HealthIncidentMinNodes, "health incident: when at least this many nodes...")
	live.Float64Var(&c.core.HealthIncidentClusterShare, "health-incident-cluster-share", d.HealthIncidentClusterShare, "...and at least this share of the judged nodes begin matching the same health rule within --health-incident-window, the signal is suspect (a monitor's false alarm, a bad rollout): the rule's matches are reported only, nothing cordoned, drained or replaced, until fewer match it for the policy's stormCooldown, with an event")
	live.DurationVar(&c.core.HealthIncidentWindow, "health-incident-window", d.HealthIncidentWindow, "the window of --health-incident-min-nodes")
	live.IntVar(&c.core.HealthFailuresBeforeBackoff, "health-failures-before-backoff", d.HealthFailuresBeforeBackoff, "this many nodes of a group younger than --health-failure-window admitted for a drain or replacement within it (or held by its breaker and bought after it was first seen failing; each counted once) back the group off (its new nodes keep going bad); 0 never")
	live.DurationVar(&c.core.HealthFailureWindow, "health-failure-window", d.HealthFailureWindow, "window of --health-failures-before-backoff")
	live.IntVar(&c.core.MaxPodEventsPerLoop, "max-pod-events-per-loop", d.MaxPodEventsPerLoop, "cap on pod events (TriggeredScaleUp, NotTriggerScaleUp) written per loop")
	live.DurationVar(&c.core.PodEventInterval, "pod-event-interval", d.PodEventInterval, "an unchanged event for the same pod is repeated at most this often")
}

// scaleDownFlags defines the flags of scale-down, its brakes and the replacement brake.
func scaleDownFlags(fs, live *pflag.FlagSet, c *config, d core.Options) {
	live.BoolVar(&c.core.ScaleDownEnabled, "scale-down-enabled", d.ScaleDownEnabled, "remove unneeded nodes")
	live.Float64Var(&c.core.ScaleDownUtilizationThreshold, "scale-down-utilization-threshold", d.ScaleDownUtilizationThreshold, "a node whose highest CPU or memory request share is below this may be removed")
	live.Float64Var(&c.core.ScaleDownGPUUtilizationThreshold, "scale-down-gpu-utilization-threshold", d.ScaleDownGPUUtilizationThreshold, "the same for GPU nodes, GPUs included")
	live.DurationVar(&c.core.ScaleDownUnneededTime, "scale-down-unneeded-time", d.ScaleDownUnneededTime, "how long a node must be unneeded before it is removed")
	live.DurationVar(&c.core.ScaleDownUnreadyTime, "scale-down-unready-time", d.ScaleDownUnreadyTime, "how long an unready node must be unneeded before it is removed")
	live.DurationVar(&c.core.ScaleDownDelayAfterAdd, "scale-down-delay-after-add", d.ScaleDownDelayAfterAdd, "no scale-down in a group for this long after it scaled up")
	live.DurationVar(&c.core.ScaleDownDelayAfterDelete, "scale-down-delay-after-delete", d.ScaleDownDelayAfterDelete, "no scale-down for this long after a node was removed")
	live.DurationVar(&c.core.ScaleDownDelayAfterFailure, "scale-down-delay-after-failure", d.ScaleDownDelayAfterFailure, "no scale-down for this long after a removal failed")
	live.IntVar(&c.core.MaxScaleDownParallelism, "max-scale-down-parallelism", d.MaxScaleDownParallelism, "nodes drained at once")
	live.IntVar(&c.core.MaxEmptyBulkDelete, "max-empty-bulk-delete", d.MaxEmptyBulkDelete, "empty nodes removed per loop")
	live.IntVar(&c.core.MaxGracefulTerminationSec, "max-graceful-termination-sec", d.MaxGracefulTerminationSec, "cap on a pod's graceful termination when draining")
	live.DurationVar(&c.core.DeletionLostAfter, "deletion-lost-after", d.DeletionLostAfter, "how long a machine whose deletion the cloud accepted may still run (listed and not deleting, or its node Ready) before the deletion is taken as lost and asked again, on every replacement path (health, preflight, failed machines; a machine the cloud lists deleting is never lost); at least 1m")
	live.DurationVar(&c.core.NodeDeleteDelayAfterTaint, "node-delete-delay-after-taint", d.NodeDeleteDelayAfterTaint, "how long a node carries its ToBeDeleted taint before its machine is deleted; a pod bound to it meanwhile keeps it")
	live.BoolVar(&c.core.SkipNodesWithSystemPods, "skip-nodes-with-system-pods", d.SkipNodesWithSystemPods, "keep nodes running kube-system pods that have no PodDisruptionBudget")
	live.BoolVar(&c.core.SkipNodesWithLocalStorage, "skip-nodes-with-local-storage", d.SkipNodesWithLocalStorage, "keep nodes running pods with emptyDir or hostPath volumes")
	live.Float64Var(&c.core.ScaleDownBrakeClusterShare, "scale-down-brake-cluster-share", d.ScaleDownBrakeClusterShare, "safety brake: at most this share of the cluster's nodes removed within --scale-down-brake-window")
	live.Float64Var(&c.core.ScaleDownBrakeGroupShare, "scale-down-brake-group-share", d.ScaleDownBrakeGroupShare, "safety brake: at most this share of a group's nodes removed within the window")
	live.DurationVar(&c.core.ScaleDownBrakeWindow, "scale-down-brake-window", d.ScaleDownBrakeWindow, "the safety brake's window")
	live.Float64Var(&c.core.ScaleDownMaxUnreadyShare, "scale-down-max-unready-share", d.ScaleDownMaxUnreadyShare, "a group with more unready nodes than this share (and more than 3) is not scaled down; other groups are")
	live.Float64Var(&c.core.MaxTotalUnreadyPercentage, "max-total-unready-percentage", d.MaxTotalUnreadyPercentage, "when more than this percentage of managed nodes (and more than --ok-total-unready-count) is unready, nothing is deleted, cordoned or drained: no scale-down, no replacement; scale-up goes on")
	live.IntVar(&c.core.OkTotalUnreadyCount, "ok-total-unready-count", d.OkTotalUnreadyCount, "unready nodes always tolerated by the cluster-wide unready guard")
	live.Float64Var(&c.core.ReplacementBrakeClusterShare, "replacement-brake-cluster-share", d.ReplacementBrakeClusterShare, "replacement brake: deletions that are not scale-down (failed preflight, machines in error or never registered) at most this share of the cluster's target per --replacement-brake-window...")
	live.IntVar(&c.core.ReplacementBrakeMinNodes, "replacement-brake-min-nodes", d.ReplacementBrakeMinNodes, "...or this many, whichever is larger; past it they wait (cordoned), with an event")
	live.DurationVar(&c.core.ReplacementBrakeWindow, "replacement-brake-window", d.ReplacementBrakeWindow, "the replacement brake's window")
	live.IntVar(&c.core.PreflightIncidentMinNodes, "preflight-incident-min-nodes", d.PreflightIncidentMinNodes, "preflight incident: when at least this many nodes...")
	live.Float64Var(&c.core.PreflightIncidentClusterShare, "preflight-incident-cluster-share", d.PreflightIncidentClusterShare, "...and at least this share of the cluster's target fail the same check within --preflight-incident-window, the check's target is broken, not the machines: nodes failing it are not cordoned, drained or deleted until fewer fail it, with an event")
	live.DurationVar(&c.core.PreflightIncidentWindow, "preflight-incident-window", d.PreflightIncidentWindow, "the window of --preflight-incident-min-nodes")
	live.DurationVar(&c.core.PreflightFailureSettle, "preflight-failure-settle", d.PreflightFailureSettle, "how long a node's preflight failure stands before the node is drained or deleted (a node its periodic re-run failed is cordoned at once, fewer than the incident threshold at a time), and how long fewer than the threshold fail a check before its incident ends: an outage's failures, reported one by one, are seen as one incident first (0: act at once)")
	live.IntVar(&c.core.MaxSoftTaintsPerLoop, "max-soft-taints-per-loop", d.MaxSoftTaintsPerLoop, "cap on DeletionCandidate taint writes per loop")
}

// nodeAdditionFlags defines the flags of smoothing: the node-addition queue and its adaptive rate.
func nodeAdditionFlags(fs, live *pflag.FlagSet, c *config, d core.Options) {
	live.BoolVar(&c.core.NodeAdditionSmoothing, "node-addition-smoothing", d.NodeAdditionSmoothing, "send new nodes to the cloud through the rate-limited node-addition queue (off: every planned node at once)")
	live.Float64Var(&c.core.NodeAdditionRate, "node-addition-rate", d.NodeAdditionRate, "nodes requested per minute at most (the adaptive mode's starting rate)")
	live.IntVar(&c.core.NodeAdditionBurst, "node-addition-burst", d.NodeAdditionBurst, "nodes that may be requested at once after a quiet period (a loop releases up to the rate times its period, at most twice --scan-interval, when that is more)")
	live.IntVar(&c.core.MaxNodesInFlight, "max-nodes-in-flight", d.MaxNodesInFlight, "cap on nodes requested and not yet ready")
	live.BoolVar(&c.core.NodeAdditionAdaptive, "node-addition-adaptive", d.NodeAdditionAdaptive, "move the node-addition rate with the API server's health: halve it on 429s, 5xx, slow requests or flow-control rejections, raise it while healthy")
	ad := &c.core.NodeAdditionAdaptiveOptions
	live.Float64Var(&ad.Min, "node-addition-rate-min", ad.Min, "adaptive mode: lowest rate, nodes per minute")
	live.Float64Var(&ad.Max, "node-addition-rate-max", ad.Max, "adaptive mode: highest rate, nodes per minute")
	live.Float64Var(&ad.DecreaseFactor, "node-addition-rate-decrease-factor", ad.DecreaseFactor, "adaptive mode: the rate is multiplied by this on trouble")
	live.Float64Var(&ad.IncreaseStep, "node-addition-rate-increase-step", ad.IncreaseStep, "adaptive mode: nodes per minute added to the rate per healthy interval while the rate holds demand back")
	live.DurationVar(&ad.Interval, "node-addition-adaptive-interval", ad.Interval, "adaptive mode: how often the rate is reconsidered")
	live.DurationVar(&ad.LatencyThreshold, "node-addition-latency-threshold", ad.LatencyThreshold, "adaptive mode: a request of the autoscaler slower than this is slow; more than 10% slow is trouble")
	fs.DurationVar(&c.apiserverMetricsInterval, "apiserver-metrics-interval", 30*time.Second, "adaptive mode: how often the API server's /metrics is read for apiserver_flowcontrol_rejected_requests_total (needs get on the non-resource URL /metrics); 0 to never read it")
}

// readinessAndBalloonFlags defines the flags of preflight, Spot, balloons, taints and gangs.
func readinessAndBalloonFlags(fs, live *pflag.FlagSet, c *config, d core.Options) {
	pf := &c.core.Preflight
	live.BoolVar(&pf.Enabled, "preflight-enabled", pf.Enabled, "treat nodes carrying the preflight taint as coming capacity until the preflight agent passes them, and replace the ones that fail")
	live.StringVar(&c.preflightTaint, "preflight-taint", pf.Taint.Key+"="+pf.Taint.Value+":"+string(pf.Taint.Effect), "taint new nodes join with until they pass preflight (key=value:Effect; key and effect identify it)")
	live.StringVar(&pf.Label, "preflight-label", pf.Label, "node label holding pending|passed|failed")
	live.StringVar(&pf.FailureAnnotation, "preflight-failure-annotation", pf.FailureAnnotation, "node annotation where the agent writes why a node failed")
	live.DurationVar(&pf.MaxPreflightTime, "max-preflight-time", pf.MaxPreflightTime, "a node still pending preflight this long after it registered counts as failed and is replaced")
	live.IntVar(&c.core.PreflightFailuresBeforeBackoff, "preflight-failures-before-backoff", d.PreflightFailuresBeforeBackoff, "this many preflight failures in a group within --preflight-failure-window back the group off; 0 never")
	live.DurationVar(&c.core.PreflightFailureWindow, "preflight-failure-window", d.PreflightFailureWindow, "window of --preflight-failures-before-backoff")
	live.IntVar(&c.core.SpotEvictionBackoffCount, "spot-eviction-backoff-count", d.SpotEvictionBackoffCount, "this many machines of a group evicted by the cloud (Azure Spot) within --spot-eviction-window back the group off, so scale-up buys other groups (the priority expander's next); 0 never")
	live.DurationVar(&c.core.SpotEvictionWindow, "spot-eviction-window", d.SpotEvictionWindow, "window of --spot-eviction-backoff-count")
	bo := &c.core.Balloons
	live.BoolVar(&c.core.BalloonAware, "balloon-aware", d.BalloonAware, "treat balloon pods' room as free: real pods that fit by preempting balloons buy no node, balloons never keep a node needed")
	live.StringArrayVar(&c.warmPools, "warm-pool", nil, "warm nodes held by balloons for a node group: "+balloon.PolicyFormat+"; repeat per group (the percentage is of the group's target size)")
	fs.StringVar(&bo.Label, "balloon-label", bo.Label, "label marking balloon pods (value: the node group)")
	fs.StringVar(&bo.PriorityClassName, "balloon-priority-class", bo.PriorityClassName, "PriorityClass of balloon pods (created if missing, preemptionPolicy Never)")
	fs.Int32Var(&bo.PriorityValue, "balloon-priority-value", bo.PriorityValue, "value of that PriorityClass; negative")
	fs.StringVar(&bo.Image, "balloon-image", bo.Image, "image of the balloon pods' container")
	fs.Int32Var(&bo.MaxReplicas, "balloon-max-replicas", bo.MaxReplicas, "at most this many balloons a node group (a warm pool is cut to it); the chart's admission policy refuses more")
	fs.StringVar(&bo.Namespace, "balloon-namespace", bo.Namespace, "namespace of the balloon Deployments")
	fs.StringVar(&bo.NodeGroupLabel, "balloon-node-group-label", bo.NodeGroupLabel, "node label naming a node's group, which balloons are pinned by (set from the scale set's tags)")
	live.BoolVar(&c.core.BorrowersScaleTeamGroups, "borrowers-scale-team-groups", d.BorrowersScaleTeamGroups, "let pods that tolerate a team's taint only through a catch-all toleration grow that team's node group")
	live.StringArrayVar(&c.core.StatusTaints, "status-taint", nil, "taint key a separate manager puts on live nodes, stripped from node templates; repeatable")
	live.StringArrayVar(&c.core.StartupTaints, "startup-taint", d.StartupTaints, "taint key an agent removes once a new node is set up: a node carrying one is coming capacity, not ready capacity, and templates never carry it (keys with the prefix "+clusterstate.StartupTaintPrefix+" are startup taints too); repeatable")
	live.BoolVar(&c.core.GangSplit, "gang-allow-split", d.GangSplit, "let a gang span several node groups when no single group can take it (one group, same fabric, is always preferred)")
}

// apiAndServingFlags defines the flags of the capacity APIs, the listeners, /healthz and leader election.
func apiAndServingFlags(fs, live *pflag.FlagSet, c *config, d core.Options) {
	fs.BoolVar(&c.core.ProvisioningRequests, "enable-provisioning-requests", d.ProvisioningRequests, "serve ProvisioningRequests (autoscaling.x-k8s.io/v1, e.g. from Kueue's admission check): check-capacity and best-effort-atomic-scale-up, with booked capacity; needs their CRD (without it, logged and off)")
	live.IntVar(&c.core.MaxCapacityBuffers, "max-capacity-buffers", d.MaxCapacityBuffers, "at most this many CapacityBuffers planned a loop, in all (taken oldest first, the namespaces in turn); the rest are counted in the status, not planned")
	live.IntVar(&c.core.MaxCapacityBuffersPerNamespace, "max-capacity-buffers-per-namespace", d.MaxCapacityBuffersPerNamespace, "at most this many CapacityBuffers of one namespace planned a loop: one tenant's buffers cannot crowd out another's")
	live.IntVar(&c.core.MaxProvisioningRequests, "max-provisioning-requests", d.MaxProvisioningRequests, "at most this many live ProvisioningRequests planned a loop, in all: booked ones always, the rest oldest first, the namespaces in turn; those left out say so (Provisioned=False, RequestLimitReached) and wait")
	live.IntVar(&c.core.MaxProvisioningRequestsPerNamespace, "max-provisioning-requests-per-namespace", d.MaxProvisioningRequestsPerNamespace, "at most this many live ProvisioningRequests of one namespace planned a loop: one tenant's requests cannot crowd out another's")
	fs.BoolVar(&c.core.CapacityBuffers, "enable-capacity-buffers", d.CapacityBuffers, "serve CapacityBuffers (autoscaling.x-k8s.io/v1beta1, strategy buffer.x-k8s.io/active-capacity): each buffer's chunks hold room on ready nodes or buy nodes at the queue's lowest class; needs their CRD (the chart's crds/; without it, logged and off)")
	fs.StringVar(&c.address, "address", "127.0.0.1:8085", "address of the plain (unauthenticated) /metrics and /healthz: loopback by default; give the pod IP to open it to the network")
	fs.StringVar(&c.secureAddress, "secure-address", "", "address of /metrics and /healthz over TLS, with the API server's delegated authentication (TokenReview) and authorization (SubjectAccessReview: get on the non-resource URL); /healthz is open to the kubelet's probes; empty: off")
	fs.StringVar(&c.tlsCertFile, "tls-cert-file", "", "serving certificate (PEM) of --secure-address; empty with --tls-private-key-file: a self-signed one made at start")
	fs.StringVar(&c.tlsKeyFile, "tls-private-key-file", "", "private key (PEM) of --tls-cert-file")
	fs.DurationVar(&c.maxInactivity, "max-inactivity", 10*time.Minute, "/healthz fails when no loop has run for this long")
	fs.DurationVar(&c.maxFailingTime, "max-failing-time", 15*time.Minute, "/healthz fails when no loop has succeeded for this long")
	fs.BoolVar(&c.leaderElect, "leader-elect", true, "run leader election on a Lease; only the leader acts")
	fs.DurationVar(&c.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "leader election lease duration")
	fs.DurationVar(&c.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "leader election renew deadline")
	fs.DurationVar(&c.retryPeriod, "leader-elect-retry-period", 2*time.Second, "leader election retry period")
	fs.StringVar(&c.leaderElectResource, "leader-elect-resource-name", "vmss-autoscaler", "name of the leader election Lease")
	fs.StringVar(&c.standbyInformers, "standby-informers", standbyOnLead, "when a replica starts its pod and node informers: "+standbyOnLead+" (once it leads: no second watch of every pod, failover adds a full LIST) or "+standbyWarm+" (at start: fast failover, twice the watches and memory); the flags ConfigMap is always watched")
}

// commandLineOnly are the flags that decide who the autoscaler is, where
// its credentials are sent and what it runs on the nodes, with why. The
// --config file and the flags ConfigMap are the same ConfigMap, which
// whoever may edit it rewrites without touching the Deployment: such a key
// there, or in the last good configuration stored from it, refuses the
// whole file, naming the key. The provider's flags are defined in
// clients.go (providerFlags); TestCommandLineOnlyFlagsClassified makes every
// azure-*, image and kubeconfig flag be here or named as not privileged,
// and the chart keeps the same list (vmss-autoscaler.commandLineOnlyKeys)
// to pass these keys of its values as arguments.
var commandLineOnly = map[string]string{
	"azure-arm-endpoint":       "it decides where the Azure credential is sent",
	"azure-authority-host":     "it decides where the federated token or client secret is sent for an Azure token",
	"azure-token-audience":     "it decides which resource the Azure token is requested for",
	"azure-ca-file":            "it decides which servers are trusted with the Azure credential",
	"azure-token-file":         "it decides which file is sent as the Azure bearer token",
	"azure-client-secret-file": "it decides which file is sent as the Azure client secret",
	"azure-auth":               "it decides which Azure credential is used",
	"azure-tenant-id":          "it decides which Azure identity is used",
	"azure-client-id":          "it decides which Azure identity is used",
	"azure-subscription-id":    "it decides which subscription the Azure credential acts on",
	"kubeconfig":               "it decides where the Kubernetes credential is sent, and which one",
	"balloon-image":            "it decides what code runs in the balloon pods on the nodes",
	"balloon-max-replicas":     "it decides how many balloons a Deployment may hold, which the chart's admission policy is rendered from",
	// Who leads: a replica with its own view of these can lead beside
	// another, both writing to the cloud unfenced.
	"leader-elect":                "it decides whether a replica acts without holding the Lease: two such replicas both write to the cloud",
	"leader-elect-lease-duration": "it decides how long a leader's Lease holds unrenewed: replicas that disagree can both lead",
	"leader-elect-renew-deadline": "it decides how long a leader acts without renewing its Lease: replicas that disagree can both lead",
	"leader-elect-retry-period":   "it decides how often a standby tries the Lease: replicas that disagree can both lead",
	"leader-elect-resource-name":  "it decides which Lease fences the replicas: two names, two leaders",
	// APIs the chart grants RBAC for with them: on without the grant, the
	// autoscaler waits for ever on an informer the API server refuses.
	"enable-provisioning-requests": "it decides which APIs are watched, which needs the RBAC the chart grants with it",
	"enable-capacity-buffers":      "it decides which APIs are watched, which needs the RBAC the chart grants with it",
	// klog's outputs: where the logs go (out of kubectl logs, or onto the
	// pod's disk).
	"log_dir":           "it decides where the logs are written",
	"log_file":          "it decides where the logs are written",
	"log_file_max_size": "it decides where the logs are written (when a log file is cut)",
	"logtostderr":       "it decides where the logs are written",
	"alsologtostderr":   "it decides where the logs are written",
	"one_output":        "it decides where the logs are written",
	"stderrthreshold":   "it decides which logs reach the container's output",
}

// commandLineOnlyError is the refusal of key name in a flags file.
func commandLineOnlyError(name string) string {
	return fmt.Sprintf("--%s: may be set on the command line only (%s)", name, commandLineOnly[name])
}

// markCommandLineOnly says so in the help of the command-line-only flags
// fs defines.
func markCommandLineOnly(fs *pflag.FlagSet) {
	for name := range commandLineOnly {
		if f := fs.Lookup(name); f != nil && !strings.Contains(f.Usage, "(command line only") {
			f.Usage += " (command line only: " + commandLineOnly[name] + ")"
		}
	}
}

// parseConfig parses the command line, then the --config file for flags the
// command line did not set, then validates. Every error names the flag (or
// config key) and the value.
func parseConfig(args []string, extra func(*pflag.FlagSet)) (*config, error) {
	c, _, err := parseConfigFrom(args, extra, nil, "")
	return c, err
}

// parseConfigFrom parses the command line, then a YAML map of flag names:
// data when given (the live flags ConfigMap, named by source), else the
// --config file. It returns the flag set too, to compare reloads.
func parseConfigFrom(args []string, extra func(*pflag.FlagSet), data []byte, source string) (*config, *pflag.FlagSet, error) {
	c := &config{}
	fs := newFlagSet(c)
	if extra != nil {
		extra(fs)
	}
	markCommandLineOnly(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	switch {
	case data != nil:
		if err := applyConfig(fs, data, source); err != nil {
			return nil, nil, err
		}
	case c.configFile != "":
		if err := applyConfigFile(fs, c.configFile); err != nil {
			return nil, nil, err
		}
	}
	if err := c.finish(); err != nil {
		return nil, nil, err
	}
	return c, fs, nil
}

// finish derives and validates what the flags describe.
func (c *config) finish() error {
	if err := c.deriveCore(); err != nil {
		return err
	}
	specs, err := cloudprovider.ParseNodeGroupSpecs(c.nodes)
	if err != nil {
		return err
	}
	c.nodeGroupSpecs = specs
	if err := c.validateLeaderElection(); err != nil {
		return err
	}
	if err := c.validateChoices(); err != nil {
		return err
	}
	if err := c.validateServers(); err != nil {
		return err
	}
	return c.validateRanges()
}

// deriveCore sets the loop's options the flags describe in their own
// words (expanders, GPU resource, preflight taint, warm pools) and
// validates them.
func (c *config) deriveCore() error {
	c.core.Expanders = splitList(c.expander)
	c.core.GPUResourceName = apiv1.ResourceName(c.gpuResourceName)
	taint, err := preflight.ParseTaint("--preflight-taint", c.preflightTaint)
	if err != nil {
		return err
	}
	c.core.Preflight.Taint = taint
	c.core.Balloons.PreflightTaintKey = taint.Key
	if c.core.WarmPools, err = balloon.ParsePolicies("--warm-pool", c.warmPools); err != nil {
		return err
	}
	if err := c.core.Validate(); err != nil {
		return err
	}
	_, err = scaleup.NewChain(c.core.Expanders, c.core.GPUResourceName, nil, nil)
	return err
}

// validateLeaderElection checks the lease's durations in order: lease >
// renew > retry > 0.
func (c *config) validateLeaderElection() error {
	if c.leaderElect && !(c.leaseDuration > c.renewDeadline && c.renewDeadline > c.retryPeriod && c.retryPeriod > 0) {
		return fmt.Errorf("--leader-elect-lease-duration %s, --leader-elect-renew-deadline %s, --leader-elect-retry-period %s: want lease > renew > retry > 0",
			c.leaseDuration, c.renewDeadline, c.retryPeriod)
	}
	return nil
}

// validateChoices checks the flags that name one of a few choices.
func (c *config) validateChoices() error {
	switch c.kubeAPIContentType {
	case contentTypeProtobuf, contentTypeJSON:
	default:
		return fmt.Errorf("--kube-api-content-type=%q: want %s or %s", c.kubeAPIContentType, contentTypeProtobuf, contentTypeJSON)
	}
	switch c.standbyInformers {
	case standbyOnLead, standbyWarm:
	default:
		return fmt.Errorf("--standby-informers=%q: want %s or %s", c.standbyInformers, standbyOnLead, standbyWarm)
	}
	return nil
}

// validateServers checks the servers' flags: /healthz's thresholds, the
// secure server's certificate and address.
func (c *config) validateServers() error {
	if c.maxInactivity <= 0 || c.maxFailingTime <= 0 {
		return fmt.Errorf("--max-inactivity %s, --max-failing-time %s: must be positive", c.maxInactivity, c.maxFailingTime)
	}
	if (c.tlsCertFile == "") != (c.tlsKeyFile == "") {
		return fmt.Errorf("--tls-cert-file=%q, --tls-private-key-file=%q: give both or neither", c.tlsCertFile, c.tlsKeyFile)
	}
	if c.secureAddress != "" && c.secureAddress == c.address {
		return fmt.Errorf("--secure-address=%s: the same as --address", c.secureAddress)
	}
	return nil
}

// validateRanges checks the binary's own durations and counts at both ends
// (core.Options.Validate checks the loop's).
func (c *config) validateRanges() error {
	const day = 24 * time.Hour
	return bounds.First(
		func() error { return bounds.Float("--kube-client-qps", float64(c.kubeClientQPS), 0.1, 100_000) },
		func() error { return bounds.Int("--kube-client-burst", c.kubeClientBurst, 1, 100_000) },
		func() error {
			return bounds.Duration("--apiserver-metrics-interval", c.apiserverMetricsInterval, 0, day)
		},
		func() error { return bounds.Duration("--max-inactivity", c.maxInactivity, time.Second, 7*day) },
		func() error { return bounds.Duration("--max-failing-time", c.maxFailingTime, time.Second, 7*day) },
		func() error {
			return bounds.Duration("--leader-elect-lease-duration", c.leaseDuration, time.Millisecond, time.Hour)
		},
		func() error {
			return bounds.Duration("--leader-elect-renew-deadline", c.renewDeadline, time.Millisecond, time.Hour)
		},
		func() error {
			return bounds.Duration("--leader-elect-retry-period", c.retryPeriod, time.Millisecond, time.Hour)
		},
	)
}

// applyConfigFile sets, from a YAML map of flag name to value (a list for
// repeatable flags), every flag the command line left unset.
func applyConfigFile(fs *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config=%s: %w", path, err)
	}
	return applyConfig(fs, data, "--config="+path)
}

// applyConfig sets flags from YAML data; errors name source, key and value.
// A key only the command line may set (commandLineOnly) refuses it all.
func applyConfig(fs *pflag.FlagSet, data []byte, source string) error {
	path := source
	raw := map[string]any{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("%s: not a YAML map of flag names to values: %w", path, err)
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Keys only the command line may set refuse the whole file, all named,
	// before anything else is looked at.
	if err := refuseCommandLineOnly(path, keys); err != nil {
		return err
	}
	for _, k := range keys {
		if err := applyConfigKey(fs, path, k, raw[k]); err != nil {
			return err
		}
	}
	return nil
}

// refuseCommandLineOnly names, in one error, the keys of the file at path
// that only the command line may set.
func refuseCommandLineOnly(path string, keys []string) error {
	var refused []string
	for _, k := range keys {
		if name := strings.TrimPrefix(k, "--"); commandLineOnly[name] != "" {
			refused = append(refused, commandLineOnlyError(name))
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("%s: %s", path, strings.Join(refused, "; "))
	}
	return nil
}

// applyConfigKey sets the flag of key k (its name, "--" optional) to
// value, a scalar or a list, unless the command line set it.
func applyConfigKey(fs *pflag.FlagSet, path, k string, value any) error {
	name := strings.TrimPrefix(k, "--")
	f := fs.Lookup(name)
	if f == nil || name == "config" {
		return fmt.Errorf("%s: unknown key %q (keys are flag names)", path, k)
	}
	if f.Changed {
		return nil
	}
	values, err := configValues(path, k, value)
	if err != nil {
		return err
	}
	if len(values) > 1 && !takesList(f) {
		return fmt.Errorf("%s: key %q takes one value, got a list", path, k)
	}
	for _, v := range values {
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("%s: key %q value %q: %w", path, k, v, err)
		}
	}
	return nil
}

// configValues is a key's value as flag values: one for a scalar, each
// of a list; a map is refused.
func configValues(path, k string, value any) ([]string, error) {
	var values []string
	switch v := value.(type) {
	case []any:
		for _, x := range v {
			values = append(values, scalar(x))
		}
	case map[string]any:
		return nil, fmt.Errorf("%s: key %q: want a value or a list, got a map", path, k)
	default:
		values = []string{scalar(v)}
	}
	return values, nil
}

// takesList says a flag is repeatable (an array or slice).
func takesList(f *pflag.Flag) bool {
	return strings.HasSuffix(f.Value.Type(), "Array") || strings.HasSuffix(f.Value.Type(), "Slice")
}

func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	case nil:
		return ""
	default:
		return fmt.Sprint(x)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// reloadAnnotation marks, on a flag, whether a new value in the flags
// ConfigMap takes effect live: "live"; absent: restart-only.
const reloadAnnotation = "vmss-autoscaler.io/reload"

// markLive marks every flag of fs live.
func markLive(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[reloadAnnotation] = []string{"live"}
	})
}

// isLive says a flag's new value takes effect at the next loop.
func isLive(f *pflag.Flag) bool {
	v := f.Annotations[reloadAnnotation]
	return len(v) == 1 && v[0] == "live"
}
