package core

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vmss-autoscaler/vmss-autoscaler/balloon"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// kubeletReserved is how a real node registers: allocatable below the
// template's capacity by kube-reserved and the eviction threshold.
func kubeletReserved(cpu, mem string) to.NodeOption {
	return func(n *apiv1.Node) {
		a := n.Status.Allocatable.DeepCopy()
		c, m := a[apiv1.ResourceCPU], a[apiv1.ResourceMemory]
		c.Sub(resource.MustParse(cpu))
		m.Sub(resource.MustParse(mem))
		a[apiv1.ResourceCPU], a[apiv1.ResourceMemory] = c, m
		n.Status.Allocatable = a
	}
}

// noGPUsYet is a GPU node before its device plugin advertises the GPUs.
func noGPUsYet() to.NodeOption {
	return func(n *apiv1.Node) {
		delete(n.Status.Allocatable, to.GPU)
		delete(n.Status.Capacity, to.GPU)
	}
}

// lowerCaseProviderID writes the providerID as the Azure cloud provider
// does for a resource group created with capitals.
func lowerCaseProviderID() to.NodeOption {
	return func(n *apiv1.Node) { n.Spec.ProviderID = strings.ToLower(n.Spec.ProviderID) }
}

// loopView runs the read phases of a loop and returns its state, to look at
// what the phases after them would see.
func (e *env) loopView() *loop {
	e.t.Helper()
	l := &loop{now: e.clock.Now()}
	for _, p := range []func() error{
		func() error { return e.a.refreshCloud(e.ctx, l) },
		func() error { return e.a.takeSnapshot(e.ctx, l) },
		func() error { return e.a.updateClusterState(e.ctx, l) },
	} {
		if err := p(); err != nil {
			e.t.Fatal(err)
		}
	}
	return l
}

func (e *env) template(group string) (source string, alloc *resource.Quantity, node *apiv1.Node, pods int) {
	e.t.Helper()
	l := e.loopView()
	dss, _ := e.a.listers.DaemonSets.List(labels.Everything())
	info, err := e.a.templates.build(e.ctx, e.a, l, l.byID[group], dss)
	if err != nil {
		e.t.Fatal(err)
	}
	source, _ = e.a.templates.source(e.a, l, l.byID[group])
	cpu := resource.NewMilliQuantity(info.GetAllocatable().GetMilliCPU(), resource.DecimalSI)
	return source, cpu, info.Node(), len(info.GetPods())
}

func daemonSet(name string, selector map[string]string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", UID: types.UID("ds-" + name)},
		Spec: appsv1.DaemonSetSpec{Template: apiv1.PodTemplateSpec{Spec: apiv1.PodSpec{
			NodeSelector: selector,
			Containers: []apiv1.Container{{Name: "c", Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{
				apiv1.ResourceCPU: resource.MustParse("100m"), apiv1.ResourceMemory: resource.MustParse("100Mi")}}}},
		}}},
	}
}

func TestTemplateLearnedFromALiveNode(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.StatusTaints = []string{"example.com/maintenance"} }))
	tmpl := gpuTemplate("gpu")
	to.Taint("openai.com/team", "rl")(tmpl)
	gpu := e.provider.AddGroup("gpu", 0, 20, tmpl)
	e.start()
	if err := e.dss.Add(daemonSet("gpu-agent", map[string]string{"pool": "gpu"})); err != nil {
		t.Fatal(err)
	}
	if err := e.dss.Add(daemonSet("cpu-agent", map[string]string{"pool": "cpu"})); err != nil {
		t.Fatal(err)
	}
	if src, cpu, _, pods := e.template("gpu"); src != templateFromSKU || cpu.MilliValue() != 96000 || pods != 0 {
		t.Fatalf("group at zero: source %s, cpu %s, %d DaemonSet pods; want the SKU's 96 and none (the team taint keeps them off)", src, cpu, pods)
	}
	if err := gpu.IncreaseSize(e.ctx, 2); err != nil {
		t.Fatal(err)
	}
	// Two live nodes: reserved resources, a label of their own, and the
	// taints of the moment that a new node will not have.
	e.register(gpu, kubeletReserved("1060m", "2350Mi"), to.NodeLabels("example.com/rack", "r7"),
		to.Taint(scaledown.DeletionCandidateTaint, "1"), to.Taint("example.com/maintenance", "soon"),
		to.Taint("node.cilium.io/agent-not-ready", "true"))
	l := e.loopView()
	names := []string{l.nodesOf["gpu"][0].Name, l.nodesOf["gpu"][1].Name}
	if src, _, _, _ := e.template("gpu"); src != templateFromSKU {
		t.Fatalf("source %s while both nodes carry a startup taint, want sku: a starting node is no model", src)
	}
	for _, n := range names {
		e.updateNode(n, func(n *apiv1.Node) { removeTaint(n, "node.cilium.io/agent-not-ready") })
	}
	first := min(names[0], names[1])
	src, cpu, node, _ := e.template("gpu")
	if src != templateFromNode+first || cpu.MilliValue() != 96000-1060 {
		t.Fatalf("source %s cpu %s, want node/%s and its allocatable 94940m", src, cpu, first)
	}
	if node.Name != "template-gpu" || node.Labels[apiv1.LabelHostname] != "template-gpu" || node.Labels["example.com/rack"] != "r7" {
		t.Fatalf("labels %v: want the node's own labels with the template's hostname", node.Labels)
	}
	var keys []string
	for _, tt := range node.Spec.Taints {
		keys = append(keys, tt.Key)
	}
	if strings.Join(keys, ",") != "openai.com/team" {
		t.Fatalf("taints %v, want the team taint only (deletion-candidate, status and startup taints stripped)", keys)
	}
	// Learned from the first node while it stays usable; cordoned, the
	// other one; both gone, the SKU again.
	e.updateNode(first, func(n *apiv1.Node) { n.Spec.Unschedulable = true })
	other := max(names[0], names[1])
	if src, _, _, _ := e.template("gpu"); src != templateFromNode+other {
		t.Fatalf("source %s after cordoning %s, want node/%s", src, first, other)
	}
	e.updateNode(first, func(n *apiv1.Node) { n.Spec.Unschedulable = false })
	if src, _, _, _ := e.template("gpu"); src != templateFromNode+other {
		t.Fatalf("source %s, want node/%s kept while it stays usable", src, other)
	}
	for _, n := range names {
		if err := e.nodes.Delete(&apiv1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	if src, cpu, _, _ := e.template("gpu"); src != templateFromSKU || cpu.MilliValue() != 96000 {
		t.Fatalf("source %s cpu %s with no node, want the SKU again", src, cpu)
	}
}

func TestDaemonSetPodsOnALearnedTemplate(t *testing.T) {
	e := newEnv(t)
	cpu := e.provider.AddGroup("cpu", 0, 20, cpuTemplate("cpu"), inmemory.WithTarget(1))
	e.start()
	e.register(cpu, kubeletReserved("260m", "2350Mi"))
	for _, ds := range []*appsv1.DaemonSet{daemonSet("a", map[string]string{"pool": "cpu"}), daemonSet("b", nil), daemonSet("c", map[string]string{"pool": "gpu"})} {
		if err := e.dss.Add(ds); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, pods := e.template("cpu"); pods != 2 {
		t.Fatalf("%d DaemonSet pods on the template, want 2 (the gpu pool's one does not match)", pods)
	}
}

// TestWholeNodeBalloonsFitTheNodesTheyBuy: balloons request the learned
// template's allocatable less its DaemonSet pods, so a whole-node balloon
// fits the real node, whose allocatable is below the SKU's capacity.
func TestWholeNodeBalloonsFitTheNodesTheyBuy(t *testing.T) {
	rec := &recordingBalloons{}
	e := newEnv(t, withOptions(func(o *Options) { o.WarmPools = map[string]balloon.Policy{"gpu": {Fixed: 3}} }))
	e.balloons = rec
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.register(gpu, kubeletReserved("1060m", "2350Mi"))
	e.run()
	s := rec.specs[len(rec.specs)-1][0]
	live := e.loopView().nodesOf["gpu"][0]
	for _, r := range []apiv1.ResourceName{apiv1.ResourceCPU, apiv1.ResourceMemory, to.GPU} {
		req, alloc := s.Requests[r], live.Status.Allocatable[r]
		if req.Cmp(alloc) > 0 {
			t.Fatalf("balloon requests %s %s, the real node offers %s: it would never fit the node it buys", r, req.String(), alloc.String())
		}
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "templateSource: node/"+live.Name) {
		t.Fatalf("status does not say the template was learned from %s:\n%s", live.Name, last)
	}
}

// TestGPUsAdvertisedLateAreComingCapacity: a GPU node whose device plugin
// has not advertised its GPUs is Ready but not capacity: the pods waiting
// for it buy no second node, and it is neither ready nor unready until the
// startup time passes.
func TestGPUsAdvertisedLateAreComingCapacity(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.MaxNodeStartupTime = 10 * time.Minute
		o.ScaleDownUnneededTime, o.ScaleDownUnreadyTime = time.Minute, time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(4))
	e.start()
	e.register(gpu, noGPUsYet())
	e.add(pendingPods(4, "train", wholeGPU()...))
	for i := 0; i < 4; i++ {
		e.run()
		e.clock.Step(2 * time.Minute)
	}
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: pods waiting for GPUs still being advertised bought more nodes", got)
	}
	if got := gpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v: a node waiting for its device plugin is no scale-down candidate", got)
	}
	for state, want := range map[string]float64{"ready": 0, "not_started": 4, "unready": 0} {
		if got := testutil.ToFloat64(e.a.metrics.Nodes.WithLabelValues("gpu", state)); got != want {
			t.Errorf("%s nodes %v, want %v", state, got, want)
		}
	}
	e.clock.Step(4 * time.Minute) // past --max-node-startup-time with no GPUs: broken
	e.run()
	if got := testutil.ToFloat64(e.a.metrics.Nodes.WithLabelValues("gpu", "unready")); got != 4 {
		t.Fatalf("unready nodes %v past the startup time, want 4", got)
	}
}

// TestStartupTaintedNodeIsNeitherRemovedNorDoubleCounted.
func TestStartupTaintedNodeIsNeitherRemovedNorDoubleCounted(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime, o.ScaleDownUnreadyTime = time.Minute, time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	cpu := e.provider.AddGroup("cpu", 0, 20, cpuTemplate("cpu"), inmemory.WithTarget(1))
	e.start()
	e.register(cpu, to.Taint("node.cilium.io/agent-not-ready", "true"))
	e.add(pendingPods(1, "web", to.Requests("4", "8Gi")))
	for i := 0; i < 4; i++ {
		e.run()
		e.clock.Step(time.Minute)
	}
	if got := cpu.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: a pod waiting for a node whose network agent is starting bought another", got)
	}
	if got := cpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v: a starting node is never a scale-down candidate", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.PodsAwaitingNodes); got != 1 {
		t.Fatalf("pods awaiting upcoming nodes %v, want 1", got)
	}
}

// TestMixedCaseProviderIDs: ARM lists IDs with the resource group as
// created, nodes carry them lower-cased; nothing is unregistered, nothing
// deleted as a failed machine, and scale-down still removes empty nodes.
func TestMixedCaseProviderIDs(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.MaxNodeProvisionTime = 5 * time.Minute
		o.ScaleDownUnneededTime = 20 * time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	cpu := e.provider.AddGroup("MC_Cluster_CPU", 0, 20, cpuTemplate("cpu"), inmemory.WithTarget(2))
	e.start()
	e.register(cpu, lowerCaseProviderID())
	busy := e.loopView().nodesOf["MC_Cluster_CPU"][0]
	if busy.Spec.ProviderID == cpu.ProviderIDs()[0] {
		t.Fatalf("provider IDs %s and %s do not differ in case: the test proves nothing", busy.Spec.ProviderID, cpu.ProviderIDs()[0])
	}
	e.add(to.Pod("db", to.Requests("12", "10Gi"), to.OnNode(busy.Name), to.ControlledBy("ReplicaSet", "db", "rs-db")))
	for i := 0; i < 3; i++ { // 15 minutes: past the provision time
		e.run()
		e.clock.Step(5 * time.Minute)
	}
	if got := testutil.ToFloat64(e.a.metrics.Nodes.WithLabelValues("MC_Cluster_CPU", "long_unregistered")) +
		testutil.ToFloat64(e.a.metrics.Nodes.WithLabelValues("MC_Cluster_CPU", "unregistered")); got != 0 {
		t.Fatalf("%v machines counted unregistered", got)
	}
	if got := cpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v as failed machines while their nodes run", got)
	}
	for i := 0; i < 3; i++ {
		e.run()
		e.clock.Step(5 * time.Minute)
	}
	e.a.WaitForDrains()
	e.run()
	if got := cpu.Deleted(); len(got) != 1 || strings.EqualFold(got[0], busy.Spec.ProviderID) {
		t.Fatalf("deleted %v, want the empty node only", got)
	}
}

func (e *env) updateNode(name string, f func(*apiv1.Node)) {
	e.t.Helper()
	obj, ok, err := e.nodes.GetByKey(name)
	if err != nil || !ok {
		e.t.Fatalf("node %s: %v", name, err)
	}
	n := obj.(*apiv1.Node).DeepCopy()
	f(n)
	if err := e.nodes.Update(n); err != nil {
		e.t.Fatal(err)
	}
}

func removeTaint(n *apiv1.Node, key string) {
	var ts []apiv1.Taint
	for _, t := range n.Spec.Taints {
		if t.Key != key {
			ts = append(ts, t)
		}
	}
	n.Spec.Taints = ts
}

// TestBalloonsPinnedByALabelTheNodesCarry: balloons select a group's nodes
// by the node-group label when its nodes carry it, else by AKS's
// agent-pool label; with neither, no balloons (they would never run, and
// each would buy a node) and nothing of the group's is deleted.
func TestBalloonsPinnedByALabelTheNodesCarry(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		labels               []string
		wantLabel, wantValue string
		wantSpecs            bool
	}{
		{"the node-group label", []string{balloon.DefaultNodeGroupLabel, "gpu"}, "", "", true},
		{"an AKS node pool", []string{AgentPoolLabel, "h100pool"}, AgentPoolLabel, "h100pool", true},
		{"neither: refused", []string{"pool", "gpu"}, "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingBalloons{}
			e := newEnv(t, withOptions(func(o *Options) { o.WarmPools = map[string]balloon.Policy{"gpu": {Fixed: 1}} }))
			e.balloons = rec
			e.provider.AddGroup("gpu", 0, 20, to.Node("gpu", "96", "900Gi", to.NodeGPUs(8), to.NodeLabels(tc.labels...)))
			e.start()
			e.run()
			if !tc.wantSpecs {
				if len(rec.specs) != 0 {
					t.Fatalf("Sync called with %+v: with no label to pin by, nothing may be synced (or deleted)", rec.specs)
				}
				return
			}
			if len(rec.specs) != 1 || len(rec.specs[0]) != 1 {
				t.Fatalf("specs %+v, want one", rec.specs)
			}
			if s := rec.specs[0][0]; s.NodeLabel != tc.wantLabel || s.NodeLabelValue != tc.wantValue {
				t.Fatalf("pinned by %q=%q, want %q=%q", s.NodeLabel, s.NodeLabelValue, tc.wantLabel, tc.wantValue)
			}
		})
	}
}

// TestNodesThatRanAndWentSilentAreNotUpcoming: nodes Ready for minutes
// whose kubelets then stopped renewing their Leases (Ready Unknown, the
// unreachable taint) are unready, not coming capacity, however young: the
// pods they cannot take get new nodes instead of waiting on them.
func TestNodesThatRanAndWentSilentAreNotUpcoming(t *testing.T) {
	e := newEnv(t)
	cpu := e.provider.AddGroup("cpu", 0, 20, cpuTemplate("cpu"), inmemory.WithTarget(3))
	e.start()
	created := e.clock.Now()
	e.register(cpu, to.LostSince(created.Add(5*time.Minute)))
	e.clock.Step(5 * time.Minute) // younger than --max-node-startup-time (15m)
	e.add(pendingPods(3, "web", to.Requests("12", "8Gi")))
	e.run()
	if got := cpu.Increases(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("increases %v, want [3]: the 3 pods cannot wait on 3 lost nodes", got)
	}
	rd := e.a.registry.Group("cpu").Readiness
	if rd.Unready != 3 || rd.NotStarted != 0 {
		t.Fatalf("readiness %+v, want the 3 lost nodes unready, none not started", rd)
	}
}
