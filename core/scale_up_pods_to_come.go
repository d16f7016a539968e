package core

import (
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/podspec"
)

// Pods a ReplicaSet is about to have scheduled (--scale-up-for-expected-pods).
//
// A Deployment scaled to 1,000 replicas has its pods created within a
// second or two, but the scheduler gives a few hundred verdicts a second,
// and a 5,000-replica one has its pods created over half a minute (the
// controller manager's client is rate-limited). A pod is planned only once
// the scheduler has failed it. When some of a ReplicaSet's pods are
// already unschedulable, its twins will not fit either: the loop plans
// them now — its pods the scheduler has not tried yet, and the replicas
// it has yet to create — as copies, so their nodes are bought with the
// first ones' instead of behind the scheduler's verdicts.
//
// The pods to come are made from the ReplicaSet's spec.template, never
// from a pod: anyone who may create pods in its namespace may give a pod
// of any shape the ReplicaSet as its controller, and one hand-made 8-GPU
// pod copied for 5,000 replicas to come bought a GPU group's maximum. Such
// a pod is planned as itself; the copies it triggers are the template's,
// pods the ReplicaSet makes anyway (#40).
//
// Copies are virtual (like a ProvisioningRequest's booked pods): no
// event, no count of real pods, no gang membership; planned with their
// twins in the same pass (packed onto the same new nodes), as created
// now; a usable node one fits on is kept from scale-down that loop, as
// for any pending pod. They are restated every loop: an untried pod is copied while it
// is untried, and the replicas to come are the ReplicaSet's spec.replicas
// less the pods it has in the informer's cache (every pod of it that is
// not terminal or terminating, bound or not), even when its controller
// reports them all made: the cache lags the controller under load, and
// pods made but not yet seen are pods to come like the rest. Trusting the
// controller's count there left 379 of a 2,000-pod burst out of the first
// plan on the xl scale run; their 79 nodes waited a whole operation for
// their scale set's write in flight (one a set). A ReplicaSet whose
// controller reports a ReplicaFailure (quota, an admission webhook) gets
// none: its pods may never come. Nor does a gang member (a gang is bought whole
// once its members exist) nor a balloon.

// expectedUIDPrefix starts an expected pod's UID.
const expectedUIDPrefix = "expected/"

// maxExpectedPods bounds the expected pods of a loop, all ReplicaSets
// together: beyond it, the next loops plan the rest.
const maxExpectedPods = 10000

// isExpected says p is a copy standing for a pod a ReplicaSet is about to
// create, not a pod of the cluster.
func isExpected(p *apiv1.Pod) bool { return strings.HasPrefix(string(p.UID), expectedUIDPrefix) }

// replicaSetOf is the UID and name of p's controller when it is a
// ReplicaSet.
func replicaSetOf(p *apiv1.Pod) (types.UID, string, bool) {
	ref := metav1.GetControllerOfNoCopy(p)
	if ref == nil || ref.Kind != "ReplicaSet" || ref.APIVersion != "apps/v1" {
		return "", "", false
	}
	return ref.UID, ref.Name, true
}

// expectedPods are the copies standing for the pods the ReplicaSets of
// pending are about to have scheduled (see above). pending are the loop's
// unschedulable pods outside gangs, past the scale-up delay and not
// consuming a ProvisioningRequest.
func (a *Autoscaler) expectedPods(l *loop, pending []*apiv1.Pod) []*apiv1.Pod {
	if !a.opts.ScaleUpForExpectedPods || a.listers.ReplicaSets == nil {
		return nil
	}
	owners, order := a.expectingOwners(l, pending)
	if len(order) == 0 {
		return nil
	}
	var out []*apiv1.Pod
	add := func(p *apiv1.Pod, i int) bool {
		if len(out) >= maxExpectedPods {
			return false
		}
		out = append(out, expectedCopy(p, i, l.now))
		return true
	}
	// Its pods the scheduler has not tried yet are its unschedulable
	// ones' twins: planned now, not after the scheduler's verdict on
	// each (it gives a few hundred a second).
	for _, p := range l.unbound {
		uid, _, ok := replicaSetOf(p)
		if !ok || owners[uid] == nil || owners[uid].base == nil || !counts(p) || !untried(p) || !a.mayExpect(l, p) {
			continue
		}
		if !add(p, 0) {
			return out
		}
	}
	// The pods it has yet to create, while its controller reports fewer
	// than it wants.
	have := a.podsOfOwners(owners, order, unboundOf(l, owners))
	for _, uid := range order {
		o := owners[uid]
		n, known := have[uid]
		klog.V(4).InfoS("Pods to come", "replicaSet", klog.KObj(o.rs), "specReplicas", *o.rs.Spec.Replicas,
			"statusReplicas", o.rs.Status.Replicas, "inCache", n, "known", known)
		if !known {
			continue // its pods unknown: none expected rather than too many
		}
		for i := 0; i < int(*o.rs.Spec.Replicas)-n; i++ {
			if !add(o.base, i+1) {
				return out
			}
		}
	}
	return out
}

// expectingOwner is a ReplicaSet some of whose pods are unschedulable.
type expectingOwner struct {
	rs *appsv1.ReplicaSet
	// base is the pod its controller creates, made from its
	// spec.template (never from a pod: a pod anyone may give the
	// ReplicaSet as owner); nil until one of its unschedulable pods is
	// such a pod.
	base *apiv1.Pod
}

// expectingOwners are the ReplicaSets of the pending pods that expect more
// pods (by UID; nil for one that does not), and those that will have
// copies made, in the order their first pod came.
func (a *Autoscaler) expectingOwners(l *loop, pending []*apiv1.Pod) (map[types.UID]*expectingOwner, []types.UID) {
	var owners map[types.UID]*expectingOwner
	var order []types.UID
	for _, p := range pending {
		if !a.mayExpect(l, p) {
			continue
		}
		uid, name, _ := replicaSetOf(p)
		o, seen := owners[uid]
		if !seen {
			if owners == nil {
				owners = map[types.UID]*expectingOwner{}
			}
			rs, err := a.listers.ReplicaSets.ReplicaSets(p.Namespace).Get(name)
			if err != nil || rs.UID != uid || !expectsPods(rs) {
				owners[uid] = nil
				continue
			}
			o = &expectingOwner{rs: rs}
			owners[uid] = o
		}
		if o == nil || o.base != nil {
			continue
		}
		// Any of its unschedulable pods triggers the copies, which are
		// its template's: a pod of another shape (made by hand and given
		// the ReplicaSet as owner) brings only pods the ReplicaSet makes
		// anyway, never copies of itself.
		o.base = templatePod(o.rs, p)
		order = append(order, uid)
	}
	return owners, order
}

// unboundOf are the UIDs of the owners' unbound pods in the loop's
// snapshot.
func unboundOf(l *loop, owners map[types.UID]*expectingOwner) map[types.UID]bool {
	seen := map[types.UID]bool{}
	for _, p := range l.unbound {
		if owner, _, ok := replicaSetOf(p); ok && owners[owner] != nil {
			seen[p.UID] = true
		}
	}
	return seen
}

// podsOfOwners counts, for the owners, every pod of theirs in the cache
// that is bound, or unbound and in the loop's snapshot (inSnapshot): their
// namespace's pods, from the informer's index, once per namespace and
// loop. An unbound pod the cache got after the snapshot is neither
// untried in this loop (the untried are the snapshot's) nor counted here,
// so it is a pod to come: counting it left it out of both (144 of a
// 2,000-pod burst on the xl scale run, whose pods arrive at hundreds a
// second while a loop builds its snapshot). An owner whose namespace
// could not be listed is not in the result.
func (a *Autoscaler) podsOfOwners(owners map[types.UID]*expectingOwner, order []types.UID, inSnapshot map[types.UID]bool) map[types.UID]int {
	have := map[types.UID]int{}
	listed := map[string]bool{} // namespace: its pods counted (false: could not be listed)
	for _, uid := range order {
		o := owners[uid]
		ok, seen := listed[o.rs.Namespace]
		if !seen {
			pods, err := a.listers.Pods.Pods(o.rs.Namespace).List(labels.Everything())
			ok = err == nil
			listed[o.rs.Namespace] = ok
			for _, p := range pods {
				if owner, _, isRS := replicaSetOf(p); isRS && owners[owner] != nil && counts(p) && (p.Spec.NodeName != "" || inSnapshot[p.UID]) {
					have[owner]++
				}
			}
		}
		if ok {
			have[uid] += 0 // known, perhaps none
		}
	}
	return have
}

// mayExpect says p, a pod of a ReplicaSet, may stand for its twins or be
// copied: not a balloon, a virtual pod, a gang member, a pod younger than
// the scale-up delay, nor one consuming a ProvisioningRequest.
func (a *Autoscaler) mayExpect(l *loop, p *apiv1.Pod) bool {
	if _, _, ok := replicaSetOf(p); !ok || a.opts.isBalloon(p) || isVirtual(p) {
		return false
	}
	if _, ok := gang.KeyOf(p); ok {
		return false
	}
	if _, ok := provreq.Consumes(p); ok {
		return false
	}
	return l.now.Sub(p.CreationTimestamp.Time) >= a.opts.NewPodScaleUpDelay
}

// counts says p is one of its ReplicaSet's replicas: neither terminal nor
// terminating.
func counts(p *apiv1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase != apiv1.PodSucceeded && p.Status.Phase != apiv1.PodFailed
}

// untried says the scheduler has given p no verdict yet: unbound, no
// PodScheduled condition (a gated pod has one).
func untried(p *apiv1.Pod) bool {
	if p.Spec.NodeName != "" || len(p.Spec.SchedulingGates) > 0 {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == apiv1.PodScheduled {
			return false
		}
	}
	return true
}

// expectsPods says rs's controller wants pods and reports no failure to
// create them.
func expectsPods(rs *appsv1.ReplicaSet) bool {
	if rs.DeletionTimestamp != nil || rs.Spec.Replicas == nil || *rs.Spec.Replicas <= 0 {
		return false
	}
	for _, c := range rs.Status.Conditions {
		if c.Type == appsv1.ReplicaSetReplicaFailure && c.Status == apiv1.ConditionTrue {
			return false
		}
	}
	return true
}

// templatePod is the pod rs's controller creates from its spec.template,
// for planning: admission's additions are not known from the template
// alone (a LimitRange's default requests, an injected sidecar), so the
// copies may ask less than the real pods will — they are planned as these
// come. The sample's priority (admission resolves the class) is taken
// when its class is the template's, or the template names none (a
// globalDefault class).
func templatePod(rs *appsv1.ReplicaSet, sample *apiv1.Pod) *apiv1.Pod {
	t := rs.Spec.Template
	base := &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: rs.Namespace, Name: rs.Name + "-template", UID: types.UID("template/" + string(rs.UID)),
			Labels: t.Labels, Annotations: t.Annotations, CreationTimestamp: sample.CreationTimestamp,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
		Spec:   *t.Spec.DeepCopy(),
		Status: apiv1.PodStatus{Phase: apiv1.PodPending},
	}
	// As the API server defaults a pod: a container's limits stand for
	// its missing requests.
	podspec.LimitsAsRequests(base.Spec.Containers)
	podspec.LimitsAsRequests(base.Spec.InitContainers)
	if t.Spec.PriorityClassName == "" || t.Spec.PriorityClassName == sample.Spec.PriorityClassName {
		base.Spec.PriorityClassName = sample.Spec.PriorityClassName
		base.Spec.Priority, base.Spec.PreemptionPolicy = sample.Spec.Priority, sample.Spec.PreemptionPolicy
	}
	if base.Spec.SchedulerName == "" {
		base.Spec.SchedulerName = sample.Spec.SchedulerName
	}
	return base
}

// expectedCopy is the i-th copy of sample standing for a pod to come (or
// for an untried pod itself), created now: it queues behind real pods.
func expectedCopy(sample *apiv1.Pod, i int, now time.Time) *apiv1.Pod {
	// A shallow copy: the loop only reads pods, and a copy shares the
	// sample's spec (and its equivalence group) as the real pods will.
	p := *sample
	p.CreationTimestamp = metav1.NewTime(now)
	p.Name = sample.Name + "-expected-" + strconv.Itoa(i)
	p.UID = types.UID(expectedUIDPrefix + string(sample.UID) + "/" + strconv.Itoa(i))
	p.Status.NominatedNodeName = ""
	return &p
}
