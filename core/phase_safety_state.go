package core

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/clusterstate"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
)

// SafetyStore keeps the safety state where the next leader reads it
// before its first loop (the status ConfigMap's safety-state key).
type SafetyStore interface {
	// ReadSafetyState returns what was saved, "" when nothing was.
	ReadSafetyState(ctx context.Context) (string, error)
	// WriteSafetyState saves it.
	WriteSafetyState(ctx context.Context, state string) error
}

// safetyState is what a new leader needs to keep the promises the last
// one made: the deletions both brakes counted in their windows, the
// groups' backoffs and health breakers. (Which nodes preflight and health
// handling cordoned is on the nodes themselves:
// actuation.CordonedAnnotation; their repair ladders too:
// actuation.RepairAnnotation.)
type safetyState struct {
	ScaleDownDeletions []scaledown.Record           `json:"scaleDownDeletions,omitempty"`
	Replacements       []scaledown.Record           `json:"replacements,omitempty"`
	Backoffs           []clusterstate.BackoffRecord `json:"backoffs,omitempty"`
	// HealthBreakers are the groups whose health breaker holds, with the
	// end of their storm cooldown (zero: still over maxUnhealthy).
	HealthBreakers map[string]time.Time `json:"healthBreakers,omitempty"`
	// HealthPolicy is the last health policy accepted: a new leader whose
	// policy ConfigMap is refused keeps it, not the built-in one.
	HealthPolicy string `json:"healthPolicy,omitempty"`
	// SpotEvictions are each group's Spot evictions within
	// --spot-eviction-window that have not backed it off yet.
	SpotEvictions map[string][]time.Time `json:"spotEvictions,omitempty"`
	// HealthFailures are each group's young nodes admitted for a drain or
	// replacement within --health-failure-window that have not backed it
	// off yet: a new leader does not start the count of a bad image again.
	HealthFailures map[string][]YoungFailure `json:"healthFailures,omitempty"`
}

// restoreSafetyState reads the safety state back once, before the first
// loop that acts. A state that cannot be read stops the loop (nothing is
// done on a budget that may already be spent); one that cannot be parsed
// is said loudly and ignored (a newer format, a hand edit).
func (a *Autoscaler) restoreSafetyState(ctx context.Context) error {
	if a.restored || a.safety == nil {
		return nil
	}
	raw, err := a.safety.ReadSafetyState(ctx)
	if err != nil {
		return fmt.Errorf("reading the safety state (brakes, backoffs) an earlier leader saved: %w", err)
	}
	a.restored = true
	if raw == "" {
		return nil
	}
	var st safetyState
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		klog.FromContext(ctx).Error(err, "The saved safety state is unreadable; starting with empty brakes and backoffs")
		return nil
	}
	now := a.clock.Now()
	a.scaleDown.brake.Restore(now, st.ScaleDownDeletions)
	a.replace.brake.Restore(now, st.Replacements)
	a.registry.RestoreBackoffs(now, st.Backoffs)
	a.spot.restore(now, a.opts.SpotEvictionWindow, st.SpotEvictions)
	a.health.youngFailures = recentFailures(now, a.opts.HealthFailureWindow, st.HealthFailures)
	a.health.restoreLastGood(ctx, st.HealthPolicy)
	for id, until := range st.HealthBreakers {
		if until.IsZero() || now.Before(until) {
			a.health.breakers[id] = until
		}
	}
	a.lastSafety = raw
	klog.FromContext(ctx).Info("Safety state read back", "scaleDownDeletions", len(st.ScaleDownDeletions),
		"replacements", len(st.Replacements), "backoffs", len(st.Backoffs), "healthBreakers", len(st.HealthBreakers),
		"spotEvictionGroups", len(st.SpotEvictions), "healthFailureGroups", len(st.HealthFailures))
	return nil
}

// saveSafetyState writes the safety state at the end of the loop when it
// changed (backoffs of this loop's scale-ups); a failure is retried by the
// next loop.
func (a *Autoscaler) saveSafetyState(ctx context.Context, l *loop) error {
	if err := a.persistSafetyState(ctx, l.now); err != nil {
		klog.FromContext(ctx).Error(err, "Saving the safety state; retried next loop")
	}
	return nil
}

// persistSafetyState writes the safety state when it changed, through the
// gate (a fenced replica saves nothing). The paths that delete call it
// after their brake admitted the deletions and before they are sent
// (write-ahead): a leader killed in between leaves the next one a budget
// that already counts them. They send nothing when it fails.
func (a *Autoscaler) persistSafetyState(ctx context.Context, now time.Time) error {
	if a.safety == nil || !a.restored {
		return nil
	}
	st := safetyState{
		ScaleDownDeletions: a.scaleDown.brake.Records(now),
		Replacements:       a.replace.brake.Records(now),
		Backoffs:           a.registry.BackoffRecords(now),
		SpotEvictions:      a.spot.records(now, a.opts.SpotEvictionWindow),
		HealthFailures:     recentFailures(now, a.opts.HealthFailureWindow, a.health.youngFailures),
	}
	st.HealthPolicy = a.health.lastGood
	if len(a.health.breakers) > 0 {
		st.HealthBreakers = map[string]time.Time{}
		for id, until := range a.health.breakers {
			st.HealthBreakers[id] = until.UTC()
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("rendering the safety state: %w", err)
	}
	if string(b) == a.lastSafety {
		return nil
	}
	if err := a.gate.Write("safety-state"); err != nil {
		return err
	}
	if err := a.safety.WriteSafetyState(ctx, string(b)); err != nil {
		return fmt.Errorf("saving the safety state: %w", err)
	}
	a.lastSafety = string(b)
	return nil
}

// recentFailures is a copy of each group's young failures within window
// of now, in UTC; groups left with none are dropped, and nil when none is
// left.
func recentFailures(now time.Time, window time.Duration, failures map[string][]YoungFailure) map[string][]YoungFailure {
	var out map[string][]YoungFailure
	for g, fs := range failures {
		for _, f := range fs {
			if now.Sub(f.At) < window {
				if out == nil {
					out = map[string][]YoungFailure{}
				}
				out[g] = append(out[g], YoungFailure{Node: f.Node, At: f.At.UTC(), Spent: f.Spent, Seen: f.Seen})
			}
		}
	}
	return out
}
