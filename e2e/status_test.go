package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/app/statuscmd"
)

// `vmss-autoscaler status`, run as an operator runs it, during a scale-up
// held back by the node-addition rate: what it prints (the table, -o json,
// and from /metrics) matches the cluster at the same moment: the target is
// the scale set's capacity in ARM, ready is the group's nodes that are
// ready as docs/concepts/azure.md defines it ("Not ready yet": Ready, and no startup
// taint), nodes are queued and held by the rate. At the end it shows the
// group settled. The nodes carry Azure CNI powered by Cilium's startup
// taint for 20 s, longer than the 10 s between two releases, as on AKS:
// the API's Ready condition alone would never agree with the product.
func TestStatusCommandDuringScaleUp(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	hook := realisticHook(sc.s.cp)
	hook.Realism.StartupTaints = []apiv1.Taint{{Key: "node.cilium.io/agent-not-ready", Value: "true", Effect: apiv1.TaintEffectNoSchedule}}
	hook.Realism.StartupTaintDelay = 20 * time.Second
	sc.s.hook.use(cpu, hook)
	t.Cleanup(func() { sc.s.hook.use(cpu, sc.s.hook.inner) })
	as := sc.autoscaler("autoscaler", "--nodes=1:20:"+cpu,
		"--node-addition-rate=6", "--node-addition-burst=1", "--node-addition-adaptive=false")
	// One 9-CPU pod per 16-vCPU node: 6 nodes, released one per 10 s.
	sc.workload("web", 6, "9", 0, cpu)

	fromConfigMap := []string{"--kubeconfig=" + sc.s.cp.Kubeconfig, "--namespace=" + sc.ns}
	fromMetrics := []string{"--metrics-url=http://" + sc.addr(as) + "/metrics"}

	// During the scale-up: nodes queued, held by the rate, and the
	// command's numbers are the cluster's.
	sc.eventually("status to show the scale-up as the cluster has it", 2*time.Minute, func() (bool, string) {
		capacity, ready := sc.capacity(cpu), sc.readyNodes(cpu)
		v, err := sc.statusView(fromConfigMap...)
		if err != nil {
			return false, err.Error()
		}
		g, ok := group(v, cpu)
		switch {
		case !ok:
			return false, fmt.Sprintf("no group %s in %+v", cpu, v.NodeGroups)
		case g.Target == nil || *g.Target != capacity || g.Ready != ready || capacity == 6:
			return false, fmt.Sprintf("status target %v ready %d; cluster capacity %d ready %d", g.Target, g.Ready, capacity, ready)
		case g.Queued == 0 || v.Queue.HeldBy != "rate" || g.Min != 1 || g.Max != 20:
			return false, fmt.Sprintf("group %+v, queue %+v: want nodes queued and held by the rate, min 1 max 20", g, v.Queue)
		}
		// The table shows the same, in its cells.
		out, err := sc.status(fromConfigMap...)
		if err != nil {
			return false, err.Error()
		}
		row, ok := tableRow(out, cpu)
		if !ok || row["TARGET"] != strconv.Itoa(capacity) || row["READY"] != strconv.Itoa(ready) || row["MIN"] != "1" || row["MAX"] != "20" ||
			row["QUEUED"] == "-" || !strings.Contains(out, "held by the rate") {
			return false, fmt.Sprintf("table row %v (cluster capacity %d ready %d):\n%s", row, capacity, ready, out)
		}
		return true, ""
	})
	// The replica's /metrics tell the same target and ready nodes.
	sc.eventually("status --metrics-url to match the cluster", time.Minute, func() (bool, string) {
		capacity, ready := sc.capacity(cpu), sc.readyNodes(cpu)
		v, err := sc.statusView(fromMetrics...)
		if err != nil {
			return false, err.Error()
		}
		g, ok := group(v, cpu)
		if !ok || g.Target == nil || *g.Target != capacity || g.Ready != ready || g.Min != 1 || g.Max != 20 {
			return false, fmt.Sprintf("status %+v; cluster capacity %d ready %d", g, capacity, ready)
		}
		return true, ""
	})

	// Settled: everything ready, nothing upcoming or queued.
	sc.eventually("6 pods Running", 3*time.Minute, allRunning(sc, 6))
	sc.eventually("status to show the group settled", time.Minute, func() (bool, string) {
		v, err := sc.statusView(fromConfigMap...)
		if err != nil {
			return false, err.Error()
		}
		g, _ := group(v, cpu)
		if g.Target == nil || *g.Target != 6 || g.Ready != 6 || sc.readyNodes(cpu) != 6 || g.Upcoming != 0 || g.Queued != 0 || v.Queue.Queued != 0 {
			return false, fmt.Sprintf("group %+v queue %+v", g, v.Queue)
		}
		return true, ""
	})
	out, err := sc.status(append(fromConfigMap, "-o", "yaml")...)
	if err != nil || !strings.Contains(out, "name: "+cpu) || !strings.Contains(out, "source: configmap "+sc.ns+"/vmss-autoscaler-status") {
		t.Errorf("status -o yaml: %v\n%s", err, out)
	}
}

// status runs the binary's status subcommand and returns its stdout.
func (sc *scenario) status(args ...string) (string, error) {
	cmd := exec.CommandContext(sc.ctx, sc.s.autoscaler, append([]string{"status"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("vmss-autoscaler status %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// statusView runs status -o json.
func (sc *scenario) statusView(args ...string) (*statuscmd.View, error) {
	out, err := sc.status(append(args, "-o", "json")...)
	if err != nil {
		return nil, err
	}
	var v statuscmd.View
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return nil, fmt.Errorf("status -o json: %w\n%s", err, out)
	}
	return &v, nil
}

func group(v *statuscmd.View, name string) (statuscmd.GroupView, bool) {
	for _, g := range v.NodeGroups {
		if g.Name == name {
			return g, true
		}
	}
	return statuscmd.GroupView{}, false
}

// notReadyTaints are the taints that keep a Ready node from being ready
// capacity as docs/concepts/azure.md defines it ("Not ready yet"): the node lifecycle
// controller's and the cloud provider's, and the default --startup-taint
// keys.
var notReadyTaints = map[string]bool{
	apiv1.TaintNodeNotReady: true, apiv1.TaintNodeUnreachable: true,
	"node.cloudprovider.kubernetes.io/uninitialized": true,
	"node.cilium.io/agent-not-ready":                 true, "node.kubernetes.io/network-unavailable": true,
}

// readyNodes counts the scale set's nodes that are ready as docs/concepts/azure.md
// defines it: Ready condition True and no taint that says it is still
// setting up (a startup taint, CA's startup-taint prefix, not-ready).
func (sc *scenario) readyNodes(set string) int {
	nodes, err := sc.s.cp.Client.CoreV1().Nodes().List(sc.ctx, metav1.ListOptions{LabelSelector: armsim.NodeGroupLabel + "=" + set})
	if err != nil {
		sc.t.Fatal(err)
	}
	n := 0
nodes:
	for _, node := range nodes.Items {
		for _, t := range node.Spec.Taints {
			if notReadyTaints[t.Key] || strings.HasPrefix(t.Key, "startup-taint.cluster-autoscaler.kubernetes.io/") {
				continue nodes
			}
		}
		for _, c := range node.Status.Conditions {
			if c.Type == apiv1.NodeReady && c.Status == apiv1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

var tableSep = regexp.MustCompile(`\s{2,}`)

// tableRow reads the row of a group from the status table, by column.
func tableRow(out, name string) (map[string]string, bool) {
	lines := strings.Split(out, "\n")
	if len(lines) == 0 {
		return nil, false
	}
	header := tableSep.Split(strings.TrimSpace(lines[0]), -1)
	for _, l := range lines[1:] {
		cells := tableSep.Split(strings.TrimSpace(l), -1)
		if len(cells) == len(header) && cells[0] == name {
			row := map[string]string{}
			for i, h := range header {
				row[h] = cells[i]
			}
			return row, true
		}
	}
	return nil, false
}
