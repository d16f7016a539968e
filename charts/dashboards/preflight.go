package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// preflight builds the dashboard: New nodes waiting for the preflight agent, results by group, time to pass, replaced machines.
func preflight() *dashboard.DashboardBuilder {
	return newDashboard("preflight", "vmss-autoscaler / Preflight",
		"New nodes waiting for the preflight agent, results by group, time to pass, replaced machines.").
		WithPanel(stacked("Nodes waiting for preflight", "short", 12,
			q(`sum by (node_group) (vmss_autoscaler_preflight_pending_nodes{job=~"$job", node_group=~"$node_group"})`, "{{node_group}}"),
		)).
		WithPanel(stacked("Nodes in preflight states", "short", 12,
			q(`sum by (node_group, state) (vmss_autoscaler_nodes{job=~"$job", node_group=~"$node_group", state=~"preflight|preflight_failed"})`, "{{node_group}} {{state}}"),
		)).
		WithPanel(stacked("Results by group", "short", 12,
			q(`sum by (node_group, result) (increase(vmss_autoscaler_preflight_results_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}} {{result}}"),
		).
			Description("passed, failed (the agent said so), timeout (not passed within --max-preflight-time).")).
		WithPanel(series("Failure ratio (1h)", "percentunit", 12,
			q(`(sum by (node_group) (increase(vmss_autoscaler_preflight_results_total{job=~"$job", node_group=~"$node_group", result!="passed"}[1h])) or 0 * sum by (node_group) (increase(vmss_autoscaler_preflight_results_total{job=~"$job", node_group=~"$node_group"}[1h]))) / sum by (node_group) (increase(vmss_autoscaler_preflight_results_total{job=~"$job", node_group=~"$node_group"}[1h]))`, "{{node_group}}"),
		).
			Description("Failed or timed out over all results, per group (0 while every node passed).")).
		WithPanel(series("Time to pass", "s", 12,
			q(`histogram_quantile(0.5, sum by (le) (rate(vmss_autoscaler_preflight_duration_seconds_bucket{job=~"$job", node_group=~"$node_group"}[$__rate_interval])))`, "p50"),
			q(`histogram_quantile(0.9, sum by (le) (rate(vmss_autoscaler_preflight_duration_seconds_bucket{job=~"$job", node_group=~"$node_group"}[$__rate_interval])))`, "p90"),
			q(`histogram_quantile(0.99, sum by (le) (rate(vmss_autoscaler_preflight_duration_seconds_bucket{job=~"$job", node_group=~"$node_group"}[$__rate_interval])))`, "p99"),
		).
			Description("From a node's registration to passing preflight.")).
		WithPanel(series("Time to pass by group (p90)", "s", 12,
			q(`histogram_quantile(0.9, sum by (le, node_group) (rate(vmss_autoscaler_preflight_duration_seconds_bucket{job=~"$job", node_group=~"$node_group"}[$__rate_interval])))`, "{{node_group}}"),
		)).
		WithPanel(stacked("Machines replaced after failing", "short", 24,
			q(`sum by (node_group) (increase(vmss_autoscaler_preflight_replaced_nodes_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}}"),
		))
}
