package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// overview builds the dashboard: The loop, pending pods, nodes by state per node group, scale-ups, scale-downs and errors.
func overview() *dashboard.DashboardBuilder {
	return newDashboard("overview", "vmss-autoscaler / Overview",
		"The loop, pending pods, nodes by state per node group, scale-ups, scale-downs and errors.").
		WithRow(row("Loop")).
		WithPanel(single("Time since last successful loop", "s", 6,
			q(`time() - max(vmss_autoscaler_last_successful_loop_timestamp_seconds{job=~"$job"})`, "seconds"),
		).
			Description("The leader's last loop without error; the standby's gauge stays 0, hence max. /healthz fails after --max-failing-time.").
			Thresholds(thresholds(step("orange", 120), step("red", 900)))).
		WithPanel(series("Loop duration", "s", 9,
			q(`histogram_quantile(0.5, sum by (le) (rate(vmss_autoscaler_loop_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "p50"),
			q(`histogram_quantile(0.99, sum by (le) (rate(vmss_autoscaler_loop_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "p99"),
			q(`sum(rate(vmss_autoscaler_loop_duration_seconds_sum{job=~"$job"}[$__rate_interval])) / sum(rate(vmss_autoscaler_loop_duration_seconds_count{job=~"$job"}[$__rate_interval]))`, "mean"),
		)).
		WithPanel(series("Loops per minute", "short", 9,
			q(`sum(rate(vmss_autoscaler_loop_duration_seconds_count{job=~"$job"}[$__rate_interval])) * 60`, "loops/min"),
		)).
		WithPanel(series("Phase duration (p99)", "s", 12,
			q(`histogram_quantile(0.99, sum by (le, phase) (rate(vmss_autoscaler_phase_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "{{phase}}"),
		).
			Description("cloud-refresh, snapshot, cluster-state, preflight, balloons, scale-up, scale-down, status.")).
		WithPanel(stacked("Phase duration (mean, stacked)", "s", 12,
			q(`sum by (phase) (rate(vmss_autoscaler_phase_duration_seconds_sum{job=~"$job"}[$__rate_interval])) / sum by (phase) (rate(vmss_autoscaler_phase_duration_seconds_count{job=~"$job"}[$__rate_interval]))`, "{{phase}}"),
		)).
		WithPanel(single("Flags ConfigMap: restart required", "short", 6,
			q(`max(vmss_autoscaler_config_restart_required{job=~"$job"})`, "restart required"),
		).
			Description("1 when an edit of the flags ConfigMap changed keys that apply only at start (ConfigRestartRequired event).")).
		WithRow(row("Pods")).
		WithPanel(series("Pending pods", "short", 12,
			q(`max(vmss_autoscaler_unschedulable_pods{job=~"$job"})`, "unschedulable (past the scale-up delay)"),
			q(`max(vmss_autoscaler_pods_awaiting_upcoming_nodes{job=~"$job"})`, "awaiting upcoming nodes"),
		)).
		WithPanel(series("Snapshot nodes rebuilt per loop", "short", 12,
			q(`max(vmss_autoscaler_snapshot_rebuilt_nodes{job=~"$job"})`, "rebuilt"),
		)).
		WithRow(row("Nodes")).
		WithPanel(stacked("Nodes by state", "short", 12,
			q(`sum by (state) (vmss_autoscaler_nodes{job=~"$job", node_group=~"$node_group"})`, "{{state}}"),
		).
			Description("ready, unready, not_started, preflight, preflight_failed, unregistered, long_unregistered, in_error, deleting, upcoming.")).
		WithPanel(series("Ready nodes per group vs target", "short", 12,
			q(`sum by (node_group) (vmss_autoscaler_nodes{job=~"$job", node_group=~"$node_group", state="ready"})`, "{{node_group}} ready"),
			q(`max by (node_group) (vmss_autoscaler_node_group_target_size{job=~"$job", node_group=~"$node_group"})`, "{{node_group}} target"),
		)).
		WithPanel(series("Nodes by group and state", "short", 24,
			q(`sum by (node_group, state) (vmss_autoscaler_nodes{job=~"$job", node_group=~"$node_group"}) > 0`, "{{node_group}} {{state}}"),
		).
			Height(10)).
		WithPanel(series("Group bounds", "short", 12,
			q(`max by (node_group) (vmss_autoscaler_node_group_min_size{job=~"$job", node_group=~"$node_group"})`, "{{node_group}} min"),
			q(`max by (node_group) (vmss_autoscaler_node_group_max_size{job=~"$job", node_group=~"$node_group"})`, "{{node_group}} max"),
		)).
		WithPanel(timeline("Groups backed off", "short", 12,
			q(`max by (node_group) (vmss_autoscaler_node_group_backoff{job=~"$job", node_group=~"$node_group"})`, "{{node_group}}"),
		)).
		WithRow(row("Scale-up")).
		WithPanel(stacked("Nodes requested", "short", 12,
			q(`sum by (node_group) (increase(vmss_autoscaler_scaled_up_nodes_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}}"),
		)).
		WithPanel(stacked("Scale-ups", "short", 12,
			q(`sum by (node_group) (increase(vmss_autoscaler_scale_ups_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}}"),
		)).
		WithRow(row("Scale-down")).
		WithPanel(stacked("Nodes removed", "short", 12,
			q(`sum by (node_group, reason) (increase(vmss_autoscaler_scaled_down_nodes_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}} {{reason}}"),
		)).
		WithPanel(series("Unneeded and draining", "short", 12,
			q(`max(vmss_autoscaler_unneeded_nodes{job=~"$job"})`, "unneeded"),
			q(`max(vmss_autoscaler_scale_down_drains_in_flight{job=~"$job"})`, "draining"),
			q(`max(vmss_autoscaler_scale_down_brake_engaged{job=~"$job"})`, "brake engaged"),
		)).
		WithPanel(stacked("Kept nodes by reason", "short", 12,
			q(`max by (reason) (vmss_autoscaler_scale_down_kept_nodes{job=~"$job"})`, "{{reason}}"),
		)).
		WithPanel(series("Evictions", "short", 12,
			q(`sum by (result) (increase(vmss_autoscaler_evictions_total{job=~"$job"}[$__rate_interval]))`, "{{result}}"),
		)).
		WithRow(row("Errors")).
		WithPanel(series("Loop errors by phase", "short", 8,
			q(`sum by (phase) (increase(vmss_autoscaler_loop_errors_total{job=~"$job"}[$__rate_interval]))`, "{{phase}}"),
		)).
		WithPanel(series("Failed scale-ups", "short", 8,
			q(`sum by (node_group, reason) (increase(vmss_autoscaler_failed_scale_ups_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}} {{reason}}"),
		)).
		WithPanel(series("Failed scale-downs", "short", 8,
			q(`sum by (node_group, step) (increase(vmss_autoscaler_failed_scale_downs_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}} {{step}}"),
		)).
		WithRow(row("API requests")).
		WithPanel(stacked("Kubernetes API requests by method and code", "reqps", 12,
			q(`sum by (method, code) (rate(rest_client_requests_total{job=~"$job"}[$__rate_interval]))`, "{{method}} {{code}}"),
		).
			Description("Every request of the autoscaler's Kubernetes clients, both replicas (client-go's rest_client_requests_total); watches count when they start.")).
		WithPanel(stacked("Kubernetes API requests by verb and resource", "reqps", 12,
			q(`sum by (verb, resource) (rate(rest_client_request_duration_seconds_count{job=~"$job"}[$__rate_interval]))`, "{{verb}} {{resource}}"),
		).
			Description("Completed requests (watch streams excluded) by HTTP verb and resource; an empty resource is discovery or /metrics.")).
		WithPanel(series("Kubernetes API request duration (p99)", "s", 12,
			q(`histogram_quantile(0.99, sum by (le, verb) (rate(rest_client_request_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "{{verb}}"),
			q(`histogram_quantile(0.99, sum by (le) (rate(rest_client_rate_limiter_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "client rate limiter wait"),
		).
			Description("Time to the API server's answer, and what the client's own --kube-client-qps/--kube-client-burst limiter added.")).
		WithPanel(stacked("ARM requests by operation and code", "reqps", 12,
			q(`sum by (operation, code) (rate(vmss_autoscaler_arm_requests_total{job=~"$job"}[$__rate_interval]))`, "{{operation}} {{code}}"),
		).
			Description("Azure Resource Manager calls; the ARM dashboard has their latency and throttling.")).
		WithRow(row("Process")).
		WithPanel(series("Memory", "bytes", 12,
			q(`process_resident_memory_bytes{job=~"$job"}`, "RSS {{pod}}"),
			q(`go_memstats_heap_inuse_bytes{job=~"$job"}`, "heap in use {{pod}}"),
		).
			Description("Informer caches of every pod and node: several GB at 7,500 nodes / 200,000 pods.")).
		WithPanel(series("CPU", "short", 12,
			q(`rate(process_cpu_seconds_total{job=~"$job"}[$__rate_interval])`, "{{pod}}"),
		))
}
