package harness

import (
	"fmt"
	"os"
	"strings"
	"time"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
)

// kwokOptions raise kwok's workers above its defaults (4 each). Each real
// kubelet renews its own Lease every 10 s; kwok renews every node's Lease
// from one pool of workers, and 4 of them at ~2,000 nodes fall behind the
// 200 renewals a second that takes: leases expire, the node lifecycle
// controller marks half the nodes Unknown and taints them unreachable, a
// failure of the simulator, not of the cluster being simulated.
const kwokOptions = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  nodeLeaseParallelism: 64
  nodePlayStageParallelism: 16
  podPlayStageParallelism: 16`

// PodDeleteDelayAnnotation says how long a pod's process takes to exit on
// SIGTERM, as a Go duration ("60s"): kwok deletes the terminating pod that
// long after its deletion, or when its grace period runs out if that comes
// first, as the kubelet kills a process that outlives its grace. kwok's
// stock "general" pod-delete stage reads the same annotation.
const PodDeleteDelayAnnotation = "pod-delete.stage.kwok.x-k8s.io/delay"

// podDeleteStages replace kwok's stock "fast" pod-delete stage, which
// deletes a terminating pod at once, with two:
//
//   - pod-delete: a terminating pod without PodDeleteDelayAnnotation is
//     deleted at once, as before: a process that exits on SIGTERM
//     straight away.
//   - pod-delete-after-exit: a terminating pod with the annotation is
//     deleted after min(its delay, the time left until its
//     deletionTimestamp). The deletionTimestamp is when the grace period
//     given at deletion (an eviction's, say) runs out, and the kubelet
//     then SIGKILLs the process; that is what an autoscaler deleting the
//     machine must wait for.
//
// kwok's Delay picks, for a duration D and a jitter J, J when J <= D and a
// uniform draw from [D, J) otherwise. With D the annotation and J the time
// until the deletionTimestamp, as the stock general stage has it, a pod
// whose process exits in 6 s under a 30 s grace would go at a random time
// between 6 and 30 s. So J is the deletionTimestamp only when it comes
// before D has passed (the jq expression parses the Go duration and
// compares it with the grace left, by jq's clock, which is kwok's), and
// otherwise D itself: always min(D, grace left), never random.
//
// kwok computes the delay when it sees the pod change; a terminating pod
// that is updated again (its status, say) is timed afresh from then, but
// never past its deletionTimestamp.
const podDeleteStages = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.annotations["` + PodDeleteDelayAnnotation + `"]'
      operator: 'DoesNotExist'
  next:
    delete: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete-after-exit
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.annotations["` + PodDeleteDelayAnnotation + `"]'
      operator: 'Exists'
  delay:
    durationFrom:
      jq:
        expression: '.metadata.annotations["` + PodDeleteDelayAnnotation + `"]'
    jitterDurationFrom:
      jq:
        expression: >-
          .metadata.annotations["` + PodDeleteDelayAnnotation + `"] as $d
          | .metadata.deletionTimestamp as $end
          | ([$d | scan("([0-9]*\\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
              | (.[0] | tonumber) * {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 0.001, "s": 1, "m": 60, "h": 3600}[.[1]]]
             | add) as $exit
          | if $exit != null and ($end | fromdateiso8601) - now < $exit then $end else $d end
  next:
    delete: true`

// KeepRunningAnnotation on a Job's pod keeps it Running until it is
// deleted: kwok's stock stage completes a Job's pods as soon as they run,
// and a training job's pods run for hours (a gang's members must all run
// at once).
const KeepRunningAnnotation = "e2e.vmss-autoscaler.io/keep-running"

// podCompleteStage is kwok's stock "fast" pod-complete stage for pods
// without KeepRunningAnnotation.
func podCompleteStage() string {
	const owner = `    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
`
	if !strings.Contains(podfast.DefaultPodComplete, owner) {
		panic("kwok's pod-complete stage changed: update podCompleteStage")
	}
	return strings.Replace(podfast.DefaultPodComplete, owner, owner+`    - key: '.metadata.annotations["`+KeepRunningAnnotation+`"]'
      operator: 'DoesNotExist'
`, 1)
}

// nodeHeartbeatDelay is the delay of kwok's stock heartbeat stage (a node's
// status every 600 s, up to 10 s later).
const nodeHeartbeatDelay = `  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 610000
`

// nodeHeartbeatStage is kwok's stock heartbeat-with-lease stage, updating a
// Ready node's status every interval (up to 10 s later); 0 keeps the
// stock 600 s.
func nodeHeartbeatStage(interval time.Duration) string {
	if !strings.Contains(nodeheartbeat.DefaultNodeHeartbeatWithLease, nodeHeartbeatDelay) {
		panic("kwok's node heartbeat stage changed: update nodeHeartbeatStage")
	}
	if interval <= 0 {
		return nodeheartbeat.DefaultNodeHeartbeatWithLease
	}
	ms := interval.Milliseconds()
	return strings.Replace(nodeheartbeat.DefaultNodeHeartbeatWithLease, nodeHeartbeatDelay, fmt.Sprintf(`  delay:
    durationMilliseconds: %d
    jitterDurationMilliseconds: %d
`, ms, ms+10000), 1)
}

// kwokStages returns kwok's options and stages as one multi-document YAML:
// its stock "fast" stages, by which nodes become Ready at once and keep a
// heartbeat (kwok renews their Leases, see --node-lease-duration-seconds,
// and updates their status every statusInterval, 0 for the stock 600 s),
// pods become Running as soon as they are bound and Jobs' pods complete
// (but those with KeepRunningAnnotation), and podDeleteStages, by which
// deleted pods go away when their process would have exited.
func kwokStages(statusInterval time.Duration) string {
	docs := []string{
		kwokOptions,
		nodefast.DefaultNodeInit,
		nodeHeartbeatStage(statusInterval),
		podfast.DefaultPodReady,
		podCompleteStage(),
		podDeleteStages,
	}
	for i, d := range docs {
		docs[i] = strings.TrimSpace(d)
	}
	return strings.Join(docs, "\n---\n") + "\n"
}

// writeKwokConfig writes the stage configuration that kwok's --config reads.
func writeKwokConfig(path string, statusInterval time.Duration) error {
	if err := os.WriteFile(path, []byte(kwokStages(statusInterval)), 0o644); err != nil {
		return fmt.Errorf("writing kwok stages: %w", err)
	}
	return nil
}
