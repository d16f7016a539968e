package core

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// templates builds each group's template NodeInfo: the provider's template
// node plus the DaemonSet pods that would run on it, as decided by the
// scheduler framework. Results are cached until the template or the
// DaemonSets change.
type templates struct {
	cache map[string]templateEntry
}

type templateEntry struct {
	sig  uint64
	info fwk.NodeInfo
}

func newTemplates() *templates { return &templates{cache: map[string]templateEntry{}} }

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

// build returns the template NodeInfo for a group.
func (t *templates) build(ctx context.Context, a *Autoscaler, g cloudprovider.NodeGroup, dss []*appsv1.DaemonSet) (fwk.NodeInfo, error) {
	node, err := g.TemplateNode()
	if err != nil {
		return nil, fmt.Errorf("template node of group %s: %w", g.ID(), err)
	}
	// Pods wait for preflight; they never need to tolerate it.
	a.opts.Preflight.StripTemplate(node)
	stripStatusTaints(node, a.opts.StatusTaints)
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
