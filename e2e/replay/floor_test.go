package main

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// floorRows, in seconds (compression 1):
//
//	0    a (1 GPU), b (4), c (4) arrive: first-fit decreasing puts b and c
//	     on floor-0 and a on floor-1 (in arrival order a would share floor-0)
//	50   c leaves; d (8 GPUs: a whole node) fits neither: floor-2
//	100  a and b leave; e (2) takes floor-0, floor-1 is released
//	150  d leaves; f (no GPUs, no lifetime) comes and goes on floor-0;
//	     floor-2 is released
//	200  e leaves at the trace's end; floor-0 is released
//
// Node-seconds 200 + 100 + 100 = 400; peak 3 nodes; idle GPU-seconds:
// floor-0 4×50 (b alone) + 6×100 (e alone) = 800, floor-1 7×100 = 700,
// floor-2 0: 1,500. The fluid bound: 2 nodes to 150 s (9, 13 then 10
// GPUs), 1 to 200 s: 350 node-seconds.
const floorRows = `a,1000,1024,1,1000,,LS,Running,0,100,0
b,1000,1024,4,1000,,LS,Running,0,100,0
c,1000,1024,4,1000,,LS,Running,0,50,0
d,1000,1024,8,1000,,LS,Running,50,150,50
e,1000,1024,2,1000,,LS,Running,100,200,100
f,2000,2048,0,0,,BE,Running,150,150,150
`

func TestFloor(t *testing.T) {
	node := h100(t)
	w, err := buildWorkload(testTrace(t, floorRows), workloadOptions{Compression: 1, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	s := time.Second
	for _, tc := range []struct {
		name      string
		boot      time.Duration
		created   []time.Duration
		nodeHours float64
	}{
		{"ready at once", 0, []time.Duration{0, 0, 50 * s}, 400.0 / 3600},
		{"bought a boot ahead", 10 * s, []time.Duration{-10 * s, -10 * s, 40 * s}, 430.0 / 3600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := floor(w, tc.boot)
			var created, ready, deleted []time.Duration
			for _, n := range r.Timeline.Nodes {
				created, ready, deleted = append(created, n.Created), append(ready, n.Ready), append(deleted, n.Deleted)
			}
			if fmt.Sprint(created) != fmt.Sprint(tc.created) || fmt.Sprint(ready) != "[0s 0s 50s]" || fmt.Sprint(deleted) != "[3m20s 1m40s 2m30s]" {
				t.Errorf("nodes created %v, ready %v, deleted %v; want %v, [0s 0s 50s], [3m20s 1m40s 2m30s]", created, ready, deleted, tc.created)
			}
			on := map[string]string{}
			for _, p := range r.Timeline.Pods {
				on[p.Name] = p.Node
				if p.Running != p.Created {
					t.Errorf("pod %s pending %s on the floor", p.Name, p.Running-p.Created)
				}
			}
			if got := fmt.Sprint(on); got != "map[a:floor-1 b:floor-0 c:floor-0 d:floor-2 e:floor-0 f:floor-0]" {
				t.Errorf("pods on %s", got)
			}
			f, err := account(r.Timeline, w.Compression)
			if err != nil {
				t.Fatal(err)
			}
			want := figures{Pods: 6, NodeHours: tc.nodeHours, TraceNodeHours: tc.nodeHours, IdleGPUHours: 1500.0 / 3600, TraceIdleGPUHours: 1500.0 / 3600, PeakNodes: 3, Launches: 3, Deletions: 3}
			if !near(f, want) {
				t.Errorf("figures %+v\nwant    %+v", f, want)
			}
			if math.Abs(r.BoundNodeHours-350.0/3600) > 1e-9 {
				t.Errorf("fluid bound %v node-hours, want %v", r.BoundNodeHours, 350.0/3600)
			}
		})
	}
}

// syntheticTrace is n made-up pods over about the OpenB trace's span,
// shaped like it: mostly 1 GPU (some shared), some CPU-only, a few of 2, 4
// and 8 GPUs; lifetimes exponential around half an hour.
func syntheticTrace(n int) *trace {
	r := rand.New(rand.NewPCG(44, 1))
	tr := &trace{Source: "synthetic"}
	const span = 12_900_000
	for i := range n {
		gpus := []int64{0, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8}[r.IntN(11)]
		milli := min(gpus, 1) * 1000
		if gpus == 1 && r.IntN(2) == 0 {
			milli = 100 + r.Int64N(900)
		}
		created := r.Int64N(span)
		tr.Pods = append(tr.Pods, tracePod{
			Name: fmt.Sprintf("p%d", i), CPUMilli: 1000 + r.Int64N(16_000), MemoryMiB: 1024 + r.Int64N(128<<10), GPUs: gpus, GPUMilli: milli,
			Created: created, Deleted: min(created+int64(r.ExpFloat64()*1800), span), Scheduled: created,
		})
		tr.End = max(tr.End, tr.Pods[i].Deleted)
	}
	return tr
}

// TestFloorHolds checks the floor on a large made-up trace: no node ever
// holds more than it offers, every pod runs on a node while it is ready,
// every node ends released, and no packing beats the fluid bound.
func TestFloorHolds(t *testing.T) {
	node := h100(t)
	w, err := buildWorkload(syntheticTrace(8152), workloadOptions{Budget: defaultBudget, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	r := floor(w, 3*time.Millisecond)
	nodes := map[string]nodeLife{}
	for _, n := range r.Timeline.Nodes {
		nodes[n.Name] = n
		if n.Deleted == never {
			t.Errorf("node %s never released", n.Name)
		}
	}
	type step struct {
		at  time.Duration
		req resources
	}
	steps := map[string][]step{}
	for i, p := range r.Timeline.Pods {
		n := nodes[p.Node]
		if p.Running < n.Ready || p.Deleted > n.Deleted {
			t.Fatalf("pod %s runs %s to %s on %s, ready %s to %s", p.Name, p.Running, p.Deleted, p.Node, n.Ready, n.Deleted)
		}
		req := w.Pods[i].Req
		steps[p.Node] = append(steps[p.Node], step{p.Running, req}, step{p.Deleted, resources{}.minus(req)})
	}
	for name, ss := range steps {
		// Departures first at the same instant, as the floor does them.
		slices.SortFunc(ss, func(a, b step) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.req.GPUs, b.req.GPUs)) })
		var used resources
		for _, s := range ss {
			if used = used.plus(s.req); !used.fits(node.Allocatable) {
				t.Fatalf("node %s holds %+v at %s, more than %+v", name, used, s.at, node.Allocatable)
			}
		}
	}
	f, err := account(r.Timeline, w.Compression)
	if err != nil {
		t.Fatal(err)
	}
	if f.Pods != len(w.Pods) || f.NeverRunning != 0 || f.PendingP99 != 0 || f.NodeHours < r.BoundNodeHours || f.Launches != f.Deletions {
		t.Errorf("figures %+v, fluid bound %v", f, r.BoundNodeHours)
	}
}

// BenchmarkFloor packs a made-up trace of the OpenB trace's 8,152 pods.
func BenchmarkFloor(b *testing.B) {
	w, err := buildWorkload(syntheticTrace(8152), workloadOptions{Budget: defaultBudget, Node: h100(b)})
	if err != nil {
		b.Fatal(err)
	}
	var r floorResult
	for b.Loop() {
		r = floor(w, 0)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(w.Pods)), "ns/pod")
	b.ReportMetric(float64(len(r.Timeline.Nodes)), "launches")
}
