package vmss

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

const sub = "11111111-2222-3333-4444-555555555555"

type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "test-token", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// fixture is a provider talking HTTPS to an ARM simulator, both on one fake clock.
type fixture struct {
	t     testing.TB
	ctx   context.Context
	clock *clocktesting.FakeClock
	sim   *armsim.Server
	p     *Provider
	reg   *prometheus.Registry
}

type fixtureOption func(*armsim.Options, *Config)

func newFixture(t testing.TB, sets []armsim.ScaleSetSpec, opts ...fixtureOption) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), clock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), reg: prometheus.NewRegistry()}
	so := armsim.Options{SubscriptionID: sub, Location: "eastus", Clock: f.clock}
	cfg := Config{
		SubscriptionID:  sub,
		ResourceGroups:  []string{"rg"},
		Credential:      staticToken{},
		Clock:           f.clock,
		Registerer:      f.reg,
		LROPollInterval: time.Second,
	}
	for _, o := range opts {
		o(&so, &cfg)
	}
	sim, err := armsim.New(so)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		if err := sim.AddScaleSet(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	sim.Advance(f.ctx)
	cfg.ARMEndpoint = sim.URL()
	tr := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: sim.CertPool()}}}
	if tp, ok := cfg.Transport.(*tap); ok {
		tp.next = tr // withTap: the tap in front of the simulator
	} else {
		cfg.Transport = tr
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	f.sim, f.p = sim, p
	return f
}

func withNodes(specs ...string) fixtureOption {
	return func(_ *armsim.Options, c *Config) {
		for _, s := range specs {
			ng, err := cloudprovider.ParseNodeGroupSpec(s)
			if err != nil {
				panic(err)
			}
			c.NodeGroups = append(c.NodeGroups, ng)
		}
	}
}

func withDiscovery(d string) fixtureOption {
	return func(_ *armsim.Options, c *Config) { c.AutoDiscovery = append(c.AutoDiscovery, d) }
}

// withOperationsInProgress keeps every long-running operation InProgress
// until the fake clock passes an hour. The background watcher of a write
// then only polls the operation: it never makes the final GET of the scale
// set that a finished PATCH operation ends with, so a test can count the
// GETs of the write path itself without racing the watcher.
func withOperationsInProgress() fixtureOption {
	return func(o *armsim.Options, _ *Config) { o.LRODuration = time.Hour }
}

func (f *fixture) refresh() {
	f.t.Helper()
	if err := f.p.Refresh(f.ctx); err != nil {
		f.t.Fatalf("Refresh: %v", err)
	}
}

// expire moves time past the cache TTL (and its jitter).
func (f *fixture) expire() { f.clock.Step(2 * time.Minute) }

func (f *fixture) group(name string) cloudprovider.NodeGroup {
	f.t.Helper()
	for _, g := range f.p.NodeGroups() {
		if g.ID() == name {
			return g
		}
	}
	f.t.Fatalf("node group %s not found", name)
	return nil
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func gpuSet(name string, capacity int, tags map[string]string) armsim.ScaleSetSpec {
	return armsim.ScaleSetSpec{ResourceGroup: "rg", Name: name, SKU: "Standard_ND96isr_H100_v5", Capacity: capacity, Tags: tags, Zones: []string{"1"}}
}

func cpuSet(name string, capacity int, tags map[string]string) armsim.ScaleSetSpec {
	return armsim.ScaleSetSpec{ResourceGroup: "rg", Name: name, SKU: "Standard_D16s_v5", Capacity: capacity, Tags: tags}
}

const discoverySpec = "label:k8s.io_cluster-autoscaler_enabled,k8s.io_cluster-autoscaler_prod"

func discoveredTags(min, max int) map[string]string {
	return map[string]string{"k8s.io_cluster-autoscaler_enabled": "true", "k8s.io_cluster-autoscaler_prod": "owned",
		"min": fmt.Sprint(min), "max": fmt.Sprint(max)}
}

func TestDiscoveryBothWays(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{
		cpuSet("cpu", 2, nil),
		gpuSet("gpu-h100", 1, discoveredTags(0, 64)),
		gpuSet("gpu-both", 0, discoveredTags(0, 64)),
		gpuSet("gpu-bad-tags", 0, map[string]string{"k8s.io_cluster-autoscaler_enabled": "true", "k8s.io_cluster-autoscaler_prod": "x", "min": "9", "max": "2"}),
		cpuSet("unmanaged", 3, nil),
	}, withNodes("1:10:cpu", "2:8:gpu-both"), withDiscovery(discoverySpec))
	f.refresh()
	got := map[string][2]int{}
	for _, g := range f.p.NodeGroups() {
		got[g.ID()] = [2]int{g.MinSize(), g.MaxSize()}
	}
	want := map[string][2]int{"cpu": {1, 10}, "gpu-h100": {0, 64}, "gpu-both": {2, 8}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("node groups %v, want %v (explicit --nodes wins over tags)", got, want)
	}
	if n, _ := f.group("cpu").TargetSize(); n != 2 {
		t.Fatalf("cpu target %d, want 2", n)
	}
}

func TestRefreshCostGrowsWithScaleSetsNotVMs(t *testing.T) {
	var sets []armsim.ScaleSetSpec
	for i := 0; i < 20; i++ {
		sets = append(sets, gpuSet(fmt.Sprintf("gpu-%02d", i), 375, discoveredTags(0, 500)))
	}
	f := newFixture(t, sets, withDiscovery(discoverySpec))
	f.sim.ResetCalls()
	f.refresh()
	calls := f.sim.Calls()
	lists := calls["ListScaleSets"] + calls["ListVMs"]
	if lists > 21 || calls["GetVM"] != 0 || calls["GetScaleSet"] != 0 {
		t.Fatalf("one refresh of 20 x 375 VMs made %v; want <= 21 list calls and no GETs", calls)
	}
	// Within the TTL, no call at all.
	f.sim.ResetCalls()
	f.clock.Step(30 * time.Second)
	f.refresh()
	if c := f.sim.Calls(); len(nonZero(c)) != 0 {
		t.Fatalf("refresh within the TTL called ARM: %v", c)
	}
	// 7,500 lookups: every node maps to its scale set, by providerID in any case.
	n := 0
	for _, g := range f.p.NodeGroups() {
		ins, _ := g.Instances()
		for _, in := range ins {
			node := &apiv1.Node{Spec: apiv1.NodeSpec{ProviderID: strings.ToUpper(in.ProviderID[:9]) + in.ProviderID[9:]}}
			got, err := f.p.NodeGroupForNode(node)
			if err != nil || got == nil || got.ID() != g.ID() {
				t.Fatalf("NodeGroupForNode(%s) = %v, %v; want %s", node.Spec.ProviderID, got, err, g.ID())
			}
			n++
		}
	}
	if n != 7500 {
		t.Fatalf("looked up %d instances, want 7500", n)
	}
	if got, _ := f.p.NodeGroupForNode(&apiv1.Node{Spec: apiv1.NodeSpec{ProviderID: "azure:///subscriptions/" + sub + "/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/other/virtualMachines/1"}}); got != nil {
		t.Fatalf("unmanaged scale set mapped to %s", got.ID())
	}
}

func nonZero(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func TestScaleUpAndDown(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("1:10:gpu"))
	f.refresh()
	g := f.group("gpu")
	if err := g.IncreaseSize(f.ctx, 3); err != nil {
		t.Fatal(err)
	}
	if n, _ := g.TargetSize(); n != 5 {
		t.Fatalf("target after increase %d, want 5", n)
	}
	st, _ := f.sim.ScaleSet("rg", "gpu")
	if st.Capacity != 5 {
		t.Fatalf("ARM capacity %d, want 5", st.Capacity)
	}
	f.sim.Advance(f.ctx)
	f.expire()
	f.refresh()
	ins, _ := g.Instances()
	running := 0
	for _, in := range ins {
		if in.State == cloudprovider.InstanceRunning && in.Error == nil {
			running++
		}
	}
	if running != 5 {
		t.Fatalf("running instances %d, want 5: %+v", running, ins)
	}
	if err := g.IncreaseSize(f.ctx, 6); err == nil {
		t.Fatal("increase past max accepted")
	}
	// Scale down: one batched call, instances deleting at once.
	f.sim.ResetCalls()
	ids := []string{ins[0].ProviderID, ins[1].ProviderID}
	if err := g.DeleteNodes(f.ctx, ids); err != nil {
		t.Fatal(err)
	}
	if c := f.sim.Calls(); c["DeleteInstances"] != 1 {
		t.Fatalf("calls %v, want one DeleteInstances", c)
	}
	ins, _ = g.Instances()
	deleting := 0
	for _, in := range ins {
		if in.State == cloudprovider.InstanceDeleting {
			deleting++
		}
	}
	if deleting != 2 {
		t.Fatalf("%d instances deleting, want 2", deleting)
	}
	if n, _ := g.TargetSize(); n != 3 {
		t.Fatalf("target after delete %d, want 3", n)
	}
	// Below min: refused, nothing sent.
	f.sim.ResetCalls()
	rest := []string{ins[2].ProviderID, ins[3].ProviderID, ins[4].ProviderID}
	if err := g.DeleteNodes(f.ctx, rest); err == nil || !strings.Contains(err.Error(), "below its min") {
		t.Fatalf("delete below min: %v", err)
	}
	// Only writes are asserted: the watcher of the deletion above may
	// still be polling its operation.
	if w := f.sim.Writes(); len(w) != 0 {
		t.Fatalf("refused delete still wrote to ARM: %+v", w)
	}
	// A node of another group is refused.
	if err := g.DeleteNodes(f.ctx, []string{strings.Replace(ins[2].ProviderID, "/gpu/", "/cpu/", 1)}); err == nil {
		t.Fatal("deleting another scale set's instance accepted")
	}
}

func TestDecreaseTargetSizeNeverDeletesRunningVMs(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("0:10:gpu"))
	f.refresh()
	g := f.group("gpu")
	if err := g.DecreaseTargetSize(f.ctx, -1); err == nil || !strings.Contains(err.Error(), "would delete existing VMs") {
		t.Fatalf("decrease below the VM count: %v", err)
	}
	st, _ := f.sim.ScaleSet("rg", "gpu")
	if st.Capacity != 2 {
		t.Fatalf("capacity changed to %d", st.Capacity)
	}
}

func TestQuotaErrorIsClassified(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 0, nil)}, withNodes("0:10:gpu"))
	f.refresh()
	if err := f.sim.InjectFault("rg", "gpu", armsim.Fault{Kind: armsim.FaultQuota}); err != nil {
		t.Fatal(err)
	}
	err := f.group("gpu").IncreaseSize(f.ctx, 2)
	if !cloudprovider.IsQuota(err) {
		t.Fatalf("err = %v, want a quota error", err)
	}
	if n, _ := f.group("gpu").TargetSize(); n != 0 {
		t.Fatalf("target %d after a refused increase", n)
	}
}

func TestAllocationFailureBecomesInstanceErrors(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 0, nil)}, withNodes("0:10:gpu"))
	f.refresh()
	if err := f.sim.InjectFault("rg", "gpu", armsim.Fault{Kind: armsim.FaultAllocation}); err != nil {
		t.Fatal(err)
	}
	g := f.group("gpu")
	if err := g.IncreaseSize(f.ctx, 2); err != nil {
		t.Fatal(err)
	}
	f.sim.Advance(f.ctx)
	f.expire()
	f.refresh()
	ins, _ := g.Instances()
	failed := 0
	for _, in := range ins {
		if in.Error != nil && in.Error.Class == cloudprovider.ClassOutOfCapacity && in.Error.Code == "AllocationFailed" {
			failed++
		}
	}
	if failed != 2 {
		t.Fatalf("instances %+v: want 2 with AllocationFailed / out-of-capacity", ins)
	}
	eventually(t, "the failed operation to be counted", func() bool {
		return testutil.ToFloat64(f.p.metrics.lroFailures.WithLabelValues("gpu", "AllocationFailed")) == 1
	})
}

func TestThrottlingHoldsBackCallsAndSizes(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("0:10:gpu"))
	f.refresh()
	g := f.group("gpu")
	f.expire()
	f.sim.Throttle("read", 30*time.Second)
	f.refresh() // answered 429: the cache is kept but stale
	if _, err := g.TargetSize(); !cloudprovider.IsSizeUnknown(err) {
		t.Fatalf("TargetSize while throttled: %v, want size unknown", err)
	}
	f.sim.ResetCalls()
	f.refresh()
	if err := g.IncreaseSize(f.ctx, 1); err == nil {
		t.Fatal("scale-up on a stale size accepted")
	}
	if err := g.DeleteNodes(f.ctx, nil); err == nil {
		t.Fatal("delete on a stale size accepted")
	}
	if c := nonZero(f.sim.Calls()); len(c) != 0 {
		t.Fatalf("calls before Retry-After: %v", c)
	}
	if got := testutil.ToFloat64(f.p.metrics.throttledUntil.WithLabelValues("read")); got == 0 {
		t.Fatal("arm_throttled_until_seconds{kind=read} not set")
	}
	f.clock.Step(31 * time.Second)
	f.refresh()
	if n, err := g.TargetSize(); err != nil || n != 2 {
		t.Fatalf("after Retry-After: %d, %v", n, err)
	}
}

// TestHeldBackRequestIsNotRetried: a request held back until Retry-After
// fails at once; the SDK's retry policy does not try it again (each try
// would be held back too, seconds later).
func TestHeldBackRequestIsNotRetried(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 1, nil)}, withNodes("0:10:gpu"))
	f.refresh()
	f.expire()
	f.sim.Throttle("read", time.Minute)
	f.refresh() // answered 429: reads are held back from now on
	heldBack := func() float64 {
		return testutil.ToFloat64(f.p.metrics.requests.WithLabelValues("VirtualMachineScaleSetsClient.Get", "held-back"))
	}
	if _, err := f.group("gpu").(*scaleSet).reread(f.ctx); !cloudprovider.IsThrottled(err) {
		t.Fatalf("read while throttled: %v, want a throttled error", err)
	}
	if got := heldBack(); got != 1 {
		t.Fatalf("held back %v times for one read, want 1 (not retried)", got)
	}
}

// TestRestartWhileThrottled is CA issue #3240: a throttled read after a
// restart must leave every size unknown and every write refused.
func TestRestartWhileThrottled(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 200, nil)}, withNodes("0:300:gpu"))
	f.sim.Throttle("read", time.Hour)
	if err := f.p.Refresh(f.ctx); err != nil {
		t.Logf("refresh: %v", err)
	}
	for _, g := range f.p.NodeGroups() {
		if _, err := g.TargetSize(); !cloudprovider.IsSizeUnknown(err) {
			t.Fatalf("%s: TargetSize = %v, want size unknown", g.ID(), err)
		}
		if err := g.DecreaseTargetSize(f.ctx, -197); err == nil {
			t.Fatalf("%s: DecreaseTargetSize on an unknown size accepted", g.ID())
		}
		if err := g.IncreaseSize(f.ctx, 1); err == nil {
			t.Fatalf("%s: IncreaseSize on an unknown size accepted", g.ID())
		}
	}
	c := f.sim.Calls()
	if c["UpdateScaleSet"]+c["DeleteInstances"] != 0 {
		t.Fatalf("writes sent while sizes were unknown: %v", c)
	}
	st, _ := f.sim.ScaleSet("rg", "gpu")
	if st.Capacity != 200 {
		t.Fatalf("capacity changed to %d", st.Capacity)
	}
}

// TestGPUTemplate: a group at zero's template from its SKU and tags, for
// either orchestration mode.
func TestGPUTemplate(t *testing.T) {
	tags := map[string]string{tagTaintPrefix + "openai.com__team": "rl:NoSchedule",
		tagOptionsPrefix + "scaledownunneededtime": "7m"}
	for _, spec := range []armsim.ScaleSetSpec{gpuSet("gpu", 0, tags), flexSet("gpu", 0, tags)} {
		t.Run(fmt.Sprintf("flexible=%v", spec.Flexible), func(t *testing.T) {
			f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:10:gpu"))
			f.refresh()
			n, err := f.group("gpu").TemplateNode()
			if err != nil {
				t.Fatal(err)
			}
			if got := n.Status.Allocatable.Name("nvidia.com/gpu", "").Value(); got != 8 {
				t.Fatalf("template GPUs %d, want 8", got)
			}
			if n.Labels[apiv1.LabelInstanceTypeStable] != "Standard_ND96isr_H100_v5" || n.Labels[AcceleratorLabel] != "nvidia" ||
				n.Labels[apiv1.LabelTopologyZone] != "eastus-1" || n.Labels[NodeGroupLabel] != "gpu" {
				t.Fatalf("labels %v", n.Labels)
			}
			if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "openai.com/team" {
				t.Fatalf("taints %v", n.Spec.Taints)
			}
			if o := f.group("gpu").Options(cloudprovider.GroupOptions{}); o.ScaleDownUnneededTime != 7*time.Minute {
				t.Fatalf("options %+v, want the tag's scale-down unneeded time 7m", o)
			}
			if got := testutil.CollectAndCount(f.reg, "vmss_autoscaler_arm_requests_total"); got == 0 {
				t.Fatal("no arm_requests_total series")
			}
		})
	}
}

// TestFailedOperationWithoutVMsBecomesPlaceholders: the machines a failed
// scale-up never created are failed placeholders, told from the VMs it
// did create by the instance IDs (Uniform) or the names (Flexible) listed
// before it; deleting them drops them without a call.
func TestFailedOperationWithoutVMsBecomesPlaceholders(t *testing.T) {
	for _, spec := range []armsim.ScaleSetSpec{gpuSet("gpu", 1, nil), flexSet("gpu", 1, nil)} {
		t.Run(fmt.Sprintf("flexible=%v", spec.Flexible), func(t *testing.T) {
			f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:10:gpu"))
			f.refresh()
			if err := f.sim.InjectFault("rg", "gpu", armsim.Fault{Kind: armsim.FaultLROFail}); err != nil {
				t.Fatal(err)
			}
			g := f.group("gpu")
			if err := g.IncreaseSize(f.ctx, 3); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the failed operation to be seen", func() bool {
				return testutil.ToFloat64(f.p.metrics.lroFailures.WithLabelValues("gpu", "InternalExecutionError")) == 1
			})
			// ARM created one of the three and rolled the rest back.
			if err := f.sim.SetCapacity("rg", "gpu", 2); err != nil {
				t.Fatal(err)
			}
			f.sim.Advance(f.ctx)
			f.expire()
			f.refresh()
			ins, _ := g.Instances()
			var placeholders []string
			for _, in := range ins {
				if in.Error != nil {
					if in.Error.Code != "InternalExecutionError" {
						t.Fatalf("placeholder error %+v", in.Error)
					}
					placeholders = append(placeholders, in.ProviderID)
				}
			}
			if len(ins) != 4 || len(placeholders) != 2 {
				t.Fatalf("instances %+v: want the 2 VMs and 2 failed placeholders", ins)
			}
			f.sim.ResetCalls()
			if err := g.DeleteNodes(f.ctx, placeholders); err != nil {
				t.Fatal(err)
			}
			if c := nonZero(f.sim.Calls()); len(c) != 0 {
				t.Fatalf("deleting placeholders called ARM: %v", c)
			}
			f.expire()
			f.refresh()
			if ins, _ := g.Instances(); len(ins) != 2 {
				t.Fatalf("placeholders came back: %+v", ins)
			}
		})
	}
}

// TestFailedDeletionListsTheMachinesAliveAgain: ARM accepts a deletion,
// its operation fails and the VMs run again. Once the operation is known
// failed, the instances are listed Running, not deleting for ever: the
// core can take the deletion back (untaint, retry).
func TestFailedDeletionListsTheMachinesAliveAgain(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 3, nil)}, withNodes("0:10:gpu"))
	f.sim.Advance(f.ctx)
	f.refresh()
	g := f.group("gpu")
	if err := f.sim.InjectFault("rg", "gpu", armsim.Fault{Kind: armsim.FaultDeleteFails, Count: 1}); err != nil {
		t.Fatal(err)
	}
	ins, _ := g.Instances()
	victim := ins[0].ProviderID
	if err := g.DeleteNodes(f.ctx, []string{victim}); err != nil {
		t.Fatal(err)
	}
	state := func() cloudprovider.InstanceState {
		ins, _ := g.Instances()
		for _, in := range ins {
			if strings.EqualFold(in.ProviderID, victim) {
				return in.State
			}
		}
		return -1
	}
	if st := state(); st != cloudprovider.InstanceDeleting {
		t.Fatalf("state %v right after the delete, want deleting", st)
	}
	eventually(t, "the failed deletion to be counted", func() bool {
		return testutil.ToFloat64(f.p.metrics.lroFailures.WithLabelValues("gpu", "InternalExecutionError")) == 1
	})
	eventually(t, "the machine listed Running again", func() bool {
		f.sim.Advance(f.ctx)
		f.expire()
		f.refresh()
		return state() == cloudprovider.InstanceRunning
	})
}

// TestFailedVMsDeletedBeforeTheirOperationEndsAreNoPlaceholders: a
// scale-up's VMs end Failed (AllocationFailed) while its operation still
// runs (an operation ends when its VMs do, extensions included); the core
// deletes the failed machines at once, and only then does the operation
// end Failed. Its VMs were created: no failed placeholders are made for
// them. Before, the list after the deletion no longer showed them, each
// was reported failed a second time as a placeholder, and the group's
// backoff doubled per machine (e2e TestFailedCreateAndDeleteOperations
// waited 10 minutes).
func TestFailedVMsDeletedBeforeTheirOperationEndsAreNoPlaceholders(t *testing.T) {
	// Without preemption: the deletion must not end the scale-up's
	// operation (as it would on Azure), so that its failure is seen
	// after the deletion, as the e2e run saw it when the two raced.
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 1, nil)}, withNodes("0:10:gpu"), func(o *armsim.Options, _ *Config) {
		o.BootDelay, o.NoPreemption = time.Minute, true
	})
	f.refresh()
	for _, fault := range []armsim.Fault{{Kind: armsim.FaultAllocation, Count: 1}, {Kind: armsim.FaultSlowLRO, Count: 1, Duration: 5 * time.Minute}} {
		if err := f.sim.InjectFault("rg", "gpu", fault); err != nil {
			t.Fatal(err)
		}
	}
	g := f.group("gpu")
	if err := g.IncreaseSize(f.ctx, 3); err != nil {
		t.Fatal(err)
	}
	f.clock.Step(2 * time.Minute) // booted: Failed; the operation runs on
	f.sim.Advance(f.ctx)
	f.refresh()
	ins, _ := g.Instances()
	failed := failedIDs(ins)
	if len(failed) != 3 {
		t.Fatalf("instances %+v: want 3 failed VMs", ins)
	}
	if err := g.DeleteNodes(f.ctx, failed); err != nil {
		t.Fatal(err)
	}
	f.sim.Advance(f.ctx)
	f.clock.Step(6 * time.Minute) // the scale-up's operation ends Failed
	f.sim.Advance(f.ctx)
	eventually(t, "the failed operation to be seen", func() bool {
		f.clock.Step(time.Second) // the watcher's next poll, whenever it set its timer
		return testutil.ToFloat64(f.p.metrics.lroFailures.WithLabelValues("gpu", armsim.CodeAllocationFailed)) == 1
	})
	f.expire()
	f.refresh()
	ins, _ = g.Instances()
	for _, in := range ins {
		if isPlaceholder(in.ProviderID) {
			t.Fatalf("instances %+v: a placeholder for a VM the operation created and the core deleted", ins)
		}
	}
}

// TestDroppedPlaceholdersLowerTheCapacity: a scale-out of 3 fails and ARM
// takes its 3 VMs away while sku.capacity stays at 4 (the simulator's
// DropVMsKeepCapacity): the 3 missing machines are failed placeholders,
// and when the core deletes them the capacity is written down to the 1
// VM that exists, so the next scale-up of 1 makes 2 VMs at capacity 2.
// Without it the capacity stays 4 with 1 VM: the next +1 writes 5 and
// makes 1 VM, and the group counts machines that never come
// (cluster-autoscaler issue 8323's stall).
func TestDroppedPlaceholdersLowerTheCapacity(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 1, nil)}, withNodes("0:10:gpu"))
	f.refresh()
	if err := f.sim.InjectFault("rg", "gpu", armsim.Fault{Kind: armsim.FaultLROFail, Count: 1}); err != nil {
		t.Fatal(err)
	}
	g := f.group("gpu")
	if err := g.IncreaseSize(f.ctx, 3); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the failed operation to be seen", func() bool {
		return testutil.ToFloat64(f.p.metrics.lroFailures.WithLabelValues("gpu", "InternalExecutionError")) == 1
	})
	if err := f.sim.DropVMsKeepCapacity("rg", "gpu", 3); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.sim.ScaleSet("rg", "gpu"); st.Capacity != 4 || len(st.VMs) != 1 {
		t.Fatalf("scale set at capacity %d with %d VMs, want 4 with 1", st.Capacity, len(st.VMs))
	}
	f.expire()
	f.refresh()
	ins, _ := g.Instances()
	placeholders := failedIDs(ins)
	if len(placeholders) != 3 {
		t.Fatalf("instances %+v: want 3 failed placeholders", ins)
	}
	if err := g.DeleteNodes(f.ctx, placeholders); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.sim.ScaleSet("rg", "gpu"); st.Capacity != 1 {
		t.Fatalf("capacity %d after the placeholders were dropped, want 1 (the VM that exists)", st.Capacity)
	}
	f.expire()
	f.refresh()
	if err := g.IncreaseSize(f.ctx, 1); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.sim.ScaleSet("rg", "gpu"); st.Capacity != 2 || len(st.VMs) != 2 {
		t.Fatalf("after +1: capacity %d with %d VMs, want 2 with 2", st.Capacity, len(st.VMs))
	}
}

// failedIDs are the provider IDs of the instances reported in error
// (failed VMs and failed placeholders).
func failedIDs(ins []cloudprovider.Instance) []string {
	var out []string
	for _, in := range ins {
		if in.Error != nil {
			out = append(out, in.ProviderID)
		}
	}
	return out
}
