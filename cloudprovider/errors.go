package cloudprovider

import (
	"errors"
	"fmt"
)

// ErrorClass says what the core should do about a cloud error.
type ErrorClass int

const (
	// ClassOther is any error without a more specific class.
	ClassOther ErrorClass = iota
	// ClassSizeUnknown means the provider does not know a group's size; act on nothing.
	ClassSizeUnknown
	// ClassQuota means a quota (vCPU family, regional) stopped the request; back off long.
	ClassQuota
	// ClassOutOfCapacity means the cloud has no capacity for the SKU or zone now; back off shorter.
	ClassOutOfCapacity
	// ClassThrottled means the cloud throttled the caller; retry after the given time, no backoff.
	ClassThrottled
	// ClassConflict means a concurrent write; retry later, no backoff.
	ClassConflict
	// ClassFenced means this process may not write now (not the leader,
	// or its lease not renewed in time); no backoff: the group is fine.
	ClassFenced
	// ClassHeld means a safety hold (the cluster-wide unready guard)
	// refused a deletion; nothing was sent, and the group is fine.
	ClassHeld
	// ClassSizeLimit means the cloud refused a size the group cannot hold
	// (a scale set's platform limit, e.g. 1,000 VMs); it will not change
	// in minutes: back off long, try another group.
	ClassSizeLimit
	// ClassEvicted is a machine the cloud took back (an Azure Spot VM
	// evicted under eviction policy Deallocate): it runs nothing and is to
	// be deleted. One eviction backs nothing off: the core counts a
	// group's evictions (EvictionReporter) and backs it off when they
	// keep coming.
	ClassEvicted
)

// ErrNotSent marks a write the provider refused before sending anything
// to the cloud (a request it knows is invalid, below a group's minimum):
// its outcome is certain — nothing changed.
var ErrNotSent = errors.New("refused before it was sent")

// ErrOutcomeUnknown says a write was sent and the cloud's answer leaves
// its outcome unknown (a timeout, a 5xx): it may have run, or still run.
var ErrOutcomeUnknown = errors.New("the outcome is unknown")

// NotSent says err is a write that certainly reached nothing: refused by
// the provider before sending (ErrNotSent), by the fence or by a hold.
func NotSent(err error) bool {
	if errors.Is(err, ErrNotSent) {
		return true
	}
	c := ClassOf(err)
	return c == ClassFenced || c == ClassHeld
}

func (c ErrorClass) String() string {
	switch c {
	case ClassSizeUnknown:
		return "size-unknown"
	case ClassQuota:
		return "quota"
	case ClassOutOfCapacity:
		return "out-of-capacity"
	case ClassThrottled:
		return "throttled"
	case ClassConflict:
		return "conflict"
	case ClassFenced:
		return "fenced"
	case ClassHeld:
		return "held"
	case ClassSizeLimit:
		return "size-limit"
	case ClassEvicted:
		return "evicted"
	default:
		return "other"
	}
}

// Error is a classified cloud error. Code is the cloud's own error code
// (e.g. ARM's "QuotaExceeded"); Err is the underlying error, if any.
type Error struct {
	Class ErrorClass
	Code  string
	Msg   string
	Err   error
}

// NewError returns a classified error.
func NewError(class ErrorClass, code, msg string, err error) *Error {
	return &Error{Class: class, Code: code, Msg: msg, Err: err}
}

func (e *Error) Error() string {
	s := e.Class.String()
	if e.Code != "" {
		s += " (" + e.Code + ")"
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// ClassOf returns the class of the first classified error in err's chain, or
// ClassOther.
func ClassOf(err error) ErrorClass {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Class
	}
	return ClassOther
}

// IsSizeUnknown reports whether err says a group's size is unknown.
func IsSizeUnknown(err error) bool { return err != nil && ClassOf(err) == ClassSizeUnknown }

// IsQuota reports whether err is a quota error.
func IsQuota(err error) bool { return err != nil && ClassOf(err) == ClassQuota }

// IsOutOfCapacity reports whether err says the cloud has no capacity.
func IsOutOfCapacity(err error) bool { return err != nil && ClassOf(err) == ClassOutOfCapacity }

// IsThrottled reports whether err is a throttling error.
func IsThrottled(err error) bool { return err != nil && ClassOf(err) == ClassThrottled }

// IsSizeLimit reports whether err says a size is beyond what the group can hold.
func IsSizeLimit(err error) bool { return err != nil && ClassOf(err) == ClassSizeLimit }

// ErrSizeUnknown builds a size-unknown error for a group.
func ErrSizeUnknown(group string, cause error) error {
	return NewError(ClassSizeUnknown, "", fmt.Sprintf("size of node group %s is unknown", group), cause)
}
