// Package statuscmd is `vmss-autoscaler status`: what the autoscaler
// thinks, per node group, as a kubectl-style table (or JSON, YAML), read
// from the status ConfigMap the leader writes (core.Status) or from the
// /metrics of a running replica.
package statuscmd

import (
	"fmt"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

// View is what the command prints: the same shape from either source.
// Fields a source cannot tell are nil or empty (see FromMetrics).
type View struct {
	// Source says where the view was read: "configmap <ns>/<name>" or
	// "metrics <url>".
	Source string `json:"source"`
	// AsOf is when the autoscaler last changed the status (ConfigMap), or
	// its last successful loop (metrics).
	AsOf              *time.Time `json:"asOf,omitempty"`
	Nodes             *int       `json:"nodes,omitempty"`
	ReadyNodes        *int       `json:"readyNodes,omitempty"`
	UnschedulablePods int        `json:"unschedulablePods"`
	PodsAwaitingNodes int        `json:"podsAwaitingUpcomingNodes"`
	// PodsWithoutScaleUp counts the pods no node group was asked for, by
	// reason (status ConfigMap only).
	PodsWithoutScaleUp map[string]int `json:"podsWithoutScaleUp,omitempty"`
	NodeGroups         []GroupView    `json:"nodeGroups"`
	Queue              QueueView      `json:"nodeAdditionQueue"`
	ScaleDown          *ScaleDownView `json:"scaleDown,omitempty"`
	// Health is passive node health's report (status ConfigMap only):
	// the unhealthy nodes, the breakers, the pause.
	Health *core.HealthStatus `json:"health,omitempty"`
	// ProvisioningRequests are the requests' counts by class and
	// condition, their bookings and those waiting for a retry (status
	// ConfigMap only, with --enable-provisioning-requests).
	ProvisioningRequests *core.ProvisioningRequestsStatus `json:"provisioningRequests,omitempty"`
	// CapacityBuffers are where the buffers' chunks are: warm, coming or
	// fitting nowhere (status ConfigMap only, with
	// --enable-capacity-buffers).
	CapacityBuffers *core.CapacityBuffersStatus `json:"capacityBuffers,omitempty"`

	// Warnings are what an operator must know first: the unready guard,
	// the replacement brake, a fallback configuration, gangs held whole,
	// health breakers and pause, ProvisioningRequests not provisioned,
	// CapacityBuffers' chunks that fit nowhere.
	Warnings []string `json:"warnings,omitempty"`
}

// GroupView is one node group's row: the group as the status ConfigMap
// has it (core.GroupStatus, the same JSON keys), its warm pool and its
// queued nodes.
type GroupView struct {
	core.GroupStatus
	// Warm is the group's warm pool, nil without one.
	Warm *WarmView `json:"warm,omitempty"`
	// Queued is the nodes planned for the group that the node-addition
	// queue holds back, by class (workload, balloon).
	Queued        int            `json:"queued"`
	QueuedByClass map[string]int `json:"queuedByClass,omitempty"`
}

// Failed is the group's machines that failed: preflight, or created in
// error by the cloud.
func (g GroupView) Failed() int { return g.PreflightFailed + g.InError }

// WarmView is a warm pool: ready warm nodes of the target.
type WarmView struct {
	Target          int `json:"target"`
	Ready           int `json:"ready"`
	BalloonsPending int `json:"balloonsPending"`
}

// QueueView is the node-addition queue.
type QueueView struct {
	Smoothing          *bool   `json:"smoothing,omitempty"`
	RateNodesPerMinute float64 `json:"rateNodesPerMinute"`
	RateReason         string  `json:"rateReason,omitempty"`
	Burst              *int    `json:"burst,omitempty"`
	// Bucket is the most the token bucket held in the last loop (status
	// only): more than the burst when the rate's worth of a loop is more.
	Bucket      *int     `json:"bucketNodes,omitempty"`
	Tokens      *float64 `json:"tokens,omitempty"`
	InFlight    int      `json:"inFlight"`
	MaxInFlight *int     `json:"maxInFlight,omitempty"`
	// HeldBy is what held queued nodes back in the last loop: "rate" (the
	// token bucket), "in-flight" (the cap on nodes requested and not yet
	// ready), "paced" (the group's last scale-set write was seconds
	// ago) or "write-in-flight" (the group's previous scale-set write
	// still runs); empty when nothing was held, or unknown (metrics).
	HeldBy string `json:"heldBy,omitempty"`
	Queued int    `json:"queued"`
}

// ScaleDownView is the scale-down pass.
type ScaleDownView struct {
	UnneededNodes   int    `json:"unneededNodes"`
	Removing        int    `json:"removing"`
	BrakeEngaged    bool   `json:"brakeEngaged"`
	RecentDeletions *int   `json:"deletionsInBrakeWindow,omitempty"`
	HeldBecause     string `json:"heldBecause,omitempty"`
	// Kept counts the nodes kept in the last pass, by reason (status
	// ConfigMap only).
	Kept map[string]int `json:"kept,omitempty"`
}

// FromStatus is the view of the status ConfigMap's content.
func FromStatus(source string, st *core.Status) *View {
	v := &View{Source: source, UnschedulablePods: st.UnschedulablePods, PodsAwaitingNodes: st.PodsAwaitingNodes, PodsWithoutScaleUp: st.PodsWithoutScaleUp}
	if !st.LastChange.IsZero() {
		t := st.LastChange
		v.AsOf = &t
	}
	nodes, ready := st.Nodes, st.ReadyNodes
	v.Nodes, v.ReadyNodes = &nodes, &ready
	warm := map[string]core.WarmPoolStatus{}
	for _, w := range st.WarmPools {
		warm[w.NodeGroup] = w
	}
	queued := map[string]map[string]int{}
	for _, q := range st.NodeAddition.Queued {
		if queued[q.NodeGroup] == nil {
			queued[q.NodeGroup] = map[string]int{}
		}
		queued[q.NodeGroup][q.Class] += q.Nodes
	}
	for _, g := range st.NodeGroups {
		gv := GroupView{GroupStatus: g}
		if w, ok := warm[g.Name]; ok {
			gv.Warm = &WarmView{Target: w.Target, Ready: w.WarmReady, BalloonsPending: w.BalloonsPending}
		}
		gv.setQueued(queued[g.Name])
		v.NodeGroups = append(v.NodeGroups, gv)
	}
	na := st.NodeAddition
	smoothing, burst, bucket, maxInFlight := na.Smoothing, na.Burst, na.BucketNodes, na.MaxInFlight
	v.Queue = QueueView{Smoothing: &smoothing, RateNodesPerMinute: na.RateNodesPerMinute, RateReason: na.RateReason,
		Burst: &burst, Bucket: &bucket, InFlight: na.InFlight, MaxInFlight: &maxInFlight, HeldBy: na.HeldBy, Queued: totalQueued(v.NodeGroups)}
	sd := st.ScaleDown
	recent := sd.RecentDeletions
	v.ScaleDown = &ScaleDownView{UnneededNodes: sd.UnneededNodes, Removing: sd.Removing, BrakeEngaged: sd.BrakeEngaged,
		RecentDeletions: &recent, HeldBecause: sd.HeldBecause, Kept: sd.Kept}
	if st.ClusterUnhealthy != "" {
		v.Warnings = append(v.Warnings, "cluster unhealthy, nothing deleted, cordoned or drained: "+st.ClusterUnhealthy)
	}
	for _, b := range st.ReplacementsBlocked {
		v.Warnings = append(v.Warnings, "not replaced, kept cordoned: "+b)
	}
	if st.ReplacementsHeld > 0 {
		v.Warnings = append(v.Warnings, fmt.Sprintf("replacement brake: %d deletions held (failed preflight, machines in error or never registered)", st.ReplacementsHeld))
	}
	for _, c := range sortedIncidentChecks(st.PreflightIncidents) {
		v.Warnings = append(v.Warnings, fmt.Sprintf("preflight incident: check %q fails on %d nodes at once; they are kept, not replaced", c, st.PreflightIncidents[c]))
	}
	if st.PreflightFailuresSettling > 0 {
		v.Warnings = append(v.Warnings, fmt.Sprintf("preflight: %d failed nodes left alone until their failure has stood --preflight-failure-settle (an outage's first reports look like bad machines)", st.PreflightFailuresSettling))
	}
	if st.ConfigFallback != "" {
		v.Warnings = append(v.Warnings, "running on a fallback configuration: "+st.ConfigFallback)
	}
	v.Health = st.Health
	v.Warnings = append(v.Warnings, healthWarnings(st)...)
	v.ProvisioningRequests = st.ProvisioningRequests
	v.CapacityBuffers = st.CapacityBuffers
	v.Warnings = append(v.Warnings, capacityWarnings(st)...)
	for _, g := range na.HeldGangs {
		v.Warnings = append(v.Warnings, fmt.Sprintf("gang %s waits whole for its %d nodes, held by %s", g.Gang, g.Nodes, g.HeldBy))
	}
	sortGroups(v.NodeGroups)
	return v
}

func (g *GroupView) setQueued(byClass map[string]int) {
	if len(byClass) == 0 {
		return
	}
	g.QueuedByClass = byClass
	for _, n := range byClass {
		g.Queued += n
	}
}

func totalQueued(groups []GroupView) int {
	n := 0
	for _, g := range groups {
		n += g.Queued
	}
	return n
}

func sortGroups(gs []GroupView) {
	sort.Slice(gs, func(i, j int) bool { return gs[i].Name < gs[j].Name })
}

// The metric names FromMetrics reads (core.NewMetrics,
// docs/reference/metrics.md).
const metricPrefix = "vmss_autoscaler_"

// FromMetrics is the view of a replica's /metrics. A standby replica
// exports no node groups: only the leader runs loops. /metrics does not
// say why a group is backed off or what holds the queue; those fields stay
// empty (the ConfigMap has them).
func FromMetrics(source string, families map[string]*dto.MetricFamily) *View {
	v := &View{Source: source}
	groups := map[string]*GroupView{}
	group := func(name string) *GroupView {
		if groups[name] == nil {
			groups[name] = &GroupView{GroupStatus: core.GroupStatus{Name: name}}
		}
		return groups[name]
	}
	each := func(metric string, f func(labels map[string]string, value float64)) {
		fam := families[metricPrefix+metric]
		if fam == nil {
			return
		}
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			f(labels, sampleValue(m))
		}
	}
	// Per-group gauges into the group's fields; "nodes" by its state label.
	type field func(*GroupView) *int
	perGroup := map[string]field{
		"node_group_min_size":    func(g *GroupView) *int { return &g.Min },
		"node_group_max_size":    func(g *GroupView) *int { return &g.Max },
		"warm_pool_target_nodes": func(g *GroupView) *int { return &warm(g).Target },
		"warm_pool_ready_nodes":  func(g *GroupView) *int { return &warm(g).Ready },
		"balloon_pods_pending":   func(g *GroupView) *int { return &warm(g).BalloonsPending },
	}
	for metric, f := range perGroup {
		each(metric, func(l map[string]string, x float64) { *f(group(l["node_group"])) = int(x) })
	}
	byState := map[string]field{
		"ready":             func(g *GroupView) *int { return &g.Ready },
		"unready":           func(g *GroupView) *int { return &g.Unready },
		"upcoming":          func(g *GroupView) *int { return &g.Upcoming },
		"preflight":         func(g *GroupView) *int { return &g.Preflight },
		"preflight_failed":  func(g *GroupView) *int { return &g.PreflightFailed },
		"in_error":          func(g *GroupView) *int { return &g.InError },
		"failed_running":    func(g *GroupView) *int { return &g.FailedRunning },
		"not_started":       func(g *GroupView) *int { return &g.NotStarted },
		"unregistered":      func(g *GroupView) *int { return &g.Unregistered },
		"long_unregistered": func(g *GroupView) *int { return &g.LongUnregistered },
		"deleting":          func(g *GroupView) *int { return &g.Deleting },
	}
	each("nodes", func(l map[string]string, x float64) {
		if f, ok := byState[l["state"]]; ok {
			*f(group(l["node_group"])) = int(x)
		}
	})
	each("node_group_target_size", func(l map[string]string, x float64) {
		t := int(x)
		group(l["node_group"]).Target = &t
	})
	each("node_group_backoff", func(l map[string]string, x float64) {
		if x > 0 {
			// Neither reason nor end is exported: a zero Until says "unknown".
			group(l["node_group"]).Backoff = &core.BackoffStatus{}
		}
	})
	queued := map[string]map[string]int{}
	each("node_addition_queue_depth", func(l map[string]string, x float64) {
		if x <= 0 {
			return
		}
		g := l["node_group"]
		if queued[g] == nil {
			queued[g] = map[string]int{}
		}
		queued[g][l["class"]] += int(x)
	})
	for name, byClass := range queued {
		group(name).setQueued(byClass)
	}
	for _, g := range groups {
		// A warm pool whose target is 0 and holds nothing is no warm pool.
		if w := g.Warm; w != nil && w.Target == 0 && w.Ready == 0 && w.BalloonsPending == 0 {
			g.Warm = nil
		}
		v.NodeGroups = append(v.NodeGroups, *g)
	}
	sortGroups(v.NodeGroups)

	sd := &ScaleDownView{}
	v.ScaleDown = sd
	for metric, dst := range map[string]*int{
		"unschedulable_pods":           &v.UnschedulablePods,
		"pods_awaiting_upcoming_nodes": &v.PodsAwaitingNodes,
		"nodes_in_flight":              &v.Queue.InFlight,
		"unneeded_nodes":               &sd.UnneededNodes,
		"scale_down_drains_in_flight":  &sd.Removing,
	} {
		each(metric, func(_ map[string]string, x float64) { *dst = int(x) })
	}
	each("last_successful_loop_timestamp_seconds", func(_ map[string]string, x float64) {
		if x > 0 {
			t := time.Unix(0, int64(x*1e9)).UTC()
			v.AsOf = &t
		}
	})
	each("node_addition_rate_nodes_per_minute", func(_ map[string]string, x float64) { v.Queue.RateNodesPerMinute = x })
	each("node_addition_rate_reason", func(l map[string]string, x float64) {
		if x > 0 {
			v.Queue.RateReason = l["reason"]
		}
	})
	each("node_addition_tokens", func(_ map[string]string, x float64) { v.Queue.Tokens = &x })
	v.Queue.Queued = totalQueued(v.NodeGroups)
	each("scale_down_brake_engaged", func(_ map[string]string, x float64) { sd.BrakeEngaged = x > 0 })
	return v
}

func warm(g *GroupView) *WarmView {
	if g.Warm == nil {
		g.Warm = &WarmView{}
	}
	return g.Warm
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// classes lists a group's queued nodes by class, "3 workload, 1 balloon".
func classes(byClass map[string]int) string {
	names := make([]string, 0, len(byClass))
	for c := range byClass {
		names = append(names, c)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, c := range names {
		parts = append(parts, itoa(byClass[c])+" "+c)
	}
	return strings.Join(parts, ", ")
}

func sortedIncidentChecks(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for c := range m {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// healthWarnings are passive node health's warnings: a refused or
// unconfirmed policy, the pause, each group whose breaker holds, each
// rule in an incident, the cordon ceiling reached, degraded nodes.
func healthWarnings(st *core.Status) []string {
	var out []string
	if h := st.Health; h != nil {
		if h.PolicyError != "" {
			out = append(out, "health policy: "+h.PolicyError)
		}
		if h.Paused {
			out = append(out, "health actions paused (annotation "+core.HealthPausedAnnotation+"): unhealthy nodes are reported only")
		}
		for _, g := range h.Breakers {
			out = append(out, fmt.Sprintf("health breaker engaged for node group %s: no new cordon, drain or replacement there (scale-up goes on)", g))
		}
		for _, r := range h.Incidents {
			out = append(out, fmt.Sprintf("health incident: many nodes began matching rule %q at once; its matches are reported only", r))
		}
		if n := len(h.NotJudged) + h.NotJudgedMore; n > 0 {
			out = append(out, fmt.Sprintf("%d nodes advertise less than their VM size in a way belowSKU rules cannot judge (not acted on): %s", n, strings.Join(h.NotJudged, "; ")))
		}
		if h.CordonCeiling > 0 && h.Cordoned >= h.CordonCeiling {
			out = append(out, fmt.Sprintf("health cordons at the cluster-wide ceiling (%d of %d, --health-max-cordoned-share): further matches are reported only", h.Cordoned, h.CordonCeiling))
		}
	}
	for _, g := range st.NodeGroups {
		if len(g.Degraded) > 0 {
			out = append(out, fmt.Sprintf("node group %s: %d degraded nodes (advertising less than the VM size; never the template): %s",
				g.Name, len(g.Degraded), strings.Join(g.Degraded, ", ")))
		}
	}
	return out
}

// maxBufferWarnings bounds the CapacityBuffers' warnings: one line per
// buffer with chunks that fit nowhere, then how many more.
const maxBufferWarnings = 3

// capacityWarnings are the warnings of capacity asked for ahead of pods:
// ProvisioningRequests waiting for a retry, with the earliest, and
// CapacityBuffers with chunks that fit nowhere, one line each (the first
// maxBufferWarnings, then how many more).
// The time is absolute: the warnings are in -o json and yaml too; the
// table's WAITING REQUEST rows say how far off each retry is.
func capacityWarnings(st *core.Status) []string {
	var out []string
	if p := st.ProvisioningRequests; p != nil && len(p.Waiting) > 0 {
		next := p.Waiting[0].RetryAt
		for _, w := range p.Waiting[1:] {
			if w.RetryAt.Before(next) {
				next = w.RetryAt
			}
		}
		n := itoa(len(p.Waiting))
		if p.More > 0 {
			// More counts booked and waiting requests left out alike.
			n += " or more"
		}
		out = append(out, fmt.Sprintf("%s %s not provisioned, next retry at %s",
			n, plural(len(p.Waiting)+p.More, "ProvisioningRequest", "ProvisioningRequests"), next.UTC().Format(time.RFC3339)))
	}
	if b := st.CapacityBuffers; b != nil {
		listed, extra := 0, 0
		for _, e := range b.Buffers {
			if e.Unplaced <= 0 {
				continue
			}
			if listed == maxBufferWarnings {
				extra++
				continue
			}
			listed++
			w := fmt.Sprintf("CapacityBuffer %s: %d of %d chunks fit nowhere", e.Buffer, e.Unplaced, e.Chunks)
			if msg := oneLine(e.Message); msg != "" {
				w += ": " + msg
			}
			out = append(out, w)
		}
		if extra > 0 {
			n := itoa(extra) + " more"
			if b.More > 0 {
				// The buffers left out of the status may have some too.
				n = "at least " + n
			}
			out = append(out, fmt.Sprintf("and %s %s with chunks that fit nowhere", n, plural(extra, "CapacityBuffer", "CapacityBuffers")))
		}
	}
	return out
}

// oneLine is a message on one line, without the full stop the warning
// line adds.
func oneLine(msg string) string {
	return strings.TrimRight(strings.Join(strings.Fields(msg), " "), ".")
}
