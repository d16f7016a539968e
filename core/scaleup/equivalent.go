package scaleup

import (
	"sort"
	"strconv"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// Clusters of this size run many scale sets of one VM size (a Uniform
// scale set holds at most 1,000 VMs, and capacity comes per zone or per
// placement group), so a planning round meets the same template ten times
// over. An estimate depends on the pending pods, the fork, the group's
// limit and what its template looks like to the scheduler's filters —
// not on the group's name. Candidates whose templates are equal in every
// part the filters can read for these pods (equivalentClasses) get one
// estimate per round, made for the class's first group by ID and offered
// to the expander under each group's name; the group the expander picks
// is estimated for itself when it is not that first one, so the fork
// carried to the next round holds its own nodes.

// equivalentClasses returns each candidate's class key for the pending
// pods on fork: candidates with equal keys have equal estimates. A
// candidate that may be like no other (a Refuse rule, a template the key
// cannot fully describe) gets "".
func equivalentClasses(fork *snapshot.Fork, pending []Pending, cands []Candidate) map[string]string {
	refs, volumes := referencedNodeLabels(fork, pending)
	out := make(map[string]string, len(cands))
	for _, c := range cands {
		if c.Template == nil || c.Skip != "" || c.Refuse != nil {
			continue
		}
		if k := templateKey(c.Template, func(label string) bool {
			// A clone gets its own hostname; with volumes, any label may be
			// a volume's topology (zone, a CSI driver's own key).
			return label != apiv1.LabelHostname && (volumes || refs[label])
		}); k != "" {
			out[c.Group] = strconv.FormatBool(c.GPUPodsOnly) + "\x00" + k
		}
	}
	return out
}

// referencedNodeLabels lists the node label keys the filters can read for
// the pending pods: their node selectors, node affinity, spread and pod
// (anti-)affinity topology keys, and the topology keys of the required
// anti-affinity of pods already in the fork (which keep matching pods off
// a whole domain). volumes says a pending pod has a volume claim, whose
// volume's node affinity may read any label.
func referencedNodeLabels(fork *snapshot.Fork, pending []Pending) (map[string]bool, bool) {
	refs := labelRefs{}
	volumes := false
	for _, pg := range pending {
		p := pg.G.Rep()
		refs.pod(p)
		volumes = volumes || hasVolumeClaim(p)
	}
	refs.requiredAntiAffinity(fork)
	return refs, volumes
}

// labelRefs is a set of node label keys the filters can read.
type labelRefs map[string]bool

// pod adds the keys of a pod's node selector, spread constraints and
// affinity.
func (refs labelRefs) pod(p *apiv1.Pod) {
	for k := range p.Spec.NodeSelector {
		refs[k] = true
	}
	for _, c := range p.Spec.TopologySpreadConstraints {
		refs[c.TopologyKey] = true
	}
	if a := p.Spec.Affinity; a != nil {
		refs.nodeAffinity(a.NodeAffinity)
		if pa := a.PodAffinity; pa != nil {
			refs.terms(pa.RequiredDuringSchedulingIgnoredDuringExecution)
			refs.weighted(pa.PreferredDuringSchedulingIgnoredDuringExecution)
		}
		if pa := a.PodAntiAffinity; pa != nil {
			refs.terms(pa.RequiredDuringSchedulingIgnoredDuringExecution)
			refs.weighted(pa.PreferredDuringSchedulingIgnoredDuringExecution)
		}
	}
}

// nodeAffinity adds the keys of a node affinity's required and preferred
// terms.
func (refs labelRefs) nodeAffinity(na *apiv1.NodeAffinity) {
	if na == nil {
		return
	}
	if na.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		refs.selector(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms)
	}
	for _, t := range na.PreferredDuringSchedulingIgnoredDuringExecution {
		refs.selector([]apiv1.NodeSelectorTerm{t.Preference})
	}
}

// terms adds the topology keys of pod (anti-)affinity terms.
func (refs labelRefs) terms(terms []apiv1.PodAffinityTerm) {
	for _, t := range terms {
		refs[t.TopologyKey] = true
	}
}

// weighted adds the topology keys of weighted pod (anti-)affinity terms.
func (refs labelRefs) weighted(terms []apiv1.WeightedPodAffinityTerm) {
	for _, t := range terms {
		refs[t.PodAffinityTerm.TopologyKey] = true
	}
}

// selector adds the keys node selector terms match on.
func (refs labelRefs) selector(terms []apiv1.NodeSelectorTerm) {
	for _, t := range terms {
		for _, r := range t.MatchExpressions {
			refs[r.Key] = true
		}
	}
}

// requiredAntiAffinity adds the topology keys of the required
// anti-affinity of the pods in fork.
func (refs labelRefs) requiredAntiAffinity(fork *snapshot.Fork) {
	anti, _ := fork.NodeInfos().HavePodsWithRequiredAntiAffinityList()
	for _, n := range anti {
		for _, pi := range n.GetPodsWithRequiredAntiAffinity() {
			for _, t := range pi.GetRequiredAntiAffinityTerms() {
				refs[t.TopologyKey] = true
			}
		}
	}
}

// hasVolumeClaim says whether a pod has a volume claim (persistent or
// ephemeral).
func hasVolumeClaim(p *apiv1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			return true
		}
	}
	return false
}

// templateKey describes a template as the filters see it: its taints,
// unschedulable bit, allocatable resources, the labels keep says matter,
// and its DaemonSet pods' requests. A template whose pods carry pod
// (anti-)affinity, host ports or volume claims gets "" (never equivalent).
func templateKey(tmpl fwk.NodeInfo, keep func(label string) bool) string {
	if len(tmpl.GetPodsWithAffinity()) > 0 || len(tmpl.GetPodsWithRequiredAntiAffinity()) > 0 || len(tmpl.GetPVCRefCounts()) > 0 || len(tmpl.GetUsedPorts()) > 0 {
		return ""
	}
	n := tmpl.Node()
	var b keyBuilder
	b.w("unschedulable", strconv.FormatBool(n.Spec.Unschedulable))
	for _, t := range n.Spec.Taints {
		b.w("taint", t.Key, t.Value, string(t.Effect))
	}
	b.allocatable(n)
	b.labels(n, keep)
	b.requests(tmpl)
	return b.String()
}

// keyBuilder writes a template key: fields separated by NUL bytes.
type keyBuilder struct{ strings.Builder }

func (b *keyBuilder) w(s ...string) {
	for _, x := range s {
		b.WriteString(x)
		b.WriteByte(0)
	}
}

// allocatable writes the node's allocatable resources, by name.
func (b *keyBuilder) allocatable(n *apiv1.Node) {
	names := make([]string, 0, len(n.Status.Allocatable))
	for r := range n.Status.Allocatable {
		names = append(names, string(r))
	}
	sort.Strings(names)
	for _, r := range names {
		q := n.Status.Allocatable[apiv1.ResourceName(r)]
		b.w("alloc", r, q.String())
	}
}

// labels writes the node's labels keep says matter, by key.
func (b *keyBuilder) labels(n *apiv1.Node, keep func(label string) bool) {
	labels := make([]string, 0, len(n.Labels))
	for k := range n.Labels {
		if keep(k) {
			labels = append(labels, k)
		}
	}
	sort.Strings(labels)
	for _, k := range labels {
		b.w("label", k, n.Labels[k])
	}
}

// requests writes the template's pods' count and requests, scalar
// resources by name.
func (b *keyBuilder) requests(tmpl fwk.NodeInfo) {
	req := tmpl.GetRequested()
	b.w("pods", strconv.Itoa(len(tmpl.GetPods())), strconv.FormatInt(req.GetMilliCPU(), 10), strconv.FormatInt(req.GetMemory(), 10),
		strconv.FormatInt(req.GetEphemeralStorage(), 10))
	scalars := make([]string, 0, len(req.GetScalarResources()))
	for r := range req.GetScalarResources() {
		scalars = append(scalars, string(r))
	}
	sort.Strings(scalars)
	for _, r := range scalars {
		b.w("req", r, strconv.FormatInt(req.GetScalarResources()[apiv1.ResourceName(r)], 10))
	}
}
