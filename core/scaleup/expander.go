package scaleup

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"sort"
	"strconv"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Option is one node group's answer to the pending pods.
type Option struct {
	Group    string
	Estimate *Estimate
}

// Expander narrows a set of options to the ones it prefers. An expander
// returns a non-empty subset of a non-empty input.
type Expander interface {
	Name() string
	Best(options []*Option) []*Option
}

// Expander names, as in CA's --expander flag.
const (
	LeastWaste = "least-waste"
	MostPods   = "most-pods"
	Priority   = "priority"
	Random     = "random"
)

// ValidExpanders lists the expander names --expander accepts.
func ValidExpanders() []string { return []string{LeastWaste, MostPods, Priority, Random} }

// Chain applies expanders in order, each narrowing the previous one's
// choice; when several options remain, the one with the lowest group ID
// wins, so decisions are reproducible.
type Chain struct {
	expanders []Expander
}

// PriorityConfig returns the priority expander's current configuration.
type PriorityConfig func() *Priorities

// NewChain builds a chain from names such as "priority,least-waste".
// gpu names the GPU resource used by least-waste; priorities supplies the
// priority expander's configuration; rnd is the random source.
func NewChain(names []string, gpu apiv1.ResourceName, priorities PriorityConfig, rnd *rand.Rand) (*Chain, error) {
	c := &Chain{}
	for _, n := range names {
		switch strings.TrimSpace(n) {
		case LeastWaste:
			c.expanders = append(c.expanders, leastWaste{gpu: gpu})
		case MostPods:
			c.expanders = append(c.expanders, mostPods{})
		case Priority:
			c.expanders = append(c.expanders, priority{config: priorities})
		case Random:
			c.expanders = append(c.expanders, random{rnd: rnd})
		default:
			return nil, fmt.Errorf("--expander: unknown expander %q (valid: %s)", n, strings.Join(ValidExpanders(), ", "))
		}
	}
	if len(c.expanders) == 0 {
		return nil, fmt.Errorf("--expander: no expander given (valid: %s)", strings.Join(ValidExpanders(), ", "))
	}
	return c, nil
}

// Names lists the chain's expanders in order.
func (c *Chain) Names() []string {
	out := make([]string, len(c.expanders))
	for i, e := range c.expanders {
		out[i] = e.Name()
	}
	return out
}

// Pick returns the chosen option, or nil for no options.
func (c *Chain) Pick(options []*Option) *Option {
	if len(options) == 0 {
		return nil
	}
	best := options
	for _, e := range c.expanders {
		if len(best) <= 1 {
			break
		}
		if b := e.Best(best); len(b) > 0 {
			best = b
		}
	}
	sort.SliceStable(best, func(i, j int) bool { return best[i].Group < best[j].Group })
	return best[0]
}

// --- least-waste ---

// leastWaste prefers the option whose new nodes would have the smallest
// unrequested share of CPU and memory (and GPUs, when the nodes have any);
// ties go to the option that schedules more pods.
type leastWaste struct{ gpu apiv1.ResourceName }

func (leastWaste) Name() string { return LeastWaste }

func (l leastWaste) Best(options []*Option) []*Option {
	const eps = 1e-9
	bestScore := math.Inf(1)
	var best []*Option
	for _, o := range options {
		s := l.waste(o)
		switch {
		case s < bestScore-eps:
			bestScore, best = s, []*Option{o}
		case math.Abs(s-bestScore) <= eps:
			best = append(best, o)
		}
	}
	if len(best) > 1 {
		best = mostPods{}.Best(best)
	}
	return best
}

func (l leastWaste) waste(o *Option) float64 {
	var allocCPU, reqCPU, allocMem, reqMem, allocGPU, reqGPU float64
	for _, n := range o.Estimate.Nodes {
		a, r := n.GetAllocatable(), n.GetRequested()
		allocCPU += float64(a.GetMilliCPU())
		reqCPU += float64(r.GetMilliCPU())
		allocMem += float64(a.GetMemory())
		reqMem += float64(r.GetMemory())
		allocGPU += float64(a.GetScalarResources()[l.gpu])
		reqGPU += float64(r.GetScalarResources()[l.gpu])
	}
	frac := func(alloc, req float64) float64 {
		if alloc <= 0 {
			return 0
		}
		return (alloc - req) / alloc
	}
	w := frac(allocCPU, reqCPU) + frac(allocMem, reqMem)
	if allocGPU > 0 {
		// An idle GPU is the most expensive waste on a GPU cluster.
		w += 2 * frac(allocGPU, reqGPU)
	}
	return w
}

// --- most-pods ---

type mostPods struct{}

func (mostPods) Name() string { return MostPods }

func (mostPods) Best(options []*Option) []*Option {
	max := -1
	var best []*Option
	for _, o := range options {
		n := o.Estimate.PodsPlaced()
		switch {
		case n > max:
			max, best = n, []*Option{o}
		case n == max:
			best = append(best, o)
		}
	}
	return best
}

// --- random ---

type random struct{ rnd *rand.Rand }

func (random) Name() string { return Random }

func (r random) Best(options []*Option) []*Option {
	return []*Option{options[r.rnd.IntN(len(options))]}
}

// --- priority ---

// Priorities is the priority expander's configuration, CA's format: a
// ConfigMap key "priorities" holding a YAML map of priority to a list of
// regular expressions matched against node group IDs.
type Priorities struct {
	levels []priorityLevel
}

type priorityLevel struct {
	priority int
	res      []*regexp.Regexp
}

// ParsePriorities parses the "priorities" value. Errors name the priority
// and the expression at fault.
func ParsePriorities(data string) (*Priorities, error) {
	raw := map[string][]string{}
	if err := yaml.Unmarshal([]byte(data), &raw); err != nil {
		return nil, fmt.Errorf("priorities: not a map of priority to list of regular expressions: %w", err)
	}
	p := &Priorities{}
	for k, list := range raw {
		prio, err := strconv.Atoi(k)
		if err != nil {
			return nil, fmt.Errorf("priorities: key %q is not an integer", k)
		}
		lvl := priorityLevel{priority: prio}
		for _, expr := range list {
			re, err := regexp.Compile(expr)
			if err != nil {
				return nil, fmt.Errorf("priorities: priority %d: expression %q: %w", prio, expr, err)
			}
			lvl.res = append(lvl.res, re)
		}
		p.levels = append(p.levels, lvl)
	}
	sort.Slice(p.levels, func(i, j int) bool { return p.levels[i].priority > p.levels[j].priority })
	return p, nil
}

// PriorityOf returns the highest priority whose expressions match group.
func (p *Priorities) PriorityOf(group string) (int, bool) {
	if p == nil {
		return 0, false
	}
	for _, l := range p.levels {
		for _, re := range l.res {
			if re.MatchString(group) {
				return l.priority, true
			}
		}
	}
	return 0, false
}

type priority struct{ config PriorityConfig }

func (priority) Name() string { return Priority }

// Best keeps the options of the highest matching priority. Options that
// match no expression are kept only when none match at all.
func (p priority) Best(options []*Option) []*Option {
	var cfg *Priorities
	if p.config != nil {
		cfg = p.config()
	}
	best, top := []*Option(nil), math.MinInt
	for _, o := range options {
		prio, ok := cfg.PriorityOf(o.Group)
		if !ok {
			continue
		}
		switch {
		case prio > top:
			top, best = prio, []*Option{o}
		case prio == top:
			best = append(best, o)
		}
	}
	if len(best) == 0 {
		return options
	}
	return best
}
