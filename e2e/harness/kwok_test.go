package harness

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kwok/pkg/apis/internalversion"
	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/utils/lifecycle"
)

// podLifecycle loads the pod stages kwok is given, through kwok's own
// config and lifecycle code.
func podLifecycle(t *testing.T) lifecycle.Lifecycle {
	t.Helper()
	var stages []*internalversion.Stage
	for _, doc := range strings.Split(kwokStages(0), "\n---\n") {
		obj, err := config.Unmarshal(doc)
		if err != nil {
			t.Fatalf("kwok cannot read a document of its configuration: %v\n%s", err, doc)
		}
		if st, ok := obj.(*internalversion.Stage); ok && st.Spec.ResourceRef.Kind == "Pod" {
			stages = append(stages, st)
		}
	}
	lc, err := lifecycle.NewLifecycle(stages)
	if err != nil {
		t.Fatal(err)
	}
	return lc
}

// TestKwokPodDeleteStages checks which stage kwok plays for a terminating
// pod and after how long: at once without the delay annotation, else after
// min(the delay, the grace left), never a random time between the two.
func TestKwokPodDeleteStages(t *testing.T) {
	lc := podLifecycle(t)
	tests := []struct {
		name      string
		delay     string        // annotation; "" for none
		graceLeft time.Duration // until the deletionTimestamp
		wantStage string
		want      time.Duration
	}{
		{"no annotation", "", 30 * time.Second, "pod-delete", 0},
		{"exits before its grace", "6s", 30 * time.Second, "pod-delete-after-exit", 6 * time.Second},
		{"killed at its grace end", "60s", 3 * time.Second, "pod-delete-after-exit", 3 * time.Second},
		{"compound duration", "1m30s", time.Hour, "pod-delete-after-exit", 90 * time.Second},
		{"milliseconds", "1500ms", time.Minute, "pod-delete-after-exit", 1500 * time.Millisecond},
		{"fraction, killed", "2.5h", 10 * time.Minute, "pod-delete-after-exit", 10 * time.Minute},
		{"grace already over", "60s", -2 * time.Second, "pod-delete-after-exit", -2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			// kwok's jq reads the wall clock (jq's now); so does the
			// deletionTimestamp, which has whole seconds on the wire.
			now := time.Now()
			end := now.Add(tt.graceLeft).Truncate(time.Second)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", DeletionTimestamp: &metav1.Time{Time: end}},
				Spec:       corev1.PodSpec{NodeName: "n"},
				Status:     corev1.PodStatus{Phase: corev1.PodRunning},
			}
			if tt.delay != "" {
				pod.Annotations = map[string]string{PodDeleteDelayAnnotation: tt.delay}
			}
			event := &lifecycle.Event{Labels: pod.Labels, Annotations: pod.Annotations, Data: pod}
			for range 20 { // a random pick would show in 20 draws
				stage, err := lc.Match(ctx, event)
				if err != nil || stage == nil {
					t.Fatalf("Match = %v, %v; want stage %s", stage, err, tt.wantStage)
				}
				if stage.Name() != tt.wantStage {
					t.Fatalf("stage %s, want %s", stage.Name(), tt.wantStage)
				}
				got, _, err := stage.Delay(ctx, event, now)
				if err != nil {
					t.Fatal(err)
				}
				want := tt.want
				if tt.graceLeft < tt.want || tt.graceLeft < 0 {
					want = end.Sub(now) // the grace end, at whole seconds
				}
				// jq's now is read a little after ours.
				if d := got - want; d > 0 || d < -time.Second {
					t.Fatalf("delay %s, want %s", got, want)
				}
			}
		})
	}
}

// TestKwokJobPodsComplete: a Running pod of a Job completes, unless it
// carries KeepRunningAnnotation; other pods never do.
func TestKwokJobPodsComplete(t *testing.T) {
	lc := podLifecycle(t)
	job := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: "u"}}
	for _, tc := range []struct {
		name   string
		owners []metav1.OwnerReference
		keep   bool
		want   string // "" for no stage
	}{
		{"a Job's pod", job, false, "pod-complete"},
		{"a Job's pod kept running", job, true, ""},
		{"a Deployment's pod", []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "r"}}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", OwnerReferences: tc.owners},
				Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
				Status:     corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "c"}}},
			}
			if tc.keep {
				pod.Annotations = map[string]string{KeepRunningAnnotation: "true"}
			}
			stage, err := lc.Match(context.Background(), &lifecycle.Event{Labels: pod.Labels, Annotations: pod.Annotations, Data: pod})
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if stage != nil {
				got = stage.Name()
			}
			if got != tc.want {
				t.Fatalf("stage %q, want %q", got, tc.want)
			}
		})
	}
}

// TestKwokNodeHeartbeatInterval checks the node heartbeat stage kwok reads:
// its stock 600–610 s by default, the interval given otherwise.
func TestKwokNodeHeartbeatInterval(t *testing.T) {
	for _, tc := range []struct {
		interval     time.Duration
		want, jitter int64
	}{
		{0, 600_000, 610_000},
		{20 * time.Minute, 1_200_000, 1_210_000},
	} {
		found := false
		for _, doc := range strings.Split(kwokStages(tc.interval), "\n---\n") {
			obj, err := config.Unmarshal(doc)
			if err != nil {
				t.Fatalf("kwok cannot read a document of its configuration: %v\n%s", err, doc)
			}
			st, ok := obj.(*internalversion.Stage)
			if !ok || st.Name != "node-heartbeat-with-lease" {
				continue
			}
			found = true
			d := st.Spec.Delay
			if d == nil || d.DurationMilliseconds == nil || d.JitterDurationMilliseconds == nil ||
				*d.DurationMilliseconds != tc.want || *d.JitterDurationMilliseconds != tc.jitter {
				t.Errorf("interval %s: delay %+v, want %d ms up to %d ms", tc.interval, d, tc.want, tc.jitter)
			}
		}
		if !found {
			t.Errorf("interval %s: no node-heartbeat-with-lease stage", tc.interval)
		}
	}
}
