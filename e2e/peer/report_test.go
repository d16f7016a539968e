package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

func f(v float64) *float64 { return &v }

func sampleReport() *report {
	fig := func(cpu, rss, req float64) *autoscalerFigures {
		return &autoscalerFigures{Command: []string{"x", "--flag=1"}, CPUSeconds: cpu, PeakRSSMiB: rss, Requests: req}
	}
	return &report{
		Machine: "2 cores", Started: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), BootDelay: "0s",
		PodCPU: "2", PodMemory: "2Gi", OurSKU: ourSKU, KarpenterT: karpenterInstanceType, Karpenter: "k@v",
		Sizes: []int{1000, 5000},
		Results: []*result{
			// Out of order on purpose: the table sorts.
			{Run: runFloor, Pods: 1000, AllRunning: f(20), Nodes: 33, AllRequests: 3000},
			{Run: runKarpenter, Pods: 1000, FirstNodeRequest: f(2), AllRunning: f(50), Nodes: 34, Autoscaler: fig(4, 120, 300), AllRequests: 5000},
			{Run: runOurs, Pods: 1000, FirstNodeRequest: f(1.5), AllRunning: f(25), Nodes: 33, Autoscaler: fig(3, 80, 200), AllRequests: 4000},
			{Run: runOurs, Pods: 5000, FirstNodeRequest: f(1), AllRunning: f(100), Nodes: 162, Autoscaler: fig(9, 100, 900), AllRequests: 1234567},
			{Run: runKarpenter, Pods: 5000, Nodes: 160, Autoscaler: fig(9, 100, 900), Failures: []string{"not all pods Running"}},
			{Run: runFloor, Pods: 5000, AllRunning: f(70), Nodes: 162},
		},
	}
}

func TestRatio(t *testing.T) {
	rep := sampleReport()
	ours := rep.find(runOurs, 1000)
	if got := rep.ratio(ours, runKarpenter); got != 0.5 {
		t.Errorf("ours/karpenter at 1000 = %v, want 0.5", got)
	}
	if got := rep.ratio(ours, runFloor); got != 1.25 {
		t.Errorf("ours/floor at 1000 = %v, want 1.25", got)
	}
	// Karpenter never got every pod Running at 5000: no ratio.
	if got := rep.ratio(rep.find(runOurs, 5000), runKarpenter); got != 0 {
		t.Errorf("ours/karpenter at 5000 = %v, want 0 (unknown)", got)
	}
	if rep.find(runOurs, 300) != nil {
		t.Error("find returned a run of a size not run")
	}
}

func TestVerdict(t *testing.T) {
	got := strings.Join(sampleReport().verdict(), "\n")
	for _, want := range []string{
		"1,000 pods, ours ≤ 0.6× karpenter: met (0.50×)",
		"1,000 pods, ours ≤ 1.3× floor: met (1.25×)",
		"5,000 pods, ours ≤ 0.6× karpenter: cannot tell",
		"5,000 pods, ours ≤ 1.3× floor: NOT met (1.43×)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdict lacks %q:\n%s", want, got)
		}
	}
	rep := sampleReport()
	rep.Results = rep.Results[2:3] // ours at 1000 alone
	rep.Sizes = []int{1000}
	if got := strings.Join(rep.verdict(), "\n"); !strings.Contains(got, "karpenter: not run") {
		t.Errorf("verdict without Karpenter's run = %q", got)
	}
}

func TestMarkdownTable(t *testing.T) {
	md := sampleReport().markdown()
	header := "| run | first node request | all Running | ratio to Karpenter | ratio to floor | nodes | CPU s | peak RSS | API requests |"
	if !strings.Contains(md, header) {
		t.Fatalf("no table header in\n%s", md)
	}
	var rows []string
	for line := range strings.Lines(md) {
		if strings.HasPrefix(line, "| ours") || strings.HasPrefix(line, "| karpenter") || strings.HasPrefix(line, "| floor") {
			rows = append(rows, strings.TrimSpace(line))
		}
	}
	want := []string{
		"| ours 1,000 | 1.5 s | 25.0 s | 0.50× | 1.25× | 33 | 3.0 | 80 MiB | 200 / 4,000 |",
		"| karpenter 1,000 | 2.0 s | 50.0 s | – | 2.50× | 34 | 4.0 | 120 MiB | 300 / 5,000 |",
		"| floor 1,000 | – | 20.0 s | 0.40× | – | 33 | – | – | – / 3,000 |",
		"| ours 5,000 | 1.0 s | 100.0 s | – | 1.43× | 162 | 9.0 | 100 MiB | 900 / 1,234,567 |",
		"| karpenter 5,000 | – | not all | – | – | 160 | 9.0 | 100 MiB | 900 / 0 |",
		"| floor 5,000 | – | 70.0 s | – | – | 162 | – | – | – / 0 |",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	for _, s := range []string{"`x --flag=1`", "karpenter 5,000: not all pods Running", "## Goal"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	rep := sampleReport()
	rep.Results[0].Series = []point{{At: 0, Running: 0}, {At: 10, Running: 500}, {At: 20, Running: 1000}}
	rep.Results[2].Series = []point{{At: 0, Running: 0}, {At: 25, Running: 1000}}
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
	if len(back.Results) != 6 || back.find(runOurs, 1000).AllRunning == nil || *back.find(runOurs, 1000).AllRunning != 25 {
		t.Errorf("report.json does not round-trip: %s", b)
	}
	if back.find(runKarpenter, 5000).AllRunning != nil {
		t.Error("a run that never got all pods Running has an allRunningSeconds")
	}
	for _, name := range []string{"report.md", plotName(1000, "svg"), plotName(1000, "png")} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s not written: %v", name, err)
		}
	}
	// 5,000 has no series: no plot.
	if _, err := os.Stat(filepath.Join(dir, plotName(5000, "svg"))); err == nil {
		t.Error("plot written for a size without series")
	}
}

func TestFmtInt(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -5000: "-5,000"} {
		if got := fmtInt(n); got != want {
			t.Errorf("fmtInt(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestFirstScaleUp(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	writes := []armsim.Write{
		{At: at(-5), Op: "UpdateScaleSet", Status: 200, Capacity: 2},  // before submission
		{At: at(1), Op: "DeleteInstances", Status: 200, Capacity: -1}, // not an update
		{At: at(2), Op: "UpdateScaleSet", Status: 200, Capacity: 2},   // no raise
		{At: at(3), Op: "UpdateScaleSet", Status: 429, Capacity: 5},   // throttled, but asked
		{At: at(4), Op: "UpdateScaleSet", Status: 200, Capacity: 5},
	}
	got, ok := firstScaleUp(writes, t0)
	if !ok || !got.Equal(at(3)) {
		t.Errorf("firstScaleUp = %v, %v; want %v", got, ok, at(3))
	}
	if _, ok := firstScaleUp(writes[:3], t0); ok {
		t.Error("firstScaleUp found a raise where there is none")
	}
}

func TestRequestsOf(t *testing.T) {
	for _, name := range clientRequestMetrics {
		fams, err := measure.ParseMetrics(strings.NewReader("# TYPE " + name + " counter\n" +
			name + `{code="200",method="GET"} 10` + "\n" + name + `{code="201",method="POST"} 5` + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := requestsOf(fams, "test"); err != nil || got != 15 {
			t.Errorf("%s: requestsOf = %v, %v; want 15", name, got, err)
		}
	}
	fams, _ := measure.ParseMetrics(strings.NewReader("# TYPE other counter\nother 1\n"))
	if _, err := requestsOf(fams, "test"); err == nil {
		t.Error("requestsOf found requests in metrics without a client counter")
	}
}

func TestKarpenterObjects(t *testing.T) {
	nc := karpenterNodeClass(90 * time.Second)
	if got := nc.Object["spec"].(map[string]any)["nodeRegistrationDelay"]; got != "90s" {
		t.Errorf("nodeRegistrationDelay = %v, want 90s", got)
	}
	if got := durationString(0); got != "0s" {
		t.Errorf("durationString(0) = %q", got)
	}
	b, err := json.Marshal(karpenterNodePool().Object)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{karpenterInstanceType, `"consolidateAfter":"10m"`, `"kind":"KWOKNodeClass"`} {
		if !strings.Contains(string(b), s) {
			t.Errorf("NodePool lacks %s: %s", s, b)
		}
	}
}

// TestMedianOfRounds: with several rounds a row is the run's median round
// (a round that did not finish counts as the slowest), every round's time
// in brackets, the ratios and the verdict of medians, and a failure names
// its round.
func TestMedianOfRounds(t *testing.T) {
	rep := &report{Sizes: []int{1000}, Repeat: 3, Results: []*result{
		{Run: runOurs, Pods: 1000, Round: 1, AllRunning: f(30), Nodes: 33},
		{Run: runKarpenter, Pods: 1000, Round: 1, AllRunning: f(40), Nodes: 33},
		{Run: runOurs, Pods: 1000, Round: 2, AllRunning: f(20), Nodes: 33},
		{Run: runKarpenter, Pods: 1000, Round: 2, Nodes: 33, Failures: []string{"not all pods Running"}},
		{Run: runOurs, Pods: 1000, Round: 3, AllRunning: f(24), Nodes: 34},
		{Run: runKarpenter, Pods: 1000, Round: 3, AllRunning: f(60), Nodes: 33},
	}, Broken: []string{"floor round 1/3 1000: kwok exited"}}
	if m := rep.find(runOurs, 1000); m.Round != 3 {
		t.Fatalf("median of ours is round %d, want 3 (24 s of 20, 24, 30)", m.Round)
	}
	if m := rep.find(runKarpenter, 1000); m.Round != 3 {
		t.Fatalf("median of karpenter is round %d, want 3 (60 s of 40, 60, not all)", m.Round)
	}
	md := rep.markdown()
	for _, s := range []string{
		"| ours 1,000 | – | 24.0 s (20.0, 24.0, 30.0) | 0.40× |",
		"| karpenter 1,000 | – | 60.0 s (40.0, 60.0, not all) | – |",
		"1,000 pods, ours ≤ 0.6× karpenter: met (0.40×)",
		"karpenter 1,000 round 2: not all pods Running",
		"3 rounds of each run",
		"## Rounds that broke",
		"- floor round 1/3 1000: kwok exited",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	if n := strings.Count(md, "| ours 1,000 |"); n != 1 {
		t.Errorf("%d rows for ours 1,000, want 1 (the median)", n)
	}
}
