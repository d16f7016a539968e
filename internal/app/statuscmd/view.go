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
	v.NodeGroups = groupViews(st)
	v.Queue = queueView(st.NodeAddition, totalQueued(v.NodeGroups))
	v.ScaleDown = scaleDownView(st.ScaleDown)
	v.Warnings = append(v.Warnings, guardWarnings(st)...)
	v.Health = st.Health
	v.Warnings = append(v.Warnings, healthWarnings(st)...)
	v.ProvisioningRequests = st.ProvisioningRequests
	v.CapacityBuffers = st.CapacityBuffers
	v.Warnings = append(v.Warnings, capacityWarnings(st)...)
	for _, g := range st.NodeAddition.HeldGangs {
		v.Warnings = append(v.Warnings, fmt.Sprintf("gang %s waits whole for its %d nodes, held by %s", g.Gang, g.Nodes, g.HeldBy))
	}
	sortGroups(v.NodeGroups)
	return v
}

// groupViews are the status's node groups (in its order) with their warm
// pools and their queued nodes by class.
func groupViews(st *core.Status) []GroupView {
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
	var groups []GroupView
	for _, g := range st.NodeGroups {
		gv := GroupView{GroupStatus: g}
		if w, ok := warm[g.Name]; ok {
			gv.Warm = &WarmView{Target: w.Target, Ready: w.WarmReady, BalloonsPending: w.BalloonsPending}
		}
		gv.setQueued(queued[g.Name])
		groups = append(groups, gv)
	}
	return groups
}

// queueView is the status's node-addition queue, holding queued nodes.
func queueView(na core.NodeAdditionStatus, queued int) QueueView {
	smoothing, burst, bucket, maxInFlight := na.Smoothing, na.Burst, na.BucketNodes, na.MaxInFlight
	return QueueView{Smoothing: &smoothing, RateNodesPerMinute: na.RateNodesPerMinute, RateReason: na.RateReason,
		Burst: &burst, Bucket: &bucket, InFlight: na.InFlight, MaxInFlight: &maxInFlight, HeldBy: na.HeldBy, Queued: queued}
}

// scaleDownView is the status's scale-down pass.
func scaleDownView(sd core.ScaleDownInfo) *ScaleDownView {
	recent := sd.RecentDeletions
	return &ScaleDownView{UnneededNodes: sd.UnneededNodes, Removing: sd.Removing, BrakeEngaged: sd.BrakeEngaged,
		RecentDeletions: &recent, HeldBecause: sd.HeldBecause, Kept: sd.Kept}
}

// guardWarnings are the warnings of the autoscaler's guards: the unready
// guard, replacements blocked and the replacement brake, preflight
// incidents and failures settling, a fallback configuration.
func guardWarnings(st *core.Status) []string {
	var out []string
	if st.ClusterUnhealthy != "" {
		out = append(out, "cluster unhealthy, nothing deleted, cordoned or drained: "+st.ClusterUnhealthy)
	}
	for _, b := range st.ReplacementsBlocked {
		out = append(out, "not replaced, kept cordoned: "+b)
	}
	if st.ReplacementsHeld > 0 {
		out = append(out, fmt.Sprintf("replacement brake: %d deletions held (failed preflight, machines in error or never registered)", st.ReplacementsHeld))
	}
	for _, c := range sortedIncidentChecks(st.PreflightIncidents) {
		out = append(out, fmt.Sprintf("preflight incident: check %q fails on %d nodes at once; they are kept, not replaced", c, st.PreflightIncidents[c]))
	}
	if st.PreflightFailuresSettling > 0 {
		out = append(out, fmt.Sprintf("preflight: %d failed nodes left alone until their failure has stood --preflight-failure-settle (an outage's first reports look like bad machines)", st.PreflightFailuresSettling))
	}
	if st.ConfigFallback != "" {
		out = append(out, "running on a fallback configuration: "+st.ConfigFallback)
	}
	return out
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
	m := &metricsReader{families: families, groups: map[string]*GroupView{}}
	m.readGroupGauges()
	m.readNodeStates()
	m.readTargetsAndBackoffs()
	m.readQueued()
	v.NodeGroups = m.nodeGroups()
	m.readClusterWide(v)
	return v
}

// metricsReader reads /metrics' families into node groups, by name.
type metricsReader struct {
	families map[string]*dto.MetricFamily
	groups   map[string]*GroupView
}

// group is the node group name, added when first seen.
func (m *metricsReader) group(name string) *GroupView {
	if m.groups[name] == nil {
		m.groups[name] = &GroupView{GroupStatus: core.GroupStatus{Name: name}}
	}
	return m.groups[name]
}

// each calls f with the labels and value of each sample of metric, if
// exported.
func (m *metricsReader) each(metric string, f func(labels map[string]string, value float64)) {
	fam := m.families[metricPrefix+metric]
	if fam == nil {
		return
	}
	for _, s := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		f(labels, sampleValue(s))
	}
}

// groupField is where a per-group gauge goes in a group's view.
type groupField func(*GroupView) *int

// readGroupGauges reads the per-group gauges into the groups' fields.
func (m *metricsReader) readGroupGauges() {
	perGroup := map[string]groupField{
		"node_group_min_size":    func(g *GroupView) *int { return &g.Min },
		"node_group_max_size":    func(g *GroupView) *int { return &g.Max },
		"warm_pool_target_nodes": func(g *GroupView) *int { return &warm(g).Target },
		"warm_pool_ready_nodes":  func(g *GroupView) *int { return &warm(g).Ready },
		"balloon_pods_pending":   func(g *GroupView) *int { return &warm(g).BalloonsPending },
	}
	for metric, f := range perGroup {
		m.each(metric, func(l map[string]string, x float64) { *f(m.group(l["node_group"])) = int(x) })
	}
}

// readNodeStates reads "nodes" into the groups' fields by its state label.
func (m *metricsReader) readNodeStates() {
	byState := map[string]groupField{
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
	m.each("nodes", func(l map[string]string, x float64) {
		if f, ok := byState[l["state"]]; ok {
			*f(m.group(l["node_group"])) = int(x)
		}
	})
}

// readTargetsAndBackoffs reads the groups' target sizes and whether each
// is backed off.
func (m *metricsReader) readTargetsAndBackoffs() {
	m.each("node_group_target_size", func(l map[string]string, x float64) {
		t := int(x)
		m.group(l["node_group"]).Target = &t
	})
	m.each("node_group_backoff", func(l map[string]string, x float64) {
		if x > 0 {
			// Neither reason nor end is exported: a zero Until says "unknown".
			m.group(l["node_group"]).Backoff = &core.BackoffStatus{}
		}
	})
}

// readQueued reads the nodes the node-addition queue holds, by group and
// class.
func (m *metricsReader) readQueued() {
	queued := map[string]map[string]int{}
	m.each("node_addition_queue_depth", func(l map[string]string, x float64) {
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
		m.group(name).setQueued(byClass)
	}
}

// nodeGroups are the groups read, sorted by name.
func (m *metricsReader) nodeGroups() []GroupView {
	var out []GroupView
	for _, g := range m.groups {
		// A warm pool whose target is 0 and holds nothing is no warm pool.
		if w := g.Warm; w != nil && w.Target == 0 && w.Ready == 0 && w.BalloonsPending == 0 {
			g.Warm = nil
		}
		out = append(out, *g)
	}
	sortGroups(out)
	return out
}

// readClusterWide reads what is not per group into v: pods, the
// scale-down pass, the last loop, the node-addition queue.
func (m *metricsReader) readClusterWide(v *View) {
	sd := &ScaleDownView{}
	v.ScaleDown = sd
	for metric, dst := range map[string]*int{
		"unschedulable_pods":           &v.UnschedulablePods,
		"pods_awaiting_upcoming_nodes": &v.PodsAwaitingNodes,
		"nodes_in_flight":              &v.Queue.InFlight,
		"unneeded_nodes":               &sd.UnneededNodes,
		"scale_down_drains_in_flight":  &sd.Removing,
	} {
		m.each(metric, func(_ map[string]string, x float64) { *dst = int(x) })
	}
	m.each("last_successful_loop_timestamp_seconds", func(_ map[string]string, x float64) {
		if x > 0 {
			t := time.Unix(0, int64(x*1e9)).UTC()
			v.AsOf = &t
		}
	})
	m.each("node_addition_rate_nodes_per_minute", func(_ map[string]string, x float64) { v.Queue.RateNodesPerMinute = x })
	m.each("node_addition_rate_reason", func(l map[string]string, x float64) {
		if x > 0 {
			v.Queue.RateReason = l["reason"]
		}
	})
	m.each("node_addition_tokens", func(_ map[string]string, x float64) { v.Queue.Tokens = &x })
	v.Queue.Queued = totalQueued(v.NodeGroups)
	m.each("scale_down_brake_engaged", func(_ map[string]string, x float64) { sd.BrakeEngaged = x > 0 })
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
	return append(healthStatusWarnings(st.Health), degradedWarnings(st.NodeGroups)...)
}

// healthStatusWarnings are the warnings of health's own report: the
// policy, the pause, the breakers, the incidents, the nodes not judged,
// the cordon ceiling.
func healthStatusWarnings(h *core.HealthStatus) []string {
	if h == nil {
		return nil
	}
	var out []string
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
	return out
}

// degradedWarnings are the groups' degraded nodes, a line per group.
func degradedWarnings(groups []core.GroupStatus) []string {
	var out []string
	for _, g := range groups {
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
		out = append(out, waitingWarning(p))
	}
	if b := st.CapacityBuffers; b != nil {
		out = append(out, unplacedWarnings(b)...)
	}
	return out
}

// waitingWarning is the requests waiting for a retry, with the earliest
// (p has some).
func waitingWarning(p *core.ProvisioningRequestsStatus) string {
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
	return fmt.Sprintf("%s %s not provisioned, next retry at %s",
		n, plural(len(p.Waiting)+p.More, "ProvisioningRequest", "ProvisioningRequests"), next.UTC().Format(time.RFC3339))
}

// unplacedWarnings are the buffers with chunks that fit nowhere, one line
// each (the first maxBufferWarnings), then how many more.
func unplacedWarnings(b *core.CapacityBuffersStatus) []string {
	var out []string
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
	return out
}

// oneLine is a message on one line, without the full stop the warning
// line adds.
func oneLine(msg string) string {
	return strings.TrimRight(strings.Join(strings.Fields(msg), " "), ".")
}
