package scaleup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// Queue decides which demand is requested now (ratelimit.Queue, or
// everything at once when smoothing is off), takes back the tokens of
// nodes the cloud refused, and keeps the nodes it deferred unsent for
// the group's next request.
type Queue interface {
	Decide(now time.Time, demands []ratelimit.Demand, inFlight int) ratelimit.Decision
	Refund(n int)
	Defer(group string, n int, now time.Time)
}

// Increaser asks a node group for more nodes: the only cloud write of a
// scale-up. It records successes and failures (cluster state, backoff,
// metrics, events); an error says the nodes were not requested.
type Increaser interface {
	IncreaseSize(ctx context.Context, group string, delta int) error
}

// Orchestrator runs one loop's scale-up: the planning passes and their
// gangs state demand; the queue releases part of it; the released nodes
// are requested, one request per group; the pods of a group the cloud
// refused are planned again, at once, on the groups left.
type Orchestrator struct {
	Planner *Planner
	// GPU is the extended resource counted as GPUs.
	GPU apiv1.ResourceName
}

// Group is a node group as the loop sees it.
type Group struct {
	// Candidate describes the group to the planner (Skip says why not).
	Candidate Candidate
	// Upcoming nodes are coming (requested, booting, pending preflight);
	// each pass puts them in its fork as copies of UpcomingTemplate, which
	// is set even for a group the planner skips (backoff, at max size).
	Upcoming         int
	UpcomingTemplate fwk.NodeInfo
}

// Pass is one planning pass: its pods, its gangs, whether balloons' room
// is free to them, and whether its demand is for balloons.
type Pass struct {
	Pods  []*apiv1.Pod
	Gangs []*gang.Gang
	// Free says which pods on usable nodes leave their room to this
	// pass's pods (balloons they preempt, capacity held for buffers that
	// the scheduler does not see); nil: none.
	Free func(*apiv1.Pod) bool
	// Balloon: the pass's nodes are at the queue's lowest class.
	Balloon bool
	// Last: the pass's nodes are released after all other demand of
	// their class (capacity buffers' chunks, after balloons).
	Last bool
}

// Request is one loop's scale-up.
type Request struct {
	Now  time.Time
	Snap *snapshot.Snapshot
	// Usable are the indexes in Snap of nodes that can take pods now.
	Usable []int
	Groups []Group
	// MaxNew caps the nodes this loop may plan (--max-nodes-total less the
	// nodes there and coming).
	MaxNew int
	// IsBalloon and IsLast say a pod is a balloon, or a capacity buffer's
	// chunk: after a refused group they are planned again apart, workload
	// first, then balloons, then chunks, at the queue's lowest class.
	IsBalloon, IsLast func(*apiv1.Pod) bool
	// GangSplit lets a gang span several groups (--gang-allow-split).
	GangSplit bool
	// Passes run in order, each seeing the upcoming nodes earlier passes'
	// pods took, and each with its own copy of the candidates, less what
	// earlier passes planned.
	Passes []Pass
	// InFlight is the number of nodes requested and not yet usable.
	InFlight int
	// Bookings are provisioning requests' booked pods that fit on no
	// usable node: before any pass they take room on the upcoming nodes
	// their booking bought, which no pass may then give to other pods.
	Bookings []Booking
}

// Booking is a request's booked pods waiting for coming nodes: they may
// take room only on upcoming nodes of the groups Nodes names, on at most
// that many nodes of each (the nodes bought for it), never on nodes
// coming for other pods (#40).
type Booking struct {
	ID    string
	Pods  []*apiv1.Pod
	Nodes map[string]int
}

// Outcome is what a loop's scale-up did.
type Outcome struct {
	// Result has the requested (Delta) and queued nodes per scale-up, the
	// refused requests and the pods no group was asked for.
	Result Result
	// Awaiting is the number of pods that fit on upcoming nodes (real
	// pods, and the core's copies of pods to come).
	Awaiting int
	// Claimed are the usable nodes pending pods fit on: the scheduler has
	// not placed them yet (a gang waiting for all its members, a pod in
	// backoff), but they will use these nodes, which scale-down must keep.
	Claimed map[string]bool
	// Released and Queued are nodes by group and class.
	Released, Queued map[string]map[ratelimit.Class]int
	// Limit is what held demand back first.
	Limit ratelimit.Limit
	// HeldGangs are the gangs the queue held back whole, and why.
	HeldGangs map[string]ratelimit.HeldGang
	// InFlight is the nodes in flight after the requests.
	InFlight int
	// LostBookings are the IDs of the Bookings whose pods do not all fit
	// on the upcoming nodes they may take: they hold no room this loop.
	// UnjudgedBookings are those that name a group whose upcoming nodes
	// are not known this loop (its size unknown, no template): neither
	// held nor lost.
	LostBookings, UnjudgedBookings []string
	// Upcoming are the pods the passes placed on upcoming nodes (a gang's
	// members among them), by node name ("upcoming-<group>-<i>").
	Upcoming []UpcomingPod
}

// UpcomingPod is a pod placed on an upcoming node.
type UpcomingPod struct {
	Node string
	Pod  *apiv1.Pod
}

// UpcomingGroup is the group of an upcoming node's name, or "".
func UpcomingGroup(node string) string {
	rest, ok := strings.CutPrefix(node, "upcoming-")
	if !ok {
		return ""
	}
	if i := strings.LastIndexByte(rest, '-'); i > 0 {
		return rest[:i]
	}
	return ""
}

// Run plans, queues and requests.
func (o *Orchestrator) Run(ctx context.Context, req Request, q Queue, inc Increaser) (Outcome, error) {
	demand, err := o.plan(ctx, req)
	if err != nil {
		return Outcome{}, err
	}
	out := o.execute(ctx, req, demand, q, inc)
	out.Awaiting, out.Claimed, out.LostBookings, out.UnjudgedBookings = demand.awaiting, demand.claimed, demand.lostBookings, demand.unjudged
	for _, p := range demand.upcoming {
		out.Upcoming = append(out.Upcoming, UpcomingPod{Node: p.node, Pod: p.info.GetPod()})
	}
	return out, nil
}

// demand is what the passes planned.
type demand struct {
	res          Result
	awaiting     int
	claimed      map[string]bool
	lostBookings []string
	unjudged     []string
	upcoming     []placement
}

// start is where every pass starts from: the snapshot with the upcoming
// nodes (copies of their group's template) and the booked pods on them.
// Passes fork it; it is never changed.
type start struct {
	fork *snapshot.Fork
	// nodes are the usable nodes, then the upcoming ones.
	nodes          []int
	lost, unjudged []string
}

// start builds the passes' starting point.
func (o *Orchestrator) start(ctx context.Context, req Request) (*start, error) {
	fork := req.Snap.Fork()
	nodes := append([]int(nil), req.Usable...)
	upcoming := map[string][]int{}
	known := map[string]bool{}
	for _, g := range req.Groups {
		if g.UpcomingTemplate == nil {
			continue
		}
		known[g.Candidate.Group] = true
		for i := 0; i < g.Upcoming; i++ {
			idx, err := fork.AddNode(CloneTemplate(g.UpcomingTemplate, "upcoming-"+g.Candidate.Group+"-"+strconv.Itoa(i)))
			if err != nil {
				return nil, fmt.Errorf("adding upcoming node of group %s: %w", g.Candidate.Group, err)
			}
			nodes = append(nodes, idx)
			upcoming[g.Candidate.Group] = append(upcoming[g.Candidate.Group], idx)
		}
	}
	st := &start{fork: fork}
	taken := map[int]bool{} // upcoming nodes earlier bookings hold
	for _, b := range req.Bookings {
		unknown := false
		for g := range b.Nodes {
			unknown = unknown || !known[g]
		}
		if unknown {
			st.unjudged = append(st.unjudged, b.ID)
			continue
		}
		if child, ok := o.placeBooking(ctx, st.fork, b, upcoming, taken); ok {
			st.fork = child
		} else {
			st.lost = append(st.lost, b.ID)
		}
	}
	st.nodes = nodes
	return st, nil
}

// placeBooking places a booking's pods on the upcoming nodes it may
// take, all or none: of each group it bought nodes of, at most that many
// nodes not taken by earlier bookings. It returns the fork with them (and
// marks their nodes taken), or false.
func (o *Orchestrator) placeBooking(ctx context.Context, fork *snapshot.Fork, b Booking, upcoming map[string][]int, taken map[int]bool) (*snapshot.Fork, bool) {
	cands, group := bookableNodes(b, upcoming, taken)
	if len(cands) == 0 {
		return nil, false
	}
	child := fork.Fork()
	used, perGroup, ok := o.fitBooking(ctx, child, b.Pods, cands, group)
	if !ok {
		return nil, false
	}
	for g, n := range perGroup {
		if n > b.Nodes[g] {
			return nil, false
		}
	}
	for idx := range used {
		taken[idx] = true
	}
	return child, true
}

// bookableNodes are the upcoming nodes a booking may take, groups in
// order: of each group it bought nodes of, at most that many not taken
// by earlier bookings; group names each one's group.
func bookableNodes(b Booking, upcoming map[string][]int, taken map[int]bool) (cands []int, group map[int]string) {
	groups := make([]string, 0, len(b.Nodes))
	for g := range b.Nodes {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	group = map[int]string{}
	for _, g := range groups {
		n := 0
		for _, idx := range upcoming[g] {
			if n == b.Nodes[g] {
				break
			}
			if taken[idx] {
				continue
			}
			cands = append(cands, idx)
			group[idx] = g
			n++
		}
	}
	return cands, group
}

// fitBooking places a booking's pods on cands in child: the nodes used,
// how many of each group, and false when a pod fits none.
func (o *Orchestrator) fitBooking(ctx context.Context, child *snapshot.Fork, pods []*apiv1.Pod, cands []int, group map[int]string) (used map[int]bool, perGroup map[string]int, ok bool) {
	used = map[int]bool{}
	perGroup = map[string]int{}
	for _, g := range simulator.GroupPods(pods, o.GPU) {
		n := o.Planner.Estimator.Sim.FitOnNodes(ctx, child, g, 0, cands, func(_, node int) {
			if !used[node] {
				used[node] = true
				perGroup[group[node]]++
			}
		})
		if n < len(g.Pods) {
			return nil, nil, false
		}
	}
	return used, perGroup, true
}

// placement is a pod placed on an upcoming (template) node.
type placement struct {
	node string
	info fwk.PodInfo
}

// passOutput is one pass's plan, the pods it put on upcoming nodes, and
// the usable nodes its pods will take.
type passOutput struct {
	res      Result
	awaiting int
	upcoming []placement
	claimed  []string
}

// plan runs the passes. The fork of the first pass that planned anything
// is the result's: a re-plan starts from it.
func (o *Orchestrator) plan(ctx context.Context, req Request) (demand, error) {
	var d demand
	var carry []placement
	var planned []ScaleUp
	var st *start
	var err error
	for _, pass := range req.Passes {
		if len(pass.Pods) == 0 && len(pass.Gangs) == 0 {
			continue
		}
		if st, err = o.startOnce(ctx, req, st); err != nil {
			return demand{}, err
		}
		cands := candidates(req.Groups, planned, nil)
		out, err := o.planPass(ctx, req, st, pass, cands, req.MaxNew-total(planned), carry)
		if err != nil {
			return demand{}, err
		}
		carry = append(carry, out.upcoming...)
		d.add(pass, out)
		planned = append(planned, out.res.ScaleUps...)
	}
	if len(req.Bookings) > 0 {
		// No pass ran: the bookings are still placed, to tell which fit nowhere.
		if st, err = o.startOnce(ctx, req, st); err != nil {
			return demand{}, err
		}
	}
	if st != nil {
		d.lostBookings, d.unjudged = st.lost, st.unjudged
	}
	d.upcoming = carry
	return d, nil
}

// startOnce is st, built by the first pass that needs it.
func (o *Orchestrator) startOnce(ctx context.Context, req Request, st *start) (*start, error) {
	if st != nil {
		return st, nil
	}
	return o.start(ctx, req)
}

// add adds a pass's plan to the demand: its nodes claimed, its scale-ups
// (balloons' marked), the pods it leaves and the gangs it placed; the
// fork is the first pass's.
func (d *demand) add(pass Pass, out passOutput) {
	for _, n := range out.claimed {
		if d.claimed == nil {
			d.claimed = map[string]bool{}
		}
		d.claimed[n] = true
	}
	if pass.Balloon {
		markBalloon(out.res.ScaleUps, pass.Last)
	} else {
		d.awaiting += out.awaiting
	}
	d.res.ScaleUps = append(d.res.ScaleUps, out.res.ScaleUps...)
	d.res.NoScale = append(d.res.NoScale, out.res.NoScale...)
	d.res.Placed = append(d.res.Placed, out.res.Placed...)
	if d.res.Fork == nil {
		d.res.Fork = out.res.Fork
	}
}

// planPass finds the pods of a pass that fit neither on usable nodes nor
// on nodes already coming, and plans nodes for them: gangs first, whole.
func (o *Orchestrator) planPass(ctx context.Context, req Request, st *start, pass Pass, cands []Candidate, maxNew int, carry []placement) (passOutput, error) {
	fork := st.fork.Fork()
	nodes := st.nodes
	if pass.Free != nil {
		for _, i := range req.Usable {
			fork.RemovePods(i, pass.Free)
		}
	}
	for _, c := range carry {
		if idx, ok := fork.Index(c.node); ok {
			fork.AddPod(idx, c.info)
		}
	}
	var out passOutput
	if len(pass.Gangs) > 0 {
		fork = o.planGangs(ctx, req, pass.Gangs, fork, nodes, cands, &maxNew, &out)
	}
	gangs := out.res
	// Usable and coming nodes first: what fits there needs no new node.
	var rest []Pending
	for _, g := range simulator.GroupPods(pass.Pods, o.GPU) {
		placed := o.Planner.Estimator.Sim.FitOnNodes(ctx, fork, g, 0, nodes, func(pod, node int) {
			if node >= req.Snap.Len() {
				out.awaiting++
				out.upcoming = append(out.upcoming, placement{node: fork.NodeInfo(node).Node().Name, info: g.PodInfo(pod)})
			} else {
				out.claimed = append(out.claimed, fork.NodeInfo(node).Node().Name)
			}
		})
		if placed < len(g.Pods) {
			rest = append(rest, Pending{G: g, From: placed})
		}
	}
	if len(rest) == 0 {
		klog.FromContext(ctx).V(2).Info("All unschedulable pods fit on existing or upcoming nodes", "pods", len(pass.Pods), "awaitingUpcoming", out.awaiting)
		out.res = Result{Fork: fork, ScaleUps: gangs.ScaleUps, NoScale: gangs.NoScale, Placed: gangs.Placed}
		return out, nil
	}
	out.res = o.Planner.Plan(ctx, fork, rest, cands, maxNew)
	out.res.Placed = gangs.Placed
	out.res.ScaleUps = append(gangs.ScaleUps, out.res.ScaleUps...)
	out.res.NoScale = append(gangs.NoScale, out.res.NoScale...)
	return out, nil
}

// execute sends the demand through the queue and requests what it
// releases. A group the cloud refuses (quota, capacity; not throttling or
// a conflict) is dropped for this loop and its pods — gangs aside, which
// the next loop plans again whole — are planned at once on the groups
// left, up to once per group.
func (o *Orchestrator) execute(ctx context.Context, req Request, d demand, q Queue, inc Increaser) Outcome {
	out := Outcome{InFlight: req.InFlight, Released: map[string]map[ratelimit.Class]int{}, Queued: map[string]map[ratelimit.Class]int{}}
	out.Result = Result{Fork: d.res.Fork, NoScale: d.res.NoScale, Placed: d.res.Placed}
	r := &requesting{q: q, inc: inc, now: req.Now, out: &out, failed: map[string]bool{}}
	res := d.res
	for round := 0; ; round++ {
		dec := q.Decide(req.Now, demands(res.ScaleUps), out.InFlight)
		if out.Limit == ratelimit.NotLimited {
			out.Limit = dec.Limit
		}
		if round == 0 {
			out.HeldGangs = dec.HeldGangs
		}
		var retry []*apiv1.Pod
		order, byGroup := groupScaleUps(res.ScaleUps)
		for _, g := range order {
			retry = append(retry, r.request(ctx, g, byGroup[g], dec.ReleaseClass[g])...)
		}
		r.queue(dec.Queued)
		if len(retry) == 0 || round >= len(req.Groups) {
			break
		}
		res = o.replan(ctx, req, res.Fork, retry, out, r.failed)
		out.Result.Fork = res.Fork
		out.Result.NoScale = append(out.Result.NoScale, res.NoScale...)
	}
	return out
}

// requesting is what execute's requests share: the queue, the cloud, the
// outcome so far and the groups the cloud refused in this loop.
type requesting struct {
	q      Queue
	inc    Increaser
	now    time.Time
	out    *Outcome
	failed map[string]bool
}

// request requests group g's released nodes, one request for all its
// classes, and records what its scale-ups got. It returns the pods to
// plan again on other groups when the cloud refused the group.
func (r *requesting) request(ctx context.Context, g string, sus []ScaleUp, released map[ratelimit.Class]int) []*apiv1.Pod {
	if n := sum(released); n > 0 {
		err := r.inc.IncreaseSize(ctx, g, n)
		switch {
		case Deferred(err):
			// Nothing was sent and nothing failed: the released
			// nodes wait, queued, for the group's next write,
			// which takes them without paying again.
			r.q.Defer(g, n, r.now)
			for c, k := range released {
				add(r.out.Queued, g, c, k)
			}
			released = nil
		case err != nil:
			return r.refused(g, n, sus, err)
		default:
			r.out.InFlight += n
		}
	}
	r.grant(g, sus, released)
	return nil
}

// refused records a refused request of n nodes for group g: its tokens
// back to the queue, and, unless the refusal is passing (throttling, a
// conflict, fencing), the group dropped for this loop; it returns the
// group's pods to plan again, gangs' aside.
func (r *requesting) refused(g string, n int, sus []ScaleUp, err error) []*apiv1.Pod {
	r.q.Refund(n)
	var pods []*apiv1.Pod
	for _, su := range sus {
		pods = append(pods, su.Pods...)
	}
	r.out.Result.Failed = append(r.out.Result.Failed, Failed{Group: g, Delta: n, Err: err, Pods: pods})
	if c := cloudprovider.ClassOf(err); c == cloudprovider.ClassThrottled || c == cloudprovider.ClassConflict || c == cloudprovider.ClassFenced {
		return nil
	}
	r.failed[g] = true
	var retry []*apiv1.Pod
	for _, su := range sus {
		if su.Gang == "" {
			retry = append(retry, su.Pods...)
		}
	}
	return retry
}

// grant gives each of group g's scale-ups its class's release, in plan
// order, up to what it asked for; the rest of its demand is queued.
func (r *requesting) grant(g string, sus []ScaleUp, released map[ratelimit.Class]int) {
	left := map[ratelimit.Class]int{}
	for c, n := range released {
		left[c] = n
	}
	for _, su := range sus {
		class := su.Class()
		n := min(left[class], su.Delta)
		left[class] -= n
		add(r.out.Released, g, class, n)
		r.out.Result.ScaleUps = append(r.out.Result.ScaleUps, ScaleUp{Group: g, Delta: n, Pods: su.Pods, Queued: su.Delta - n, Balloon: su.Balloon, Last: su.Last, Gang: su.Gang})
	}
}

// queue records the demand the queue held back, but a refused group's.
func (r *requesting) queue(queued map[string]map[ratelimit.Class]int) {
	for g, byClass := range queued {
		if r.failed[g] {
			continue
		}
		for c, n := range byClass {
			add(r.out.Queued, g, c, n)
		}
	}
}

// replan plans the pods of refused groups on the groups left: workload
// first, then balloons, each on candidates less what is released or
// queued already.
func (o *Orchestrator) replan(ctx context.Context, req Request, fork *snapshot.Fork, pods []*apiv1.Pod, out Outcome, failed map[string]bool) Result {
	standing := standingOf(out)
	maxNew := req.MaxNew - total(standing)
	wl, bl, last := splitByClass(req, pods)
	res := Result{Fork: fork}
	for _, part := range []struct {
		pods          []*apiv1.Pod
		balloon, last bool
	}{{wl, false, false}, {bl, true, false}, {last, true, true}} {
		if len(part.pods) == 0 {
			continue
		}
		cands := candidates(req.Groups, standing, failed)
		next := o.Planner.Plan(ctx, res.Fork, pendingOf(simulator.GroupPods(part.pods, o.GPU)), cands, maxNew-total(res.ScaleUps))
		if part.balloon {
			markBalloon(next.ScaleUps, part.last)
		}
		standing = append(standing, next.ScaleUps...)
		res.ScaleUps = append(res.ScaleUps, next.ScaleUps...)
		res.NoScale = append(res.NoScale, next.NoScale...)
		res.Fork = next.Fork
	}
	return res
}

// standingOf is the nodes released or queued already, as scale-ups per
// group.
func standingOf(out Outcome) []ScaleUp {
	var standing []ScaleUp
	for _, m := range []map[string]map[ratelimit.Class]int{out.Released, out.Queued} {
		for g, byClass := range m {
			standing = append(standing, ScaleUp{Group: g, Delta: sum(byClass)})
		}
	}
	return standing
}

// splitByClass splits pods into workload, balloons and capacity buffers'
// chunks.
func splitByClass(req Request, pods []*apiv1.Pod) (wl, bl, last []*apiv1.Pod) {
	for _, p := range pods {
		switch {
		case req.IsLast != nil && req.IsLast(p):
			last = append(last, p)
		case req.IsBalloon != nil && req.IsBalloon(p):
			bl = append(bl, p)
		default:
			wl = append(wl, p)
		}
	}
	return wl, bl, last
}

// candidates copies the groups' candidates for one pass: each group's
// limit less what is planned for it already, and refused groups skipped.
func candidates(groups []Group, planned []ScaleUp, failed map[string]bool) []Candidate {
	byGroup := map[string]int{}
	for _, su := range planned {
		byGroup[su.Group] += su.Delta
	}
	out := make([]Candidate, 0, len(groups))
	for _, g := range groups {
		c := g.Candidate
		c.Limit -= byGroup[c.Group]
		if failed[c.Group] {
			c.Skip, c.SkipCode = "scale-up failed in this loop", ReasonFailedThisLoop
		}
		out = append(out, c)
	}
	return out
}

// Class is the queue class of a scale-up's demand.
func (su ScaleUp) Class() ratelimit.Class {
	if su.Balloon {
		return ratelimit.Balloon
	}
	return ratelimit.Workload
}

func demands(sus []ScaleUp) []ratelimit.Demand {
	out := make([]ratelimit.Demand, 0, len(sus))
	for _, su := range sus {
		since := oldest(su.Pods)
		if su.Last {
			since = lastSince()
		}
		out = append(out, ratelimit.Demand{Group: su.Group, Count: su.Delta, Class: su.Class(), Since: since, Gang: su.Gang})
	}
	return out
}

// groupScaleUps groups scale-ups by group, groups in first-seen order.
func groupScaleUps(sus []ScaleUp) ([]string, map[string][]ScaleUp) {
	var order []string
	by := map[string][]ScaleUp{}
	for _, su := range sus {
		if by[su.Group] == nil {
			order = append(order, su.Group)
		}
		by[su.Group] = append(by[su.Group], su)
	}
	return order, by
}

func oldest(pods []*apiv1.Pod) time.Time {
	var t time.Time
	for _, p := range pods {
		if c := p.CreationTimestamp.Time; t.IsZero() || c.Before(t) {
			t = c
		}
	}
	return t
}

func pendingOf(groups []*simulator.Group) []Pending {
	out := make([]Pending, 0, len(groups))
	for _, g := range groups {
		out = append(out, Pending{G: g})
	}
	return out
}

// total is the number of nodes scale-ups ask for.
func total(sus []ScaleUp) int {
	n := 0
	for _, su := range sus {
		n += su.Delta
	}
	return n
}

func markBalloon(sus []ScaleUp, last bool) {
	for i := range sus {
		sus[i].Balloon = true
		sus[i].Last = last
	}
}

// lastSince is the age of demand released after all other demand of its
// class: the queue releases the oldest first.
func lastSince() time.Time { return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC) }

func add(m map[string]map[ratelimit.Class]int, g string, c ratelimit.Class, n int) {
	if n <= 0 {
		return
	}
	if m[g] == nil {
		m[g] = map[ratelimit.Class]int{}
	}
	m[g][c] += n
}

func sum[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Deferred says the cloud took no request and asks for it later: a
// throttled answer that was never sent (the scale set's previous write
// still runs, or its throttling budget is held back).
func Deferred(err error) bool {
	return cloudprovider.ClassOf(err) == cloudprovider.ClassThrottled && errors.Is(err, cloudprovider.ErrNotSent)
}
