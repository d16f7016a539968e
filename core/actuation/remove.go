package actuation

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
)

// Machine is a machine to delete: its node group, its provider ID and its
// Node, when one registered (nil: nothing ever ran on it).
type Machine struct {
	Group      string
	ProviderID string
	Node       *apiv1.Node
}

// MachineOf is the machine of a node.
func MachineOf(group string, n *apiv1.Node) Machine {
	return Machine{Group: group, ProviderID: n.Spec.ProviderID, Node: n}
}

// Holder is a pod that keeps its node's machine: it runs there, or it was
// asked to stop and its grace period has not run out.
type Holder struct {
	Pod *apiv1.Pod
	// Terminating says the pod is stopping (evicted or deleted): the
	// machine may go once the pod is gone, or at Until, the end of its
	// grace period (its deletionTimestamp).
	Terminating bool
	Until       time.Time
}

func (h Holder) String() string {
	if h.Terminating {
		return fmt.Sprintf("pod %s/%s is terminating until %s", h.Pod.Namespace, h.Pod.Name, h.Until.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("pod %s/%s runs on the node", h.Pod.Namespace, h.Pod.Name)
}

// GraceMargin is added to a terminating pod's deletionTimestamp before its
// machine may go while the pod object still exists: the kubelet starts
// counting the grace only when it sees the deletion (late, on a busy or
// NotReady node), kills what ignores SIGTERM at its end, and reports the
// pod gone after. A pod object gone is gone at once. Cluster-autoscaler
// waits the same 30 s past the grace (PodEvictionHeadroom, "the extra
// time we wait to catch situations when the pod is ignoring SIGTERM and
// is killed with SIGKILL", core/scaledown/actuation); it was 2 s here,
// which gave a kubelet that saw the eviction late less grace, or none.
const GraceMargin = 30 * time.Second

// HolderOf says whether p keeps its node's machine at now: nil for
// DaemonSet and mirror pods (they go with the node), for finished pods,
// and for pods whose deletion's grace period ran out (deletionTimestamp
// plus GraceMargin reached: the kubelet killed what is left, or there is
// no kubelet). Every other pod holds it: a running pod never dies with
// its machine.
func HolderOf(p *apiv1.Pod, now time.Time) *Holder {
	switch {
	case scaledown.IsDaemonSetPod(p), scaledown.IsMirrorPod(p),
		p.Status.Phase == apiv1.PodSucceeded, p.Status.Phase == apiv1.PodFailed:
		return nil
	case p.DeletionTimestamp != nil:
		until := p.DeletionTimestamp.Add(GraceMargin)
		if !now.Before(until) {
			return nil
		}
		return &Holder{Pod: p, Terminating: true, Until: until}
	}
	return &Holder{Pod: p}
}

// EventDeletedWhileTerminating is a Warning on a pod, and on its node,
// when the node's machine is deleted while the pod object still exists
// past its deletion's grace period and GraceMargin: the kubelet never
// reported it gone (a NotReady node, a process that ignores SIGKILL, a
// stuck volume), so it was not known to be gone — only out of time.
const EventDeletedWhileTerminating = "DeletedWhileTerminating"

// overdue are the pods bound to node that HolderOf lets go only because
// their deletion's grace period and GraceMargin ran out at now: the pod
// object is still there.
func overdue(pods []*apiv1.Pod, node string, now time.Time) []*apiv1.Pod {
	var out []*apiv1.Pod
	for _, p := range pods {
		if p.Spec.NodeName == node && p.DeletionTimestamp != nil && HolderOf(p, now) == nil &&
			!scaledown.IsDaemonSetPod(p) && !scaledown.IsMirrorPod(p) &&
			p.Status.Phase != apiv1.PodSucceeded && p.Status.Phase != apiv1.PodFailed {
			out = append(out, p)
		}
	}
	return out
}

// firstHolder is the first pod of pods bound to node that holds its
// machine at now: a running one before a terminating one.
func firstHolder(pods []*apiv1.Pod, node string, now time.Time) *Holder {
	var terminating *Holder
	for _, p := range pods {
		if p.Spec.NodeName != node {
			continue
		}
		h := HolderOf(p, now)
		switch {
		case h == nil:
		case !h.Terminating:
			return h
		case terminating == nil:
			terminating = h
		}
	}
	return terminating
}

// Outcome is what Remove did with a machine.
type Outcome struct {
	Machine
	// Deleted: its group's DeleteNodes accepted it.
	Deleted bool
	// Held names the pod that kept it: not deleted, nothing was asked of
	// the cloud for it.
	Held *Holder
	// Err says why it was not deleted otherwise: its pods could not be
	// read, or the deletion failed.
	Err error
	// Sent says DeleteNodes was called for it: with Err set, the cloud may
	// or may not have started deleting it (a timeout, a lost answer).
	Sent bool
	// Overdue are its node's pods that were still terminating past their
	// grace period and GraceMargin when it was deleted; each got an
	// EventDeletedWhileTerminating. Set only with Deleted.
	Overdue []*apiv1.Pod
}

// PodReader reads the pods bound to a node.
type PodReader interface {
	// Cached are the pods bound to the node in the informer's cache.
	Cached(node string) []*apiv1.Pod
	// Fresh reads them from the API server, a consistent read: what the
	// cache has not seen yet (a pod bound a moment ago) is there.
	Fresh(ctx context.Context, node string) ([]*apiv1.Pod, error)
}

// Remover is the only way core deletes machines. At the moment it
// deletes, it looks at each machine's node again — the informer's cache,
// then a fresh read of the pods bound to it — and deletes only machines
// that hold nothing but DaemonSet and mirror pods, finished pods, and pods
// whose termination ended or whose grace period ran out. A machine with
// no Node needs no such look. Deletions are batched one DeleteNodes per
// node group.
//
// What a caller does with a held machine is its own: scale-down gives the
// removal up, a replacement waits.
type Remover struct {
	pods  PodReader
	rec   record.EventRecorder // nil: no events
	clock clock.Clock
}

// NewRemover returns a Remover that reads pods through pods and says on
// rec (nil: nowhere) when a machine goes with a pod that was only out of
// time (EventDeletedWhileTerminating).
func NewRemover(pods PodReader, rec record.EventRecorder, clk clock.Clock) *Remover {
	return &Remover{pods: pods, rec: rec, clock: clk}
}

// Remove checks and deletes machines, one DeleteNodes per group, groups in
// name order, and returns one outcome per machine, in the order given. A
// group's machines are looked at right before its DeleteNodes, not all
// before the first group's: the look is as fresh as the deletion.
func (r *Remover) Remove(ctx context.Context, groups map[string]cloudprovider.NodeGroup, machines []Machine) []Outcome {
	out := make([]Outcome, len(machines))
	perGroup := map[string][]int{}
	for i, m := range machines {
		out[i].Machine = m
		perGroup[m.Group] = append(perGroup[m.Group], i)
	}
	for _, id := range slices.Sorted(maps.Keys(perGroup)) {
		r.removeGroup(ctx, groups, id, machines, perGroup[id], out)
	}
	return out
}

// removeGroup looks at the nodes of a group's machines (indexes in
// machines and out) again and deletes the machines nothing holds, with
// one DeleteNodes, recording each machine's outcome.
func (r *Remover) removeGroup(ctx context.Context, groups map[string]cloudprovider.NodeGroup, id string, machines []Machine, idxs []int, out []Outcome) {
	idx, overdue := r.unheld(ctx, machines, idxs, out)
	if len(idx) == 0 {
		return
	}
	err := deleteGroup(ctx, groups, id, len(idx), func(yield func(string) bool) {
		for _, i := range idx {
			if !yield(machines[i].ProviderID) {
				return
			}
		}
	})
	sent := err == nil || !cloudprovider.NotSent(err)
	for _, i := range idx {
		out[i].Deleted, out[i].Err, out[i].Sent = err == nil, err, sent
		if err == nil {
			// Said once: a deletion sent with an unclear answer is
			// looked at again, and said, when it is sent again.
			out[i].Overdue = overdue[i]
			r.sayOverdue(out[i])
		}
	}
}

// unheld are the machines (of idxs) whose node holds no pod, or that
// have no node, with each one's overdue pods; a held machine's holder,
// or the error reading its pods, goes in its outcome.
func (r *Remover) unheld(ctx context.Context, machines []Machine, idxs []int, out []Outcome) ([]int, map[int][]*apiv1.Pod) {
	var idx []int
	overdue := map[int][]*apiv1.Pod{}
	for _, i := range idxs {
		if n := machines[i].Node; n != nil {
			h, late, err := r.holder(ctx, n.Name)
			if err != nil {
				out[i].Err = fmt.Errorf("reading the pods of node %s before deleting its machine: %w", n.Name, err)
				continue
			}
			if h != nil {
				out[i].Held = h
				continue
			}
			overdue[i] = late
		}
		idx = append(idx, i)
	}
	return idx, overdue
}

// sayOverdue puts an EventDeletedWhileTerminating on each overdue pod of
// a deleted machine, and on its node.
func (r *Remover) sayOverdue(o Outcome) {
	if r.rec == nil || len(o.Overdue) == 0 {
		return
	}
	for _, p := range o.Overdue {
		r.rec.Eventf(p, apiv1.EventTypeWarning, EventDeletedWhileTerminating,
			"the machine of node %s was sent for deletion with this pod still terminating: its deletion's grace period ended at %s and %s more passed without the kubelet reporting it gone",
			o.Node.Name, p.DeletionTimestamp.UTC().Format(time.RFC3339), GraceMargin)
	}
	pods := "pods"
	if len(o.Overdue) == 1 {
		pods = "pod"
	}
	r.rec.Eventf(o.Node, apiv1.EventTypeWarning, EventDeletedWhileTerminating,
		"machine sent for deletion with %d %s still terminating past the grace period and %s (first: %s/%s)",
		len(o.Overdue), pods, GraceMargin, o.Overdue[0].Namespace, o.Overdue[0].Name)
}

// Holder is the first pod that keeps node's machine from being stopped
// (HolderOf), nil when none: what a deletion waits for, and an in-place
// repair too (a reboot stops what runs as a deletion does).
func (r *Remover) Holder(ctx context.Context, node string) (*Holder, error) {
	h, _, err := r.holder(ctx, node)
	return h, err
}

// holder looks at a node's pods: the cache first (a holder there needs no
// API call), then a fresh read. With no holder it also returns the pods
// only out of time (overdue), from the read that found none.
func (r *Remover) holder(ctx context.Context, node string) (*Holder, []*apiv1.Pod, error) {
	now := r.clock.Now()
	if h := firstHolder(r.pods.Cached(node), node, now); h != nil {
		return h, nil, nil
	}
	pods, err := r.pods.Fresh(ctx, node)
	if err != nil {
		return nil, nil, err
	}
	if h := firstHolder(pods, node, now); h != nil {
		return h, nil, nil
	}
	return nil, overdue(pods, node, now), nil
}

// deleteGroup deletes n machines of one group with one DeleteNodes. A
// group missing from groups fails with an error naming it, and its
// machines are left alone.
func deleteGroup(ctx context.Context, groups map[string]cloudprovider.NodeGroup, id string, n int, providerIDs func(yield func(string) bool)) error {
	g, ok := groups[id]
	if !ok {
		return fmt.Errorf("deleting %d machines: node group %s is gone", n, id)
	}
	pids := slices.Collect(providerIDs)
	if err := g.DeleteNodes(ctx, pids); err != nil {
		return fmt.Errorf("deleting %d machines of node group %s: %w", len(pids), id, err)
	}
	return nil
}

// ByGroup groups outcomes by node group, for callers that report per
// group.
func ByGroup(outcomes []Outcome) map[string][]Outcome {
	out := map[string][]Outcome{}
	for _, o := range outcomes {
		out[o.Group] = append(out[o.Group], o)
	}
	return out
}
