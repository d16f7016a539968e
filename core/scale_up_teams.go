package core

import (
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
)

// teamTaints are the taints of a group's template that keep pods off its
// nodes (NoSchedule, NoExecute): a team's capacity, such as
// openai.com/team=<team>:NoSchedule from the scale set's tags.
func teamTaints(node *apiv1.Node) []apiv1.Taint {
	var out []apiv1.Taint
	for _, t := range node.Spec.Taints {
		if t.Effect == apiv1.TaintEffectNoSchedule || t.Effect == apiv1.TaintEffectNoExecute {
			out = append(out, t)
		}
	}
	return out
}

// refuseBorrowers keeps borrowers — pods that tolerate a team's taint
// only through a catch-all toleration — from growing the team's group:
// they may use idle room anywhere, but new capacity of a team is bought by
// the team's own pods. Nil when the group has no team taint.
func refuseBorrowers(group string, taints []apiv1.Taint) func(*simulator.Group) string {
	if len(taints) == 0 {
		return nil
	}
	return func(g *simulator.Group) string {
		p := g.Rep()
		for _, t := range taints {
			if borrows(p.Spec.Tolerations, t) {
				return fmt.Sprintf("pod tolerates taint %s of node group %s only through a catch-all toleration: a borrower does not grow a team's group (--borrowers-scale-team-groups)", t.Key, group)
			}
		}
		return ""
	}
}

// borrows: the taint is tolerated, but by no toleration naming its key.
func borrows(tols []apiv1.Toleration, t apiv1.Taint) bool {
	wildcard := false
	for _, tol := range tols {
		if tol.Key == t.Key && tol.ToleratesTaint(klog.Background(), &t, true) {
			return false
		}
		if tol.Key == "" && tol.Operator == apiv1.TolerationOpExists && (tol.Effect == "" || tol.Effect == t.Effect) {
			wildcard = true
		}
	}
	return wildcard
}

// stripTaints removes the taints whose key drop says so from a template:
// taints a separate manager puts on live nodes (--status-taint) and
// startup taints (--startup-taint), which a node built from the template
// will not have when it takes pods.
func stripTaints(n *apiv1.Node, drop func(key string) bool) {
	out := n.Spec.Taints[:0:0]
	for _, t := range n.Spec.Taints {
		if !drop(t.Key) {
			out = append(out, t)
		}
	}
	n.Spec.Taints = out
}
