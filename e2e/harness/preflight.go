package harness

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RunPreflightAgents plays the preflight agent's DaemonSet, whose
// nodeSelector is the pending label: until ctx ends it polls for nodes
// matching selector and starts, on a node that has none, bin's preflight
// subcommand (the real agent) against the API server with the checks file
// checksFor returns; "" skips the node. An agent is stopped when its node
// no longer matches (passed, failed or gone: the DaemonSet controller
// deletes the pod), and a node that matches again (a repair sent it
// through preflight again) gets a new one. started (may be nil) gets each
// process; a failed start is handed to it as a nil process and its error.
func (cp *ControlPlane) RunPreflightAgents(ctx context.Context, bin, selector string, checksFor func(*corev1.Node) string,
	started func(*Process, error)) {
	running := map[string]*Process{} // node → its agent; nil: none wanted
	runs := map[string]int{}
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		nodes, err := cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			listed := map[string]bool{}
			for i := range nodes.Items {
				n := &nodes.Items[i]
				listed[n.Name] = true
				if _, ok := running[n.Name]; ok {
					continue
				}
				running[n.Name] = nil
				checks := checksFor(n)
				if checks == "" {
					continue
				}
				runs[n.Name]++
				p, err := cp.StartProcess(ctx, fmt.Sprintf("agent-%s-%d", n.Name, runs[n.Name]), bin, "preflight", "--kubeconfig="+cp.Kubeconfig,
					"--node-name="+n.Name, "--checks="+checks)
				if err == nil {
					running[n.Name] = p
				}
				if started != nil {
					started(p, err)
				}
			}
			for name, p := range running {
				if listed[name] {
					continue
				}
				if p != nil {
					_ = p.Stop()
				}
				delete(running, name)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
