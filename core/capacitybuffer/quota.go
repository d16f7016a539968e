package capacitybuffer

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// A buffer's chunks are not pods: no ResourceQuota sees them, so a tenant
// allowed a quota of 16 GPUs could hold 50 nodes' worth with one buffer.
// As cluster-autoscaler's design makes its buffer controller "quota
// aware, apply the quota when translating the buffer config to a pod
// spec" ("Buffers API", cluster-autoscaler/proposals/buffers.md: the
// LimitedByQuotas condition names the quotas that hold a buffer), a
// namespace's ResourceQuotas cap its buffers' chunks: what each quota
// leaves (spec.hard less status.used, as the quota controller counts the
// namespace's pods) is shared by the namespace's buffers, oldest first,
// each chunk counted as the pod it stands for would be (Kubernetes,
// "Resource Quotas": pods, cpu / requests.cpu, memory / requests.memory,
// requests.ephemeral-storage, limits.*, requests.<extended resource>,
// and a quota's scopes: BestEffort, NotBestEffort, Terminating,
// NotTerminating, PriorityClass).

// ConditionLimitedByQuotas says a buffer has fewer chunks than it asks
// for because of its namespace's ResourceQuotas.
const ConditionLimitedByQuotas = "LimitedByQuotas"

// Reasons of LimitedByQuotas.
const (
	ReasonQuotaLimited    = "QuotaLimitsBuffer"
	ReasonQuotaNotLimited = "QuotaDoesNotLimitBuffer"
)

// QuotaLedger is what a namespace's ResourceQuotas leave, spent by its
// buffers in turn.
type QuotaLedger struct {
	quotas []ledgerQuota
}

type ledgerQuota struct {
	q    *apiv1.ResourceQuota
	left apiv1.ResourceList
}

// NewQuotaLedger starts from what each quota leaves now.
func NewQuotaLedger(quotas []*apiv1.ResourceQuota) *QuotaLedger {
	l := &QuotaLedger{}
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

// Take spends, for want chunks of the template t, what the quotas that
// cover such a pod leave, and returns how many fit and, when fewer than
// want, why (the quota and the resource that bind).
func (l *QuotaLedger) Take(t *apiv1.PodTemplateSpec, want int32) (int32, string) {
	if l == nil || want <= 0 {
		return max(want, 0), ""
	}
	use := chunkUsage(t)
	fit, why := int64(want), ""
	for _, lq := range l.quotas {
		if !quotaCovers(lq.q, t) {
			continue
		}
		for _, name := range sortedNames(lq.left) {
			per, counted := use(name)
			if !counted {
				continue
			}
			left := lq.left[name]
			var n int64
			switch {
			case per == nil:
				n, why = 0, fmt.Sprintf("ResourceQuota %s counts %s, which a chunk does not set (its pod would be refused)", lq.q.Name, name)
			case per.Sign() <= 0:
				continue
			case left.Sign() <= 0:
				n = 0
			default:
				n = int64(math.Floor(left.AsApproximateFloat64() / per.AsApproximateFloat64()))
				if left.MilliValue() < math.MaxInt64/2 && per.MilliValue() > 0 {
					n = left.MilliValue() / per.MilliValue() // exact in thousandths
				}
			}
			if n < fit {
				fit = n
				if per != nil {
					why = fmt.Sprintf("ResourceQuota %s leaves %s of %s, %s a chunk", lq.q.Name, left.String(), name, per.String())
				}
			}
		}
	}
	fit = max(fit, 0)
	for i := range l.quotas {
		lq := &l.quotas[i]
		if fit == 0 || !quotaCovers(lq.q, t) {
			continue
		}
		for name, left := range lq.left {
			if per, counted := use(name); counted && per != nil {
				spent := per.DeepCopy()
				spent.Mul(fit)
				left.Sub(spent)
				lq.left[name] = left
			}
		}
	}
	if fit >= int64(want) {
		return want, ""
	}
	return int32(fit), why
}

// chunkUsage says what one chunk of t counts against a quota's resource
// name: nil with true when the quota counts something the chunk does not
// set (a limit it lacks); false when the quota does not count chunks
// (object counts of other kinds).
func chunkUsage(t *apiv1.PodTemplateSpec) func(apiv1.ResourceName) (*resource.Quantity, bool) {
	requests, limits := apiv1.ResourceList{}, apiv1.ResourceList{}
	for _, c := range t.Spec.Containers {
		for k, v := range c.Resources.Requests {
			q := requests[k]
			q.Add(v)
			requests[k] = q
		}
		for k, v := range c.Resources.Limits {
			q := limits[k]
			q.Add(v)
			limits[k] = q
		}
	}
	// A container's limit stands for its missing request (the API
	// server's defaulting).
	for _, c := range t.Spec.Containers {
		for k, v := range c.Resources.Limits {
			if _, ok := c.Resources.Requests[k]; !ok {
				q := requests[k]
				q.Add(v)
				requests[k] = q
			}
		}
	}
	one := resource.MustParse("1")
	return func(name apiv1.ResourceName) (*resource.Quantity, bool) {
		switch n := string(name); {
		case n == "pods" || n == "count/pods":
			return &one, true
		case n == "cpu" || n == "memory" || n == "ephemeral-storage":
			return quantityOf(requests, apiv1.ResourceName(n)), true
		case strings.HasPrefix(n, "requests."):
			return quantityOf(requests, apiv1.ResourceName(strings.TrimPrefix(n, "requests."))), true
		case strings.HasPrefix(n, "limits."):
			if q, ok := limits[apiv1.ResourceName(strings.TrimPrefix(n, "limits."))]; ok {
				return &q, true
			}
			return nil, true
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
func quotaCovers(q *apiv1.ResourceQuota, t *apiv1.PodTemplateSpec) bool {
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

func scopeMatches(scope apiv1.ResourceQuotaScope, op apiv1.ScopeSelectorOperator, values []string, t *apiv1.PodTemplateSpec) bool {
	best := true
	for _, c := range t.Spec.Containers {
		if len(c.Resources.Requests)+len(c.Resources.Limits) > 0 {
			best = false
		}
	}
	terminating := t.Spec.ActiveDeadlineSeconds != nil && *t.Spec.ActiveDeadlineSeconds >= 0
	switch scope {
	case apiv1.ResourceQuotaScopeBestEffort:
		return best
	case apiv1.ResourceQuotaScopeNotBestEffort:
		return !best
	case apiv1.ResourceQuotaScopeTerminating:
		return terminating
	case apiv1.ResourceQuotaScopeNotTerminating:
		return !terminating
	case apiv1.ResourceQuotaScopePriorityClass:
		pc := t.Spec.PriorityClassName
		switch op {
		case apiv1.ScopeSelectorOpIn:
			return pc != "" && slices.Contains(values, pc)
		case apiv1.ScopeSelectorOpNotIn:
			return pc == "" || !slices.Contains(values, pc)
		case apiv1.ScopeSelectorOpExists:
			return pc != ""
		case apiv1.ScopeSelectorOpDoesNotExist:
			return pc == ""
		}
		return false
	}
	// CrossNamespacePodAffinity and scopes of other objects: not a chunk's.
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
