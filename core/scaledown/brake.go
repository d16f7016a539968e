package scaledown

import (
	"math"
	"sort"
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
}

// Brake remembers recent deletions. At least one node per window may go
// whatever the shares, so small clusters can still shrink.
type Brake struct {
	opts      BrakeOptions
	deletions []deletion
}

// SetOptions changes the brake's shares and window (a live reload); the
// deletions already recorded still count.
func (b *Brake) SetOptions(o BrakeOptions) { b.opts = o }

type deletion struct {
	at    time.Time
	group string
}

// NewBrake returns a brake with no recorded deletion.
func NewBrake(o BrakeOptions) *Brake { return &Brake{opts: o} }

func (b *Brake) prune(now time.Time) {
	kept := b.deletions[:0]
	for _, d := range b.deletions {
		if now.Sub(d.at) < b.opts.Window {
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
	b.prune(now)
	c, g := b.counts(group)
	if c+1 > limit(b.opts.ClusterShare, clusterSize+c, b.opts.Min) {
		return false
	}
	return g+1 <= limit(b.opts.GroupShare, groupSize+g, b.opts.Min)
}

// Record counts a deletion.
func (b *Brake) Record(now time.Time, group string) {
	b.deletions = append(b.deletions, deletion{at: now, group: group})
}

// Recent is the number of deletions in the window.
func (b *Brake) Recent(now time.Time) int {
	b.prune(now)
	return len(b.deletions)
}

// Record is one deletion a brake counts, for keeping across a failover.
type Record struct {
	At    time.Time `json:"at"`
	Group string    `json:"group"`
}

// Records are the deletions in the window at now, oldest first.
func (b *Brake) Records(now time.Time) []Record {
	b.prune(now)
	out := make([]Record, len(b.deletions))
	for i, d := range b.deletions {
		out[i] = Record{At: d.at, Group: d.group}
	}
	return out
}

// Restore adds deletions an earlier leader recorded (those still in the
// window at now), so a new leader's budget is what is left of the same
// window, not a fresh one. Called once, before the brake records anything
// itself (several deletions share one time: a loop's).
func (b *Brake) Restore(now time.Time, rs []Record) {
	for _, r := range rs {
		if now.Sub(r.At) < b.opts.Window && !now.Before(r.At) {
			b.deletions = append(b.deletions, deletion{at: r.At, group: r.Group})
		}
	}
	sort.SliceStable(b.deletions, func(i, j int) bool { return b.deletions[i].at.Before(b.deletions[j].at) })
}
