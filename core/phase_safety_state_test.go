package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// memSafety is a SafetyStore in memory, shared by the leaders of a test.
type memSafety struct {
	mu      sync.Mutex
	state   string
	readErr error
	// writeErr, when set, fails every write.
	writeErr error
	reads    int
	writes   int
}

func (m *memSafety) ReadSafetyState(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	return m.state, m.readErr
}

func (m *memSafety) WriteSafetyState(_ context.Context, s string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.writeErr != nil {
		return m.writeErr
	}
	m.state = s
	m.writes++
	return nil
}

func (m *memSafety) set(f func(*memSafety)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

// failover replaces the env's autoscaler by a new one (a new leader: the
// same cluster, cloud and safety store, nothing in memory).
func (e *env) failover() {
	e.t.Helper()
	e.a.WaitForDrains()
	e.reg = prometheus.NewRegistry() // a new process's metrics
	e.start()
}

// TestSafetyStateBrakeSurvivesAFailover: a new leader in the middle of a
// replacement storm deletes nothing beyond what is left of the same
// window's budget; without the saved state each new leader would get a
// fresh budget.
func TestSafetyStateBrakeSurvivesAFailover(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), actOnFailuresAtOnce(), withOptions(func(o *Options) {
		o.PreflightFailuresBeforeBackoff = 0
		o.PreflightIncidentMinNodes = 1000 // the brake is the subject: no incident
	}))
	e.safety = &memSafety{}
	gpu := e.provider.AddGroup("gpu", 0, 200, gpuTemplate("gpu"), inmemory.WithTarget(70))
	bad := e.provider.AddGroup("bad", 0, 200, gpuTemplate("bad"), inmemory.WithTarget(30))
	e.start()
	e.register(gpu)
	e.register(bad, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValueFailed
		n.Annotations = map[string]string{preflight.DefaultFailureAnnotation: "ib: link down"}
	})
	e.run()
	e.run()
	if got := len(bad.Deleted()); got != 10 {
		t.Fatalf("deleted %d of 30, want the brake's 10 (2%% of 100, at least 10)", got)
	}
	for i := range 3 {
		e.clock.Step(time.Minute)
		e.failover()
		e.run()
		e.run()
		if got := len(bad.Deleted()); got != 10 {
			t.Fatalf("after failover %d, %d deleted within the window, want still 10: %v", i+1, got, bad.Deleted())
		}
	}
	e.clock.Step(8 * time.Minute) // the window has passed
	e.failover()
	e.run()
	e.run()
	if got := len(bad.Deleted()); got != 20 {
		t.Fatalf("deleted %d once the window passed, want 10 more", got)
	}
}

// TestSafetyStateBackoffSurvivesAFailover: a group backed off for quota is
// not asked again by the next leader before its backoff ends.
func TestSafetyStateBackoffSurvivesAFailover(t *testing.T) {
	e := newEnv(t)
	e.safety = &memSafety{}
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"))
	gpu.SetIncreaseError(cloudprovider.NewError(cloudprovider.ClassQuota, "QuotaExceeded", "0 of 8 cores left", nil))
	e.start()
	e.add(pendingPods(2, "train", wholeGPU()...))
	e.run()
	if gs := e.a.registry.Group("gpu"); !gs.Backoff.Active {
		t.Fatal("not backed off after a quota error")
	}
	gpu.SetIncreaseError(nil) // the cloud would accept now: only the backoff holds the group
	e.clock.Step(time.Minute)
	e.failover()
	e.run()
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("the new leader scaled up %v a group still backed off for quota", got)
	}
	if gs := e.a.registry.Group("gpu"); !gs.Backoff.Active || !strings.Contains(gs.Backoff.Reason, "QuotaExceeded") {
		t.Fatalf("backoff %+v after the failover, want the old leader's", gs.Backoff)
	}
}

// TestSafetyStateCordonsAreTakenOver: a node an earlier leader cordoned
// for a preflight failure (the annotation says so) that passes again is
// uncordoned by the new leader; a node cordoned by someone else is not.
func TestSafetyStateCordonsAreTakenOver(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(2))
	e.start()
	e.register(gpu, func(n *apiv1.Node) { n.Spec.Unschedulable = true })
	ours, theirs := nodeName(gpu, 0), nodeName(gpu, 1)
	obj, _, _ := e.nodes.GetByKey(ours)
	n := obj.(*apiv1.Node).DeepCopy()
	n.Annotations = map[string]string{actuation.CordonedAnnotation: cordonPreflight + " 2026-01-01T00:00:00Z"}
	must(t, e.nodes.Update(n))
	e.run()
	if fmt.Sprint(acts.uncordoned) != fmt.Sprint([]string{ours}) {
		t.Fatalf("uncordoned %v, want only %s (the other was cordoned by someone else: %s)", acts.uncordoned, ours, theirs)
	}
}

// TestSafetyStateUnreadableStopsTheLoop: a leader that cannot read the
// state an earlier one saved does not act on a budget that may be spent.
func TestSafetyStateUnreadableStopsTheLoop(t *testing.T) {
	e := newEnv(t)
	store := &memSafety{readErr: errors.New("the API server is unavailable")}
	e.safety = store
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(2, "train", wholeGPU()...))
	if err := e.a.RunOnce(e.ctx); err == nil || !strings.Contains(err.Error(), "not acting") {
		t.Fatalf("RunOnce = %v, want a refusal to act", err)
	}
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("increases %v without the safety state", got)
	}
	store.set(func(m *memSafety) { m.readErr = nil })
	e.run()
	if got := gpu.Increases(); len(got) != 1 {
		t.Fatalf("increases %v once readable, want one", got)
	}
	if store.writes == 0 {
		t.Fatal("the safety state was never saved")
	}
}

// TestRunTellsOfCompletedLoops: Run tells of every loop that completed,
// and only of those (a loop that could not read the safety state did
// not): the leader stores its last good configuration at its first.
func TestRunTellsOfCompletedLoops(t *testing.T) {
	e := newEnv(t)
	store := &memSafety{readErr: errors.New("the API server is unavailable")}
	e.safety = store
	e.start()
	ctx, cancel := context.WithCancel(e.ctx)
	told := make(chan struct{}, 10)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		e.a.Run(ctx, func(context.Context) { told <- struct{}{} })
	}()
	// The first loop read the unreadable state (and so fails): then the
	// state turns readable and the clock ticks.
	deadline := time.Now().Add(10 * time.Second)
	for {
		store.mu.Lock()
		reads := store.reads
		if reads > 0 {
			store.readErr = nil
		}
		store.mu.Unlock()
		if reads > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Run never ran its first loop")
		}
		runtime.Gosched()
	}
	e.clock.Step(e.opts.ScanInterval)
	select {
	case <-told:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop that completed was not told of")
	}
	if n := len(told); n != 0 {
		t.Fatalf("%d more loops told of: the failed first loop was too", n)
	}
	cancel()
	e.clock.Step(e.opts.ScanInterval)
	<-stopped
}

// TestSafetyStateWrittenBeforeDeleting: the brake's count is saved before
// the deletions it admitted are sent (a leader killed in between leaves
// them counted); when it cannot be saved, nothing is deleted.
func TestSafetyStateWrittenBeforeDeleting(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), actOnFailuresAtOnce(), withOptions(func(o *Options) {
		o.PreflightFailuresBeforeBackoff = 0
		o.PreflightIncidentMinNodes = 1000
	}))
	store := &memSafety{}
	e.safety = store
	bad := e.provider.AddGroup("bad", 0, 200, gpuTemplate("bad"), inmemory.WithTarget(4))
	e.start()
	e.register(bad, func(n *apiv1.Node) {
		n.Labels[preflight.DefaultLabel] = preflight.ValueFailed
		n.Annotations = map[string]string{preflight.DefaultFailureAnnotation: "ib: link down"}
	})
	store.set(func(m *memSafety) { m.writeErr = errors.New("etcd is slow") })
	e.run()
	e.run()
	if got := bad.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v while the brake's count could not be saved", got)
	}
	store.set(func(m *memSafety) { m.writeErr = nil })
	e.run()
	deleted := len(bad.Deleted())
	if deleted == 0 {
		t.Fatal("nothing deleted once the state can be saved")
	}
	var st safetyState
	must(t, json.Unmarshal([]byte(store.state), &st))
	if len(st.Replacements) < deleted {
		t.Fatalf("saved %d replacements, %d machines deleted: the count was not written first", len(st.Replacements), deleted)
	}
}
