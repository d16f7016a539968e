package vmss

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// armMetrics are the provider's ARM metrics.
type armMetrics struct {
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	throttledUntil  *prometheus.GaugeVec
	policyHeldUntil *prometheus.GaugeVec
	remaining       *prometheus.GaugeVec
	cacheAge        prometheus.Gauge
	vmListAge       prometheus.Gauge
	lroFailures     *prometheus.CounterVec
}

func newARMMetrics(reg prometheus.Registerer) *armMetrics {
	const ns = "vmss_autoscaler"
	m := &armMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "arm_requests_total",
			Help: "ARM requests sent, by SDK operation and HTTP status code (\"error\" when no response, \"held-back\" when a throttle hold kept it)."}, []string{"operation", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "arm_request_duration_seconds",
			Help: "Duration of ARM requests by SDK operation.", Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}}, []string{"operation"}),
		throttledUntil: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "arm_throttled_until_seconds",
			Help: "Unix time until which every ARM call of a kind (read, write, delete) is held back because ARM's own subscription bucket is empty; 0 when not."}, []string{"kind"}),
		policyHeldUntil: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "arm_policy_held_until_seconds",
			Help: "Unix time until which the calls a Compute throttling policy covers are held back after its 429, for one scale set at least (scope resource) or all (scope subscription); 0 when not."}, []string{"policy", "scope"}),
		remaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "arm_ratelimit_remaining",
			Help: "Calls left in a Compute throttling policy's bucket as the last answer charged to it said (x-ms-ratelimit-remaining-resource), by scope."}, []string{"policy", "scope"}),
		cacheAge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "cloud_cache_age_seconds",
			Help: "Age of the scale-set cache (the scale-set lists) at the last loop."}),
		vmListAge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "cloud_vm_list_age_seconds",
			Help: "Age of the oldest scale set's VM list at the last refresh."}),
		lroFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "arm_operation_failures_total",
			Help: "Long-running ARM operations that ended in failure, by scale set and error code."}, []string{"node_group", "code"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.throttledUntil, m.policyHeldUntil, m.remaining, m.cacheAge, m.vmListAge, m.lroFailures)
	}
	return m
}

// errThrottled is returned without sending a request while a throttle
// hold covers it (ARM's Retry-After, or a policy below its floor).
type errThrottled struct {
	kind  string
	until time.Time
	why   string
}

func (e *errThrottled) Error() string {
	why := e.why
	if why == "" {
		why = "ARM " + e.kind + "s"
	}
	return fmt.Sprintf("ARM call held back until %s: %s throttled (Retry-After)", e.until.UTC().Format(time.RFC3339), why)
}

// Is makes a held-back call cloudprovider.ErrNotSent: nothing reached
// ARM, so a held-back write is deferred (the core merges its demand into
// the scale set's next write), never a failure.
func (e *errThrottled) Is(target error) bool { return target == cloudprovider.ErrNotSent }

// NonRetriable tells the SDK's retry policy not to retry a request held
// back: each retry would be held back too, only seconds later (and a
// background operation watcher would keep Close waiting for them).
func (e *errThrottled) NonRetriable() {}

// armPolicy runs on every attempt: it holds requests back while a
// throttle hold covers them, records metrics, and learns the policies and
// Retry-After from the answers.
type armPolicy struct {
	throttle *throttle
	metrics  *armMetrics
	clock    clock.Clock
}

func (p *armPolicy) Do(req *policy.Request) (*http.Response, error) {
	raw := req.Raw()
	kind := kindOf(raw.Method)
	op, _ := raw.Context().Value(runtime.CtxAPINameKey{}).(string)
	if op == "" {
		op = "poll"
	}
	resource := resourceOf(raw)
	if u, why := p.throttle.blocked(kind, op, resource); !u.IsZero() {
		p.metrics.requests.WithLabelValues(op, "held-back").Inc()
		return nil, &errThrottled{kind: kind, until: u, why: why}
	}
	start := p.clock.Now()
	resp, err := req.Next()
	p.metrics.duration.WithLabelValues(op).Observe(p.clock.Since(start).Seconds())
	if err != nil {
		p.metrics.requests.WithLabelValues(op, "error").Inc()
		return resp, err
	}
	p.metrics.requests.WithLabelValues(op, strconv.Itoa(resp.StatusCode)).Inc()
	var body []byte
	if resp.StatusCode == http.StatusTooManyRequests {
		body = readBody(resp)
	}
	p.throttle.observe(kind, op, resource, resp, body)
	return resp, nil
}

// retryAfter parses seconds or an HTTP date; ARM sends seconds. Without a
// usable value the provider stays away for a minute.
func retryAfter(v string) time.Duration {
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return time.Minute
}

// classify maps an ARM error to the core's error classes (see arm.md).
func classify(err error) error {
	if err == nil {
		return nil
	}
	var th *errThrottled
	if errors.As(err, &th) {
		return cloudprovider.NewError(cloudprovider.ClassThrottled, "TooManyRequests", "", err)
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return err
	}
	return cloudprovider.NewError(classOfCode(re.StatusCode, re.ErrorCode, re.Error()), re.ErrorCode, "", err)
}

// classOfCode maps an ARM status and error code to a class.
func classOfCode(status int, code, msg string) cloudprovider.ErrorClass {
	lc, lmsg := strings.ToLower(code), strings.ToLower(msg)
	switch {
	case status == http.StatusTooManyRequests || lc == "toomanyrequests":
		return cloudprovider.ClassThrottled
	case isSizeLimit(lc, lmsg):
		return cloudprovider.ClassSizeLimit
	case isQuota(lc, lmsg):
		return cloudprovider.ClassQuota
	case isOutOfCapacity(lc):
		return cloudprovider.ClassOutOfCapacity
	case lc == "scopelocked":
		// A management lock on the scale set or its resource group
		// (409 ScopeLocked: "Lock your resources to protect your
		// infrastructure") refuses every write until someone removes
		// it: no concurrent write that the next loop gets past, so
		// backed off, not retried at once.
		return cloudprovider.ClassOther
	case lc == "operationpreempted" || status == http.StatusConflict || lc == "conflict":
		return cloudprovider.ClassConflict
	default:
		return cloudprovider.ClassOther
	}
}

// isQuota says an ARM error refused what a quota does not allow:
// QuotaExceeded, or OperationNotAllowed about a quota. Both take lower
// case.
func isQuota(code, msg string) bool {
	return code == "quotaexceeded" || (code == "operationnotallowed" && strings.Contains(msg, "quota"))
}

// isOutOfCapacity says an ARM error code (lower case) is Azure out of
// the VMs asked for.
func isOutOfCapacity(code string) bool {
	switch code {
	case "allocationfailed", "zonalallocationfailed", "overconstrainedallocationrequest",
		"overconstrainedzonalallocationrequest", "skunotavailable":
		return true
	}
	return false
}

// isSizeLimit says an ARM error refused a capacity the scale set cannot
// hold: 400 InvalidParameter on sku.capacity (beyond 1,000), or 409
// OperationNotAllowed "... exceeds the total limit of 'N' Virtual Machine
// instances" (a single placement group, a managed image). Both take lower
// case.
func isSizeLimit(code, msg string) bool {
	switch code {
	case "invalidparameter":
		return strings.Contains(msg, "sku.capacity")
	case "operationnotallowed":
		return strings.Contains(msg, "exceeds the total limit of")
	}
	return false
}

// sizeLimitRE finds the limit in ARM's answer to a capacity beyond it.
var sizeLimitRE = regexp.MustCompile(`(?i)(?:must be between 0 and |total limit of ')(\d+)`)

// sizeLimitOf returns the limit an ARM size-limit error names, or 0.
func sizeLimitOf(err error) int {
	var re *azcore.ResponseError
	if !errors.As(err, &re) || !isSizeLimit(strings.ToLower(re.ErrorCode), strings.ToLower(re.Error())) {
		return 0
	}
	m := sizeLimitRE.FindStringSubmatch(re.Error())
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// retryOptions retries transient failures but never a 429: ARM asked us to
// stay away, and retrying makes the whole subscription's throttling longer.
func retryOptions() policy.RetryOptions {
	return policy.RetryOptions{
		MaxRetries:    3,
		RetryDelay:    time.Second,
		MaxRetryDelay: 10 * time.Second,
		StatusCodes:   []int{http.StatusRequestTimeout, http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout},
	}
}

// withTimeout bounds one ARM call.
func withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 2*time.Minute)
}
