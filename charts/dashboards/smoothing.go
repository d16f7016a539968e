package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// smoothing builds the dashboard: The node-addition queue: demand held back by class and group, nodes released against the rate, in flight, and the adaptive rate with its reason.
func smoothing() *dashboard.DashboardBuilder {
	return newDashboard("smoothing", "vmss-autoscaler / Smoothing",
		"The node-addition queue: demand held back by class and group, nodes released against the rate, in flight, and the adaptive rate with its reason.").
		WithRow(row("Queue")).
		WithPanel(stacked("Queued nodes by class", "short", 12,
			q(`sum by (class) (vmss_autoscaler_node_addition_queue_depth{job=~"$job", node_group=~"$node_group"})`, "{{class}}"),
		).
			Description("Nodes planned and held back by the queue; workload before balloon.")).
		WithPanel(stacked("Queued nodes by group", "short", 12,
			q(`sum by (node_group) (vmss_autoscaler_node_addition_queue_depth{job=~"$job", node_group=~"$node_group"})`, "{{node_group}}"),
		)).
		WithRow(row("Rate")).
		WithPanel(series("Released vs rate (nodes/min)", "short", 12,
			q(`sum(rate(vmss_autoscaler_node_addition_released_nodes_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval])) * 60`, "released"),
			q(`max(vmss_autoscaler_node_addition_rate_nodes_per_minute{job=~"$job"})`, "rate"),
		)).
		WithPanel(stacked("Released by group and class", "short", 12,
			q(`sum by (node_group, class) (increase(vmss_autoscaler_node_addition_released_nodes_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}} {{class}}"),
		)).
		WithPanel(timeline("Rate reason", "short", 12,
			q(`max by (reason) (vmss_autoscaler_node_addition_rate_reason{job=~"$job"}) == 1`, "{{reason}}"),
		).
			Description("configured, healthy, steady, at-max, client-429, client-5xx, client-latency, apiserver-flowcontrol-rejected.")).
		WithPanel(series("Rate changes by reason", "short", 12,
			q(`sum by (reason) (increase(vmss_autoscaler_node_addition_rate_changes_total{job=~"$job"}[$__rate_interval]))`, "{{reason}}"),
		)).
		WithRow(row("In flight")).
		WithPanel(series("Nodes in flight", "short", 8,
			q(`max(vmss_autoscaler_nodes_in_flight{job=~"$job"})`, "in flight"),
		).
			Description("Requested and not yet ready; capped by --max-nodes-in-flight.")).
		WithPanel(series("Token bucket", "short", 8,
			q(`max(vmss_autoscaler_node_addition_tokens{job=~"$job"})`, "tokens"),
		)).
		WithPanel(series("Cancelled before sent", "short", 8,
			q(`sum by (node_group, class) (increase(vmss_autoscaler_node_addition_cancelled_nodes_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}} {{class}}"),
		)).
		WithPanel(single("API server /metrics readable", "short", 6,
			q(`max(vmss_autoscaler_apiserver_metrics_readable{job=~"$job"})`, "readable"),
		).
			Description("1 when the last read of the API server's flow-control rejections worked (needs get on /metrics)."))
}
