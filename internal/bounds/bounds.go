// Package bounds checks that a configured duration, count or share lies
// within a range. Every error names what was configured (a flag such as
// "--scan-interval", or a scale-set tag) and the value given, so a typo
// such as 10h for 10m is refused with a message that says where it is.
package bounds

import (
	"fmt"
	"time"
)

// Duration checks lo <= v <= hi.
func Duration(name string, v, lo, hi time.Duration) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s=%s: must be between %s and %s", name, v, lo, hi)
	}
	return nil
}

// Int checks lo <= v <= hi.
func Int(name string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s=%d: must be between %d and %d", name, v, lo, hi)
	}
	return nil
}

// Float checks lo <= v <= hi (NaN is never in range).
func Float(name string, v, lo, hi float64) error {
	if !(v >= lo && v <= hi) {
		return fmt.Errorf("%s=%v: must be between %v and %v", name, v, lo, hi)
	}
	return nil
}

// Check is one range check, for tables of them.
type Check func() error

// First returns the first error of checks, in order.
func First(checks ...Check) error {
	for _, c := range checks {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}
