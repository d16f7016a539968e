package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/fairshare"
)

// CapacityBuffers (autoscaling.x-k8s.io/v1beta1) are served as
// cluster-autoscaler serves them: each buffer's chunks are virtual pods
// booked in the loop's snapshot, never pods written to the cluster.
//   - On ready nodes (after ProvisioningRequests' bookings, never in a
//     balloon's room) they hold room the scheduler does not see: a real
//     pod takes it at once, with no preemption round and no grace period
//     to wait, and scale-up's passes for real pods count it free. The
//     nodes holding it are kept by scale-down, and scale-down moves no pod
//     into it.
//   - Those that fit on no ready node go to scale-up's last pass, at the
//     node-addition queue's lowest class: they take room on coming nodes
//     or buy nodes, behind every real pod and balloon, through the same
//     queue, caps and limits.
// Why not balloons: a buffer names a pod shape in any namespace, often a
// fraction of a node; balloon Deployments are whole-node pause pods in
// the autoscaler's own namespace. Writing pods of users' shapes would run
// them under the autoscaler's identity, cost API writes and a preemption
// round for each use, and 7,500-node clusters would pay for it in
// placeholder pods. The warm-pool flags (balloons) keep working beside
// buffers.

// maxBufferStatusWrites bounds the buffers' status writes per loop (the
// rest are written next loop: a status is decided again from scratch).
const maxBufferStatusWrites = 50

// Buffer events on the CapacityBuffer.
const (
	EventBufferScaleUp   = "TriggeredScaleUp"
	EventBufferNoScaleUp = "NotTriggerScaleUp"
)

// buffersState is the CapacityBuffer handling kept between loops; nil
// when --enable-capacity-buffers is off or the API is not served.
type buffersState struct {
	api capacitybuffer.API
	// lastEvent is each buffer's last scale-up event, emitted again only
	// when it changes.
	lastEvent map[types.UID]string
	// lastGood is each buffer's last resolved chunks: a buffer whose
	// workload cannot be read (a timeout, a refused read) keeps them for
	// maxBufferStale, so its nodes keep their room and no status flaps.
	lastGood map[types.UID]goodChunks
	// held are the nodes that held chunks last loop: chunks go there
	// first, so the room stays where it was (a node emptied by its pods
	// is the one scale-down takes, not one the buffer held).
	held map[string]bool
}

type goodChunks struct {
	chunks     capacitybuffer.Chunks
	generation int64
	at         time.Time
}

// maxBufferStale is how long a buffer whose workload cannot be read keeps
// its last chunks.
const maxBufferStale = 10 * time.Minute

// bufferChunks is one buffer's loop.
type bufferChunks struct {
	b      *capacitybuffer.CapacityBuffer
	chunks capacitybuffer.Chunks
	err    error // not ready (a *capacitybuffer.NotReadyError), or a failed read
	// unreadable: its workload could not be read and it has no last
	// chunks (never read, or longer ago than maxBufferStale).
	unreadable bool
	pods       []*apiv1.Pod
	warm       int // held on ready nodes
	coming     int // on coming nodes, or nodes requested or queued for them
	unplaced   int // no node group can take them
	why        string
	groups     []string
	// quota says why its namespace's ResourceQuotas cut its chunks ("":
	// they did not).
	quota string
}

// buffersLoop is one loop's buffers.
type buffersLoop struct {
	buffers []*bufferChunks
	byUID   map[types.UID]*bufferChunks
	// pending are the chunks that fit on no ready node: scale-up's last pass.
	pending []*apiv1.Pod
	// nodes are the ready nodes holding buffer room: scale-down keeps them.
	nodes map[string]bool
	// other counts buffers of strategies this autoscaler does not serve;
	// skipped are those over --max-capacity-buffers(-per-namespace).
	other   int
	skipped []*capacitybuffer.CapacityBuffer
}

// olderBuffer orders buffers oldest first, then by key.
func olderBuffer(a, b *capacitybuffer.CapacityBuffer) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return capacitybuffer.Key(a) < capacitybuffer.Key(b)
}

// bufferNode says a ready node holds room of a capacity buffer.
func (l *loop) bufferNode(name string) bool { return l.buffers != nil && l.buffers.nodes[name] }

// isVirtual says a pod stands for a ProvisioningRequest's or a buffer's
// capacity, not for a pod of the cluster.
func isVirtual(p *apiv1.Pod) bool {
	return provreq.IsBooked(p) || capacitybuffer.IsBufferPod(p) || isExpected(p)
}

// capacityBuffers is the capacity-buffers phase: it turns each buffer of
// the active-capacity strategy into its chunks and books on ready nodes
// those that fit (see the comment above).
func (a *Autoscaler) capacityBuffers(ctx context.Context, l *loop) error {
	bs := a.buffers
	if bs == nil {
		return nil
	}
	all, err := bs.api.List()
	if err != nil {
		return fmt.Errorf("listing CapacityBuffers from cache: %w", err)
	}
	bl := &buffersLoop{byUID: map[types.UID]*bufferChunks{}, nodes: map[string]bool{}}
	l.buffers = bl
	for _, b := range a.activeBuffers(bl, all) {
		a.resolveBuffer(ctx, l, b)
	}
	// Resolved in turns; capped by quotas, booked and reported oldest
	// first.
	sort.SliceStable(bl.buffers, func(i, j int) bool { return olderBuffer(bl.buffers[i].b, bl.buffers[j].b) })
	a.capByQuotas(l, bl.buffers)
	chunks := 0
	for _, bc := range bl.buffers {
		if bc.err == nil {
			bc.pods = capacitybuffer.Pods(bc.b, bc.chunks)
			chunks += len(bc.pods)
		}
	}
	for uid := range bs.lastGood {
		if _, ok := bl.byUID[uid]; !ok {
			delete(bs.lastGood, uid)
		}
	}
	if chunks == 0 {
		bs.held = nil
		return nil
	}
	return a.placeChunks(ctx, l)
}

// activeBuffers are the buffers of the active-capacity strategy this loop
// plans, oldest first with the namespaces in turns: the read budget
// (scalable objects) and the simulation are spent so; the others are
// counted (another strategy) or left out, saying why (#40).
func (a *Autoscaler) activeBuffers(bl *buffersLoop, all []*capacitybuffer.CapacityBuffer) []*capacitybuffer.CapacityBuffer {
	sort.Slice(all, func(i, j int) bool { return olderBuffer(all[i], all[j]) })
	active := all[:0:0]
	for _, b := range all {
		if b.Strategy() != capacitybuffer.ActiveCapacity {
			bl.other++
			continue
		}
		active = append(active, b)
	}
	active, bl.skipped = fairshare.Take(active, func(b *capacitybuffer.CapacityBuffer) string { return b.Namespace },
		a.opts.MaxCapacityBuffersPerNamespace, a.opts.MaxCapacityBuffers, nil)
	a.metrics.CapacityBuffersSkipped.Set(float64(len(bl.skipped)))
	return active
}

// resolveBuffer turns a buffer into its chunks; when its workload cannot
// be read, its last chunks stand for a while (maxBufferStale).
func (a *Autoscaler) resolveBuffer(ctx context.Context, l *loop, b *capacitybuffer.CapacityBuffer) {
	bs, bl := a.buffers, l.buffers
	bc := &bufferChunks{b: b}
	bc.chunks, bc.err = capacitybuffer.Resolve(ctx, bs.api, b)
	var nr *capacitybuffer.NotReadyError
	switch last, ok := bs.lastGood[b.UID]; {
	case bc.err == nil:
		bs.lastGood[b.UID] = goodChunks{chunks: bc.chunks, generation: b.Generation, at: l.now}
	case !errors.As(bc.err, &nr) && ok && last.generation == b.Generation && l.now.Sub(last.at) < maxBufferStale:
		// Its workload could not be read: the last chunks stand.
		bc.chunks, bc.err = last.chunks, nil
	case !errors.As(bc.err, &nr):
		bc.unreadable = true
	}
	bl.buffers = append(bl.buffers, bc)
	bl.byUID[b.UID] = bc
}

// placeChunks places the buffers' chunks on the ready nodes that may take
// them, those that held chunks last loop first (the room stays put); the
// rest are scale-up's last pass.
func (a *Autoscaler) placeChunks(ctx context.Context, l *loop) error {
	bs, bl := a.buffers, l.buffers
	usable := a.bookableNodes(l)
	sort.SliceStable(usable, func(i, j int) bool {
		return bs.held[l.snap.NodeInfo(usable[i]).Node().Name] && !bs.held[l.snap.NodeInfo(usable[j]).Node().Name]
	})
	fork := l.snap.Fork()
	placed := 0
	for _, bc := range bl.buffers {
		if len(bc.pods) == 0 {
			continue
		}
		left, nodes := a.placePods(ctx, fork, bc.pods, usable, freeRoom{})
		bc.warm = len(bc.pods) - len(left)
		placed += len(nodes)
		for _, n := range nodes {
			bl.nodes[n] = true
		}
		bl.pending = append(bl.pending, left...)
	}
	bs.held = bl.nodes
	if placed == 0 {
		return nil
	}
	snap, err := fork.Freeze()
	if err != nil {
		return fmt.Errorf("booking CapacityBuffers' room: %w", err)
	}
	l.snap = snap
	return nil
}

// capByQuotas caps each buffer's chunks by what its namespace's
// ResourceQuotas leave once its ProvisioningRequests took theirs (the
// loop's ledger), the namespace's buffers spending it in turn, oldest
// first; a capped buffer says which quota binds (LimitedByQuotas).
func (a *Autoscaler) capByQuotas(l *loop, buffers []*bufferChunks) {
	for _, bc := range buffers {
		if bc.err != nil || bc.chunks.Template == nil {
			continue
		}
		want := bc.chunks.Replicas
		if got, why := a.quotaLedger(l, bc.b.Namespace).Take(&bc.chunks.Template.Spec, want); got < want {
			bc.chunks.Replicas, bc.quota = got, fmt.Sprintf("%d of its %d chunks: %s", got, want, why)
		}
	}
}

// bufferResults reads each buffer's share of scale-up's outcome: its
// pending chunks placed on coming nodes or in a scale-up are coming, those
// in a refusal or a failed request are unplaced.
func (a *Autoscaler) bufferResults(l *loop, out scaleup.Outcome) {
	bl := l.buffers
	if bl == nil || len(bl.pending) == 0 {
		return
	}
	mark := (&chunkMarker{bl: bl, seen: map[types.UID]bool{}}).mark
	for _, su := range out.Result.ScaleUps {
		mark(su.Pods, func(bc *bufferChunks, _ *apiv1.Pod) {
			if su.Delta > 0 && !slices.Contains(bc.groups, su.Group) {
				bc.groups = append(bc.groups, su.Group)
			}
		})
	}
	for _, ns := range out.Result.NoScale {
		mark(ns.Pods, func(bc *bufferChunks, _ *apiv1.Pod) { bc.unplaced++; bc.why = ns.Reason })
	}
	for _, f := range out.Result.Failed {
		mark(f.Pods, func(bc *bufferChunks, _ *apiv1.Pod) {
			bc.unplaced++
			bc.why = fmt.Sprintf("node group %s: %v", f.Group, f.Err)
		})
	}
	// The rest of the pending chunks fit on coming nodes (or on a ready
	// node the booking did not offer, as one being drained: not warm).
	for _, bc := range bl.buffers {
		bc.coming = len(bc.pods) - bc.warm - bc.unplaced
	}
}

// chunkMarker hands each buffer chunk of scale-up's outcome to its
// buffer, once: a chunk is in one result only.
type chunkMarker struct {
	bl   *buffersLoop
	seen map[types.UID]bool
}

// mark calls f with the buffer of each chunk of pods not marked yet
// (other pods, and chunks of buffers not in the loop, are passed over).
func (m *chunkMarker) mark(pods []*apiv1.Pod, f func(*bufferChunks, *apiv1.Pod)) {
	for _, p := range pods {
		if !capacitybuffer.IsBufferPod(p) || m.seen[p.UID] {
			continue
		}
		if bc := m.bl.byUID[capacitybuffer.BufferOf(p)]; bc != nil {
			m.seen[p.UID] = true
			f(bc, p)
		}
	}
}

// bufferStatus is the status a buffer should have after this loop, and
// the condition that changed last (for the log); nil when unchanged or
// when nothing may be said (a failed read keeps the last status).
func bufferStatus(bc *bufferChunks, now metav1.Time) *capacitybuffer.CapacityBuffer {
	var nr *capacitybuffer.NotReadyError
	if bc.err != nil && !errors.As(bc.err, &nr) {
		return unreadableBufferStatus(bc, now)
	}
	b := bc.b.DeepCopy()
	st := &b.Status
	strategy := capacitybuffer.ActiveCapacity
	st.ProvisioningStrategy = &strategy
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg,
			ObservedGeneration: b.Generation, LastTransitionTime: now})
	}
	if nr != nil {
		st.PodTemplateRef, st.Replicas, st.PodTemplateGeneration = nil, nil, nil
		set(capacitybuffer.ReadyForProvisioning, metav1.ConditionFalse, nr.Reason, nr.Error())
		set(capacitybuffer.Provisioning, metav1.ConditionFalse, capacitybuffer.ReasonNotReady, "CapacityBuffer is not ready for provisioning: "+nr.Error())
	} else {
		c := bc.chunks
		st.PodTemplateRef, st.PodTemplateGeneration = nil, nil
		if c.TemplateRef != "" {
			st.PodTemplateRef = &capacitybuffer.LocalObjectRef{Name: c.TemplateRef}
			gen := c.TemplateGeneration
			st.PodTemplateGeneration = &gen
		}
		n := c.Replicas
		st.Replicas = &n
		set(capacitybuffer.ReadyForProvisioning, metav1.ConditionTrue, capacitybuffer.ReasonAttributesSet,
			fmt.Sprintf("%d chunks of %s", n, c.Source))
		switch {
		case bc.quota != "":
			set(capacitybuffer.ConditionLimitedByQuotas, metav1.ConditionTrue, capacitybuffer.ReasonQuotaLimited, bc.quota)
		case apimeta.FindStatusCondition(st.Conditions, capacitybuffer.ConditionLimitedByQuotas) != nil:
			set(capacitybuffer.ConditionLimitedByQuotas, metav1.ConditionFalse, capacitybuffer.ReasonQuotaNotLimited, "its namespace's ResourceQuotas leave room for every chunk")
		}
		if n == 0 {
			set(capacitybuffer.Provisioning, metav1.ConditionFalse, capacitybuffer.ReasonBufferIsEmpty, "CapacityBuffer has zero replicas")
		} else {
			set(capacitybuffer.Provisioning, metav1.ConditionTrue, capacitybuffer.ReasonFakePodsInjected,
				fmt.Sprintf("%d chunks take room on ready nodes or on nodes bought for them, which pods may use at once (vmss-autoscaler status shows where)", n))
		}
	}
	if equality.Semantic.DeepEqual(b.Status, bc.b.Status) {
		return nil
	}
	return b
}

// unreadableBufferStatus is the status of a buffer whose workload could
// not be read: nil while its last chunks stand for it (its status is
// kept) or when it says so already.
func unreadableBufferStatus(bc *bufferChunks, now metav1.Time) *capacitybuffer.CapacityBuffer {
	if !bc.unreadable {
		return nil
	}
	// No chunks stand for it: say so, keeping what else it said.
	b := bc.b.DeepCopy()
	apimeta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: capacitybuffer.Provisioning, Status: metav1.ConditionFalse,
		Reason: capacitybuffer.ReasonScalableRefUnreadable, Message: "its workload cannot be read, no chunks are placed: " + bc.err.Error(),
		ObservedGeneration: b.Generation, LastTransitionTime: now})
	if equality.Semantic.DeepEqual(b.Status, bc.b.Status) {
		return nil
	}
	return b
}

// skippedBufferStatus is the status of a buffer left out by the bounds
// on buffers (nil when it says so already): Provisioning=False naming the
// flags; the rest of its status is kept (#40: a buffer not planned says
// why, rather than keep a status that says its chunks are placed).
func skippedBufferStatus(b *capacitybuffer.CapacityBuffer, perNS, total int, now metav1.Time) *capacitybuffer.CapacityBuffer {
	cp := b.DeepCopy()
	apimeta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{Type: capacitybuffer.Provisioning, Status: metav1.ConditionFalse,
		Reason: capacitybuffer.ReasonLimitReached,
		Message: fmt.Sprintf("not planned: older CapacityBuffers fill the autoscaler's bounds (--max-capacity-buffers-per-namespace=%d, --max-capacity-buffers=%d); planned when older ones are deleted",
			perNS, total),
		ObservedGeneration: cp.Generation, LastTransitionTime: now})
	if equality.Semantic.DeepEqual(cp.Status, b.Status) {
		return nil
	}
	return cp
}

// writeBuffers writes the buffers' statuses and scale-up events and sets
// their metrics. A conflict is left to the next loop.
func (a *Autoscaler) writeBuffers(ctx context.Context, l *loop) {
	bl := l.buffers
	if bl == nil {
		return
	}
	defer a.reportBuffers(l)
	logger := klog.FromContext(ctx)
	now := metav1.NewTime(l.now)
	var w bufferWrites
	for _, bc := range bl.buffers {
		a.bufferEvent(bc)
		b := bufferStatus(bc, now)
		if b == nil {
			if bc.err != nil {
				logger.V(2).Info("CapacityBuffer's scalable object not read; its status is kept", "buffer", klog.KObj(bc.b), "err", bc.err.Error())
			}
			continue
		}
		if !a.writeBufferStatus(ctx, &w, b) {
			return
		}
	}
	for _, b := range bl.skipped {
		st := skippedBufferStatus(b, a.opts.MaxCapacityBuffersPerNamespace, a.opts.MaxCapacityBuffers, now)
		if st != nil && !a.writeBufferStatus(ctx, &w, st) {
			return
		}
	}
	w.log(logger)
}

// bufferWrites tallies a loop's buffer status writes.
type bufferWrites struct {
	written, conflicts, deferred int
	firstErr                     error
}

// log tells the loop's first failed write and what was written.
func (w *bufferWrites) log(logger klog.Logger) {
	if w.firstErr != nil {
		logger.Error(w.firstErr, "Writing CapacityBuffer statuses; tried again next loop")
	}
	if w.written+w.conflicts+w.deferred > 0 {
		logger.Info("CapacityBuffer statuses written", "written", w.written, "conflicts", w.conflicts, "deferredToNextLoop", w.deferred)
	}
}

// writeBufferStatus writes one buffer's status within the loop's bound
// (the rest are deferred to the next loop) and the leader's fence; false
// when the fence refused (nothing more is written).
func (a *Autoscaler) writeBufferStatus(ctx context.Context, w *bufferWrites, b *capacitybuffer.CapacityBuffer) bool {
	logger := klog.FromContext(ctx)
	if w.written+w.conflicts >= maxBufferStatusWrites {
		w.deferred++
		return true
	}
	if err := a.gate.Write("capacity-buffer-status"); err != nil {
		logger.V(2).Info("CapacityBuffer statuses not written", "err", err.Error())
		return false
	}
	switch err := a.buffers.api.UpdateStatus(ctx, b); {
	case err == nil:
		w.written++
		if c := apimeta.FindStatusCondition(b.Status.Conditions, capacitybuffer.ReadyForProvisioning); c != nil {
			logger.V(2).Info("CapacityBuffer status written", "buffer", klog.KObj(b), "ready", c.Status, "reason", c.Reason)
		}
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		w.conflicts++
	case w.firstErr == nil:
		w.firstErr = err
	}
	return true
}

// bufferEvent emits a buffer's scale-up event when it changed since the
// last one: nodes requested for its chunks, or why some fit nowhere.
func (a *Autoscaler) bufferEvent(bc *bufferChunks) {
	if a.rec == nil {
		return
	}
	typ, reason, msg := apiv1.EventTypeNormal, "", ""
	switch {
	case bc.unplaced > 0:
		typ, reason = apiv1.EventTypeWarning, EventBufferNoScaleUp
		msg = fmt.Sprintf("%d of the buffer's %d chunks fit on no ready or coming node and no node group can take them: %s", bc.unplaced, len(bc.pods), bc.why)
	case len(bc.groups) > 0:
		reason = EventBufferScaleUp
		msg = fmt.Sprintf("the buffer's chunks asked for new nodes of node group %s", strings.Join(bc.groups, ", "))
	default:
		delete(a.buffers.lastEvent, bc.b.UID)
		return
	}
	if a.buffers.lastEvent[bc.b.UID] == reason+msg {
		return
	}
	a.buffers.lastEvent[bc.b.UID] = reason + msg
	ref := &apiv1.ObjectReference{APIVersion: capacitybuffer.GroupVersion.String(), Kind: capacitybuffer.Kind, Namespace: bc.b.Namespace, Name: bc.b.Name, UID: bc.b.UID}
	a.rec.Event(ref, typ, reason, msg)
}

// reportBuffers sets the buffers' metrics.
func (a *Autoscaler) reportBuffers(l *loop) {
	m := a.metrics.Buffers
	counts := map[string]int{"provisioning": 0, "not_ready": 0, "empty": 0}
	pods := map[string]int{"warm": 0, "coming": 0, "unplaced": 0}
	live := map[types.UID]bool{}
	for _, bc := range l.buffers.buffers {
		live[bc.b.UID] = true
		switch {
		case bc.err != nil:
			counts["not_ready"]++
		case bc.chunks.Replicas == 0:
			counts["empty"]++
		default:
			counts["provisioning"]++
		}
		pods["warm"] += bc.warm
		pods["coming"] += bc.coming
		pods["unplaced"] += bc.unplaced
	}
	for uid := range a.buffers.lastEvent {
		if !live[uid] {
			delete(a.buffers.lastEvent, uid)
		}
	}
	for k, n := range counts {
		m.Buffers.WithLabelValues(k).Set(float64(n))
	}
	for k, n := range pods {
		m.Pods.WithLabelValues(k).Set(float64(n))
	}
}

// buffersStatus is the buffers' part of the status.
func (a *Autoscaler) buffersStatus(l *loop) *CapacityBuffersStatus {
	bl := l.buffers
	if bl == nil || len(bl.buffers)+bl.other+len(bl.skipped) == 0 {
		return nil
	}
	st := &CapacityBuffersStatus{OtherStrategies: bl.other, Skipped: len(bl.skipped)}
	for _, bc := range bl.buffers {
		if len(st.Buffers) == maxProvreqStatusEntries {
			st.More++
			continue
		}
		e := CapacityBufferStatus{Buffer: capacitybuffer.Key(bc.b), Chunks: int(bc.chunks.Replicas), Warm: bc.warm, Coming: bc.coming, Unplaced: bc.unplaced}
		switch {
		case bc.err != nil:
			e.Chunks, e.Message = 0, "not ready: "+bc.err.Error()
		case bc.unplaced > 0:
			e.Message = bc.why
		}
		st.Buffers = append(st.Buffers, e)
	}
	return st
}

// CapacityBuffersStatus is the CapacityBuffers' part of the status
// ConfigMap (with --enable-capacity-buffers).
type CapacityBuffersStatus struct {
	// Buffers are the buffers of the active-capacity strategy, oldest
	// first (the first 20).
	Buffers []CapacityBufferStatus `json:"buffers,omitempty"`
	// More counts the buffers left out of the list.
	More int `json:"more,omitempty"`
	// OtherStrategies counts the buffers of strategies this autoscaler
	// does not serve (left alone).
	OtherStrategies int `json:"otherStrategies,omitempty"`
	// Skipped counts the buffers over --max-capacity-buffers or
	// --max-capacity-buffers-per-namespace: not planned this loop.
	Skipped int `json:"skipped,omitempty"`
}

// CapacityBufferStatus is where a buffer's chunks are.
type CapacityBufferStatus struct {
	Buffer string `json:"buffer"`
	// Chunks is the number of chunks the buffer stands for.
	Chunks int `json:"chunks"`
	// Warm chunks hold room on ready nodes; Coming ones on nodes booting,
	// requested or queued; Unplaced ones fit nowhere (Message says why).
	Warm     int    `json:"warm"`
	Coming   int    `json:"coming"`
	Unplaced int    `json:"unplaced"`
	Message  string `json:"message,omitempty"`
}

// buffersMetrics are the CapacityBuffer metrics.
type buffersMetrics struct {
	Buffers *prometheus.GaugeVec
	Pods    *prometheus.GaugeVec
}

func newBuffersMetrics(reg prometheus.Registerer, ns string) buffersMetrics {
	m := buffersMetrics{
		Buffers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "capacity_buffers",
			Help: "CapacityBuffers of the active-capacity strategy, by state: provisioning (chunks placed or being bought), not_ready (the spec cannot be turned into chunks: see its ReadyForProvisioning condition), empty (zero chunks)."},
			[]string{"state"}),
		Pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "capacity_buffer_pods",
			Help: "CapacityBuffers' chunks by state: warm (room held on ready nodes), coming (room on nodes booting, requested or queued), unplaced (no node group can take them)."},
			[]string{"state"}),
	}
	reg.MustRegister(m.Buffers, m.Pods)
	return m
}
