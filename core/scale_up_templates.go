package core

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// templates builds each group's template NodeInfo, as cluster-autoscaler
// does: a sanitized copy of one of the group's usable nodes when it has one
// (its real allocatable, labels and taints) that is not degraded (see
// degraded), else the provider's template
// (the VM size less the reserved-resource estimate), plus the DaemonSet
// pods that would run on it, as decided by the scheduler framework. Results
// are cached until the template or the DaemonSets change.
type templates struct {
	cache map[string]templateEntry
	// learned is, per group, the node the template was last learned from:
	// kept while it stays usable, so the template does not flap.
	learned map[string]string
}

type templateEntry struct {
	sig  uint64
	info fwk.NodeInfo
}

func newTemplates() *templates {
	return &templates{cache: map[string]templateEntry{}, learned: map[string]string{}}
}

// Template sources, for the status.
const (
	templateFromSKU  = "sku"
	templateFromNode = "node/"
)

// daemonSetTolerations are the tolerations the DaemonSet controller adds to
// every DaemonSet pod.
func daemonSetTolerations() []apiv1.Toleration {
	keys := []struct {
		key    string
		effect apiv1.TaintEffect
	}{
		{apiv1.TaintNodeNotReady, apiv1.TaintEffectNoExecute},
		{apiv1.TaintNodeUnreachable, apiv1.TaintEffectNoExecute},
		{apiv1.TaintNodeDiskPressure, apiv1.TaintEffectNoSchedule},
		{apiv1.TaintNodeMemoryPressure, apiv1.TaintEffectNoSchedule},
		{apiv1.TaintNodePIDPressure, apiv1.TaintEffectNoSchedule},
		{apiv1.TaintNodeUnschedulable, apiv1.TaintEffectNoSchedule},
	}
	out := make([]apiv1.Toleration, 0, len(keys))
	for _, k := range keys {
		out = append(out, apiv1.Toleration{Key: k.key, Operator: apiv1.TolerationOpExists, Effect: k.effect})
	}
	return out
}

// daemonSetPod is the pod a DaemonSet would create on node.
func daemonSetPod(ds *appsv1.DaemonSet, node string) *apiv1.Pod {
	t := true
	p := &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      ds.Name + "-" + node,
			Namespace: ds.Namespace,
			UID:       types.UID(string(ds.UID) + "-" + node),
			Labels:    ds.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet",
				Name: ds.Name, UID: ds.UID, Controller: &t}},
		},
		Spec: *ds.Spec.Template.Spec.DeepCopy(),
	}
	p.Spec.Tolerations = append(p.Spec.Tolerations, daemonSetTolerations()...)
	return p
}

// source names the node a group's template is learned from
// ("node/<name>"), or "sku" when the group has no usable node, and returns
// that node (nil for the SKU).
func (t *templates) source(a *Autoscaler, l *loop, g cloudprovider.NodeGroup) (string, *apiv1.Node) {
	nodes := l.nodesOf[g.ID()]
	if n := t.stillLearned(a, l, g.ID(), nodes); n != nil {
		return templateFromNode + n.Name, n
	}
	var pick *apiv1.Node
	for _, n := range nodes {
		if (pick == nil || n.Name < pick.Name) && a.templateEligible(l, n) {
			pick = n
		}
	}
	if pick == nil {
		delete(t.learned, g.ID())
		return templateFromSKU, nil
	}
	t.learned[g.ID()] = pick.Name
	return templateFromNode + pick.Name, pick
}

// stillLearned is the node the group's template was last learned from, when it
// is among its nodes and still eligible; nil otherwise.
func (t *templates) stillLearned(a *Autoscaler, l *loop, group string, nodes []*apiv1.Node) *apiv1.Node {
	name, ok := t.learned[group]
	if !ok {
		return nil
	}
	for _, n := range nodes {
		if n.Name == name && a.templateEligible(l, n) {
			return n
		}
	}
	return nil
}

// templateEligible says a template may be learned from node n: usable,
// schedulable, not being deleted, and not degraded. A degraded node (7 of
// its 8 GPUs advertised) is never the template: learned from it, no new
// node would be believed to fit a whole-node pod, and such pods would
// wait for ever.
func (a *Autoscaler) templateEligible(l *loop, n *apiv1.Node) bool {
	return a.usable(l, n) && !n.Spec.Unschedulable && !actuation.HasTaintKey(n, scaledown.ToBeDeletedTaint) &&
		!a.machineDeleted(n.Name) && len(a.degraded(l, n)) == 0
}

// build returns the template NodeInfo for a group.
func (t *templates) build(ctx context.Context, a *Autoscaler, l *loop, g cloudprovider.NodeGroup, dss []*appsv1.DaemonSet) (fwk.NodeInfo, error) {
	var node *apiv1.Node
	if _, live := t.source(a, l, g); live != nil {
		node = a.sanitize(live, g.ID())
	} else {
		var err error
		if node, err = g.TemplateNode(); err != nil {
			return nil, fmt.Errorf("template node of group %s: %w", g.ID(), err)
		}
	}
	// Pods wait for preflight and for startup; they never need to
	// tolerate either.
	a.opts.Preflight.StripTemplate(node)
	stripTaints(node, func(key string) bool {
		return a.opts.startupOptions().IsStartupTaint(key) || slices.Contains(a.opts.StatusTaints, key)
	})
	node.Name = "template-" + g.ID()
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	node.Labels[apiv1.LabelHostname] = node.Name
	sig := signature(node, dss)
	if e, ok := t.cache[g.ID()]; ok && e.sig == sig {
		return e.info, nil
	}
	base := snapshot.NewNodeInfo(node)
	probe := snapshot.New([]fwk.NodeInfo{base}, a.opts.GPUResourceName).Fork()
	var pods []*apiv1.Pod
	for _, ds := range dss {
		p := daemonSetPod(ds, node.Name)
		if a.sim.CheckPod(ctx, probe, p, 0) == nil {
			pods = append(pods, p)
		}
	}
	info := snapshot.NewNodeInfo(node, pods...)
	t.cache[g.ID()] = templateEntry{sig: sig, info: info}
	return info, nil
}

// sanitize turns a live node into a template: its labels, taints, capacity
// and allocatable, without what belongs to that node alone (its name and
// hostname, its pods, its conditions, and the taints of its moment:
// lifecycle, cordon, scale-down's own).
func (a *Autoscaler) sanitize(n *apiv1.Node, group string) *apiv1.Node {
	out := &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "template-" + group, Labels: maps.Clone(n.Labels)},
		Status: apiv1.NodeStatus{
			Capacity:    n.Status.Capacity.DeepCopy(),
			Allocatable: n.Status.Allocatable.DeepCopy(),
			Conditions:  []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionTrue}},
		},
	}
	for _, t := range n.Spec.Taints {
		switch {
		case t.Key == scaledown.ToBeDeletedTaint, t.Key == scaledown.DeletionCandidateTaint,
			strings.HasPrefix(t.Key, "node.kubernetes.io/"), strings.HasPrefix(t.Key, "node.cloudprovider.kubernetes.io/"):
			continue
		}
		out.Spec.Taints = append(out.Spec.Taints, t)
	}
	return out
}

// signature identifies a template node and the DaemonSets it was built with.
func signature(node *apiv1.Node, dss []*appsv1.DaemonSet) uint64 {
	h := fnv.New64a()
	b, _ := json.Marshal(node)
	_, _ = h.Write(b)
	for _, ds := range dss {
		_, _ = h.Write([]byte(string(ds.UID) + "/" + ds.ResourceVersion + "/" + fmt.Sprint(ds.Generation)))
	}
	return h.Sum64()
}
