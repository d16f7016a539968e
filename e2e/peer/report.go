package main

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// The runs of a size.
const (
	runOurs      = "ours"
	runKarpenter = "karpenter"
	runFloor     = "floor"
)

var runNames = []string{runOurs, runKarpenter, runFloor}

// The goal the report is held against: ours at most goalVsKarpenter times
// Karpenter's time to all Running and goalVsFloor times the floor's.
const (
	goalVsKarpenter = 0.6
	goalVsFloor     = 1.3
)

// point is one sample, At seconds after the workload was submitted.
type point struct {
	At      float64 `json:"t"`
	Running int     `json:"running"`
	Nodes   int     `json:"nodes"`
}

// result is one run: one autoscaler (or none, the floor) at one size on
// a fresh control plane.
type result struct {
	Run  string `json:"run"`
	Pods int    `json:"pods"`
	// Round is which of the --repeat rounds this is, from 1.
	Round int `json:"round,omitempty"`
	// PodsPerNode is how many pods a node holds (the floor's nodes are
	// the pods over this, rounded up; ours from the simulator's node).
	PodsPerNode int `json:"podsPerNode,omitempty"`
	// FirstNodeRequest is seconds from submission to the first node asked
	// for: ours, the first scale-set update (ARM PUT) that raised
	// capacity; Karpenter, the first NodeClaim seen. Nil for the floor, or
	// when no node was asked for.
	FirstNodeRequest *float64 `json:"firstNodeRequestSeconds,omitempty"`
	// AllRunning is seconds from submission to every pod Running; nil
	// when they did not all run within the timeout.
	AllRunning *float64 `json:"allRunningSeconds,omitempty"`
	// Nodes is the nodes bought: ours, the scale set's capacity; Karpenter,
	// its NodeClaims; the floor, the nodes made beforehand. Registered is
	// the Node objects at the end.
	Nodes      int `json:"nodes"`
	Registered int `json:"registeredNodes"`

	// Autoscaler is its process's figures; nil for the floor.
	Autoscaler *autoscalerFigures `json:"autoscaler,omitempty"`
	// AllRequests is the API server's apiserver_request_total from
	// submission to all Running (or the timeout): every client.
	AllRequests float64 `json:"allRequests"`
	// Components are the control plane's processes over the whole run
	// (peak RSS, CPU since start), and "harness", this process (etcd,
	// the ARM simulator and its node hook; CPU from submission).
	Components map[string]usage `json:"components,omitempty"`

	Series   []point  `json:"series"`
	LogDir   string   `json:"logDir"`
	Duration string   `json:"duration"`
	Failures []string `json:"failures,omitempty"`
}

// usage is what the report keeps of a process's measure.Usage: its peak
// RSS and CPU time.
type usage struct {
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	CPUSeconds float64 `json:"cpuSeconds"`
}

func usageOf(u measure.Usage) usage {
	return usage{PeakRSSMiB: u.PeakRSSMiB, CPUSeconds: u.CPUSeconds}
}

// autoscalerFigures are one autoscaler process's.
type autoscalerFigures struct {
	// Command is the exact command line and Env what was added to the
	// environment.
	Command []string `json:"command"`
	Env     []string `json:"env,omitempty"`
	// CPUSeconds is CPU time (user+system) from submission to all
	// Running; CPUSecondsTotal since the process started.
	CPUSeconds      float64 `json:"cpuSeconds"`
	CPUSecondsTotal float64 `json:"cpuSecondsTotal"`
	PeakRSSMiB      float64 `json:"peakRSSMiB"`
	// Requests is its rest_client_requests_total from submission to all
	// Running; RequestsTotal since it started.
	Requests      float64 `json:"requests"`
	RequestsTotal float64 `json:"requestsTotal"`
}

func (r *result) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.Failures = append(r.Failures, msg)
	say("  FAILED: %s", msg)
}

// report is report.json; report.md is its markdown.
type report struct {
	Machine   string    `json:"machine"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	BootDelay string    `json:"bootDelay"`
	// ARMLimits: the simulator throttled at ARM's limits with 10 s
	// long-running operations (the default).
	ARMLimits  bool   `json:"armLimits"`
	PodCPU     string `json:"podCPU"`
	PodMemory  string `json:"podMemory"`
	OurSKU     string `json:"ourSKU"`
	KarpenterT string `json:"karpenterInstanceType"`
	Karpenter  string `json:"karpenter"`
	Sizes      []int  `json:"sizes"`
	// Repeat is how many rounds each run had (--repeat): the table shows
	// each run's median round.
	Repeat  int       `json:"repeat,omitempty"`
	Results []*result `json:"results"`
	// Broken are the rounds that broke (a component failed, not a slow
	// run): not in Results, so not in any median.
	Broken []string `json:"broken,omitempty"`
}

// rounds are every round of run at size pods, fastest first (a round
// that did not get every pod Running last).
func (rep *report) rounds(run string, pods int) []*result {
	var out []*result
	for _, r := range rep.Results {
		if r.Run == run && r.Pods == pods {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b *result) int {
		switch {
		case a.AllRunning == nil && b.AllRunning == nil:
			return 0
		case a.AllRunning == nil:
			return 1
		case b.AllRunning == nil:
			return -1
		}
		return cmp.Compare(*a.AllRunning, *b.AllRunning)
	})
	return out
}

// find returns the median round of run at size pods (the lower one of an
// even count; a round that did not finish counts as the slowest), or nil.
func (rep *report) find(run string, pods int) *result {
	rs := rep.rounds(run, pods)
	if len(rs) == 0 {
		return nil
	}
	return rs[(len(rs)-1)/2]
}

// ratio is r's time to all Running over other's at the same size, or 0
// when either is missing.
func (rep *report) ratio(r *result, other string) float64 {
	o := rep.find(other, r.Pods)
	if o == nil || r.AllRunning == nil || o.AllRunning == nil || *o.AllRunning <= 0 {
		return 0
	}
	return *r.AllRunning / *o.AllRunning
}

// verdict says, per size, whether ours met the goal, or why it cannot
// be told.
func (rep *report) verdict() []string {
	var out []string
	for _, n := range rep.Sizes {
		ours := rep.find(runOurs, n)
		if ours == nil {
			continue
		}
		for _, g := range []struct {
			other string
			limit float64
		}{{runKarpenter, goalVsKarpenter}, {runFloor, goalVsFloor}} {
			line := fmt.Sprintf("%s pods, ours ≤ %.1f× %s: ", fmtInt(n), g.limit, g.other)
			switch q := rep.ratio(ours, g.other); {
			case rep.find(g.other, n) == nil:
				line += "not run"
			case q == 0:
				line += "cannot tell (a run did not get every pod Running)"
			case q <= g.limit:
				line += fmt.Sprintf("met (%.2f×)", q)
			default:
				line += fmt.Sprintf("NOT met (%.2f×)", q)
			}
			out = append(out, line)
		}
	}
	return out
}

func (rep *report) markdown() string {
	var b strings.Builder
	rep.writeIntro(&b)
	rep.writeTable(&b)
	rep.writeNotes(&b)
	if v := rep.verdict(); len(v) > 0 {
		b.WriteString("\n## Goal: ours ≤ 0.6× Karpenter's time to all Running, and within 1.3× of the floor\n\n")
		for _, l := range v {
			b.WriteString("- " + l + "\n")
		}
	}
	rep.writeCommandLines(&b)
	writeList(&b, "\n## Rounds that broke (in no median: a row's brackets show the rounds it has)\n\n", rep.Broken)
	writeList(&b, "\n## Failures\n\n", rep.failures())
	return b.String()
}

// writeIntro writes the title and what was run, where and how.
func (rep *report) writeIntro(b *strings.Builder) {
	fmt.Fprintf(b, "# vmss-autoscaler against Karpenter (make peer)\n\n")
	fmt.Fprintf(b, "%s; %s to %s. Each run on a fresh control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok). "+
		"Pods: a Deployment of pause pods of %s CPU / %s each. Nodes of 64 cores: ours %s from the ARM simulator, Karpenter's kwok provider (%s) %s. "+
		"Node registration delay %s on both sides.",
		rep.Machine, rep.Started.Format(time.RFC3339), rep.Finished.Format(time.RFC3339), rep.PodCPU, rep.PodMemory, rep.OurSKU, rep.Karpenter, rep.KarpenterT, rep.BootDelay)
	if !rep.ARMLimits {
		b.WriteString(" **The ARM simulator ran without ARM's limits** (--arm-limits=false): no throttling, long-running operations done at once.")
	}
	b.WriteString("\n\n")
}

// writeTable writes the table: a row per run and size (its median
// round).
func (rep *report) writeTable(b *strings.Builder) {
	b.WriteString("| run | first node request | all Running | ratio to Karpenter | ratio to floor | nodes | CPU s | peak RSS | API requests |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rep.sorted() {
		first, all := rep.times(r)
		vsK, vsF := rep.ratioText(r, runKarpenter), rep.ratioText(r, runFloor)
		cpu, rss, req := autoscalerText(r)
		fmt.Fprintf(b, "| %s %s | %s | %s | %s | %s | %d | %s | %s | %s |\n",
			r.Run, fmtInt(r.Pods), first, all, vsK, vsF, r.Nodes, cpu, rss, req)
	}
}

// times are a row's first node request and time to all Running, with
// every round's time when there were several.
func (rep *report) times(r *result) (first, all string) {
	first, all = "–", "not all"
	if r.FirstNodeRequest != nil {
		first = fmt.Sprintf("%.1f s", *r.FirstNodeRequest)
	}
	if r.AllRunning != nil {
		all = fmt.Sprintf("%.1f s", *r.AllRunning)
	}
	if rs := rep.rounds(r.Run, r.Pods); len(rs) > 1 {
		all += " (" + roundTimes(rs) + ")"
	}
	return first, all
}

// ratioText is r's ratio to other's run, "–" for other's own row or
// when it cannot be told.
func (rep *report) ratioText(r *result, other string) string {
	if r.Run == other {
		return "–"
	}
	if q := rep.ratio(r, other); q > 0 {
		return fmt.Sprintf("%.2f×", q)
	}
	return "–"
}

// autoscalerText is a row's autoscaler figures: CPU seconds, peak RSS,
// its API requests of all clients'.
func autoscalerText(r *result) (cpu, rss, req string) {
	a := r.Autoscaler
	if a == nil {
		return "–", "–", fmt.Sprintf("– / %s", fmtInt(int(r.AllRequests)))
	}
	return fmt.Sprintf("%.1f", a.CPUSeconds), fmt.Sprintf("%.0f MiB", a.PeakRSSMiB), fmt.Sprintf("%s / %s", fmtInt(int(a.Requests)), fmtInt(int(r.AllRequests)))
}

// writeNotes writes what the columns mean and what differs between the
// two sides.
func (rep *report) writeNotes(b *strings.Builder) {
	b.WriteString(`
- **first node request**: seconds from the Deployment's creation to the first node asked for: ours, the first ARM scale-set update (PUT) raising capacity, as the simulator logged it; Karpenter, the first NodeClaim, as the harness's watch saw it.
- **all Running**: seconds from the Deployment's creation until the harness's pod informer saw every pod Running. The floor is the same pods on nodes that already exist: what the control plane alone costs. With several rounds (--repeat) each row is the run's median round (every round's time in brackets, fastest first), and the ratios are of medians.
- **nodes**: bought. Ours, the scale set's capacity; Karpenter, its NodeClaims; the floor, the nodes made beforehand (the pods over the pods a node holds).
- **CPU s**: the autoscaler process's CPU time (user + system, /proc/<pid>/stat) from submission to all Running. **peak RSS**: its VmHWM (/proc/<pid>/status) at the end, over its whole life.
- **API requests**: the autoscaler's own Kubernetes requests (client-go's request counter, which ours exports as rest_client_requests_total and Karpenter as client_go_request_total; a watch counts once) / all clients' (the API server's apiserver_request_total: controllers, scheduler, kwok, the harness's informers and scrapes), both from submission to all Running. The API server has no per-user-agent request metric; its audit log would, and the harness does not turn it on.
`)
	b.WriteString(`
What differs between the two sides, beyond the autoscalers:

- **Who registers nodes.** Ours: the ARM simulator creates the VMs at the scale-set PUT and its hook, in the harness process, creates each Node as AKS registers it (allocatable less kube-reserved and the eviction threshold). Karpenter: its kwok provider creates the Node itself, from Karpenter's process, so Karpenter's CPU and API requests include that "cloud" work and ours do not (the harness's CPU is in report.json, components.harness).
- **The cloud's limits.** The ARM simulator throttles as Azure does today (ARM's per-principal token buckets, and the Compute resource provider's policies per scale set and per subscription: a scale set's Update is 12 tokens refilled 4 a minute) and a long-running operation lasts until its VMs boot, 10 s at least; Karpenter's kwok provider has no limits.
- **Each autoscaler's own defaults.** Ours: client QPS 20 (burst 40), smoothing on. Karpenter: client QPS 200 (burst 300), batching 1 s idle / 10 s max. Karpenter's NodePool consolidates after 10 minutes (our --scale-down-unneeded-time default), so neither removes nodes during the run.
`)
	if rep.Repeat > 1 {
		fmt.Fprintf(b, "- **Noise.** %d rounds of each run, interleaved (round 1 of ours, Karpenter and the floor, then round 2, ...), on a shared machine; the table shows medians.\n", rep.Repeat)
	} else {
		b.WriteString("- **Noise.** One run each on a shared machine; at a few hundred pods a second either way is noise (--repeat runs several rounds and reports medians).\n")
	}
}

// writeCommandLines writes each autoscaler's command line (and
// environment).
func (rep *report) writeCommandLines(b *strings.Builder) {
	b.WriteString("\n## Command lines\n\n")
	for _, r := range rep.sorted() {
		if r.Autoscaler == nil {
			continue
		}
		fmt.Fprintf(b, "- %s %s: `%s`", r.Run, fmtInt(r.Pods), strings.Join(r.Autoscaler.Command, " "))
		if len(r.Autoscaler.Env) > 0 {
			fmt.Fprintf(b, " with `%s`", strings.Join(r.Autoscaler.Env, " "))
		}
		b.WriteString("\n")
	}
}

// failures are every round's failures, named by run, size (and round).
func (rep *report) failures() []string {
	var fails []string
	for _, r := range rep.Results {
		for _, f := range r.Failures {
			name := fmt.Sprintf("%s %s", r.Run, fmtInt(r.Pods))
			if rep.Repeat > 1 {
				name += fmt.Sprintf(" round %d", r.Round)
			}
			fails = append(fails, name+": "+f)
		}
	}
	return fails
}

// writeList writes heading and items, a bullet each, when there are
// items.
func writeList(b *strings.Builder, heading string, items []string) {
	if len(items) == 0 {
		return
	}
	b.WriteString(heading)
	for _, it := range items {
		b.WriteString("- " + it + "\n")
	}
}

// roundTimes lists rounds' times to all Running, as the table shows them.
func roundTimes(rs []*result) string {
	var parts []string
	for _, r := range rs {
		if r.AllRunning == nil {
			parts = append(parts, "not all")
			continue
		}
		parts = append(parts, fmt.Sprintf("%.1f", *r.AllRunning))
	}
	return strings.Join(parts, ", ")
}

// sorted returns the median round of each run (find) by size, then ours,
// Karpenter, floor.
func (rep *report) sorted() []*result {
	var out []*result
	seen := map[string]bool{}
	for _, r := range rep.Results {
		key := fmt.Sprint(r.Run, "/", r.Pods)
		if !seen[key] {
			seen[key] = true
			out = append(out, rep.find(r.Run, r.Pods))
		}
	}
	slices.SortStableFunc(out, func(a, b *result) int {
		if a.Pods != b.Pods {
			return a.Pods - b.Pods
		}
		return slices.Index(runNames, a.Run) - slices.Index(runNames, b.Run)
	})
	return out
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

// write writes report.json, report.md and the plots to dir.
func (rep *report) write(dir string) error {
	if err := measure.WriteReport(dir, rep, rep.markdown()); err != nil {
		return err
	}
	return writePlots(dir, rep)
}

// machine describes this machine: cores, CPU model, Go.
func machine() string {
	s := fmt.Sprintf("%d cores", runtime.NumCPU())
	if model := measure.CPUModel(); model != "" {
		s += " (" + model + ")"
	}
	return s + ", " + runtime.Version()
}
