package vmss

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// How Azure throttles, and so what a 429 holds back here.
//
// ARM throttles first, per subscription, per security principal and per
// operation type (reads, writes, deletes), with regional token buckets
// since 2024 (Microsoft, "Request limits and throttling": reads 250
// tokens refilled 25 a second, writes and deletes 200 refilled 10 a
// second, and a global subscription limit of 15 times that across
// principals), and says what is left in
// x-ms-ratelimit-remaining-subscription-{reads,writes,deletes} and their
// -global- variants. Only when ARM's own bucket is empty is every call of
// a kind held back.
//
// The Compute resource provider then throttles per policy, per region, at
// two levels at once: per resource (a scale set's Update: 12 tokens,
// refilled 4 a minute) and per subscription (Microsoft, "Compute
// throttling limits"). Every answer names the policies it was charged to
// in x-ms-ratelimit-remaining-resource ("Microsoft.Compute/<policy>;<n>",
// one header or comma-separated values per policy), and a 429 names the
// empty one in its body (code OperationNotAllowed, details[].target:
// "Troubleshooting API throttling errors"). So a 429 holds back only
// what that policy covers: the operations whose answers named it, for
// the scale set the request was about when the policy is the resource's,
// or for every scale set when it is the subscription's.
//
// Microsoft publishes the policies' numbers but not always their scope
// in their names. A policy is taken as the subscription's when its name
// says so (…Subscription, the windowed HighCostGet…3Min/30Min, the
// batched-VM policies: subscription-wide in the public examples), or
// when it is throttled for two scale sets at once (the subscription's
// bucket is what two resources share); otherwise as the resource's.
//
// Before a bucket empties the provider slows itself: a policy whose last
// answer left at most lowFloor of the most it was seen to have (and at
// most one token) lets one call through per lowPace, which reads the
// count again ("consider implementing proactive client-side
// self-throttling when the available call count for a target operation
// group drops below some low threshold": Troubleshooting API throttling
// errors, Best practices).

// Request kinds ARM counts separately.
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

const (
	// lowFloor is the share of a policy's tokens below which the
	// provider paces itself.
	lowFloor = 0.10
	// lowPace is how often a policy below its floor lets a call through:
	// the slowest documented refill, 4 tokens a minute (a scale set's
	// Update and Delete policies).
	lowPace = 15 * time.Second
	// computePrefix starts every Compute policy name in
	// x-ms-ratelimit-remaining-resource.
	computePrefix           = "microsoft.compute/"
	headerRemainingResource = "x-ms-ratelimit-remaining-resource"
)

// holdKey is what a hold covers: a Compute policy for one scale set
// (resource, lower-case resource ID) or for all (resource "").
type holdKey struct{ policy, resource string }

// left is a policy's remaining count as an answer gave it.
type left struct {
	n  int
	at time.Time
}

// throttle remembers until when ARM asked us to stay away, and from what.
type throttle struct {
	clock   clock.Clock
	metrics *armMetrics
	mu      sync.Mutex
	// kinds holds a whole kind of call: ARM's own subscription bucket
	// (or an unexplained 429) said 0.
	kinds map[string]time.Time
	// holds holds a Compute policy, for one scale set or all.
	holds map[holdKey]time.Time
	// ops maps an SDK operation to the policies its answers named.
	ops map[string]map[string]bool
	// lefts are the policies' last remaining counts; peak the most seen
	// per policy (its capacity, near enough); paced when a call was last
	// let through a policy below its floor.
	lefts map[holdKey]left
	peak  map[string]int
	paced map[holdKey]time.Time
	// shared are policies found to be the subscription's (throttled for
	// two scale sets at once).
	shared map[string]bool
}

func newThrottle(c clock.Clock, m *armMetrics) *throttle {
	return &throttle{clock: c, metrics: m, kinds: map[string]time.Time{}, holds: map[holdKey]time.Time{},
		ops: map[string]map[string]bool{}, lefts: map[holdKey]left{}, peak: map[string]int{},
		paced: map[holdKey]time.Time{}, shared: map[string]bool{}}
}

// subscriptionScoped says a Compute policy (lower-case, without the
// prefix) is the subscription's rather than each resource's.
func (t *throttle) subscriptionScoped(policy string) bool {
	return t.shared[policy] || strings.HasSuffix(policy, "subscription") ||
		strings.HasPrefix(policy, "highcostgetvmscaleset") && (strings.HasSuffix(policy, "3min") || strings.HasSuffix(policy, "30min")) ||
		strings.Contains(policy, "batchedvm") || strings.Contains(policy, "queuedvm")
}

// keyFor is the hold key of a policy for a request about resource.
func (t *throttle) keyFor(policy, resource string) holdKey {
	if resource == "" || t.subscriptionScoped(policy) {
		return holdKey{policy: policy}
	}
	return holdKey{policy: policy, resource: resource}
}

// blocked returns why and until when a call of the kind and operation
// about resource is held back, or a zero time.
func (t *throttle) blocked(kind, op, resource string) (time.Time, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	if u, ok := t.kinds[kind]; ok {
		if now.Before(u) {
			return u, "ARM's subscription " + kind + "s"
		}
		delete(t.kinds, kind)
		t.metrics.throttledUntil.WithLabelValues(kind).Set(0)
	}
	var until time.Time
	why := ""
	for policy := range t.ops[op] {
		k := t.keyFor(policy, resource)
		if u, ok := t.holds[k]; ok {
			if now.Before(u) {
				if u.After(until) {
					until, why = u, "policy "+policy+scopeText(k)
				}
				continue
			}
			delete(t.holds, k)
			t.setHoldMetric(k.policy)
		}
		if u := t.paceLocked(k, now); !u.IsZero() && u.After(until) {
			until, why = u, "policy "+policy+scopeText(k)+" below its floor"
		}
	}
	return until, why
}

// paceLocked returns until when a policy below its floor holds calls
// back, or zero (and counts this call as the one let through).
func (t *throttle) paceLocked(k holdKey, now time.Time) time.Time {
	l, ok := t.lefts[k]
	if !ok || l.n > max(1, int(lowFloor*float64(t.peak[k.policy]))) {
		return time.Time{}
	}
	if last, ok := t.paced[k]; ok && now.Sub(last) < lowPace {
		return last.Add(lowPace)
	}
	t.paced[k] = now
	return time.Time{}
}

func scopeText(k holdKey) string {
	if k.resource == "" {
		return " (subscription)"
	}
	return " of " + k.resource
}

// observe learns from an answer: the policies it names and what is left
// of them, and, for a 429, what it holds back until when. body is the
// 429's body (nil otherwise).
func (t *throttle) observe(kind, op, resource string, resp *http.Response, body []byte) {
	now := t.clock.Now()
	counts := remainingCounts(resp.Header)
	t.mu.Lock()
	defer t.mu.Unlock()
	for policy, n := range counts {
		t.learnLocked(op, policy)
		k := t.keyFor(policy, resource)
		t.lefts[k] = left{n: n, at: now}
		if _, seen := t.peak[policy]; !seen {
			// A policy's hold gauges exist from its first answer (at 0,
			// not held), so a dashboard shows every policy ARM charges
			// and not only those that once throttled.
			t.peak[policy] = n
			t.setHoldMetric(policy)
		}
		if n > t.peak[policy] {
			t.peak[policy] = n
		}
		t.metrics.remaining.WithLabelValues(policy, scopeLabel(k)).Set(float64(n))
	}
	if resp.StatusCode != http.StatusTooManyRequests {
		return
	}
	until := now.Add(retryAfter(resp.Header.Get("Retry-After")))
	policy := throttledPolicy(body, counts)
	if policy == "" || armSaysEmpty(resp.Header, kind) {
		// ARM's own bucket, or a 429 that names nothing: the whole kind.
		if until.After(t.kinds[kind]) {
			t.kinds[kind] = until
			t.metrics.throttledUntil.WithLabelValues(kind).Set(float64(until.Unix()))
		}
		return
	}
	t.learnLocked(op, policy)
	k := t.keyFor(policy, resource)
	if k.resource != "" {
		// Held for another scale set too: the bucket they share is the
		// subscription's.
		for other, u := range t.holds {
			if other.policy == policy && other.resource != "" && other.resource != resource && now.Before(u) {
				t.shared[policy] = true
				k = holdKey{policy: policy}
				break
			}
		}
	}
	if until.After(t.holds[k]) {
		t.holds[k] = until
	}
	t.setHoldMetric(policy)
}

func (t *throttle) learnLocked(op, policy string) {
	if t.ops[op] == nil {
		t.ops[op] = map[string]bool{}
	}
	t.ops[op][policy] = true
}

// setHoldMetric sets the policy's hold gauges to its latest holds.
// Called with t.mu held.
func (t *throttle) setHoldMetric(policy string) {
	var res, sub time.Time
	for k, u := range t.holds {
		if k.policy != policy {
			continue
		}
		if k.resource == "" && u.After(sub) {
			sub = u
		} else if k.resource != "" && u.After(res) {
			res = u
		}
	}
	t.metrics.policyHeldUntil.WithLabelValues(policy, "resource").Set(unixOrZero(res))
	t.metrics.policyHeldUntil.WithLabelValues(policy, "subscription").Set(unixOrZero(sub))
}

func unixOrZero(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.Unix())
}

func scopeLabel(k holdKey) string {
	if k.resource == "" {
		return "subscription"
	}
	return "resource"
}

// remainingCounts reads every Compute policy an answer names in
// x-ms-ratelimit-remaining-resource, by lower-case policy name without
// the prefix; a policy named twice (its resource and subscription buckets
// under one name) keeps the lower count.
func remainingCounts(h http.Header) map[string]int {
	var out map[string]int
	for _, line := range h.Values(headerRemainingResource) {
		for _, v := range strings.Split(line, ",") {
			name, count, ok := strings.Cut(strings.TrimSpace(v), ";")
			if !ok {
				continue
			}
			name = strings.ToLower(strings.TrimSpace(name))
			name = strings.TrimPrefix(name, computePrefix)
			n, err := strconv.Atoi(strings.TrimSpace(count))
			if err != nil || name == "" || n < 0 {
				continue
			}
			if out == nil {
				out = map[string]int{}
			}
			if old, ok := out[name]; !ok || n < old {
				out[name] = n
			}
		}
	}
	return out
}

// throttledPolicy finds the policy a Compute 429 names: the body's
// details[].target, else a policy its headers give 0. "" when neither.
func throttledPolicy(body []byte, counts map[string]int) string {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Details []struct {
				Code   string `json:"code"`
				Target string `json:"target"`
			} `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil {
		for _, d := range e.Error.Details {
			if d.Target != "" && strings.EqualFold(d.Code, "TooManyRequests") {
				return strings.TrimPrefix(strings.ToLower(d.Target), computePrefix)
			}
		}
	}
	for p, n := range counts {
		if n == 0 {
			return p
		}
	}
	return ""
}

// armSaysEmpty says ARM's own bucket for the kind is empty: its
// remaining count (the principal's or the subscription's global one) is 0.
func armSaysEmpty(h http.Header, kind string) bool {
	for _, name := range []string{"x-ms-ratelimit-remaining-subscription-" + kind + "s", "x-ms-ratelimit-remaining-subscription-global-" + kind + "s"} {
		if v := h.Get(name); v != "" {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n <= 0 {
				return true
			}
		}
	}
	return false
}

// readBody reads a 429's body (at most 64 KiB) and puts it back for the
// SDK.
func readBody(resp *http.Response) []byte {
	if resp.Body == nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return b
}

// ctxResource is the context key of the scale set a request is about
// when its URL does not name it (an operation's polls).
type ctxResource struct{}

// withResource says the calls made with ctx are about the scale set.
func withResource(ctx context.Context, resourceID string) context.Context {
	return context.WithValue(ctx, ctxResource{}, strings.ToLower(resourceID))
}

// resourceOf is the scale set a request is about: from its context, or
// its URL's path up to the scale set's name (lower-case), or "".
func resourceOf(req *http.Request) string {
	if r, ok := req.Context().Value(ctxResource{}).(string); ok && r != "" {
		return r
	}
	path := strings.ToLower(req.URL.Path)
	const seg = "/providers/microsoft.compute/virtualmachinescalesets/"
	i := strings.Index(path, seg)
	if i < 0 {
		return ""
	}
	rest := path[i+len(seg):]
	if j := strings.IndexByte(rest, '/'); j >= 0 {
		rest = rest[:j]
	}
	return path[:i+len(seg)] + rest
}
