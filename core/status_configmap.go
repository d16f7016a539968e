package core

import (
	"context"
	"fmt"
	"time"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

// Status is what the status ConfigMap holds, under the key "status".
type Status struct {
	// LastChange is when the content below last changed.
	LastChange        time.Time `json:"lastChange"`
	Nodes             int       `json:"nodes"`
	ReadyNodes        int       `json:"readyNodes"`
	UnschedulablePods int       `json:"unschedulablePods"`
	PodsAwaitingNodes int       `json:"podsAwaitingUpcomingNodes"`
	// PodsWithoutScaleUp counts the pods no node group was asked for, by
	// the reason most groups gave (scaleup.ReasonCode: max-size, backoff,
	// does-not-fit, …).
	PodsWithoutScaleUp map[string]int     `json:"podsWithoutScaleUp,omitempty"`
	NodeGroups         []GroupStatus      `json:"nodeGroups"`
	ScaleDown          ScaleDownInfo      `json:"scaleDown"`
	NodeAddition       NodeAdditionStatus `json:"nodeAdditionQueue"`
	WarmPools          []WarmPoolStatus   `json:"warmPools,omitempty"`
	// ClusterUnhealthy says why the cluster-wide unready guard holds:
	// nothing is deleted, cordoned or drained.
	ClusterUnhealthy string `json:"clusterUnhealthy,omitempty"`
	// ConfigFallback says the process runs on a fallback configuration:
	// its flags file was refused at start.
	ConfigFallback string `json:"configFallback,omitempty"`
	// ReplacementsHeld are deletions that are not scale-down the
	// replacement brake held back in the last loop.
	ReplacementsHeld int `json:"replacementsHeld,omitempty"`
	// ReplacementsBlocked are nodes being replaced (failed preflight, a
	// failed machine) that keep a pod which may not be evicted, as "node:
	// why": they stay cordoned and are not deleted.
	ReplacementsBlocked []string `json:"replacementsBlocked,omitempty"`
	// PreflightIncidents are checks many nodes fail at once, with the
	// nodes failing each: those nodes are kept, not replaced.
	PreflightIncidents map[string]int `json:"preflightIncidents,omitempty"`
	// PreflightFailuresSettling are failed nodes not drained or deleted in
	// the last loop because their failure is younger than
	// --preflight-failure-settle (a node a periodic check failed may be
	// cordoned meanwhile).
	PreflightFailuresSettling int `json:"preflightFailuresSettling,omitempty"`
	// Health is what passive node health found and did (docs/concepts/health-policy.md).
	Health *HealthStatus `json:"health,omitempty"`
	// ProvisioningRequests are the requests' counts, bookings and retries
	// (with --enable-provisioning-requests).
	ProvisioningRequests *ProvisioningRequestsStatus `json:"provisioningRequests,omitempty"`
	// CapacityBuffers are where the buffers' chunks are (with
	// --enable-capacity-buffers).
	CapacityBuffers *CapacityBuffersStatus `json:"capacityBuffers,omitempty"`
	// Truncated says the status was cut to fit its ConfigMap beside the
	// safety state (status_bound.go).
	Truncated string `json:"truncated,omitempty"`
}

// WarmPoolStatus is a group's warm pool in the status.
type WarmPoolStatus struct {
	NodeGroup       string `json:"nodeGroup"`
	Target          int    `json:"target"`
	WarmReady       int    `json:"warmReady"`
	BalloonsPending int    `json:"balloonsPending"`
}

// NodeAdditionStatus is the node-addition queue in the status.
type NodeAdditionStatus struct {
	Smoothing          bool    `json:"smoothing"`
	RateNodesPerMinute float64 `json:"rateNodesPerMinute"`
	RateReason         string  `json:"rateReason"`
	Burst              int     `json:"burst"`
	// BucketNodes is what the token bucket held at most in the last loop:
	// the burst, or the rate's worth of the loop's period when more.
	BucketNodes int `json:"bucketNodes"`
	MaxInFlight int `json:"maxInFlight"`
	InFlight    int `json:"inFlight"`
	// HeldBy is what held demand back in the last loop: "rate", "in-flight", "paced", "write-in-flight" or empty.
	HeldBy string        `json:"heldBy,omitempty"`
	Queued []QueuedNodes `json:"queued,omitempty"`
	// HeldGangs are gangs held back whole, and by what.
	HeldGangs []HeldGang `json:"heldGangs,omitempty"`
}

// HeldGang is a gang whose nodes wait, together, in the queue.
type HeldGang struct {
	Gang   string `json:"gang"`
	Nodes  int    `json:"nodes"`
	HeldBy string `json:"heldBy"`
}

// QueuedNodes is demand waiting in the queue.
type QueuedNodes struct {
	NodeGroup string `json:"nodeGroup"`
	Class     string `json:"class"`
	Nodes     int    `json:"nodes"`
}

// ScaleDownInfo is the scale-down part of the status.
type ScaleDownInfo struct {
	UnneededNodes int `json:"unneededNodes"`
	Removing      int `json:"removing"`
	// BrakeEngaged says the safety brake stopped removals in the last pass.
	BrakeEngaged    bool   `json:"brakeEngaged"`
	RecentDeletions int    `json:"deletionsInBrakeWindow"`
	HeldBecause     string `json:"heldBecause,omitempty"`
	// Kept counts the managed nodes kept in the last pass, by reason
	// (scaledown.Reason: utilization-high, pdb, min-size, brake, …).
	Kept map[string]int `json:"kept,omitempty"`
}

// GroupStatus is one node group in the status ConfigMap.
type GroupStatus struct {
	Name             string         `json:"name"`
	Min              int            `json:"min"`
	Max              int            `json:"max"`
	Target           *int           `json:"target,omitempty"`
	SizeError        string         `json:"sizeError,omitempty"`
	Ready            int            `json:"ready"`
	Unready          int            `json:"unready"`
	NotStarted       int            `json:"notStarted"`
	Unregistered     int            `json:"unregistered"`
	LongUnregistered int            `json:"longUnregistered"`
	InError          int            `json:"instancesInError"`
	FailedRunning    int            `json:"instancesFailedRunning,omitempty"`
	Deleting         int            `json:"deleting"`
	Upcoming         int            `json:"upcoming"`
	Preflight        int            `json:"preflightPending"`
	PreflightFailed  int            `json:"preflightFailed"`
	Backoff          *BackoffStatus `json:"backoff,omitempty"`
	LastScaleUp      *time.Time     `json:"lastScaleUp,omitempty"`
	// MaxWarning says the configured max is more than the group's cloud
	// lets it hold (a scale set's platform limit); Max is that limit.
	MaxWarning string `json:"maxWarning,omitempty"`
	// InstancesStale says the group's machines are an older list's: the
	// cloud's last list of them failed (a throttled VM list); its size is
	// still read fresh.
	InstancesStale string `json:"instancesStale,omitempty"`
	// TemplateSource is where the group's template node comes from:
	// "node/<name>", a live node of the group, or "sku", the VM size less
	// the reserved-resource estimate (a group with no usable node).
	TemplateSource string `json:"templateSource,omitempty"`
	// Degraded are nodes advertising less than the VM size (never the
	// template source), the first 20.
	Degraded []string `json:"degraded,omitempty"`
}

// BackoffStatus is a group's backoff in the status ConfigMap.
type BackoffStatus struct {
	Until  time.Time `json:"until"`
	Reason string    `json:"reason"`
}

// StatusWriter stores the rendered status.
type StatusWriter interface {
	WriteStatus(ctx context.Context, status string) error
}

// ConfigMapStatusWriter writes the status into a ConfigMap through the API.
type ConfigMapStatusWriter struct {
	Client    corev1client.ConfigMapsGetter
	Namespace string
	Name      string
}

// WriteStatus creates or updates the ConfigMap's "status" key.
func (w *ConfigMapStatusWriter) WriteStatus(ctx context.Context, status string) error {
	return w.WriteKey(ctx, "status", status)
}

// SafetyStateKey is the status ConfigMap's key that keeps the safety
// state (the brakes' windows, the backoffs) for the next leader.
const SafetyStateKey = "safety-state"

// ReadSafetyState implements SafetyStore: "" when the ConfigMap or its key
// does not exist yet.
func (w *ConfigMapStatusWriter) ReadSafetyState(ctx context.Context) (string, error) {
	cm, err := w.Client.ConfigMaps(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading status ConfigMap %s/%s: %w", w.Namespace, w.Name, err)
	}
	return cm.Data[SafetyStateKey], nil
}

// WriteSafetyState implements SafetyStore.
func (w *ConfigMapStatusWriter) WriteSafetyState(ctx context.Context, state string) error {
	return w.WriteKey(ctx, SafetyStateKey, state)
}

// WriteKey creates the ConfigMap with one key, or sets that key, leaving
// the others as they are; an unchanged value is not written. A conflict
// (another key written meanwhile: the status, the last good flags) is
// read and applied again.
func (w *ConfigMapStatusWriter) WriteKey(ctx context.Context, key, value string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return w.writeKey(ctx, key, value) })
}

func (w *ConfigMapStatusWriter) writeKey(ctx context.Context, key, value string) error {
	cms := w.Client.ConfigMaps(w.Namespace)
	cm, err := cms.Get(ctx, w.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &apiv1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: w.Name, Namespace: w.Namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "vmss-autoscaler"}},
			Data: map[string]string{key: value},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating status ConfigMap %s/%s: %w", w.Namespace, w.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading status ConfigMap %s/%s: %w", w.Namespace, w.Name, err)
	}
	if v, ok := cm.Data[key]; ok && v == value {
		return nil
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[key] = value
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		// %w keeps the Conflict visible to RetryOnConflict.
		return fmt.Errorf("updating key %s of status ConfigMap %s/%s: %w", key, w.Namespace, w.Name, err)
	}
	return nil
}

// renderStatus renders a status without its LastChange, for comparison,
// and with it, for writing.
func renderStatus(s Status) (cmp string, full string, err error) {
	c := s
	c.LastChange = time.Time{}
	a, err := yaml.Marshal(c)
	if err != nil {
		return "", "", fmt.Errorf("rendering status: %w", err)
	}
	b, err := yaml.Marshal(s)
	if err != nil {
		return "", "", fmt.Errorf("rendering status: %w", err)
	}
	return string(a), string(b), nil
}

// HealthStatus is the health phase's report: the unhealthy nodes (the
// first 20, and how many more), the groups whose breaker holds, whether
// actions are paused, and why the policy ConfigMap was refused.
type HealthStatus struct {
	Paused      bool         `json:"paused"`
	PolicyError string       `json:"policyError,omitempty"`
	Unhealthy   []HealthNode `json:"unhealthy,omitempty"`
	More        int          `json:"more,omitempty"`
	Breakers    []string     `json:"breakers,omitempty"`
	// Incidents are the rules in a health incident: their matches are
	// reported only.
	Incidents []string `json:"incidents,omitempty"`
	// Cordoned is the health cordons held, CordonCeiling their
	// cluster-wide bound (--health-max-cordoned-share).
	Cordoned      int `json:"cordoned,omitempty"`
	CordonCeiling int `json:"cordonCeiling,omitempty"`
	// NotJudged are nodes advertising less than their VM size in a way
	// belowSKU rules cannot judge (GPUs under other names: MIG,
	// time-slicing, DRA), "<node>: <why>", the first 20; NotJudgedMore
	// how many more.
	NotJudged     []string `json:"notJudged,omitempty"`
	NotJudgedMore int      `json:"notJudgedMore,omitempty"`
	// Repairs are the repair ladders in progress (the first 20, and
	// how many more).
	Repairs     []HealthRepair `json:"repairs,omitempty"`
	RepairsMore int            `json:"repairsMore,omitempty"`
}

// HealthRepair is a node's repair ladder in progress: its rule, the step
// ("2/3 reimage"), where the step is ("due: <why not asked yet>", "in
// the cloud", "preflight again", "replacing") and since when.
type HealthRepair struct {
	Node      string    `json:"node"`
	NodeGroup string    `json:"nodeGroup"`
	Rule      string    `json:"rule"`
	Step      string    `json:"step"`
	State     string    `json:"state"`
	Since     time.Time `json:"since,omitzero"`
}

// HealthNode is an unhealthy node: the rule it matches (the strongest),
// that rule's action and where the node is in it ("matched", "cordoned",
// "draining", "drained", "deleting", "deleted", "held: <reason>").
type HealthNode struct {
	Node      string `json:"node"`
	NodeGroup string `json:"nodeGroup"`
	Rule      string `json:"rule"`
	Action    string `json:"action"`
	State     string `json:"state"`
}
