package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// A real Prometheus scrapes the autoscaler through a scenario that makes
// every dashboard panel's story happen: a rate-limited scale-up with
// queued and cancelled nodes, GPU nodes through preflight with a warm pool
// whose balloons are displaced, a node failed by a periodic preflight run
// (drained and replaced), two web nodes reporting XIDErrors one after the
// other (the first cordoned, the second held by the health breaker;
// uncordoned when it clears), a GPU the device plugin drops, a quota error, a failed ARM
// operation, ARM throttling and server errors, and a scale-down. Then
// every panel's query returns data over the scenario's time range.
func TestDashboardsShowDataFromARealPrometheus(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	start := time.Now()
	gpu := sc.scaleSet("gpu", "Standard_ND96isr_H100_v5", 0, preflightTags())
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	quota := sc.scaleSet("quota", "Standard_D16s_v5", 0, nil)
	lro := sc.scaleSet("lro", "Standard_D16s_v5", 0, nil)
	must(t, sc.s.sim.InjectFault(sc.rg, quota, armsim.Fault{Kind: armsim.FaultQuota, Count: 1}))
	must(t, sc.s.sim.InjectFault(sc.rg, lro, armsim.Fault{Kind: armsim.FaultLROFail, Count: 1}))
	// Its own ARM token: its reads are throttled below, not those of the
	// scenarios running alongside (ARM throttles per principal).
	token, caller := sc.ownARMToken("autoscaler")
	as := sc.autoscaler("autoscaler", fastScaleDown(token,
		"--nodes=0:10:"+gpu, "--nodes=0:20:"+cpu, "--nodes=0:3:"+quota, "--nodes=0:3:"+lro,
		"--warm-pool="+gpu+":1", "--balloon-namespace="+sc.restrictedNamespace("e2e-dash-balloons"), // as the chart would create it
		"--node-addition-rate=30", "--node-addition-burst=2",
		"--node-addition-adaptive-interval=2s", "--node-addition-rate-min=10", "--node-addition-rate-max=100",
		"--apiserver-metrics-interval=2s",
		"--max-graceful-termination-sec=5", "--preflight-failure-settle=5s",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	prom := sc.prometheus(sc.addr(as))
	sc.runAgents(func(string, int) bool { return false }, gpu)

	// Work for every group: a GPU job that displaces the warm node's
	// balloon, web pods held by the rate, a pod for each faulty group.
	sc.workload("train", 2, "90", 8, gpu)
	web := sc.deployment("web", 8, "9", 0, cpu)
	sc.create(web)
	sc.workload("q", 1, "9", 0, quota)
	sc.workload("l", 1, "9", 0, lro)
	depth := `vmss_autoscaler_node_addition_queue_depth{class="workload",node_group="` + cpu + `"}`
	sc.eventually("web nodes queued", time.Minute, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		v := metricValue(body, depth)
		return v >= 2, fmt.Sprintf("queued %v", v)
	})
	// Half the web pods go while their nodes are queued: cancelled.
	sc.scaleDeployment("web", 4)
	sc.eventually("train, web and the lro group's pod Running", 3*time.Minute, func() (bool, string) {
		tr, w, l := sc.running("train"), sc.running("web"), sc.running("l")
		return tr == 2 && w == 4 && l == 1, fmt.Sprintf("train %d web %d l %d", tr, w, l)
	})
	sc.eventually("the warm pool whole again", 2*time.Minute, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		v := metricValue(body, `vmss_autoscaler_warm_pool_ready_nodes{node_group="`+gpu+`"}`)
		return v == 1, fmt.Sprintf("warm %v", v)
	})
	// A periodic preflight run fails a node that runs a training pod: the
	// pod is evicted and the node replaced.
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=train"})
	must(t, err)
	sc.updateNode(pods.Items[0].Spec.NodeName, false, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValueFailed
		n.Annotations[preflight.DefaultFailureAnnotation] = "check dcgm: diag level 1 failed"
	})
	sc.eventually("the failed node replaced and train Running again", 3*time.Minute, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		r := metricValue(body, `vmss_autoscaler_preflight_replaced_nodes_total{node_group="`+gpu+`"}`)
		return r == 1 && sc.running("train") == 2, fmt.Sprintf("replaced %v, train %d", r, sc.running("train"))
	})
	// ARM trouble: reads throttled for a few seconds (no decision on a
	// stale view: the groups' sizes are unknown until the next refresh),
	// then server errors for the CPU group while it scales down.
	sc.s.sim.ThrottleCaller(caller, "read", 3*time.Second)
	sc.eventually("groups of unknown size skipped", time.Minute, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		return strings.Contains(body, `vmss_autoscaler_node_group_size_unknown_total{node_group="`+cpu+`"}`), "not yet"
	})
	sc.healthStory(as, cpu, gpu)
	must(t, sc.s.sim.InjectFault(sc.rg, cpu, armsim.Fault{Kind: armsim.FaultServerError, Count: 3}))
	must(t, sc.s.cp.Client.AppsV1().Deployments(sc.ns).Delete(sc.ctx, "web", metav1.DeleteOptions{}))
	sc.eventually("the web nodes removed", 3*time.Minute, func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 0, fmt.Sprintf("cpu capacity %d", c)
	})
	// The last events need a couple of scrapes to show in a rate.
	// The Capacity requests dashboard's panels need autoscalers that
	// handle ProvisioningRequests and CapacityBuffers, which act on every
	// request or buffer of the shared API server: its panels are checked
	// by the scenarios that run them (TestCapacityBufferKeepsWarmGPUNodesAndTestTenantBufferText,
	// TestKueueAdmitsAGangJobThroughAProvisioningRequest); the health
	// dashboard's repair panels by TestRepairRebootKeepsTheMachineElseReplaced.
	var queries []panelQuery
	for _, q := range dashboardQueries(t) {
		if q.Dashboard != "capacity-requests.json" && !strings.Contains(q.Expr, "health_repair") {
			queries = append(queries, q)
		}
	}
	sc.eventually("every panel's query to return data", time.Minute, func() (bool, string) {
		var missing []string
		for _, q := range queries {
			n, err := prom.seriesOver(sc.ctx, q.Expr, start)
			switch {
			case err != nil:
				missing = append(missing, fmt.Sprintf("%s / %s: %v", q.Dashboard, q.Panel, err))
			case n == 0:
				missing = append(missing, fmt.Sprintf("%s / %s: no data for %s", q.Dashboard, q.Panel, q.Expr))
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d of %d panel queries without data:\n%s", len(missing), len(queries), strings.Join(missing, "\n"))
	})
	t.Logf("all %d panel queries of the chart's dashboards returned data", len(queries))
}

// scaleDeployment sets a Deployment's replicas through its scale
// subresource, by a merge patch: a read-then-update raced the deployment
// controller's own writes (409 "the object has been modified", one run
// in many).
func (sc *scenario) scaleDeployment(name string, replicas int32) {
	sc.t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
	if _, err := sc.s.cp.Client.AppsV1().Deployments(sc.ns).Patch(sc.ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "scale"); err != nil {
		sc.t.Fatal(err)
	}
}

// healthStory makes the health dashboard's story happen: two of the four
// web nodes report XIDErrors one after the other: the first is cordoned
// (its replacement due in an hour), the second, more than the policy's
// maxUnhealthy of 1, is held by the breaker (an engaged breaker cordons
// nothing new); the first is uncordoned once it clears; and a GPU node
// advertises 7 of its 8 GPUs (degraded).
func (sc *scenario) healthStory(as *harness.Process, cpu, gpu string) {
	sc.t.Helper()
	sc.healthPolicy(`maxUnhealthy: 1
stormCooldown: 1s
rules:
- name: xid-error
  condition: {type: XIDErrors, status: "True"}
  for: 1h
  action: replace
`)
	web := sc.nodeList(cpu)
	if len(web) < 2 {
		sc.t.Fatalf("%d web nodes, want at least 2", len(web))
	}
	xid := func(status apiv1.ConditionStatus) func(*apiv1.Node) {
		return func(n *apiv1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, apiv1.NodeCondition{Type: "XIDErrors", Status: status,
				Reason: "XID79", LastTransitionTime: metav1.Now()})
		}
	}
	cordons := func(body string) float64 {
		return metricValue(body, `vmss_autoscaler_health_actions_total{action="cordon",node_group="`+cpu+`",rule="xid-error"}`)
	}
	sc.updateNode(web[0].Name, true, xid(apiv1.ConditionTrue))
	sc.eventually("the first web node cordoned", time.Minute, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		return cordons(body) == 1, fmt.Sprintf("cordons %v", cordons(body))
	})
	sc.updateNode(web[1].Name, true, xid(apiv1.ConditionTrue))
	sc.updateNode(sc.nodeList(gpu)[0].Name, true, func(n *apiv1.Node) {
		n.Status.Allocatable["nvidia.com/gpu"] = resource.MustParse("7")
	})
	sc.eventually("the breaker holding the second web node", time.Minute, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		held := metricValue(body, `vmss_autoscaler_health_held_total{node_group="`+cpu+`",reason="breaker"}`)
		degraded := metricValue(body, `vmss_autoscaler_degraded_nodes{node_group="`+gpu+`"}`)
		return held > 0 && cordons(body) == 1 && degraded == 1, fmt.Sprintf("held %v, cordons %v, degraded %v", held, cordons(body), degraded)
	})
	for _, n := range web[:2] {
		sc.updateNode(n.Name, true, func(n *apiv1.Node) {
			for i := range n.Status.Conditions {
				if n.Status.Conditions[i].Type == "XIDErrors" {
					n.Status.Conditions[i].Status = apiv1.ConditionFalse
				}
			}
		})
	}
	sc.eventually("the cordoned web node uncordoned", time.Minute, func() (bool, string) {
		_, body := sc.get(as, "/metrics")
		v := metricValue(body, `vmss_autoscaler_health_actions_total{action="uncordon",node_group="`+cpu+`",rule="xid-error"}`)
		return v == 1, fmt.Sprintf("uncordoned %v", v)
	})
}
