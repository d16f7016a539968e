// Package quota counts virtual pods against a namespace's ResourceQuotas:
// the pods a CapacityBuffer's chunks or a ProvisioningRequest's pod sets
// stand for are never created, so no quota admission sees them.
package quota

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/podspec"
)

// A tenant allowed a quota of 16 GPUs could otherwise hold 50 nodes'
// worth with one buffer, or book them with one request. As
// cluster-autoscaler's design makes its buffer controller "quota aware,
// apply the quota when translating the buffer config to a pod spec"
// ("Buffers API", cluster-autoscaler/proposals/buffers.md), what each
// quota leaves (spec.hard less status.used, as the quota controller
// counts the namespace's pods) is shared by the namespace's virtual pods
// in turn, each counted as the pod it stands for would be (Kubernetes,
// "Resource Quotas": pods, cpu / requests.cpu, memory / requests.memory,
// requests.ephemeral-storage, limits.*, requests.<extended resource>,
// and a quota's scopes: BestEffort, NotBestEffort, Terminating,
// NotTerminating, PriorityClass).

// Ledger is what a namespace's ResourceQuotas leave, spent in turn.
type Ledger struct {
	quotas []ledgerQuota
}

type ledgerQuota struct {
	q    *apiv1.ResourceQuota
	left apiv1.ResourceList
}

// New starts from what each quota leaves now; nil (no cap) without
// quotas.
func New(quotas []*apiv1.ResourceQuota) *Ledger {
	if len(quotas) == 0 {
		return nil
	}
	l := &Ledger{}
	sorted := append([]*apiv1.ResourceQuota(nil), quotas...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, q := range sorted {
		left := apiv1.ResourceList{}
		for name, hard := range q.Spec.Hard {
			v := hard.DeepCopy()
			if used, ok := q.Status.Used[name]; ok {
				v.Sub(used)
			}
			left[name] = v
		}
		l.quotas = append(l.quotas, ledgerQuota{q: q, left: left})
	}
	return l
}

// Take spends, for as many as fit of want pods of spec t, what the quotas
// that cover such a pod leave, and returns how many fit and, when fewer
// than want, why (the quota and the resource that bind).
func (l *Ledger) Take(t *apiv1.PodSpec, want int32) (int32, string) {
	if l == nil || want <= 0 {
		return max(want, 0), ""
	}
	use := podUsage(t)
	fit, why := int64(want), ""
	for _, lq := range l.quotas {
		if !quotaCovers(lq.q, t) {
			continue
		}
		fit, why = lq.bind(use, fit, why)
	}
	fit = max(fit, 0)
	l.spend(t, use, fit)
	if fit >= int64(want) {
		return want, ""
	}
	return int32(fit), why
}

// bind lowers fit to the pods (each using use) that the quota leaves
// room for, with why when it does: the quota and the resource.
func (lq ledgerQuota) bind(use func(apiv1.ResourceName) (*resource.Quantity, bool), fit int64, why string) (int64, string) {
	for _, name := range sortedNames(lq.left) {
		per, counted := use(name)
		if !counted {
			continue
		}
		left := lq.left[name]
		n, takes := podsFitting(left, per)
		if !takes {
			continue
		}
		if n < fit {
			fit, why = n, fmt.Sprintf("ResourceQuota %s leaves %s of %s, %s a pod", lq.q.Name, left.String(), name, per.String())
		}
	}
	return fit, why
}

// podsFitting is how many pods taking per each fit in left (exact in
// thousandths where those are in range); false when a pod takes none.
func podsFitting(left resource.Quantity, per *resource.Quantity) (int64, bool) {
	switch {
	case per.Sign() <= 0:
		return 0, false
	case left.Sign() <= 0:
		return 0, true
	}
	n := int64(math.Floor(left.AsApproximateFloat64() / per.AsApproximateFloat64()))
	if left.MilliValue() < math.MaxInt64/2 && per.MilliValue() > 0 {
		n = left.MilliValue() / per.MilliValue() // exact in thousandths
	}
	return n, true
}

// TakeAll spends what every pod of specs (one spec a pod) takes, all or
// nothing: false, and why, when they do not all fit (nothing spent).
func (l *Ledger) TakeAll(specs []*apiv1.PodSpec) (bool, string) {
	if l == nil || len(specs) == 0 {
		return true, ""
	}
	order, counts := bySpec(specs)
	saved := l.snapshot()
	for _, s := range order {
		if got, why := l.Take(s, counts[s]); got < counts[s] {
			l.quotas = saved
			return false, fmt.Sprintf("%d of %d pods fit: %s", got, counts[s], why)
		}
	}
	return true, ""
}

// TakeSome spends what as many of the pods of specs as fit take (pods
// booked already: they are coming whatever the quota says now).
func (l *Ledger) TakeSome(specs []*apiv1.PodSpec) {
	if l == nil {
		return
	}
	order, counts := bySpec(specs)
	for _, s := range order {
		l.Take(s, counts[s])
	}
}

// bySpec counts the pods of specs by spec (the pods of a pod set share
// theirs), in their first order.
func bySpec(specs []*apiv1.PodSpec) ([]*apiv1.PodSpec, map[*apiv1.PodSpec]int32) {
	counts := map[*apiv1.PodSpec]int32{}
	var order []*apiv1.PodSpec
	for _, s := range specs {
		if counts[s] == 0 {
			order = append(order, s)
		}
		counts[s]++
	}
	return order, counts
}

// snapshot copies what the quotas leave.
func (l *Ledger) snapshot() []ledgerQuota {
	out := make([]ledgerQuota, len(l.quotas))
	for i, lq := range l.quotas {
		out[i] = ledgerQuota{q: lq.q, left: lq.left.DeepCopy()}
	}
	return out
}

// spend takes n pods of t from every quota covering them.
func (l *Ledger) spend(t *apiv1.PodSpec, use func(apiv1.ResourceName) (*resource.Quantity, bool), n int64) {
	for i := range l.quotas {
		lq := &l.quotas[i]
		if n == 0 || !quotaCovers(lq.q, t) {
			continue
		}
		for name, left := range lq.left {
			if per, counted := use(name); counted {
				spent := per.DeepCopy()
				spent.Mul(n)
				left.Sub(spent)
				lq.left[name] = left
			}
		}
	}
}

// podUsage says what one pod of t counts against a quota's resource name,
// as the quota's pod evaluator counts it: the pod's requests and limits as
// the scheduler sums them (init containers' maximum, sidecars, overhead:
// resourcehelper.PodRequests / PodLimits) after the API server's
// defaulting (a container's limit stands for its missing request). A
// limit the pod does not set counts as its request: a LimitRange would
// default it to no less (and a quota on limits with none and no LimitRange
// refuses the pod, which then buys nothing anyway). false when the quota
// does not count pods (object counts of other kinds).
func podUsage(t *apiv1.PodSpec) func(apiv1.ResourceName) (*resource.Quantity, bool) {
	pod := &apiv1.Pod{Spec: *t.DeepCopy()}
	podspec.LimitsAsRequests(pod.Spec.Containers)
	podspec.LimitsAsRequests(pod.Spec.InitContainers)
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	limits := resourcehelper.PodLimits(pod, resourcehelper.PodResourcesOptions{})
	one := resource.MustParse("1")
	return func(name apiv1.ResourceName) (*resource.Quantity, bool) {
		switch n := string(name); {
		case n == "pods" || n == "count/pods":
			return &one, true
		case n == "cpu" || n == "memory" || n == "ephemeral-storage" || strings.HasPrefix(n, "hugepages-"):
			return quantityOf(requests, apiv1.ResourceName(n)), true
		case strings.HasPrefix(n, "requests."):
			return quantityOf(requests, apiv1.ResourceName(strings.TrimPrefix(n, "requests."))), true
		case strings.HasPrefix(n, "limits."):
			r := apiv1.ResourceName(strings.TrimPrefix(n, "limits."))
			if q, ok := limits[r]; ok {
				return &q, true
			}
			return quantityOf(requests, r), true
		}
		return nil, false
	}
}

// quantityOf is list[name], zero when absent (nothing requested counts
// nothing).
func quantityOf(list apiv1.ResourceList, name apiv1.ResourceName) *resource.Quantity {
	q := list[name]
	return &q
}

// quotaCovers says a quota counts a pod of template t: its scopes, as the
// quota admission evaluates them for pods.
func quotaCovers(q *apiv1.ResourceQuota, t *apiv1.PodSpec) bool {
	for _, s := range q.Spec.Scopes {
		if !scopeMatches(s, apiv1.ScopeSelectorOpExists, nil, t) {
			return false
		}
	}
	if sel := q.Spec.ScopeSelector; sel != nil {
		for _, e := range sel.MatchExpressions {
			if !scopeMatches(e.ScopeName, e.Operator, e.Values, t) {
				return false
			}
		}
	}
	return true
}

func scopeMatches(scope apiv1.ResourceQuotaScope, op apiv1.ScopeSelectorOperator, values []string, t *apiv1.PodSpec) bool {
	switch scope {
	case apiv1.ResourceQuotaScopeBestEffort:
		return bestEffort(t)
	case apiv1.ResourceQuotaScopeNotBestEffort:
		return !bestEffort(t)
	case apiv1.ResourceQuotaScopeTerminating:
		return terminating(t)
	case apiv1.ResourceQuotaScopeNotTerminating:
		return !terminating(t)
	case apiv1.ResourceQuotaScopePriorityClass:
		return priorityClassMatches(op, values, t.PriorityClassName)
	}
	// CrossNamespacePodAffinity and scopes of other objects: not a chunk's.
	return false
}

// bestEffort says no container (init ones included) requests or limits
// cpu or memory (the pod's QoS class; other resources do not count).
func bestEffort(t *apiv1.PodSpec) bool {
	best := true
	for _, c := range append(append([]apiv1.Container(nil), t.InitContainers...), t.Containers...) {
		for _, r := range []apiv1.ResourceName{apiv1.ResourceCPU, apiv1.ResourceMemory} {
			_, req := c.Resources.Requests[r]
			_, lim := c.Resources.Limits[r]
			best = best && !req && !lim
		}
	}
	return best
}

// terminating says the pod has an active deadline.
func terminating(t *apiv1.PodSpec) bool {
	return t.ActiveDeadlineSeconds != nil && *t.ActiveDeadlineSeconds >= 0
}

// priorityClassMatches says a pod of priority class pc matches a
// PriorityClass scope's selector (op, values).
func priorityClassMatches(op apiv1.ScopeSelectorOperator, values []string, pc string) bool {
	switch op {
	case apiv1.ScopeSelectorOpIn:
		return pc != "" && slices.Contains(values, pc)
	case apiv1.ScopeSelectorOpNotIn:
		return pc == "" || !slices.Contains(values, pc)
	case apiv1.ScopeSelectorOpExists:
		return pc != ""
	case apiv1.ScopeSelectorOpDoesNotExist:
		// The quota evaluator always sees the key: never matches.
		return false
	}
	return false
}

func sortedNames(l apiv1.ResourceList) []apiv1.ResourceName {
	out := make([]apiv1.ResourceName, 0, len(l))
	for k := range l {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
