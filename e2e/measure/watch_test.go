package measure

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func pod(uid string, phase apiv1.PodPhase) *apiv1.Pod {
	return &apiv1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: uid, Namespace: "ns"}, Status: apiv1.PodStatus{Phase: phase}}
}

func TestNodeName(t *testing.T) {
	for _, tc := range []struct {
		name string
		obj  any
		want string
	}{
		{"a node", &apiv1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, "n1"},
		{"a tombstone", cache.DeletedFinalStateUnknown{Key: "n2"}, "n2"},
		{"something else", pod("p", apiv1.PodRunning), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NodeName(tc.obj); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPhases(t *testing.T) {
	type event struct {
		gone bool
		obj  any
	}
	set := func(uid string, phase apiv1.PodPhase) event { return event{obj: pod(uid, phase)} }
	gone := func(obj any) event { return event{gone: true, obj: obj} }
	for _, tc := range []struct {
		name                      string
		events                    []event
		running, pending, success int
	}{
		{"none", nil, 0, 0, 0},
		{"added", []event{set("a", apiv1.PodPending), set("b", apiv1.PodRunning)}, 1, 1, 0},
		{"a pod counts in its last phase only", []event{set("a", apiv1.PodPending), set("a", apiv1.PodRunning), set("a", apiv1.PodRunning)}, 1, 0, 0},
		{"run to completion", []event{set("a", apiv1.PodRunning), set("a", apiv1.PodSucceeded)}, 0, 0, 1},
		{"deleted", []event{set("a", apiv1.PodRunning), set("b", apiv1.PodRunning), gone(pod("a", apiv1.PodRunning))}, 1, 0, 0},
		{"deleted, seen by its tombstone", []event{set("a", apiv1.PodRunning), gone(cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: pod("a", apiv1.PodRunning)})}, 0, 0, 0},
		{"a tombstone without its pod", []event{set("a", apiv1.PodRunning), gone(cache.DeletedFinalStateUnknown{Key: "ns/a"})}, 1, 0, 0},
		{"a pod never seen", []event{set("a", apiv1.PodPending), gone(pod("z", apiv1.PodRunning))}, 0, 1, 0},
		{"not a pod", []event{{obj: &apiv1.Node{}}, set("a", apiv1.PodRunning)}, 1, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Phases
			for _, e := range tc.events {
				if e.gone {
					s.Delete(e.obj)
					continue
				}
				_, isPod := e.obj.(*apiv1.Pod)
				if got := s.Set(e.obj); got != isPod {
					t.Errorf("Set(%T) = %v", e.obj, got)
				}
			}
			for phase, want := range map[apiv1.PodPhase]int{apiv1.PodRunning: tc.running, apiv1.PodPending: tc.pending, apiv1.PodSucceeded: tc.success} {
				if got := s.Count(phase); got != want {
					t.Errorf("%s: %d, want %d", phase, got, want)
				}
			}
		})
	}
}

// TestWatcherStart: the nodes' and the namespace's pods' events reach
// their handlers, and the informers sync.
func TestWatcherStart(t *testing.T) {
	c := fake.NewClientset(
		&apiv1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		pod("a", apiv1.PodRunning),
		&apiv1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "other", Name: "other", Namespace: "elsewhere"}},
	)
	var mu sync.Mutex
	nodes := map[string]bool{}
	var phases Phases
	w := &Watcher{stopCh: make(chan struct{})}
	synced, err := w.start(c, "ns", cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { mu.Lock(); nodes[NodeName(obj)] = true; mu.Unlock() },
		DeleteFunc: func(obj any) { mu.Lock(); delete(nodes, NodeName(obj)); mu.Unlock() },
	}, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { mu.Lock(); phases.Set(obj); mu.Unlock() },
		UpdateFunc: func(_, obj any) { mu.Lock(); phases.Set(obj); mu.Unlock() },
		DeleteFunc: func(obj any) { mu.Lock(); phases.Delete(obj); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		t.Fatal("informers did not sync")
	}
	if _, err := c.CoreV1().Pods("ns").Create(ctx, pod("b", apiv1.PodPending), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		mu.Lock()
		running, pending, n := phases.Count(apiv1.PodRunning), phases.Count(apiv1.PodPending), len(nodes)
		mu.Unlock()
		if running == 1 && pending == 1 && n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("running %d, pending %d, nodes %d; want 1, 1 and 0 (the other namespace's pod left out)", running, pending, n)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestWatchFails: Watch stops what it started and says why when a further
// informer cannot start, or the informers do not sync.
func TestWatchFails(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1", Timeout: time.Second}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	var stop <-chan struct{}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		more []Informer
		want string
	}{
		{"a further informer fails", context.Background(), []Informer{func(cfg *rest.Config, s <-chan struct{}) (cache.InformerSynced, error) {
			if cfg.ContentType != "application/vnd.kubernetes.protobuf" {
				t.Errorf("the further informer's configuration is %q, want Watch's", cfg.ContentType)
			}
			stop = s
			return nil, errors.New("no CRD")
		}}, "no CRD"},
		{"no sync", cancelled, []Informer{func(_ *rest.Config, s <-chan struct{}) (cache.InformerSynced, error) {
			stop = s
			return func() bool { return false }, nil
		}}, "did not sync"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stop = nil
			w, err := Watch(tc.ctx, cfg, "ns", cache.ResourceEventHandlerFuncs{}, cache.ResourceEventHandlerFuncs{}, tc.more...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || w != nil {
				t.Fatalf("Watch = %v, %v; want an error naming %q", w, err, tc.want)
			}
			select {
			case <-stop:
			default:
				t.Error("the informers were not stopped")
			}
		})
	}
}
