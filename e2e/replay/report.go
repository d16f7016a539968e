package main

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// The sides of a replay.
const (
	sideOurs      = "ours"
	sideKarpenter = "karpenter"
	sideFloor     = "floor"
)

// sideNames are the sides in the report's order.
func sideNames() []string { return []string{sideOurs, sideKarpenter, sideFloor} }

// The goal the report is held against: ours at most Karpenter's idle
// GPU-hours at most goalPendingVsKarpenter times its p99 pending time, and
// at most goalVsFloor times the floor's node-hours.
const (
	goalPendingVsKarpenter = 0.5
	goalVsFloor            = 1.3
)

// round is one side's run.
type round struct {
	Side     string   `json:"side"`
	Round    int      `json:"round"`
	Figures  figures  `json:"figures"`
	Failures []string `json:"failures,omitempty"`
}

// report is report.json; report.md is its markdown.
type report struct {
	Machine  string    `json:"machine"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Trace    string    `json:"trace"`
	Citation string    `json:"citation"`
	// TracePods and TraceEndSeconds are the whole trace's.
	TracePods       int       `json:"tracePods"`
	TraceEndSeconds int64     `json:"traceEndSeconds"`
	Workload        *workload `json:"workload"`
	Pods            int       `json:"pods"`
	// BootDelay is a node's boot as Azure has it; BootDelayReplay is it
	// compressed, what both sides and the floor get.
	BootDelay       string   `json:"bootDelay"`
	BootDelayReplay string   `json:"bootDelayReplay"`
	Sides           []string `json:"sides"`
	Rounds          int      `json:"rounds"`
	OursFlags       []string `json:"oursFlags,omitempty"`
	Results         []round  `json:"results"`
	// NotRun are the sides asked for that did not run, and why.
	NotRun map[string]string `json:"notRun,omitempty"`
	// FloorBoundNodeHours is the fluid bound, in trace hours.
	FloorBoundNodeHours float64 `json:"floorBoundNodeHoursTrace"`
}

// median is side's figures, each the median (the lower middle) of its
// rounds', and how many rounds it had.
func (rep *report) median(side string) (figures, int) {
	var fs []figures
	for _, r := range rep.Results {
		if r.Side == side {
			fs = append(fs, r.Figures)
		}
	}
	if len(fs) == 0 {
		return figures{}, 0
	}
	m := func(get func(figures) float64) float64 { return medianOf(fs, get) }
	n := func(get func(figures) int) int {
		return int(medianOf(fs, func(f figures) float64 { return float64(get(f)) }))
	}
	return figures{
		Pods:              n(func(f figures) int { return f.Pods }),
		NeverRunning:      n(func(f figures) int { return f.NeverRunning }),
		DeletedPending:    n(func(f figures) int { return f.DeletedPending }),
		PendingP50:        m(func(f figures) float64 { return f.PendingP50 }),
		PendingP90:        m(func(f figures) float64 { return f.PendingP90 }),
		PendingP99:        m(func(f figures) float64 { return f.PendingP99 }),
		NodeHours:         m(func(f figures) float64 { return f.NodeHours }),
		IdleGPUHours:      m(func(f figures) float64 { return f.IdleGPUHours }),
		TraceNodeHours:    m(func(f figures) float64 { return f.TraceNodeHours }),
		TraceIdleGPUHours: m(func(f figures) float64 { return f.TraceIdleGPUHours }),
		PeakNodes:         n(func(f figures) int { return f.PeakNodes }),
		Launches:          n(func(f figures) int { return f.Launches }),
		Deletions:         n(func(f figures) int { return f.Deletions }),
	}, len(fs)
}

// medianOf is the lower middle of get over fs.
func medianOf(fs []figures, get func(figures) float64) float64 {
	v := make([]float64, len(fs))
	for i, f := range fs {
		v[i] = get(f)
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// ran says whether side has a round.
func (rep *report) ran(side string) bool {
	_, n := rep.median(side)
	return n > 0
}

// ratio is a over b as "0.50×", or "–" when b is not positive.
func ratio(a, b float64) string {
	if b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// goal says whether ours (a) ≤ limit × the other side's (b), with the
// figures and their ratio.
func goal(what string, limit, a, b float64, other, unit string) string {
	line := fmt.Sprintf("%s: ours %.4g %s, %s %.4g %s (%s)", what, a, unit, other, b, unit, ratio(a, b))
	if a <= limit*b {
		return "met: " + line
	}
	return "NOT met: " + line
}

// verdict is the goal's lines: each part, met or not with the figures, and
// the whole.
func (rep *report) verdict() []string {
	ours, _ := rep.median(sideOurs)
	k, _ := rep.median(sideKarpenter)
	fl, _ := rep.median(sideFloor)
	var lines []string
	missing := false
	for _, part := range []struct {
		other, what string
		line        func() string
	}{
		{sideKarpenter, "idle GPU-hours, ours ≤ Karpenter's", func() string {
			return goal("idle GPU-hours (trace time), ours ≤ Karpenter's", 1, ours.TraceIdleGPUHours, k.TraceIdleGPUHours, sideKarpenter, "h")
		}},
		{sideKarpenter, "p99 pending, ours ≤ 0.5× Karpenter's", func() string {
			return goal("p99 pending (replay), ours ≤ 0.5× Karpenter's", goalPendingVsKarpenter, ours.PendingP99, k.PendingP99, sideKarpenter, "s") +
				fmt.Sprintf(" (never Running: ours %d, Karpenter %d)", ours.NeverRunning, k.NeverRunning)
		}},
		{sideFloor, "node-hours, ours ≤ 1.3× the floor's", func() string {
			return goal("node-hours (trace time), ours ≤ 1.3× the floor's", goalVsFloor, ours.TraceNodeHours, fl.TraceNodeHours, sideFloor, "h")
		}},
	} {
		switch {
		case !rep.ran(sideOurs) || !rep.ran(part.other):
			missing = true
			lines = append(lines, fmt.Sprintf("%s: cannot tell (%s)", part.what, rep.whoDidNotRun(part.other)))
		default:
			lines = append(lines, part.line())
		}
	}
	return append(lines, overall(lines, missing))
}

// whoDidNotRun names which of ours and other did not run.
func (rep *report) whoDidNotRun(other string) string {
	var out []string
	for _, s := range []string{sideOurs, other} {
		if !rep.ran(s) {
			out = append(out, s+" not run")
		}
	}
	return strings.Join(out, ", ")
}

// overall is the goal's whole verdict from its parts' lines.
func overall(lines []string, missing bool) string {
	for _, l := range lines {
		if strings.HasPrefix(l, "NOT met") {
			return "**Goal: not met.**"
		}
	}
	if missing {
		return "**Goal: cannot tell**: a side it compares did not run."
	}
	return "**Goal: met.**"
}

func (rep *report) markdown() string {
	var b strings.Builder
	rep.header(&b)
	rep.table(&b)
	b.WriteString("\n## Goal: ours ≤ Karpenter's idle GPU-hours at ≤ 0.5× its p99 pending time, and within 1.3× the floor's node-hours\n\n")
	for _, l := range rep.verdict() {
		b.WriteString("- " + l + "\n")
	}
	rep.model(&b)
	rep.failures(&b)
	return b.String()
}

// header is the title, what ran and the workload.
func (rep *report) header(b *strings.Builder) {
	w := rep.Workload
	fmt.Fprintf(b, "# Trace replay: vmss-autoscaler, Karpenter and the floor (issue #44)\n\n")
	fmt.Fprintf(b, "%s; %s to %s.\n\n", rep.Machine, rep.Started.Format(time.RFC3339), rep.Finished.Format(time.RFC3339))
	var ran []string
	for _, s := range rep.Sides {
		if rep.ran(s) {
			ran = append(ran, s)
		}
	}
	fmt.Fprintf(b, "**Sides run: %s.**", orNone(ran))
	for _, s := range sideNames() {
		if why, ok := rep.NotRun[s]; ok {
			fmt.Fprintf(b, " %s: not run (%s).", s, why)
		}
	}
	fmt.Fprintf(b, "\n\nTrace: %s (%s pods over %s), from `%s`. Replayed: the pods created from %s to %s of trace time, %s pods, "+
		"compressed %s× (trace seconds per replayed second) into %s. Nodes: %s, %d GPUs, %s CPU milli and %s MiB allocatable, %d pods each. "+
		"Boot delay %s (%s replayed), the same on every side. %d round(s) of each autoscaler; the table shows each figure's median.\n",
		traceCitation, fmtInt(rep.TracePods), fmtSeconds(rep.TraceEndSeconds), rep.Trace, fmtSeconds(w.Start), fmtSeconds(w.End), fmtInt(rep.Pods),
		fmtInt(int(w.Compression)), w.Span.Round(time.Second), w.Node.SKU, w.Node.Allocatable.GPUs, fmtInt(int(w.Node.Allocatable.CPUMilli)),
		fmtInt(int(w.Node.Allocatable.MemoryMiB)), w.Node.MaxPods, rep.BootDelay, rep.BootDelayReplay, rep.Rounds)
}

// table is one row per side: the median figures and the ratios.
func (rep *report) table(b *strings.Builder) {
	b.WriteString("\n| side | rounds | pending p50 / p90 / p99 (replay s) | never Running | node-hours (trace h) | idle GPU-hours (trace h) | peak nodes | launches / deletions | node-hours vs Karpenter | vs floor | idle GPU-hours vs Karpenter | p99 vs Karpenter |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	k, _ := rep.median(sideKarpenter)
	fl, _ := rep.median(sideFloor)
	for _, s := range sideNames() {
		f, n := rep.median(s)
		if n == 0 {
			fmt.Fprintf(b, "| %s | not run | – | – | – | – | – | – | – | – | – | – |\n", s)
			continue
		}
		vsK, vsF, idleK, p99K := ratio(f.TraceNodeHours, k.TraceNodeHours), ratio(f.TraceNodeHours, fl.TraceNodeHours), ratio(f.TraceIdleGPUHours, k.TraceIdleGPUHours), ratio(f.PendingP99, k.PendingP99)
		if s == sideKarpenter {
			vsK, idleK, p99K = "–", "–", "–"
		}
		if s == sideFloor {
			vsF = "–"
		}
		fmt.Fprintf(b, "| %s | %d | %.1f / %.1f / %.1f | %d (%d deleted pending) | %.1f | %.1f | %d | %d / %d | %s | %s | %s | %s |\n",
			s, n, f.PendingP50, f.PendingP90, f.PendingP99, f.NeverRunning, f.DeletedPending, f.TraceNodeHours, f.TraceIdleGPUHours,
			f.PeakNodes, f.Launches, f.Deletions, vsK, vsF, idleK, p99K)
	}
	if rep.ran(sideFloor) {
		fmt.Fprintf(b, "\nThe floor's fluid bound (the running pods' requests over a node's, rounded up, as if pods could be split and moved): %.1f node-hours (trace).\n", rep.FloorBoundNodeHours)
	}
	b.WriteString(`
- **pending**: seconds of replay from a pod's creation to Running, percentiles (nearest rank) over the pods that ran; **never Running**: the others, deleted before Running or still pending at the end. Pending stays in replayed seconds: a control plane's own latency is not compressed.
- **node-hours**: the nodes bought, from creation (request) to deletion or the end, every one an 8-GPU node, scaled to trace time (replayed hours × the compression): what the traced cluster's users would pay. **idle GPU-hours**: allocatable GPUs on ready nodes that no pod Running there requested, integrated over time, in trace hours.
- **ratios**: of medians; "–" where the other side did not run or its figure is 0.
`)
}

// model says what the workload model changed and what each side's cloud
// model adds.
func (rep *report) model(b *strings.Builder) {
	w := rep.Workload
	fmt.Fprintf(b, `
## The workload model

- Each trace pod is a pause pod of its requests: CPU, memory and GPUs (nvidia.com/gpu). GPUs are whole: %s GPU-sharing pods (gpu_milli below 1000) each take a whole GPU, as Kubernetes counts them. %s pods of 8 GPUs ask for the node's whole allocatable CPU and memory, so nothing shares their node.
- %s pods the trace never scheduled (pod_phase Pending) are replayed all the same: the autoscalers see their requests. %s pods never deleted or outliving the window are cut at its end. Pods created before the window are not replayed (it starts from an empty cluster).
- %s pods no node holds were skipped%s.
- Compressed %s×, %s of %s pods live less than %s replayed (median lifetime %s): on a real control plane such pods are likely deleted before they run (the floor runs them at once). A window (--window-start, --window) with a smaller compression replays them at a pace a control plane keeps.
`, fmtInt(w.SharedGPU), fmtInt(w.WholeNode), fmtInt(w.NeverScheduled), fmtInt(w.EndsAtEnd), fmtInt(len(w.Unfit)), unfitList(w.Unfit),
		fmtInt(int(w.Compression)), fmtInt(w.ShortLived), fmtInt(rep.Pods), shortLived, w.MedianLifetime.Round(time.Millisecond))
	b.WriteString(`
## What each side's cloud model adds

- **ours**: the ARM simulator. Scale-set PUTs throttled as Azure does (ARM's per-principal buckets, the Compute policies per scale set and subscription), long-running operations that last until the VMs boot, and nodes registered as AKS registers them (allocatable less kube-reserved and the eviction threshold; GPUs advertised by the device plugin shortly after registration). Smoothing on; warm pools and buffers off unless a variant's --ours-flag says so.
- **karpenter**: Karpenter's kwok provider creates each Node itself, from Karpenter's process, with no cloud limits; its instance type is given the same node shape and the same boot delay.
- **floor**: no cloud and no control plane: the schedule packed first-fit decreasing as it changes, each node bought a boot ahead of need (so no pod waits) and released when empty; pods never move. Computed once (it is deterministic).
`)
	if len(rep.OursFlags) > 0 {
		fmt.Fprintf(b, "- Variant: ours with `%s`.\n", strings.Join(rep.OursFlags, " "))
	}
}

// failures lists the rounds' failures.
func (rep *report) failures(b *strings.Builder) {
	var fails []string
	for _, r := range rep.Results {
		for _, f := range r.Failures {
			fails = append(fails, fmt.Sprintf("%s round %d: %s", r.Side, r.Round, f))
		}
	}
	if len(fails) == 0 {
		return
	}
	b.WriteString("\n## Failures\n\n")
	for _, f := range fails {
		b.WriteString("- " + f + "\n")
	}
}

// unfitList names up to five unfit pods.
func unfitList(unfit []string) string {
	if len(unfit) == 0 {
		return ""
	}
	s := ": " + strings.Join(unfit[:min(len(unfit), 5)], "; ")
	if len(unfit) > 5 {
		s += fmt.Sprintf("; and %d more", len(unfit)-5)
	}
	return s
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// fmtSeconds writes trace seconds as days and hours.
func fmtSeconds(s int64) string {
	d := time.Duration(s) * time.Second
	if d < 24*time.Hour {
		return d.String()
	}
	return fmt.Sprintf("%dd%s", d/(24*time.Hour), (d % (24 * time.Hour)).String())
}

// fmtInt writes n with thousands separators.
func fmtInt(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}

// write writes report.json and report.md to dir.
func (rep *report) write(dir string) error {
	return measure.WriteReport(dir, rep, rep.markdown())
}

// machine describes this machine: cores, CPU model, Go.
func machine() string {
	s := fmt.Sprintf("%d cores", runtime.NumCPU())
	if model := measure.CPUModel(); model != "" {
		s += " (" + model + ")"
	}
	return s + ", " + runtime.Version()
}
