package gang

import (
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	schedv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	schedlisters "k8s.io/client-go/listers/scheduling/v1alpha2"
	"k8s.io/client-go/tools/cache"

	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func nativeMember(name string) to.PodOption {
	return func(p *apiv1.Pod) { p.Spec.SchedulingGroup = &apiv1.PodSchedulingGroup{PodGroupName: &name} }
}

func lookup(t *testing.T) Lookup {
	t.Helper()
	native := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for name, min := range map[string]int32{"train-16": 16, "train-4": 4} {
		pg := &schedv1alpha2.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
		pg.Spec.SchedulingPolicy.Gang = &schedv1alpha2.GangSchedulingPolicy{MinCount: min}
		if err := native.Add(pg); err != nil {
			t.Fatal(err)
		}
	}
	cosched := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": "mpi", "namespace": "default"},
		"spec":     map[string]any{"minMember": int64(3)},
	}}
	if err := cosched.Add(u); err != nil {
		t.Fatal(err)
	}
	return Lookup{Native: schedlisters.NewPodGroupLister(native),
		Coscheduling: cache.NewGenericLister(cosched, schema.GroupResource{Group: "scheduling.x-k8s.io", Resource: "podgroups"})}
}

func TestKeyOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *apiv1.Pod
		want Key
		ok   bool
	}{
		{"no gang", to.Pod("p"), Key{}, false},
		{"native", to.Pod("p", nativeMember("train")), Key{"default", "train", Native}, true},
		{"coscheduling", to.Pod("p", to.Labels(CoschedulingLabel, "mpi")), Key{"default", "mpi", Coscheduling}, true},
		{"both: native wins", to.Pod("p", nativeMember("train"), to.Labels(CoschedulingLabel, "mpi")), Key{"default", "train", Native}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := KeyOf(tc.pod)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("KeyOf = %v %v, want %v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestCollect(t *testing.T) {
	l := lookup(t)
	members := func(n int, opt to.PodOption, prefix string) []*apiv1.Pod {
		out := make([]*apiv1.Pod, n)
		for i := range out {
			out[i] = to.Pod(prefix+string(rune('a'+i)), opt, to.CreatedAt(t0.Add(time.Duration(i)*time.Second)))
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		pending  []*apiv1.Pod
		running  map[Key]int
		wantMin  int
		wantNeed int
		known    bool
	}{
		{"native, min at the member count", members(16, nativeMember("train-16"), "n"), nil, 16, 16, true},
		{"native, min below the member count", members(6, nativeMember("train-4"), "n"), nil, 4, 4, true},
		{"native, members already running count", members(16, nativeMember("train-16"), "n"), map[Key]int{{"default", "train-16", Native}: 10}, 16, 6, true},
		{"coscheduling minMember", members(5, to.Labels(CoschedulingLabel, "mpi"), "c"), nil, 3, 3, true},
		{"coscheduling, running reach the minimum", members(2, to.Labels(CoschedulingLabel, "mpi"), "c"), map[Key]int{{"default", "mpi", Coscheduling}: 3}, 3, 0, true},
		{"PodGroup not found: every member", members(5, nativeMember("missing"), "n"), map[Key]int{{"default", "missing", Native}: 2}, 7, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			solo := to.Pod("solo")
			gangs, rest := Collect(append(tc.pending, solo), func(k Key) int { return tc.running[k] }, l)
			if len(gangs) != 1 || len(rest) != 1 || rest[0] != solo {
				t.Fatalf("gangs %v rest %d", gangs, len(rest))
			}
			g := gangs[0]
			if g.Min != tc.wantMin || g.Need() != tc.wantNeed || g.MinKnown != tc.known || len(g.Pending) != len(tc.pending) {
				t.Fatalf("%s: min %d need %d known %v; want %d %d %v", g, g.Min, g.Need(), g.MinKnown, tc.wantMin, tc.wantNeed, tc.known)
			}
			if !g.Since.Equal(t0) {
				t.Fatalf("since %s, want the oldest member's %s", g.Since, t0)
			}
		})
	}
}

func TestCollectOrdersGangsOldestFirst(t *testing.T) {
	young := to.Pod("y", nativeMember("b"), to.CreatedAt(t0.Add(time.Minute)))
	old := to.Pod("o", nativeMember("a"), to.CreatedAt(t0))
	gangs, _ := Collect([]*apiv1.Pod{young, old}, func(Key) int { return 0 }, nil)
	if len(gangs) != 2 || gangs[0].Key.Name != "a" {
		t.Fatalf("gangs %v, want a first", gangs)
	}
}
