package bounds

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestRanges(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		wantErr string
	}{
		{"duration in range", Duration("--scan-interval", 10*time.Second, time.Millisecond, time.Hour), ""},
		{"duration at low end", Duration("--scan-interval", time.Millisecond, time.Millisecond, time.Hour), ""},
		{"duration below", Duration("--scan-interval", 0, time.Millisecond, time.Hour), "--scan-interval=0s: must be between 1ms and 1h0m0s"},
		{"duration above", Duration("tag maxnodeprovisiontime", 200*time.Hour, 0, 168*time.Hour), "tag maxnodeprovisiontime=200h0m0s: must be between 0s and 168h0m0s"},
		{"int in range", Int("--max-nodes-in-flight", 300, 1, 100000), ""},
		{"int below", Int("--max-nodes-in-flight", -1, 1, 100000), "--max-nodes-in-flight=-1: must be between 1 and 100000"},
		{"int above", Int("tag max", 5000, 0, 1000), "tag max=5000: must be between 0 and 1000"},
		{"float in range", Float("--share", 0.5, 0, 1), ""},
		{"float above", Float("--share", 1.5, 0, 1), "--share=1.5: must be between 0 and 1"},
		{"float NaN", Float("--share", math.NaN(), 0, 1), "--share=NaN: must be between 0 and 1"},
		{"float +Inf", Float("--rate", math.Inf(1), 0, 1e6), "--rate=+Inf: must be between 0 and 1e+06"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			switch {
			case tc.wantErr == "" && tc.err != nil:
				t.Fatalf("unexpected error %v", tc.err)
			case tc.wantErr != "" && (tc.err == nil || tc.err.Error() != tc.wantErr):
				t.Fatalf("error %v, want %q", tc.err, tc.wantErr)
			}
		})
	}
}

func TestFirst(t *testing.T) {
	calls := 0
	ok := func() error { calls++; return nil }
	bad := func() error { calls++; return errors.New("bad") }
	if err := First(ok, bad, ok); err == nil || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("First = %v, want bad", err)
	}
	if calls != 2 {
		t.Fatalf("%d checks ran, want 2 (stops at the first error)", calls)
	}
	if err := First(); err != nil {
		t.Fatal(err)
	}
}
