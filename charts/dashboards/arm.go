package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// arm builds the dashboard: Azure Resource Manager: requests by operation and status, latency, throttling, failed long-running operations and the scale-set cache.
func arm() *dashboard.DashboardBuilder {
	return newDashboard("arm", "vmss-autoscaler / ARM",
		"Azure Resource Manager: requests by operation and status, latency, throttling, failed long-running operations and the scale-set cache.").
		WithPanel(stacked("Requests by operation and code", "reqps", 12,
			q(`sum by (operation, code) (rate(vmss_autoscaler_arm_requests_total{job=~"$job"}[$__rate_interval]))`, "{{operation}} {{code}}"),
		)).
		WithPanel(series("Throttled, held back and failed requests", "reqps", 12,
			q(`sum by (operation, code) (rate(vmss_autoscaler_arm_requests_total{job=~"$job", code=~"429|held-back|error|5.."}[$__rate_interval]))`, "{{operation}} {{code}}"),
		)).
		WithPanel(series("Request duration (p99)", "s", 12,
			q(`histogram_quantile(0.99, sum by (le, operation) (rate(vmss_autoscaler_arm_request_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "{{operation}}"),
		)).
		WithPanel(series("ARM's own buckets: held for (seconds left)", "s", 12,
			q(`clamp_min(max by (kind) (vmss_autoscaler_arm_throttled_until_seconds{job=~"$job"}) - time(), 0)`, "{{kind}}"),
		).
			Description("Only when ARM's own subscription bucket (per principal, or global) is empty, or a 429 names no policy, does every call of that kind (read, write, delete) wait for Retry-After; while reads wait, group sizes are unknown.")).
		WithPanel(series("Compute policies: held for (seconds left)", "s", 12,
			q(`clamp_min(max by (policy, scope) (vmss_autoscaler_arm_policy_held_until_seconds{job=~"$job"}) - time(), 0)`, "{{policy}} {{scope}}"),
		).
			Description("A Compute resource provider 429 holds back only the calls its policy covers, for one scale set (scope resource) or all (subscription), until Retry-After.")).
		WithPanel(series("Compute policies: calls left", "short", 12,
			q(`min by (policy, scope) (vmss_autoscaler_arm_ratelimit_remaining{job=~"$job"})`, "{{policy}} {{scope}}"),
		).
			Description("x-ms-ratelimit-remaining-resource of the last answer charged to each policy; near 10 % of its most the provider paces itself to one call per 15 s.")).
		WithPanel(series("Scale-set cache and VM list age", "s", 8,
			q(`max(vmss_autoscaler_cloud_cache_age_seconds{job=~"$job"})`, "scale-set list"),
			q(`max(vmss_autoscaler_cloud_vm_list_age_seconds{job=~"$job"})`, "oldest VM list"),
		)).
		WithPanel(series("Groups skipped, size unknown", "short", 8,
			q(`sum by (node_group) (increase(vmss_autoscaler_node_group_size_unknown_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}}"),
		)).
		WithPanel(series("Failed long-running operations", "short", 8,
			q(`sum by (node_group, code) (increase(vmss_autoscaler_arm_operation_failures_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{node_group}} {{code}}"),
		))
}
