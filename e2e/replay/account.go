package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// never is a time a thing did not reach (a node never ready or never
// deleted, a pod never Running or never deleted) before the run ended.
const never = time.Duration(math.MaxInt64)

// nodeLife is one node as a run saw it, times from the replay's start (the
// floor buys some before it: negative).
type nodeLife struct {
	Name    string        `json:"name"`
	Created time.Duration `json:"created"`
	Ready   time.Duration `json:"ready"`
	Deleted time.Duration `json:"deleted"`
	// GPUs are its allocatable GPUs.
	GPUs int64 `json:"gpus"`
}

// podLife is one pod as a run saw it.
type podLife struct {
	Name    string        `json:"name"`
	Created time.Duration `json:"created"`
	Running time.Duration `json:"running"`
	Deleted time.Duration `json:"deleted"`
	Node    string        `json:"node,omitempty"`
	GPUs    int64         `json:"gpus"`
}

// timeline is what a run recorded; End is when it ended: what was still
// there then is cut there.
type timeline struct {
	End   time.Duration
	Nodes []nodeLife
	Pods  []podLife
}

// figures are one side's measures. Hours are in replay time and, scaled
// by the compression, in trace time: what users of the traced cluster
// would pay. Pending is in replayed seconds (a control plane's own
// latency is not compressed).
type figures struct {
	Pods int `json:"pods"`
	// NeverRunning were deleted before Running (DeletedPending of them) or
	// still pending at the end; the percentiles are of the others.
	NeverRunning   int     `json:"neverRunning"`
	DeletedPending int     `json:"deletedPending"`
	PendingP50     float64 `json:"pendingP50Seconds"`
	PendingP90     float64 `json:"pendingP90Seconds"`
	PendingP99     float64 `json:"pendingP99Seconds"`
	// NodeHours are the nodes bought, from creation to deletion (or the
	// end), every node an 8-GPU one; IdleGPUHours are allocatable GPUs on
	// ready nodes that no pod Running there requested.
	NodeHours         float64 `json:"nodeHoursReplay"`
	IdleGPUHours      float64 `json:"idleGPUHoursReplay"`
	TraceNodeHours    float64 `json:"nodeHoursTrace"`
	TraceIdleGPUHours float64 `json:"idleGPUHoursTrace"`
	PeakNodes         int     `json:"peakNodes"`
	Launches          int     `json:"launches"`
	Deletions         int     `json:"deletions"`
}

// account works a timeline's figures out; compression is trace seconds
// per replayed second.
func account(tl timeline, compression float64) (figures, error) {
	if err := check(tl); err != nil {
		return figures{}, err
	}
	var f figures
	f.NodeHours, f.PeakNodes, f.Launches, f.Deletions = nodeFigures(tl)
	idle, err := idleGPUHours(tl)
	if err != nil {
		return figures{}, err
	}
	f.IdleGPUHours = idle
	f.TraceNodeHours, f.TraceIdleGPUHours = f.NodeHours*compression, f.IdleGPUHours*compression
	pendingFigures(tl, &f)
	return f, nil
}

// check refuses a timeline whose times run backwards.
func check(tl timeline) error {
	for _, n := range tl.Nodes {
		if n.Ready < n.Created || n.Deleted < n.Created {
			return fmt.Errorf("node %s: ready %s or deleted %s before created %s", n.Name, n.Ready, n.Deleted, n.Created)
		}
	}
	for _, p := range tl.Pods {
		if p.Running < p.Created || p.Deleted < p.Created {
			return fmt.Errorf("pod %s: running %s or deleted %s before created %s", p.Name, p.Running, p.Deleted, p.Created)
		}
	}
	return nil
}

func hours(d time.Duration) float64 { return d.Hours() }

// nodeFigures are node-hours, the most nodes at once, launches and
// deletions (within the run).
func nodeFigures(tl timeline) (nodeHours float64, peak, launches, deletions int) {
	type step struct {
		at time.Duration
		d  int
	}
	var steps []step
	for _, n := range tl.Nodes {
		if n.Created > tl.End {
			continue
		}
		launches++
		end := min(n.Deleted, tl.End)
		nodeHours += hours(end - n.Created)
		steps = append(steps, step{n.Created, 1})
		if n.Deleted <= tl.End {
			deletions++
			steps = append(steps, step{n.Deleted, -1})
		}
	}
	// Deletions first at the same instant: a node replaced is not two.
	slices.SortFunc(steps, func(a, b step) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.d, b.d)) })
	now := 0
	for _, s := range steps {
		now += s.d
		peak = max(peak, now)
	}
	return nodeHours, peak, launches, deletions
}

// idleGPUHours are the GPU-hours of ready nodes no Running pod on them
// requested, node by node.
func idleGPUHours(tl timeline) (float64, error) {
	offered := map[string]float64{}
	ready := map[string][2]time.Duration{}
	for _, n := range tl.Nodes {
		from, to := n.Ready, min(n.Deleted, tl.End)
		if from >= to {
			from, to = 0, 0
		}
		ready[n.Name] = [2]time.Duration{from, to}
		offered[n.Name] = float64(n.GPUs) * hours(to-from)
	}
	for _, p := range tl.Pods {
		if p.Node == "" || p.GPUs == 0 || p.Running == never {
			continue
		}
		r, ok := ready[p.Node]
		if !ok {
			return 0, fmt.Errorf("pod %s: on node %q, which the timeline does not have", p.Name, p.Node)
		}
		from, to := max(p.Running, r[0]), min(p.Deleted, r[1])
		if from < to {
			offered[p.Node] -= float64(p.GPUs) * hours(to-from)
		}
	}
	idle := 0.0
	for _, h := range offered {
		idle += max(h, 0)
	}
	return idle, nil
}

// pendingFigures are the pods' pending times (creation to Running) and
// those never Running.
func pendingFigures(tl timeline, f *figures) {
	var pending []float64
	for _, p := range tl.Pods {
		f.Pods++
		switch {
		case p.Running <= tl.End && p.Running <= p.Deleted:
			pending = append(pending, (p.Running - p.Created).Seconds())
		case p.Deleted <= tl.End:
			f.NeverRunning++
			f.DeletedPending++
		default:
			f.NeverRunning++
		}
	}
	slices.Sort(pending)
	f.PendingP50, f.PendingP90, f.PendingP99 = percentile(pending, 50), percentile(pending, 90), percentile(pending, 99)
}

// percentile is the nearest-rank q-th percentile of sorted values, 0 of
// none.
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
