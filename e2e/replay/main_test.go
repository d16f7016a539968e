package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	good := options{sides: sideNames(), rounds: 1}
	for _, tc := range []struct {
		name   string
		change func(*options)
		want   string
	}{
		{"defaults", func(*options) {}, ""},
		{"a given compression", func(o *options) { o.compression = 60 }, ""},
		{"an unknown side", func(o *options) { o.sides = []string{"ours", "cas"} }, `--sides: "cas" is not one of ours, karpenter, floor`},
		{"no side", func(o *options) { o.sides = nil }, "--sides: none given"},
		{"no rounds", func(o *options) { o.rounds = 0 }, "--rounds: 0 is not between 1 and 20"},
		{"a negative boot", func(o *options) { o.bootDelay = -time.Second }, "--boot-delay: -1s is negative"},
		{"a negative window", func(o *options) { o.window.Length = -time.Hour }, "neither may be negative"},
		{"compression below 1", func(o *options) { o.compression = 0.5 }, "--compression: 0.5 is below 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.change(&o)
			err := o.check()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("check = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestReplay runs phase 1 end to end on a small trace: the floor's
// figures, and the autoscalers marked not run.
func TestReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), traceFile)
	if err := os.WriteFile(path, []byte(header+floorRows), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := replay(context.Background(), options{trace: path, sides: sideNames(), rounds: 2, bootDelay: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// 200 s of trace: the default compression is 1 (never stretched).
	if rep.Workload.Compression != 1 || rep.Pods != 6 || rep.TracePods != 6 || rep.BootDelayReplay != "10s" {
		t.Errorf("compression %v, pods %d of %d, boot %s; want 1, 6 of 6, 10s", rep.Workload.Compression, rep.Pods, rep.TracePods, rep.BootDelayReplay)
	}
	if len(rep.Results) != 1 || rep.Results[0].Side != sideFloor {
		t.Fatalf("results %+v, want the floor's alone", rep.Results)
	}
	f := rep.Results[0].Figures
	// TestFloor works these out: 430 node-seconds with a 10 s boot.
	if want := (figures{Pods: 6, NodeHours: 430.0 / 3600, TraceNodeHours: 430.0 / 3600, IdleGPUHours: 1500.0 / 3600, TraceIdleGPUHours: 1500.0 / 3600, PeakNodes: 3, Launches: 3, Deletions: 3}); !near(f, want) {
		t.Errorf("floor %+v\nwant  %+v", f, want)
	}
	if rep.NotRun[sideOurs] != notYet || rep.NotRun[sideKarpenter] != notYet || len(rep.NotRun) != 2 {
		t.Errorf("not run: %v", rep.NotRun)
	}
	if md := rep.markdown(); !strings.Contains(md, "**Sides run: floor.**") || !strings.Contains(md, "| ours | not run |") {
		t.Errorf("the markdown does not say only the floor ran:\n%s", md)
	}

	rep, err = replay(context.Background(), options{trace: path, sides: []string{sideOurs}, rounds: 1})
	if err != nil || len(rep.Results) != 0 || !strings.Contains(rep.markdown(), "**Sides run: none.**") {
		t.Errorf("ours alone: %v, results %+v", err, rep)
	}
	for _, tc := range []struct {
		name string
		o    options
		want string
	}{
		{"no trace", options{trace: filepath.Join(t.TempDir(), "nope.csv"), sides: sideNames()}, "alibaba/clusterdata"},
		{"an empty window", options{trace: path, sides: sideNames(), window: window{Start: 10 * time.Second, Length: 20 * time.Second}}, path + ": window 20s from 10s: no pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := replay(context.Background(), tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := replay(ctx, options{trace: path, sides: sideNames()}); err == nil {
		t.Error("no error from a cancelled context")
	}
}
