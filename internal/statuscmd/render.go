package statuscmd

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

// Output formats of -o.
const (
	OutputTable = "table"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

// Render writes v in format (table, json or yaml); now dates the table's
// relative times.
func Render(w io.Writer, v *View, format string, now time.Time) error {
	switch format {
	case OutputTable, "":
		return renderTable(w, v, now)
	case OutputJSON:
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Errorf("rendering JSON: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", data)
		return err
	case OutputYAML:
		data, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("rendering YAML: %w", err)
		}
		_, err = w.Write(data)
		return err
	default:
		return fmt.Errorf("-o=%q: want table, json or yaml", format)
	}
}

// Columns of the table, kubectl style.
var columns = []string{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"}

func renderTable(w io.Writer, v *View, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(columns, "\t"))
	var notes []string
	for _, g := range v.NodeGroups {
		target := "?"
		if g.Target != nil {
			target = itoa(*g.Target)
		} else if g.SizeError != "" {
			notes = append(notes, fmt.Sprintf("%s: size unknown: %s", g.Name, g.SizeError))
		}
		if g.MaxWarning != "" {
			notes = append(notes, fmt.Sprintf("WARNING: %s: %s", g.Name, g.MaxWarning))
		}
		if g.FailedRunning > 0 {
			notes = append(notes, fmt.Sprintf("WARNING: %s: %d VMs Failed in Azure but running: kept with their pods (FailedVMRunning events)", g.Name, g.FailedRunning))
		}
		warmCol := "-"
		if g.Warm != nil {
			warmCol = fmt.Sprintf("%d/%d", g.Warm.Ready, g.Warm.Target)
		}
		queued := "-"
		if g.Queued > 0 {
			queued = itoa(g.Queued)
			if len(g.QueuedByClass) > 1 || g.QueuedByClass["workload"] == 0 {
				queued += " (" + classes(g.QueuedByClass) + ")"
			}
		}
		fmt.Fprintln(tw, strings.Join([]string{g.Name, itoa(g.Min), target, itoa(g.Max), itoa(g.Ready), itoa(g.Upcoming),
			itoa(g.Preflight), itoa(g.Failed()), warmCol, queued, backoffText(g.Backoff, now)}, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.NodeGroups) == 0 {
		fmt.Fprintln(w, "(no node group: a standby replica's /metrics has none; the leader's has)")
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	if err := renderHealth(w, v.Health); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, line := range summary(v, now) {
		fmt.Fprintln(w, line)
	}
	return nil
}

func backoffText(b *core.BackoffStatus, now time.Time) string {
	if b == nil {
		return "-"
	}
	reason := b.Reason
	if reason == "" {
		reason = "yes"
	}
	if b.Until.IsZero() {
		return reason
	}
	left := b.Until.Sub(now)
	if left <= 0 {
		return reason + " (ended)"
	}
	return fmt.Sprintf("%s (%s left)", reason, shortDuration(left))
}

// summary is the lines under the table: where the view is from, pods,
// the queue and what holds it, scale-down.
func summary(v *View, now time.Time) []string {
	from := "From " + v.Source
	if v.AsOf != nil {
		label := "changed"
		if strings.HasPrefix(v.Source, "metrics") {
			label = "last successful loop"
		}
		from += fmt.Sprintf(", %s %s ago (%s)", label, shortDuration(now.Sub(*v.AsOf)), v.AsOf.UTC().Format(time.RFC3339))
	}
	lines := []string{from + "."}
	pods := fmt.Sprintf("Pods: %d unschedulable, %d waiting for upcoming nodes.", v.UnschedulablePods, v.PodsAwaitingNodes)
	if v.Nodes != nil && v.ReadyNodes != nil {
		pods += fmt.Sprintf(" Nodes: %d, %d ready.", *v.Nodes, *v.ReadyNodes)
	}
	lines = append(lines, pods)

	q := v.Queue
	queue := "Node-addition queue: "
	if q.Smoothing != nil && !*q.Smoothing {
		queue += "smoothing off (every planned node is requested at once)"
	} else {
		queue += fmt.Sprintf("%d %s queued", q.Queued, plural(q.Queued, "node", "nodes"))
		switch {
		case q.Queued > 0 && q.HeldBy == "rate":
			queue += ", held by the rate"
		case q.Queued > 0 && q.HeldBy == "in-flight":
			queue += ", held by the in-flight cap"
		case q.Queued > 0 && q.Smoothing == nil:
			queue += " (what holds them is in the status ConfigMap, not /metrics)"
		}
		queue += fmt.Sprintf("; rate %s nodes/min", strconv.FormatFloat(q.RateNodesPerMinute, 'f', -1, 64))
		if q.RateReason != "" {
			queue += " (" + q.RateReason + ")"
		}
		if q.Burst != nil {
			queue += fmt.Sprintf(", burst %d", *q.Burst)
			if q.Bucket != nil && *q.Bucket > *q.Burst {
				queue += fmt.Sprintf(" (%d a loop at this rate)", *q.Bucket)
			}
		}
		if q.Tokens != nil {
			queue += fmt.Sprintf(", %.1f tokens", *q.Tokens)
		}
		queue += fmt.Sprintf("; %d in flight", q.InFlight)
		if q.MaxInFlight != nil {
			queue += fmt.Sprintf(" (at most %d)", *q.MaxInFlight)
		}
	}
	lines = append(lines, queue+".")

	if sd := v.ScaleDown; sd != nil {
		s := fmt.Sprintf("Scale-down: %d unneeded, %d being removed", sd.UnneededNodes, sd.Removing)
		if sd.BrakeEngaged {
			s += "; the safety brake is engaged"
			if sd.RecentDeletions != nil {
				s += fmt.Sprintf(" (%d deletions in its window)", *sd.RecentDeletions)
			}
		}
		if sd.HeldBecause != "" {
			s += "; held: " + sd.HeldBecause
		}
		lines = append(lines, s+".")
	}
	for _, w := range v.Warnings {
		lines = append(lines, "WARNING: "+w+".")
	}
	return lines
}

// shortDuration rounds d for people: 45s, 4m12s, 2h5m.
func shortDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		r := d.Round(time.Second)
		if r%time.Minute == 0 {
			return strings.TrimSuffix(r.String(), "0s")
		}
		return r.String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// renderHealth lists the unhealthy nodes: rule, action, where each is.
func renderHealth(w io.Writer, h *core.HealthStatus) error {
	if h == nil || len(h.Unhealthy) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "UNHEALTHY NODE\tGROUP\tRULE\tACTION\tSTATE")
	for _, n := range h.Unhealthy {
		fmt.Fprintln(tw, strings.Join([]string{n.Node, n.NodeGroup, n.Rule, n.Action, n.State}, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if h.More > 0 {
		fmt.Fprintf(w, "(and %d more)\n", h.More)
	}
	return nil
}
