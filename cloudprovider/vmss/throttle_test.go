package vmss

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testclock "k8s.io/utils/clock/testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

const (
	testSetA = "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/a"
	testSetB = "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/b"
	opList   = "VirtualMachineScaleSetVMsClient.NewListPager"
	opGet    = "VirtualMachineScaleSetsClient.Get"
	opUpdate = "VirtualMachineScaleSetsClient.BeginUpdate"
)

// answer builds an ARM answer with the given status, remaining-resource
// values and extra headers.
func answer(status int, remaining []string, extra ...string) *http.Response {
	h := http.Header{}
	for _, v := range remaining {
		h.Add(headerRemainingResource, v)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		h.Set(extra[i], extra[i+1])
	}
	return &http.Response{StatusCode: status, Header: h}
}

func computeBody(policy string) []byte {
	return []byte(`{"error":{"code":"OperationNotAllowed","message":"The server rejected the request because too many requests have been received for this subscription.","details":[{"code":"TooManyRequests","target":"` +
		policy + `","message":"{}"}]}}`)
}

// TestThrottleHoldsOnlyWhatThePolicyCovers: a 429 holds back the calls
// its policy covers — the operation that named it, for the scale set or
// for all when the policy is the subscription's — and nothing else; only
// ARM's own empty bucket holds a whole kind. (Before, any 429 held every
// call of its kind.)
func TestThrottleHoldsOnlyWhatThePolicyCovers(t *testing.T) {
	type call struct {
		kind, op, resource string
		held               bool
	}
	cases := []struct {
		name string
		// learn: answers of each operation that teach its policies.
		learn map[string][]string
		// the 429.
		kind, op, resource string
		resp               *http.Response
		body               []byte
		want               []call
	}{{
		name: "a VM list's 30-minute policy holds VM lists of every set, not GETs or polls",
		learn: map[string][]string{
			opList: {"Microsoft.Compute/HighCostGetVMScaleSet3Min;150,Microsoft.Compute/HighCostGetVMScaleSet30Min;10"},
			opGet:  {"Microsoft.Compute/LowCostGetVMScaleSetResource;30", "Microsoft.Compute/LowCostGetVMScaleSetSubscription;2000"},
			"poll": {"Microsoft.Compute/GetOperationResource;40"},
		},
		kind: kindRead, op: opList, resource: testSetA,
		resp: answer(429, []string{"Microsoft.Compute/HighCostGetVMScaleSet30Min;0"}, "Retry-After", "1200"),
		body: computeBody("HighCostGetVMScaleSet30Min"),
		want: []call{
			{kindRead, opList, testSetA, true},
			{kindRead, opList, testSetB, true},
			{kindRead, opGet, testSetA, false},
			{kindRead, "poll", testSetA, false},
			{kindRead, "VirtualMachineScaleSetsClient.NewListPager", "", false},
			{kindWrite, opUpdate, testSetA, false},
		},
	}, {
		name:  "a scale set's Update policy holds that scale set's writes only",
		learn: map[string][]string{opUpdate: {"Microsoft.Compute/UpdateVMScaleSetResource;5", "Microsoft.Compute/UpdateVMScaleSetSubscription;1400"}},
		kind:  kindWrite, op: opUpdate, resource: testSetA,
		resp: answer(429, []string{"Microsoft.Compute/UpdateVMScaleSetResource;0"}, "Retry-After", "15"),
		body: computeBody("UpdateVMScaleSetResource"),
		want: []call{
			{kindWrite, opUpdate, testSetA, true},
			{kindWrite, opUpdate, testSetB, false},
			{kindRead, opList, testSetA, false},
		},
	}, {
		name: "ARM's own read bucket empty holds every read",
		kind: kindRead, op: opGet, resource: testSetA,
		resp: answer(429, nil, "Retry-After", "10", "x-ms-ratelimit-remaining-subscription-reads", "0"),
		body: []byte(`{"error":{"code":"TooManyRequests","message":"Number of 'read' requests for subscription exceeded."}}`),
		want: []call{
			{kindRead, opGet, testSetB, true},
			{kindRead, opList, testSetA, true},
			{kindWrite, opUpdate, testSetA, false},
		},
	}, {
		name: "a 429 that names no policy holds its kind",
		kind: kindRead, op: opGet, resource: testSetA,
		resp: answer(429, nil, "Retry-After", "10"),
		want: []call{{kindRead, opList, testSetB, true}, {kindWrite, opUpdate, testSetA, false}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
			th := newThrottle(clk, newARMMetrics(nil))
			for op, vals := range tc.learn {
				th.observe(kindRead, op, testSetA, answer(200, vals), nil)
			}
			th.observe(tc.kind, tc.op, tc.resource, tc.resp, tc.body)
			for _, c := range tc.want {
				u, why := th.blocked(c.kind, c.op, c.resource)
				if got := !u.IsZero(); got != c.held {
					t.Errorf("%s %s of %s: held %v (%s), want %v", c.kind, c.op, c.resource, got, why, c.held)
				}
			}
			// Retry-After passes: each call goes through (the first of a
			// policy whose 429 said 0 is the one let through to read the
			// count again; its answer, with tokens, lifts the pace).
			ra, _ := strconv.Atoi(tc.resp.Header.Get("Retry-After"))
			clk.Step(time.Duration(ra)*time.Second + time.Millisecond)
			for _, c := range tc.want {
				if u, why := th.blocked(c.kind, c.op, c.resource); !u.IsZero() {
					t.Errorf("after Retry-After: %s %s of %s still held (%s)", c.kind, c.op, c.resource, why)
				}
				th.observe(c.kind, c.op, c.resource, answer(200, []string{"Microsoft.Compute/HighCostGetVMScaleSet30Min;800",
					"Microsoft.Compute/UpdateVMScaleSetResource;10"}), nil)
			}
		})
	}
}

// TestThrottleEscalatesAPolicyThrottledForTwoSets: a policy whose name
// does not say its scope, throttled for two scale sets at once, is the
// subscription's: a third set's calls are held too.
func TestThrottleEscalatesAPolicyThrottledForTwoSets(t *testing.T) {
	clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	th := newThrottle(clk, newARMMetrics(nil))
	const testSetC = testSetA + "c"
	for _, set := range []string{testSetA, testSetB} {
		th.observe(kindWrite, opUpdate, set, answer(429, []string{"Microsoft.Compute/PutVMScaleSet;0"}, "Retry-After", "60"), computeBody("PutVMScaleSet"))
	}
	if u, _ := th.blocked(kindWrite, opUpdate, testSetC); u.IsZero() {
		t.Fatal("a third scale set's write is not held after two sets' 429s of one policy")
	}
}

// TestThrottlePacesAPolicyBelowItsFloor: once a policy's remaining count
// is at its floor, one call goes through per lowPace (so steady state
// meets no 429), and none is held above it.
func TestThrottlePacesAPolicyBelowItsFloor(t *testing.T) {
	clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	th := newThrottle(clk, newARMMetrics(nil))
	obs := func(n int) {
		th.observe(kindWrite, opUpdate, testSetA, answer(202, []string{"Microsoft.Compute/UpdateVMScaleSetResource;" + strconv.Itoa(n)}), nil)
	}
	obs(11)
	if u, _ := th.blocked(kindWrite, opUpdate, testSetA); !u.IsZero() {
		t.Fatal("held with 11 of 11 left")
	}
	obs(1)
	if u, _ := th.blocked(kindWrite, opUpdate, testSetA); !u.IsZero() {
		t.Fatal("the first call at the floor is held; want it let through")
	}
	u, why := th.blocked(kindWrite, opUpdate, testSetA)
	if u.IsZero() {
		t.Fatal("a second call at the floor within lowPace is let through")
	}
	if want := clk.Now().Add(lowPace); !u.Equal(want) {
		t.Fatalf("held until %v (%s), want %v", u, why, want)
	}
	if u, _ := th.blocked(kindWrite, opUpdate, testSetB); !u.IsZero() {
		t.Fatal("another scale set is paced by set a's floor")
	}
	clk.Step(lowPace)
	if u, _ := th.blocked(kindWrite, opUpdate, testSetA); !u.IsZero() {
		t.Fatal("held after lowPace")
	}
	obs(6)
	if u, _ := th.blocked(kindWrite, opUpdate, testSetA); !u.IsZero() {
		t.Fatal("held after the bucket refilled above its floor")
	}
}

func TestRemainingCounts(t *testing.T) {
	h := http.Header{}
	h.Add(headerRemainingResource, "Microsoft.Compute/HighCostGetVMScaleSet3Min;107,Microsoft.Compute/HighCostGetVMScaleSet30Min;827")
	h.Add(headerRemainingResource, "Microsoft.Compute/DeleteVMScaleSet;107")
	h.Add(headerRemainingResource, "Microsoft.Compute/DeleteVMScaleSet;587")
	h.Add(headerRemainingResource, "garbage,Microsoft.Compute/Bad;x,;3")
	got := remainingCounts(h)
	want := map[string]int{"highcostgetvmscaleset3min": 107, "highcostgetvmscaleset30min": 827, "deletevmscaleset": 107}
	if len(got) != len(want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("counts %v, want %v", got, want)
		}
	}
}

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachineScaleSets/A/virtualMachines": "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/a",
		"/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachineScaleSets/A":                 "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/a",
		"/subscriptions/S/providers/Microsoft.Compute/locations/eastus/operations/x":                               "",
	} {
		req, _ := http.NewRequest(http.MethodGet, "https://127.0.0.1"+path, nil)
		if got := resourceOf(req); got != want {
			t.Errorf("resourceOf(%s) = %q, want %q", path, got, want)
		}
	}
}

// TestPolicyHoldGaugesExistFromTheFirstAnswer: a policy's hold gauges
// are exported (at 0) from the first answer that names it, so the ARM
// dashboard's "Compute policies: held for" panel has a series for every
// policy ARM charges, not only for those that once throttled (CI's
// dashboard test found the panel empty without a 429).
func TestPolicyHoldGaugesExistFromTheFirstAnswer(t *testing.T) {
	clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	m := newARMMetrics(nil)
	th := newThrottle(clk, m)
	if n := testutil.CollectAndCount(m.policyHeldUntil); n != 0 {
		t.Fatalf("%d hold series before any answer, want 0", n)
	}
	th.observe(kindWrite, opUpdate, testSetA, answer(200, []string{"Microsoft.Compute/UpdateVMScaleSetResource;11"}), nil)
	if n := testutil.CollectAndCount(m.policyHeldUntil); n != 2 {
		t.Fatalf("%d hold series after one answer naming one policy, want 2 (its two scopes)", n)
	}
	for _, scope := range []string{"resource", "subscription"} {
		g, err := m.policyHeldUntil.GetMetricWithLabelValues("updatevmscalesetresource", scope)
		if err != nil {
			t.Fatal(err)
		}
		if v := testutil.ToFloat64(g); v != 0 {
			t.Errorf("scope %s: held until %v, want 0 (not held)", scope, v)
		}
	}
}

// TestForceRefusalIsNotThrottling: ARM's refusal of a force deletion
// (OperationNotAllowed, 409) turns force off for the scale set; the
// Compute RP's 429, whose body has the same code, does not.
func TestForceRefusalIsNotThrottling(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		want   bool
	}{
		{"refused", http.StatusConflict, true},
		{"refused with 400", http.StatusBadRequest, true},
		{"throttled", http.StatusTooManyRequests, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := &azcore.ResponseError{StatusCode: c.status, ErrorCode: "OperationNotAllowed"}
			if got := isForceRefused(fmt.Errorf("deleting: %w", err)); got != c.want {
				t.Fatalf("isForceRefused(%d OperationNotAllowed) = %v, want %v", c.status, got, c.want)
			}
		})
	}
}

// TestHeldBackCallIsNotSent: a call the provider held back never reached
// ARM: classified throttled and ErrNotSent, so the core defers its demand
// into the scale set's next write instead of counting a failure.
func TestHeldBackCallIsNotSent(t *testing.T) {
	err := classify(fmt.Errorf("updating: %w", &errThrottled{kind: kindWrite, until: time.Unix(1_700_000_000, 0), why: "policy updatevmscalesetresource"}))
	if cloudprovider.ClassOf(err) != cloudprovider.ClassThrottled || !errors.Is(err, cloudprovider.ErrNotSent) {
		t.Fatalf("held-back call classified %v, ErrNotSent %v: want throttled and not sent", cloudprovider.ClassOf(err), errors.Is(err, cloudprovider.ErrNotSent))
	}
	sent := classify(&azcore.ResponseError{StatusCode: http.StatusTooManyRequests, ErrorCode: "OperationNotAllowed"})
	if errors.Is(sent, cloudprovider.ErrNotSent) {
		t.Fatal("a 429 ARM answered was classified as not sent")
	}
}

// TestVMListBudgetHoldsInAnyWindow: the VM-list budget lets at most its
// count into any 30-minute window (the window HighCostGetVMScaleSet30Min
// counts), a full bucket included, and repays first lists forced into
// debt before any other. Before, a 300 budget let 330 into a window.
func TestVMListBudgetHoldsInAnyWindow(t *testing.T) {
	for _, per30 := range []int{300, 50, 10000} {
		t0 := time.Unix(1_700_000_000, 0)
		b := newVMListBudget(per30, t0)
		var taken []time.Time
		// 75 first lists forced at once, then a list asked every second
		// for two hours.
		for range 75 {
			b.take(t0, true)
			taken = append(taken, t0)
		}
		for now := t0; now.Before(t0.Add(2 * time.Hour)); now = now.Add(time.Second) {
			if b.take(now, false) {
				taken = append(taken, now)
			}
		}
		most := 0
		for i, j := 0, 0; i < len(taken); i++ {
			for j < len(taken) && taken[j].Before(taken[i].Add(30*time.Minute)) {
				j++
			}
			most = max(most, j-i)
		}
		if limit := max(per30, 75); most > limit {
			t.Errorf("budget %d: %d lists in a 30-minute window, want at most %d", per30, most, limit)
		}
		if most < per30*9/10 && per30 > 75 && per30 <= 1000 {
			t.Errorf("budget %d: only %d lists in the busiest window: the budget is not used", per30, most)
		}
	}
}
