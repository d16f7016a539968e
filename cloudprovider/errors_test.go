package cloudprovider

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorClassHelpers(t *testing.T) {
	base := errors.New("boom")
	tests := []struct {
		name                                    string
		err                                     error
		sizeUnknown, quota, capacity, throttled bool
		sizeLimit                               bool
	}{
		{name: "nil", err: nil},
		{name: "plain", err: base},
		{name: "size unknown", err: ErrSizeUnknown("g1", base), sizeUnknown: true},
		{name: "quota wrapped", err: fmt.Errorf("scaling g1: %w", NewError(ClassQuota, "QuotaExceeded", "", nil)), quota: true},
		{name: "capacity", err: NewError(ClassOutOfCapacity, "AllocationFailed", "", base), capacity: true},
		{name: "throttled", err: NewError(ClassThrottled, "", "", nil), throttled: true},
		{name: "size limit wrapped", err: fmt.Errorf("scaling g1: %w", NewError(ClassSizeLimit, "InvalidParameter", "", base)), sizeLimit: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsSizeUnknown(tc.err); got != tc.sizeUnknown {
				t.Errorf("IsSizeUnknown = %v, want %v", got, tc.sizeUnknown)
			}
			if got := IsQuota(tc.err); got != tc.quota {
				t.Errorf("IsQuota = %v, want %v", got, tc.quota)
			}
			if got := IsOutOfCapacity(tc.err); got != tc.capacity {
				t.Errorf("IsOutOfCapacity = %v, want %v", got, tc.capacity)
			}
			if got := IsThrottled(tc.err); got != tc.throttled {
				t.Errorf("IsThrottled = %v, want %v", got, tc.throttled)
			}
			if got := IsSizeLimit(tc.err); got != tc.sizeLimit {
				t.Errorf("IsSizeLimit = %v, want %v", got, tc.sizeLimit)
			}
		})
	}
	if !errors.Is(NewError(ClassOther, "", "", base), base) {
		t.Error("Error does not unwrap to its cause")
	}
}
