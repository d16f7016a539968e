package armsim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
)

// highCostHeaders are the x-ms-ratelimit-remaining-resource lines of the
// n-th VM list page answered in fresh windows.
func highCostHeaders(n int) []string {
	return []string{"Microsoft.Compute/HighCostGetVMScaleSet3Min;" + strconv.Itoa(190-n),
		"Microsoft.Compute/HighCostGetVMScaleSet30Min;" + strconv.Itoa(900-n)}
}

// tokenCredential hands out a bearer token of its own: another principal.
type tokenCredential string

func (c tokenCredential) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: string(c), ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// setsClientAs is a scale-set client of env's simulator sending token.
func setsClientAs(t *testing.T, env *testEnv, token string) *armcompute.VirtualMachineScaleSetsClient {
	t.Helper()
	factory, err := armcompute.NewClientFactory(testSub, tokenCredential(token), &arm.ClientOptions{
		ClientOptions: policy.ClientOptions{
			Cloud: cloud.Configuration{Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
				cloud.ResourceManager: {Endpoint: env.srv.URL(), Audience: "https://management.azure.com"},
			}},
			Transport: env.http,
			Retry:     policy.RetryOptions{MaxRetries: -1},
		},
	})
	if err != nil {
		t.Fatalf("NewClientFactory: %v", err)
	}
	return factory.NewVirtualMachineScaleSetsClient()
}

// computeThrottle is what a Compute 429 says.
type computeThrottle struct {
	code, internal string
	targets        []string
	groups         []operationGroup
	retryAfter     string
	remaining      []string
}

// computeThrottleOf reads a Compute 429 the SDK returned, or fails the
// test when err is not one.
func computeThrottleOf(t *testing.T, err error) computeThrottle {
	t.Helper()
	if err == nil {
		t.Fatal("no error, want a 429")
	}
	re := responseError(t, err)
	if re.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d (%v), want 429", re.StatusCode, err)
	}
	body, rerr := io.ReadAll(re.RawResponse.Body)
	if rerr != nil {
		t.Fatalf("reading the 429's body: %v", rerr)
	}
	var b computeErrorBody
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("429 body %s: %v", body, err)
	}
	ct := computeThrottle{code: re.ErrorCode, retryAfter: re.RawResponse.Header.Get("Retry-After"),
		remaining: re.RawResponse.Header.Values(headerRemainingResource)}
	if b.Error.Code != re.ErrorCode {
		t.Fatalf("SDK error code %q, body's %q", re.ErrorCode, b.Error.Code)
	}
	if b.Error.Message != computeThrottleMessage {
		t.Errorf("429 message %q", b.Error.Message)
	}
	if b.Error.InnerError != nil {
		ct.internal = b.Error.InnerError.InternalErrorCode
	}
	for _, d := range b.Error.Details {
		if d.Code != "TooManyRequests" {
			t.Errorf("detail code %q, want TooManyRequests", d.Code)
		}
		ct.targets = append(ct.targets, d.Target)
		var g operationGroup
		if err := json.Unmarshal([]byte(d.Message), &g); err != nil {
			t.Fatalf("detail message %q is not an operation group: %v", d.Message, err)
		}
		ct.groups = append(ct.groups, g)
	}
	return ct
}

// want fails the test unless the 429 names policy first, with Retry-After
// secs and its header at 0.
func (ct computeThrottle) want(t *testing.T, policy string, secs int) {
	t.Helper()
	if ct.code != "OperationNotAllowed" || ct.internal != "TooManyRequestsReceived" {
		t.Errorf("429 code %q, internal %q; want OperationNotAllowed, TooManyRequestsReceived", ct.code, ct.internal)
	}
	if len(ct.targets) == 0 || ct.targets[0] != policy || ct.groups[0].OperationGroup != policy {
		t.Errorf("429 targets %v, groups %+v; want %s first", ct.targets, ct.groups, policy)
	}
	if ct.retryAfter != strconv.Itoa(secs) {
		t.Errorf("Retry-After %q, want %d", ct.retryAfter, secs)
	}
	if !slices.Contains(ct.remaining, computePrefix+policy+";0") {
		t.Errorf("x-ms-ratelimit-remaining-resource %q, want %s;0 among them", ct.remaining, policy)
	}
}

func setSpec(name string, capacity int) ScaleSetSpec {
	return ScaleSetSpec{ResourceGroup: testRG, Name: name, SKU: "Standard_D16s_v5", Capacity: capacity}
}

func setID(name string) string {
	return "/subscriptions/" + testSub + "/resourceGroups/" + testRG + "/providers/Microsoft.Compute/virtualMachineScaleSets/" + name
}

// patch sends a PATCH of the scale set's capacity and returns the answer
// (nil with an error).
func (e *testEnv) patch(ctx context.Context, name string, capacity int64) (*http.Response, error) {
	var raw *http.Response
	_, err := e.scaleTo(policy.WithCaptureResponse(ctx, &raw), name, capacity, nil)
	if err != nil {
		return nil, err
	}
	return raw, nil
}

// TestUpdateBucketPerScaleSet: a scale set's Update bucket holds 12 and
// refills 4 a minute; another scale set has its own.
func TestUpdateBucketPerScaleSet(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, Options{}, setSpec("a", 0), setSpec("b", 0))
	for i := range 12 {
		raw, err := env.patch(ctx, "a", 1)
		if err != nil {
			t.Fatalf("PATCH %d of a: %v", i+1, err)
		}
		h := raw.Header.Values(headerRemainingResource)
		want := []string{computePrefix + PolicyUpdateVMScaleSetResource + ";" + strconv.Itoa(11-i),
			computePrefix + PolicyUpdateVMScaleSetSubscription + ";" + strconv.Itoa(1499-i)}
		if i == 0 { // the first adds a VM: charged to the batched policy
			want = append(want, computePrefix+PolicyVMScaleSetBatchedVMRequests+";5999")
		}
		if !slices.Equal(h, want) {
			t.Fatalf("PATCH %d: x-ms-ratelimit-remaining-resource %q, want %q", i+1, h, want)
		}
	}
	_, err := env.patch(ctx, "a", 1)
	ct := computeThrottleOf(t, err)
	ct.want(t, PolicyUpdateVMScaleSetResource, 15)
	if len(ct.targets) != 1 {
		t.Errorf("targets %v, want only the resource's bucket", ct.targets)
	}
	if g := ct.groups[0]; g.AllowedRequestCount != 12 || g.MeasuredRequestCount != 13 {
		t.Errorf("operation group %+v, want 12 allowed, 13 measured", g)
	}
	if _, err := env.patch(ctx, "b", 1); err != nil {
		t.Fatalf("PATCH of b while a's bucket is empty: %v", err)
	}
	env.clock.Step(14 * time.Second)
	_, err = env.patch(ctx, "a", 1)
	computeThrottleOf(t, err).want(t, PolicyUpdateVMScaleSetResource, 1)
	env.clock.Step(time.Second)
	raw, err := env.patch(ctx, "a", 1)
	if err != nil {
		t.Fatalf("PATCH of a after 15 s: %v", err)
	}
	if h := raw.Header.Values(headerRemainingResource); h[0] != computePrefix+PolicyUpdateVMScaleSetResource+";0" {
		t.Errorf("after the refilled token: %q, want the resource's bucket at 0", h)
	}
	_, err = env.patch(ctx, "a", 1)
	computeThrottleOf(t, err).want(t, PolicyUpdateVMScaleSetResource, 15)
	if got := env.srv.Throttled(); got[PolicyUpdateVMScaleSetResource] != 3 || len(got) != 1 {
		t.Errorf("Throttled() = %v, want 3 of %s", got, PolicyUpdateVMScaleSetResource)
	}
	if got := env.srv.Charged(); got[PolicyUpdateVMScaleSetResource] != 14 || got[PolicyUpdateVMScaleSetSubscription] != 14 || got["arm/writes"] != 17 {
		t.Errorf("Charged() = %v, want 14 updates charged, 17 ARM writes", got)
	}
	if c := env.srv.Calls(); c[OpThrottled] != 3 || c[OpUpdateScaleSet] != 14 {
		t.Errorf("Calls() = %v", c)
	}
	if st := env.state(t, "a"); st.Capacity != 1 {
		t.Errorf("capacity of a %d, want 1", st.Capacity)
	}
}

// TestSubscriptionBucketAcrossSets: the subscription's bucket binds
// across scale sets, and a refused request consumes nothing.
func TestSubscriptionBucketAcrossSets(t *testing.T) {
	ctx := context.Background()
	tight := Policy{Name: PolicyUpdateVMScaleSetSubscription, Ops: []string{OpUpdateScaleSet}, Rate: Rate{Capacity: 5, Refill: 1, Period: time.Minute}}
	env := newTestEnv(t, Options{Throttling: Throttling{Compute: WithPolicy(ComputePolicies(), tight)}},
		setSpec("a", 0), setSpec("b", 0), setSpec("c", 0))
	for i, name := range []string{"a", "a", "b", "b", "c"} {
		if _, err := env.patch(ctx, name, 0); err != nil {
			t.Fatalf("PATCH %d (%s): %v", i+1, name, err)
		}
	}
	for _, name := range []string{"c", "a"} {
		_, err := env.patch(ctx, name, 0)
		ct := computeThrottleOf(t, err)
		ct.want(t, PolicyUpdateVMScaleSetSubscription, 60)
		// Nothing consumed: c's (a's) own bucket still has 11 (10).
		left := map[string]string{"c": "11", "a": "10"}[name]
		if want := computePrefix + PolicyUpdateVMScaleSetResource + ";" + left; !slices.Contains(ct.remaining, want) {
			t.Errorf("429 for %s: x-ms-ratelimit-remaining-resource %q, want %s", name, ct.remaining, want)
		}
	}
	env.clock.Step(time.Minute)
	raw, err := env.patch(ctx, "c", 0)
	if err != nil {
		t.Fatalf("PATCH of c after a minute: %v", err)
	}
	// c's own bucket refilled to 12 meanwhile; the subscription's has 1.
	if want := []string{computePrefix + PolicyUpdateVMScaleSetResource + ";11", computePrefix + PolicyUpdateVMScaleSetSubscription + ";0"}; !slices.Equal(raw.Header.Values(headerRemainingResource), want) {
		t.Errorf("headers %q, want %q", raw.Header.Values(headerRemainingResource), want)
	}
	if got := env.srv.Throttled()[PolicyUpdateVMScaleSetSubscription]; got != 2 {
		t.Errorf("Throttled()[%s] = %d, want 2", PolicyUpdateVMScaleSetSubscription, got)
	}
}

// TestBatchedVMCharge: VMScaleSetBatchedVMRequests is charged per VM a
// capacity increase adds or a deletion names, with x-ms-request-charge.
func TestBatchedVMCharge(t *testing.T) {
	ctx := context.Background()
	batched := computePrefix + PolicyVMScaleSetBatchedVMRequests + ";"
	tests := []struct {
		name string
		// capacity the PATCH asks for (from 4), or, when -1, the
		// instances deleted.
		capacity int64
		delete   []string
		policy   *Policy
		// wantLeft is the batched policy's header ("" for none),
		// wantCharge x-ms-request-charge; wantRetry a 429's Retry-After.
		wantLeft, wantCharge string
		wantRetry            int
	}{
		{name: "scale-out by 10", capacity: 14, wantLeft: "5990", wantCharge: "10"},
		{name: "scale-in not charged", capacity: 2, wantCharge: "1"},
		{name: "delete 3 instances", capacity: -1, delete: []string{"0", "1", "3"}, wantLeft: "5997", wantCharge: "3"},
		{name: "scale-out beyond a tight bucket", capacity: 29, wantRetry: 5,
			// 10 tokens, 1 a second, 5 left: 20 VMs wait for a full
			// bucket, 5 s.
			policy: &Policy{Name: PolicyVMScaleSetBatchedVMRequests, Ops: []string{OpUpdateScaleSet, OpDeleteInstances}, PerVM: true,
				Rate: Rate{Capacity: 10, Refill: 60, Period: time.Minute}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts Options
			if tt.policy != nil {
				opts.Throttling.Compute = WithPolicy(ComputePolicies(), *tt.policy)
			}
			env := newTestEnv(t, opts, setSpec("pool", 4))
			if tt.policy != nil {
				// Use 5 of the 10 tokens first.
				if _, err := env.patch(ctx, "pool", 9); err != nil {
					t.Fatal(err)
				}
			}
			var raw *http.Response
			var err error
			if tt.capacity >= 0 {
				raw, err = env.patch(ctx, "pool", tt.capacity)
			} else {
				_, err = env.sets.BeginDeleteInstances(policy.WithCaptureResponse(ctx, &raw), testRG, "pool",
					armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: to.SliceOfPtrs(tt.delete...)}, nil)
			}
			if tt.wantRetry > 0 {
				computeThrottleOf(t, err).want(t, PolicyVMScaleSetBatchedVMRequests, tt.wantRetry)
				if st := env.state(t, "pool"); st.Capacity != 9 {
					t.Fatalf("capacity %d after the throttled scale-out, want 9", st.Capacity)
				}
				env.clock.Step(time.Duration(tt.wantRetry) * time.Second)
				if _, err := env.patch(ctx, "pool", tt.capacity); err != nil {
					t.Fatalf("after Retry-After: %v", err)
				}
				if got := env.srv.Charged()[PolicyVMScaleSetBatchedVMRequests]; got != 5+20 {
					t.Fatalf("Charged()[batched] = %d, want 25", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, h := range raw.Header.Values(headerRemainingResource) {
				if v, ok := strings.CutPrefix(h, batched); ok {
					got = v
				}
			}
			if got != tt.wantLeft || raw.Header.Get(headerRequestCharge) != tt.wantCharge {
				t.Fatalf("batched remaining %q, x-ms-request-charge %q; want %q, %q (headers %q)", got, raw.Header.Get(headerRequestCharge),
					tt.wantLeft, tt.wantCharge, raw.Header.Values(headerRemainingResource))
			}
			wantCharged := 0
			if tt.wantLeft != "" {
				n, _ := strconv.Atoi(tt.wantLeft)
				wantCharged = 6000 - n
			}
			if c := env.srv.Charged()[PolicyVMScaleSetBatchedVMRequests]; c != wantCharged {
				t.Fatalf("Charged()[batched] = %d, want %d", c, wantCharged)
			}
		})
	}
}

// TestVMListWindows: the VM lists' fixed windows of the subscription,
// with Retry-After to the window's end.
func TestVMListWindows(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name          string
		perRound      int
		rounds        int
		step          time.Duration
		policy        string
		wantRetry     int
		wantRemaining string // the other window's header on the 429
	}{
		{"3 minutes", 190, 1, 0, PolicyHighCostGetVMScaleSet3Min, 180, "HighCostGetVMScaleSet30Min;710"},
		// 5 rounds of 180 lists 3 minutes apart: 900 by 12 minutes; the
		// 901st, at 15 minutes, waits for the 30-minute window's end.
		{"30 minutes", 180, 5, 3 * time.Minute, PolicyHighCostGetVMScaleSet30Min, 15 * 60, "HighCostGetVMScaleSet3Min;190"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{}, setSpec("a", 1), setSpec("b", 1))
			list := func(name string) (*http.Response, error) {
				var raw *http.Response
				_, err := env.vms.NewListPager(testRG, name, &armcompute.VirtualMachineScaleSetVMsClientListOptions{Expand: to.Ptr("instanceView")}).
					NextPage(policy.WithCaptureResponse(ctx, &raw))
				return raw, err
			}
			for r := range tt.rounds {
				for i := range tt.perRound {
					if _, err := list([]string{"a", "b"}[i%2]); err != nil {
						t.Fatalf("round %d, list %d: %v", r, i, err)
					}
				}
				env.clock.Step(tt.step)
			}
			_, err := list("b")
			ct := computeThrottleOf(t, err)
			ct.want(t, tt.policy, tt.wantRetry)
			if !slices.Contains(ct.remaining, computePrefix+tt.wantRemaining) {
				t.Errorf("429 headers %q, want %s among them", ct.remaining, tt.wantRemaining)
			}
			if g := ct.groups[0]; g.EndTime != env.clock.Now().Add(time.Duration(tt.wantRetry)*time.Second).UTC().Format(time.RFC3339) {
				t.Errorf("operation group %+v, want it to end at the window's end", g)
			}
			env.clock.Step(time.Duration(tt.wantRetry-1) * time.Second)
			_, err = list("a")
			computeThrottleOf(t, err).want(t, tt.policy, 1)
			env.clock.Step(time.Second)
			raw, err := list("a")
			if err != nil {
				t.Fatalf("list at the window's end: %v", err)
			}
			if h := raw.Header.Values(headerRemainingResource); !slices.Contains(h, computePrefix+tt.policy+";"+strconv.Itoa(map[string]int{
				PolicyHighCostGetVMScaleSet3Min: 189, PolicyHighCostGetVMScaleSet30Min: 899}[tt.policy])) {
				t.Errorf("headers %q, want a new window of %s", h, tt.policy)
			}
			total := tt.perRound*tt.rounds + 1
			if got := env.srv.Charged()[PolicyHighCostGetVMScaleSet30Min]; got != total {
				t.Errorf("VM lists charged to the 30-minute window: %d, want %d", got, total)
			}
			if got := env.srv.Throttled()[tt.policy]; got != 2 {
				t.Errorf("Throttled()[%s] = %d, want 2", tt.policy, got)
			}
		})
	}
}

// TestARMBuckets: ARM's read bucket per principal, and the global one
// across principals (here 2 times the principal's), checked before the
// Compute policies.
func TestARMBuckets(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, Options{Throttling: Throttling{ARM: ARMLimits{Reads: Rate{Capacity: 3, Refill: 1, Period: 10 * time.Second}, GlobalFactor: 2}}},
		setSpec("pool", 0))
	get := func(c *armcompute.VirtualMachineScaleSetsClient) (*http.Response, error) {
		var raw *http.Response
		_, err := c.Get(policy.WithCaptureResponse(ctx, &raw), testRG, "pool", nil)
		if err != nil {
			return responseError(t, err).RawResponse, err
		}
		return raw, nil
	}
	one, two, three := env.sets, setsClientAs(t, env, "token-two"), setsClientAs(t, env, "token-three")
	for i := range 6 {
		c := []*armcompute.VirtualMachineScaleSetsClient{one, two}[i/3]
		raw, err := get(c)
		if err != nil {
			t.Fatalf("read %d: %v", i+1, err)
		}
		mine, global := raw.Header.Get("x-ms-ratelimit-remaining-subscription-reads"), raw.Header.Get("x-ms-ratelimit-remaining-subscription-global-reads")
		if mine != strconv.Itoa(2-i%3) || global != strconv.Itoa(5-i) {
			t.Fatalf("read %d: remaining reads %q, global %q; want %d, %d", i+1, mine, global, 2-i%3, 5-i)
		}
	}
	armThrottle := func(raw *http.Response, err error, header, actor string, secs int) {
		t.Helper()
		re := responseError(t, err)
		if re.StatusCode != http.StatusTooManyRequests || re.ErrorCode != "TooManyRequests" {
			t.Fatalf("%d %s, want ARM's 429 TooManyRequests", re.StatusCode, re.ErrorCode)
		}
		if raw.Header.Get("Retry-After") != strconv.Itoa(secs) || raw.Header.Get(header) != "0" {
			t.Fatalf("Retry-After %q, %s %q; want %d and 0", raw.Header.Get("Retry-After"), header, raw.Header.Get(header), secs)
		}
		want := "Number of 'read' requests for subscription '" + testSub + "' actor '" + actor + "' exceeded. Please try again after '" +
			strconv.Itoa(secs) + "' seconds after additional tokens are available. Refer to https://aka.ms/arm-throttling"
		if !strings.Contains(re.Error(), want) {
			t.Fatalf("429 %v, want the message %q", re, want)
		}
		if h := raw.Header.Values(headerRemainingResource); len(h) != 0 {
			t.Fatalf("ARM's 429 carries Compute headers %q", h)
		}
	}
	// The first principal's own bucket is empty: 1 token in 10 s (the
	// global one is empty too, for 5 s).
	raw, err := get(one)
	armThrottle(raw, err, "x-ms-ratelimit-remaining-subscription-reads", CallerOf("static-test-token"), 10)
	// A third principal has a full bucket of its own, but the global one
	// is empty: 1 token in 5 s (2 per 10 s).
	raw, err = get(three)
	armThrottle(raw, err, "x-ms-ratelimit-remaining-subscription-global-reads", CallerOf("token-three"), 5)
	if mine := raw.Header.Get("x-ms-ratelimit-remaining-subscription-reads"); mine != "3" {
		t.Errorf("third principal's remaining reads %q, want 3", mine)
	}
	env.clock.Step(5 * time.Second)
	if _, err := get(three); err != nil {
		t.Fatalf("third principal after 5 s: %v", err)
	}
	// Writes have buckets of their own.
	raw, err = env.patch(ctx, "pool", 0)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if raw.Header.Get("x-ms-ratelimit-remaining-subscription-writes") != "199" || raw.Header.Get("x-ms-ratelimit-remaining-subscription-global-writes") != "399" {
		t.Errorf("write headers %v", raw.Header)
	}
	// The first principal's 429 found both buckets empty.
	if got := env.srv.Throttled(); got["arm/reads"] != 1 || got["arm/global-reads"] != 2 || len(got) != 2 {
		t.Errorf("Throttled() = %v, want 1 of arm/reads and 2 of arm/global-reads", got)
	}
	// ARM refused before the resource provider: only admitted reads were
	// charged to the Compute policy.
	if got := env.srv.Charged(); got["arm/reads"] != 7 || got[PolicyLowCostGetVMScaleSetSubscription] != 7 {
		t.Errorf("Charged() = %v, want 7 ARM reads and 7 GETs charged", got)
	}
	env.srv.ResetCalls()
	if len(env.srv.Throttled()) != 0 || len(env.srv.Charged()) != 0 {
		t.Errorf("after ResetCalls: %v, %v", env.srv.Throttled(), env.srv.Charged())
	}
}

// TestRateLimitHeadersOnSuccess: each operation's answer names every
// policy it was charged to, and ARM's remaining counts.
func TestRateLimitHeadersOnSuccess(t *testing.T) {
	ctx := context.Background()
	p := func(name string, left int) string { return computePrefix + name + ";" + strconv.Itoa(left) }
	tests := []struct {
		name string
		call func(t *testing.T, env *testEnv) *http.Response
		kind string
		want []string
	}{
		{"get scale set", func(t *testing.T, env *testEnv) *http.Response {
			var raw *http.Response
			_, err := env.sets.Get(policy.WithCaptureResponse(ctx, &raw), testRG, "pool", nil)
			wantError(t, "Get", err, "")
			return raw
		}, kindRead, []string{p(PolicyLowCostGetVMScaleSetResource, 35), p(PolicyLowCostGetVMScaleSetSubscription, 2399)}},
		{"list scale sets", func(t *testing.T, env *testEnv) *http.Response {
			var raw *http.Response
			_, err := env.sets.NewListPager(testRG, nil).NextPage(policy.WithCaptureResponse(ctx, &raw))
			wantError(t, "List", err, "")
			return raw
		}, kindRead, []string{p(PolicyHighCostGetVMScaleSetSubscription, 1079)}},
		{"list VMs", func(t *testing.T, env *testEnv) *http.Response {
			var raw *http.Response
			_, err := env.vms.NewListPager(testRG, "pool", nil).NextPage(policy.WithCaptureResponse(ctx, &raw))
			wantError(t, "List VMs", err, "")
			return raw
		}, kindRead, highCostHeaders(1)},
		{"get VM", func(t *testing.T, env *testEnv) *http.Response {
			var raw *http.Response
			_, err := env.vms.Get(policy.WithCaptureResponse(ctx, &raw), testRG, "pool", "1", nil)
			wantError(t, "Get VM", err, "")
			return raw
		}, kindRead, []string{p(PolicyGetVMScaleSetVMResource, 35), p(PolicyGetVMScaleSetVMSubscription, 5999)}},
		{"update", func(t *testing.T, env *testEnv) *http.Response {
			raw, err := env.patch(ctx, "pool", 4)
			wantError(t, "Update", err, "")
			return raw
		}, kindWrite, []string{p(PolicyUpdateVMScaleSetResource, 11), p(PolicyUpdateVMScaleSetSubscription, 1499), p(PolicyVMScaleSetBatchedVMRequests, 5998)}},
		{"delete instances", func(t *testing.T, env *testEnv) *http.Response {
			var raw *http.Response
			_, err := env.sets.BeginDeleteInstances(policy.WithCaptureResponse(ctx, &raw), testRG, "pool",
				armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: to.SliceOfPtrs("0")}, nil)
			wantError(t, "DeleteInstances", err, "")
			return raw
		}, kindWrite, []string{p(PolicyDeleteVMScaleSetResource, 11), p(PolicyDeleteVMScaleSetSubscription, 524), p(PolicyVMScaleSetBatchedVMRequests, 5999)}},
		{"poll an operation", func(t *testing.T, env *testEnv) *http.Response {
			poller, err := env.scaleTo(ctx, "pool", 3, nil)
			wantError(t, "Update", err, "")
			var raw *http.Response
			_, err = poller.Poll(policy.WithCaptureResponse(ctx, &raw))
			wantError(t, "Poll", err, "")
			return raw
		}, kindRead, []string{p(PolicyGetOperationResource, 44), p(PolicyGetOperationSubscription, 14999)}},
		{"list SKUs: no Compute policy", func(t *testing.T, env *testEnv) *http.Response {
			var raw *http.Response
			_, err := env.skus.NewListPager(nil).NextPage(policy.WithCaptureResponse(ctx, &raw))
			wantError(t, "List SKUs", err, "")
			return raw
		}, kindRead, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{}, setSpec("pool", 2))
			raw := tt.call(t, env)
			if got := raw.Header.Values(headerRemainingResource); !slices.Equal(got, tt.want) {
				t.Errorf("x-ms-ratelimit-remaining-resource %q, want %q", got, tt.want)
			}
			// The poll's PATCH was a write: the poll is the first read.
			wantARM := map[string][2]string{kindRead: {"249", "3749"}, kindWrite: {"199", "2999"}}[tt.kind]
			if got := [2]string{raw.Header.Get(armHeader(tt.kind, false)), raw.Header.Get(armHeader(tt.kind, true))}; got != wantARM {
				t.Errorf("ARM's remaining %ss %q, want %q", tt.kind, got, wantARM)
			}
		})
	}
}

// TestThrottlePolicy: a policy throttled by hand answers the Compute 429
// with the Retry-After asked for, for one scale set or for all.
func TestThrottlePolicy(t *testing.T) {
	ctx := context.Background()
	for _, disabled := range []bool{false, true} {
		t.Run("disabled="+strconv.FormatBool(disabled), func(t *testing.T) {
			env := newTestEnv(t, Options{Throttling: Throttling{Disabled: disabled}}, setSpec("a", 1), setSpec("b", 1))
			until := env.srv.ThrottlePolicy("Microsoft.Compute/HighCostGetVMScaleSet30Min", "", 20*time.Minute)
			if want := env.clock.Now().Add(20 * time.Minute); !until.Equal(want) {
				t.Errorf("ThrottlePolicy returned %v, want %v", until, want)
			}
			_, err := env.vms.NewListPager(testRG, "a", nil).NextPage(ctx)
			ct := computeThrottleOf(t, err)
			ct.want(t, PolicyHighCostGetVMScaleSet30Min, 1200)
			if _, err := env.sets.Get(ctx, testRG, "a", nil); err != nil {
				t.Fatalf("GET of a scale set while VM lists are throttled: %v", err)
			}
			// One scale set's updates: the other's pass.
			env.srv.ThrottlePolicy(PolicyUpdateVMScaleSetResource, strings.ToUpper(setID("a")), 90*time.Second)
			_, err = env.patch(ctx, "a", 1)
			computeThrottleOf(t, err).want(t, PolicyUpdateVMScaleSetResource, 90)
			if _, err := env.patch(ctx, "b", 1); err != nil {
				t.Fatalf("PATCH of b: %v", err)
			}
			env.clock.Step(90 * time.Second)
			if _, err := env.patch(ctx, "a", 1); err != nil {
				t.Fatalf("PATCH of a after 90 s: %v", err)
			}
			_, err = env.vms.NewListPager(testRG, "b", nil).NextPage(ctx)
			computeThrottleOf(t, err).want(t, PolicyHighCostGetVMScaleSet30Min, 1200-90)
			if got := env.srv.ThrottlePolicy("NoSuchPolicy", "", time.Minute); !got.IsZero() {
				t.Errorf("unknown policy throttled until %v", got)
			}
			if got := env.srv.Throttled(); got[PolicyHighCostGetVMScaleSet30Min] != 2 || got[PolicyUpdateVMScaleSetResource] != 1 {
				t.Errorf("Throttled() = %v", got)
			}
		})
	}
}

// TestThrottlingDisabled: no bucket or window refuses anything, and no
// Compute header is sent.
func TestThrottlingDisabled(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, Options{Throttling: Throttling{Disabled: true}}, setSpec("a", 0))
	for i := range 20 {
		raw, err := env.patch(ctx, "a", int64(i))
		if err != nil {
			t.Fatalf("PATCH %d: %v", i+1, err)
		}
		if h := raw.Header.Values(headerRemainingResource); len(h) != 0 || raw.Header.Get(armHeader(kindWrite, false)) != "200" {
			t.Fatalf("PATCH %d: headers %v", i+1, raw.Header)
		}
	}
	if got := env.srv.Charged()[PolicyUpdateVMScaleSetResource]; got != 20 {
		t.Errorf("Charged()[%s] = %d, want 20 (counted even when disabled)", PolicyUpdateVMScaleSetResource, got)
	}
}

// TestResourceBucketsArePruned: full per-resource buckets are dropped, so
// memory follows the resources charged recently, not all ever charged.
func TestResourceBucketsArePruned(t *testing.T) {
	p := &policyState{Policy: Policy{Name: "P", Scope: ScopeResource, Rate: Rate{Capacity: 2, Refill: 1, Period: time.Minute}},
		lim: limit{Rate: Rate{Capacity: 2, Refill: 1, Period: time.Minute}}, res: map[string]*meter{}}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 1000 {
		p.lim.take(p.meter("old-"+strconv.Itoa(i), now), 1, now)
	}
	now = now.Add(time.Hour)
	for i := range 1000 {
		p.lim.take(p.meter("new-"+strconv.Itoa(i), now), 1, now)
	}
	if len(p.res) > 1200 {
		t.Fatalf("%d buckets kept, want the 1,000 in use and few more", len(p.res))
	}
	if m := p.meter("new-7", now); p.lim.remaining(m) != 1 {
		t.Fatalf("a bucket in use was dropped: %d left", p.lim.remaining(m))
	}
}
