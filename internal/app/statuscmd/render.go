package statuscmd

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

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
		// The status quotes text tenants wrote (a CapacityBuffer's
		// template name, a ProvisioningRequest's): an escape sequence
		// there must not reach the operator's terminal (an OSC 52
		// clipboard write, a cursor move hiding a line).
		return renderTable(&printable{w: w}, v, now)
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
	if err := renderNodeGroups(w, v.NodeGroups, now); err != nil {
		return err
	}
	if err := renderHealth(w, v.Health); err != nil {
		return err
	}
	if err := renderProvisioningRequests(w, v.ProvisioningRequests, now); err != nil {
		return err
	}
	if err := renderCapacityBuffers(w, v.CapacityBuffers); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, line := range summary(v, now) {
		fmt.Fprintln(w, line)
	}
	return nil
}

// renderNodeGroups writes the node groups' table, then the notes on
// them (sizes unknown, warnings).
func renderNodeGroups(w io.Writer, groups []GroupView, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(columns, "\t"))
	var notes []string
	for _, g := range groups {
		notes = append(notes, groupNotes(g)...)
		fmt.Fprintln(tw, strings.Join(groupRow(g, now), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(groups) == 0 {
		fmt.Fprintln(w, "(no node group: a standby replica's /metrics has none; the leader's has)")
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return nil
}

// groupNotes are the lines under the table about a group: its size
// unknown, its max warning, its stale instances, its Failed VMs running.
func groupNotes(g GroupView) []string {
	var notes []string
	if g.Target == nil && g.SizeError != "" {
		notes = append(notes, fmt.Sprintf("%s: size unknown: %s", g.Name, g.SizeError))
	}
	if g.MaxWarning != "" {
		notes = append(notes, fmt.Sprintf("WARNING: %s: %s", g.Name, g.MaxWarning))
	}
	if g.InstancesStale != "" {
		notes = append(notes, fmt.Sprintf("%s: %s", g.Name, g.InstancesStale))
	}
	if g.FailedRunning > 0 {
		notes = append(notes, fmt.Sprintf("WARNING: %s: %d VMs Failed in Azure but running: kept with their pods (FailedVMRunning events)", g.Name, g.FailedRunning))
	}
	return notes
}

// groupRow is a group's cells, in the order of columns.
func groupRow(g GroupView, now time.Time) []string {
	target := "?"
	if g.Target != nil {
		target = itoa(*g.Target)
	}
	warmCol := "-"
	if g.Warm != nil {
		warmCol = fmt.Sprintf("%d/%d", g.Warm.Ready, g.Warm.Target)
	}
	return []string{g.Name, itoa(g.Min), target, itoa(g.Max), itoa(g.Ready), itoa(g.Upcoming),
		itoa(g.Preflight), itoa(g.Failed()), warmCol, queuedText(g), backoffText(g.Backoff, now)}
}

// queuedText is the QUEUED cell: "-", the count, or the count by class
// when any is not a workload's.
func queuedText(g GroupView) string {
	if g.Queued <= 0 {
		return "-"
	}
	queued := itoa(g.Queued)
	if len(g.QueuedByClass) > 1 || g.QueuedByClass["workload"] == 0 {
		queued += " (" + classes(g.QueuedByClass) + ")"
	}
	return queued
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
	lines := []string{fromLine(v, now) + "."}
	pods := podsLine(v)
	if v.Nodes != nil && v.ReadyNodes != nil {
		pods += fmt.Sprintf(" Nodes: %d, %d ready.", *v.Nodes, *v.ReadyNodes)
	}
	lines = append(lines, pods)
	lines = append(lines, queueLine(v.Queue)+".")
	if sd := v.ScaleDown; sd != nil {
		lines = append(lines, scaleDownLine(sd)+".")
	}
	for _, w := range v.Warnings {
		lines = append(lines, "WARNING: "+w+".")
	}
	return lines
}

// fromLine says where the view is from and how old it is.
func fromLine(v *View, now time.Time) string {
	from := "From " + v.Source
	if v.AsOf != nil {
		label := "changed"
		if strings.HasPrefix(v.Source, "metrics") {
			label = "last successful loop"
		}
		from += fmt.Sprintf(", %s %s ago (%s)", label, shortDuration(now.Sub(*v.AsOf)), v.AsOf.UTC().Format(time.RFC3339))
	}
	return from
}

// queueLine is the node-addition queue: what is queued and what holds
// it, the rate, the burst and tokens, the nodes in flight.
func queueLine(q QueueView) string {
	queue := "Node-addition queue: "
	if q.Smoothing != nil && !*q.Smoothing {
		return queue + "smoothing off (every planned node is requested at once)"
	}
	queue += fmt.Sprintf("%d %s queued", q.Queued, plural(q.Queued, "node", "nodes"))
	queue += queueHeld(q)
	queue += fmt.Sprintf("; rate %s nodes/min", strconv.FormatFloat(q.RateNodesPerMinute, 'f', -1, 64))
	if q.RateReason != "" {
		queue += " (" + q.RateReason + ")"
	}
	queue += burstText(q)
	if q.Tokens != nil {
		queue += fmt.Sprintf(", %.1f tokens", *q.Tokens)
	}
	queue += fmt.Sprintf("; %d in flight", q.InFlight)
	if q.MaxInFlight != nil {
		queue += fmt.Sprintf(" (at most %d)", *q.MaxInFlight)
	}
	return queue
}

// queueHeld says what holds the queued nodes back, if any are queued.
func queueHeld(q QueueView) string {
	if q.Queued <= 0 {
		return ""
	}
	if held, ok := heldByText(q.HeldBy); ok {
		return held
	}
	if q.Smoothing == nil {
		return " (what holds them is in the status ConfigMap, not /metrics)"
	}
	return ""
}

// heldByText is a QueueView.HeldBy as the queue's line says it.
func heldByText(heldBy string) (string, bool) {
	switch heldBy {
	case "rate":
		return ", held by the rate", true
	case "in-flight":
		return ", held by the in-flight cap", true
	case "paced":
		return ", paced (a group's scale-set writes spaced by --node-group-write-interval)", true
	case "write-in-flight":
		return ", waiting for a scale set's previous write to finish (one at a time per scale set)", true
	}
	return "", false
}

// burstText is the token bucket's burst, and what it holds a loop when
// that is more.
func burstText(q QueueView) string {
	if q.Burst == nil {
		return ""
	}
	s := fmt.Sprintf(", burst %d", *q.Burst)
	if q.Bucket != nil && *q.Bucket > *q.Burst {
		s += fmt.Sprintf(" (%d a loop at this rate)", *q.Bucket)
	}
	return s
}

// scaleDownLine is the scale-down pass: unneeded and removed nodes, the
// brake, what holds it and the nodes kept.
func scaleDownLine(sd *ScaleDownView) string {
	s := fmt.Sprintf("Scale-down: %d unneeded, %d being removed", sd.UnneededNodes, sd.Removing)
	if sd.BrakeEngaged {
		s += "; the safety brake is engaged"
		if sd.RecentDeletions != nil {
			s += fmt.Sprintf(" (%d deletions in its window)", *sd.RecentDeletions)
		}
	}
	return s + heldAndKept(sd)
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

// renderHealth lists the unhealthy nodes (rule, action, where each is)
// and the repair ladders in progress.
func renderHealth(w io.Writer, h *core.HealthStatus) error {
	if h == nil {
		return nil
	}
	if err := renderUnhealthy(w, h); err != nil {
		return err
	}
	return renderRepairs(w, h)
}

// renderRepairs lists the repair ladders: rule, step, where it is, since.
func renderRepairs(w io.Writer, h *core.HealthStatus) error {
	if len(h.Repairs) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "REPAIRING NODE\tGROUP\tRULE\tSTEP\tSTATE\tSINCE")
	for _, r := range h.Repairs {
		since := "-"
		if !r.Since.IsZero() {
			since = r.Since.Format(time.RFC3339)
		}
		fmt.Fprintln(tw, strings.Join([]string{r.Node, r.NodeGroup, r.Rule, r.Step, r.State, since}, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if h.RepairsMore > 0 {
		fmt.Fprintf(w, "(and %d more)\n", h.RepairsMore)
	}
	return nil
}

// renderUnhealthy lists the unhealthy nodes.
func renderUnhealthy(w io.Writer, h *core.HealthStatus) error {
	if len(h.Unhealthy) == 0 {
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

// provreqConditions are the ProvisioningRequest conditions the status
// counts, in the order of a request's life (core's provreqConditions).
var provreqConditions = []string{"Accepted", "Provisioned", "Failed", "BookingExpired", "CapacityRevoked"}

// renderProvisioningRequests lists the requests: a count per class and
// condition (a column per condition any class has), the booked requests
// with their pods and until when, the requests waiting for a retry and
// why.
func renderProvisioningRequests(w io.Writer, p *core.ProvisioningRequestsStatus, now time.Time) error {
	if p == nil {
		return nil
	}
	if err := renderProvreqCounts(w, p.Requests); err != nil {
		return err
	}
	if err := renderBooked(w, p.Booked, now); err != nil {
		return err
	}
	if err := renderWaiting(w, p.Waiting, now); err != nil {
		return err
	}
	if p.More > 0 {
		fmt.Fprintf(w, "(and %d more booked or waiting)\n", p.More)
	}
	if p.Skipped > 0 {
		fmt.Fprintf(w, "WARNING: %d %s not planned: over --max-provisioning-requests or --max-provisioning-requests-per-namespace\n", p.Skipped, plural(p.Skipped, "request", "requests"))
	}
	return nil
}

// renderProvreqCounts writes the requests' counts: a row per class, a
// column per condition any class has.
func renderProvreqCounts(w io.Writer, requests []core.ProvisioningRequestCount) error {
	if len(requests) == 0 {
		return nil
	}
	counts, classes, conds := provreqCounts(requests)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	header := []string{"PROVISIONING CLASS"}
	for _, c := range conds {
		header = append(header, columnName(c))
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, class := range classes {
		row := []string{class}
		for _, c := range conds {
			row = append(row, itoa(counts[class][c]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// provreqCounts sums the requests by class and condition, with the
// classes sorted and the conditions seen in the order of a request's life
// (then those this command does not know yet, sorted).
func provreqCounts(requests []core.ProvisioningRequestCount) (counts map[string]map[string]int, classes, conds []string) {
	counts = map[string]map[string]int{}
	seen := map[string]bool{}
	for _, c := range requests {
		if counts[c.Class] == nil {
			counts[c.Class] = map[string]int{}
			classes = append(classes, c.Class)
		}
		counts[c.Class][c.Condition] += c.Requests
		seen[c.Condition] = true
	}
	sort.Strings(classes)
	for _, c := range provreqConditions {
		if seen[c] {
			conds = append(conds, c)
			delete(seen, c)
		}
	}
	conds = append(conds, sortedKeys(seen)...) // a condition this command does not know yet
	return counts, classes, conds
}

// renderBooked lists the booked requests with their pods and until when.
func renderBooked(w io.Writer, booked []core.BookedRequest, now time.Time) error {
	if len(booked) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "BOOKED REQUEST\tCLASS\tPODS\tUNTIL")
	for _, b := range booked {
		fmt.Fprintln(tw, strings.Join([]string{b.Request, b.Class, itoa(b.Pods), timeText(b.Until, now, "%s left", "ended")}, "\t"))
	}
	return tw.Flush()
}

// renderWaiting lists the requests waiting for a retry: when, and why.
func renderWaiting(w io.Writer, waiting []core.WaitingRequest, now time.Time) error {
	if len(waiting) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "WAITING REQUEST\tCLASS\tRETRY\tMESSAGE")
	for _, r := range waiting {
		msg := r.Message
		if msg == "" {
			msg = "-"
		}
		fmt.Fprintln(tw, strings.Join([]string{r.Request, r.Class, timeText(r.RetryAt, now, "in %s", "due"), msg}, "\t"))
	}
	return tw.Flush()
}

// renderCapacityBuffers lists the buffers: each one's chunks and where
// they are (warm on ready nodes, coming, fitting nowhere and why), then
// how many were left out and how many of other strategies were left
// alone.
func renderCapacityBuffers(w io.Writer, b *core.CapacityBuffersStatus) error {
	if b == nil || len(b.Buffers)+b.More+b.OtherStrategies+b.Skipped == 0 {
		return nil
	}
	fmt.Fprintln(w)
	if len(b.Buffers) > 0 {
		tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
		fmt.Fprintln(tw, "BUFFER\tCHUNKS\tWARM\tCOMING\tUNPLACED\tMESSAGE")
		for _, e := range b.Buffers {
			msg := oneLine(e.Message)
			if msg == "" {
				msg = "-"
			}
			fmt.Fprintln(tw, strings.Join([]string{e.Buffer, itoa(e.Chunks), itoa(e.Warm), itoa(e.Coming), itoa(e.Unplaced), msg}, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if b.More > 0 {
		fmt.Fprintf(w, "(and %d more)\n", b.More)
	}
	if b.OtherStrategies > 0 {
		fmt.Fprintf(w, "%d %s of other strategies left alone\n", b.OtherStrategies, plural(b.OtherStrategies, "buffer", "buffers"))
	}
	if b.Skipped > 0 {
		fmt.Fprintf(w, "WARNING: %d %s not planned: over --max-capacity-buffers or --max-capacity-buffers-per-namespace\n", b.Skipped, plural(b.Skipped, "buffer", "buffers"))
	}
	return nil
}

// timeText is t as the table shows it, UTC (with the date when not
// today's), with how far ahead it is (ahead, a format of the duration) or
// past: "03:10:01Z (8m left)", "03:01:01Z (ended)".
func timeText(t, now time.Time, ahead, past string) string {
	at := t.UTC().Format("15:04:05Z")
	if t.UTC().Format(time.DateOnly) != now.UTC().Format(time.DateOnly) {
		at = t.UTC().Format(time.RFC3339)
	}
	if left := t.Sub(now); left > 0 {
		return at + " (" + fmt.Sprintf(ahead, shortDuration(left)) + ")"
	}
	return at + " (" + past + ")"
}

// columnName is a condition type as a column's name: BookingExpired is
// BOOKING EXPIRED.
func columnName(condition string) string {
	var b strings.Builder
	for i, r := range condition {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// printable writes what it is given with every rune that is not
// printable (but newlines and tabs) escaped as \u{XXXX}, and every byte
// that is not UTF-8 as \x{XX}: what reaches the terminal is text.
type printable struct{ w io.Writer }

func (p *printable) Write(b []byte) (int, error) {
	clean := true
	for _, r := range string(b) {
		if !shown(r) {
			clean = false
			break
		}
	}
	if clean {
		return p.w.Write(b)
	}
	var out strings.Builder
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&out, `\x{%02x}`, b[i])
		case shown(r):
			out.WriteRune(r)
		default:
			fmt.Fprintf(&out, `\u{%04x}`, r)
		}
		i += max(size, 1)
	}
	if _, err := io.WriteString(p.w, out.String()); err != nil {
		return 0, err
	}
	return len(b), nil
}

// shown says a rune goes to the terminal as it is.
func shown(r rune) bool {
	return r == '\n' || r == '\t' || (r != utf8.RuneError && unicode.IsPrint(r))
}

// byCount is counts by reason, most first: "8 max-size, 4 backoff". The
// reasons are the code's named reasons (and the table is escaped whole).
func byCount(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}

// podsLine is the summary's pods: unschedulable (those without a
// scale-up by reason), waiting for upcoming nodes.
func podsLine(v *View) string {
	if len(v.PodsWithoutScaleUp) == 0 {
		return fmt.Sprintf("Pods: %d unschedulable, %d waiting for upcoming nodes.", v.UnschedulablePods, v.PodsAwaitingNodes)
	}
	return fmt.Sprintf("Pods: %d unschedulable (without a scale-up: %s), %d waiting for upcoming nodes.",
		v.UnschedulablePods, byCount(v.PodsWithoutScaleUp), v.PodsAwaitingNodes)
}

// heldAndKept is what holds scale-down and the nodes it kept, by reason.
func heldAndKept(sd *ScaleDownView) string {
	s := ""
	if sd.HeldBecause != "" {
		s += "; held: " + sd.HeldBecause
	}
	if len(sd.Kept) > 0 {
		s += "; kept: " + byCount(sd.Kept)
	}
	return s
}
