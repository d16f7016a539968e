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
	a := &preflightAgents{cp: cp, bin: bin, checksFor: checksFor, started: started, running: map[string]*Process{}, runs: map[string]int{}}
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		nodes, err := cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			a.sync(ctx, nodes.Items)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// preflightAgents are RunPreflightAgents' agents, by node.
type preflightAgents struct {
	cp        *ControlPlane
	bin       string
	checksFor func(*corev1.Node) string
	started   func(*Process, error)
	running   map[string]*Process // node → its agent; nil: none wanted
	runs      map[string]int
}

// sync starts an agent on each node of nodes seen for the first time,
// and stops those of the nodes no longer listed.
func (a *preflightAgents) sync(ctx context.Context, nodes []corev1.Node) {
	listed := map[string]bool{}
	for i := range nodes {
		n := &nodes[i]
		listed[n.Name] = true
		if _, ok := a.running[n.Name]; ok {
			continue
		}
		a.start(ctx, n)
	}
	for name, p := range a.running {
		if listed[name] {
			continue
		}
		if p != nil {
			_ = p.Stop()
		}
		delete(a.running, name)
	}
}

// start starts n's agent with the checks checksFor gives it, if any, and
// hands it to started.
func (a *preflightAgents) start(ctx context.Context, n *corev1.Node) {
	a.running[n.Name] = nil
	checks := a.checksFor(n)
	if checks == "" {
		return
	}
	a.runs[n.Name]++
	p, err := a.cp.StartProcess(ctx, fmt.Sprintf("agent-%s-%d", n.Name, a.runs[n.Name]), a.bin, "preflight", "--kubeconfig="+a.cp.Kubeconfig,
		"--node-name="+n.Name, "--checks="+checks)
	if err == nil {
		a.running[n.Name] = p
	}
	if a.started != nil {
		a.started(p, err)
	}
}
