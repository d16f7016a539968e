package core

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/quota"
)

// provreqGangSource names the gangs a best-effort-atomic request's pods
// make: their key, "<namespace>/provisioningrequest:<name>", can be no
// PodGroup's (a name has no colon).
const provreqGangSource gang.Source = "provisioning-request"

// maxProvreqStatusWrites bounds the requests' status writes per loop: a
// burst of hundreds of requests (a queue of jobs submitted at once) is
// written over a few loops, not in one storm on the API server. A request
// not written is decided again next loop.
const maxProvreqStatusWrites = 100

// maxProvreqStatusEntries bounds each list of requests in the status.
const maxProvreqStatusEntries = 20

// provreqState is the ProvisioningRequest handling kept between loops;
// nil when --enable-provisioning-requests is off or the API is not served.
type provreqState struct {
	api     provreq.API
	tracker *provreq.Tracker
}

// provreqLoop is one loop's requests, from the provisioning-requests
// phase to scale-up (gangs, bookings on coming nodes, results), scale-down
// (the ready nodes whose room is booked) and the status.
type provreqLoop struct {
	// gangs are the best-effort-atomic requests to scale up for, oldest
	// first; atomic finds their attempt by gang key, gangOf a gang's key by
	// the request's UID.
	gangs  []*gang.Gang
	atomic map[string]provreq.Attempt
	gangOf map[types.UID]string
	// bookings are the requests whose capacity is booked; upcoming are
	// their pods that fit on no ready node, with the coming nodes they
	// may take (scale-up places them before its passes).
	bookings []provreq.Booking
	upcoming []scaleup.Booking
	// bookedNodes are ready nodes holding booked room: scale-down keeps them.
	bookedNodes map[string]bool
	waiting     []provreq.Waiting
	// skipped counts the live requests left out by
	// --max-provisioning-requests(-per-namespace).
	skipped int
	// pending are the condition changes to write at the end of scale-up,
	// one per request (a later change is made on the earlier's copy).
	pending map[types.UID]*provreq.Update
	order   []types.UID
	all     []*provreq.ProvisioningRequest
}

func (pl *provreqLoop) put(u *provreq.Update) {
	if u == nil {
		return
	}
	if _, ok := pl.pending[u.Req.UID]; !ok {
		pl.order = append(pl.order, u.Req.UID)
	}
	pl.pending[u.Req.UID] = u
}

// latest is a request as this loop leaves it: with its pending change.
func (pl *provreqLoop) latest(r *provreq.ProvisioningRequest) *provreq.ProvisioningRequest {
	if u, ok := pl.pending[r.UID]; ok {
		return u.Req
	}
	return r
}

// bookedNode says a ready node holds room booked by a request.
func (l *loop) bookedNode(name string) bool { return l.provreq != nil && l.provreq.bookedNodes[name] }

// provisioningRequests is the provisioning-requests phase: it reads the
// requests, writes what their life cycle decides without simulation
// (Accepted, bookings expired or consumed, failures, deletion of finished
// ones), books the capacity of Provisioned requests in the snapshot (the
// rest of the loop sees it taken), checks check-capacity requests on the
// cluster as it is, and hands best-effort-atomic requests to scale-up as
// gangs.
func (a *Autoscaler) provisioningRequests(ctx context.Context, l *loop) error {
	pr := a.provreq
	if pr == nil {
		return nil
	}
	reqs, err := pr.api.List()
	if err != nil {
		return fmt.Errorf("listing ProvisioningRequests from cache: %w", err)
	}
	pl := &provreqLoop{atomic: map[string]provreq.Attempt{}, gangOf: map[types.UID]string{},
		bookedNodes: map[string]bool{}, pending: map[types.UID]*provreq.Update{}, all: reqs}
	l.provreq = pl
	count, waiting := consumersOf(l)
	pr.tracker.SetLimits(a.opts.MaxProvisioningRequestsPerNamespace, a.opts.MaxProvisioningRequests)
	plan := pr.tracker.Plan(l.now, reqs, count, waiting, pr.api.PodTemplate, func(ns string) *quota.Ledger { return a.quotaLedger(l, ns) })
	for i := range plan.Updates {
		pl.put(&plan.Updates[i])
	}
	pl.waiting, pl.skipped = plan.Waiting, plan.Skipped
	a.deleteFinishedRequests(ctx, plan.Delete)
	if len(plan.Book)+len(plan.Check) > 0 {
		if err := a.bookAndCheck(ctx, l, plan); err != nil {
			return err
		}
	}
	for _, at := range plan.ScaleUp {
		k := gang.Key{Namespace: at.Req.Namespace, Name: "provisioningrequest:" + at.Req.Name, Source: provreqGangSource}
		pl.gangs = append(pl.gangs, &gang.Gang{Key: k, Min: len(at.Pods), MinKnown: true, Pending: at.Pods, Since: at.Req.CreationTimestamp.Time})
		pl.atomic[k.String()] = at
		pl.gangOf[at.Req.UID] = k.String()
	}
	return nil
}

// consumersOf answers, per request, its scheduled consuming pods and how
// many of its consumers exist unscheduled, each read from the loop once
// and only when asked.
func consumersOf(l *loop) (func(*provreq.ProvisioningRequest) []*apiv1.Pod, func(*provreq.ProvisioningRequest) int) {
	var consumed map[string][]*apiv1.Pod
	count := func(r *provreq.ProvisioningRequest) []*apiv1.Pod {
		if consumed == nil {
			consumed = consumingPods(l.snap)
		}
		return consumed[provreq.Key(r)]
	}
	var unscheduled map[string]int
	waiting := func(r *provreq.ProvisioningRequest) int {
		if unscheduled == nil {
			unscheduled = map[string]int{}
			for _, p := range l.unbound {
				if name, ok := provreq.Consumes(p); ok && !provreq.IsBooked(p) && p.DeletionTimestamp == nil {
					unscheduled[p.Namespace+"/"+name]++
				}
			}
		}
		return unscheduled[provreq.Key(r)]
	}
	return count, waiting
}

// bookAndCheck places the bookings' pods, then the check-capacity
// requests', on the ready nodes that may take them, in the loop's
// snapshot: the rest of the loop sees the room taken.
func (a *Autoscaler) bookAndCheck(ctx context.Context, l *loop, plan provreq.Plan) error {
	usable := a.bookableNodes(l)
	free := a.bookingFrees(l, usable)
	fork := l.snap.Fork()
	placed := 0
	for _, b := range plan.Book {
		placed += a.book(ctx, l, &fork, b, usable, free)
	}
	for _, at := range plan.Check {
		placed += a.checkCapacity(ctx, l, &fork, at, usable, free)
	}
	if placed == 0 {
		return nil
	}
	snap, err := fork.Freeze()
	if err != nil {
		return fmt.Errorf("booking ProvisioningRequests' capacity: %w", err)
	}
	l.snap = snap
	return nil
}

// book holds a Provisioned request's room (#40): on ready nodes and, for
// a best-effort-atomic booking, on the coming nodes it bought, never on
// nodes coming for other pods; a check-capacity booking never waits for
// coming nodes (it buys nothing). A booking whose pods fit nowhere it may
// hold room holds none, and is lost (Tracker.Lost) or, past its
// reservation time, ends. It returns the ready nodes it took.
func (a *Autoscaler) book(ctx context.Context, l *loop, fork **snapshot.Fork, b provreq.Booking, usable []int, free freeRoom) int {
	pr, pl := a.provreq, l.provreq
	child := (*fork).Fork()
	left, nodes := a.placePods(ctx, child, b.Pods, usable, free)
	used := provreq.Count(b.Req) - len(b.Pods)
	if b.Overdue && len(left) == 0 {
		// Past its reservation time, and its pods wait for no coming
		// node: the booking ends.
		pl.put(pr.tracker.Expire(b.Req, used, l.now))
		return 0
	}
	// Asked every loop, so the claim follows its nodes as they come up,
	// whether or not its pods wait for them now.
	claim := pr.tracker.ClaimOf(b.Req, a.upcomingOf(l))
	if len(left) > 0 && len(claim) == 0 {
		if b.Overdue {
			pl.put(pr.tracker.Expire(b.Req, used, l.now))
		} else {
			pl.put(pr.tracker.Lost(b.Req, len(left), used, l.now))
		}
		return 0
	}
	if len(left) == 0 {
		pr.tracker.Held(b.Req.UID)
	}
	*fork = child
	for _, n := range nodes {
		pl.bookedNodes[n] = true
	}
	pl.bookings = append(pl.bookings, b)
	if len(left) > 0 {
		pl.upcoming = append(pl.upcoming, scaleup.Booking{ID: string(b.Req.UID), Pods: left, Nodes: claim})
	}
	return len(nodes)
}

// checkCapacity answers a check-capacity request on the cluster as it is:
// Provisioned, its room booked from now on (later requests and pods of
// this loop see it), or not, with how many of its pods fit. It returns
// the ready nodes it took.
func (a *Autoscaler) checkCapacity(ctx context.Context, l *loop, fork **snapshot.Fork, at provreq.Attempt, usable []int, free freeRoom) int {
	pr, pl := a.provreq, l.provreq
	child := (*fork).Fork()
	left, nodes := a.placePods(ctx, child, at.Pods, usable, free)
	if len(left) > 0 {
		pl.put(pr.tracker.NotProvisioned(at.Req, fmt.Sprintf("%d of its %d pods fit on the cluster as it is (its ready nodes, less the capacity other requests booked)",
			len(at.Pods)-len(left), len(at.Pods)), l.now))
		return 0
	}
	*fork = child
	for _, n := range nodes {
		pl.bookedNodes[n] = true
	}
	reservation := pr.tracker.Options().ReservationTime
	pl.put(pr.tracker.Provisioned(at.Req, provreq.ReasonCapacityIsFound,
		fmt.Sprintf("Capacity is found in the cluster: its %d pods fit on ready nodes, booked for %s", len(at.Pods), reservation), l.now))
	pl.bookings = append(pl.bookings, provreq.Booking{Req: at.Req, Pods: at.Pods, Until: l.now.Add(reservation)})
	return len(nodes)
}

// bookable says a node may take booked room: usable, and may take pods
// (not cordoned, not being removed, its machine not deleted), as a node a
// group's template is learned from.
func (a *Autoscaler) bookable(l *loop, n *apiv1.Node) bool {
	return a.usable(l, n) && !n.Spec.Unschedulable && !actuation.HasTaintKey(n, scaledown.ToBeDeletedTaint) &&
		!(a.scaleDown.actuator != nil && a.scaleDown.actuator.IsDraining(n.Name)) && !a.machineDeleted(n.Name)
}

// bookableNodes are the indexes in the loop's snapshot of the nodes that
// may take booked room.
func (a *Autoscaler) bookableNodes(l *loop) []int {
	var out []int
	for i := 0; i < l.snap.Len(); i++ {
		if a.bookable(l, l.snap.NodeInfo(i).Node()) {
			out = append(out, i)
		}
	}
	return out
}

// placePods places pods on the candidate nodes of fork and returns those
// that did not fit and the nodes that took the others. With free, the
// room of the pods it says (balloons, which the scheduler preempts for
// the pods) counts as free: the pods are placed as if they were gone,
// and added to fork beside them.
func (a *Autoscaler) placePods(ctx context.Context, fork *snapshot.Fork, pods []*apiv1.Pod, candidates []int, free freeRoom) ([]*apiv1.Pod, []string) {
	trial := fork
	if len(free.nodes) > 0 {
		trial = fork.Fork()
		for _, i := range free.nodes {
			trial.RemovePods(i, free.pods)
		}
	}
	var left []*apiv1.Pod
	var nodes []string
	for _, g := range simulator.GroupPods(pods, a.opts.GPUResourceName) {
		n := a.sim.FitOnNodes(ctx, trial, g, 0, candidates, func(pod, node int) {
			nodes = append(nodes, trial.NodeInfo(node).Node().Name)
			if trial != fork {
				fork.AddPod(node, g.PodInfo(pod))
			}
		})
		left = append(left, g.Pods[n:]...)
	}
	return left, nodes
}

// freeRoom is room placed pods may take though pods hold it: pods says
// which, nodes are the candidates holding some (found once a phase).
type freeRoom struct {
	pods  func(*apiv1.Pod) bool
	nodes []int
}

// bookingFrees is the room booked pods may take: the balloons', which
// the scheduler preempts for the requests' pods.
func (a *Autoscaler) bookingFrees(l *loop, candidates []int) freeRoom {
	fr := freeRoom{pods: a.opts.isBalloon}
	if !a.opts.BalloonAware {
		return fr
	}
	for _, i := range candidates {
		for _, p := range l.snap.Pods(i) {
			if fr.pods(p) {
				fr.nodes = append(fr.nodes, i)
				break
			}
		}
	}
	return fr
}

// consumingPods lists, per request (namespace/name), the scheduled pods
// that consume it. Terminated pods are not in the snapshot.
func consumingPods(snap *snapshot.Snapshot) map[string][]*apiv1.Pod {
	out := map[string][]*apiv1.Pod{}
	for i := 0; i < snap.Len(); i++ {
		for _, p := range snap.Pods(i) {
			if name, ok := provreq.Consumes(p); ok && !provreq.IsBooked(p) {
				k := p.Namespace + "/" + name
				out[k] = append(out[k], p)
			}
		}
	}
	return out
}

// requestOf is the UID of the request a booked pod stands for.
func requestOf(p *apiv1.Pod) types.UID {
	if ref := metav1.GetControllerOf(p); ref != nil {
		return ref.UID
	}
	return ""
}

// live says a request's booking is live as this loop leaves it:
// Provisioned, and neither BookingExpired, Failed nor CapacityRevoked.
func (pl *provreqLoop) live(r *provreq.ProvisioningRequest) bool {
	r = pl.latest(r)
	return provreq.IsTrue(r, provreq.Provisioned) && !provreq.Finished(r)
}

// dropConsumers takes out of the pending pods those consuming a request
// whose booking is live: its capacity is provisioned for them, and they
// trigger no scale-up of their own (as in cluster-autoscaler). A pod
// naming a request whose booking is over (a pod recreated after its node
// was replaced), not yet made, or gone, is an ordinary pod.
func (a *Autoscaler) dropConsumers(l *loop, pending []*apiv1.Pod) []*apiv1.Pod {
	pl := l.provreq
	if pl == nil {
		return pending
	}
	booked := map[string]bool{}
	for _, r := range pl.all {
		if provreq.Supported(r) && pl.live(r) {
			booked[provreq.Key(r)] = true
		}
	}
	out := pending[:0:0]
	for _, p := range pending {
		name, ok := provreq.Consumes(p)
		if !ok || !booked[p.Namespace+"/"+name] {
			out = append(out, p)
			continue
		}
		a.events.emit(p, l.now, l.epoch, apiv1.EventTypeNormal, EventNotTriggerScaleUp,
			fmt.Sprintf("pod didn't trigger scale-up: it consumes ProvisioningRequest %s/%s, whose capacity is provisioned for it", p.Namespace, name))
	}
	return out
}

// withRequestGangs adds the best-effort-atomic requests' gangs to the
// pending gangs, oldest first.
func withRequestGangs(l *loop, gangs []*gang.Gang) []*gang.Gang {
	if l.provreq == nil || len(l.provreq.gangs) == 0 {
		return gangs
	}
	out := append(append([]*gang.Gang(nil), gangs...), l.provreq.gangs...)
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Since.Equal(out[j].Since) {
			return out[i].Since.Before(out[j].Since)
		}
		return out[i].Key.String() < out[j].Key.String()
	})
	return out
}

// upcomingOf says how many nodes a group has coming, and whether its
// size is known this loop.
func (a *Autoscaler) upcomingOf(l *loop) func(group string) (int, bool) {
	return func(group string) (int, bool) {
		gs := a.registry.Group(group)
		if gs == nil || !gs.Readiness.TargetKnown {
			return 0, false
		}
		return gs.Readiness.Upcoming, true
	}
}

// bookedForUpcoming are the bookings scale-up places on coming nodes.
func bookedForUpcoming(l *loop) []scaleup.Booking {
	if l.provreq == nil {
		return nil
	}
	return l.provreq.upcoming
}

// provisioningRequestResults turns scale-up's outcome into the
// best-effort-atomic requests' conditions, and judges the bookings that
// wait for coming nodes.
func (a *Autoscaler) provisioningRequestResults(l *loop, out scaleup.Outcome) {
	pl := l.provreq
	if pl == nil {
		return
	}
	res := gangResults(pl, out)
	coming := comingNodesOf(out.Upcoming)
	for _, g := range pl.gangs {
		k := g.Key.String()
		if r := res[k]; r != nil {
			a.gangResult(l, k, r, coming)
		}
		// Otherwise scale-up said nothing of its pods (no pass ran them):
		// tried again next loop, never Provisioned without evidence.
	}
	a.judgeWaitingBookings(l, out)
}

// gangResult is what scale-up did for a best-effort-atomic request's gang.
type gangResult struct {
	released, queued int
	groups           []string
	failed           []string
	noScale          string
	placed           bool
	claims           []claim
}

// gangResults gathers scale-up's outcome by request gang: the nodes
// released and queued for it, the failures and no-scale-ups its pods are
// in (every request with pods in one has its share), whether it fit on
// ready and coming nodes.
func gangResults(pl *provreqLoop, out scaleup.Outcome) map[string]*gangResult {
	res := map[string]*gangResult{}
	get := func(k string) *gangResult { return gangResultOf(res, k) }
	addGangScaleUps(pl, out.Result.ScaleUps, res)
	for _, f := range out.Result.Failed {
		for _, k := range pl.gangsOfPods(f.Pods) {
			get(k).failed = append(get(k).failed, fmt.Sprintf("node group %s: %v", f.Group, f.Err))
		}
	}
	for _, ns := range out.Result.NoScale {
		for _, k := range pl.gangsOfPods(ns.Pods) {
			get(k).noScale = ns.Reason
		}
	}
	for _, k := range out.Result.Placed {
		if _, ok := pl.atomic[k]; ok {
			get(k).placed = true
		}
	}
	return res
}

// gangResultOf is gang k's result in res, added when it has none yet.
func gangResultOf(res map[string]*gangResult, k string) *gangResult {
	r := res[k]
	if r == nil {
		r = &gangResult{}
		res[k] = r
	}
	return r
}

// addGangScaleUps adds to their gangs' results the scale-ups made for
// best-effort-atomic requests: the nodes released and queued, the groups,
// and the nodes the booking may claim.
func addGangScaleUps(pl *provreqLoop, scaleUps []scaleup.ScaleUp, res map[string]*gangResult) {
	for _, su := range scaleUps {
		if _, ok := pl.atomic[su.Gang]; ok {
			r := gangResultOf(res, su.Gang)
			r.released += su.Delta
			r.queued += su.Queued
			r.groups = append(r.groups, su.Group)
			if su.Delta > 0 {
				r.claims = append(r.claims, claim{su.Group, su.Delta})
			}
		}
	}
}

// gangsOfPods are the request gangs whose booked pods are among pods.
func (pl *provreqLoop) gangsOfPods(pods []*apiv1.Pod) []string {
	var keys []string
	seen := map[string]bool{}
	for _, p := range pods {
		if !provreq.IsBooked(p) {
			continue
		}
		if k, ok := pl.gangOf[requestOf(p)]; ok && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// gangResult writes a request's condition from what scale-up did for its
// gang: failed, no group can take it, queued, provisioned (with the
// coming nodes its booking may hold) or found on ready and coming nodes.
func (a *Autoscaler) gangResult(l *loop, k string, r *gangResult, coming map[types.UID]map[string]int) {
	pl, t := l.provreq, a.provreq.tracker
	at := pl.atomic[k]
	booked := t.Options().ReservationTime
	switch {
	case len(r.failed) > 0:
		pl.put(t.NotProvisioned(at.Req, "the scale-up for its pods failed: "+strings.Join(r.failed, "; "), l.now))
	case r.noScale != "":
		pl.put(t.NotProvisioned(at.Req, requestReason(k, len(at.Pods), r.noScale), l.now))
	case r.queued > 0:
		pl.put(t.Queued(at.Req, fmt.Sprintf("Capacity is being provisioned: the %d new nodes its pods need wait in the node-addition queue, to be requested together",
			r.queued+r.released), l.now))
	case r.released > 0:
		// Its booking may hold the nodes bought for it, and the coming
		// nodes its pods were planned on, while they come.
		u := t.Provisioned(at.Req, provreq.ReasonCapacityIsProvisioned,
			fmt.Sprintf("Capacity is provisioned: %d new nodes requested from node group %s for its %d pods, booked for %s",
				r.released, strings.Join(uniq(r.groups), ", "), len(at.Pods), booked), l.now)
		t.Claim(u, claimOf(r.claims, coming[at.Req.UID]))
		pl.put(u)
	case r.placed:
		u := t.Provisioned(at.Req, provreq.ReasonCapacityIsFound,
			fmt.Sprintf("Capacity is found in the cluster: its %d pods fit on ready and coming nodes, booked for %s", len(at.Pods), booked), l.now)
		t.Claim(u, claimOf(nil, coming[at.Req.UID]))
		pl.put(u)
	}
}

// judgeWaitingBookings judges the bookings whose pods wait for coming
// nodes: kept while they fit on the nodes they bought; once they do not
// (a node failed or was removed, other pods took its room), an overdue one
// ends, another is lost (Tracker.Lost). Their capacity is never revoked
// (Kueue would deactivate the workload).
func (a *Autoscaler) judgeWaitingBookings(l *loop, out scaleup.Outcome) {
	pl, t := l.provreq, a.provreq.tracker
	lost, unjudged := map[string]bool{}, map[string]bool{}
	for _, id := range out.LostBookings {
		lost[id] = true
	}
	for _, id := range out.UnjudgedBookings {
		unjudged[id] = true
	}
	waiting := map[string]int{}
	for _, b := range pl.upcoming {
		waiting[b.ID] = len(b.Pods)
	}
	for _, b := range pl.bookings {
		n, ok := waiting[string(b.Req.UID)]
		used := provreq.Count(b.Req) - len(b.Pods)
		switch {
		case !ok, unjudged[string(b.Req.UID)]:
			// Its pods wait for no coming node, or its groups' coming
			// nodes are unknown this loop (a size not read): not judged.
		case !lost[string(b.Req.UID)]:
			t.Held(b.Req.UID)
		case b.Overdue:
			pl.put(t.Expire(b.Req, used, l.now))
		default:
			pl.put(t.Lost(b.Req, n, used, l.now))
		}
	}
}

// claim is nodes of a group bought for a best-effort-atomic request.
type claim struct {
	group string
	nodes int
}

// comingNodesOf counts, per request and group, the distinct upcoming
// nodes scale-up placed its pods on.
func comingNodesOf(placed []scaleup.UpcomingPod) map[types.UID]map[string]int {
	seen := map[types.UID]map[string]bool{}
	out := map[types.UID]map[string]int{}
	for _, p := range placed {
		if !provreq.IsBooked(p.Pod) {
			continue
		}
		uid := requestOf(p.Pod)
		if seen[uid] == nil {
			seen[uid], out[uid] = map[string]bool{}, map[string]int{}
		}
		if g := scaleup.UpcomingGroup(p.Node); g != "" && !seen[uid][p.Node] {
			seen[uid][p.Node] = true
			out[uid][g]++
		}
	}
	return out
}

// claimOf adds the nodes bought to the coming nodes used, per group.
func claimOf(bought []claim, coming map[string]int) map[string]int {
	out := map[string]int{}
	for g, n := range coming {
		out[g] += n
	}
	for _, c := range bought {
		out[c.group] += c.nodes
	}
	return out
}

// requestReason says why a request's gang got no nodes in the request's
// words: the planner's "gang <key> needs n more members on new nodes (min
// n, 0 running) and no node group can take them all: <why>" becomes "its
// n pods need new nodes and no node group can take them all: <why>".
func requestReason(key string, pods int, reason string) string {
	const all = " and no node group can take them all: "
	if rest, ok := strings.CutPrefix(reason, "gang "+key+" needs "); ok {
		if i := strings.Index(rest, all); i >= 0 {
			return fmt.Sprintf("its %d pods need new nodes and no node group can take them all: %s", pods, rest[i+len(all):])
		}
	}
	return reason
}

func uniq(xs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// deleteFinishedRequests deletes requests finished for longer than the
// TTL (cluster-autoscaler's garbage collection of week-old requests).
func (a *Autoscaler) deleteFinishedRequests(ctx context.Context, rs []*provreq.ProvisioningRequest) {
	if len(rs) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	if err := a.gate.Write("provisioning-request-delete"); err != nil {
		logger.V(2).Info("Finished ProvisioningRequests not deleted", "err", err.Error())
		return
	}
	deleted := 0
	for _, r := range rs {
		if err := a.provreq.api.Delete(ctx, r); err != nil {
			logger.Error(err, "Deleting a finished ProvisioningRequest; tried again next loop", "request", klog.KObj(r))
			continue
		}
		deleted++
		logger.V(2).Info("Deleted finished ProvisioningRequest", "request", klog.KObj(r))
	}
	logger.Info("Deleted finished ProvisioningRequests", "deleted", deleted, "ttl", a.provreq.tracker.Options().TerminalTTL)
}

// writeProvisioningRequests writes the loop's condition changes, one
// status update per request, each with an event on the request, and
// updates the metrics. A conflict (the request changed meanwhile) is left
// to the next loop, which decides again from the new object.
func (a *Autoscaler) writeProvisioningRequests(ctx context.Context, l *loop) {
	pl := l.provreq
	if pl == nil {
		return
	}
	defer a.reportProvisioningRequests(l)
	if len(pl.order) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	var w provreqWrites
	for i, uid := range pl.order {
		u := pl.pending[uid]
		// Each write passes the gate: a leader that stalled mid-batch
		// writes no more. The rest of the batch is decided again next loop,
		// as are the writes past the per-loop bound.
		if w.written+w.conflicts >= maxProvreqStatusWrites {
			w.deferred++
			delete(pl.pending, uid)
			continue
		}
		if err := a.gate.Write("provisioning-request-status"); err != nil {
			logger.V(2).Info("ProvisioningRequest conditions not written", "err", err.Error(), "left", len(pl.order)-i)
			for _, rest := range pl.order[i:] {
				delete(pl.pending, rest)
			}
			break
		}
		if err := a.provreq.api.UpdateStatus(ctx, u.Req); err != nil {
			delete(pl.pending, uid)
			w.failed(logger, u.Req, err)
			continue
		}
		w.written++
		a.announceCondition(logger, l, u)
	}
	if w.firstErr != nil {
		logger.Error(w.firstErr, "Writing ProvisioningRequest conditions; tried again next loop", "failed", len(pl.order)-w.written-w.conflicts-w.deferred)
	}
	logger.Info("ProvisioningRequest conditions written", "written", w.written, "conflicts", w.conflicts, "deferredToNextLoop", w.deferred)
}

// provreqWrites tallies a loop's ProvisioningRequest status writes.
type provreqWrites struct {
	written, conflicts, deferred int
	firstErr                     error
}

// failed counts a write the API server refused: a conflict (or a request
// gone) is decided again next loop; another error is kept when it is the
// loop's first.
func (w *provreqWrites) failed(logger klog.Logger, req *provreq.ProvisioningRequest, err error) {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		w.conflicts++
		logger.V(2).Info("ProvisioningRequest changed before its conditions were written; decided again next loop", "request", klog.KObj(req), "err", err.Error())
		return
	}
	if w.firstErr == nil {
		w.firstErr = err
	}
}

// announceCondition tells a written condition: logged, an event on the
// request, and the time to provisioned observed.
func (a *Autoscaler) announceCondition(logger klog.Logger, l *loop, u *provreq.Update) {
	c := u.Condition
	logger.V(2).Info("ProvisioningRequest condition set", "request", klog.KObj(u.Req), "type", c.Type, "status", c.Status, "reason", c.Reason)
	if a.rec != nil {
		typ := apiv1.EventTypeNormal
		if u.Warning {
			typ = apiv1.EventTypeWarning
		}
		ref := &apiv1.ObjectReference{APIVersion: provreq.GroupVersion.String(), Kind: provreq.Kind, Namespace: u.Req.Namespace, Name: u.Req.Name, UID: u.Req.UID}
		a.rec.Event(ref, typ, c.Reason, c.Message)
	}
	if c.Type == provreq.Provisioned && c.Status == metav1.ConditionTrue {
		a.metrics.ProvReq.ProvisionDuration.WithLabelValues(u.Req.Spec.ProvisioningClassName).
			Observe(l.now.Sub(u.Req.CreationTimestamp.Time).Seconds())
	}
}

// reportProvisioningRequests sets the requests' metrics.
func (a *Autoscaler) reportProvisioningRequests(l *loop) {
	pl := l.provreq
	m := a.metrics.ProvReq
	m.Requests.Reset()
	for _, class := range []string{provreq.ClassCheckCapacity, provreq.ClassBestEffortAtomic} {
		for _, ct := range provreqConditions() {
			m.Requests.WithLabelValues(class, ct)
		}
	}
	for k, n := range pl.conditionCounts() {
		m.Requests.WithLabelValues(k.class, k.condition).Set(float64(n))
	}
	m.Skipped.Set(float64(pl.skipped))
	m.BookedPods.Reset()
	m.BookedGPUs.Reset()
	for _, b := range pl.bookings {
		class := b.Req.Spec.ProvisioningClassName
		m.BookedPods.WithLabelValues(class).Add(float64(len(b.Pods)))
		gpus := int64(0)
		for _, p := range b.Pods {
			gpus += simulator.RequestOf(p, a.opts.GPUResourceName).GPU
		}
		m.BookedGPUs.WithLabelValues(class).Add(float64(gpus))
	}
}

// provreqConditions are the condition types counted by the metric and the status.
func provreqConditions() []string {
	return []string{provreq.Accepted, provreq.Provisioned, provreq.Failed, provreq.BookingExpired, provreq.CapacityRevoked}
}

type classCondition struct{ class, condition string }

// conditionCounts counts the requests of each class with each condition
// True, as this loop leaves them.
func (pl *provreqLoop) conditionCounts() map[classCondition]int {
	counts := map[classCondition]int{}
	for _, r := range pl.all {
		if !provreq.Supported(r) {
			continue
		}
		r = pl.latest(r)
		for _, ct := range provreqConditions() {
			if provreq.IsTrue(r, ct) {
				counts[classCondition{r.Spec.ProvisioningClassName, ct}]++
			}
		}
	}
	return counts
}

// provisioningRequestsStatus is the requests' part of the status.
func (a *Autoscaler) provisioningRequestsStatus(l *loop) *ProvisioningRequestsStatus {
	pl := l.provreq
	if pl == nil {
		return nil
	}
	st := &ProvisioningRequestsStatus{Skipped: pl.skipped}
	for k, n := range pl.conditionCounts() {
		st.Requests = append(st.Requests, ProvisioningRequestCount{Class: k.class, Condition: k.condition, Requests: n})
	}
	sort.Slice(st.Requests, func(i, j int) bool {
		if st.Requests[i].Class != st.Requests[j].Class {
			return st.Requests[i].Class < st.Requests[j].Class
		}
		return st.Requests[i].Condition < st.Requests[j].Condition
	})
	for _, b := range pl.bookings {
		if len(st.Booked) == maxProvreqStatusEntries {
			st.More++
			continue
		}
		st.Booked = append(st.Booked, BookedRequest{Request: provreq.Key(b.Req), Class: b.Req.Spec.ProvisioningClassName, Pods: len(b.Pods), Until: b.Until.UTC()})
	}
	for _, w := range pl.waiting {
		if len(st.Waiting) == maxProvreqStatusEntries {
			st.More++
			continue
		}
		msg := ""
		if c := provreq.Find(w.Req, provreq.Provisioned); c != nil {
			msg = c.Message
		}
		st.Waiting = append(st.Waiting, WaitingRequest{Request: provreq.Key(w.Req), Class: w.Req.Spec.ProvisioningClassName, RetryAt: w.RetryAt.UTC(), Message: msg})
	}
	if len(st.Requests)+len(st.Booked)+len(st.Waiting)+st.Skipped == 0 {
		return nil
	}
	return st
}

// ProvisioningRequestsStatus is the ProvisioningRequests' part of the
// status ConfigMap (with --enable-provisioning-requests).
type ProvisioningRequestsStatus struct {
	// Requests counts the requests of each class with a condition True.
	Requests []ProvisioningRequestCount `json:"requests,omitempty"`
	// Booked are the requests whose capacity is booked (the first 20).
	Booked []BookedRequest `json:"booked,omitempty"`
	// Waiting are the requests waiting to be tried again (the first 20).
	Waiting []WaitingRequest `json:"waiting,omitempty"`
	// More counts the requests left out of the lists.
	More int `json:"more,omitempty"`
	// Skipped counts the live requests not planned: over
	// --max-provisioning-requests or its per-namespace bound.
	Skipped int `json:"skipped,omitempty"`
}

// ProvisioningRequestCount is the number of requests of a class with a
// condition True.
type ProvisioningRequestCount struct {
	Class     string `json:"class"`
	Condition string `json:"condition"`
	Requests  int    `json:"requests"`
}

// BookedRequest is a request whose capacity is booked: its pods not yet
// consumed, until when.
type BookedRequest struct {
	Request string    `json:"request"`
	Class   string    `json:"class"`
	Pods    int       `json:"pods"`
	Until   time.Time `json:"until"`
}

// WaitingRequest is a request not provisioned, tried again at RetryAt.
type WaitingRequest struct {
	Request string    `json:"request"`
	Class   string    `json:"class"`
	RetryAt time.Time `json:"retryAt"`
	Message string    `json:"message,omitempty"`
}

// provreqMetrics are the ProvisioningRequest metrics.
type provreqMetrics struct {
	Requests          *prometheus.GaugeVec
	BookedPods        *prometheus.GaugeVec
	BookedGPUs        *prometheus.GaugeVec
	ProvisionDuration *prometheus.HistogramVec
	Skipped           prometheus.Gauge
}

func newProvreqMetrics(reg prometheus.Registerer, ns string) provreqMetrics {
	m := provreqMetrics{
		Requests: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "provisioning_requests",
			Help: "ProvisioningRequests of each class (check-capacity, best-effort-atomic-scale-up) with a condition True (Accepted, Provisioned, Failed, BookingExpired, CapacityRevoked)."},
			[]string{"class", "condition"}),
		BookedPods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "provisioning_request_booked_pods",
			Help: "Pods whose capacity Provisioned requests book (not yet consumed by their pods), by class."}, []string{"class"}),
		BookedGPUs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "provisioning_request_booked_gpus",
			Help: "GPUs those booked pods request, by class."}, []string{"class"}),
		ProvisionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "provisioning_request_provision_duration_seconds",
			Help:    "Time from a ProvisioningRequest's creation to its Provisioned=True, by class.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200}}, []string{"class"}),
	}
	m.Skipped = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "provisioning_requests_skipped",
		Help: "Live ProvisioningRequests not planned last loop: over --max-provisioning-requests or --max-provisioning-requests-per-namespace (booked ones always planned; the rest oldest first, the namespaces in turn)."})
	reg.MustRegister(m.Requests, m.BookedPods, m.BookedGPUs, m.ProvisionDuration, m.Skipped)
	return m
}
