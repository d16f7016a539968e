package clusterstate

import (
	"fmt"
	"strings"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// StartupTaintPrefix marks a startup taint by its key, as in
// cluster-autoscaler: an agent removes it once the node is set up.
const StartupTaintPrefix = "startup-taint.cluster-autoscaler.kubernetes.io/"

// StartupOptions say which nodes are Ready but not capacity yet: a node
// carrying a startup taint (a network agent's, say, until it runs), or a
// node of a GPU group whose device plugin has not advertised its GPUs. Such
// a node is coming capacity, like a node still booting: counted upcoming
// until --max-node-startup-time, then unready.
type StartupOptions struct {
	// TaintKeys are startup taints (--startup-taint); keys with
	// StartupTaintPrefix are startup taints too.
	TaintKeys []string
	// GPUResource is the extended resource a GPU node advertises.
	GPUResource apiv1.ResourceName
	// GPULabel marks a GPU node before its GPUs are advertised
	// (kubernetes.azure.com/accelerator on AKS).
	GPULabel string
}

// IsStartupTaint says a taint key is a startup taint.
func (o StartupOptions) IsStartupTaint(key string) bool {
	if strings.HasPrefix(key, StartupTaintPrefix) {
		return true
	}
	for _, k := range o.TaintKeys {
		if k == key {
			return true
		}
	}
	return false
}

// Pending says why a node is not capacity yet, or "". gpuGroup says the
// node's group makes GPU nodes (its template has GPUs or the GPU label).
func (o StartupOptions) Pending(n *apiv1.Node, gpuGroup bool) string {
	for _, t := range n.Spec.Taints {
		if o.IsStartupTaint(t.Key) {
			return fmt.Sprintf("startup taint %s", t.Key)
		}
	}
	if o.GPUResource == "" || !(gpuGroup || (o.GPULabel != "" && n.Labels[o.GPULabel] != "")) {
		return ""
	}
	if q, ok := n.Status.Allocatable[o.GPUResource]; !ok || q.IsZero() {
		return fmt.Sprintf("no %s advertised yet", o.GPUResource)
	}
	return ""
}

// isGPUGroup says a group's template has GPUs or the GPU label.
func (o StartupOptions) isGPUGroup(g cloudprovider.NodeGroup) bool {
	if o.GPUResource == "" {
		return false
	}
	tmpl, err := g.TemplateNode()
	if err != nil || tmpl == nil {
		return false
	}
	if q, ok := tmpl.Status.Allocatable[o.GPUResource]; ok && !q.IsZero() {
		return true
	}
	return o.GPULabel != "" && tmpl.Labels[o.GPULabel] != ""
}
