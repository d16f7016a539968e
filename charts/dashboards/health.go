package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// health builds the dashboard: passive node health (docs/concepts/health-policy.md): what is unhealthy and why, what was done, what held it.
func health() *dashboard.DashboardBuilder {
	return newDashboard("health", "vmss-autoscaler / Node health",
		"Passive node health (docs/concepts/health-policy.md): nodes matching a rule of the health policy, what was done to them and what held it, the per-group breakers, degraded nodes and the pause switch.").
		WithRow(row("Node health")).
		WithPanel(stacked("Unhealthy nodes by rule", "short", 18,
			q(`sum by (rule) (vmss_autoscaler_health_unhealthy_nodes{job=~"$job", node_group=~"$node_group"})`, "{{rule}}"),
		).
			Description("Nodes matching a rule of the health policy now, counted under the strongest rule each matches (xid-error, gpus-below-sku, ...).")).
		WithPanel(single("Health actions paused", "short", 6,
			q(`max(vmss_autoscaler_health_paused{job=~"$job"})`, "paused"),
		).
			Description("1 while the policy's ConfigMap carries vmss-autoscaler.io/health-paused=true: reports only, no new cordon, drain or deletion.").
			Thresholds(thresholds(step("orange", 1)))).
		WithPanel(stacked("Actions per minute by action", "short", 12,
			q(`sum by (action) (rate(vmss_autoscaler_health_actions_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval])) * 60`, "{{action}}"),
		).
			Description("cordon, drain (evictions begun), replace (machine deleted), uncordon (the node recovered), buy-first (a replacement bought first, the group at its minimum).")).
		WithPanel(stacked("Held actions by reason", "short", 12,
			q(`sum by (reason) (increase(vmss_autoscaler_health_held_total{job=~"$job", node_group=~"$node_group"}[$__rate_interval]))`, "{{reason}}"),
		).
			Description("Cordons, drains and replacements that waited: paused, unready-guard, breaker, gang (one node of a gang at a time), brake (replacement brake), blocked (a pod that may not be evicted).")).
		WithPanel(timeline("Breaker engaged by group", "short", 12,
			q(`max by (node_group) (vmss_autoscaler_health_breaker_engaged{job=~"$job", node_group=~"$node_group"})`, "{{node_group}}"),
		).
			Description("1 while more of the group's nodes match drain or replace rules than maxUnhealthy allows, and for stormCooldown after: report and cordon only.")).
		WithPanel(series("Degraded nodes by group", "short", 12,
			q(`sum by (node_group) (vmss_autoscaler_degraded_nodes{job=~"$job", node_group=~"$node_group"})`, "{{node_group}}"),
		).
			Description("Nodes advertising less than their VM size (fewer GPUs, memory beyond memoryTolerance): never the group's template.")).
		WithPanel(stacked("Nodes in a repair ladder by stage", "short", 12,
			q(`sum by (stage) (vmss_autoscaler_health_repairing_nodes{job=~"$job", node_group=~"$node_group"})`, "{{stage}}"),
		).
			Description("Nodes a replace rule's repair steps (reboot, reimage, redeploy) are trying to keep: due (waiting for its pods, or throttled), cloud (the VM's operation runs), preflight (sent through preflight again; the rule must clear), replace (no step fixed it).")).
		WithPanel(stacked("Repair steps per hour by step and outcome", "short", 12,
			q(`sum by (action, outcome) (increase(vmss_autoscaler_health_repairs_total{job=~"$job", node_group=~"$node_group"}[1h]))`, "{{action}} {{outcome}}"),
		).
			Description("started; fixed (passed preflight again, the rule cleared: the machine kept); timeout, failed (the cloud's operation), preflight-failed: the next step, or past the last a replacement."))
}
