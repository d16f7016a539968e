package ratelimit

import (
	"fmt"
	"math"
	"time"
)

// Why the adaptive controller set the rate. Each is also a value of the
// metric label that says why the rate is what it is.
const (
	ReasonConfigured = "configured" // the flag's value; adaptive mode off or not evaluated yet
	ReasonHealthy    = "healthy"    // raised: no trouble while the rate held demand back
	ReasonSteady     = "steady"     // unchanged: healthy, but the rate was not what held demand back
	ReasonAtMax      = "at-max"     // healthy, already at the upper bound
	Reason429        = "client-429" // the API server answered the autoscaler's requests with 429
	Reason5xx        = "client-5xx" // the API server answered with 5xx
	ReasonLatency    = "client-latency"
	ReasonRejected   = "apiserver-flowcontrol-rejected" // API Priority and Fairness rejected requests (any client)
)

// Reasons lists every reason, for metrics that reset the ones not current.
func Reasons() []string {
	return []string{ReasonConfigured, ReasonHealthy, ReasonSteady, ReasonAtMax, Reason429, Reason5xx, ReasonLatency, ReasonRejected}
}

// AdaptiveOptions bound the adaptive controller: it cuts the rate by
// DecreaseFactor on trouble and raises it while healthy (doubling it in
// slow start, then by IncreaseStep once per Interval), within [Min, Max].
type AdaptiveOptions struct {
	Min, Max       float64
	DecreaseFactor float64
	IncreaseStep   float64
	Interval       time.Duration
	// LatencyThreshold makes a request slow; SlowShare of the requests in an
	// interval being slow is trouble (with at least MinRequests requests).
	LatencyThreshold time.Duration
	SlowShare        float64
	MinRequests      int
}

// DefaultAdaptiveOptions are safe for a 7,500-node cluster.
func DefaultAdaptiveOptions() AdaptiveOptions {
	return AdaptiveOptions{
		Min: 10, Max: 600, DecreaseFactor: 0.5, IncreaseStep: 10, Interval: 30 * time.Second,
		LatencyThreshold: time.Second, SlowShare: 0.1, MinRequests: 5,
	}
}

// Validate names the flag at fault; rate is the configured starting rate.
func (o AdaptiveOptions) Validate(rate float64) error {
	if err := o.validateBounds(rate); err != nil {
		return err
	}
	if err := o.validateSteps(); err != nil {
		return err
	}
	return o.validateLatency()
}

// validateBounds checks the rate's bounds and that the starting rate is
// within them.
func (o AdaptiveOptions) validateBounds(rate float64) error {
	switch {
	case o.Min <= 0:
		return fmt.Errorf("--node-addition-rate-min: must be positive, got %v", o.Min)
	case o.Max < o.Min:
		return fmt.Errorf("--node-addition-rate-max: %v is below --node-addition-rate-min %v", o.Max, o.Min)
	case rate < o.Min || rate > o.Max:
		return fmt.Errorf("--node-addition-rate: %v is outside the adaptive bounds [%v, %v]", rate, o.Min, o.Max)
	}
	return nil
}

// validateSteps checks how the controller moves the rate: the cut, the
// raise and the period.
func (o AdaptiveOptions) validateSteps() error {
	switch {
	case o.DecreaseFactor <= 0 || o.DecreaseFactor >= 1:
		return fmt.Errorf("--node-addition-rate-decrease-factor: must be between 0 and 1 (exclusive), got %v", o.DecreaseFactor)
	case o.IncreaseStep <= 0:
		return fmt.Errorf("--node-addition-rate-increase-step: must be positive, got %v", o.IncreaseStep)
	case o.Interval <= 0:
		return fmt.Errorf("--node-addition-adaptive-interval: must be positive, got %s", o.Interval)
	}
	return nil
}

// validateLatency checks what makes latency trouble.
func (o AdaptiveOptions) validateLatency() error {
	switch {
	case o.LatencyThreshold <= 0:
		return fmt.Errorf("--node-addition-latency-threshold: must be positive, got %s", o.LatencyThreshold)
	case o.SlowShare <= 0 || o.SlowShare > 1:
		return fmt.Errorf("node-addition slow share: must be in (0, 1], got %v", o.SlowShare)
	}
	return nil
}

// Signals are the API server's health as the autoscaler saw it over an
// interval.
type Signals struct {
	// Requests the autoscaler's client made (watches excluded), and of
	// those: slower than the latency threshold, answered 429, answered 5xx.
	Requests, Slow, Throttled, ServerErrors int
	// Rejected is the increase of apiserver_flowcontrol_rejected_requests_total
	// over the interval; RejectedKnown is false when /metrics could not be read.
	Rejected      float64
	RejectedKnown bool
}

// Change is a decision of the adaptive controller.
type Change struct {
	From, To float64
	Reason   string
	Signals  Signals
}

// Adaptive is the controller. Not safe for concurrent use: the loop owns it.
//
// It starts in slow start, as TCP does: while the API server is healthy
// and the rate is what holds demand back, the rate doubles every sixth of
// an Interval, so a burst on a healthy control plane reaches the upper
// bound within seconds (100 → 600 nodes a minute in 15 s with the
// defaults), not after minutes of additive steps. The first sign of
// trouble ends slow start for good; from then on the rate rises by
// IncreaseStep once per Interval. Trouble the API server states outright
// (429s, API Priority and Fairness rejections, 5xx) cuts the rate in the
// loop that sees it, not at the end of the interval, at most once per
// third of an Interval (one burst of errors is one cut); a latency share
// above SlowShare is judged over a whole period (an Interval; a sixth of
// one in slow start), with at least MinRequests requests in it.
type Adaptive struct {
	opts    AdaptiveOptions
	rate    float64
	reason  string
	last    time.Time
	lastCut time.Time
	limited bool
	// acc are the signals since the last decision.
	acc       Signals
	slowStart bool
}

// NewAdaptive starts at rate, in slow start.
func NewAdaptive(rate float64, o AdaptiveOptions) (*Adaptive, error) {
	if err := o.Validate(rate); err != nil {
		return nil, err
	}
	return &Adaptive{opts: o, rate: rate, reason: ReasonConfigured, slowStart: true}, nil
}

// Rate is the current rate and why.
func (a *Adaptive) Rate() (float64, string) { return a.rate, a.reason }

// SlowStart says the rate still doubles while healthy (no trouble seen yet).
func (a *Adaptive) SlowStart() bool { return a.slowStart }

// slowStartPeriods is how many times the rate may double per Interval in
// slow start: every 5 s with the default 30 s. Every third of an Interval
// (10 s), the peer benchmark's 162 nodes had all registered 38-48 s in at
// 5,000 pods; every sixth, 29-46 s. Joins lag the rate by a VM's boot (a minute
// or more on Azure), so a slower doubling would not see their cost
// sooner; what bounds the burst is --node-addition-rate-max and the cut
// on the first 429, flow-control rejection or 5xx.
const slowStartPeriods = 6

// Update is called every loop, with the signals since the last call
// (take). limited says whether the rate held demand back in this loop.
// It cuts the rate at once on 429s, flow-control rejections and 5xx (see
// Adaptive); otherwise, once per period (a sixth of Interval in slow
// start, Interval after), it decides on the period's signals:
// multiplicative decrease on trouble, increase while healthy and the rate
// is what holds demand back (a rate raised while idle would only turn into
// a burst later). ok is false when nothing was decided.
func (a *Adaptive) Update(now time.Time, limited bool, take func() Signals) (c Change, ok bool) {
	s := take()
	if a.last.IsZero() {
		a.last = now // start the first period afresh: s is from before
		a.limited = limited
		return Change{}, false
	}
	a.limited = a.limited || limited
	a.acc.add(s)
	if why := a.outright(s); why != "" && (a.lastCut.IsZero() || now.Sub(a.lastCut) >= a.opts.Interval/3) {
		return a.cut(now, why), true
	}
	if now.Sub(a.last) < a.period() {
		return Change{}, false
	}
	if why := a.trouble(a.acc); why != "" {
		return a.cut(now, why), true
	}
	c = Change{From: a.rate, Signals: a.acc}
	a.raise()
	a.next(now)
	c.To, c.Reason = a.rate, a.reason
	return c, true
}

// period is how often the controller decides on its signals: a sixth of
// Interval in slow start, Interval after.
func (a *Adaptive) period() time.Duration {
	if a.slowStart {
		return a.opts.Interval / slowStartPeriods
	}
	return a.opts.Interval
}

// raise sets the rate of a healthy period: doubled in slow start, else
// one step up, when the rate held demand back and is below the maximum.
func (a *Adaptive) raise() {
	switch {
	case !a.limited:
		a.reason = ReasonSteady
	case a.rate >= a.opts.Max:
		a.reason = ReasonAtMax
	case a.slowStart:
		a.rate = math.Min(a.opts.Max, a.rate*2)
		a.reason = ReasonHealthy
	default:
		a.rate = math.Min(a.opts.Max, a.rate+a.opts.IncreaseStep)
		a.reason = ReasonHealthy
	}
}

// cut decreases the rate for why and ends slow start.
func (a *Adaptive) cut(now time.Time, why string) Change {
	c := Change{From: a.rate, Signals: a.acc}
	a.rate = math.Max(a.opts.Min, a.rate*a.opts.DecreaseFactor)
	a.reason = why
	a.slowStart = false
	a.lastCut = now
	a.next(now)
	c.To, c.Reason = a.rate, a.reason
	return c
}

// next starts a new period.
func (a *Adaptive) next(now time.Time) {
	a.last = now
	a.acc = Signals{}
	a.limited = false
}

// outright is trouble the API server states itself (429, flow-control
// rejections, 5xx), or "".
func (a *Adaptive) outright(s Signals) string {
	switch {
	case s.Throttled > 0:
		return Reason429
	case s.RejectedKnown && s.Rejected > 0:
		return ReasonRejected
	case s.ServerErrors > 0:
		return Reason5xx
	}
	return ""
}

func (s *Signals) add(o Signals) {
	s.Requests += o.Requests
	s.Slow += o.Slow
	s.Throttled += o.Throttled
	s.ServerErrors += o.ServerErrors
	s.Rejected += o.Rejected
	s.RejectedKnown = s.RejectedKnown || o.RejectedKnown
}

// trouble is the most telling sign of an overloaded API server over a
// period, or "".
func (a *Adaptive) trouble(s Signals) string {
	if why := a.outright(s); why != "" {
		return why
	}
	if s.Requests >= a.opts.MinRequests && float64(s.Slow) > a.opts.SlowShare*float64(s.Requests) {
		return ReasonLatency
	}
	return ""
}
