package core

import (
	"strings"
	"testing"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/gang"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

type mins map[string]int

func (m mins) MinCount(k gang.Key) (int, bool) {
	n, ok := m[k.Name]
	return n, ok
}

// gangMembers are n whole-node GPU pods of a native gang.
func gangMembers(n int, name string, opts ...to.PodOption) []*apiv1.Pod {
	member := func(p *apiv1.Pod) { p.Spec.SchedulingGroup = &apiv1.PodSchedulingGroup{PodGroupName: &name} }
	return pendingPods(n, name, append(append(wholeGPU(), member), opts...)...)
}

func withGangs(m mins) envOption { return func(e *env) { e.gangs = m } }

func TestGangPlanning(t *testing.T) {
	type group struct {
		name string
		max  int
	}
	for _, tc := range []struct {
		name      string
		groups    []group
		gangs     map[string]int // gang → members (min = members)
		split     bool
		want      map[string]int // nodes requested per group
		noScaleOn string         // a NotTriggerScaleUp event contains this
	}{
		{"fits one group", []group{{"gpu-a", 20}}, map[string]int{"train": 16}, false, map[string]int{"gpu-a": 16}, ""},
		{"too big for the group's max: nothing", []group{{"gpu-a", 10}}, map[string]int{"train": 16}, false, map[string]int{},
			"node group gpu-a can add 10 nodes, the gang needs 16"},
		{"one group preferred over a split", []group{{"gpu-a", 10}, {"gpu-b", 20}}, map[string]int{"train": 16}, false, map[string]int{"gpu-b": 16}, ""},
		{"fits only split, split off: nothing", []group{{"gpu-a", 10}, {"gpu-b", 10}}, map[string]int{"train": 16}, false, map[string]int{},
			"no node group can take them all"},
		{"fits only split, split on", []group{{"gpu-a", 10}, {"gpu-b", 10}}, map[string]int{"train": 16}, true, map[string]int{"gpu-a": 10, "gpu-b": 6}, ""},
		{"two gangs, room for one: one whole, not both half", []group{{"gpu-a", 16}}, map[string]int{"train-1": 12, "train-2": 12}, false,
			map[string]int{"gpu-a": 12}, "gang default/train-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mins{}
			for g, n := range tc.gangs {
				m[g] = n
			}
			e := newEnv(t, withGangs(m), withOptions(func(o *Options) {
				o.GangSplit = tc.split
				o.NodeAdditionBurst = 4 // a gang bigger than the burst still goes whole
			}))
			gs := map[string]*inmemory.Group{}
			for _, g := range tc.groups {
				gs[g.name] = e.provider.AddGroup(g.name, 0, g.max, gpuTemplate(g.name))
			}
			e.start()
			for g, n := range tc.gangs {
				e.add(gangMembers(n, g))
			}
			e.run()
			for name, g := range gs {
				inc := g.Increases()
				if len(inc) > 1 {
					t.Fatalf("%s increases %v: a gang's nodes must go in one request", name, inc)
				}
				if got := sum(inc); got != tc.want[name] {
					t.Fatalf("%s: %d nodes requested (%v), want %d", name, got, inc, tc.want[name])
				}
			}
			if tc.noScaleOn != "" {
				evs := e.events(EventNotTriggerScaleUp)
				found := false
				for _, ev := range evs {
					found = found || strings.Contains(ev, tc.noScaleOn)
				}
				if !found {
					t.Fatalf("no NotTriggerScaleUp event with %q in %v", tc.noScaleOn, evs)
				}
			}
		})
	}
}

// Two gangs that both fit one group get their nodes in the same loop: the
// second's template nodes are named past the first's on the same fork
// (not "node template-gpu-0 is already in the snapshot").
func TestTwoGangsInOneGroup(t *testing.T) {
	e := newEnv(t, withGangs(mins{"train-1": 3, "train-2": 3}), withOptions(func(o *Options) { o.NodeAdditionBurst = 100 }))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"))
	e.start()
	e.add(gangMembers(3, "train-1"))
	e.add(gangMembers(3, "train-2"))
	e.run()
	if got := sum(gpu.Increases()); got != 6 {
		t.Fatalf("increases %v, want 6 nodes for both gangs; events %v", gpu.Increases(), e.events(EventNotTriggerScaleUp))
	}
}

func TestGangCountsRunningMembers(t *testing.T) {
	e := newEnv(t, withGangs(mins{"train": 16}))
	gpu := e.provider.AddGroup("gpu", 0, 30, gpuTemplate("gpu"), inmemory.WithTarget(10))
	e.start()
	e.register(gpu)
	running := gangMembers(10, "train")
	for i, n := range e.nodeNames() {
		running[i].Spec.NodeName = n
		running[i].Status.Conditions = nil
		running[i].Status.Phase = apiv1.PodRunning
	}
	e.add(running)
	e.add(gangMembers(6, "train", func(p *apiv1.Pod) { p.Name += "-late"; p.UID += "-late" }))
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 6 {
		t.Fatalf("increases %v, want [6]: 10 of 16 run already", got)
	}
}

func TestTeamCapacity(t *testing.T) {
	teamTmpl := func(name, team string) *apiv1.Node {
		n := gpuTemplate(name)
		to.Taint("openai.com/team", team)(n)
		return n
	}
	tolerate := func(team string) to.PodOption { return to.Tolerate("openai.com/team", team) }
	borrower := func(p *apiv1.Pod) {
		p.Spec.Tolerations = append(p.Spec.Tolerations, apiv1.Toleration{Operator: apiv1.TolerationOpExists})
	}
	for _, tc := range []struct {
		name      string
		pod       to.PodOption
		general   bool
		borrowers bool
		want      map[string]int
		why       string
	}{
		{"a team's pod grows only its team's group", tolerate("rl"), false, false, map[string]int{"team-rl": 1}, ""},
		{"a borrower does not grow a team's group", borrower, false, false, map[string]int{}, "borrower"},
		{"a borrower grows an untainted group", borrower, true, false, map[string]int{"general": 1}, ""},
		{"with --borrowers-scale-team-groups it may", borrower, false, true, map[string]int{"team-cv": 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withOptions(func(o *Options) { o.BorrowersScaleTeamGroups = tc.borrowers }))
			gs := map[string]*inmemory.Group{
				"team-rl": e.provider.AddGroup("team-rl", 0, 10, teamTmpl("team-rl", "rl")),
				"team-cv": e.provider.AddGroup("team-cv", 0, 10, teamTmpl("team-cv", "cv")),
			}
			if tc.general {
				gs["general"] = e.provider.AddGroup("general", 0, 10, gpuTemplate("general"))
			}
			e.start()
			e.add(pendingPods(1, "job", append(wholeGPU(), tc.pod)...))
			e.run()
			for name, g := range gs {
				if got := sum(g.Increases()); got != tc.want[name] {
					t.Fatalf("%s: %d nodes, want %d", name, got, tc.want[name])
				}
			}
			if tc.why != "" {
				if evs := e.events(EventNotTriggerScaleUp); len(evs) != 1 || !strings.Contains(evs[0], tc.why) {
					t.Fatalf("NotTriggerScaleUp %v, want one saying %q", evs, tc.why)
				}
			}
		})
	}
}

func TestStatusTaintStrippedFromTemplates(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.StatusTaints = []string{"example.com/maintenance"} }))
	tmpl := gpuTemplate("gpu")
	to.Taint("example.com/maintenance", "true")(tmpl)
	gpu := e.provider.AddGroup("gpu", 0, 10, tmpl)
	e.start()
	e.add(pendingPods(1, "job", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != 1 {
		t.Fatalf("increases %v: a status taint on the template must not keep pods off", got)
	}
}
