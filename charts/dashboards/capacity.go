package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// provreqClasses is 0 for each ProvisioningRequest class while requests
// are served (--enable-provisioning-requests sets the requests' gauge for
// both classes every loop): a panel shows 0, not "No data", when nothing
// is booked or provisioned.
const provreqClasses = `0 * max by (class) (vmss_autoscaler_provisioning_requests{job=~"$job", condition="Accepted"})`

// capacityRequests builds the dashboard: capacity asked for ahead of pods,
// ProvisioningRequests (Kueue's admission check) and CapacityBuffers.
func capacityRequests() *dashboard.DashboardBuilder {
	return newDashboard("capacity-requests", "vmss-autoscaler / Capacity requests",
		"Capacity asked for ahead of the pods: ProvisioningRequests (Kueue's admission check; --enable-provisioning-requests) by class and condition, the room they book and how long they wait to be Provisioned; CapacityBuffers (spare room kept for pods of a given shape) by state, and where their pods' room is.").
		WithRow(row("ProvisioningRequests")).
		WithPanel(series("Requests by class and condition", "short", 12,
			q(`max by (class, condition) (vmss_autoscaler_provisioning_requests{job=~"$job"})`, "{{class}} {{condition}}"),
		).
			Description("ProvisioningRequests with each condition True, per class (check-capacity: does it fit on the ready nodes now; best-effort-atomic-scale-up: buy all the nodes or none). The conditions overlap, so the lines do not add up: Accepted = every request the autoscaler has seen; Provisioned = capacity found or nodes requested (the workload may start); Failed = given up (expired after 7 days, template unreadable, too many pods, or check-capacity with noRetry); BookingExpired = its booked room was used by its pods or ran out (10 min). CapacityRevoked is never set by this autoscaler. Finished requests are deleted 7 days after they finish. No data: --enable-provisioning-requests is off.")).
		WithPanel(series("Requests not provisioned yet", "short", 12,
			q(`clamp_min(max by (class) (vmss_autoscaler_provisioning_requests{job=~"$job", condition="Accepted"}) - max by (class) (vmss_autoscaler_provisioning_requests{job=~"$job", condition="Provisioned"}) - max by (class) (vmss_autoscaler_provisioning_requests{job=~"$job", condition="Failed"}), 0)`, "{{class}}"),
		).
			Description("Accepted, neither Provisioned nor Failed: workloads (Kueue jobs) still held back. They wait for a retry (1, 2, 4, 8, then every 10 min) after CapacityIsNotFound, or for their queued nodes (CapacityIsQueued). Which ones and why: `vmss-autoscaler status`, or the Provisioned condition's message on the request (kubectl get provisioningrequest -A).")).
		WithPanel(stacked("Booked pods by class", "short", 12,
			q(`max by (class) (vmss_autoscaler_provisioning_request_booked_pods{job=~"$job"}) or `+provreqClasses, "{{class}}"),
		).
			Description("Pods of Provisioned requests whose room is held for them and not yet taken by their own pods: other pods, balloons and scale-down treat that room as used. A booking ends when the request's pods are scheduled, or after 10 minutes (a best-effort-atomic one also waits for its nodes to boot). A booking that ends at 10 minutes instead of dropping when the pods start (BookingExpired, CapacityReservationTimeExpired): the workload was admitted but its pods did not come.")).
		WithPanel(stacked("Booked GPUs by class", "short", 12,
			q(`max by (class) (vmss_autoscaler_provisioning_request_booked_gpus{job=~"$job"}) or `+provreqClasses, "{{class}}"),
		).
			Description("GPUs the booked pods request: GPU capacity held for admitted workloads that nothing else may use meanwhile.")).
		WithPanel(series("Time from request to Provisioned", "s", 12,
			q(`histogram_quantile(0.5, sum by (le, class) (rate(vmss_autoscaler_provisioning_request_provision_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "{{class}} p50"),
			q(`histogram_quantile(0.9, sum by (le, class) (rate(vmss_autoscaler_provisioning_request_provision_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "{{class}} p90"),
			q(`histogram_quantile(0.99, sum by (le, class) (rate(vmss_autoscaler_provisioning_request_provision_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "{{class}} p99"),
		).
			Description("From a request's creation to Provisioned=True, for the requests provisioned in each interval: how long a workload waited for its capacity. Gaps: nothing was provisioned then. Buckets end at 2h: a value of 2h means 2h or more. Best-effort-atomic requests are Provisioned when their nodes are requested, not when they are up.")).
		WithPanel(stacked("Provisioned per minute by class", "short", 12,
			q(`sum by (class) (rate(vmss_autoscaler_provisioning_request_provision_duration_seconds_count{job=~"$job"}[$__rate_interval])) * 60 or `+provreqClasses, "{{class}}"),
		).
			Description("Requests turning Provisioned=True per minute: workloads let through. 0 while requests are waiting (see Requests not provisioned yet) means none is getting capacity.")).
		WithRow(row("CapacityBuffers")).
		WithPanel(stacked("Buffers by state", "short", 9,
			q(`max by (state) (vmss_autoscaler_capacity_buffers{job=~"$job"})`, "{{state}}"),
		).
			Description("CapacityBuffers of the active-capacity strategy (spare room kept free for pods of a given shape), by what they are doing. provisioning = it asks for room and the autoscaler keeps it (held on ready nodes, or nodes bought or queued; Buffer pods by state shows where, and what found no room). not_ready = the buffer cannot be turned into pods (invalid spec, PodTemplate or scaled object not found): it keeps no room until fixed; see its ReadyForProvisioning condition (kubectl get capacitybuffer -A -o yaml). empty = it asks for no pods right now (its replicas, percentage or limits come to 0; BufferIsEmpty). No data: --enable-capacity-buffers is off.")).
		WithPanel(stacked("Buffer pods by state", "short", 9,
			q(`max by (state) (vmss_autoscaler_capacity_buffer_pods{job=~"$job"})`, "{{state}}"),
		).
			Description("The buffers' pods (each one pod's worth of room) by where their room is. warm = held on ready nodes: real pods of that shape can start at once. coming = on nodes still booting, or on nodes requested or queued this loop: ready soon. unplaced = no node group can take them (at its max, backed off, or none fits the shape): that room does not exist. The stack's top is the room the buffers ask for.")).
		WithPanel(single("Buffer pods no group can take", "short", 6,
			q(`max(vmss_autoscaler_capacity_buffer_pods{job=~"$job", state="unplaced"})`, "unplaced"),
		).
			Description("Buffer pods with room nowhere, now and coming: the buffer promises less spare room than it asks for. Orange from 1: check the node groups' max, backoffs and the buffer's Provisioning condition.").
			Thresholds(thresholds(step("orange", 1))))
}
