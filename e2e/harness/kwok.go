package harness

import (
	"fmt"
	"os"
	"strings"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
)

// kwokStages returns kwok's stock "fast" stages as one multi-document YAML:
// nodes become Ready at once and keep a heartbeat (kwok renews their Leases,
// see --node-lease-duration-seconds), pods become Running as soon as they
// are bound, Jobs' pods complete, and deleted pods go away.
func kwokStages() string {
	docs := []string{
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
