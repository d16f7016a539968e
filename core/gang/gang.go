// Package gang finds the gangs among pending pods: pods that are useless
// until a minimum number of them run together (MPI training jobs). Two
// APIs name them: the coscheduling plugin's pod label
// scheduling.x-k8s.io/pod-group with its PodGroup's spec.minMember, and
// Kubernetes' native gang scheduling (scheduling.k8s.io/v1alpha2, 1.35+):
// a pod's spec.schedulingGroup.podGroupName with its PodGroup's
// spec.schedulingPolicy.gang.minCount.
package gang

import (
	"fmt"
	"sort"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	schedlisters "k8s.io/client-go/listers/scheduling/v1alpha2"
	"k8s.io/client-go/tools/cache"
)

// CoschedulingLabel is the coscheduling plugin's pod label naming its PodGroup.
const CoschedulingLabel = "scheduling.x-k8s.io/pod-group"

// Source says which API named a gang.
type Source string

const (
	Native       Source = "native"
	Coscheduling Source = "coscheduling"
)

// Key names a gang: its PodGroup, in the pods' namespace.
type Key struct {
	Namespace, Name string
	Source          Source
}

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// KeyOf returns the gang a pod belongs to, if any. The native field wins
// when a pod has both.
func KeyOf(p *apiv1.Pod) (Key, bool) {
	if sg := p.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil && *sg.PodGroupName != "" {
		return Key{Namespace: p.Namespace, Name: *sg.PodGroupName, Source: Native}, true
	}
	if n := p.Labels[CoschedulingLabel]; n != "" {
		return Key{Namespace: p.Namespace, Name: n, Source: Coscheduling}, true
	}
	return Key{}, false
}

// MinCounts finds a gang's minimum number of members.
type MinCounts interface {
	MinCount(Key) (int, bool)
}

// Lookup reads minimums from informer caches; a nil lister means that API
// is not served (the CRD is absent, or the alpha API is off).
type Lookup struct {
	Native       schedlisters.PodGroupLister
	Coscheduling cache.GenericLister
}

// MinCount implements MinCounts.
func (l Lookup) MinCount(k Key) (int, bool) {
	switch k.Source {
	case Native:
		if l.Native == nil {
			return 0, false
		}
		pg, err := l.Native.PodGroups(k.Namespace).Get(k.Name)
		if err != nil || pg.Spec.SchedulingPolicy.Gang == nil {
			return 0, false
		}
		return int(pg.Spec.SchedulingPolicy.Gang.MinCount), true
	case Coscheduling:
		if l.Coscheduling == nil {
			return 0, false
		}
		obj, err := l.Coscheduling.ByNamespace(k.Namespace).Get(k.Name)
		if err != nil {
			return 0, false
		}
		return coschedulingMin(obj)
	}
	return 0, false
}

// coschedulingMin reads spec.minMember of a coscheduling PodGroup.
func coschedulingMin(obj runtime.Object) (int, bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return 0, false
	}
	v, found, err := unstructured.NestedInt64(u.Object, "spec", "minMember")
	if err != nil || !found {
		return 0, false
	}
	return int(v), true
}

// Gang is a gang with pending members.
type Gang struct {
	Key Key
	// Min is the minimum members that must run together; MinKnown is false
	// when the PodGroup was not found, and Min is then every member known.
	Min      int
	MinKnown bool
	Pending  []*apiv1.Pod
	Running  int
	// Since is when the oldest pending member was created.
	Since time.Time
}

// Need is how many pending members must be placed for the gang to reach
// its minimum.
func (g *Gang) Need() int { return max(0, g.Min-g.Running) }

func (g *Gang) String() string {
	return fmt.Sprintf("gang %s (min %d, %d running, %d pending)", g.Key, g.Min, g.Running, len(g.Pending))
}

// Collect splits pending pods into gangs and the rest. running counts a
// gang's bound, non-terminal members. Gangs come oldest first.
func Collect(pending []*apiv1.Pod, running func(Key) int, mins MinCounts) ([]*Gang, []*apiv1.Pod) {
	byKey := map[Key]*Gang{}
	var gangs []*Gang
	var rest []*apiv1.Pod
	for _, p := range pending {
		k, ok := KeyOf(p)
		if !ok {
			rest = append(rest, p)
			continue
		}
		g := byKey[k]
		if g == nil {
			g = &Gang{Key: k}
			byKey[k] = g
			gangs = append(gangs, g)
		}
		g.Pending = append(g.Pending, p)
		if c := p.CreationTimestamp.Time; g.Since.IsZero() || c.Before(g.Since) {
			g.Since = c
		}
	}
	for _, g := range gangs {
		g.Running = running(g.Key)
		if mins != nil {
			g.Min, g.MinKnown = mins.MinCount(g.Key)
		}
		if !g.MinKnown {
			g.Min = g.Running + len(g.Pending)
		}
	}
	sort.SliceStable(gangs, func(i, j int) bool {
		if !gangs[i].Since.Equal(gangs[j].Since) {
			return gangs[i].Since.Before(gangs[j].Since)
		}
		return gangs[i].Key.String() < gangs[j].Key.String()
	})
	return gangs, rest
}
