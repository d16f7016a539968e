package actuation

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	apiv1 "k8s.io/api/core/v1"
)

// Errors of the writes a gate refused: every refusal wraps one of them.
var (
	// ErrHeld: the hold (the cluster-wide unready guard) refused it.
	ErrHeld = errors.New("held")
	// ErrFenced: this replica may not write (the leader fence).
	ErrFenced = errors.New("fenced")
)

// Refused says err is a write a gate refused: nothing was sent.
func Refused(err error) bool { return errors.Is(err, ErrHeld) || errors.Is(err, ErrFenced) }

// Gate is the last check before every write to nodes, pods and machines,
// by the loop and by the drains that run between loops. Two rules:
//   - the fence: a replica that does not hold the leader lease, renewed
//     within the renew deadline, writes nothing (a stalled old leader);
//   - the hold: while set (the cluster-wide unready guard), nothing is
//     cordoned, tainted, evicted or deleted. Removing a taint, uncordoning
//     and scale-up go on: they undo or add, never take away.
//
// The phases check the same rules first and hold their work for later;
// the gate makes sure no path, present or future, escapes them.
type Gate struct {
	fence func() error // nil: no leader election
	// refused counts writes the gate stopped, by rule and action; nil: not counted.
	refused *prometheus.CounterVec

	mu   sync.Mutex
	hold string
}

// NewGate returns an open gate with the given fence (nil: none) and
// counter of refused writes {rule, action} (nil: not counted).
func NewGate(fence func() error, refused *prometheus.CounterVec) *Gate {
	return &Gate{fence: fence, refused: refused}
}

// Hold sets why destructive writes are refused now; "" lifts the hold.
func (g *Gate) Hold(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hold = reason
}

// Held is the hold's reason, or "".
func (g *Gate) Held() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.hold
}

// Write says whether this replica may write at all: nil, or the fence's refusal.
func (g *Gate) Write(action string) error {
	if g == nil || g.fence == nil {
		return nil
	}
	if err := g.fence(); err != nil {
		g.count("fence", action)
		return fmt.Errorf("%s refused: %w: %w", action, ErrFenced, err)
	}
	return nil
}

// Destroy says whether a deletion, cordon, taint or eviction may be sent:
// nil, or why not (the fence, or the hold; the hold's error wraps ErrHeld).
func (g *Gate) Destroy(action string) error {
	if g == nil {
		return nil
	}
	if err := g.Write(action); err != nil {
		return err
	}
	if why := g.Held(); why != "" {
		g.count("hold", action)
		return fmt.Errorf("%s refused: %w: %s", action, ErrHeld, why)
	}
	return nil
}

// DeletionsAllowed is Destroy for machine deletions, in the cloud
// provider's guard form (the fence is the provider's own guard).
func (g *Gate) DeletionsAllowed() error {
	if why := g.Held(); why != "" {
		g.count("hold", "delete")
		return fmt.Errorf("%w: %s", ErrHeld, why)
	}
	return nil
}

func (g *Gate) count(rule, action string) {
	if g.refused != nil {
		g.refused.WithLabelValues(rule, action).Inc()
	}
}

// Guarded returns actions with every write checked against g first: a
// refused write is not sent and returns the gate's error.
func Guarded(actions NodeActions, g *Gate) NodeActions {
	if actions == nil || g == nil {
		return actions
	}
	return &guarded{inner: actions, gate: g}
}

type guarded struct {
	inner NodeActions
	gate  *Gate
}

func (a *guarded) AddTaint(ctx context.Context, node string, taint apiv1.Taint) error {
	if err := a.gate.Destroy("taint"); err != nil {
		return fmt.Errorf("tainting node %s with %s: %w", node, taint.Key, err)
	}
	return a.inner.AddTaint(ctx, node, taint)
}

func (a *guarded) RemoveTaint(ctx context.Context, node, key string) error {
	if err := a.gate.Write("untaint"); err != nil {
		return fmt.Errorf("removing taint %s from node %s: %w", key, node, err)
	}
	return a.inner.RemoveTaint(ctx, node, key)
}

func (a *guarded) Evict(ctx context.Context, pod *apiv1.Pod, grace int64) error {
	if err := a.gate.Destroy("evict"); err != nil {
		return fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return a.inner.Evict(ctx, pod, grace)
}

func (a *guarded) Cordon(ctx context.Context, node, reason string) error {
	if err := a.gate.Destroy("cordon"); err != nil {
		return fmt.Errorf("cordoning node %s: %w", node, err)
	}
	return a.inner.Cordon(ctx, node, reason)
}

func (a *guarded) UpdateRepair(ctx context.Context, node string, change func(string) string, again *PreflightAgain) error {
	if err := a.gate.Write("repair-record"); err != nil {
		return fmt.Errorf("writing the repair record of node %s: %w", node, err)
	}
	return a.inner.UpdateRepair(ctx, node, change, again)
}

func (a *guarded) Uncordon(ctx context.Context, node string) error {
	if err := a.gate.Write("uncordon"); err != nil {
		return fmt.Errorf("uncordoning node %s: %w", node, err)
	}
	return a.inner.Uncordon(ctx, node)
}
