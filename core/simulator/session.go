package simulator

import (
	"context"

	apiv1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// Session simulates one equivalence group against one fork: PreFilter runs
// once, then TryNode and Commit per pod. Placing a pod updates the
// PreFilter state through the plugins' AddPod extensions, as the scheduler
// does for nominated pods.
type Session struct {
	sim        *Simulator
	fork       *snapshot.Fork
	g          *Group
	state      fwk.CycleState
	res        *fwk.PreFilterResult
	failed     *fwk.Status
	lastPassed int
}

// NewSession runs PreFilter for g's representative on fork.
func (s *Simulator) NewSession(ctx context.Context, fork *snapshot.Fork, g *Group) *Session {
	ss := &Session{sim: s, fork: fork, g: g, lastPassed: -1}
	ss.state, ss.res, ss.failed = s.preFilter(ctx, fork, g.Rep())
	return ss
}

// Failed returns the PreFilter status when the group cannot be scheduled
// anywhere in the fork, or nil.
func (ss *Session) Failed() *fwk.Status { return ss.failed }

// TryNode reports whether pod i of the group fits node n (nil) or why not.
// The resource pre-check runs first, so most full nodes never reach the
// framework; a Simple group re-checks only resources on the node it last
// fit.
func (ss *Session) TryNode(ctx context.Context, i, n int) *fwk.Status {
	if ss.failed != nil {
		return ss.failed
	}
	if !ss.g.Req.Fits(ss.fork.Free(n)) {
		return ss.sim.insufficient(ss.g.Req, ss.fork.Free(n))
	}
	if ss.g.Simple && ss.lastPassed == n {
		return nil
	}
	ni := ss.fork.NodeInfo(n)
	if !ss.res.AllNodes() && !ss.res.NodeNames.Has(ni.Node().Name) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node(s) didn't satisfy plugin(s) PreFilter result")
	}
	ss.sim.lister.fork = ss.fork
	if st := ss.sim.fw.RunFilterPlugins(ctx, ss.state, ss.g.Pods[i], ni); !st.IsSuccess() {
		return st
	}
	return nil
}

// Commit places pod i on node n.
func (ss *Session) Commit(ctx context.Context, i, n int) {
	pi := ss.g.PodInfo(i)
	ss.fork.AddPod(n, pi)
	if !ss.g.Simple {
		ss.sim.lister.fork = ss.fork
		// A failure here means a plugin's state could not take the pod; the
		// next Filter call then answers from the state as it was, which can
		// only over-admit one node: the scheduler itself will correct it.
		_ = ss.sim.fw.RunPreFilterExtensionAddPod(ctx, ss.state, ss.g.Rep(), pi, ss.fork.NodeInfo(n))
	}
	ss.lastPassed = n
}

// insufficientStatuses are the pre-check's answers, in the scheduler's own
// words ("Insufficient cpu"); built once per simulator because the
// pre-check fails millions of times per loop on a full cluster.
type insufficientStatuses struct {
	pods, gpu, cpu, memory, storage *fwk.Status
}

func newInsufficientStatuses(gpu apiv1.ResourceName) insufficientStatuses {
	return insufficientStatuses{
		pods:    fwk.NewStatus(fwk.Unschedulable, "Too many pods"),
		gpu:     fwk.NewStatus(fwk.Unschedulable, "Insufficient "+string(gpu)),
		cpu:     fwk.NewStatus(fwk.Unschedulable, "Insufficient cpu"),
		memory:  fwk.NewStatus(fwk.Unschedulable, "Insufficient memory"),
		storage: fwk.NewStatus(fwk.Unschedulable, "Insufficient ephemeral-storage"),
	}
}

// insufficient says which resource the pre-check found short.
func (s *Simulator) insufficient(r Request, f snapshot.Free) *fwk.Status {
	switch {
	case f.Pods < 1:
		return s.short.pods
	case r.GPU > 0 && r.GPU > f.GPU:
		return s.short.gpu
	case r.MilliCPU > f.MilliCPU:
		return s.short.cpu
	case r.Memory > f.Memory:
		return s.short.memory
	default:
		return s.short.storage
	}
}

// FitOnNodes places as many of g's pods, from index from on, as fit on the
// candidate nodes and returns how many, calling placed(pod, node) for each.
//
// A Simple group fills each node before moving on and never goes back:
// free capacity only shrinks. Other groups (spread, affinity, ports) rescan
// from the first node after each placement, because placing a pod can make
// a node feasible again (topology skew); nodes that failed for good
// (resources, or an unresolvable status such as a taint) are skipped.
func (s *Simulator) FitOnNodes(ctx context.Context, fork *snapshot.Fork, g *Group, from int, candidates []int, placed func(pod, node int)) int {
	if from >= len(g.Pods) || len(candidates) == 0 {
		return 0
	}
	ss := s.NewSession(ctx, fork, g)
	if ss.Failed() != nil {
		return 0
	}
	var dead []bool
	if !g.Simple {
		dead = make([]bool, len(candidates))
	}
	pos, count := 0, 0
	for i := from; i < len(g.Pods); i++ {
		if !g.Simple {
			pos = 0
		}
		pos = ss.firstFit(ctx, i, candidates, pos, dead)
		if pos == len(candidates) {
			break
		}
		ss.Commit(ctx, i, candidates[pos])
		if placed != nil {
			placed(i, candidates[pos])
		}
		count++
	}
	return count
}

// firstFit is the first of candidates from pos on that pod i fits, or
// len(candidates). With dead (a group that is not Simple), it skips the
// nodes marked dead and marks those that fail for good (resources, or an
// unresolvable status).
func (ss *Session) firstFit(ctx context.Context, i int, candidates []int, pos int, dead []bool) int {
	for ; pos < len(candidates); pos++ {
		if dead != nil && dead[pos] {
			continue
		}
		st := ss.TryNode(ctx, i, candidates[pos])
		if st == nil {
			return pos
		}
		if dead != nil && (st.Code() == fwk.UnschedulableAndUnresolvable || !ss.g.Req.Fits(ss.fork.Free(candidates[pos]))) {
			dead[pos] = true
		}
	}
	return pos
}
