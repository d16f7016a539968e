package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// balloons builds the dashboard: Warm pools: the target of each group's policy against ready nodes holding a balloon, balloons waiting for a node.
func balloons() *dashboard.DashboardBuilder {
	return newDashboard("balloons", "vmss-autoscaler / Balloons",
		"Warm pools: the target of each group's policy against ready nodes holding a balloon, balloons waiting for a node.").
		WithPanel(series("Warm target vs ready", "short", 12,
			q(`max by (node_group) (vmss_autoscaler_warm_pool_target_nodes{job=~"$job", node_group=~"$node_group"})`, "{{node_group}} target"),
			q(`max by (node_group) (vmss_autoscaler_warm_pool_ready_nodes{job=~"$job", node_group=~"$node_group"})`, "{{node_group}} ready"),
		)).
		WithPanel(series("Warm nodes missing", "short", 12,
			q(`max by (node_group) (vmss_autoscaler_warm_pool_target_nodes{job=~"$job", node_group=~"$node_group"}) - max by (node_group) (vmss_autoscaler_warm_pool_ready_nodes{job=~"$job", node_group=~"$node_group"})`, "{{node_group}}"),
		)).
		WithPanel(stacked("Balloons pending", "short", 12,
			q(`sum by (node_group) (vmss_autoscaler_balloon_pods_pending{job=~"$job", node_group=~"$node_group"})`, "{{node_group}}"),
		).
			Description("Displaced by real pods or a growing pool; planned last and queued at class balloon.")).
		WithPanel(series("Balloon-class nodes queued and released", "short", 12,
			q(`sum by (node_group) (vmss_autoscaler_node_addition_queue_depth{job=~"$job", node_group=~"$node_group", class="balloon"}) or 0 * max by (node_group) (vmss_autoscaler_warm_pool_target_nodes{job=~"$job", node_group=~"$node_group"})`, "{{node_group}} queued"),
			q(`sum by (node_group) (increase(vmss_autoscaler_node_addition_released_nodes_total{job=~"$job", node_group=~"$node_group", class="balloon"}[$__rate_interval])) or 0 * max by (node_group) (vmss_autoscaler_warm_pool_target_nodes{job=~"$job", node_group=~"$node_group"})`, "{{node_group}} released"),
		).
			Description("Balloons are planned after workload and released last; 0 for groups with a warm pool and nothing queued."))
}
