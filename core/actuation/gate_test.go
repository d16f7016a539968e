package actuation

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// recordingActions counts the writes that reached it.
type recordingActions struct{ calls map[string]int }

func (r *recordingActions) AddTaint(context.Context, string, apiv1.Taint) error {
	r.calls["taint"]++
	return nil
}
func (r *recordingActions) RemoveTaint(context.Context, string, string) error {
	r.calls["untaint"]++
	return nil
}
func (r *recordingActions) Evict(context.Context, *apiv1.Pod, int64) error {
	r.calls["evict"]++
	return nil
}
func (r *recordingActions) Cordon(context.Context, string, string) error {
	r.calls["cordon"]++
	return nil
}
func (r *recordingActions) Uncordon(context.Context, string) error { r.calls["uncordon"]++; return nil }
func (r *recordingActions) UpdateRepair(context.Context, string, func(string) string, *PreflightAgain) error {
	r.calls["repair-record"]++
	return nil
}

// TestGateGuardsEveryWrite: under the hold nothing is tainted, cordoned or
// evicted, while a taint may still be removed; behind a closed fence
// nothing at all is written. Each refusal is an error the callers can
// recognise, and it is counted by rule and action.
func TestGateGuardsEveryWrite(t *testing.T) {
	pod := &apiv1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	writes := map[string]func(context.Context, NodeActions) error{
		"taint":    func(ctx context.Context, a NodeActions) error { return a.AddTaint(ctx, "n", ToBeDeleted(time.Time{})) },
		"untaint":  func(ctx context.Context, a NodeActions) error { return a.RemoveTaint(ctx, "n", "k") },
		"evict":    func(ctx context.Context, a NodeActions) error { return a.Evict(ctx, pod, 0) },
		"cordon":   func(ctx context.Context, a NodeActions) error { return a.Cordon(ctx, "n", "test") },
		"uncordon": func(ctx context.Context, a NodeActions) error { return a.Uncordon(ctx, "n") },
		"repair-record": func(ctx context.Context, a NodeActions) error {
			return a.UpdateRepair(ctx, "n", func(string) string { return "{}" }, nil)
		},
	}
	for _, tc := range []struct {
		name     string
		hold     string
		fence    error
		rule     string
		sent     map[string]bool
		sentinel error
	}{
		{name: "open", sent: map[string]bool{"taint": true, "untaint": true, "evict": true, "cordon": true, "uncordon": true, "repair-record": true}},
		{name: "held", hold: "7 of 9 managed nodes unready", rule: "hold", sent: map[string]bool{"untaint": true, "uncordon": true, "repair-record": true}, sentinel: ErrHeld},
		{name: "fenced", fence: errors.New("lease not renewed"), rule: "fence", sent: map[string]bool{}, sentinel: ErrFenced},
		{name: "fenced and held", hold: "unready", fence: errors.New("lease lost"), rule: "fence", sent: map[string]bool{}, sentinel: ErrFenced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"rule", "action"})
			g := NewGate(func() error { return tc.fence }, refused)
			g.Hold(tc.hold)
			inner := &recordingActions{calls: map[string]int{}}
			a := Guarded(inner, g)
			for action, write := range writes {
				err := write(context.Background(), a)
				if tc.sent[action] {
					if err != nil || inner.calls[action] != 1 {
						t.Fatalf("%s: err %v, sent %d times; want sent once", action, err, inner.calls[action])
					}
					continue
				}
				if inner.calls[action] != 0 {
					t.Fatalf("%s sent through the gate (%s)", action, tc.name)
				}
				if !Refused(err) || !errors.Is(err, tc.sentinel) {
					t.Fatalf("%s: err %v, want a refusal wrapping %v", action, err, tc.sentinel)
				}
				if got := testutil.ToFloat64(refused.WithLabelValues(tc.rule, action)); got != 1 {
					t.Fatalf("refused{%s,%s} = %v, want 1", tc.rule, action, got)
				}
			}
			if err := g.DeletionsAllowed(); (err != nil) != (tc.hold != "") || (err != nil && !errors.Is(err, ErrHeld)) {
				t.Fatalf("DeletionsAllowed = %v with hold %q", err, tc.hold)
			}
		})
	}
}

// TestGateHoldLifts: a hold lifted lets the same writes through again.
func TestGateHoldLifts(t *testing.T) {
	g := NewGate(nil, nil)
	inner := &recordingActions{calls: map[string]int{}}
	a := Guarded(inner, g)
	g.Hold("cluster unhealthy")
	if err := a.Cordon(context.Background(), "n", "test"); !errors.Is(err, ErrHeld) {
		t.Fatalf("cordon under the hold: %v", err)
	}
	g.Hold("")
	if err := a.Cordon(context.Background(), "n", "test"); err != nil || inner.calls["cordon"] != 1 {
		t.Fatalf("cordon after the hold lifted: %v, sent %d", err, inner.calls["cordon"])
	}
	if Guarded(nil, g) != nil {
		t.Fatal("Guarded(nil) must stay nil: callers read nil as no actions")
	}
}
