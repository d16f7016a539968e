package scaledown

import (
	"math"
	"slices"
	"sort"
	"sync"
	"time"
)

// BrakeOptions bound how much may be deleted within a window.
type BrakeOptions struct {
	// ClusterShare is the largest share of the cluster's nodes deleted
	// within Window (the 2,500-node lesson: an etcd outage made every node
	// look unhealthy and an autoscaler deleted all workers).
	ClusterShare float64
	// GroupShare is the same per node group.
	GroupShare float64
	Window     time.Duration
	// Min nodes may go per window whatever the shares (0: one), so small
	// clusters can still shrink or replace.
	Min int
	// MaxPending bounds how long a reservation (Reserve) counts while its
	// deletion has not been asked yet: longer than the taint's pause and
	// a drain take, so that only a removal lost by a bug stops counting.
	MaxPending time.Duration
}

// Brake remembers recent deletions. At least one node per window may go
// whatever the shares, so small clusters can still shrink.
//
// A deletion is decided (Reserve) some time before it is asked of the
// cloud (Sent): after --node-delete-delay-after-taint, after a drain. It
// counts from its decision until a window after it was sent, so the
// deletions asked within any window stay within the shares: counted from
// the decision only, a removal that waited longer than the next one
// (a drain, a loop's alignment) let two windows' deletions be sent within
// one (the scale harness saw 45 sent within 30 s under a brake of 30).
// Its methods may be called from drains' goroutines.
type Brake struct {
	mu        sync.Mutex
	opts      BrakeOptions
	deletions []deletion
}

// SetOptions changes the brake's shares and window (a live reload); the
// deletions already recorded still count.
func (b *Brake) SetOptions(o BrakeOptions) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.opts = o
}

type deletion struct {
	at    time.Time
	group string
	// key names the node (or machine) whose deletion is reserved; ""
	// for one Recorded.
	key string
	// pending: reserved at at, not sent yet.
	pending bool
}

// NewBrake returns a brake with no recorded deletion.
func NewBrake(o BrakeOptions) *Brake { return &Brake{opts: o} }

func (b *Brake) prune(now time.Time) {
	kept := b.deletions[:0]
	for _, d := range b.deletions {
		keep := b.opts.Window
		if d.pending {
			keep += b.opts.MaxPending
		}
		if now.Sub(d.at) < keep {
			kept = append(kept, d)
		}
	}
	b.deletions = kept
}

func (b *Brake) counts(group string) (cluster, inGroup int) {
	for _, d := range b.deletions {
		cluster++
		if d.group == group {
			inGroup++
		}
	}
	return cluster, inGroup
}

func limit(share float64, size, least int) int {
	return max(int(math.Floor(share*float64(size))), least, 1)
}

// Allow reports whether one more node of group may be deleted now, given
// the cluster's and the group's current sizes (deletions in the window are
// added back, so the share is of the size before them).
func (b *Brake) Allow(now time.Time, group string, clusterSize, groupSize int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(now)
	c, g := b.counts(group)
	if c+1 > limit(b.opts.ClusterShare, clusterSize+c, b.opts.Min) {
		return false
	}
	return g+1 <= limit(b.opts.GroupShare, groupSize+g, b.opts.Min)
}

// Record counts a deletion asked now.
func (b *Brake) Record(now time.Time, group string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deletions = append(b.deletions, deletion{at: now, group: group})
}

// Reserve counts the deletion of key (a node's name, or a machine's
// provider ID) decided now and asked later: it counts until a window
// after Sent, or a window after now once Dropped.
func (b *Brake) Reserve(now time.Time, group, key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.deletions {
		if d := &b.deletions[i]; d.pending && d.key == key {
			d.at, d.group = now, group // planned again: one reservation
			return
		}
	}
	b.deletions = append(b.deletions, deletion{at: now, group: group, key: key, pending: true})
}

// Sent says key's deletion was asked of the cloud now: it counts for a
// window from now. One not reserved (or reserved longer ago than
// MaxPending allows) is counted from now as well, unless key's deletion
// was sent within the window already (the same deletion asked again).
// Callers call it for a machine's first deletion only: a lost deletion
// asked again later is not charged twice.
func (b *Brake) Sent(now time.Time, group, key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(now)
	for i := range b.deletions {
		if d := &b.deletions[i]; d.key == key {
			if d.pending {
				d.at, d.pending = now, false
			}
			return
		}
	}
	b.deletions = append(b.deletions, deletion{at: now, group: group, key: key})
}

// Dropped says key's reserved deletion will not be asked (the removal
// was given up): it counts a window from its decision, as before.
func (b *Brake) Dropped(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.deletions {
		if d := &b.deletions[i]; d.pending && d.key == key {
			d.pending = false
			return
		}
	}
}

// Unreserve forgets key's reserved deletion: the plan that reserved it
// was not carried out at all (nothing was tainted or asked), so it
// counts for nothing.
func (b *Brake) Unreserve(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deletions = slices.DeleteFunc(b.deletions, func(d deletion) bool { return d.pending && d.key == key })
}

// Recent is the number of deletions in the window, and of those decided
// and not sent yet.
func (b *Brake) Recent(now time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(now)
	return len(b.deletions)
}

// Record is one deletion a brake counts, for keeping across a failover.
type Record struct {
	At    time.Time `json:"at"`
	Group string    `json:"group"`
}

// Records are the deletions in the window at now, oldest first; one
// decided and not sent yet is kept as sent at now rounded down to a tenth
// of the window, not before its decision (a new leader cannot know
// whether it was sent; the rounding keeps the saved state from changing
// every loop while a drain runs: at most ten times a window, at the cost
// of a tenth of its window).
func (b *Brake) Records(now time.Time) []Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(now)
	out := make([]Record, len(b.deletions))
	for i, d := range b.deletions {
		out[i] = Record{At: d.at, Group: d.group}
		if d.pending {
			out[i].At = maxTime(d.at, now.Truncate(max(b.opts.Window/10, time.Second)))
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Restore adds deletions an earlier leader recorded (those still in the
// window at now), so a new leader's budget is what is left of the same
// window, not a fresh one. Called once, before the brake records anything
// itself (several deletions share one time: a loop's).
func (b *Brake) Restore(now time.Time, rs []Record) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range rs {
		if now.Sub(r.At) < b.opts.Window && !now.Before(r.At) {
			b.deletions = append(b.deletions, deletion{at: r.At, group: r.Group})
		}
	}
	sort.SliceStable(b.deletions, func(i, j int) bool { return b.deletions[i].at.Before(b.deletions[j].at) })
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
