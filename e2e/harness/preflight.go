package harness

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RunPreflightAgents plays the preflight agent's DaemonSet: until ctx ends
// it polls for nodes matching selector (the pending label) and starts, once
// per node, bin's preflight subcommand (the real agent) against the API
// server with the checks file checksFor returns; "" skips the node. started
// (may be nil) gets each process; the agents, like DaemonSet pods, keep
// running after they report, until the caller or Stop ends them. A failed
// start is handed to started as a nil process and its error.
func (cp *ControlPlane) RunPreflightAgents(ctx context.Context, bin, selector string, checksFor func(*corev1.Node) string,
	started func(*Process, error)) {
	seen := map[string]bool{}
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		nodes, err := cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			for i := range nodes.Items {
				n := &nodes.Items[i]
				if seen[n.Name] {
					continue
				}
				seen[n.Name] = true
				checks := checksFor(n)
				if checks == "" {
					continue
				}
				p, err := cp.StartProcess(ctx, "agent-"+n.Name, bin, "preflight", "--kubeconfig="+cp.Kubeconfig,
					"--node-name="+n.Name, "--checks="+checks)
				if started != nil {
					started(p, err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
