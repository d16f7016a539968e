package core

import (
	"context"
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
)

// EventReplacementBrake is on the status ConfigMap when the replacement
// brake holds deletions back.
const EventReplacementBrake = "ReplacementBrake"

// replacements is the replacement brake: the budget of deletions that are
// not scale-down (nodes that failed preflight, machines in error or never
// registered), shared by every such path.
type replacements struct {
	brake  *scaledown.Brake
	braked bool
}

func (o Options) replacementBrakeOptions() scaledown.BrakeOptions {
	return scaledown.BrakeOptions{ClusterShare: o.ReplacementBrakeClusterShare, GroupShare: 1,
		Window: o.ReplacementBrakeWindow, Min: o.ReplacementBrakeMinNodes}
}

// allowReplacements says how many of n machines of group may be deleted
// now, and counts them against the budget; the rest wait.
func (a *Autoscaler) allowReplacements(l *loop, group string, n int) int {
	cluster, size := a.clusterTarget(), 0
	if gs := a.registry.Group(group); gs != nil && gs.Readiness.TargetKnown {
		size = gs.Readiness.Target
	}
	k := 0
	for ; k < n && a.replace.brake.Allow(l.now, group, cluster, size); k++ {
		a.replace.brake.Record(l.now, group)
	}
	l.replacementsHeld += n - k
	return k
}

// reportReplacements says whether the brake held anything this loop: an
// event when it engages, the metric, the status.
func (a *Autoscaler) reportReplacements(ctx context.Context, l *loop) {
	held := l.replacementsHeld > 0
	if held && !a.replace.braked {
		o := a.opts
		msg := fmt.Sprintf("replacement brake engaged: %d deletions held; %d nodes replaced within %s, the most allowed (%.0f%% of the cluster or %d nodes)",
			l.replacementsHeld, a.replace.brake.Recent(l.now), o.ReplacementBrakeWindow, 100*o.ReplacementBrakeClusterShare, o.ReplacementBrakeMinNodes)
		klog.FromContext(ctx).Info("Replacement brake engaged", "held", l.replacementsHeld, "recent", a.replace.brake.Recent(l.now), "window", o.ReplacementBrakeWindow)
		a.groupEvent(apiv1.EventTypeWarning, EventReplacementBrake, msg)
	}
	a.replace.braked = held
	v := 0.0
	if held {
		v = 1
	}
	a.metrics.ReplacementBrakeEngaged.Set(v)
}
