// Package scaledown decides which nodes the cluster no longer needs: it
// measures utilisation, checks that every pod on a node may be evicted and
// has somewhere else to run (simulated with the scheduler framework), keeps
// each node's unneeded time, and holds a safety brake on how much of the
// cluster may be deleted within a window.
package scaledown

import (
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	resourcehelper "k8s.io/component-helpers/resource"
)

// Well-known names, as in cluster-autoscaler.
const (
	// SafeToEvictAnnotation on a pod: "true" lets it be evicted whatever the
	// other rules say; "false" keeps its node.
	SafeToEvictAnnotation = "cluster-autoscaler.kubernetes.io/safe-to-evict"
	// ScaleDownDisabledAnnotation on a node keeps it.
	ScaleDownDisabledAnnotation = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
	// ToBeDeletedTaint marks a node being drained and deleted.
	ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"
	// DeletionCandidateTaint softly steers new pods away from unneeded nodes.
	DeletionCandidateTaint = "DeletionCandidateOfClusterAutoscaler"
	mirrorPodAnnotation    = "kubernetes.io/config.mirror"
)

// Reason says why a node is kept. The values are metric labels.
type Reason string

// Reasons a node is not removed.
const (
	ReasonNone              Reason = ""
	ReasonDisabled          Reason = "scale-down-disabled"
	ReasonBeingDeleted      Reason = "being-deleted"
	ReasonHighUtilization   Reason = "utilization-high"
	ReasonMinSize           Reason = "min-size"
	ReasonNotReplicated     Reason = "not-replicated"
	ReasonKubeSystem        Reason = "kube-system-pod"
	ReasonLocalStorage      Reason = "local-storage"
	ReasonSafeToEvictFalse  Reason = "safe-to-evict-false"
	ReasonPDB               Reason = "pdb"
	ReasonNoPlaceToMove     Reason = "no-place-to-move"
	ReasonRecentScaleUp     Reason = "recent-scale-up"
	ReasonBrake             Reason = "brake"
	ReasonGroupUnhealthy    Reason = "group-unhealthy"
	ReasonParallelism       Reason = "parallelism-limit"
	ReasonUnneededTimeShort Reason = "unneeded-time-not-reached"
	ReasonSizeUnknown       Reason = "size-unknown"
)

// Rules are the eligibility settings.
type Rules struct {
	SkipNodesWithSystemPods   bool
	SkipNodesWithLocalStorage bool
	// EvictScratch lets a pod whose only local storage is emptyDir be
	// evicted despite SkipNodesWithLocalStorage: a node judged broken
	// takes its emptyDir data with it anyway (a health replace rule's
	// evictLocalScratch). hostPath still holds the node.
	EvictScratch bool
	// IsFreeRoom reports pods whose room counts as free (balloons): they
	// do not count in utilisation, so they never make a node needed on their
	// own; but they must find room elsewhere for their node to go (a
	// balloon that cannot move is warm capacity lost), and they are evicted
	// with no grace period. Nil: none.
	IsFreeRoom func(*apiv1.Pod) bool
}

// IsDaemonSetPod reports pods owned by a DaemonSet.
func IsDaemonSetPod(p *apiv1.Pod) bool {
	ref := controllerOf(p)
	return ref != nil && ref.Kind == "DaemonSet"
}

// controllerOf is metav1.GetControllerOf without its copy (which was a
// third of the steady loop's allocations at 200,000 pods): the pod's own
// controller reference, or nil. Callers must not change it.
func controllerOf(p *apiv1.Pod) *metav1.OwnerReference {
	for i := range p.OwnerReferences {
		if r := &p.OwnerReferences[i]; r.Controller != nil && *r.Controller {
			return r
		}
	}
	return nil
}

// IsMirrorPod reports static pods' mirrors.
func IsMirrorPod(p *apiv1.Pod) bool {
	_, ok := p.Annotations[mirrorPodAnnotation]
	return ok
}

func terminal(p *apiv1.Pod) bool {
	return p.Status.Phase == apiv1.PodSucceeded || p.Status.Phase == apiv1.PodFailed
}

// Utilization is a node's highest share of requested CPU, memory and (on
// GPU nodes) GPUs; DaemonSet, mirror, terminal and free-room pods do not
// count.
type Utilization struct {
	CPU, Memory, GPU float64
	HasGPU           bool
}

// Max is the figure compared with the threshold.
func (u Utilization) Max() float64 {
	m := u.CPU
	if u.Memory > m {
		m = u.Memory
	}
	if u.HasGPU && u.GPU > m {
		m = u.GPU
	}
	return m
}

// Requested is what a node's pods request in total, as the scheduler
// framework's NodeInfo aggregates it.
type Requested struct {
	MilliCPU, Memory, GPU int64
}

// UtilizationOf computes a node's utilisation. With total (the NodeInfo's
// aggregate of all its pods) only the excluded pods are computed and taken
// off, which is what keeps a pass over 200,000 pods cheap; without it every
// counted pod is summed.
func UtilizationOf(node *apiv1.Node, pods []*apiv1.Pod, gpu apiv1.ResourceName, r Rules, total *Requested) Utilization {
	return utilizationOf(node, pods, gpu, r, total, func(p *apiv1.Pod) Requested { return podRequests(p, gpu) })
}

// podRequests is what a pod requests, as the scheduler counts it.
func podRequests(p *apiv1.Pod, gpu apiv1.ResourceName) Requested {
	req := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
	out := Requested{MilliCPU: req.Cpu().MilliValue(), Memory: req.Memory().Value()}
	if q, ok := req[gpu]; ok {
		out.GPU = q.Value()
	}
	return out
}

// utilizationOf is UtilizationOf with the pods' requests from requests.
func utilizationOf(node *apiv1.Node, pods []*apiv1.Pod, gpu apiv1.ResourceName, r Rules, total *Requested, requests func(*apiv1.Pod) Requested) Utilization {
	sum := counted(pods, r, total, requests)
	alloc := node.Status.Allocatable
	u := Utilization{}
	if c := alloc.Cpu().MilliValue(); c > 0 {
		u.CPU = float64(sum.MilliCPU) / float64(c)
	}
	if m := alloc.Memory().Value(); m > 0 {
		u.Memory = float64(sum.Memory) / float64(m)
	}
	if q, ok := alloc[gpu]; ok && q.Value() > 0 {
		u.HasGPU = true
		u.GPU = float64(sum.GPU) / float64(q.Value())
	}
	return u
}

// counted is what the counted pods request: total less the excluded
// ones when total is known, else the sum of the others.
func counted(pods []*apiv1.Pod, r Rules, total *Requested, requests func(*apiv1.Pod) Requested) Requested {
	var sum Requested
	if total != nil {
		sum = *total
		for _, p := range pods {
			if !terminal(p) && r.excluded(p) {
				sum.add(requests(p), -1)
			}
		}
		return sum
	}
	for _, p := range pods {
		if !terminal(p) && !r.excluded(p) {
			sum.add(requests(p), 1)
		}
	}
	return sum
}

// add adds sign times req.
func (s *Requested) add(req Requested, sign int64) {
	s.MilliCPU += sign * req.MilliCPU
	s.Memory += sign * req.Memory
	s.GPU += sign * req.GPU
}

// excluded says whether a pod does not count in utilisation: DaemonSet,
// mirror and free-room pods.
func (r Rules) excluded(p *apiv1.Pod) bool {
	return IsDaemonSetPod(p) || IsMirrorPod(p) || (r.IsFreeRoom != nil && r.IsFreeRoom(p))
}

// PDBs answers, per pod, which PodDisruptionBudgets cover it and how many
// more disruptions each allows in this pass.
type PDBs struct {
	pdbs      []*policyv1.PodDisruptionBudget
	selectors []labels.Selector
	left      []int32
}

// NewPDBs indexes PDBs. Budgets with invalid selectors block every pod of
// their namespace (an unreadable budget is no licence to evict).
func NewPDBs(pdbs []*policyv1.PodDisruptionBudget) *PDBs {
	b := &PDBs{}
	for _, pdb := range pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			sel = labels.Everything()
		}
		b.pdbs = append(b.pdbs, pdb)
		b.selectors = append(b.selectors, sel)
		b.left = append(b.left, pdb.Status.DisruptionsAllowed)
	}
	return b
}

// covering returns the indexes of the budgets covering p.
func (b *PDBs) covering(p *apiv1.Pod) []int {
	var out []int
	for i, pdb := range b.pdbs {
		if pdb.Namespace == p.Namespace && b.selectors[i].Matches(labels.Set(p.Labels)) {
			out = append(out, i)
		}
	}
	return out
}

// Covered reports whether any budget covers p.
func (b *PDBs) Covered(p *apiv1.Pod) bool { return len(b.covering(p)) > 0 }

// CanEvict reports whether every budget covering the pods allows evicting
// all of them in addition to what was already taken in this pass.
func (b *PDBs) CanEvict(pods []*apiv1.Pod) (bool, string) {
	need := map[int]int32{}
	for _, p := range pods {
		for _, i := range b.covering(p) {
			need[i]++
		}
	}
	for i, n := range need {
		if b.left[i] < n {
			return false, fmt.Sprintf("PodDisruptionBudget %s/%s allows %d more disruptions, needs %d", b.pdbs[i].Namespace, b.pdbs[i].Name, b.left[i], n)
		}
	}
	return true, ""
}

// Take records the pods' disruptions against their budgets.
func (b *PDBs) Take(pods []*apiv1.Pod) {
	for _, p := range pods {
		for _, i := range b.covering(p) {
			b.left[i]--
		}
	}
}

// PodsToMove returns the pods that must be evicted from a node, or the
// reason the node must be kept. DaemonSet, mirror and terminal pods stay
// (they go with the node). Free-room pods (balloons) move, whatever the
// other rules say: they are placeholders, with no budget or local state.
func PodsToMove(pods []*apiv1.Pod, pdbs *PDBs, r Rules) ([]*apiv1.Pod, Reason, string) {
	var move, free []*apiv1.Pod
	for _, p := range pods {
		if terminal(p) || IsDaemonSetPod(p) || IsMirrorPod(p) {
			continue
		}
		if r.IsFreeRoom != nil && r.IsFreeRoom(p) {
			free = append(free, p)
			continue
		}
		if reason, why := r.blocking(p, pdbs); reason != ReasonNone {
			return nil, reason, why
		}
		move = append(move, p)
	}
	if ok, why := pdbs.CanEvict(move); !ok {
		return nil, ReasonPDB, why
	}
	return append(move, free...), ReasonNone, ""
}

// blocking is why a pod (neither left with the node nor free room) keeps
// its node, and in words; ReasonNone when it may be evicted.
func (r Rules) blocking(p *apiv1.Pod, pdbs *PDBs) (Reason, string) {
	switch p.Annotations[SafeToEvictAnnotation] {
	case "true":
		return ReasonNone, ""
	case "false":
		return ReasonSafeToEvictFalse, fmt.Sprintf("pod %s/%s is annotated %s=false", p.Namespace, p.Name, SafeToEvictAnnotation)
	}
	if controllerOf(p) == nil {
		return ReasonNotReplicated, fmt.Sprintf("pod %s/%s has no controller", p.Namespace, p.Name)
	}
	if r.SkipNodesWithSystemPods && p.Namespace == "kube-system" && !pdbs.Covered(p) {
		return ReasonKubeSystem, fmt.Sprintf("pod %s/%s is in kube-system without a PodDisruptionBudget", p.Namespace, p.Name)
	}
	if r.keepsLocalStorage(p) {
		return ReasonLocalStorage, fmt.Sprintf("pod %s/%s uses local storage", p.Namespace, p.Name)
	}
	return ReasonNone, ""
}

// keepsLocalStorage says whether a pod's local storage keeps its node:
// with SkipNodesWithLocalStorage, unless EvictScratch lets an emptyDir
// (not a hostPath) go.
func (r Rules) keepsLocalStorage(p *apiv1.Pod) bool {
	return r.SkipNodesWithLocalStorage && hasLocalStorage(p) && !(r.EvictScratch && !hasHostPath(p))
}

// hasHostPath reports hostPath volumes.
func hasHostPath(p *apiv1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil {
			return true
		}
	}
	return false
}

// hasLocalStorage reports emptyDir volumes on disk and hostPath volumes.
func hasLocalStorage(p *apiv1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil || (v.EmptyDir != nil && v.EmptyDir.Medium != apiv1.StorageMediumMemory) {
			return true
		}
	}
	return false
}
