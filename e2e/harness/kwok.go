package harness

import (
	"fmt"
	"os"
	"strings"

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

// kwokStages returns kwok's options and its stock "fast" stages as one
// multi-document YAML: nodes become Ready at once and keep a heartbeat
// (kwok renews their Leases, see --node-lease-duration-seconds), pods
// become Running as soon as they are bound, Jobs' pods complete, and
// deleted pods go away.
func kwokStages() string {
	docs := []string{
		kwokOptions,
		nodefast.DefaultNodeInit,
		nodeheartbeat.DefaultNodeHeartbeatWithLease,
		podfast.DefaultPodReady,
		podfast.DefaultPodComplete,
		podfast.DefaultPodDelete,
	}
	for i, d := range docs {
		docs[i] = strings.TrimSpace(d)
	}
	return strings.Join(docs, "\n---\n") + "\n"
}

// writeKwokConfig writes the stage configuration that kwok's --config reads.
func writeKwokConfig(path string) error {
	if err := os.WriteFile(path, []byte(kwokStages()), 0o644); err != nil {
		return fmt.Errorf("writing kwok stages: %w", err)
	}
	return nil
}
