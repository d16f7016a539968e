package clusterstate

import (
	"sort"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// BackoffOptions are CA's exponential backoff settings.
type BackoffOptions struct {
	Initial time.Duration // first backoff (CA: 5m)
	Max     time.Duration // cap (CA: 30m)
	Reset   time.Duration // a group with no failure for this long starts again at Initial (CA: 3h)
}

// Backoff tracks which node groups must not be scaled up for now.
type Backoff struct {
	opts    BackoffOptions
	entries map[string]*backoffEntry
}

type backoffEntry struct {
	until       time.Time
	lastFailure time.Time
	duration    time.Duration
	class       cloudprovider.ErrorClass
	reason      string
}

// BackoffStatus is a group's backoff as reported in status and metrics.
type BackoffStatus struct {
	Active bool
	Until  time.Time
	Class  cloudprovider.ErrorClass
	Reason string
}

// NewBackoff returns an empty backoff.
func NewBackoff(opts BackoffOptions) *Backoff {
	return &Backoff{opts: opts, entries: map[string]*backoffEntry{}}
}

// Fail backs a group off after a failed scale-up. Quota and size-limit
// errors go straight to the maximum (neither changes in minutes); other failures
// double from the initial duration.
func (b *Backoff) Fail(group string, class cloudprovider.ErrorClass, reason string, now time.Time) time.Duration {
	e := b.entries[group]
	if e == nil || now.Sub(e.lastFailure) > b.opts.Reset {
		e = &backoffEntry{}
		b.entries[group] = e
	}
	switch {
	case class == cloudprovider.ClassQuota, class == cloudprovider.ClassSizeLimit:
		e.duration = b.opts.Max
	case e.duration == 0:
		e.duration = b.opts.Initial
	default:
		e.duration *= 2
	}
	if e.duration > b.opts.Max {
		e.duration = b.opts.Max
	}
	e.until = now.Add(e.duration)
	e.lastFailure = now
	e.class = class
	e.reason = reason
	return e.duration
}

// Status returns a group's backoff at time now.
func (b *Backoff) Status(group string, now time.Time) BackoffStatus {
	e := b.entries[group]
	if e == nil {
		return BackoffStatus{}
	}
	if now.Sub(e.lastFailure) > b.opts.Reset {
		delete(b.entries, group)
		return BackoffStatus{}
	}
	return BackoffStatus{Active: now.Before(e.until), Until: e.until, Class: e.class, Reason: e.reason}
}

// BackoffRecord is a group's backoff, for keeping across a failover.
type BackoffRecord struct {
	Group       string                   `json:"group"`
	Until       time.Time                `json:"until"`
	LastFailure time.Time                `json:"lastFailure"`
	Duration    time.Duration            `json:"duration"`
	Class       cloudprovider.ErrorClass `json:"class"`
	Reason      string                   `json:"reason"`
}

// Records are the groups' backoffs still remembered at now (within the
// reset time of their last failure), by group name.
func (b *Backoff) Records(now time.Time) []BackoffRecord {
	out := make([]BackoffRecord, 0, len(b.entries))
	for g, e := range b.entries {
		if now.Sub(e.lastFailure) > b.opts.Reset {
			continue
		}
		out = append(out, BackoffRecord{Group: g, Until: e.until, LastFailure: e.lastFailure, Duration: e.duration, Class: e.class, Reason: e.reason})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

// Restore takes an earlier leader's backoffs; a group this process has a
// later failure for keeps its own.
func (b *Backoff) Restore(now time.Time, rs []BackoffRecord) {
	for _, r := range rs {
		if now.Sub(r.LastFailure) > b.opts.Reset {
			continue
		}
		if e := b.entries[r.Group]; e != nil && !e.lastFailure.Before(r.LastFailure) {
			continue
		}
		b.entries[r.Group] = &backoffEntry{until: r.Until, lastFailure: r.LastFailure, duration: r.Duration, class: r.Class, reason: r.Reason}
	}
}
