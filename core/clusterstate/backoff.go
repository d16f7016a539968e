package clusterstate

import (
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
