package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sampleReport has ours in three rounds, Karpenter in one, the floor.
func sampleReport(t *testing.T) *report {
	t.Helper()
	w, err := buildWorkload(testTrace(t, rows), workloadOptions{Compression: 10, Node: h100(t)})
	if err != nil {
		t.Fatal(err)
	}
	ours := func(r int, p99, nodeHours, idle float64, never int) round {
		return round{Side: sideOurs, Round: r, Figures: figures{Pods: 5, NeverRunning: never, PendingP50: 1, PendingP90: 2, PendingP99: p99,
			NodeHours: nodeHours / 10, TraceNodeHours: nodeHours, IdleGPUHours: idle / 10, TraceIdleGPUHours: idle, PeakNodes: 3, Launches: 4 + r, Deletions: 4}}
	}
	return &report{
		Machine: "2 cores", Started: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Trace: "/t.csv", Citation: traceCitation,
		TracePods: 6, TraceEndSeconds: 2400, Workload: w, Pods: len(w.Pods), BootDelay: "8m0s", BootDelayReplay: "48s",
		Sides: sideNames(), Rounds: 3,
		Results: []round{
			// Out of order on purpose; medians: p99 4, node-hours 12, idle 30.
			ours(2, 6, 12, 50, 1), ours(1, 4, 14, 30, 0), ours(3, 3, 11, 10, 0),
			{Side: sideKarpenter, Round: 1, Figures: figures{Pods: 5, NeverRunning: 2, PendingP50: 2, PendingP90: 5, PendingP99: 10,
				TraceNodeHours: 20, TraceIdleGPUHours: 40, PeakNodes: 4, Launches: 6, Deletions: 5}, Failures: []string{"a pod stayed pending"}},
			{Side: sideFloor, Round: 1, Figures: figures{Pods: 5, TraceNodeHours: 10, TraceIdleGPUHours: 5, PeakNodes: 2, Launches: 3, Deletions: 3}},
		},
		FloorBoundNodeHours: 8,
	}
}

func TestMedian(t *testing.T) {
	rep := sampleReport(t)
	f, n := rep.median(sideOurs)
	want := figures{Pods: 5, PendingP50: 1, PendingP90: 2, PendingP99: 4, NodeHours: 1.2, TraceNodeHours: 12, IdleGPUHours: 3, TraceIdleGPUHours: 30, PeakNodes: 3, Launches: 6, Deletions: 4}
	if n != 3 || !near(f, want) {
		t.Errorf("median of ours: %+v over %d rounds, want %+v over 3", f, n, want)
	}
	// Two rounds: the lower middle.
	rep.Results = rep.Results[:2]
	if f, n := rep.median(sideOurs); n != 2 || f.PendingP99 != 4 || f.TraceNodeHours != 12 {
		t.Errorf("median of two rounds: p99 %v, node-hours %v over %d; want 4, 12 over 2", f.PendingP99, f.TraceNodeHours, n)
	}
	if _, n := rep.median(sideFloor); n != 0 {
		t.Errorf("the floor has %d rounds, want 0", n)
	}
}

func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*report)
		want   []string
	}{
		{"met", func(*report) {}, []string{
			"met: idle GPU-hours (trace time), ours ≤ Karpenter's: ours 30 h, karpenter 40 h (0.75×)",
			"met: p99 pending (replay), ours ≤ 0.5× Karpenter's: ours 4 s, karpenter 10 s (0.40×) (never Running: ours 0, Karpenter 2)",
			"met: node-hours (trace time), ours ≤ 1.3× the floor's: ours 12 h, floor 10 h (1.20×)",
			"**Goal: met.**",
		}},
		{"not met", func(rep *report) { rep.Results[4].Figures.TraceNodeHours, rep.Results[3].Figures.PendingP99 = 9, 7 }, []string{
			"met: idle GPU-hours",
			"NOT met: p99 pending (replay), ours ≤ 0.5× Karpenter's: ours 4 s, karpenter 7 s (0.57×)",
			"NOT met: node-hours (trace time), ours ≤ 1.3× the floor's: ours 12 h, floor 9 h (1.33×)",
			"**Goal: not met.**",
		}},
		{"Karpenter not run", func(rep *report) { rep.Results = append(rep.Results[:3], rep.Results[4]) }, []string{
			"idle GPU-hours, ours ≤ Karpenter's: cannot tell (karpenter not run)",
			"met: node-hours",
			"**Goal: cannot tell**",
		}},
		{"only the floor", func(rep *report) { rep.Results = rep.Results[4:] }, []string{
			"p99 pending, ours ≤ 0.5× Karpenter's: cannot tell (ours not run, karpenter not run)",
			"node-hours, ours ≤ 1.3× the floor's: cannot tell (ours not run)",
			"**Goal: cannot tell**",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := sampleReport(t)
			tc.change(rep)
			got := rep.verdict()
			if len(got) != 4 {
				t.Fatalf("%d lines, want 4:\n%s", len(got), strings.Join(got, "\n"))
			}
			all := strings.Join(got, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("verdict lacks %q:\n%s", w, all)
				}
			}
		})
	}
}

func TestMarkdown(t *testing.T) {
	rep := sampleReport(t)
	rep.NotRun = map[string]string{}
	md := rep.markdown()
	for _, want := range []string{
		"**Sides run: ours, karpenter, floor.**",
		"| ours | 3 | 1.0 / 2.0 / 4.0 | 0 (0 deleted pending) | 12.0 | 30.0 | 3 | 6 / 4 | 0.60× | 1.20× | 0.75× | 0.40× |",
		"| karpenter | 1 | 2.0 / 5.0 / 10.0 | 2 (0 deleted pending) | 20.0 | 40.0 | 4 | 6 / 5 | – | 2.00× | – | – |",
		"| floor | 1 | 0.0 / 0.0 / 0.0 | 0 (0 deleted pending) | 10.0 | 5.0 | 2 | 3 / 3 | 0.50× | – | 0.12× | 0.00× |",
		"fluid bound (the running pods' requests over a node's, rounded up, as if pods could be split and moved): 8.0 node-hours",
		"**Goal: met.**",
		"USENIX ATC 2023",
		"1 GPU-sharing pods (gpu_milli below 1000) each take a whole GPU",
		"1 pods of 8 GPUs ask for the node's whole allocatable",
		"1 pods the trace never scheduled",
		"1 pods no node holds were skipped: c (120000 CPU milli",
		"Boot delay 8m0s (48s replayed)",
		"compressed 10× (trace seconds per replayed second) into 4m0s",
		"karpenter round 1: a pod stayed pending",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// The sides that did not run say so, in the header and the table.
	rep.Results = rep.Results[4:]
	rep.NotRun = map[string]string{sideOurs: notYet, sideKarpenter: notYet}
	md = rep.markdown()
	for _, want := range []string{
		"**Sides run: floor.** ours: not run (phase 1",
		"karpenter: not run (phase 1",
		"| ours | not run | – |",
		"| karpenter | not run | – |",
		"| floor | 1 | 0.0 / 0.0 / 0.0 | 0 (0 deleted pending) | 10.0 | 5.0 | 2 | 3 / 3 | – | – | – | – |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	rep := sampleReport(t)
	if err := rep.write(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != 5 || back.Results[4].Figures.TraceNodeHours != 10 || back.Workload.Compression != 10 || back.Workload.Node.Allocatable.GPUs != 8 {
		t.Errorf("report.json read back: %+v", back)
	}
	for _, key := range []string{`"nodeHoursTrace"`, `"idleGPUHoursTrace"`, `"pendingP99Seconds"`, `"citation"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("report.json lacks %s", key)
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil || string(md) != rep.markdown() {
		t.Errorf("report.md is not the markdown (%v)", err)
	}
}

func TestFormats(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{fmtInt(1234567), "1,234,567"},
		{fmtInt(-1000), "-1,000"},
		{fmtInt(12), "12"},
		{fmtSeconds(3600), "1h0m0s"},
		{fmtSeconds(12902960), "149d8h9m20s"},
		{ratio(1, 4), "0.25×"},
		{ratio(1, 0), "–"},
		{unfitList([]string{"a", "b", "c", "d", "e", "f", "g"}), ": a; b; c; d; e; and 2 more"},
		{unfitList(nil), ""},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
