package armsim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// How the simulator throttles, by default as Azure does today.
//
// ARM first (Microsoft, "Request limits and throttling", section
// "Regional throttling and token bucket algorithm", 2024): per
// subscription, per security principal and per operation type, token
// buckets of reads (250 tokens, refilled 25 a second), writes (200, 10 a
// second) and deletes (HTTP DELETE: 200, 10 a second), and a global
// subscription limit of 15 times the principal's across all principals.
// Every answer of a kind carries x-ms-ratelimit-remaining-subscription-
// reads / -writes / -deletes (the principal's bucket) and
// x-ms-ratelimit-remaining-subscription-global-reads / -global-writes /
// -global-deletes. ARM checks its buckets before the resource provider
// sees the request; its 429 has a Retry-After, the empty bucket's header
// at 0 and the body code TooManyRequests. The principal is CallerOf the
// bearer token.
//
// Then the Compute resource provider (Microsoft, "Compute throttling
// limits", learn.microsoft.com/azure/virtual-machines/compute-throttling-
// limits, ms.date 2024-05-27): its policies are token buckets, per
// region, at two levels at once, per resource and per subscription; each
// request consumes a token; buckets refill continuously at the "Bucket
// refill rate (per min)" up to the "Maximum bucket capacity". A request
// is admitted only if every bucket it is charged to has the tokens;
// otherwise nothing is consumed and it is answered 429. Every Compute
// answer (success or error, 429 included) carries one
// x-ms-ratelimit-remaining-resource header line per policy it was charged
// to: "Microsoft.Compute/<policy>;<whole tokens left>". Microsoft
// publishes no names for the token-bucket policies: the simulator's
// "<Category>Resource" (the resource's bucket) and
// "<Category>Subscription" (the subscription's) are assumed names.
//
// The Compute 429 is Microsoft's ("Troubleshooting API throttling
// errors", section "Throttling error details"): Retry-After in whole
// seconds, the empty policy's header at 0, and a body of code
// OperationNotAllowed whose details[] name the policy (target,
// operationGroup). Two more kinds of policy come from the same pages:
// the windowed HighCostGetVMScaleSet3Min and HighCostGetVMScaleSet30Min
// of the VM lists, and the batched VMScaleSetBatchedVMRequests charged
// per VM (see ComputePolicies).

// Scope is which bucket of a Compute policy a request draws from.
type Scope int

const (
	// ScopeSubscription is one bucket for the subscription (in the
	// region), shared by every resource.
	ScopeSubscription Scope = iota
	// ScopeResource is one bucket per resource: the scale set a request
	// is about (a poll: the operation's scale set), or the VM for a
	// scale-set VM's GET.
	ScopeResource
)

func (s Scope) String() string {
	switch s {
	case ScopeSubscription:
		return "subscription"
	case ScopeResource:
		return "resource"
	}
	return "Scope(" + strconv.Itoa(int(s)) + ")"
}

// Rate is a token bucket holding at most Capacity tokens and refilled
// continuously with Refill tokens every Period. For a Policy with
// FixedWindow it is a fixed window instead: Capacity requests per Period,
// Refill unused.
type Rate struct {
	Capacity int
	Refill   int
	Period   time.Duration
}

func (r Rate) validate(fixed bool) error {
	if r.Capacity <= 0 || r.Period <= 0 || (!fixed && r.Refill <= 0) {
		if fixed {
			return fmt.Errorf("a fixed window needs a positive capacity and period, got %d per %v", r.Capacity, r.Period)
		}
		return fmt.Errorf("a token bucket needs a positive capacity, refill and period, got %d tokens, %d per %v", r.Capacity, r.Refill, r.Period)
	}
	return nil
}

// Policy is a Compute resource provider throttling policy.
type Policy struct {
	// Name is the policy's name in x-ms-ratelimit-remaining-resource
	// (after "Microsoft.Compute/") and in 429 bodies.
	Name  string
	Scope Scope
	// Ops are the operations charged to it (OpGetScaleSet, ...). The
	// Virtual Machines list (OpListVirtualMachines) is charged only when
	// it lists one scale set's VMs with their instance view.
	Ops []string
	Rate
	// FixedWindow makes Rate a fixed window: the count resets when the
	// window (started by the first request charged after the last one
	// ended) ends, and a 429's Retry-After is the time to that end.
	FixedWindow bool
	// PerVM charges a request one token per VM it adds (UpdateScaleSet
	// raising sku.capacity) or names (DeleteInstances' instance IDs); a
	// request that adds or names none is not charged to it. A request
	// charged more than Capacity waits for a full bucket and empties it.
	PerVM bool
}

// Compute policy names. The "…Resource" and "…Subscription" names of the
// token-bucket policies are the simulator's (Microsoft publishes none);
// the windowed and batched ones are Microsoft's.
const (
	PolicyUpdateVMScaleSetResource           = "UpdateVMScaleSetResource"
	PolicyUpdateVMScaleSetSubscription       = "UpdateVMScaleSetSubscription"
	PolicyDeleteVMScaleSetResource           = "DeleteVMScaleSetResource"
	PolicyDeleteVMScaleSetSubscription       = "DeleteVMScaleSetSubscription"
	PolicyLowCostGetVMScaleSetResource       = "LowCostGetVMScaleSetResource"
	PolicyLowCostGetVMScaleSetSubscription   = "LowCostGetVMScaleSetSubscription"
	PolicyHighCostGetVMScaleSetSubscription  = "HighCostGetVMScaleSetSubscription"
	PolicyGetVMScaleSetVMResource            = "GetVMScaleSetVMResource"
	PolicyGetVMScaleSetVMSubscription        = "GetVMScaleSetVMSubscription"
	PolicyGetOperationResource               = "GetOperationResource"
	PolicyGetOperationSubscription           = "GetOperationSubscription"
	PolicyHighCostGetVMScaleSet3Min          = "HighCostGetVMScaleSet3Min"
	PolicyHighCostGetVMScaleSet30Min         = "HighCostGetVMScaleSet30Min"
	PolicyVMScaleSetBatchedVMRequests        = "VMScaleSetBatchedVMRequests"
	computePrefix                            = "Microsoft.Compute/"
	headerRemainingResource                  = "x-ms-ratelimit-remaining-resource"
	headerRequestCharge                      = "x-ms-request-charge"
	armThrottleMessage                       = "Number of '%s' requests for subscription '%s' actor '%s' exceeded. Please try again after '%d' seconds after additional tokens are available. Refer to https://aka.ms/arm-throttling"
	computeThrottleMessage                   = "The server rejected the request because too many requests have been received for this subscription."
	defaultGlobalFactor                      = 15
	armCounterPrefix, armGlobalCounterPrefix = "arm/", "arm/global-"
)

// ComputePolicies returns the Compute resource provider's policies as
// Microsoft publishes them, the simulator's default.
//
// From "Compute throttling limits" (ms.date 2024-05-27), the Virtual
// Machine Scale Sets table (resource refill/capacity, subscription
// refill/capacity, per minute): Update (PATCH of a scale set, capacity
// included) 4/12, 500/1,500; Delete (delete, power off, deallocate) 4/12,
// 175/525 — charged here by the scale set's POST delete of instances, an
// assumed category; Low Cost Get (GET of one scale set) 12/36, 800/2,400;
// High Cost Get (List of the scale sets of a resource group) subscription
// only, 360/1,080. The scale-set VMs table: Get (one VM) 12/36,
// 2,000/6,000; Update VMSS VMs (Restart, Reimage, and here Redeploy: see
// repair.go) 4/12, 500/1,500. The Virtual Machines table: Get Operation (status of an
// asynchronous operation) 15/45, 5,000/15,000; Update VM (Restart,
// Reimage, Redeploy of a Flexible set's VM: repair.go) 4/12, 500/1,500.
//
// The VM list of a scale set (the scale-set VMs List, and the Virtual
// Machines List filtered by a Flexible scale set with instance view) is
// charged to the older windowed policies HighCostGetVMScaleSet3Min and
// HighCostGetVMScaleSet30Min (public headers:
// "Microsoft.Compute/HighCostGetVMScaleSet3Min;107,Microsoft.Compute/HighCostGetVMScaleSet30Min;827";
// public examples allow 900 and 1,800 per 30 minutes and 190 per 3
// minutes), modelled as fixed windows of the subscription: 190 per 3
// minutes and 900 per 30 minutes.
//
// VMScaleSetBatchedVMRequests: Microsoft's sample answer of a scale set
// deletion ("Troubleshooting API throttling errors") names it
// (Microsoft.Compute/VMScaleSetBatchedVMRequests;3704) and says
// "x-ms-request-charge: batch requests, such as scaling a scale set, can
// charge multiple counts". Modelled as a subscription token bucket
// charged one token per VM a capacity increase adds or a deletion of
// instances names. Microsoft publishes no numbers: its capacity of 6,000
// and refill of 1,200 a minute are ASSUMED.
//
// The Resource SKUs list is charged to no Compute policy here ("list
// SKUs of a set" in the table is the scale set's own SKUs API, which the
// simulator does not serve).
func ComputePolicies() []Policy {
	perMin := func(capacity, refill int) Rate { return Rate{Capacity: capacity, Refill: refill, Period: time.Minute} }
	return []Policy{
		{Name: PolicyUpdateVMScaleSetResource, Scope: ScopeResource, Ops: []string{OpUpdateScaleSet}, Rate: perMin(12, 4)},
		{Name: PolicyUpdateVMScaleSetSubscription, Ops: []string{OpUpdateScaleSet}, Rate: perMin(1500, 500)},
		{Name: PolicyDeleteVMScaleSetResource, Scope: ScopeResource, Ops: []string{OpDeleteInstances}, Rate: perMin(12, 4)},
		{Name: PolicyDeleteVMScaleSetSubscription, Ops: []string{OpDeleteInstances}, Rate: perMin(525, 175)},
		{Name: PolicyLowCostGetVMScaleSetResource, Scope: ScopeResource, Ops: []string{OpGetScaleSet}, Rate: perMin(36, 12)},
		{Name: PolicyLowCostGetVMScaleSetSubscription, Ops: []string{OpGetScaleSet}, Rate: perMin(2400, 800)},
		{Name: PolicyHighCostGetVMScaleSetSubscription, Ops: []string{OpListScaleSets}, Rate: perMin(1080, 360)},
		{Name: PolicyGetVMScaleSetVMResource, Scope: ScopeResource, Ops: []string{OpGetVM}, Rate: perMin(36, 12)},
		{Name: PolicyGetVMScaleSetVMSubscription, Ops: []string{OpGetVM}, Rate: perMin(6000, 2000)},
		{Name: PolicyUpdateVMScaleSetVMResource, Scope: ScopeResource, Ops: []string{OpRestartVM, OpReimageVM, OpRedeployVM}, Rate: perMin(12, 4)},
		{Name: PolicyUpdateVMScaleSetVMSubscription, Ops: []string{OpRestartVM, OpReimageVM, OpRedeployVM}, Rate: perMin(1500, 500)},
		{Name: PolicyUpdateVMResource, Scope: ScopeResource, Ops: []string{OpRestartVirtualMachine, OpReimageVirtualMachine, OpRedeployVirtualMachine}, Rate: perMin(12, 4)},
		{Name: PolicyUpdateVMSubscription, Ops: []string{OpRestartVirtualMachine, OpReimageVirtualMachine, OpRedeployVirtualMachine}, Rate: perMin(1500, 500)},
		{Name: PolicyGetOperationResource, Scope: ScopeResource, Ops: []string{OpPollOperation}, Rate: perMin(45, 15)},
		{Name: PolicyGetOperationSubscription, Ops: []string{OpPollOperation}, Rate: perMin(15000, 5000)},
		{Name: PolicyHighCostGetVMScaleSet3Min, Ops: []string{OpListVMs, OpListVirtualMachines}, FixedWindow: true,
			Rate: Rate{Capacity: 190, Period: 3 * time.Minute}},
		{Name: PolicyHighCostGetVMScaleSet30Min, Ops: []string{OpListVMs, OpListVirtualMachines}, FixedWindow: true,
			Rate: Rate{Capacity: 900, Period: 30 * time.Minute}},
		{Name: PolicyVMScaleSetBatchedVMRequests, Ops: []string{OpUpdateScaleSet, OpDeleteInstances}, PerVM: true,
			Rate: perMin(6000, 1200)},
	}
}

// WithPolicy returns policies with p in place of the policy of its name
// (case-insensitive), or with p appended when there is none: a test's
// tight custom policy, say.
func WithPolicy(policies []Policy, p Policy) []Policy {
	out := slices.Clone(policies)
	for i := range out {
		if strings.EqualFold(out[i].Name, p.Name) {
			out[i] = p
			return out
		}
	}
	return append(out, p)
}

// ComputePolicy returns the default policy of the name (case-insensitive,
// with or without "Microsoft.Compute/"), to tighten in a test.
func ComputePolicy(name string) (Policy, bool) {
	name = policyName(name)
	for _, p := range ComputePolicies() {
		if strings.EqualFold(p.Name, name) {
			return p, true
		}
	}
	return Policy{}, false
}

// ARMLimits are ARM's own per-principal buckets per operation type, and
// its global subscription limit across principals (GlobalFactor times
// the principal's capacity and refill). A zero Rate or factor takes the
// default (DefaultARMLimits).
type ARMLimits struct {
	Reads, Writes, Deletes Rate
	GlobalFactor           int
}

// DefaultARMLimits are ARM's limits as Microsoft documents them ("Request
// limits and throttling", "Regional throttling and token bucket
// algorithm"): reads 250 tokens refilled 25 a second, writes and deletes
// 200 refilled 10 a second, per principal; global 15 times that.
func DefaultARMLimits() ARMLimits {
	perSec := func(capacity, refill int) Rate { return Rate{Capacity: capacity, Refill: refill, Period: time.Second} }
	return ARMLimits{Reads: perSec(250, 25), Writes: perSec(200, 10), Deletes: perSec(200, 10), GlobalFactor: defaultGlobalFactor}
}

func (l ARMLimits) withDefaults() ARMLimits {
	d := DefaultARMLimits()
	for _, r := range []struct{ got, def *Rate }{{&l.Reads, &d.Reads}, {&l.Writes, &d.Writes}, {&l.Deletes, &d.Deletes}} {
		if *r.got == (Rate{}) {
			*r.got = *r.def
		}
	}
	if l.GlobalFactor == 0 {
		l.GlobalFactor = d.GlobalFactor
	}
	return l
}

func (l ARMLimits) rate(kind string) Rate {
	switch kind {
	case kindRead:
		return l.Reads
	case kindDelete:
		return l.Deletes
	}
	return l.Writes
}

// Throttling configures the simulator's throttling, on by default.
type Throttling struct {
	// Disabled turns off every bucket and window (for tests whose
	// subject is elsewhere). Throttle, ThrottleCaller and ThrottlePolicy
	// still apply; answers still carry ARM's remaining counts (always
	// full) but no x-ms-ratelimit-remaining-resource.
	Disabled bool
	// Compute are the Compute resource provider's policies; nil means
	// ComputePolicies(), an empty slice none.
	Compute []Policy
	// ARM are ARM's own limits; zero fields take DefaultARMLimits'.
	ARM ARMLimits
}

// withDefaults fills in the defaults and validates.
func (t Throttling) withDefaults() (Throttling, error) {
	if t.Compute == nil {
		t.Compute = ComputePolicies()
	} else {
		t.Compute = slices.Clone(t.Compute)
	}
	seen := map[string]bool{}
	for i := range t.Compute {
		if err := settlePolicy(i, &t.Compute[i], seen); err != nil {
			return t, err
		}
	}
	t.ARM = t.ARM.withDefaults()
	if err := t.ARM.validate(); err != nil {
		return t, err
	}
	return t, nil
}

// settlePolicy normalizes the i-th Compute policy (its name without
// "Microsoft.Compute/", its own Ops) and validates it; seen holds the
// lower-case names of the policies before it.
func settlePolicy(i int, p *Policy, seen map[string]bool) error {
	p.Name = policyName(p.Name)
	p.Ops = slices.Clone(p.Ops)
	if err := checkPolicyShape(i, p, seen); err != nil {
		return err
	}
	seen[strings.ToLower(p.Name)] = true
	for _, op := range p.Ops {
		if !servedOp(op) {
			return fmt.Errorf("throttling policy %s: unknown operation %q", p.Name, op)
		}
	}
	if err := p.validate(p.FixedWindow); err != nil {
		return fmt.Errorf("throttling policy %s: %w", p.Name, err)
	}
	return nil
}

// checkPolicyShape checks a normalized policy's name (well-formed, not
// seen before), scope, operations and how it is charged.
func checkPolicyShape(i int, p *Policy, seen map[string]bool) error {
	switch {
	case p.Name == "" || strings.ContainsAny(p.Name, ";,/ "):
		return fmt.Errorf("throttling policy %d: name %q must be non-empty, without ';', ',', '/' or spaces", i, p.Name)
	case seen[strings.ToLower(p.Name)]:
		return fmt.Errorf("throttling policy %s listed twice", p.Name)
	case p.Scope != ScopeSubscription && p.Scope != ScopeResource:
		return fmt.Errorf("throttling policy %s: unknown scope %v", p.Name, p.Scope)
	case len(p.Ops) == 0:
		return fmt.Errorf("throttling policy %s charges no operation", p.Name)
	case p.FixedWindow && p.PerVM:
		return fmt.Errorf("throttling policy %s: a fixed window cannot be charged per VM", p.Name)
	}
	return nil
}

// servedOp says whether the simulator serves op, for policies to charge.
func servedOp(op string) bool {
	switch op {
	case OpListScaleSets, OpGetScaleSet, OpUpdateScaleSet, OpDeleteInstances,
		OpListVMs, OpGetVM, OpListSKUs, OpPollOperation, OpListVirtualMachines,
		OpRestartVM, OpReimageVM, OpRedeployVM, OpRestartVirtualMachine, OpReimageVirtualMachine, OpRedeployVirtualMachine:
		return true
	}
	return false
}

// validate checks ARM's limits, defaults filled in.
func (l ARMLimits) validate() error {
	if l.GlobalFactor < 1 {
		return fmt.Errorf("ARM global factor must be at least 1, got %d", l.GlobalFactor)
	}
	for kind, r := range map[string]Rate{kindRead: l.Reads, kindWrite: l.Writes, kindDelete: l.Deletes} {
		if err := r.validate(false); err != nil {
			return fmt.Errorf("ARM %ss: %w", kind, err)
		}
	}
	return nil
}

// policyName strips "Microsoft.Compute/" (any case) from a policy name.
func policyName(name string) string {
	name = strings.TrimSpace(name)
	if len(name) >= len(computePrefix) && strings.EqualFold(name[:len(computePrefix)], computePrefix) {
		name = name[len(computePrefix):]
	}
	return name
}

// Request kinds ARM counts separately ("Request limits and throttling":
// reads are GET and HEAD, deletes HTTP DELETE, writes the rest).
const (
	kindRead   = "read"
	kindWrite  = "write"
	kindDelete = "delete"
)

func kindOf(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return kindRead
	case http.MethodDelete:
		return kindDelete
	}
	return kindWrite
}

func knownKind(kind string) bool { return kind == kindRead || kind == kindWrite || kind == kindDelete }

// meter is one token bucket or fixed window; its limit says which.
// Buckets start full and refill lazily, when a request looks at them.
// A bucket counts in units of 1/Period of a token (one token is Period
// units, a nanosecond of refill is Refill units), so refills add up
// exactly: 15 s of a 4-a-minute bucket is one token, not 0.999….
type meter struct {
	// units: a bucket's tokens in units, or the requests counted in a
	// window.
	units int64
	// last: when a bucket was last refilled, or when a window started
	// (zero: no window under way).
	last time.Time
}

// limit is a Rate as a bucket or, fixed, a window.
type limit struct {
	Rate
	fixed bool
}

// unit is a token in units: Period for a bucket, 1 for a window.
func (l limit) unit() int64 {
	if l.fixed {
		return 1
	}
	return int64(l.Period)
}

func (l limit) newMeter(now time.Time) *meter {
	if l.fixed {
		return &meter{}
	}
	return &meter{units: int64(l.Capacity) * l.unit(), last: now}
}

// settle brings m to now: refills a bucket, ends a window that is over.
func (l limit) settle(m *meter, now time.Time) {
	if l.fixed {
		if !m.last.IsZero() && !now.Before(m.last.Add(l.Period)) {
			m.units, m.last = 0, time.Time{}
		}
		return
	}
	if dt := int64(now.Sub(m.last)); dt > 0 {
		room := int64(l.Capacity)*l.unit() - m.units
		if dt >= room/int64(l.Refill)+1 { // full (and no overflow)
			m.units += room
		} else {
			m.units = min(m.units+int64(l.Refill)*dt, int64(l.Capacity)*l.unit())
		}
		m.last = now
	}
}

// remaining is the whole tokens (or window requests) m (settled) has
// left, as headers report them.
func (l limit) remaining(m *meter) int {
	if l.fixed {
		return max(0, l.Capacity-int(m.units))
	}
	return int(m.units / l.unit())
}

// need is what a charge of n must find left: n, or a full bucket when n is
// more than it holds.
func (l limit) need(n int) int { return min(n, l.Capacity) }

// has says m (settled) has need left.
func (l limit) has(m *meter, need int) bool {
	if l.fixed {
		return int(m.units)+need <= l.Capacity
	}
	return m.units >= int64(need)*l.unit()
}

func (l limit) full(m *meter) bool { return l.has(m, l.Capacity) }

// wait is how long until m (settled) has need left.
func (l limit) wait(m *meter, need int, now time.Time) time.Duration {
	if l.fixed {
		if m.last.IsZero() {
			return 0
		}
		return m.last.Add(l.Period).Sub(now)
	}
	short := int64(need)*l.unit() - m.units
	return time.Duration((short + int64(l.Refill) - 1) / int64(l.Refill))
}

// take charges n to m (settled).
func (l limit) take(m *meter, n int, now time.Time) {
	if l.fixed {
		if m.last.IsZero() {
			m.last = now
		}
		m.units += int64(n)
		return
	}
	m.units = max(0, m.units-int64(l.need(n))*l.unit())
}

// span is a manual throttle (Throttle, ThrottleCaller, ThrottlePolicy).
type span struct{ from, until time.Time }

// policyState is a Compute policy's buckets.
type policyState struct {
	Policy
	lim limit
	sub *meter
	// res are the resources' buckets by lower-case resource ID. A full
	// bucket is as good as none, so full ones are dropped now and then:
	// memory stays in proportion to the resources recently charged.
	res   map[string]*meter
	swept int
}

func (p *policyState) meter(about string, now time.Time) *meter {
	if p.Scope == ScopeSubscription {
		if p.sub == nil {
			p.sub = p.lim.newMeter(now)
		}
		return p.sub
	}
	m, ok := p.res[about]
	if !ok {
		if len(p.res) >= 2*p.swept+64 {
			for k, old := range p.res {
				if p.lim.settle(old, now); p.lim.full(old) {
					delete(p.res, k)
				}
			}
			p.swept = len(p.res)
		}
		m = p.lim.newMeter(now)
		p.res[about] = m
	}
	return m
}

// throttler is the server's throttling state. Guarded by Server.mu.
type throttler struct {
	disabled bool
	arm      ARMLimits
	policies []*policyState
	byName   map[string]*policyState // by lower-case name
	byOp     map[string][]*policyState
	// principals are ARM's buckets per caller and kind; global per kind.
	principals map[string]map[string]*meter
	global     map[string]*meter
	// blocked: Throttle's, by kind; blockedFor: ThrottleCaller's, by
	// caller and kind; policyBlocks: ThrottlePolicy's, by lower-case
	// policy name and lower-case resource ID ("": every request).
	blocked      map[string]span
	blockedFor   map[string]map[string]span
	policyBlocks map[string]map[string]span
	// throttled counts 429s by the policy (or "arm/reads" …) that was
	// empty; charged counts what was charged to each.
	throttled, charged map[string]int
}

func newThrottler(t Throttling) *throttler {
	th := &throttler{disabled: t.Disabled, arm: t.ARM, byName: map[string]*policyState{}, byOp: map[string][]*policyState{},
		principals: map[string]map[string]*meter{}, global: map[string]*meter{},
		blocked: map[string]span{}, blockedFor: map[string]map[string]span{}, policyBlocks: map[string]map[string]span{},
		throttled: map[string]int{}, charged: map[string]int{}}
	for _, p := range t.Compute {
		ps := &policyState{Policy: p, lim: limit{Rate: p.Rate, fixed: p.FixedWindow}, res: map[string]*meter{}}
		th.policies = append(th.policies, ps)
		th.byName[strings.ToLower(p.Name)] = ps
		for _, op := range p.Ops {
			th.byOp[op] = append(th.byOp[op], ps)
		}
	}
	return th
}

func (th *throttler) armLimit(kind string, global bool) limit {
	r := th.arm.rate(kind)
	if global {
		r.Capacity *= th.arm.GlobalFactor
		r.Refill *= th.arm.GlobalFactor
	}
	return limit{Rate: r}
}

// armMeter is the caller's (or, with global, the subscription's) ARM
// bucket of the kind; nil when it does not exist and create is false.
func (th *throttler) armMeter(kind, caller string, global, create bool, now time.Time) *meter {
	if global {
		m := th.global[kind]
		if m == nil && create {
			m = th.armLimit(kind, true).newMeter(now)
			th.global[kind] = m
		}
		return m
	}
	m := th.principals[caller][kind]
	if m == nil && create {
		if th.principals[caller] == nil {
			th.principals[caller] = map[string]*meter{}
		}
		m = th.armLimit(kind, false).newMeter(now)
		th.principals[caller][kind] = m
	}
	return m
}

// armRemaining is what the caller's (or the global) bucket has left.
func (th *throttler) armRemaining(kind, caller string, global bool, now time.Time) int {
	l := th.armLimit(kind, global)
	m := th.armMeter(kind, caller, global, false, now)
	if m == nil || th.disabled {
		return l.Capacity
	}
	l.settle(m, now)
	return l.remaining(m)
}

func armHeader(kind string, global bool) string {
	if global {
		return "x-ms-ratelimit-remaining-subscription-global-" + kind + "s"
	}
	return "x-ms-ratelimit-remaining-subscription-" + kind + "s"
}

// admitARM charges a request to ARM's buckets of its kind, the caller's
// and the global one, or answers ARM's 429 when either is empty or the
// kind is throttled (Throttle, ThrottleCaller). Callers hold s.mu.
func (s *Server) admitARM(kind, caller string, now time.Time) (response, bool) {
	th := s.thr
	empties := th.armBlocked(kind, caller, now)
	if len(empties) == 0 && !th.disabled {
		empties = th.armShort(kind, caller, now)
	}
	if len(empties) > 0 {
		return s.armThrottled(kind, caller, empties), true
	}
	if !th.disabled {
		for _, global := range []bool{false, true} {
			th.armLimit(kind, global).take(th.armMeter(kind, caller, global, true, now), 1, now)
		}
	}
	th.charged[armCounterPrefix+kind+"s"]++
	return response{}, false
}

// armEmpty is one of ARM's buckets, the caller's or the global one, that
// refuses a request, and how long until it would not.
type armEmpty struct {
	global bool
	wait   time.Duration
}

// armBlocked are the manual throttles (Throttle, ThrottleCaller) refusing
// the kind now: the global one, then the caller's.
func (th *throttler) armBlocked(kind, caller string, now time.Time) []armEmpty {
	var empties []armEmpty
	if b, ok := th.blocked[kind]; ok && now.Before(b.until) {
		empties = append(empties, armEmpty{true, b.until.Sub(now)})
	}
	if b, ok := th.blockedFor[caller][kind]; ok && now.Before(b.until) {
		empties = append(empties, armEmpty{false, b.until.Sub(now)})
	}
	return empties
}

// armShort are the buckets of the kind, the caller's then the global one,
// without a token now. Buckets are created (full) as needed and refilled.
func (th *throttler) armShort(kind, caller string, now time.Time) []armEmpty {
	var empties []armEmpty
	for _, global := range []bool{false, true} {
		l, m := th.armLimit(kind, global), th.armMeter(kind, caller, global, true, now)
		if l.settle(m, now); !l.has(m, 1) {
			empties = append(empties, armEmpty{global, l.wait(m, 1, now)})
		}
	}
	return empties
}

// armThrottled is ARM's 429 for the empty buckets, counted as throttled.
// Callers hold s.mu.
func (s *Server) armThrottled(kind, caller string, empties []armEmpty) response {
	var wait time.Duration
	resp := response{status: http.StatusTooManyRequests}
	for _, e := range empties {
		wait = max(wait, e.wait)
		resp.set(armHeader(kind, e.global), "0")
		counter := armCounterPrefix + kind + "s"
		if e.global {
			counter = armGlobalCounterPrefix + kind + "s"
		}
		s.thr.throttled[counter]++
	}
	secs := retryAfterSeconds(wait)
	resp.body = envelope("TooManyRequests", fmt.Sprintf(armThrottleMessage, kind, s.opts.SubscriptionID, caller, secs))
	resp.set("Retry-After", strconv.Itoa(secs))
	return resp
}

// armHeaders puts ARM's remaining counts of the kind, the caller's and
// the global, on an answer that has none yet. Callers hold s.mu.
func (s *Server) armHeaders(resp *response, kind, caller string, now time.Time) {
	for _, global := range []bool{false, true} {
		if h := armHeader(kind, global); resp.header.Get(h) == "" {
			resp.set(h, strconv.Itoa(s.thr.armRemaining(kind, caller, global, now)))
		}
	}
}

// charge is a request's charge to one Compute policy: n tokens, about a
// resource (lower-case ID; "" when it names none, or none that exists).
type charge struct {
	p     *policyState
	about string
	n     int
}

// computeCharges lists the Compute policies a request is charged to, in
// the order of the policies. It looks at the server's state but changes
// nothing. Callers hold s.mu.
func (s *Server) computeCharges(r *http.Request, rt route, op string, body []byte) []charge {
	policies := s.thr.byOp[op]
	if len(policies) == 0 {
		return nil
	}
	set, charged := s.chargedSet(r, rt, op)
	if !charged {
		return nil
	}
	about, vms := "", 0
	if set != nil {
		about = s.chargedResource(set, rt, op)
		vms = chargedVMs(set, op, body)
	}
	if op == OpDeleteInstances {
		vms += countInstanceIDs(body)
	}
	charges := make([]charge, 0, len(policies))
	for _, p := range policies {
		c := charge{p: p, about: about, n: 1}
		if p.PerVM {
			c.n = vms
		}
		if c.n == 0 || (p.Scope == ScopeResource && about == "") {
			continue
		}
		charges = append(charges, c)
	}
	return charges
}

// chargedSet is the scale set a request is charged about (nil for none),
// or false when the request is not charged at all: a Virtual Machines list
// without a filter and instance view naming an existing scale set of its
// resource group. Callers hold s.mu.
func (s *Server) chargedSet(r *http.Request, rt route, op string) (*scaleSet, bool) {
	switch op {
	case OpListScaleSets, OpListSKUs:
		return nil, true
	case OpPollOperation:
		if o, ok := s.ops[rt.opID]; ok && o.set != nil {
			return o.set, true
		}
		return nil, true
	case OpRestartVirtualMachine, OpReimageVirtualMachine, OpRedeployVirtualMachine:
		return s.flexSetOfVM(rt.rg, rt.instance), true
	case OpListVirtualMachines:
		set := s.filteredSet(r, rt)
		return set, set != nil
	}
	return s.sets[setKey(rt.rg, rt.name)], true
}

// filteredSet is the scale set a Virtual Machines list with instance view
// is filtered by, if it exists in the subscription and the request's
// resource group. Callers hold s.mu.
func (s *Server) filteredSet(r *http.Request, rt route) *scaleSet {
	q := r.URL.Query()
	if q.Get("$filter") == "" || q.Get("$expand") == "" {
		return nil
	}
	m := scaleSetFilter.FindStringSubmatch(q.Get("$filter"))
	if m == nil {
		return nil
	}
	sub, rg, name, ok := parseScaleSetID(m[1])
	if !ok || !strings.EqualFold(sub, s.opts.SubscriptionID) || !strings.EqualFold(rg, rt.rg) {
		return nil
	}
	return s.sets[setKey(rg, name)]
}

// chargedResource is the lower-case ID of the resource a request about
// the set is charged to: the VM for a request about one ("" when it does
// not exist), else the scale set.
func (s *Server) chargedResource(set *scaleSet, rt route, op string) string {
	switch op {
	case OpGetVM, OpRestartVM, OpReimageVM, OpRedeployVM, OpRestartVirtualMachine, OpReimageVirtualMachine, OpRedeployVirtualMachine:
		if vm, ok := set.vmByKey(rt.instance); ok {
			return strings.ToLower(s.vmResourceID(vm))
		}
		return ""
	}
	return strings.ToLower(s.scaleSetResourceID(set))
}

// chargedVMs is what an update of the set is charged per VM: the VMs a
// capacity increase adds.
func chargedVMs(set *scaleSet, op string, body []byte) int {
	if op != OpUpdateScaleSet {
		return 0
	}
	if c, ok := requestedCapacity(body); ok {
		return max(0, int(min(c, maxCapacity))-set.capacity())
	}
	return 0
}

// requestedCapacity is the capacity a scale set PATCH body asks for, if
// it is JSON with one.
func requestedCapacity(body []byte) (int64, bool) {
	var patch struct {
		SKU *struct {
			Capacity *int64 `json:"capacity"`
		} `json:"sku"`
	}
	if json.Unmarshal(body, &patch) == nil && patch.SKU != nil && patch.SKU.Capacity != nil {
		return *patch.SKU.Capacity, true
	}
	return 0, false
}

// countInstanceIDs counts the instance IDs an instance deletion's body
// names; 0 when it is no JSON.
func countInstanceIDs(body []byte) int {
	var req struct {
		InstanceIDs []*string `json:"instanceIds"`
	}
	n := 0
	if json.Unmarshal(body, &req) == nil {
		for _, id := range req.InstanceIDs {
			if id != nil {
				n++
			}
		}
	}
	return n
}

// computeEmpty is a charge that cannot be made now.
type computeEmpty struct {
	c    charge
	wait time.Duration
	// from, until: the window or manual throttle refusing it, for the
	// body.
	from, until time.Time
	measured    int
}

// admitCompute makes the charges, or none of them and answers the
// Compute resource provider's 429 when a bucket is short or a policy is
// throttled (ThrottlePolicy). Callers hold s.mu.
func (s *Server) admitCompute(charges []charge, now time.Time) (response, bool) {
	th := s.thr
	var empties []computeEmpty
	for _, c := range charges {
		if e, short := th.computeShort(c, now); short {
			empties = append(empties, e)
		}
	}
	if len(empties) > 0 {
		return s.computeThrottled(charges, empties, now), true
	}
	for _, c := range charges {
		if !th.disabled {
			m := c.p.meter(c.about, now)
			c.p.lim.take(m, c.n, now)
		}
		th.charged[c.p.Name] += c.n
	}
	return response{}, false
}

// computeShort says whether the charge cannot be made now: its policy is
// throttled (ThrottlePolicy), or its bucket or window is short. The
// charge's meter is created as needed and brought to now.
func (th *throttler) computeShort(c charge, now time.Time) (computeEmpty, bool) {
	if b, ok := th.policyBlock(c, now); ok {
		return computeEmpty{c: c, wait: b.until.Sub(now), from: b.from, until: b.until, measured: c.p.Capacity + c.n}, true
	}
	if th.disabled {
		return computeEmpty{}, false
	}
	m := c.p.meter(c.about, now)
	c.p.lim.settle(m, now)
	need := c.p.lim.need(c.n)
	if c.p.lim.has(m, need) {
		return computeEmpty{}, false
	}
	e := computeEmpty{c: c, wait: c.p.lim.wait(m, need, now), measured: c.p.Capacity - c.p.lim.remaining(m) + c.n}
	e.from, e.until = now, now.Add(e.wait)
	if c.p.lim.fixed {
		e.from = m.last
	}
	return e, true
}

// computeThrottled is the Compute resource provider's 429 for the charges
// that cannot be made, counted as throttled. Callers hold s.mu.
func (s *Server) computeThrottled(charges []charge, empties []computeEmpty, now time.Time) response {
	th := s.thr
	// The longest wait first: the policy a client should hold back for.
	slices.SortStableFunc(empties, func(a, b computeEmpty) int { return cmp.Compare(b.wait, a.wait) })
	resp := response{status: http.StatusTooManyRequests}
	details := make([]computeErrorDetail, 0, len(empties))
	isEmpty := map[*policyState]bool{}
	for _, e := range empties {
		isEmpty[e.c.p] = true
		th.throttled[e.c.p.Name]++
		group, _ := json.Marshal(operationGroup{OperationGroup: e.c.p.Name, StartTime: e.from.UTC().Format(time.RFC3339),
			EndTime: e.until.UTC().Format(time.RFC3339), AllowedRequestCount: e.c.p.Capacity, MeasuredRequestCount: e.measured})
		details = append(details, computeErrorDetail{Code: "TooManyRequests", Target: e.c.p.Name, Message: string(group)})
	}
	for _, c := range charges {
		n := 0
		if !isEmpty[c.p] {
			n = s.remainingOf(c, now)
		}
		resp.add(headerRemainingResource, computePrefix+c.p.Name+";"+strconv.Itoa(n))
	}
	secs := retryAfterSeconds(empties[0].wait)
	resp.set("Retry-After", strconv.Itoa(secs))
	resp.body = computeErrorBody{Error: computeError{Code: "OperationNotAllowed", Message: computeThrottleMessage, Details: details,
		InnerError: &computeInnerError{InternalErrorCode: "TooManyRequestsReceived"}}}
	return resp
}

// remainingOf is what the charge's bucket has left. Callers hold s.mu.
func (s *Server) remainingOf(c charge, now time.Time) int {
	if b, ok := s.thr.policyBlock(c, now); ok && now.Before(b.until) {
		return 0
	}
	m := c.p.meter(c.about, now)
	c.p.lim.settle(m, now)
	return c.p.lim.remaining(m)
}

// computeHeaders puts the remaining counts of the policies an admitted
// request was charged to on its answer, and x-ms-request-charge: the
// most it was charged to one policy (a batch's VMs, else 1). Callers
// hold s.mu.
func (s *Server) computeHeaders(resp *response, charges []charge, now time.Time) {
	if len(charges) == 0 || s.thr.disabled {
		return
	}
	most := 0
	for _, c := range charges {
		resp.add(headerRemainingResource, computePrefix+c.p.Name+";"+strconv.Itoa(s.remainingOf(c, now)))
		most = max(most, c.n)
	}
	resp.set(headerRequestCharge, strconv.Itoa(most))
}

// policyBlock is the ThrottlePolicy throttle refusing the charge, if any.
func (th *throttler) policyBlock(c charge, now time.Time) (span, bool) {
	blocks := th.policyBlocks[strings.ToLower(c.p.Name)]
	var found span
	ok := false
	for _, res := range []string{"", c.about} {
		if b, has := blocks[res]; has && now.Before(b.until) && (!ok || b.until.After(found.until)) {
			found, ok = b, true
		}
		if c.about == "" {
			break
		}
	}
	return found, ok
}

// The Compute 429 body ("Troubleshooting API throttling errors").
type computeErrorBody struct {
	Error computeError `json:"error"`
}

type computeError struct {
	Code       string               `json:"code"`
	Message    string               `json:"message"`
	Details    []computeErrorDetail `json:"details,omitempty"`
	InnerError *computeInnerError   `json:"innererror,omitempty"`
}

type computeErrorDetail struct {
	Code    string `json:"code"`
	Target  string `json:"target"`
	Message string `json:"message"`
}

type computeInnerError struct {
	InternalErrorCode string `json:"internalErrorCode"`
}

// operationGroup is the JSON in a throttled detail's message.
type operationGroup struct {
	OperationGroup       string `json:"operationGroup"`
	StartTime            string `json:"startTime"`
	EndTime              string `json:"endTime"`
	AllowedRequestCount  int    `json:"allowedRequestCount"`
	MeasuredRequestCount int    `json:"measuredRequestCount"`
}

// retryAfterSeconds renders d as ARM's Retry-After: whole seconds, rounded
// up, at least 1.
func retryAfterSeconds(d time.Duration) int {
	secs := int(math.Ceil(d.Seconds()))
	if secs < 1 {
		secs = 1
	}
	return secs
}

// Throttle answers every request of the kind ("read", "write" or
// "delete") with ARM's 429 for d (by Options.Clock), as ARM does when
// the subscription's global bucket of the kind is empty: Retry-After,
// x-ms-ratelimit-remaining-subscription-global-<kind>s at 0. It returns
// when the throttling ends (the zero time for an unknown kind), to
// compare with Write.At.
func (s *Server) Throttle(kind string, d time.Duration) time.Time {
	if !knownKind(kind) {
		klog.ErrorS(nil, "Ignoring throttle of unknown request kind", "kind", kind)
		return time.Time{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	s.thr.blocked[kind] = span{from: now, until: now.Add(d)}
	klog.V(2).InfoS("Throttling requests", "kind", kind, "duration", d)
	return now.Add(d)
}

// ThrottleCaller is Throttle for one security principal: every request of
// the kind sent with a bearer token whose CallerOf is caller is answered
// ARM's 429 for d (x-ms-ratelimit-remaining-subscription-<kind>s at 0);
// other callers are served. ARM applies its limits per principal and
// subscription, so one client can be throttled while another in the same
// subscription is not. It lets tests that share the simulator throttle
// only their own autoscaler.
func (s *Server) ThrottleCaller(caller, kind string, d time.Duration) time.Time {
	if !knownKind(kind) {
		klog.ErrorS(nil, "Ignoring throttle of unknown request kind", "kind", kind, "caller", caller)
		return time.Time{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if s.thr.blockedFor[caller] == nil {
		s.thr.blockedFor[caller] = map[string]span{}
	}
	s.thr.blockedFor[caller][kind] = span{from: now, until: now.Add(d)}
	klog.V(2).InfoS("Throttling requests of one caller", "kind", kind, "caller", caller, "duration", d)
	return now.Add(d)
}

// ThrottlePolicy answers the requests charged to a Compute policy (its
// name, with or without "Microsoft.Compute/") with the Compute 429 for d,
// Retry-After the time left: only the requests about resourceID (a scale
// set's resource ID, any case; a VM's for the scale-set VM policies) when
// it is not "", else every request charged to the policy. It works with
// Throttling.Disabled too. It returns when the throttling ends, or the
// zero time for a policy the server does not have.
func (s *Server) ThrottlePolicy(policy, resourceID string, d time.Duration) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.thr.byName[strings.ToLower(policyName(policy))]
	if !ok {
		klog.ErrorS(nil, "Ignoring throttle of unknown Compute policy", "policy", policy)
		return time.Time{}
	}
	now := s.clock.Now()
	key := strings.ToLower(p.Name)
	if s.thr.policyBlocks[key] == nil {
		s.thr.policyBlocks[key] = map[string]span{}
	}
	res := strings.ToLower(strings.TrimRight(strings.TrimSpace(resourceID), "/"))
	s.thr.policyBlocks[key][res] = span{from: now, until: now.Add(d)}
	klog.V(2).InfoS("Throttling a Compute policy", "policy", p.Name, "resource", resourceID, "duration", d)
	return now.Add(d)
}

// Throttled returns the 429s answered by the policy that refused them:
// Compute policies by name ("UpdateVMScaleSetResource", …), ARM's as
// "arm/reads", "arm/writes", "arm/deletes" (the principal's bucket, or
// ThrottleCaller) and "arm/global-reads" … (the global bucket, or
// Throttle). A 429 refused by two policies counts for both;
// Calls()[OpThrottled] counts answers.
func (s *Server) Throttled() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.thr.throttled)
}

// Charged returns what was charged to each policy: requests (VMs for
// VMScaleSetBatchedVMRequests) admitted, by Compute policy name summed
// over resources, and ARM's requests admitted as "arm/reads",
// "arm/writes", "arm/deletes". Charged()[PolicyHighCostGetVMScaleSet30Min]
// is the VM list pages answered, say.
func (s *Server) Charged() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.thr.charged)
}

// resetCounters zeroes Throttled and Charged (not the buckets). Callers
// hold s.mu.
func (th *throttler) resetCounters() {
	th.throttled, th.charged = map[string]int{}, map[string]int{}
}

// add adds a header line (several of one name: x-ms-ratelimit-remaining-resource).
func (r *response) add(key, value string) {
	if r.header == nil {
		r.header = http.Header{}
	}
	r.header.Add(key, value)
}
