package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

const h = time.Hour

// sampleTimeline, to 6 h:
//
//	n1  created 0, ready 1h, deleted 5h: 5 node-hours, ready 4 h × 8 GPUs = 32
//	n2  created 2h, ready 2h:            4 node-hours, ready 4 h × 8 GPUs = 32
//	n3  created 4h, never ready:         2 node-hours, no GPU-hours
//	p1  4 GPUs on n1, 0.5h → 1h → 3h:    pending 1,800 s, 8 GPU-hours used
//	p2  8 GPUs on n2, 1h → 2h:           pending 3,600 s, 32 GPU-hours used
//	p3  created 5h, still pending:       never Running
//	p4  created 3h, deleted 3.5h:        never Running, deleted pending
//	p5  no GPUs on n1, 4h → 4h → 4.5h:   pending 0
//
// Node-hours 11, idle 32-8 + 32-32 = 24 GPU-hours, peak 3 nodes (n1, n2, n3
// from 4h to 5h), 3 launches, 1 deletion.
func sampleTimeline() timeline {
	return timeline{End: 6 * h,
		Nodes: []nodeLife{
			{Name: "n1", Created: 0, Ready: h, Deleted: 5 * h, GPUs: 8},
			{Name: "n2", Created: 2 * h, Ready: 2 * h, Deleted: never, GPUs: 8},
			{Name: "n3", Created: 4 * h, Ready: never, Deleted: never, GPUs: 8},
		},
		Pods: []podLife{
			{Name: "p1", Created: h / 2, Running: h, Deleted: 3 * h, Node: "n1", GPUs: 4},
			{Name: "p2", Created: h, Running: 2 * h, Deleted: never, Node: "n2", GPUs: 8},
			{Name: "p3", Created: 5 * h, Running: never, Deleted: never},
			{Name: "p4", Created: 3 * h, Running: never, Deleted: 7 * h / 2, GPUs: 1},
			{Name: "p5", Created: 4 * h, Running: 4 * h, Deleted: 9 * h / 2, Node: "n1"},
		},
	}
}

func TestAccount(t *testing.T) {
	clipped := sampleTimeline()
	// A pod outliving its node counts only while the node is ready, and
	// a node asked for more GPUs than it has is not negative idle.
	clipped.Pods = append(clipped.Pods, podLife{Name: "p6", Created: 0, Running: 0, Deleted: 6 * h, Node: "n1", GPUs: 8})
	late := sampleTimeline()
	// A node created after the end is not counted.
	late.Nodes = append(late.Nodes, nodeLife{Name: "n4", Created: 7 * h, Ready: 7 * h, Deleted: never, GPUs: 8})
	early := sampleTimeline()
	// A pod Running before its node is ready (a recording's skew) uses
	// GPUs only from then: p1 still uses 8 GPU-hours.
	early.Pods[0].Running = h / 2
	bought := sampleTimeline()
	// The floor buys before the start: a node from -1h counts from then.
	bought.Nodes[0].Created = -h
	for _, tc := range []struct {
		name string
		tl   timeline
		want figures
	}{
		{"sample", sampleTimeline(), figures{Pods: 5, NeverRunning: 2, DeletedPending: 1, PendingP50: 1800, PendingP90: 3600, PendingP99: 3600,
			NodeHours: 11, IdleGPUHours: 24, TraceNodeHours: 110, TraceIdleGPUHours: 240, PeakNodes: 3, Launches: 3, Deletions: 1}},
		{"a pod outliving its node, GPUs over-asked", clipped, figures{Pods: 6, NeverRunning: 2, DeletedPending: 1, PendingP50: 0, PendingP90: 3600, PendingP99: 3600,
			NodeHours: 11, IdleGPUHours: 0, TraceNodeHours: 110, TraceIdleGPUHours: 0, PeakNodes: 3, Launches: 3, Deletions: 1}},
		{"a pod Running before its node is ready", early, figures{Pods: 5, NeverRunning: 2, DeletedPending: 1, PendingP50: 0, PendingP90: 3600, PendingP99: 3600,
			NodeHours: 11, IdleGPUHours: 24, TraceNodeHours: 110, TraceIdleGPUHours: 240, PeakNodes: 3, Launches: 3, Deletions: 1}},
		{"a node after the end", late, figures{Pods: 5, NeverRunning: 2, DeletedPending: 1, PendingP50: 1800, PendingP90: 3600, PendingP99: 3600,
			NodeHours: 11, IdleGPUHours: 24, TraceNodeHours: 110, TraceIdleGPUHours: 240, PeakNodes: 3, Launches: 3, Deletions: 1}},
		{"bought before the start", bought, figures{Pods: 5, NeverRunning: 2, DeletedPending: 1, PendingP50: 1800, PendingP90: 3600, PendingP99: 3600,
			NodeHours: 12, IdleGPUHours: 24, TraceNodeHours: 120, TraceIdleGPUHours: 240, PeakNodes: 3, Launches: 3, Deletions: 1}},
		{"nothing", timeline{End: h}, figures{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := account(tc.tl, 10)
			if err != nil {
				t.Fatal(err)
			}
			if !near(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// near says whether two figures agree to a microhour.
func near(a, b figures) bool {
	const eps = 1e-6
	for _, p := range [][2]float64{
		{a.NodeHours, b.NodeHours}, {a.IdleGPUHours, b.IdleGPUHours}, {a.TraceNodeHours, b.TraceNodeHours}, {a.TraceIdleGPUHours, b.TraceIdleGPUHours},
		{a.PendingP50, b.PendingP50}, {a.PendingP90, b.PendingP90}, {a.PendingP99, b.PendingP99},
	} {
		if math.Abs(p[0]-p[1]) > eps {
			return false
		}
	}
	a.NodeHours, a.IdleGPUHours, a.TraceNodeHours, a.TraceIdleGPUHours, a.PendingP50, a.PendingP90, a.PendingP99 = 0, 0, 0, 0, 0, 0, 0
	b.NodeHours, b.IdleGPUHours, b.TraceNodeHours, b.TraceIdleGPUHours, b.PendingP50, b.PendingP90, b.PendingP99 = 0, 0, 0, 0, 0, 0, 0
	return a == b
}

func TestAccountErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*timeline)
		want   string
	}{
		{"a node ready before created", func(tl *timeline) { tl.Nodes[1].Ready = h }, "node n2: ready 1h0m0s or deleted"},
		{"a node deleted before created", func(tl *timeline) { tl.Nodes[0].Created = 6 * h }, "node n1: ready"},
		{"a pod Running before created", func(tl *timeline) { tl.Pods[0].Running = 0 }, "pod p1: running 0s"},
		{"a pod on a node not in the timeline", func(tl *timeline) { tl.Pods[1].Node = "n9" }, `pod p2: on node "n9"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := sampleTimeline()
			tc.mutate(&tl)
			if _, err := account(tl, 1); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	for _, tc := range []struct {
		name string
		v    []float64
		q    float64
		want float64
	}{
		{"none", nil, 50, 0},
		{"one", []float64{7}, 99, 7},
		{"p50 of 1..100", hundred, 50, 50},
		{"p90 of 1..100", hundred, 90, 90},
		{"p99 of 1..100", hundred, 99, 99},
		{"p99 of four: the largest", []float64{1, 2, 3, 4}, 99, 4},
		{"p50 of four: the lower middle", []float64{1, 2, 3, 4}, 50, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.v, tc.q); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
