// Package core is the autoscaler's loop: it reads the informer caches and
// the cloud provider's cache, simulates scheduling with the kube-scheduler
// framework, and decides which node groups to scale, which nodes to
// remove, repair or replace.
//
// One loop (RunOnce) is the phase table of (*Autoscaler).phases, each
// phase a file named for it, each with its duration metric:
//
//	informer caches ─┐                       ┌─ cloud provider cache
//	                 ▼                       ▼
//	phase_cloud_refresh.go      the provider's cache refreshed: groups, sizes, machines
//	phase_snapshot.go           nodes and pods into the scheduling snapshot
//	phase_cluster_state.go      readiness, upcoming and failed machines, backoff (cluster_state_*.go: Spot, failed VMs)
//	phase_preflight.go          nodes that failed preflight replaced (preflight_*.go: incidents)
//	phase_health.go             broken nodes cordoned, repaired (health_repair.go) or replaced
//	phase_balloons.go           warm pools' balloon Deployments sized
//	phase_provisioning_requests.go  requests booked, checked or turned into gangs
//	phase_capacity_buffers.go   buffers' chunks placed
//	phase_scale_up.go           pending pods planned, demand queued and requested (scale_up_*.go:
//	                            templates, the node-addition queue, pods to come, gangs, teams,
//	                            priorities, pod events)
//	phase_scale_down.go         unneeded nodes drained and removed
//	phase_status.go             the status ConfigMap (status_*.go)
//	phase_safety_state.go       brake windows and backoffs saved for the next leader
//
// Every path that deletes a machine hands it to the actuation.Remover, the
// one deletion path, which reads the node's pods again before the machine
// goes: scale-down (phase_scale_down.go), and the replacements of failed
// preflight, broken nodes and failed machines, with their shared brake and
// drains, in removal_replacements.go. Every cloud write passes the fence
// (Deps.Fence). loop_triggers.go wakes the loop between --scan-interval
// ticks; options.go and options_reconfigure.go are its options, live.
package core
