// Package scaleup plans scale-ups: it estimates, per node group, how many
// new nodes the pending pods need (binpacking on template nodes with the
// scheduler framework), picks a group with an expander chain, and says why
// for the pods no group can take.
package scaleup

import (
	"context"
	"strconv"
	"sync"

	apiv1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// Pending is an equivalence group whose pods from From on have no node.
type Pending struct {
	G    *simulator.Group
	From int
}

// Left is how many of the group's pods still need a node.
func (p Pending) Left() int { return len(p.G.Pods) - p.From }

// Estimate is what one node group would need for the pending pods.
type Estimate struct {
	Group    string
	NewNodes int
	// Placed[i] pods of pending group i (from its From) fit on the new nodes.
	Placed []int
	// Reasons[i], when set, says why the rest of pending group i did not
	// fit, and Codes[i] its code.
	Reasons []string
	Codes   []ReasonCode
	// Nodes are the new template nodes with the pods placed on them.
	Nodes []fwk.NodeInfo
	fork  *snapshot.Fork
}

// PodsPlaced is the number of pods the estimate gives a node.
func (e *Estimate) PodsPlaced() int {
	n := 0
	for _, c := range e.Placed {
		n += c
	}
	return n
}

// Estimator binpacks pending pods onto copies of a node group's template.
type Estimator struct {
	Sim *simulator.Simulator

	// clones keeps, per node group, the empty copies of its template the
	// estimates name template-<group>-<i>, built once (a node copy and the
	// framework's allocatable parsing, a fifth of a 10,000-pod scale-up)
	// and handed out as Snapshots. Dropped when the template changes.
	mu     sync.Mutex
	clones map[string]*templateClones
	// count, when set, counts the estimates made (tests).
	count *int
}

type templateClones struct {
	tmpl  fwk.NodeInfo
	nodes []fwk.NodeInfo // never changed once built
}

// templateNode returns a new copy of the group's template as its node i.
func (e *Estimator) templateNode(tmpl fwk.NodeInfo, group string, i int) fwk.NodeInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.clones == nil {
		e.clones = map[string]*templateClones{}
	}
	c := e.clones[group]
	if c == nil || c.tmpl != tmpl {
		c = &templateClones{tmpl: tmpl}
		e.clones[group] = c
	}
	for len(c.nodes) <= i {
		c.nodes = append(c.nodes, newTemplateNode(tmpl, group, len(c.nodes)))
	}
	return c.nodes[i].Snapshot()
}

// Estimate places the pending pods, largest first, onto new copies of tmpl
// added to a child of base, at most limit of them. A group whose
// representative does not fit an empty template is skipped with the
// framework's reason.
//
// With gpuPodsOnly, pods that request no GPU are not placed (the group's
// nodes are GPU machines kept for GPU work). refuse, when set, names why a
// pod group may not grow this node group (a borrower and a team's group).
func (e *Estimator) Estimate(ctx context.Context, base *snapshot.Fork, pending []Pending, groupID string, tmpl fwk.NodeInfo, limit int, gpuPodsOnly bool, refuse func(*simulator.Group) string) *Estimate {
	if e.count != nil {
		*e.count++
	}
	fork := base.Fork()
	est := &Estimate{Group: groupID, Placed: make([]int, len(pending)), Reasons: make([]string, len(pending)), Codes: make([]ReasonCode, len(pending)), fork: fork}
	b := &binpack{e: e, fork: fork, est: est, group: groupID, tmpl: tmpl, limit: limit}
	for pi, p := range pending {
		if p.Left() <= 0 {
			continue
		}
		if why, code := refusal(p.G, gpuPodsOnly, refuse); why != "" {
			est.Reasons[pi], est.Codes[pi] = why, code
			continue
		}
		b.place(ctx, pi, p)
	}
	est.NewNodes = len(b.newNodes)
	for _, idx := range b.newNodes {
		est.Nodes = append(est.Nodes, fork.NodeInfo(idx))
	}
	return est
}

// refusal is why pod group g may not grow the node group at all: a GPU
// group's pods that request no GPU, or refuse's reason; "" when it may.
func refusal(g *simulator.Group, gpuPodsOnly bool, refuse func(*simulator.Group) string) (string, ReasonCode) {
	if gpuPodsOnly && g.Req.GPU == 0 {
		return "GPU node group, pod requests no GPU", ReasonGPUGroup
	}
	if refuse != nil {
		if why := refuse(g); why != "" {
			return why, ReasonRefused
		}
	}
	return "", ""
}

// binpack is one Estimate's placing of pods onto new template nodes.
type binpack struct {
	e     *Estimator
	fork  *snapshot.Fork
	est   *Estimate
	group string
	tmpl  fwk.NodeInfo
	limit int
	// newNodes are the fork's indexes of the new nodes; off skips the
	// template node names the fork held already.
	newNodes []int
	off      int
}

// place places pending group pi's pods on the new nodes, adding one
// when none takes the next pod, until the limit or a pod that fits no
// new node (its reason recorded).
func (b *binpack) place(ctx context.Context, pi int, p Pending) {
	g := p.G
	ss := b.e.Sim.NewSession(ctx, b.fork, g)
	if st := ss.Failed(); st != nil {
		b.est.Reasons[pi], b.est.Codes[pi] = statusReason(st), ReasonDoesNotFit
		return
	}
	pos := 0
	for i := p.From; i < len(g.Pods); i++ {
		if !g.Simple {
			pos = 0
		}
		if at, ok := b.onNewNodes(ctx, ss, i, pos); ok {
			pos = at
			b.est.Placed[pi]++
			continue
		}
		var why string
		var code ReasonCode
		if ss, why, code = b.onNewNode(ctx, ss, g, i); why != "" {
			b.est.Reasons[pi], b.est.Codes[pi] = why, code
			break
		}
		pos = len(b.newNodes) - 1
		b.est.Placed[pi]++
	}
}

// onNewNodes places pod i on the first new node from pos that takes it,
// and says which.
func (b *binpack) onNewNodes(ctx context.Context, ss *simulator.Session, i, pos int) (int, bool) {
	for ; pos < len(b.newNodes); pos++ {
		if ss.TryNode(ctx, i, b.newNodes[pos]) == nil {
			ss.Commit(ctx, i, b.newNodes[pos])
			return pos, true
		}
	}
	return pos, false
}

// onNewNode adds a new template node and places pod i on it, returning
// the session to go on with; why (and its code) when the limit is
// reached, the node cannot be added or the pod does not fit it.
func (b *binpack) onNewNode(ctx context.Context, ss *simulator.Session, g *simulator.Group, i int) (_ *simulator.Session, why string, code ReasonCode) {
	if len(b.newNodes) >= b.limit {
		return ss, "max-size", ReasonMaxSize
	}
	idx, err := b.addNode()
	if err != nil {
		return ss, err.Error(), ReasonNoTemplate
	}
	if !g.Simple {
		// Spreading and affinity count topology domains at PreFilter:
		// a new node is a new domain.
		ss = b.e.Sim.NewSession(ctx, b.fork, g)
	}
	if st := ss.TryNode(ctx, i, idx); st != nil {
		b.fork.RemoveLastNode()
		return ss, statusReason(st), ReasonDoesNotFit
	}
	ss.Commit(ctx, i, idx)
	b.newNodes = append(b.newNodes, idx)
	return ss, "", ""
}

// addNode adds the next template node to the fork, named past the
// template nodes the fork holds already (an earlier gang's of this
// group, planned in the same pass).
func (b *binpack) addNode() (int, error) {
	for {
		if _, taken := b.fork.Index(templateNodeName(b.group, b.off+len(b.newNodes))); !taken {
			break
		}
		b.off++
	}
	return b.fork.AddNode(b.e.templateNode(b.tmpl, b.group, b.off+len(b.newNodes)))
}

// Fork is the simulated cluster with the estimate's nodes and pods.
func (e *Estimate) Fork() *snapshot.Fork { return e.fork }

// newTemplateNode copies a template NodeInfo under a unique name and
// hostname (topology plugins must see each new node as its own domain).
// The node object is copied shallowly: only its name and labels change.
func newTemplateNode(tmpl fwk.NodeInfo, group string, i int) fwk.NodeInfo {
	return CloneTemplate(tmpl, templateNodeName(group, i))
}

func templateNodeName(group string, i int) string { return "template-" + group + "-" + strconv.Itoa(i) }

// CloneTemplate copies a template NodeInfo as a node called name.
func CloneTemplate(tmpl fwk.NodeInfo, name string) fwk.NodeInfo {
	ni := tmpl.Snapshot()
	src := tmpl.Node()
	n := *src
	n.ObjectMeta = *src.ObjectMeta.DeepCopy()
	n.Name = name
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[apiv1.LabelHostname] = name
	ni.SetNode(&n)
	return ni
}

// statusReason turns a framework status into one line.
func statusReason(st *fwk.Status) string {
	r := st.Reasons()
	switch len(r) {
	case 0:
		return st.Message()
	case 1:
		return r[0]
	}
	s := r[0]
	for _, x := range r[1:] {
		s += ", " + x
	}
	return s
}
