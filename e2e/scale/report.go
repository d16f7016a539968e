package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/measure"
)

// report is a whole run: report.json is this, report.md its table.
type report struct {
	Size      string `json:"size"`
	Machine   string `json:"machine"`
	BootDelay string `json:"bootDelay"`
	// Heartbeats are the control plane's node heartbeats (kwok's Lease
	// and status intervals, the node lifecycle controller's grace).
	Heartbeats string `json:"heartbeats"`
	// SeedNodes of the burst ran before the autoscaler started.
	SeedNodes int `json:"seedNodes,omitempty"`
	// Layout is the burst's scale sets (cpu, ib); LRODuration how long
	// the simulator's long-running operations last.
	Layout      string `json:"layout,omitempty"`
	LRODuration string `json:"lroDuration,omitempty"`
	// Extensions is how long a new VM runs its extensions once booted.
	Extensions string `json:"extensions,omitempty"`
	// ScaleDownCompressed: the autoscaler ran with the compressed
	// scale-down timings (the run watched a scale-down); else every flag
	// but the ARM and cluster wiring was its default.
	ScaleDownCompressed bool `json:"scaleDownCompressed"`
	// AutoscalerFlags were added to the autoscaler's defaults
	// (--autoscaler-flag).
	AutoscalerFlags []string  `json:"autoscalerFlags,omitempty"`
	Started         time.Time `json:"started"`
	Finished        time.Time `json:"finished"`
	Scenarios       []*result `json:"scenarios"`
	// Failures are the checks across scenarios that failed.
	Failures []string `json:"failures,omitempty"`
}

// check compares scenarios: with more nodes than smoothing lets through in
// a minute, smoothing must have asked for fewer at once than no smoothing.
func (rep *report) check() {
	var on, off *result
	for _, r := range rep.Scenarios {
		switch r.Name {
		case "burst":
			on = r
		case "burst-unsmoothed":
			off = r
		}
	}
	if adaptiveMaxRate, bucketMax := smoothingBounds(); on == nil || off == nil || on.NodesNeeded <= adaptiveMaxRate+bucketMax {
		return
	}
	if on.ScaleUpWrites.MaxPerMinute >= off.ScaleUpWrites.MaxPerMinute {
		msg := fmt.Sprintf("smoothing on asked for %d nodes within 60 s, no fewer than smoothing off (%d)", on.ScaleUpWrites.MaxPerMinute, off.ScaleUpWrites.MaxPerMinute)
		rep.Failures = append(rep.Failures, msg)
		say("CHECK FAILED: %s", msg)
	}
}

func (rep *report) failures() []string {
	out := append([]string(nil), rep.Failures...)
	for _, r := range rep.Scenarios {
		for _, f := range r.Failures {
			out = append(out, r.Name+": "+f)
		}
	}
	return out
}

func (rep *report) write(dir string) error {
	if err := measure.WriteReport(dir, rep, rep.markdown()); err != nil {
		return err
	}
	return writePlots(dir, rep.Scenarios)
}

// machine describes this machine: cores, memory, CPU model, Go.
func machine() string {
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb float64
				if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%f kB", &kb); err == nil {
					mem = fmt.Sprintf(", %.0f GiB RAM", kb/1024/1024)
				}
			}
		}
	}
	s := fmt.Sprintf("%d cores%s", runtime.NumCPU(), mem)
	if model := measure.CPUModel(); model != "" {
		s += " (" + model + ")"
	}
	return s + ", " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}

func (rep *report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	flags := "with its default flags, scale-down timings included"
	if rep.ScaleDownCompressed {
		flags = "with its default flags but the scale-down timings (see docs/performance/scale.md)"
	}
	if len(rep.AutoscalerFlags) > 0 {
		flags += ", plus " + strings.Join(rep.AutoscalerFlags, " ")
	}
	seed := ""
	if rep.SeedNodes > 0 {
		seed = fmt.Sprintf(" %d of the burst's nodes were Ready, with their pods Running, before the autoscaler started and the rest of the pods were submitted; it added the nodes for those.", rep.SeedNodes)
	}
	layout := ""
	if rep.Layout == layoutIB {
		layout = fmt.Sprintf(" The burst runs on the InfiniBand layout: %s scale sets of %d VMs (singlePlacementGroup=true), one whole-node 8-GPU pod a node.", gpuSKU, ibSetSize)
	}
	lro := ""
	if rep.Extensions != "" && rep.Extensions != "0s" {
		lro = fmt.Sprintf(" and then run their extensions for %s", rep.Extensions)
	}
	if rep.LRODuration != "" {
		lro += fmt.Sprintf("; an operation (scale-set update, instance deletion) lasts until its VMs are provisioned or gone, and at least %s", rep.LRODuration)
	}
	p("Scale run, size `%s`, on %s; %s → %s. Simulated VMs boot in %s ±50%%%s; ARM allows %d reads and %d writes a minute per principal, and the simulator's Compute RP policies are on (a scale set's Update: 12 tokens, refilled 4 a minute); the autoscaler runs %s. Heartbeats: %s.%s%s\n\n",
		rep.Size, rep.Machine, rep.Started.Format("2006-01-02 15:04"), rep.Finished.Format("15:04 MST"), rep.BootDelay, lro, armReadsPerMinute, armWritesPerMinute, flags, rep.Heartbeats, seed, layout)
	p("|  |")
	for _, r := range rep.Scenarios {
		p(" %s |", r.Name)
	}
	p("\n|---|")
	for range rep.Scenarios {
		p("---:|")
	}
	p("\n")
	row := func(name string, f func(*result) string) {
		p("| %s |", name)
		for _, r := range rep.Scenarios {
			p(" %s |", f(r))
		}
		p("\n")
	}
	row("smoothing", func(r *result) string { return map[bool]string{true: "on (defaults)", false: "off"}[r.Smoothing] })
	row("pods / nodes needed", func(r *result) string { return fmt.Sprintf("%d / %d", r.Pods, r.NodesNeeded) })
	if rep.SeedNodes > 0 {
		row("seeded nodes (Ready after)", func(r *result) string {
			if r.SeedNodes == 0 {
				return "–"
			}
			return fmt.Sprintf("%d (%.0f s)", r.SeedNodes, r.SeedSeconds)
		})
	}
	row("time to all nodes / all pods Running", func(r *result) string {
		nodes, pods := "**never**", "**never**"
		if r.TimeToAllNodes > 0 {
			nodes = fmt.Sprintf("%.0f s", r.TimeToAllNodes)
		}
		if r.TimeToAllRunning > 0 {
			pods = fmt.Sprintf("%.0f s", r.TimeToAllRunning)
		}
		return nodes + " / " + pods
	})
	row("nodes at the end (ARM capacity)", func(r *result) string { return fmt.Sprintf("%d (%d)", r.NodesAtEnd, r.CapacityAtEnd) })
	row("most nodes requested in 60 s", func(r *result) string {
		return fmt.Sprintf("%d (%d writes)", r.ScaleUpWrites.MaxPerMinute, r.ScaleUpWrites.Writes)
	})
	row("most nodes joined in 60 s", func(r *result) string { return fmt.Sprint(r.MaxJoinedIn60s) })
	row("API server during joins: p99 latency median / worst 10 s", func(r *result) string {
		a := r.APIDuringJoins
		if a.Intervals == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f / %.0f ms (%.0f req/s)", a.MedianP99, a.WorstP99, a.RequestsPerSecond)
	})
	row("API server during joins: APF rejections / 429s", func(r *result) string {
		a := r.APIDuringJoins
		if a.Intervals == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f / %.0f", a.Rejected, a.Throttled)
	})
	row("loop p50 / p99 / max", func(r *result) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f s (%d loops)", r.Loops.P50, r.Loops.P99, r.Loops.Max, r.Loops.Count)
	})
	row("autoscaler peak RSS / CPU", func(r *result) string {
		return fmt.Sprintf("%.0f MiB / %.0f s", r.Autoscaler.PeakRSSMiB, r.Autoscaler.CPUSeconds)
	})
	row("autoscaler API requests / API server total", func(r *result) string {
		share := 0.0
		if r.APIServerRequestsTotal > 0 {
			share = 100 * r.AutoscalerRequestsTotal / r.APIServerRequestsTotal
		}
		perMin := ""
		if r.AutoscalerMinutes > 0 {
			perMin = fmt.Sprintf("; %.0f/min", r.AutoscalerRequestsTotal/r.AutoscalerMinutes)
		}
		return fmt.Sprintf("%.0f / %.0f (%.2f%%%s)", r.AutoscalerRequestsTotal, r.APIServerRequestsTotal, share, perMin)
	})
	row("status ConfigMap writes", func(r *result) string {
		if r.AutoscalerMinutes <= 0 {
			return fmt.Sprintf("%.0f", r.StatusWrites)
		}
		return fmt.Sprintf("%.0f (%.1f/min)", r.StatusWrites, r.StatusWrites/r.AutoscalerMinutes)
	})
	row("at full size: nodes, loop p50 / p99 / max", func(r *result) string {
		st := r.Steady
		if st == nil {
			return "–"
		}
		return fmt.Sprintf("%d nodes for %.0f s: %.2f / %.2f / %.2f s (%d loops)", st.Nodes, st.To-st.From, st.Loops.P50, st.Loops.P99, st.Loops.Max, st.Loops.Count)
	})
	row("at full size: autoscaler RSS / CPU", func(r *result) string {
		st := r.Steady
		if st == nil || st.RSSMiB == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f MiB / %.3f cores", st.RSSMiB, st.CPUCores)
	})
	row("at full size: API requests / status writes a minute", func(r *result) string {
		st := r.Steady
		if st == nil || st.RSSMiB == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f / %.1f", st.RequestsPerMinute, st.StatusWritesPerMinute)
	})
	row("ARM calls / refreshes (per refresh)", func(r *result) string {
		return fmt.Sprintf("%.0f / %.0f (%.1f)", r.ARMCallsTotal, r.Refreshes, r.ARMCallsPerRefresh)
	})
	row("ARM 429s the autoscaler counted", func(r *result) string { return fmt.Sprintf("%.0f", r.ARMThrottled) })
	row("VM lists (simulator): total / per 30 min", func(r *result) string {
		a := r.Azure
		if a == nil {
			return "–"
		}
		how := "most in any 30 min"
		if !a.Windowed {
			how = fmt.Sprintf("scaled from %.0f min", a.ObservedMinutes)
		}
		return fmt.Sprintf("%d / %.0f (%s)", a.VMLists, a.VMListsPer30Min, how)
	})
	row("429s (simulator): Compute RP / ARM, whole run (steady state)", func(r *result) string {
		a := r.Azure
		if a == nil {
			return "–"
		}
		return fmt.Sprintf("%d / %d (%d / %d)", a.ComputeThrottled, a.ARMThrottled, a.SteadyComputeThrottled, a.SteadyARMThrottled)
	})
	row("longest stall: pods pending, capacity short, no write accepted", func(r *result) string {
		a := r.Azure
		if a == nil {
			return "–"
		}
		return fmt.Sprintf("%.0f s (freeze: ≥ %.0f s); kinds held %.0f s", a.LongestStall, a.FreezeThreshold, a.LongestKindHold)
	})
	row("API server peak RSS / CPU", func(r *result) string { return usageCell(r, "kube-apiserver") })
	row("scheduler peak RSS / CPU", func(r *result) string { return usageCell(r, "kube-scheduler") })
	row("controller manager peak RSS / CPU", func(r *result) string { return usageCell(r, "kube-controller-manager") })
	row("kwok peak RSS / CPU", func(r *result) string { return usageCell(r, "kwok") })
	row("harness (etcd, ARM simulator) peak RSS / CPU", func(r *result) string { return usageCell(r, "harness") })
	row("busiest process (share of all CPU time)", func(r *result) string {
		name, most, total := "", 0.0, 0.0
		for n, u := range r.Components {
			total += u.CPUSeconds
			if u.CPUSeconds > most {
				name, most = n, u.CPUSeconds
			}
		}
		if total == 0 {
			return "–"
		}
		return fmt.Sprintf("%s (%.0f%%)", name, 100*most/total)
	})
	row("scale-down under the brake", func(r *result) string {
		sd := r.ScaleDown
		if sd == nil {
			return "–"
		}
		return fmt.Sprintf("%d → %d nodes in %.0f s; first after %.0f s; at most %d deletions sent per %s (brake: %d); nodes gone per window: at most %.0f%%", sd.StartNodes, sd.EndNodes, sd.WatchedFor, sd.FirstRemoval, sd.MostSent, sd.Window, sd.SentLimit, 100*sd.MaxShare)
	})
	row("checks", func(r *result) string {
		if len(r.Failures) == 0 {
			return "pass"
		}
		return fmt.Sprintf("**%d failed**", len(r.Failures))
	})
	p("\n")
	for _, r := range rep.Scenarios {
		p("**%s** — %s. The autoscaler's API requests by verb and resource: ", r.Name, r.Description)
		var parts []string
		for _, kv := range topRequests(r.AutoscalerRequests, 8) {
			parts = append(parts, fmt.Sprintf("%s %.0f", kv.Key, kv.Count))
		}
		p("%s. ARM calls by operation: ", strings.Join(parts, ", "))
		parts = parts[:0]
		for _, kv := range topRequests(r.ARMCalls, 8) {
			parts = append(parts, fmt.Sprintf("%s %.0f", strings.TrimPrefix(kv.Key, "VirtualMachine"), kv.Count))
		}
		p("%s.", strings.Join(parts, ", "))
		if sd := r.ScaleDown; sd != nil {
			var ws []string
			for _, w := range sd.Windows {
				ws = append(ws, fmt.Sprintf("%d of %d", w.Removed, w.Nodes))
			}
			p(" Nodes removed per %s window: %s.", sd.Window, strings.Join(ws, ", "))
		}
		if a := r.Azure; a != nil && len(a.ThrottledByPolicy) > 0 {
			parts = parts[:0]
			for _, kv := range topRequests(toFloats(a.ThrottledByPolicy), 8) {
				parts = append(parts, fmt.Sprintf("%s %.0f", kv.Key, kv.Count))
			}
			p(" 429s by the policy or bucket that refused them: %s.", strings.Join(parts, ", "))
		}
		if a := r.Azure; a != nil && len(a.Criteria) > 0 {
			p("\n\nIssue #38's criteria (%s):\n", r.Name)
			for _, c := range a.Criteria {
				p("\n- %s: %s — %s", c.verdict(), c.Name, c.Detail)
			}
			if b := a.Bound; b != nil {
				p("\n\nThe bound is the time the per-set write budgets allow: each of the %d scale sets that grew needs its W capacity writes within its Update bucket (Compute throttling limits, Virtual Machine Scale Sets, Update: %d tokens, refilled %g a minute), then one operation, which lasts until its slowest VM has booted (boot delay +50%%) and run its extensions, when its node registers: %s, with W = %d, the accepted capacity writes of the busiest set until all nodes were up.",
					b.Sets, b.BucketCapacity, b.RefillPerMinute, b.formula(), b.MostWrites)
			}
			if f := a.InFlight; f != nil && f.Seconds > 0 {
				p(" Beside it, the autoscaler's own in-flight cap (--max-nodes-in-flight %d, a smoothing default: nodes requested and not yet ready) allows %d added nodes in ceil(%d / %d) operations of %.0f s = %.0f s when each node is in flight for a whole operation; the time to all nodes is %.2fx the larger of the two bounds, which is what is judged: the issue names the write budgets' time, but at the default smoothing the cap binds first by design (the added nodes joining within one operation is the burst smoothing exists to prevent).",
					f.Capacity, f.Added, f.Added, f.Capacity, f.Operation, f.Seconds, a.InFlightRatio)
			}
			p(" A freeze is a stretch of at least %.0f s (an operation and a minute) with pods pending, ARM's capacity short of the nodes they need and no capacity write or instance deletion accepted for any scale set. VM lists are the simulator's VM list pages answered; 429s are counted by the policy or ARM bucket that refused them, steady state being the hold with every pod Running.", a.FreezeThreshold)
		}
		for _, f := range r.Failures {
			p("\n- check failed: %s", f)
		}
		p("\n\n")
	}
	for _, f := range rep.Failures {
		p("- check failed: %s\n", f)
	}
	return b.String()
}

func toFloats(m map[string]int) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = float64(v)
	}
	return out
}

func usageCell(r *result, name string) string {
	u, ok := r.Components[name]
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.0f MiB / %.0f s", u.PeakRSSMiB, u.CPUSeconds)
}
