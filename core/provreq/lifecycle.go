package provreq

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/fairshare"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/quota"
)

// Options are the life cycle's times, cluster-autoscaler's by default.
type Options struct {
	// ReservationTime is how long a Provisioned request's capacity stays
	// booked, from its Provisioned transition, unless consumed first.
	ReservationTime time.Duration
	// ExpirationTime: a request not provisioned this long after its
	// creation fails (Failed=True, Expired).
	ExpirationTime time.Duration
	// TerminalTTL: a finished request is deleted this long after it
	// finished.
	TerminalTTL time.Duration
	// InitialBackoff and MaxBackoff bound the wait before a request that
	// was not provisioned is tried again: it doubles from one to the other.
	InitialBackoff, MaxBackoff time.Duration
	// TemplateGrace is how long a request whose PodTemplate cannot be read
	// waits for it (the template's informer may trail the request's)
	// before it fails.
	TemplateGrace time.Duration
}

// DefaultOptions are cluster-autoscaler's: 10 minutes of booking, 7 days
// to be provisioned and to be deleted once finished, retries after 1
// minute doubling to 10.
func DefaultOptions() Options {
	return Options{
		ReservationTime: 10 * time.Minute,
		ExpirationTime:  7 * 24 * time.Hour,
		TerminalTTL:     7 * 24 * time.Hour,
		InitialBackoff:  time.Minute,
		MaxBackoff:      10 * time.Minute,
		TemplateGrace:   time.Minute,
	}
}

// Supported says the request is this autoscaler's: one of its two
// classes, and for check-capacity no processorInstance parameter (that
// names a cluster-autoscaler instance started with
// --check-capacity-processor-instance).
func Supported(r *ProvisioningRequest) bool {
	switch r.Spec.ProvisioningClassName {
	case ClassBestEffortAtomic:
		return true
	case ClassCheckCapacity:
		return r.Spec.Parameters[ProcessorInstanceParameter] == ""
	}
	return false
}

// Attempt is a request to check or scale up for this loop, with its pods.
type Attempt struct {
	Req  *ProvisioningRequest
	Pods []*apiv1.Pod
}

// Booking is a Provisioned request whose capacity is booked: Pods are its
// pods not yet consumed (its pods scheduled so far are running on their
// room already).
type Booking struct {
	Req   *ProvisioningRequest
	Pods  []*apiv1.Pod
	Until time.Time
	// Overdue: the reservation time is over (best-effort-atomic only). The
	// booking is kept while some of its pods still wait for coming nodes
	// (the machines bought for it boot for longer than the reservation
	// time); otherwise the caller ends it with Expire.
	Overdue bool
}

// Update is a request whose conditions changed (a copy), with the
// condition that changed last, for its event.
type Update struct {
	Req       *ProvisioningRequest
	Condition metav1.Condition
	Warning   bool
}

// Waiting is a request in backoff.
type Waiting struct {
	Req     *ProvisioningRequest
	RetryAt time.Time
}

// Plan is one loop's work, oldest requests first.
type Plan struct {
	// Updates are condition changes decided without simulation: Accepted,
	// bookings that expired or were consumed, requests that failed.
	Updates []Update
	// Book are the requests whose capacity is booked now.
	Book []Booking
	// Check are the check-capacity requests to check now.
	Check []Attempt
	// ScaleUp are the best-effort-atomic requests to scale up for now.
	ScaleUp []Attempt
	// Delete are finished requests past the TTL.
	Delete []*ProvisioningRequest
	// Waiting are the requests in backoff.
	Waiting []Waiting
	// Skipped counts the live requests left out by the bounds (SetLimits).
	Skipped int
}

// Tracker keeps what the life cycle needs between loops: each request's
// retry backoff and its pods (a request's spec is immutable: they are
// made once). It holds no state a restart must keep: a new leader retries
// at once and starts the grace periods again. Not safe for concurrent use.
//
// It never sets CapacityRevoked: Kueue (v0.17) rejects the admission check
// of a request whose capacity is revoked and deactivates its workload, even
// a running one. Cluster-autoscaler never sets it either.
type Tracker struct {
	opts   Options
	limits limits
	// claims are the coming nodes a best-effort-atomic booking bought
	// (per group), the most of them it may hold; lost says since when a
	// booking's pods fit nowhere it may hold room.
	claims  map[types.UID]map[string]int
	lost    map[types.UID]time.Time
	backoff map[types.UID]backoff
	pods    map[types.UID]podsEntry
	seen    map[types.UID]bool
}

type backoff struct {
	delay time.Duration
	next  time.Time
}

// podsEntry is a request's pod sets, made from templates at these
// versions: its shapes, never its pods (expanded for each loop's use).
type podsEntry struct {
	versions []string
	shapes   []Shape
}

// NewTracker returns an empty tracker.
func NewTracker(o Options) *Tracker {
	return &Tracker{opts: o, backoff: map[types.UID]backoff{}, pods: map[types.UID]podsEntry{}, seen: map[types.UID]bool{},
		claims: map[types.UID]map[string]int{}, lost: map[types.UID]time.Time{}}
}

// Options are the tracker's options.
func (t *Tracker) Options() Options { return t.opts }

// limits bound the requests a loop plans (0: none).
type limits struct{ perNS, total int }

// SetLimits bounds the live requests not yet booked that a loop plans:
// perNS of a namespace and total in all, booked ones counted against
// both (--max-provisioning-requests(-per-namespace), which may change
// between loops).
func (t *Tracker) SetLimits(perNS, total int) { t.limits = limits{perNS: perNS, total: total} }

// skip is a live request left out by the bounds: it says so
// (Provisioned=False, RequestLimitReached, once) and waits; it still
// fails when it expires.
func (t *Tracker) skip(now time.Time, r *ProvisioningRequest, p *Plan) {
	if now.Sub(r.CreationTimestamp.Time) > t.opts.ExpirationTime {
		if u := t.set(r, Failed, metav1.ConditionTrue, ReasonExpired,
			fmt.Sprintf("ProvisioningRequest is expired: not provisioned within %s of its creation", t.opts.ExpirationTime), true, now); u != nil {
			p.Updates = append(p.Updates, *u)
		}
		return
	}
	msg := fmt.Sprintf("not planned: older requests fill the autoscaler's bounds (--max-provisioning-requests-per-namespace=%d, --max-provisioning-requests=%d); planned when older ones finish",
		t.limits.perNS, t.limits.total)
	// Accepted too: Kueue (v0.17) shows the Provisioned message on the
	// workload only once the request is Accepted.
	cp := r.DeepCopy()
	accepted := SetCondition(cp, Accepted, metav1.ConditionTrue, ReasonAccepted, acceptedMessage, now)
	if provisioned := SetCondition(cp, Provisioned, metav1.ConditionFalse, ReasonLimitReached, msg, now); accepted || provisioned {
		p.Updates = append(p.Updates, Update{Req: cp, Condition: *Find(cp, Provisioned), Warning: true})
	}
	p.Skipped++
}

// Plan decides the loop's work for the requests (any order; the cache's
// objects, never changed: updates are copies). consumed(r) are r's
// consuming pods scheduled now, asked only of Provisioned requests.
// LedgerGetter returns a namespace's ResourceQuota ledger of the loop
// (nil: no quota).
type LedgerGetter func(namespace string) *quota.Ledger

// Plan decides what each request needs this loop. consumed are a
// request's scheduled consumers, waiting how many of its consumers exist
// unscheduled (counted in their namespace's quotas already), ledger the
// namespaces' quota ledgers of the loop (nil: none).
func (t *Tracker) Plan(now time.Time, reqs []*ProvisioningRequest, consumed func(*ProvisioningRequest) []*apiv1.Pod, waiting func(*ProvisioningRequest) int,
	get TemplateGetter, ledger LedgerGetter) Plan {
	sorted := plannable(reqs)
	var p Plan
	seen := make(map[types.UID]bool, len(sorted))
	// The pods of a request are never created until it is provisioned:
	// no ResourceQuota sees them. Each namespace's quotas are spent by
	// its requests in turn (booked ones first: their pods are coming),
	// and a request whose pods would not fit is not provisioned (#40).
	if ledger == nil {
		ledger = func(string) *quota.Ledger { return nil }
	}
	// Bounded work (#40): booked requests are planned always (their
	// capacity is promised), finished ones cost nothing; the rest are
	// planned up to the bounds, the namespaces in turns, and those left
	// out say so and wait.
	held := map[string]int{}
	var open []*ProvisioningRequest
	for _, r := range sorted {
		seen[r.UID] = true
		switch {
		case Finished(r):
		case IsTrue(r, Provisioned):
			held[r.Namespace]++
		default:
			open = append(open, r)
			continue
		}
		t.plan(now, r, consumed, waiting, get, ledger(r.Namespace), &p)
	}
	kept, left := open, []*ProvisioningRequest(nil)
	if t.limits.total > 0 {
		kept, left = fairshare.Take(open, func(r *ProvisioningRequest) string { return r.Namespace }, t.limits.perNS, t.limits.total, held)
	}
	for _, r := range kept {
		t.plan(now, r, consumed, waiting, get, ledger(r.Namespace), &p)
	}
	for _, r := range left {
		t.skip(now, r, &p)
	}
	t.forgetGone(seen)
	return p
}

// plannable are the supported requests in the order Plan spends quotas
// and bounds: booked ones first, then oldest first.
func plannable(reqs []*ProvisioningRequest) []*ProvisioningRequest {
	sorted := make([]*ProvisioningRequest, 0, len(reqs))
	for _, r := range reqs {
		if Supported(r) {
			sorted = append(sorted, r)
		}
	}
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return Key(a) < Key(b)
	})
	sort.SliceStable(sorted, func(i, j int) bool { return IsTrue(sorted[i], Provisioned) && !IsTrue(sorted[j], Provisioned) })
	return sorted
}

// forgetGone forgets the requests not seen in this Plan.
func (t *Tracker) forgetGone(seen map[types.UID]bool) {
	for uid := range t.seen {
		if !seen[uid] {
			delete(t.backoff, uid)
			delete(t.pods, uid)
			delete(t.claims, uid)
			delete(t.lost, uid)
		}
	}
	t.seen = seen
}

func (t *Tracker) plan(now time.Time, r *ProvisioningRequest, consumed func(*ProvisioningRequest) []*apiv1.Pod, waiting func(*ProvisioningRequest) int,
	get TemplateGetter, led *quota.Ledger, p *Plan) {
	if Finished(r) {
		t.planFinished(now, r, p)
		return
	}
	e := &conditionEdits{r: r, now: now}
	defer e.flush(p)
	if IsTrue(r, Provisioned) {
		t.planBooking(now, r, consumed, waiting, get, led, e, p)
		return
	}
	t.planAttempt(now, r, get, led, e, p)
}

// conditionEdits are one request's condition changes of a loop, made on
// one copy; the one changed last names the update's event.
type conditionEdits struct {
	r, cp *ProvisioningRequest
	last  *Update
	now   time.Time
}

func (e *conditionEdits) set(ct string, s metav1.ConditionStatus, reason, msg string, warn bool) {
	if e.cp == nil {
		e.cp = e.r.DeepCopy()
	}
	if SetCondition(e.cp, ct, s, reason, msg, e.now) {
		e.last = &Update{Condition: *Find(e.cp, ct), Warning: warn}
	}
}

func (e *conditionEdits) flush(p *Plan) {
	if e.last != nil {
		e.last.Req = e.cp
		p.Updates = append(p.Updates, *e.last)
	}
}

// planFinished forgets a finished request and deletes it past the TTL.
func (t *Tracker) planFinished(now time.Time, r *ProvisioningRequest, p *Plan) {
	t.forgetAttempts(r.UID)
	delete(t.pods, r.UID)
	delete(t.claims, r.UID)
	delete(t.lost, r.UID)
	if last := lastTransition(r); !last.IsZero() && now.Sub(last) > t.opts.TerminalTTL {
		p.Delete = append(p.Delete, r)
	}
}

// planBooking is a Provisioned request: its booking consumed, expired, or
// booked again this loop with its unconsumed pods.
func (t *Tracker) planBooking(now time.Time, r *ProvisioningRequest, consumed func(*ProvisioningRequest) []*apiv1.Pod, waiting func(*ProvisioningRequest) int,
	get TemplateGetter, led *quota.Ledger, e *conditionEdits, p *Plan) {
	o := t.opts
	t.forgetAttempts(r.UID)
	since := Find(r, Provisioned).LastTransitionTime.Time
	until := since.Add(o.ReservationTime)
	total := Count(r)
	consumers := consumed(r)
	used := len(consumers)
	if used >= total {
		e.set(BookingExpired, metav1.ConditionTrue, ReasonBookingConsumed,
			fmt.Sprintf("Capacity booking is consumed: all %d pods consuming the request are scheduled", total), false)
		return
	}
	overdue := !now.Before(until)
	if overdue && r.Spec.ProvisioningClassName != ClassBestEffortAtomic {
		e.set(BookingExpired, metav1.ConditionTrue, ReasonReservationTimeExpired, reservationExpiredMessage(o, used, total), false)
		return
	}
	pods, err := t.bookedPods(r, get)
	if err != nil {
		// Never Failed once Provisioned: Kueue would evict the admitted
		// workload. Without its pods (a template gone before they were
		// ever made, as after a restart) the booking just ends.
		e.set(BookingExpired, metav1.ConditionTrue, ReasonReservationTimeExpired,
			"Capacity booking ended: the request's pods cannot be made to book its capacity: "+err.Error(), false)
		return
	}
	// The pods scheduled hold their room themselves.
	unconsumed := Unconsumed(pods, consumers)
	// Booked: counted in the quotas as far as they fit (never taken
	// back), less its consumers that exist unscheduled, which the
	// quotas' status.used counts already.
	coming := unconsumed
	if waiting != nil {
		coming = coming[:max(0, len(coming)-waiting(r))]
	}
	led.TakeSome(specsOf(coming))
	p.Book = append(p.Book, Booking{Req: r, Pods: unconsumed, Until: until, Overdue: overdue})
}

// planAttempt is a request not provisioned yet: expired, refused, waiting
// (its template, its backoff, its namespace's quota) or tried this loop.
func (t *Tracker) planAttempt(now time.Time, r *ProvisioningRequest, get TemplateGetter, led *quota.Ledger, e *conditionEdits, p *Plan) {
	o := t.opts
	if now.Sub(r.CreationTimestamp.Time) > o.ExpirationTime {
		e.set(Failed, metav1.ConditionTrue, ReasonExpired,
			fmt.Sprintf("ProvisioningRequest is expired: not provisioned within %s of its creation", o.ExpirationTime), true)
		return
	}
	if !IsTrue(r, Accepted) {
		e.set(Accepted, metav1.ConditionTrue, ReasonAccepted, acceptedMessage, false)
	}
	if why := TooManyPods(r); why != "" {
		e.set(Failed, metav1.ConditionTrue, ReasonFailedToCreatePods, why, true)
		return
	}
	shapes, err := t.shapesOf(r, get)
	if err != nil {
		if now.Sub(r.CreationTimestamp.Time) < o.TemplateGrace {
			return // the template's informer may trail the request's
		}
		e.set(Failed, metav1.ConditionTrue, ReasonFailedToCreatePods, err.Error(), true)
		return
	}
	if t.waitsBackoff(now, r, p) {
		return
	}
	// Made only now: a request in backoff costs its shapes, not its pods.
	pods := Expand(r, shapes)
	if ok, why := led.TakeAll(specsOf(pods)); !ok {
		next := t.backOff(now, r.UID)
		e.set(Provisioned, metav1.ConditionFalse, ReasonExceedsQuota,
			fmt.Sprintf("its %d pods exceed what the namespace's ResourceQuotas leave (%s); tried again in %s", len(pods), why, t.backoff[r.UID].delay), true)
		p.Waiting = append(p.Waiting, Waiting{Req: r, RetryAt: next})
		return
	}
	a := Attempt{Req: r, Pods: pods}
	if e.cp != nil {
		a.Req = e.cp // carries the Accepted just set
	}
	if r.Spec.ProvisioningClassName == ClassCheckCapacity {
		p.Check = append(p.Check, a)
	} else {
		p.ScaleUp = append(p.ScaleUp, a)
	}
}

// waitsBackoff says a request waits out its backoff (then listed in
// p.Waiting). After a restart the first retry waits the initial backoff
// from the last failure, as cluster-autoscaler's does.
func (t *Tracker) waitsBackoff(now time.Time, r *ProvisioningRequest, p *Plan) bool {
	b, ok := t.backoff[r.UID]
	if ok && now.Before(b.next) {
		p.Waiting = append(p.Waiting, Waiting{Req: r, RetryAt: b.next})
		return true
	}
	if ok {
		return false
	}
	c := Find(r, Provisioned)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonCapacityIsNotFound {
		return false
	}
	if next := c.LastTransitionTime.Add(t.opts.InitialBackoff); now.Before(next) {
		t.backoff[r.UID] = backoff{delay: t.opts.InitialBackoff, next: next}
		p.Waiting = append(p.Waiting, Waiting{Req: r, RetryAt: next})
		return true
	}
	return false
}

// backOff doubles a request's backoff (from the initial one up to the
// most) and returns when it is tried again.
func (t *Tracker) backOff(now time.Time, uid types.UID) time.Time {
	b, seen := t.backoff[uid]
	if !seen {
		b.delay = t.opts.InitialBackoff
	} else {
		b.delay = min(2*b.delay, t.opts.MaxBackoff)
	}
	b.next = now.Add(b.delay)
	t.backoff[uid] = b
	return b.next
}

// specsOf are the pods' specs, one a pod: the pods of a pod set (shallow
// copies of one pod: pods.go) give the same pointer, so a ledger counts
// them together.
func specsOf(pods []*apiv1.Pod) []*apiv1.PodSpec {
	out := make([]*apiv1.PodSpec, len(pods))
	first := map[*apiv1.Container]*apiv1.PodSpec{}
	for i, p := range pods {
		out[i] = &p.Spec
		if len(p.Spec.Containers) == 0 {
			continue
		}
		key := &p.Spec.Containers[0] // the pod set's shared backing array
		if s, ok := first[key]; ok {
			out[i] = s
		} else {
			first[key] = &p.Spec
		}
	}
	return out
}

func reservationExpiredMessage(o Options, used, total int) string {
	return fmt.Sprintf("Capacity reservation time is expired: the capacity was booked for %s, %d of %d pods consumed it", o.ReservationTime, used, total)
}

// ClaimDetail is the key of status.provisioningClassDetails where a
// best-effort-atomic request's booking keeps the coming nodes it holds,
// per group ("gpu-a=5,gpu-b=3"): written with its Provisioned=True, read
// back by a new leader. Kueue (v0.17) reads only the details a
// ProvisioningRequestConfig's podSetUpdates name.
const ClaimDetail = "vmss-autoscaler.io/coming-nodes"

// Claim sets on u (a Provisioned=True update of a best-effort-atomic
// request) the coming nodes its booking may hold, per group: the nodes
// bought for it and the coming nodes its pods were planned on. They are
// kept in memory and in the request's status (ClaimDetail).
func (t *Tracker) Claim(u *Update, nodes map[string]int) {
	if u == nil || len(nodes) == 0 {
		return
	}
	c := make(map[string]int, len(nodes))
	for g, n := range nodes {
		if n > 0 {
			c[g] = n
		}
	}
	t.claims[u.Req.UID] = c
	if u.Req.Status.ProvisioningClassDetails == nil {
		u.Req.Status.ProvisioningClassDetails = map[string]Detail{}
	}
	u.Req.Status.ProvisioningClassDetails[ClaimDetail] = Detail(formatClaim(c))
}

func formatClaim(c map[string]int) string {
	groups := make([]string, 0, len(c))
	for g := range c {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = g + "=" + strconv.Itoa(c[g])
	}
	return strings.Join(parts, ",")
}

// parseClaim reads a ClaimDetail; a malformed entry is skipped (the
// booking then holds less, never more).
func parseClaim(s string) map[string]int {
	c := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		g, n, ok := strings.Cut(part, "=")
		v, err := strconv.Atoi(n)
		if !ok || g == "" || err != nil || v <= 0 {
			continue
		}
		c[g] = v
	}
	return c
}

// ClaimOf is the coming nodes a booking may hold this loop, per group:
// those it bought or was planned on, never more than its group has coming
// now (upcoming says how many, ok false when the group's size is unknown
// this loop: then not lowered). Asked every loop: the bound only shrinks,
// so once its nodes are up a booking whose room on them was taken cannot
// move to nodes coming for other pods (#40). A new leader reads it from
// the request's status (ClaimDetail), whole again, lowered at once to what
// each group has coming. It cannot tell its nodes from others' coming in
// the same group at the same time.
func (t *Tracker) ClaimOf(r *ProvisioningRequest, upcoming func(group string) (int, bool)) map[string]int {
	c, ok := t.claims[r.UID]
	if !ok {
		c = parseClaim(string(r.Status.ProvisioningClassDetails[ClaimDetail]))
		t.claims[r.UID] = c // an empty claim is kept: spent, never read again
	}
	for g, n := range c {
		if up, ok := upcoming(g); ok && up < n {
			n = up
			c[g] = n
		}
		if n <= 0 {
			delete(c, g)
		}
	}
	if len(c) == 0 {
		return nil
	}
	out := make(map[string]int, len(c))
	for g, n := range c {
		out[g] = n
	}
	return out
}

// Lost is a booking some of whose pods (unplaced of them) fit nowhere it
// may hold room: on no ready node, and on none of the coming nodes it
// bought. Other pods took its room (the scheduler does not see
// bookings) or a node it held is gone. It is noted first; if it is still
// so LostGrace later (a node briefly unusable is not a loss), the booking
// ends (BookingExpired=True, CapacityBookingLost): its room is freed and
// its consumers are planned as any pod, at once, rather than wait out
// the reservation time for capacity that is not there. Kueue (v0.17,
// provisioning admission check) ignores BookingExpired once the workload
// is admitted, and retries with a new request before. The update is nil
// while only noted.
func (t *Tracker) Lost(r *ProvisioningRequest, unplaced, used int, now time.Time) *Update {
	since, ok := t.lost[r.UID]
	if !ok {
		t.lost[r.UID] = now
		return nil
	}
	if now.Sub(since) < LostGrace {
		return nil
	}
	delete(t.lost, r.UID)
	return t.set(r, BookingExpired, metav1.ConditionTrue, ReasonBookingLost,
		fmt.Sprintf("Capacity booking ended: %d of its pods fit on no ready node and on no node coming for it (other pods took the room, or a node is gone), %d of %d pods consumed it; its pods are planned as any pod",
			unplaced, used, Count(r)), true, now)
}

// LostGrace is how long a booking's pods fit nowhere it may hold room
// before it ends: a node's NotReady blip or a loop between a node's
// registration and its readiness is not a loss; a node that failed its
// preflight or was removed is.
const LostGrace = 30 * time.Second

// Held says a booking's pods all fit where it may hold room this loop.
func (t *Tracker) Held(uid types.UID) { delete(t.lost, uid) }

// Expire returns r marked BookingExpired=True for an overdue booking whose
// pods no longer wait for coming nodes; used of its pods consumed it.
func (t *Tracker) Expire(r *ProvisioningRequest, used int, now time.Time) *Update {
	return t.set(r, BookingExpired, metav1.ConditionTrue, ReasonReservationTimeExpired, reservationExpiredMessage(t.opts, used, Count(r)), false, now)
}

// bookedPods returns a Provisioned request's pods: made again when a
// template changed, or those made before when a template can no longer
// be read (a booking never fails).
func (t *Tracker) bookedPods(r *ProvisioningRequest, get TemplateGetter) ([]*apiv1.Pod, error) {
	shapes, err := t.shapesOf(r, get)
	if err != nil {
		e, ok := t.pods[r.UID]
		if !ok {
			return nil, err
		}
		shapes = e.shapes
	}
	return Expand(r, shapes), nil
}

// forgetAttempts drops the retry state of a request that stopped being
// tried (provisioned, finished).
func (t *Tracker) forgetAttempts(uid types.UID) { delete(t.backoff, uid) }

// shapesOf returns a request's shapes, made again only when one of its
// templates changed.
func (t *Tracker) shapesOf(r *ProvisioningRequest, get TemplateGetter) ([]Shape, error) {
	versions := make([]string, len(r.Spec.PodSets))
	for i, ps := range r.Spec.PodSets {
		pt, err := get(r.Namespace, ps.PodTemplateRef.Name)
		if err != nil {
			return nil, fmt.Errorf("spec.podSets[%d].podTemplateRef.name of %s %s: PodTemplate %s/%s: %w",
				i, Kind, Key(r), r.Namespace, ps.PodTemplateRef.Name, err)
		}
		versions[i] = string(pt.UID) + "/" + pt.ResourceVersion
	}
	if e, ok := t.pods[r.UID]; ok && equalStrings(e.versions, versions) {
		return e.shapes, nil
	}
	shapes, err := Shapes(r, get)
	if err != nil {
		return nil, err
	}
	t.pods[r.UID] = podsEntry{versions: versions, shapes: shapes}
	return shapes, nil
}

// Provisioned returns r (a copy, or the copy given) marked
// Provisioned=True: its capacity is booked from now. The update is
// nil when nothing changed.
func (t *Tracker) Provisioned(r *ProvisioningRequest, reason, msg string, now time.Time) *Update {
	delete(t.backoff, r.UID)
	return t.set(r, Provisioned, metav1.ConditionTrue, reason, msg, false, now)
}

// Queued returns r marked Provisioned=False while its nodes wait in the
// node-addition queue: tried again next loop, with no backoff.
func (t *Tracker) Queued(r *ProvisioningRequest, msg string, now time.Time) *Update {
	delete(t.backoff, r.UID)
	return t.set(r, Provisioned, metav1.ConditionFalse, ReasonCapacityIsQueued, msg, false, now)
}

// NotProvisioned returns r marked Provisioned=False, tried again after a
// backoff (1 minute doubling to 10), or, for a check-capacity request
// with parameters.noRetry "true", Failed=True. why says what is missing.
func (t *Tracker) NotProvisioned(r *ProvisioningRequest, why string, now time.Time) *Update {
	if r.Spec.ProvisioningClassName == ClassCheckCapacity && r.Spec.Parameters[NoRetryParameter] == "true" {
		delete(t.backoff, r.UID)
		return t.set(r, Failed, metav1.ConditionTrue, ReasonCapacityIsNotFound,
			"Capacity is not found and parameters.noRetry is \"true\": "+why, true, now)
	}
	t.backOff(now, r.UID)
	return t.set(r, Provisioned, metav1.ConditionFalse, ReasonCapacityIsNotFound,
		fmt.Sprintf("Capacity is not found, tried again in %s: %s", t.backoff[r.UID].delay, why), true, now)
}

// NextRetry is when a request in backoff is tried again (zero: not in backoff).
func (t *Tracker) NextRetry(uid types.UID) time.Time { return t.backoff[uid].next }

func (t *Tracker) set(r *ProvisioningRequest, ct string, s metav1.ConditionStatus, reason, msg string, warn bool, now time.Time) *Update {
	cp := r.DeepCopy()
	if !SetCondition(cp, ct, s, reason, msg, now) {
		return nil
	}
	return &Update{Req: cp, Condition: *Find(cp, ct), Warning: warn}
}

// lastTransition is the latest transition of the conditions that finish
// or provision a request.
func lastTransition(r *ProvisioningRequest) time.Time {
	var last time.Time
	for _, ct := range []string{Provisioned, Failed, BookingExpired, CapacityRevoked} {
		if c := Find(r, ct); c != nil && c.LastTransitionTime.After(last) {
			last = c.LastTransitionTime.Time
		}
	}
	return last
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Unconsumed are a request's pods less one for each consuming pod: the
// first not yet taken whose requests equal the consumer's (its own pod
// set's), else the last one left (a consumer of a shape the request never
// asked for still uses its room). The pods' order is kept.
func Unconsumed(pods, consumers []*apiv1.Pod) []*apiv1.Pod {
	if len(consumers) == 0 {
		return pods
	}
	if len(consumers) >= len(pods) {
		return nil
	}
	// The pods of each shape, in order; a consumer takes the first left of
	// its shape, else the last pod left.
	byKey := byShape(pods)
	taken := make([]bool, len(pods))
	last := len(pods) - 1
	for _, c := range consumers {
		hit := firstOfShape(byKey, requestsKey(c), taken)
		if hit < 0 {
			for taken[last] {
				last--
			}
			hit = last
		}
		taken[hit] = true
	}
	out := make([]*apiv1.Pod, 0, len(pods)-len(consumers))
	for i, p := range pods {
		if !taken[i] {
			out = append(out, p)
		}
	}
	return out
}

// byShape is the indexes of the pods of each shape (requestsKey), in
// order.
func byShape(pods []*apiv1.Pod) map[string][]int {
	byKey := map[string][]int{}
	key := ""
	for i, p := range pods {
		if i == 0 || !samePodSpec(p, pods[i-1]) { // the pods of a set share their spec
			key = requestsKey(p)
		}
		byKey[key] = append(byKey[key], i)
	}
	return byKey
}

// firstOfShape is the first pod of shape k not taken, or -1; the pods it
// passes leave byKey.
func firstOfShape(byKey map[string][]int, k string, taken []bool) int {
	hit := -1
	for q := byKey[k]; len(q) > 0 && hit < 0; q = q[1:] {
		if !taken[q[0]] {
			hit = q[0]
		}
		byKey[k] = q[1:]
	}
	return hit
}

// samePodSpec says two pods made by Pods share their spec (one pod set).
func samePodSpec(a, b *apiv1.Pod) bool {
	return len(a.Spec.Containers) > 0 && len(b.Spec.Containers) > 0 && &a.Spec.Containers[0] == &b.Spec.Containers[0]
}

// requestsKey is a pod's resource requests, as a comparable string.
func requestsKey(p *apiv1.Pod) string {
	req := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
	names := make([]string, 0, len(req))
	for n := range req {
		names = append(names, string(n))
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		q := req[apiv1.ResourceName(n)]
		b.WriteString(n + "=" + q.String() + ";")
	}
	return b.String()
}
