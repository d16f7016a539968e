package actuation

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	apiv1 "k8s.io/api/core/v1"
)

// EvictOptions are what an eviction needs to know, copied by value when a
// drain starts so a live reload cannot change them under it.
type EvictOptions struct {
	// MaxGracefulTerminationSec caps a pod's termination grace period
	// (--max-graceful-termination-sec).
	MaxGracefulTerminationSec int
	// IsPlaceholder says a pod holds room and runs nothing (a balloon): it
	// is evicted with no grace. It must read nothing that changes: a
	// closure over values, never over the autoscaler's options.
	IsPlaceholder func(*apiv1.Pod) bool
}

// Grace is the grace period a pod gets when evicted: its own, capped at
// the maximum; none for a placeholder.
func (o EvictOptions) Grace(p *apiv1.Pod) int64 {
	g := int64(o.MaxGracefulTerminationSec)
	switch {
	case o.IsPlaceholder != nil && o.IsPlaceholder(p):
		return 0
	case p.Spec.TerminationGracePeriodSeconds != nil && *p.Spec.TerminationGracePeriodSeconds < g:
		return *p.Spec.TerminationGracePeriodSeconds
	}
	return g
}

// Evictor evicts pods through the Eviction API with a capped grace period,
// and counts the outcomes (evictions_total{result=ok|blocked|refused}).
type Evictor struct {
	Actions NodeActions
	Results *prometheus.CounterVec
}

// Evict evicts p; an error means it was refused (a PodDisruptionBudget
// says not yet, or the API failed) and may be retried.
func (e Evictor) Evict(ctx context.Context, o EvictOptions, p *apiv1.Pod) error {
	if err := e.Actions.Evict(ctx, p, o.Grace(p)); err != nil {
		result := "blocked"
		if Refused(err) {
			result = "refused" // by the gate: never sent
		}
		e.Results.WithLabelValues(result).Inc()
		return err
	}
	e.Results.WithLabelValues("ok").Inc()
	return nil
}
