package simulator

import (
	"encoding/json"
	"hash"
	"hash/fnv"
	"io"
	"sort"
	"strconv"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	fwk "k8s.io/kube-scheduler/framework"
	schedframework "k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// Request is a pod's resource request in the units of snapshot.Free.
type Request struct {
	MilliCPU         int64
	Memory           int64
	EphemeralStorage int64
	GPU              int64
	// OtherScalar is set when the pod asks for an extended resource other
	// than the GPU one; such pods are always checked by the full Filter.
	OtherScalar bool
}

// RequestOf computes a pod's request with the same arithmetic as the
// scheduler's NodeResourcesFit plugin (resourcehelper.PodRequests, overhead
// included), so a pre-check with it never rejects a node the plugin accepts.
func RequestOf(pod *apiv1.Pod, gpu apiv1.ResourceName) Request {
	rl := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	r := Request{}
	for name, q := range rl {
		switch name {
		case apiv1.ResourceCPU:
			r.MilliCPU = q.MilliValue()
		case apiv1.ResourceMemory:
			r.Memory = q.Value()
		case apiv1.ResourceEphemeralStorage:
			r.EphemeralStorage = q.Value()
		case gpu:
			r.GPU = q.Value()
		default:
			if !q.IsZero() {
				r.OtherScalar = true
			}
		}
	}
	return r
}

// Fits is the cheap resource pre-check: false means NodeResourcesFit would
// reject the pod on a node with this free capacity.
func (r Request) Fits(f snapshot.Free) bool {
	if f.Pods < 1 {
		return false
	}
	if r.MilliCPU > 0 && r.MilliCPU > f.MilliCPU {
		return false
	}
	if r.Memory > 0 && r.Memory > f.Memory {
		return false
	}
	if r.EphemeralStorage > 0 && r.EphemeralStorage > f.EphemeralStorage {
		return false
	}
	if r.GPU > 0 && r.GPU > f.GPU {
		return false
	}
	return true
}

// Group is a set of equivalent pods: same controller and same scheduling
// spec, so one simulation answers for all of them.
type Group struct {
	Pods []*apiv1.Pod
	Req  Request
	// Simple pods have no inter-pod (anti-)affinity, no hard topology spread,
	// no host ports and no extended resources besides GPUs: once a node passed
	// Filter for one of them, only its free capacity decides for the next.
	Simple bool
	key    string
	infos  []fwk.PodInfo
}

// Rep is the group's representative pod.
func (g *Group) Rep() *apiv1.Pod { return g.Pods[0] }

// PodInfo returns the framework's PodInfo of pod i, built once; pods whose
// resource fields equal the representative's share its resource sums.
func (g *Group) PodInfo(i int) fwk.PodInfo {
	if g.infos == nil {
		g.infos = make([]fwk.PodInfo, len(g.Pods))
	}
	if g.infos[i] == nil {
		var like fwk.PodInfo
		if i > 0 {
			like = g.PodInfo(0)
		}
		pi, err := snapshot.PodInfoLike(g.Pods[i], like)
		if err != nil {
			// NewPodInfo fails only on unparsable affinity selectors, which the
			// API server's validation rejects; keep the pod without the terms.
			pi = &schedframework.PodInfo{Pod: g.Pods[i]}
		}
		g.infos[i] = pi
	}
	return g.infos[i]
}

// GroupPods splits pods into equivalence groups, largest request first (the
// order in which binpacking wastes least), ties by key for stable results.
func GroupPods(pods []*apiv1.Pod, gpu apiv1.ResourceName) []*Group {
	byKey := map[string]*Group{}
	var out []*Group
	for _, p := range pods {
		k := equivalenceKey(p)
		g := byKey[k]
		if g == nil {
			g = &Group{key: k, Req: RequestOf(p, gpu), Simple: isSimple(p)}
			g.Simple = g.Simple && !g.Req.OtherScalar
			byKey[k] = g
			out = append(out, g)
		}
		g.Pods = append(g.Pods, p)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Req, out[j].Req
		if a.GPU != b.GPU {
			return a.GPU > b.GPU
		}
		if a.MilliCPU != b.MilliCPU {
			return a.MilliCPU > b.MilliCPU
		}
		if a.Memory != b.Memory {
			return a.Memory > b.Memory
		}
		return out[i].key < out[j].key
	})
	return out
}

func isSimple(p *apiv1.Pod) bool {
	if a := p.Spec.Affinity; a != nil && (a.PodAffinity != nil || a.PodAntiAffinity != nil) {
		return false
	}
	for _, c := range p.Spec.TopologySpreadConstraints {
		if c.WhenUnsatisfiable == apiv1.DoNotSchedule {
			return false
		}
	}
	return !hasHostPort(p.Spec.Containers) && !hasHostPort(p.Spec.InitContainers)
}

// hasHostPort says whether a container asks for a host port.
func hasHostPort(cs []apiv1.Container) bool {
	for _, c := range cs {
		for _, port := range c.Ports {
			if port.HostPort > 0 {
				return true
			}
		}
	}
	return false
}

// perPodLabels differ between otherwise identical pods and do not affect
// where they can be scheduled.
func isPerPodLabel(k string) bool {
	switch k {
	case "statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index", "batch.kubernetes.io/job-completion-index", "job-completion-index":
		return true
	}
	return false
}

// equivalenceKey identifies what the simulated plugins look at: controller,
// namespace, labels, priority and the spec fields Filter plugins read.
// Volumes are left out (each pod has its own token volume, and volume
// plugins are not simulated). Pods without a controller are never grouped.
func equivalenceKey(p *apiv1.Pod) string {
	k := keyWriter{fnv.New128a()}
	if ref := metav1.GetControllerOf(p); ref != nil {
		k.w(string(ref.UID))
	} else {
		k.w("pod:" + string(p.UID))
	}
	k.w(p.Namespace)
	k.labels(p.Labels)
	k.w(p.Spec.SchedulerName)
	if p.Spec.Priority != nil {
		k.w(strconv.FormatInt(int64(*p.Spec.Priority), 10))
	}
	k.w(p.Spec.NodeName)
	k.containers(p.Spec.InitContainers)
	k.w("init-end")
	k.containers(p.Spec.Containers)
	k.w("containers-end")
	// The rarely-set structured fields are encoded as JSON only when present.
	k.json("ns", p.Spec.NodeSelector, len(p.Spec.NodeSelector) > 0)
	k.json("aff", p.Spec.Affinity, p.Spec.Affinity != nil)
	k.json("tol", p.Spec.Tolerations, len(p.Spec.Tolerations) > 0)
	k.json("tsc", p.Spec.TopologySpreadConstraints, len(p.Spec.TopologySpreadConstraints) > 0)
	k.json("ovh", p.Spec.Overhead, len(p.Spec.Overhead) > 0)
	k.json("res", p.Spec.Resources, p.Spec.Resources != nil)
	return string(k.h.Sum(nil))
}

// keyWriter hashes an equivalence key: fields each followed by a NUL
// byte.
type keyWriter struct{ h hash.Hash }

func (k keyWriter) w(s string) { _, _ = io.WriteString(k.h, s); _, _ = k.h.Write([]byte{0}) }

// labels writes the labels, but the per-pod ones, by key.
func (k keyWriter) labels(labels map[string]string) {
	keys := make([]string, 0, len(labels))
	for l := range labels {
		if !isPerPodLabel(l) {
			keys = append(keys, l)
		}
	}
	sort.Strings(keys)
	for _, l := range keys {
		k.w(l)
		k.w(labels[l])
	}
}

// containers writes each container's requests, limits, host ports and
// restart policy.
func (k keyWriter) containers(cs []apiv1.Container) {
	for _, c := range cs {
		for _, rl := range []apiv1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			k.resources(rl)
			k.w("|")
		}
		for _, port := range c.Ports {
			k.w(strconv.Itoa(int(port.HostPort)) + "/" + string(port.Protocol) + "/" + port.HostIP)
		}
		if c.RestartPolicy != nil {
			k.w(string(*c.RestartPolicy))
		}
		k.w("||")
	}
}

// resources writes a resource list, by name.
func (k keyWriter) resources(rl apiv1.ResourceList) {
	names := make([]string, 0, len(rl))
	for n := range rl {
		names = append(names, string(n))
	}
	sort.Strings(names)
	for _, n := range names {
		q := rl[apiv1.ResourceName(n)]
		k.w(n)
		k.w(q.String())
	}
}

// json writes tag and v as JSON (the error's text if it has none) when
// present.
func (k keyWriter) json(tag string, v any, present bool) {
	if !present {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(err.Error())
	}
	k.w(tag)
	_, _ = k.h.Write(b)
}
