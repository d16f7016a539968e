package vmss

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// Provider tests of operations as Azure runs them (issue #38): each goes
// through the real SDK client to the ARM simulator, on the fake clock.

// tap is the provider's HTTP transport in a test (withTap): it records
// the instance deletions sent and can answer the next polls of
// operations itself, as a front end (5xx) or the network (an error) can.
type tap struct {
	next policy.Transporter

	mu sync.Mutex
	// failPolls is how many polls are still to fail; pollStatus what they
	// are answered (0: a transport error); pollsFailed how many did.
	failPolls, pollStatus, pollsFailed int
	// forced is the forceDeletion query of each instance deletion sent.
	forced []string
}

func withTap(tp *tap) fixtureOption {
	return func(_ *armsim.Options, c *Config) { c.Transport = tp }
}

func (tp *tap) Do(req *http.Request) (*http.Response, error) {
	tp.mu.Lock()
	poll := req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/operations/")
	if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/delete") {
		tp.forced = append(tp.forced, req.URL.Query().Get("forceDeletion"))
	}
	fail, status := poll && tp.failPolls > 0, tp.pollStatus
	if fail {
		tp.failPolls--
		tp.pollsFailed++
	}
	tp.mu.Unlock()
	switch {
	case !fail:
		return tp.next.Do(req)
	case status == 0:
		return nil, fmt.Errorf("read tcp 127.0.0.1:443: %w", syscall.ECONNRESET)
	}
	return &http.Response{StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), Request: req,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   io.NopCloser(strings.NewReader(`{"error":{"code":"ServiceUnavailable","message":"The service is temporarily unavailable."}}`))}, nil
}

// failNextPolls makes the next n polls fail with status (0: a transport error).
func (tp *tap) failNextPolls(n, status int) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.failPolls, tp.pollStatus = n, status
}

func (tp *tap) failed() int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.pollsFailed
}

func (tp *tap) forceFlags() []string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return slices.Clone(tp.forced)
}

// withSim changes the simulator's options.
func withSim(change func(*armsim.Options)) fixtureOption {
	return func(o *armsim.Options, _ *Config) { change(o) }
}

// withConfig changes the provider's configuration.
func withConfig(change func(*Config)) fixtureOption {
	return func(_ *armsim.Options, c *Config) { change(c) }
}

type outsideToken struct{}

func (outsideToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "outside-token", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// outside is another writer of the scale sets (a person, a pipeline): a
// client of its own, with a token of its own, through the real SDK.
func (f *fixture) outside() *armcompute.VirtualMachineScaleSetsClient {
	f.t.Helper()
	c, err := armcompute.NewVirtualMachineScaleSetsClient(sub, outsideToken{}, &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud:     f.p.cfg.cloudConfig(),
		Transport: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.sim.CertPool()}}},
		Retry:     policy.RetryOptions{MaxRetries: -1},
	}})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// outsideScaleTo writes the scale set's capacity from outside.
func (f *fixture) outsideScaleTo(name string, capacity int) {
	f.t.Helper()
	if _, err := f.outside().BeginUpdate(f.ctx, "rg", name, armcompute.VirtualMachineScaleSetUpdate{
		SKU: &armcompute.SKU{Capacity: to.Ptr(int64(capacity))}}, nil); err != nil {
		f.t.Fatalf("outside write of capacity %d: %v", capacity, err)
	}
}

// outsideDelete deletes instances from outside.
func (f *fixture) outsideDelete(name string, ids ...string) {
	f.t.Helper()
	if _, err := f.outside().BeginDeleteInstances(f.ctx, "rg", name,
		armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: to.SliceOfPtrs(ids...)}, nil); err != nil {
		f.t.Fatalf("outside deletion of %v: %v", ids, err)
	}
}

// providerCaller is Write.Caller of the provider's requests.
var providerCaller = armsim.CallerOf("test-token")

// providerDeletes are the instance deletions the provider sent: their
// IDs and status, in order.
func (f *fixture) providerDeletes() []string {
	var out []string
	for _, w := range f.sim.Writes() {
		if w.Caller == providerCaller && w.Op == "DeleteInstances" {
			out = append(out, fmt.Sprintf("%v:%d", w.InstanceIDs, w.Status))
		}
	}
	return out
}

// lroFailureCodes is arm_operation_failures_total by code, counts above 0.
func lroFailureCodes(f *fixture) map[string]float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "vmss_autoscaler_arm_operation_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && m.GetCounter().GetValue() > 0 {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// advanceUntil steps the fake clock by step (and the simulator's VMs with
// it) until cond holds, within eventually's real-time deadline.
func (f *fixture) advanceUntil(what string, step time.Duration, cond func() bool) {
	f.t.Helper()
	eventually(f.t, what, func() bool {
		if cond() {
			return true
		}
		f.clock.Step(step)
		f.sim.Advance(f.ctx)
		return cond()
	})
}

// scaleUpFollowed says the group's scale-up operation is still followed.
func (g *scaleSet) scaleUpFollowed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.scaleUp != nil
}

// states maps each instance's ID (last segment) to its state, "+err"
// when it carries an error.
func states(t *testing.T, g cloudprovider.NodeGroup) map[string]string {
	t.Helper()
	ins, err := g.Instances()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, in := range ins {
		s := map[cloudprovider.InstanceState]string{cloudprovider.InstanceRunning: "running",
			cloudprovider.InstanceCreating: "creating", cloudprovider.InstanceDeleting: "deleting"}[in.State]
		if in.Error != nil {
			s += "+err " + in.Error.Code
		}
		out[lastSegment(in.ProviderID)] = s
	}
	return out
}

func setResourceID(name string) string {
	return "/subscriptions/" + sub + "/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/" + name
}

// TestPollErrorsAreNotFailures: a poll of a running scale-up that fails
// (the operation policy's 429, a front end's 503, a reset connection;
// five in a row, more than the SDK's retries would absorb) says nothing
// about the operation: no failure is counted, no placeholder made, and
// the operation is followed to its real end, when its VMs have booted.
func TestPollErrorsAreNotFailures(t *testing.T) {
	tests := []struct {
		name   string
		fail   func(f *fixture, tp *tap)
		failed func(f *fixture, tp *tap) int
	}{
		{"429 of the scale set's GetOperation policy", func(f *fixture, _ *tap) {
			f.sim.ThrottlePolicy(armsim.PolicyGetOperationResource, setResourceID("gpu"), 45*time.Second)
		}, func(f *fixture, _ *tap) int { return f.sim.Throttled()[armsim.PolicyGetOperationResource] }},
		{"503 from a front end", func(_ *fixture, tp *tap) { tp.failNextPolls(5, http.StatusServiceUnavailable) },
			func(_ *fixture, tp *tap) int { return tp.failed() }},
		{"transport error", func(_ *fixture, tp *tap) { tp.failNextPolls(5, 0) },
			func(_ *fixture, tp *tap) int { return tp.failed() }},
	}
	const boot = 3 * time.Minute
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tp := &tap{}
			f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("0:10:gpu"), withTap(tp),
				withSim(func(o *armsim.Options) { o.BootDelay = boot }))
			f.refresh()
			g := f.p.groups[setKey("rg", "gpu")]
			tc.fail(f, tp)
			start := f.clock.Now()
			if err := g.IncreaseSize(f.ctx, 2); err != nil {
				t.Fatal(err)
			}
			eventually(t, "a poll to fail", func() bool { return tc.failed(f, tp) > 0 })
			if c := lroFailureCodes(f); len(c) != 0 || !g.scaleUpFollowed() {
				t.Fatalf("after a failed poll of an operation in progress: failures %v, followed %v; want none and still followed", c, g.scaleUpFollowed())
			}
			var ended time.Time
			f.advanceUntil("the operation to end", 5*time.Second, func() bool {
				if g.scaleUpFollowed() {
					return false
				}
				ended = f.clock.Now()
				return true
			})
			if ended.Before(start.Add(boot)) {
				t.Fatalf("operation taken as ended after %v; its VMs boot in %v", ended.Sub(start), boot)
			}
			if c := lroFailureCodes(f); len(c) != 0 {
				t.Fatalf("arm_operation_failures_total %v, want none", c)
			}
			f.expire()
			f.refresh()
			want := map[string]string{"0": "running", "1": "running", "2": "running", "3": "running"}
			if got := states(t, g); !maps.Equal(got, want) {
				t.Fatalf("instances %v, want %v (no placeholder)", got, want)
			}
		})
	}
}

// TestPreemptedScaleUpIsSuperseded: another writer's capacity PATCH while
// the provider's scale-up runs preempts it (Canceled, OperationPreempted):
// counted as a preemption, no failed instance reported to the core, the
// next scale-up not held back, and the VMs of both writes come.
func TestPreemptedScaleUpIsSuperseded(t *testing.T) {
	const boot = 3 * time.Minute
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("0:10:gpu"),
		withSim(func(o *armsim.Options) { o.BootDelay = boot }))
	f.refresh()
	g := f.p.groups[setKey("rg", "gpu")]
	start := f.clock.Now()
	if err := g.IncreaseSize(f.ctx, 2); err != nil {
		t.Fatal(err)
	}
	if !g.ScaleUpInFlight() {
		t.Fatal("ScaleUpInFlight false while the scale-up's operation runs: the core would spend tokens on a write refused unsent")
	}
	f.outsideScaleTo("gpu", 5)
	f.advanceUntil("the preemption to be seen", time.Second, func() bool { return !g.scaleUpFollowed() })
	if g.ScaleUpInFlight() {
		t.Fatal("ScaleUpInFlight true after the operation ended (preempted)")
	}
	if d := f.clock.Since(start); d >= boot {
		t.Fatalf("operation followed for %v: want it ended by the preemption, before its VMs boot", d)
	}
	eventually(t, "the preemption to be counted", func() bool { return len(lroFailureCodes(f)) > 0 })
	if c := lroFailureCodes(f); !maps.Equal(c, map[string]float64{codePreempted: 1}) {
		t.Fatalf("arm_operation_failures_total %v, want only code %s once", c, codePreempted)
	}
	f.expire()
	f.refresh()
	want := map[string]string{"0": "running", "1": "running", "2": "creating", "3": "creating", "4": "creating"}
	if got := states(t, g); !maps.Equal(got, want) {
		t.Fatalf("instances %v, want %v: no failed instance for a superseded operation", got, want)
	}
	// The next scale-up is sent at once (not ScaleUpInProgress).
	if err := g.IncreaseSize(f.ctx, 1); err != nil {
		t.Fatalf("scale-up after the preemption: %v", err)
	}
	f.clock.Step(boot)
	f.sim.Advance(f.ctx)
	f.expire()
	f.refresh()
	for id, st := range states(t, g) {
		if st != "running" {
			t.Errorf("instance %s %s after boot, want running", id, st)
		}
	}
	if n, _ := g.TargetSize(); n != 6 {
		t.Fatalf("target %d, want 6", n)
	}
}

// TestPreemptedDeleteIsSentAgain: another writer's PATCH preempts the
// provider's deletion, and ARM puts its VMs back: they stay reported
// deleting (the core does not take them back), the next VM list sends
// their deletion again, and they go.
func TestPreemptedDeleteIsSentAgain(t *testing.T) {
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 4, nil)}, withNodes("0:10:gpu"),
		withSim(func(o *armsim.Options) { o.DeleteDelay, o.BootDelay = 3*time.Minute, time.Minute }))
	f.sim.Advance(f.ctx)
	f.refresh()
	g := f.p.groups[setKey("rg", "gpu")]
	pid := func(id string) string { return "azure://" + setResourceID("gpu") + "/virtualMachines/" + id }
	if err := g.DeleteNodes(f.ctx, []string{pid("0"), pid("1")}); err != nil {
		t.Fatal(err)
	}
	f.outsideScaleTo("gpu", 5) // preempts the deletion: VMs 0 and 1 back, one more created
	f.advanceUntil("the preemption to be seen", time.Second, func() bool { return lroFailureCodes(f)[codePreempted] == 1 })
	if vms := vmStates(f.vmsOf("gpu")); vms["0"] != armsim.StateRunning || vms["1"] != armsim.StateRunning {
		t.Fatalf("ARM's VMs %v: want 0 and 1 put back Running by the preemption", vms)
	}
	deleting := func(when string) {
		t.Helper()
		if s := states(t, g); s["0"] != "deleting" || s["1"] != "deleting" {
			t.Fatalf("%s: instances %v, want 0 and 1 deleting", when, s)
		}
	}
	deleting("once the preemption is seen")
	f.expire()
	f.refresh() // lists them Running: their deletion is sent again
	deleting("after the list that shows them back")
	eventually(t, "the deletion sent again", func() bool {
		return slices.Equal(f.providerDeletes(), []string{"[0 1]:202", "[0 1]:202"})
	})
	f.advanceUntil("VMs 0 and 1 gone", 10*time.Second, func() bool {
		vms := vmStates(f.vmsOf("gpu"))
		_, a := vms["0"]
		_, b := vms["1"]
		return !a && !b
	})
	f.expire()
	f.refresh()
	if s := states(t, g); s["0"] != "" || s["1"] != "" || len(s) != 3 {
		t.Fatalf("instances %v, want 2, 3 and 4", s)
	}
	if c := lroFailureCodes(f); !maps.Equal(c, map[string]float64{codePreempted: 1}) {
		t.Fatalf("arm_operation_failures_total %v, want one preemption", c)
	}
}

func vmStates(vms []armsim.VMState) map[string]string {
	out := map[string]string{}
	for _, vm := range vms {
		out[vm.InstanceID] = vm.State
	}
	return out
}

// TestDeleteOfAVanishedVMSendsTheRest: a VM deleted out of band after the
// provider's last VM list is still in it; ARM refuses a batch naming it
// (400 for the whole batch). The provider lists the VMs once more and
// sends the rest, and the VM that vanished is reported deleting until a
// list drops it; when none is left, nothing is sent.
func TestDeleteOfAVanishedVMSendsTheRest(t *testing.T) {
	tests := []struct {
		name     string
		delete   []int // indexes into the listed VMs; the first vanishes
		wantSent int   // the VMs of the second send (0: none)
	}{
		{"one of two vanished", []int{1, 2}, 1},
		{"the only one vanished", []int{1}, 0},
	}
	for _, flexible := range []bool{false, true} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/flexible=%v", tc.name, flexible), func(t *testing.T) {
				spec := gpuSet("gpu", 3, nil)
				if flexible {
					spec = flexSet("gpu", 3, nil)
				}
				f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:10:gpu"))
				f.sim.Advance(f.ctx)
				f.refresh()
				g := f.p.groups[setKey("rg", "gpu")]
				ins, _ := g.Instances()
				slices.SortFunc(ins, func(a, b cloudprovider.Instance) int { return strings.Compare(a.ProviderID, b.ProviderID) })
				name := func(i int) string { return lastSegment(ins[i].ProviderID) }
				f.outsideDelete("gpu", name(tc.delete[0]))
				f.sim.Advance(f.ctx) // gone
				if _, ok := vmStates(f.vmsOf("gpu"))[name(tc.delete[0])]; ok {
					t.Fatal("the VM deleted out of band is still there")
				}
				var pids, names []string
				for _, i := range tc.delete {
					pids = append(pids, ins[i].ProviderID)
					names = append(names, name(i))
				}
				if err := g.DeleteNodes(f.ctx, pids); err != nil {
					t.Fatalf("DeleteNodes: %v", err)
				}
				slices.Sort(names)
				want := []string{fmt.Sprintf("%v:400", names)}
				if tc.wantSent > 0 {
					want = append(want, fmt.Sprintf("%v:202", []string{name(tc.delete[1])}))
				}
				if got := f.providerDeletes(); !slices.Equal(got, want) {
					t.Fatalf("deletions sent %v, want %v", got, want)
				}
				for _, i := range tc.delete {
					if s := states(t, g)[name(i)]; s != "deleting" {
						t.Errorf("instance %s %q right after the deletion, want deleting", name(i), s)
					}
				}
				f.sim.Advance(f.ctx)
				f.expire()
				f.refresh()
				if got, want := len(states(t, g)), 3-len(tc.delete); got != want {
					t.Fatalf("instances %v, want %d", states(t, g), want)
				}
				if got := len(f.vmsOf("gpu")); got != 3-len(tc.delete) {
					t.Fatalf("ARM has %d VMs, want %d", got, 3-len(tc.delete))
				}
			})
		}
	}
}

// TestDeletingVMsWithoutIDsAreSkipped: ARM lists a VM late in its
// deletion with an empty ID (FaultDeletingWithoutIDs): it is no machine
// of the group, is never sent, and the group's other VMs are unaffected.
func TestDeletingVMsWithoutIDsAreSkipped(t *testing.T) {
	// Without preemption: the provider's deletion would preempt the
	// outside one and put VM 1 back (TestPreemptedDeleteIsSentAgain).
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 3, nil)}, withNodes("0:10:gpu"),
		withSim(func(o *armsim.Options) { o.DeleteDelay, o.NoPreemption = 10*time.Minute, true }))
	f.sim.Advance(f.ctx)
	f.outsideDelete("gpu", "1")
	if err := f.sim.InjectFault("rg", "gpu", armsim.Fault{Kind: armsim.FaultDeletingWithoutIDs}); err != nil {
		t.Fatal(err)
	}
	f.refresh()
	g := f.p.groups[setKey("rg", "gpu")]
	check := func(when string, want map[string]string) {
		t.Helper()
		ins, _ := g.Instances()
		for _, in := range ins {
			if _, ok := parseProviderID(in.ProviderID); !ok || lastSegment(in.ProviderID) == "" {
				t.Fatalf("%s: instance with provider ID %q listed", when, in.ProviderID)
			}
		}
		if got := states(t, g); !maps.Equal(got, want) {
			t.Fatalf("%s: instances %v, want %v", when, got, want)
		}
	}
	check("first list", map[string]string{"0": "running", "2": "running"})
	if n, _ := g.TargetSize(); n != 2 {
		t.Fatalf("target %d, want 2", n)
	}
	if err := g.DeleteNodes(f.ctx, []string{"azure://" + setResourceID("gpu") + "/virtualMachines/2"}); err != nil {
		t.Fatal(err)
	}
	if got := f.providerDeletes(); !slices.Equal(got, []string{"[2]:202"}) {
		t.Fatalf("deletions sent %v, want only VM 2's", got)
	}
	f.expire()
	f.refresh() // VM 2 is deleting now, listed without an ID too
	check("list with both deleting VMs blank", map[string]string{"0": "running"})
	if err := f.sim.ClearFaults("rg", "gpu"); err != nil {
		t.Fatal(err)
	}
	f.clock.Step(6 * time.Minute) // a quiet set's next VM list
	f.refresh()
	check("fault cleared", map[string]string{"0": "running", "1": "deleting", "2": "deleting"})
}

// TestRefusedForceDeletionFallsBack: with --azure-force-delete, ARM refuses
// force deletion of an isolated size's VMs (409 OperationNotAllowed): the
// same batch goes without force at once, and the scale set is not forced
// again. A throttled force deletion (the Compute 429 carries
// OperationNotAllowed too) is no refusal: the next one is forced.
func TestRefusedForceDeletionFallsBack(t *testing.T) {
	// Standard_F72s_v2 is in cluster-autoscaler's isolatedVMSizes.
	f72 := armsim.SKU{Name: "Standard_F72s_v2", Family: "standardFSv2Family", VCPUs: 72, MemoryGB: 144, Arch: armsim.ArchX64}
	tests := []struct {
		name     string
		sku      string
		throttle bool
		// want: the forceDeletion flag of each request and its status,
		// for the first deletion and then the second.
		wantFirst, wantSecond []string
		wantErr               func(error) bool
		wantNoForce           bool
	}{
		{name: "isolated size", sku: f72.Name,
			wantFirst: []string{"true:409", "false:202"}, wantSecond: []string{"false:202"}, wantNoForce: true},
		{name: "throttled is not refused", sku: "Standard_D16s_v5", throttle: true,
			wantFirst: []string{"true:429"}, wantSecond: []string{"true:202"}, wantErr: cloudprovider.IsThrottled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tp := &tap{}
			spec := armsim.ScaleSetSpec{ResourceGroup: "rg", Name: "pool", SKU: tc.sku, Capacity: 3}
			f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:10:pool"), withTap(tp),
				withSim(func(o *armsim.Options) { o.SKUs = append(armsim.DefaultSKUs(), f72); o.DeleteDelay = time.Minute }),
				withConfig(func(c *Config) { c.ForceDelete = true }))
			f.sim.Advance(f.ctx)
			f.refresh()
			g := f.p.groups[setKey("rg", "pool")]
			if tc.throttle {
				f.sim.ThrottlePolicy(armsim.PolicyDeleteVMScaleSetResource, setResourceID("pool"), 30*time.Second)
			}
			// Each deletion sent, as its forceDeletion flag and ARM's status.
			sent := func() []string {
				flags := tp.forceFlags()
				var out []string
				for _, w := range f.sim.Writes() {
					if w.Op == "DeleteInstances" && len(out) < len(flags) {
						out = append(out, fmt.Sprintf("%s:%d", flags[len(out)], w.Status))
					}
				}
				return out
			}
			pid := func(id string) string { return "azure://" + setResourceID("pool") + "/virtualMachines/" + id }
			err := g.DeleteNodes(f.ctx, []string{pid("0")})
			if (tc.wantErr == nil) != (err == nil) || (err != nil && !tc.wantErr(err)) {
				t.Fatalf("first DeleteNodes: %v", err)
			}
			if got := sent(); !slices.Equal(got, tc.wantFirst) {
				t.Fatalf("first deletion sent %v, want %v", got, tc.wantFirst)
			}
			g.mu.Lock()
			noForce := g.noForce
			g.mu.Unlock()
			if noForce != tc.wantNoForce {
				t.Fatalf("no longer forcing: %v, want %v", noForce, tc.wantNoForce)
			}
			f.clock.Step(31 * time.Second)
			id := "1"
			if err != nil {
				id = "0" // the core deletes it again
			}
			if err := g.DeleteNodes(f.ctx, []string{pid(id)}); err != nil {
				t.Fatalf("second DeleteNodes: %v", err)
			}
			if got := sent()[len(tc.wantFirst):]; !slices.Equal(got, tc.wantSecond) {
				t.Fatalf("second deletion sent %v, want %v", got, tc.wantSecond)
			}
			if s := states(t, g)[id]; s != "deleting" {
				t.Fatalf("instance %s %q, want deleting", id, s)
			}
		})
	}
}

// TestOverprovisionedExtrasAreNotMachines: an overprovisioning scale set
// makes extra VMs on a scale-out; they are not the group's machines (the
// core would count them as machines that never registered), the group
// holds exactly its capacity, and the warning is logged once.
func TestOverprovisionedExtrasAreNotMachines(t *testing.T) {
	const boot = 3 * time.Minute
	spec := gpuSet("gpu", 2, nil)
	spec.Overprovision = true
	f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:20:gpu"),
		withSim(func(o *armsim.Options) { o.BootDelay, o.OverprovisionPercent = boot, 50 }))
	logs := withLog(f)
	f.sim.Advance(f.ctx)
	f.refresh()
	g := f.p.groups[setKey("rg", "gpu")]
	if err := g.IncreaseSize(f.ctx, 4); err != nil {
		t.Fatal(err)
	}
	extras := map[string]bool{}
	for _, vm := range f.vmsOf("gpu") {
		if vm.Overprovisioned {
			extras[vm.InstanceID] = true
		}
	}
	if len(extras) != 2 {
		t.Fatalf("simulator made %d extras, want 2 (50%% of 4)", len(extras))
	}
	f.expire()
	f.refresh()
	got := states(t, g)
	for id := range extras {
		if _, ok := got[id]; ok {
			t.Fatalf("overprovisioned extra %s listed as a machine: %v", id, got)
		}
	}
	want := map[string]string{"0": "running", "1": "running", "2": "creating", "3": "creating", "4": "creating", "5": "creating"}
	if !maps.Equal(got, want) {
		t.Fatalf("instances %v, want %v", got, want)
	}
	f.clock.Step(boot)
	f.sim.Advance(f.ctx) // the requested VMs run; the extras start deleting
	f.sim.Advance(f.ctx)
	f.expire()
	f.refresh()
	want = map[string]string{"0": "running", "1": "running", "2": "running", "3": "running", "4": "running", "5": "running"}
	if got := states(t, g); !maps.Equal(got, want) {
		t.Fatalf("after boot: instances %v, want %v", got, want)
	}
	if n := strings.Count(logs.String(), "scale set overprovisions"); n != 1 {
		t.Fatalf("overprovisioning warning logged %d times over three refreshes, want once:\n%s", n, logs.String())
	}
}

// TestRefusedWritesNameTheCause: a write refused by a deny assignment
// (403: AKS's node resource group lockdown) or a management lock (409
// ScopeLocked) fails with an error naming the cause, classed so the core
// backs the group off (neither clears in the next loop: not a conflict
// retried at once), and changes nothing.
func TestRefusedWritesNameTheCause(t *testing.T) {
	tests := []struct {
		name  string
		kind  armsim.FaultKind
		wants []string
	}{
		{"deny assignment", armsim.FaultDenyAssignment, []string{"DenyAssignmentAuthorizationFailed", "deny assignment"}},
		{"management lock", armsim.FaultScopeLocked, []string{"ScopeLocked", "locked"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("0:10:gpu"))
			f.sim.Advance(f.ctx)
			f.refresh()
			if err := f.sim.InjectFault("rg", "gpu", armsim.Fault{Kind: tc.kind}); err != nil {
				t.Fatal(err)
			}
			g := f.p.groups[setKey("rg", "gpu")]
			up := g.IncreaseSize(f.ctx, 1)
			del := g.DeleteNodes(f.ctx, []string{"azure://" + setResourceID("gpu") + "/virtualMachines/0"})
			for what, err := range map[string]error{"scale-up": up, "deletion": del} {
				if err == nil {
					t.Fatalf("%s accepted", what)
				}
				for _, w := range tc.wants {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not name %q", what, err, w)
					}
				}
				if c := cloudprovider.ClassOf(err); c != cloudprovider.ClassOther {
					t.Errorf("%s: class %s, want %s (backed off)", what, c, cloudprovider.ClassOther)
				}
			}
			if st, _ := f.sim.ScaleSet("rg", "gpu"); st.Capacity != 2 {
				t.Fatalf("capacity %d, want 2", st.Capacity)
			}
			if s := states(t, g); !maps.Equal(s, map[string]string{"0": "running", "1": "running"}) {
				t.Fatalf("instances %v, want both running", s)
			}
		})
	}
}

// TestPlacementGroupLimitRaised: a single placement group holds 100 VMs
// unless Azure raised its cap (up to 300) on request; the tag says so, and
// ARM's "exceeds the total limit of 'N'" corrects a tag that says more
// than Azure granted.
func TestPlacementGroupLimitRaised(t *testing.T) {
	tests := []struct {
		name      string
		granted   int    // the simulator's cap (0: 100)
		tag       string // tagPlacementGroupLimit ("": none)
		capacity  int
		wantMax   int
		wantWhy   string
		up        int // a scale-up asked then
		wantLimit int // 0: accepted; else refused naming this limit
		after     int // the max after it
	}{
		{"tag of a granted raise", 300, "300", 95, 300, "single placement group raised to 300 (tag " + tagPlacementGroupLimit + ")", 205, 0, 300},
		{"tag says more than granted", 200, "300", 195, 300, "single placement group raised to 300 (tag " + tagPlacementGroupLimit + ")", 10, 200, 200},
		{"raise granted, not tagged", 300, "", 95, 100, "single placement group", 5, 0, 100},
		{"tag out of range", 0, "1000", 95, 100, "single placement group (tag " + tagPlacementGroupLimit + `="1000" ignored: want 100 to 300)`, 5, 0, 100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := gpuSet("gpu", tc.capacity, nil)
			spec.SinglePlacementGroup, spec.PlacementGroupLimit = true, tc.granted
			if tc.tag != "" {
				spec.Tags = map[string]string{tagPlacementGroupLimit: tc.tag}
			}
			f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:500:gpu"))
			f.refresh()
			g := f.p.groups[setKey("rg", "gpu")]
			if _, limit, why := g.SizeLimit(); g.MaxSize() != tc.wantMax || limit != tc.wantMax || why != tc.wantWhy {
				t.Fatalf("MaxSize %d, SizeLimit %d %q; want %d %q", g.MaxSize(), limit, why, tc.wantMax, tc.wantWhy)
			}
			err := g.IncreaseSize(f.ctx, tc.up)
			switch {
			case tc.wantLimit == 0 && err != nil:
				t.Fatalf("IncreaseSize(%d) at %d: %v", tc.up, tc.capacity, err)
			case tc.wantLimit > 0 && (!cloudprovider.IsSizeLimit(err) || !strings.Contains(err.Error(), fmt.Sprintf("total limit of '%d'", tc.wantLimit))):
				t.Fatalf("IncreaseSize(%d) at %d: %v; want a size-limit refusal naming %d", tc.up, tc.capacity, err, tc.wantLimit)
			}
			if got := g.MaxSize(); got != tc.after {
				t.Fatalf("MaxSize %d after the scale-up, want %d", got, tc.after)
			}
			f.expire()
			f.refresh()
			if got := g.MaxSize(); got != tc.after {
				t.Fatalf("MaxSize %d after a refresh, want %d (what ARM named kept while the tag is unchanged)", got, tc.after)
			}
		})
	}

	t.Run("tagged later: the max follows at the next refresh", func(t *testing.T) {
		spec := gpuSet("gpu", 100, nil)
		spec.SinglePlacementGroup, spec.PlacementGroupLimit = true, 300
		f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:500:gpu"))
		f.refresh()
		g := f.p.groups[setKey("rg", "gpu")]
		if err := g.IncreaseSize(f.ctx, 1); err == nil || g.MaxSize() != 100 {
			t.Fatalf("IncreaseSize past 100 untagged: %v, max %d; want refused unsent, max 100", err, g.MaxSize())
		}
		if _, err := f.outside().BeginUpdate(f.ctx, "rg", "gpu", armcompute.VirtualMachineScaleSetUpdate{
			Tags: map[string]*string{tagPlacementGroupLimit: to.Ptr("300")}}, nil); err != nil {
			t.Fatal(err)
		}
		f.expire()
		f.refresh()
		if g.MaxSize() != 300 {
			t.Fatalf("MaxSize %d after the tag, want 300", g.MaxSize())
		}
		if err := g.IncreaseSize(f.ctx, 50); err != nil {
			t.Fatalf("IncreaseSize to 150: %v", err)
		}
	})
}

// TestConcurrentScaleUpSupersedesItsOwnWrite: with ConcurrentScaleUps
// (--azure-concurrent-scale-ups) a scale-up asked for while the
// provider's previous one runs is sent at once with the absolute target;
// ARM preempts the earlier operation (Canceled, OperationPreempted, as
// for another writer's PATCH), which is no failure: no failed instance,
// every VM of both writes comes, and the set is never reported as
// holding a write in flight. cluster-autoscaler's Azure provider sends
// each capacity write without waiting for the previous operation
// (azure_scale_set.go: IncreaseSize, createOrUpdateInstances).
func TestConcurrentScaleUpSupersedesItsOwnWrite(t *testing.T) {
	const boot = 3 * time.Minute
	f := newFixture(t, []armsim.ScaleSetSpec{gpuSet("gpu", 2, nil)}, withNodes("0:10:gpu"),
		withSim(func(o *armsim.Options) { o.BootDelay = boot }),
		func(_ *armsim.Options, c *Config) { c.ConcurrentScaleUps = true })
	f.refresh()
	g := f.p.groups[setKey("rg", "gpu")]
	if err := g.IncreaseSize(f.ctx, 2); err != nil {
		t.Fatal(err)
	}
	if g.ScaleUpInFlight() {
		t.Fatal("ScaleUpInFlight true with ConcurrentScaleUps: the core would hold demand a write could carry now")
	}
	if err := g.IncreaseSize(f.ctx, 1); err != nil {
		t.Fatalf("second scale-up while the first runs: %v (want it sent)", err)
	}
	if n, _ := g.TargetSize(); n != 5 {
		t.Fatalf("target %d, want 5: the second write is the absolute target 2+2+1", n)
	}
	eventually(t, "the first operation's preemption to be counted", func() bool {
		f.clock.Step(time.Second)
		f.sim.Advance(f.ctx)
		return len(lroFailureCodes(f)) > 0
	})
	if c := lroFailureCodes(f); !maps.Equal(c, map[string]float64{codePreempted: 1}) {
		t.Fatalf("arm_operation_failures_total %v, want only code %s once", c, codePreempted)
	}
	f.clock.Step(boot)
	f.sim.Advance(f.ctx)
	f.expire()
	f.refresh()
	got := states(t, g)
	if len(got) != 5 {
		t.Fatalf("instances %v, want 5", got)
	}
	for id, st := range got {
		if st != "running" {
			t.Errorf("instance %s %s after boot, want running: a superseded write is no failure", id, st)
		}
	}
}
