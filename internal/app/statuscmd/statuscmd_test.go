package statuscmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

var now = time.Date(2026, 5, 4, 3, 2, 1, 0, time.UTC)

// The ProvisioningRequest classes (core/provreq).
const (
	checkClass  = "check-capacity.autoscaling.x-k8s.io"
	atomicClass = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
)

func intp(n int) *int { return &n }

// statusYAML renders st as the autoscaler writes it into the ConfigMap
// (core.renderStatus: sigs.k8s.io/yaml of core.Status).
func statusYAML(t *testing.T, st core.Status) string {
	t.Helper()
	b, err := yaml.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTableFromStatus: the ConfigMap's status, parsed as the command parses
// it, printed as the table; each case names the lines it must print.
func TestTableFromStatus(t *testing.T) {
	until := now.Add(4*time.Minute + 12*time.Second)
	scaleUp := core.Status{
		LastChange: now.Add(-12 * time.Second), Nodes: 14, ReadyNodes: 11, UnschedulablePods: 40, PodsAwaitingNodes: 24,
		NodeGroups: []core.GroupStatus{
			{Name: "gpu-h100", Min: 0, Max: 100, Target: intp(12), Ready: 9, Upcoming: 3, Preflight: 2, PreflightFailed: 1},
			{Name: "cpu", Min: 1, Max: 50, Target: intp(3), Ready: 2, Unready: 1, InError: 1,
				Backoff: &core.BackoffStatus{Until: until, Reason: "quota exceeded"}},
			{Name: "gpu-team-rl", Min: 0, Max: 20, SizeError: "scale set read throttled until 03:05:00"},
			{Name: "gpu-spg", Min: 0, Max: 100, Target: intp(100), Ready: 100, FailedRunning: 2,
				MaxWarning: "configured max 2500 is more than the node group can hold (100: single placement group); max is 100"},
		},
		NodeAddition: core.NodeAdditionStatus{Smoothing: true, RateNodesPerMinute: 120, RateReason: "healthy", Burst: 6, BucketNodes: 20, MaxInFlight: 300,
			InFlight: 5, HeldBy: "rate", Queued: []core.QueuedNodes{
				{NodeGroup: "gpu-h100", Class: "workload", Nodes: 6}, {NodeGroup: "gpu-h100", Class: "balloon", Nodes: 1},
				{NodeGroup: "cpu", Class: "workload", Nodes: 2}}},
		WarmPools: []core.WarmPoolStatus{{NodeGroup: "gpu-h100", Target: 2, WarmReady: 1, BalloonsPending: 1}},
		ScaleDown: core.ScaleDownInfo{UnneededNodes: 2, Removing: 1, BrakeEngaged: true, RecentDeletions: 7},
	}
	quiet := core.Status{
		LastChange: now.Add(-2 * time.Hour), Nodes: 3, ReadyNodes: 3,
		NodeGroups:   []core.GroupStatus{{Name: "cpu", Min: 3, Max: 10, Target: intp(3), Ready: 3}},
		NodeAddition: core.NodeAdditionStatus{Smoothing: false},
	}
	incident := core.Status{
		LastChange: now.Add(-time.Minute), Nodes: 40, ReadyNodes: 10,
		NodeGroups:         []core.GroupStatus{{Name: "gpu", Min: 0, Max: 100, Target: intp(40), Ready: 10}},
		NodeAddition:       core.NodeAdditionStatus{Smoothing: true, HeldGangs: []core.HeldGang{{Gang: "ml/train", Nodes: 400, HeldBy: "in-flight"}}},
		ClusterUnhealthy:   "30 of 40 managed nodes unready",
		ReplacementsHeld:   6,
		PreflightIncidents: map[string]int{"dns": 16},
		ConfigFallback:     "--node-addition-burst: must be at least 1, got -3: running on the last good configuration",
	}
	unhealthy := core.Status{
		LastChange: now.Add(-time.Minute), Nodes: 5, ReadyNodes: 5,
		NodeGroups: []core.GroupStatus{{Name: "gpu", Min: 0, Max: 100, Target: intp(5), Ready: 5, Degraded: []string{"gpu-4"}}},
		Health: &core.HealthStatus{Paused: true, PolicyError: `rules[0].action: "reboot": must be one of report, cordon, drain, replace`,
			Breakers: []string{"gpu"}, Incidents: []string{"xid-error"}, Cordoned: 2, CordonCeiling: 2, More: 3, Unhealthy: []core.HealthNode{
				{Node: "gpu-1", NodeGroup: "gpu", Rule: "xid-error", Action: "replace", State: "held: breaker"},
				{Node: "gpu-2", NodeGroup: "gpu", Rule: "xid-error", Action: "replace", State: "cordoned"}},
			Repairs: []core.HealthRepair{
				{Node: "gpu-3", NodeGroup: "gpu", Rule: "xid-error", Step: "2/3 reimage", State: "in the cloud", Since: now.Add(-5 * time.Minute).UTC()},
				{Node: "gpu-4", NodeGroup: "gpu", Rule: "xid-error", Step: "1/3 reboot", State: "due: pod ml/train-4 is terminating", Since: now.Add(-time.Minute).UTC()}},
			RepairsMore: 2},
	}
	provreqs := core.Status{
		LastChange: now.Add(-time.Minute), Nodes: 2, ReadyNodes: 2,
		NodeGroups:   []core.GroupStatus{{Name: "gpu", Min: 0, Max: 10, Target: intp(2), Ready: 2}},
		NodeAddition: core.NodeAdditionStatus{Smoothing: true},
		ProvisioningRequests: &core.ProvisioningRequestsStatus{
			// As core sorts them: by class, then condition; only counts above 0.
			Requests: []core.ProvisioningRequestCount{
				{Class: atomicClass, Condition: "Accepted", Requests: 3},
				{Class: atomicClass, Condition: "Provisioned", Requests: 1},
				{Class: checkClass, Condition: "Accepted", Requests: 4},
				{Class: checkClass, Condition: "BookingExpired", Requests: 1},
				{Class: checkClass, Condition: "Failed", Requests: 1},
				{Class: checkClass, Condition: "Provisioned", Requests: 2},
			},
			Booked: []core.BookedRequest{
				{Request: "ml/train", Class: atomicClass, Pods: 8, Until: now.Add(8 * time.Minute)},
				{Request: "ml/eval", Class: checkClass, Pods: 2, Until: now.Add(-5 * time.Second)},
			},
			Waiting: []core.WaitingRequest{
				{Request: "ml/big", Class: atomicClass, RetryAt: now.Add(4 * time.Minute),
					Message: "its 16 pods need new nodes and no node group can take them all: node group gpu can add 10 nodes, the gang needs 16"},
				{Request: "ml/check", Class: checkClass, RetryAt: now.Add(time.Minute + 30*time.Second)},
			},
			More: 2,
		},
	}
	buffers := core.Status{
		LastChange: now.Add(-time.Minute), Nodes: 2, ReadyNodes: 2,
		NodeGroups:   []core.GroupStatus{{Name: "gpu", Min: 0, Max: 10, Target: intp(2), Ready: 2}},
		NodeAddition: core.NodeAdditionStatus{Smoothing: true},
		ProvisioningRequests: &core.ProvisioningRequestsStatus{
			Requests: []core.ProvisioningRequestCount{{Class: checkClass, Condition: "Provisioned", Requests: 1}}},
		CapacityBuffers: &core.CapacityBuffersStatus{
			Buffers: []core.CapacityBufferStatus{
				{Buffer: "ml/warm", Chunks: 4, Warm: 3, Coming: 1},
				{Buffer: "ml/big", Chunks: 5, Warm: 1, Coming: 2, Unplaced: 2,
					Message: "node group gpu: max size reached\n(10 nodes)."},
				{Buffer: "web/broken", Message: "not ready: scalableRef apps/v1 Deployment web/gone not found"},
			},
			More: 17, OtherStrategies: 2,
		},
	}
	otherBuffers := core.Status{
		LastChange: now.Add(-time.Minute), Nodes: 2, ReadyNodes: 2,
		NodeGroups:      []core.GroupStatus{{Name: "gpu", Min: 0, Max: 10, Target: intp(2), Ready: 2}},
		NodeAddition:    core.NodeAdditionStatus{Smoothing: true},
		CapacityBuffers: &core.CapacityBuffersStatus{OtherStrategies: 1},
	}
	tests := []struct {
		name string
		st   core.Status
		rows [][]string // the table's header and rows, by cell
		want []string   // lines under the table
	}{
		{"CapacityBuffers after the requests", buffers, [][]string{
			{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"},
			{"gpu", "0", "2", "10", "2", "0", "0", "0", "-", "-", "-"},
			{""},
			{"PROVISIONING CLASS", "PROVISIONED"},
			{checkClass, "1"},
			{""},
			{"BUFFER", "CHUNKS", "WARM", "COMING", "UNPLACED", "MESSAGE"},
			{"ml/warm", "4", "3", "1", "0", "-"},
			{"ml/big", "5", "1", "2", "2", "node group gpu: max size reached (10 nodes)"},
			{"web/broken", "0", "0", "0", "0", "not ready: scalableRef apps/v1 Deployment web/gone not found"},
			{"(and 17 more)"},
			{"2 buffers of other strategies left alone"},
			{""},
		}, []string{
			"WARNING: CapacityBuffer ml/big: 2 of 5 chunks fit nowhere: node group gpu: max size reached (10 nodes).\n",
		}},
		{"CapacityBuffers of other strategies only", otherBuffers, [][]string{
			{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"},
			{"gpu", "0", "2", "10", "2", "0", "0", "0", "-", "-", "-"},
			{""},
			{"1 buffer of other strategies left alone"},
			{""},
			{"From configmap kube-system/vmss-autoscaler-status, changed 1m ago (2026-05-04T03:01:01Z)."},
		}, nil},
		{"ProvisioningRequests booked and waiting", provreqs, [][]string{
			{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"},
			{"gpu", "0", "2", "10", "2", "0", "0", "0", "-", "-", "-"},
			{""},
			{"PROVISIONING CLASS", "ACCEPTED", "PROVISIONED", "FAILED", "BOOKING EXPIRED"},
			{atomicClass, "3", "1", "0", "0"},
			{checkClass, "4", "2", "1", "1"},
			{""},
			{"BOOKED REQUEST", "CLASS", "PODS", "UNTIL"},
			{"ml/train", atomicClass, "8", "03:10:01Z (8m left)"},
			{"ml/eval", checkClass, "2", "03:01:56Z (ended)"},
			{""},
			{"WAITING REQUEST", "CLASS", "RETRY", "MESSAGE"},
			{"ml/big", atomicClass, "03:06:01Z (in 4m)",
				"its 16 pods need new nodes and no node group can take them all: node group gpu can add 10 nodes, the gang needs 16"},
			{"ml/check", checkClass, "03:03:31Z (in 1m30s)", "-"},
			{"(and 2 more booked or waiting)"},
		}, []string{
			"WARNING: 2 or more ProvisioningRequests not provisioned, next retry at 2026-05-04T03:03:31Z.",
		}},
		{"scale-up under way", scaleUp, [][]string{
			{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"},
			{"cpu", "1", "3", "50", "2", "0", "0", "1", "-", "2", "quota exceeded (4m12s left)"},
			{"gpu-h100", "0", "12", "100", "9", "3", "2", "1", "1/2", "7 (1 balloon, 6 workload)", "-"},
			{"gpu-spg", "0", "100", "100", "100", "0", "0", "0", "-", "-", "-"},
			{"gpu-team-rl", "0", "?", "20", "0", "0", "0", "0", "-", "-", "-"},
		}, []string{
			"gpu-team-rl: size unknown: scale set read throttled until 03:05:00",
			"WARNING: gpu-spg: configured max 2500 is more than the node group can hold (100: single placement group); max is 100",
			"WARNING: gpu-spg: 2 VMs Failed in Azure but running: kept with their pods (FailedVMRunning events)",
			"From configmap kube-system/vmss-autoscaler-status, changed 12s ago (2026-05-04T03:01:49Z).",
			"Pods: 40 unschedulable, 24 waiting for upcoming nodes. Nodes: 14, 11 ready.",
			"Node-addition queue: 9 nodes queued, held by the rate; rate 120 nodes/min (healthy), burst 6 (20 a loop at this rate); 5 in flight (at most 300).",
			"Scale-down: 2 unneeded, 1 being removed; the safety brake is engaged (7 deletions in its window).",
		}},
		{"an incident", incident, [][]string{
			{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"},
			{"gpu", "0", "40", "100", "10", "0", "0", "0", "-", "-", "-"},
		}, []string{
			"WARNING: cluster unhealthy, nothing deleted, cordoned or drained: 30 of 40 managed nodes unready.",
			"WARNING: replacement brake: 6 deletions held (failed preflight, machines in error or never registered).",
			`WARNING: preflight incident: check "dns" fails on 16 nodes at once; they are kept, not replaced.`,
			"WARNING: running on a fallback configuration: --node-addition-burst: must be at least 1, got -3: running on the last good configuration.",
			"WARNING: gang ml/train waits whole for its 400 nodes, held by in-flight.",
		}},
		{"unhealthy nodes", unhealthy, [][]string{
			{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"},
			{"gpu", "0", "5", "100", "5", "0", "0", "0", "-", "-", "-"},
			{""},
			{"UNHEALTHY NODE", "GROUP", "RULE", "ACTION", "STATE"},
			{"gpu-1", "gpu", "xid-error", "replace", "held: breaker"},
			{"gpu-2", "gpu", "xid-error", "replace", "cordoned"},
			{"(and 3 more)"},
			{""},
			{"REPAIRING NODE", "GROUP", "RULE", "STEP", "STATE", "SINCE"},
			{"gpu-3", "gpu", "xid-error", "2/3 reimage", "in the cloud", now.Add(-5 * time.Minute).UTC().Format(time.RFC3339)},
			{"gpu-4", "gpu", "xid-error", "1/3 reboot", "due: pod ml/train-4 is terminating", now.Add(-time.Minute).UTC().Format(time.RFC3339)},
			{"(and 2 more)"},
		}, []string{
			`WARNING: health policy: rules[0].action: "reboot": must be one of report, cordon, drain, replace.`,
			"WARNING: health actions paused (annotation vmss-autoscaler.io/health-paused): unhealthy nodes are reported only.",
			"WARNING: health breaker engaged for node group gpu: no new cordon, drain or replacement there (scale-up goes on).",
			`WARNING: health incident: many nodes began matching rule "xid-error" at once; its matches are reported only.`,
			"WARNING: health cordons at the cluster-wide ceiling (2 of 2, --health-max-cordoned-share): further matches are reported only.",
			"WARNING: node group gpu: 1 degraded nodes (advertising less than the VM size; never the template): gpu-4.",
		}},
		{"quiet, no smoothing", quiet, [][]string{
			{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"},
			{"cpu", "3", "3", "10", "3", "0", "0", "0", "-", "-", "-"},
		}, []string{
			"changed 2h0m ago",
			"Node-addition queue: smoothing off (every planned node is requested at once).",
			"Scale-down: 0 unneeded, 0 being removed.",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := ParseStatus(statusYAML(t, tc.st))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := Render(&out, FromStatus("configmap kube-system/vmss-autoscaler-status", st), OutputTable, now); err != nil {
				t.Fatal(err)
			}
			if got := tableCells(out.String(), len(tc.rows)); !reflect.DeepEqual(got, tc.rows) {
				t.Errorf("table cells\n%q\nwant\n%q\n%s", got, tc.rows, out.String())
			}
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// cellSep separates a table's columns: tabwriter pads them with at least 3
// spaces, and no cell has two spaces in a row.
var cellSep = regexp.MustCompile(`\s{2,}`)

// tableCells splits the first n lines of out into cells.
func tableCells(out string, n int) [][]string {
	var rows [][]string
	for _, line := range strings.SplitN(out, "\n", n+1)[:n] {
		rows = append(rows, cellSep.Split(strings.TrimSpace(line), -1))
	}
	return rows
}

// TestJSONAndYAML: -o json and -o yaml print the same view, which parses
// back, with the derived numbers (queued per group, failed).
func TestJSONAndYAML(t *testing.T) {
	st := &core.Status{LastChange: now,
		NodeGroups: []core.GroupStatus{{Name: "a", Min: 1, Max: 5, Target: intp(4), Ready: 2, Upcoming: 2, PreflightFailed: 1, InError: 2}},
		NodeAddition: core.NodeAdditionStatus{Smoothing: true, HeldBy: "in-flight",
			Queued: []core.QueuedNodes{{NodeGroup: "a", Class: "workload", Nodes: 3}}},
		ProvisioningRequests: &core.ProvisioningRequestsStatus{
			Requests: []core.ProvisioningRequestCount{{Class: checkClass, Condition: "Accepted", Requests: 2}},
			Booked:   []core.BookedRequest{{Request: "ml/train", Class: atomicClass, Pods: 8, Until: now.Add(10 * time.Minute)}},
			Waiting:  []core.WaitingRequest{{Request: "ml/check", Class: checkClass, RetryAt: now.Add(time.Minute), Message: "1 of 2 pods fit"}},
			More:     4,
		},
		CapacityBuffers: &core.CapacityBuffersStatus{
			Buffers: []core.CapacityBufferStatus{
				{Buffer: "ml/warm", Chunks: 2, Warm: 2},
				{Buffer: "ml/big", Chunks: 5, Warm: 1, Coming: 2, Unplaced: 2, Message: "no node group can take them"},
			},
			More: 1, OtherStrategies: 3,
		}}
	v := FromStatus("configmap ns/name", st)
	var js, ys bytes.Buffer
	if err := Render(&js, v, OutputJSON, now); err != nil {
		t.Fatal(err)
	}
	if err := Render(&ys, v, OutputYAML, now); err != nil {
		t.Fatal(err)
	}
	var fromJSON, fromYAML View
	if err := json.Unmarshal(js.Bytes(), &fromJSON); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if err := yaml.UnmarshalStrict(ys.Bytes(), &fromYAML); err != nil {
		t.Fatalf("%v\n%s", err, ys.String())
	}
	for _, got := range []View{fromJSON, fromYAML} {
		g := got.NodeGroups[0]
		if g.Name != "a" || *g.Target != 4 || g.Queued != 3 || g.QueuedByClass["workload"] != 3 || g.Failed() != 3 ||
			got.Queue.HeldBy != "in-flight" || got.Queue.Queued != 3 || got.Source != "configmap ns/name" {
			t.Errorf("view = %+v", got)
		}
		if !reflect.DeepEqual(got.ProvisioningRequests, st.ProvisioningRequests) {
			t.Errorf("provisioningRequests = %+v, want %+v", got.ProvisioningRequests, st.ProvisioningRequests)
		}
		if !reflect.DeepEqual(got.CapacityBuffers, st.CapacityBuffers) {
			t.Errorf("capacityBuffers = %+v, want %+v", got.CapacityBuffers, st.CapacityBuffers)
		}
		if want := []string{"1 or more ProvisioningRequests not provisioned, next retry at 2026-05-04T03:03:01Z",
			"CapacityBuffer ml/big: 2 of 5 chunks fit nowhere: no node group can take them"}; !reflect.DeepEqual(got.Warnings, want) {
			t.Errorf("warnings = %q, want %q", got.Warnings, want)
		}
	}
	if err := Render(&js, v, "xml", now); err == nil || !strings.Contains(err.Error(), `-o="xml"`) {
		t.Errorf("err = %v", err)
	}
}

// TestProvisioningRequestsWarning: a warning when requests wait for a
// retry, naming the earliest; none when nothing waits.
func TestProvisioningRequestsWarning(t *testing.T) {
	waiting := func(retries ...time.Duration) []core.WaitingRequest {
		var out []core.WaitingRequest
		for i, d := range retries {
			out = append(out, core.WaitingRequest{Request: fmt.Sprintf("ml/r%d", i), Class: checkClass, RetryAt: now.Add(d)})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		p    *core.ProvisioningRequestsStatus
		want []string
	}{
		{"off", nil, nil},
		{"counts only", &core.ProvisioningRequestsStatus{
			Requests: []core.ProvisioningRequestCount{{Class: checkClass, Condition: "Provisioned", Requests: 3}}}, nil},
		{"booked, some left out", &core.ProvisioningRequestsStatus{
			Booked: []core.BookedRequest{{Request: "ml/a", Class: atomicClass, Pods: 1, Until: now}}, More: 5}, nil},
		{"one waiting", &core.ProvisioningRequestsStatus{Waiting: waiting(2 * time.Minute)},
			[]string{"1 ProvisioningRequest not provisioned, next retry at 2026-05-04T03:04:01Z"}},
		{"several, the earliest last and due", &core.ProvisioningRequestsStatus{Waiting: waiting(5*time.Minute, time.Minute, -10*time.Second)},
			[]string{"3 ProvisioningRequests not provisioned, next retry at 2026-05-04T03:01:51Z"}},
		{"some left out", &core.ProvisioningRequestsStatus{Waiting: waiting(time.Hour), More: 1},
			[]string{"1 or more ProvisioningRequests not provisioned, next retry at 2026-05-04T04:02:01Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &core.Status{NodeGroups: []core.GroupStatus{{Name: "a", Max: 1}}, ProvisioningRequests: tc.p}
			if got := FromStatus("configmap ns/name", st).Warnings; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("warnings = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCapacityBuffersWarning: a warning per buffer with chunks that fit
// nowhere, at most maxBufferWarnings of them, then how many more; none
// when every chunk has a place.
func TestCapacityBuffersWarning(t *testing.T) {
	unplaced := func(names ...string) []core.CapacityBufferStatus {
		var out []core.CapacityBufferStatus
		for i, n := range names {
			out = append(out, core.CapacityBufferStatus{Buffer: n, Chunks: 5, Warm: 4 - i, Unplaced: i + 1, Message: "no node group can take them"})
		}
		return out
	}
	placed := core.CapacityBufferStatus{Buffer: "ml/ok", Chunks: 3, Warm: 2, Coming: 1}
	notReady := core.CapacityBufferStatus{Buffer: "ml/nr", Message: "not ready: podTemplateRef ml/t not found"}
	for _, tc := range []struct {
		name string
		b    *core.CapacityBuffersStatus
		want []string
	}{
		{"off", nil, nil},
		{"all placed, not ready, others left alone", &core.CapacityBuffersStatus{
			Buffers: []core.CapacityBufferStatus{placed, notReady}, More: 4, OtherStrategies: 2}, nil},
		{"one", &core.CapacityBuffersStatus{Buffers: append([]core.CapacityBufferStatus{placed}, unplaced("ml/a")...)},
			[]string{"CapacityBuffer ml/a: 1 of 5 chunks fit nowhere: no node group can take them"}},
		{"no message, one line", &core.CapacityBuffersStatus{Buffers: []core.CapacityBufferStatus{
			{Buffer: "ml/a", Chunks: 2, Unplaced: 2},
			{Buffer: "ml/b", Chunks: 3, Unplaced: 1, Message: "node group gpu:\n  quota exceeded."}}},
			[]string{"CapacityBuffer ml/a: 2 of 2 chunks fit nowhere", "CapacityBuffer ml/b: 1 of 3 chunks fit nowhere: node group gpu: quota exceeded"}},
		{"three, no more", &core.CapacityBuffersStatus{Buffers: unplaced("ml/a", "ml/b", "ml/c")}, []string{
			"CapacityBuffer ml/a: 1 of 5 chunks fit nowhere: no node group can take them",
			"CapacityBuffer ml/b: 2 of 5 chunks fit nowhere: no node group can take them",
			"CapacityBuffer ml/c: 3 of 5 chunks fit nowhere: no node group can take them"}},
		{"five, two more", &core.CapacityBuffersStatus{Buffers: append(unplaced("ml/a", "ml/b", "ml/c", "ml/d"), placed, unplaced("ml/e")[0])}, []string{
			"CapacityBuffer ml/a: 1 of 5 chunks fit nowhere: no node group can take them",
			"CapacityBuffer ml/b: 2 of 5 chunks fit nowhere: no node group can take them",
			"CapacityBuffer ml/c: 3 of 5 chunks fit nowhere: no node group can take them",
			"and 2 more CapacityBuffers with chunks that fit nowhere"}},
		{"four, some left out of the status", &core.CapacityBuffersStatus{Buffers: unplaced("ml/a", "ml/b", "ml/c", "ml/d"), More: 20}, []string{
			"CapacityBuffer ml/a: 1 of 5 chunks fit nowhere: no node group can take them",
			"CapacityBuffer ml/b: 2 of 5 chunks fit nowhere: no node group can take them",
			"CapacityBuffer ml/c: 3 of 5 chunks fit nowhere: no node group can take them",
			"and at least 1 more CapacityBuffer with chunks that fit nowhere"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &core.Status{NodeGroups: []core.GroupStatus{{Name: "a", Max: 1}}, CapacityBuffers: tc.b}
			if got := FromStatus("configmap ns/name", st).Warnings; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("warnings = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestTimeText: booking ends and retries as the table shows them.
func TestTimeText(t *testing.T) {
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{now.Add(8*time.Minute + 10*time.Second), "03:10:11Z (8m10s left)"},
		{now, "03:02:01Z (ended)"},
		{now.Add(-time.Hour), "02:02:01Z (ended)"},
		{now.Add(-4 * time.Hour), "2026-05-03T23:02:01Z (ended)"},
		{now.Add(25 * time.Hour), "2026-05-05T04:02:01Z (25h0m left)"},
	} {
		if got := timeText(tc.at, now, "%s left", "ended"); got != tc.want {
			t.Errorf("timeText(%s) = %q, want %q", tc.at, got, tc.want)
		}
	}
}

// metricsServer serves a real core.NewMetrics registry, set as a leader in
// the middle of a scale-up would set it, on 127.0.0.1.
func metricsServer(t *testing.T) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := core.NewMetrics(reg)
	for g, sizes := range map[string][3]float64{"gpu-h100": {0, 12, 100}, "cpu": {1, 3, 50}} {
		m.MinSize.WithLabelValues(g).Set(sizes[0])
		m.TargetSize.WithLabelValues(g).Set(sizes[1])
		m.MaxSize.WithLabelValues(g).Set(sizes[2])
	}
	for state, n := range map[string]float64{"ready": 9, "upcoming": 3, "preflight": 2, "preflight_failed": 1, "unready": 0} {
		m.Nodes.WithLabelValues("gpu-h100", state).Set(n)
	}
	m.Nodes.WithLabelValues("cpu", "ready").Set(3)
	m.Nodes.WithLabelValues("cpu", "in_error").Set(1)
	m.Backoff.WithLabelValues("cpu").Set(1)
	m.Backoff.WithLabelValues("gpu-h100").Set(0)
	m.WarmTarget.WithLabelValues("gpu-h100").Set(2)
	m.WarmReady.WithLabelValues("gpu-h100").Set(1)
	m.WarmTarget.WithLabelValues("cpu").Set(0)
	m.QueueDepth.WithLabelValues("gpu-h100", "workload").Set(6)
	m.QueueDepth.WithLabelValues("gpu-h100", "balloon").Set(1)
	m.QueueDepth.WithLabelValues("cpu", "workload").Set(0)
	m.AdditionRate.Set(120)
	m.AdditionRateReason.WithLabelValues("healthy").Set(1)
	m.AdditionRateReason.WithLabelValues("client-429").Set(0)
	m.AdditionTokens.Set(0.5)
	m.NodesInFlight.Set(5)
	m.UnschedulablePods.Set(40)
	m.PodsAwaitingNodes.Set(24)
	m.UnneededNodes.Set(2)
	m.LastSuccessfulLoop.Set(float64(now.Add(-3 * time.Second).Unix()))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// TestMainFromMetrics runs the command against a real registry's /metrics
// over HTTP.
func TestMainFromMetrics(t *testing.T) {
	u := metricsServer(t)
	var out bytes.Buffer
	if err := Main(context.Background(), []string{"--metrics-url=" + u, "-o", "json"}, &out); err != nil {
		t.Fatal(err)
	}
	var v View
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(v.NodeGroups) != 2 {
		t.Fatalf("groups %+v", v.NodeGroups)
	}
	cpu, gpu := v.NodeGroups[0], v.NodeGroups[1]
	if gpu.Name != "gpu-h100" || gpu.Min != 0 || *gpu.Target != 12 || gpu.Max != 100 || gpu.Ready != 9 || gpu.Upcoming != 3 ||
		gpu.Preflight != 2 || gpu.PreflightFailed != 1 || gpu.Warm == nil || gpu.Warm.Ready != 1 || gpu.Warm.Target != 2 ||
		gpu.Queued != 7 || gpu.Backoff != nil {
		t.Errorf("gpu-h100 = %+v", gpu)
	}
	if cpu.Name != "cpu" || cpu.Min != 1 || *cpu.Target != 3 || cpu.InError != 1 || cpu.Backoff == nil || cpu.Warm != nil || cpu.Queued != 0 {
		t.Errorf("cpu = %+v (a zero warm target is no warm pool; a zero queue depth is nothing queued)", cpu)
	}
	q := v.Queue
	if q.RateNodesPerMinute != 120 || q.RateReason != "healthy" || q.InFlight != 5 || q.Queued != 7 || q.Tokens == nil || *q.Tokens != 0.5 || q.HeldBy != "" {
		t.Errorf("queue = %+v", q)
	}
	if v.UnschedulablePods != 40 || v.PodsAwaitingNodes != 24 || v.ScaleDown.UnneededNodes != 2 || v.AsOf == nil || !v.AsOf.Equal(now.Add(-3*time.Second)) {
		t.Errorf("view = %+v", v)
	}

	out.Reset()
	if err := Main(context.Background(), []string{"--metrics-url=" + u}, &out); err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"NODE GROUP", "MIN", "TARGET", "MAX", "READY", "UPCOMING", "PREFLIGHT", "FAILED", "WARM", "QUEUED", "BACKOFF"},
		{"cpu", "1", "3", "50", "3", "0", "0", "1", "-", "-", "yes"},
		{"gpu-h100", "0", "12", "100", "9", "3", "2", "1", "1/2", "7 (1 balloon, 6 workload)", "-"},
	}
	if got := tableCells(out.String(), 3); !reflect.DeepEqual(got, want) {
		t.Errorf("table cells\n%q\nwant\n%q", got, want)
	}
	for _, want := range []string{
		"7 nodes queued (what holds them is in the status ConfigMap, not /metrics); rate 120 nodes/min (healthy), 0.5 tokens; 5 in flight.",
		"last successful loop",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestMainFromMetricsErrors(t *testing.T) {
	notOurs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# TYPE up gauge\nup 1\n"))
	}))
	defer notOurs.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "nope", http.StatusServiceUnavailable)
	}))
	defer broken.Close()
	for _, tc := range []struct{ url, want string }{
		{notOurs.URL, "not vmss-autoscaler's /metrics"},
		{broken.URL, "HTTP 503 Service Unavailable: nope"},
	} {
		err := Main(context.Background(), []string{"--metrics-url=" + tc.url}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.url) {
			t.Errorf("err = %v, want one naming %s and containing %q", err, tc.url, tc.want)
		}
	}
}

func TestParseOptions(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.namespace != "kube-system" || o.name != "vmss-autoscaler-status" || o.output != "table" {
		t.Errorf("defaults %+v, want the autoscaler's namespace and status ConfigMap", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "wide"}, `-o="wide": want table, json or yaml`},
		{[]string{"--metrics-url=localhost:8085"}, `--metrics-url="localhost:8085": want an http(s) URL`},
		{[]string{"--metrics-url=http://x/metrics", "--namespace=a"}, "--namespace: not with --metrics-url"},
		{[]string{"--request-timeout=0s"}, "--request-timeout=0s: must be positive"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"--nmespace=a"}, "unknown flag: --nmespace"},
	} {
		if _, err := parseOptions(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseOptions(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 45 * time.Second: "45s", 4*time.Minute + 10*time.Second: "4m10s",
		4 * time.Minute: "4m", 2*time.Hour + 5*time.Minute + 20*time.Second: "2h5m",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%s) = %q, want %q", d, got, want)
		}
	}
}

// TestTableEscapesWhatTenantsWrote (#40): a buffer message with an
// escape sequence (an OSC 52 clipboard write, a cursor move), a C1
// control and a byte that is not UTF-8 reaches the table escaped; the
// table's own newlines and tabs are kept.
func TestTableEscapesWhatTenantsWrote(t *testing.T) {
	st := &core.Status{LastChange: now, CapacityBuffers: &core.CapacityBuffersStatus{Buffers: []core.CapacityBufferStatus{{
		Buffer: "ml/b", Message: "not ready: \x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b[2A\u009b\xff done"}}}}
	var out bytes.Buffer
	if err := Render(&out, FromStatus("configmap kube-system/vmss-autoscaler-status", st), OutputTable, now); err != nil {
		t.Fatal(err)
	}
	for _, r := range out.String() {
		if r != '\n' && r != '\t' && !unicode.IsPrint(r) {
			t.Fatalf("the table carries %U:\n%q", r, out.String())
		}
	}
	if !strings.Contains(out.String(), `\u{001b}]52;c;Y3VybCBldmlsfHNo\u{0007}\u{001b}[2A\u{009b}\x{ff} done`) {
		t.Fatalf("the message is not shown escaped:\n%s", out.String())
	}
}

// TestWhyNoScaleUpAndWhyKept (#43): the named reasons of the status — the
// pods no group was asked for and the nodes scale-down kept, by reason —
// are printed most first, and absent when there are none.
func TestWhyNoScaleUpAndWhyKept(t *testing.T) {
	st := &core.Status{NodeGroups: []core.GroupStatus{{Name: "a", Max: 1}}, UnschedulablePods: 12,
		PodsWithoutScaleUp: map[string]int{"backoff": 4, "max-size": 8},
		ScaleDown:          core.ScaleDownInfo{UnneededNodes: 1, Kept: map[string]int{"pdb": 2, "utilization-high": 5}}}
	var b strings.Builder
	if err := Render(&b, FromStatus("configmap ns/name", st), "table", now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Pods: 12 unschedulable (without a scale-up: 8 max-size, 4 backoff)", "kept: 5 utilization-high, 2 pdb"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table without %q:\n%s", want, b.String())
		}
	}
	st.PodsWithoutScaleUp, st.ScaleDown.Kept = nil, nil
	b.Reset()
	if err := Render(&b, FromStatus("configmap ns/name", st), "table", now); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "without a scale-up") || strings.Contains(b.String(), "kept:") {
		t.Errorf("reasons printed with none:\n%s", b.String())
	}
}
