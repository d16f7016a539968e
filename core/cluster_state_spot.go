package core

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/bounds"
)

// Events of Spot evictions, on the status ConfigMap.
const (
	// EventSpotEvicted: the cloud took machines of a node group back.
	EventSpotEvicted = "SpotEvicted"
	// EventSpotEvictionBackoff: a node group lost
	// --spot-eviction-backoff-count machines within --spot-eviction-window
	// and is backed off, so scale-up buys capacity elsewhere.
	EventSpotEvictionBackoff = "SpotEvictionBackoff"
)

// spotState counts the machines the cloud takes back (Azure's Spot
// evictions), for a provider that reports them
// (cloudprovider.EvictionReporter).
//
// An evicted machine needs nothing of its own here: one the cloud deleted
// is gone, with its node, and its pods are pending again once their node is
// (the pod garbage collector deletes pods bound to a node that no longer
// exists; their controllers make new ones); one deallocated is an instance
// in error (cloudprovider.ClassEvicted) that the cluster state lists for
// deletion, deleted like every failed machine: within the replacement
// brake, through the Remover. What is here is the report (an event and
// spot_evictions_total by group) and the backoff of a group that keeps
// losing machines: --spot-eviction-backoff-count evictions within
// --spot-eviction-window back it off through the cluster state's backoff
// (kept in the safety state), so the expander's fallback (the priority
// expander's next group) buys capacity that stays.
type spotState struct {
	reporter cloudprovider.EvictionReporter // nil: the provider reports none
	// recent are each group's evictions within the window that have not
	// backed it off yet (kept in the safety state).
	recent map[string][]time.Time
}

// newSpotState reads evictions from p when it reports them. p is the
// provider as given (the guards' wrapper has no Evictions).
func newSpotState(p cloudprovider.CloudProvider) *spotState {
	r, _ := p.(cloudprovider.EvictionReporter)
	return &spotState{reporter: r, recent: map[string][]time.Time{}}
}

// newSpotMetrics is spot_evictions_total, registered on reg.
func newSpotMetrics(reg prometheus.Registerer, ns string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "spot_evictions_total",
		Help: "Machines the cloud took back (Azure Spot VMs evicted: deleted, or deallocated and then deleted by the autoscaler), by node group."},
		[]string{"node_group"})
	reg.MustRegister(c)
	return c
}

// validateSpot checks the Spot eviction backoff's flags.
func (o Options) validateSpot() error {
	if err := bounds.Int("--spot-eviction-backoff-count", o.SpotEvictionBackoffCount, 0, maxCount); err != nil {
		return err
	}
	if o.SpotEvictionBackoffCount > 0 && o.SpotEvictionWindow <= 0 {
		return fmt.Errorf("--spot-eviction-window: must be positive with --spot-eviction-backoff-count %d, got %s",
			o.SpotEvictionBackoffCount, o.SpotEvictionWindow)
	}
	return bounds.Duration("--spot-eviction-window", o.SpotEvictionWindow, 0, maxWait)
}

// takeEvictions reports the evictions the provider's refresh of this loop
// noticed and backs off the groups that lost too many machines within the
// window: before the scale-up phase, so this loop's scale-up already buys
// elsewhere. Called after the cluster state's Update.
func (a *Autoscaler) takeEvictions(ctx context.Context, l *loop) {
	sp := a.spot
	if sp.reporter == nil {
		return
	}
	// Every group's counter exists from its first loop, at zero: an alert
	// on its rate sees the first eviction.
	for _, gs := range a.registry.Groups() {
		a.metrics.SpotEvictions.WithLabelValues(gs.ID)
	}
	a.reportEvictions(ctx, l, countEvictions(sp.reporter.Evictions()))
	a.backOffEvicted(ctx, l)
}

// evictionCount is one group's evictions of a loop, by how the cloud
// took the machines back.
type evictionCount struct{ deleted, deallocated int }

// countEvictions are the evictions by group.
func countEvictions(evictions []cloudprovider.Eviction) map[string]*evictionCount {
	per := map[string]*evictionCount{}
	for _, e := range evictions {
		c := per[e.Group]
		if c == nil {
			c = &evictionCount{}
			per[e.Group] = c
		}
		if e.Deallocated {
			c.deallocated++
		} else {
			c.deleted++
		}
	}
	return per
}

// reportEvictions counts, logs and tells each group's evictions, and
// keeps their times for the backoff.
func (a *Autoscaler) reportEvictions(ctx context.Context, l *loop, per map[string]*evictionCount) {
	sp := a.spot
	logger := klog.FromContext(ctx)
	for _, id := range slices.Sorted(maps.Keys(per)) {
		c := per[id]
		n := c.deleted + c.deallocated
		a.metrics.SpotEvictions.WithLabelValues(id).Add(float64(n))
		logger.Info("Spot machines evicted by the cloud", "nodeGroup", id, "deleted", c.deleted, "deallocated", c.deallocated)
		a.groupEvent(apiv1.EventTypeWarning, EventSpotEvicted, fmt.Sprintf(
			"node group %s: %d machines evicted by the cloud (%d deleted, %d deallocated: deleted by the autoscaler, they hold quota); their pods are pending again",
			id, n, c.deleted, c.deallocated))
		for range n {
			sp.recent[id] = append(sp.recent[id], l.now)
		}
	}
}

// backOffEvicted backs off the groups with --spot-eviction-backoff-count
// evictions within the window, and forgets the evictions out of it.
func (a *Autoscaler) backOffEvicted(ctx context.Context, l *loop) {
	sp := a.spot
	limit, window := a.opts.SpotEvictionBackoffCount, a.opts.SpotEvictionWindow
	logger := klog.FromContext(ctx)
	for _, id := range slices.Sorted(maps.Keys(sp.recent)) {
		recent := withinWindow(sp.recent[id], l.now, window)
		if limit <= 0 {
			recent = nil // the backoff is off: nothing to count for
		}
		if len(recent) > 0 && len(recent) >= limit {
			msg := fmt.Sprintf("Spot evictions within %s: %d (--spot-eviction-backoff-count %d)", window, len(recent), limit)
			a.registry.RegisterFailedScaleUp(id, cloudprovider.ClassEvicted, msg, l.now)
			until := l.now
			if gs := a.registry.Group(id); gs != nil {
				until = gs.Backoff.Until
			}
			logger.Info("Node group backed off: the cloud keeps evicting its machines; scale-up buys elsewhere", "nodeGroup", id,
				"evictions", len(recent), "window", window, "until", until)
			a.groupEvent(apiv1.EventTypeWarning, EventSpotEvictionBackoff, fmt.Sprintf(
				"node group %s backed off until %s: %s; scale-up buys other groups meanwhile (the priority expander's next)",
				id, until.UTC().Format(time.RFC3339), msg))
			recent = nil
		}
		if len(recent) == 0 {
			delete(sp.recent, id)
			continue
		}
		sp.recent[id] = recent
	}
}

// withinWindow keeps the times of ts less than window before now (none
// with a zero window: the backoff is off).
func withinWindow(ts []time.Time, now time.Time, window time.Duration) []time.Time {
	kept := ts[:0]
	for _, t := range ts {
		if now.Sub(t) < window {
			kept = append(kept, t)
		}
	}
	return kept
}

// records are the groups' evictions still within the window at now, for
// the safety state (nil when none).
func (sp *spotState) records(now time.Time, window time.Duration) map[string][]time.Time {
	var out map[string][]time.Time
	for id, ts := range sp.recent {
		kept := withinWindow(slices.Clone(ts), now, window)
		if len(kept) == 0 {
			continue
		}
		for i := range kept {
			kept[i] = kept[i].UTC()
		}
		if out == nil {
			out = map[string][]time.Time{}
		}
		out[id] = kept
	}
	return out
}

// restore takes an earlier leader's evictions still within the window,
// before any of this process's own.
func (sp *spotState) restore(now time.Time, window time.Duration, rs map[string][]time.Time) {
	for id, ts := range rs {
		kept := withinWindow(slices.Clone(ts), now, window)
		if len(kept) > 0 {
			sp.recent[id] = append(kept, sp.recent[id]...)
		}
	}
}
