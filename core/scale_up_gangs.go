package core

import (
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
)

// collectGangs splits the pending pods into gangs that still miss members
// for their minimum, and the rest (including members beyond a minimum
// that running members already reach).
func (a *Autoscaler) collectGangs(l *loop, pending []*apiv1.Pod) ([]*gang.Gang, []*apiv1.Pod) {
	var keys map[gang.Key]int
	running := func(k gang.Key) int {
		if keys == nil {
			// One pass over the bound pods, only when some gang is pending.
			keys = map[gang.Key]int{}
			for i := 0; i < l.snap.Len(); i++ {
				for _, pi := range l.snap.NodeInfo(i).GetPods() {
					p := pi.GetPod()
					// A request's booked pod or a buffer's chunk is room,
					// not a running member.
					if p.Status.Phase == apiv1.PodSucceeded || p.Status.Phase == apiv1.PodFailed || isVirtual(p) {
						continue
					}
					if k, ok := gang.KeyOf(p); ok {
						keys[k]++
					}
				}
			}
		}
		return keys[k]
	}
	gangs, rest := gang.Collect(pending, running, a.gangs)
	out := gangs[:0]
	for _, g := range gangs {
		if g.Need() == 0 {
			rest = append(rest, g.Pending...)
			continue
		}
		out = append(out, g)
	}
	return out, rest
}
