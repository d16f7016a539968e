package armsim

import (
	"math"
	"time"
)

// Request kinds, throttled by separate subscription-wide buckets as ARM does.
const (
	kindRead  = "read"
	kindWrite = "write"
)

// Throttling policy names reported in 429 answers.
const (
	readPolicy  = "Microsoft.Compute/HighCostGet30Min"
	writePolicy = "Microsoft.Compute/PutVMScaleSet30Min"
)

// Remaining-request counts reported when a bucket is unlimited (ARM's usual
// per-hour subscription limits).
const (
	unlimitedReads  = 11999
	unlimitedWrites = 1199
)

// bucket is a token bucket holding up to limit tokens and refilling
// continuously at limit tokens per window.
type bucket struct {
	limit     int // 0 = unlimited
	unlimited int // remaining count reported when unlimited
	window    time.Duration
	tokens    float64
	last      time.Time
}

func newBucket(limit, unlimited int, window time.Duration, now time.Time) *bucket {
	return &bucket{limit: limit, unlimited: unlimited, window: window, tokens: float64(limit), last: now}
}

func (b *bucket) refill(now time.Time) {
	if b.limit == 0 || !now.After(b.last) {
		return
	}
	b.tokens = math.Min(float64(b.limit), b.tokens+float64(b.limit)*float64(now.Sub(b.last))/float64(b.window))
	b.last = now
}

// take consumes a token if one is available. It returns whether it did, the
// whole tokens left, and otherwise how long until a token is available.
func (b *bucket) take(now time.Time) (ok bool, remaining int, wait time.Duration) {
	if b.limit == 0 {
		return true, b.unlimited, 0
	}
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true, int(b.tokens), 0
	}
	wait = time.Duration((1 - b.tokens) * float64(b.window) / float64(b.limit))
	return false, 0, wait
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

// peek returns the whole tokens left without taking one.
func (b *bucket) peek(now time.Time) int {
	if b.limit == 0 {
		return b.unlimited
	}
	b.refill(now)
	return int(b.tokens)
}
