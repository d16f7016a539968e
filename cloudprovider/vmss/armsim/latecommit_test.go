package armsim

import (
	"context"
	"net/http"
	"slices"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
)

// TestCommitLateFault: an update answered 500 under FaultCommitLate is not
// visible to the requests about the scale set that follow it (Fault.Lag of
// them, 1 by default), and lands just before the next one, or at Advance.
func TestCommitLateFault(t *testing.T) {
	type step struct {
		do   string // "get", "list", "patch" (to 4, If-Match the last read ETag), "advance" or "peek" (no request)
		want int    // capacity for get, list and peek; HTTP status for patch
	}
	tests := []struct {
		name string
		lag  int
		// refusedFirst sends an update with a stale ETag before the
		// faulty one: it is answered 412 and takes no fault.
		refusedFirst bool
		steps        []step
	}{
		{"default lag: the read-back sees the old size, the next request the new", 0, false,
			[]step{{"peek", 1}, {"get", 1}, {"peek", 1}, {"get", 3}}},
		{"lag 2", 2, false,
			[]step{{"get", 1}, {"get", 1}, {"get", 3}}},
		{"a write after the read-back meets the landed change: 412", 0, false,
			[]step{{"get", 1}, {"patch", http.StatusPreconditionFailed}, {"get", 3}}},
		{"a list of the resource group counts as a request about it", 0, false,
			[]step{{"list", 1}, {"list", 3}}},
		{"Advance lands it without a request", 5, false,
			[]step{{"peek", 1}, {"advance", 0}, {"peek", 3}}},
		{"an update refused on its If-Match takes no fault", 0, true,
			[]step{{"get", 1}, {"get", 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 1})
			ctx := context.Background()
			if err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultCommitLate, Count: 1, Lag: tt.lag}); err != nil {
				t.Fatal(err)
			}
			etag := env.state(t, "pool").ETag
			if tt.refusedFirst {
				_, err := env.scaleTo(ctx, "pool", 3, to.Ptr(`"0"`))
				if re := responseError(t, err); re.StatusCode != http.StatusPreconditionFailed {
					t.Fatalf("stale If-Match: status %d, want 412", re.StatusCode)
				}
			}
			_, err := env.scaleTo(ctx, "pool", 3, &etag)
			if re := responseError(t, err); re.StatusCode != http.StatusInternalServerError || re.ErrorCode != "InternalServerError" {
				t.Fatalf("late update: %d %s, want 500 InternalServerError", re.StatusCode, re.ErrorCode)
			}
			for i, st := range tt.steps {
				got := 0
				switch st.do {
				case "get":
					s, err := env.sets.Get(ctx, testRG, "pool", nil)
					if err != nil {
						t.Fatalf("step %d: Get: %v", i, err)
					}
					got, etag = int(*s.SKU.Capacity), *s.Etag
				case "list":
					page, err := env.sets.NewListPager(testRG, nil).NextPage(ctx)
					if err != nil || len(page.Value) != 1 {
						t.Fatalf("step %d: list: %v, %d scale sets", i, err, len(page.Value))
					}
					got = int(*page.Value[0].SKU.Capacity)
				case "patch":
					got = http.StatusOK
					if _, err := env.scaleTo(ctx, "pool", 4, &etag); err != nil {
						got = responseError(t, err).StatusCode
					}
				case "advance":
					env.srv.Advance(ctx)
					continue
				case "peek":
					got = env.state(t, "pool").Capacity
				}
				if got != st.want {
					t.Fatalf("step %d (%s): got %d, want %d", i, st.do, got, st.want)
				}
			}
			// The write log shows what the caller sent and heard, not the
			// landing (no request).
			var statuses []int
			for _, w := range env.srv.Writes() {
				if w.Capacity == 3 {
					statuses = append(statuses, w.Status)
				}
			}
			want := []int{http.StatusInternalServerError}
			if tt.refusedFirst {
				want = []int{http.StatusPreconditionFailed, http.StatusInternalServerError}
			}
			if !slices.Equal(statuses, want) {
				t.Fatalf("writes to 3 answered %v, want %v", statuses, want)
			}
		})
	}
}

func TestInjectFaultRefusesNegativeLag(t *testing.T) {
	env := newTestEnv(t, Options{}, ScaleSetSpec{ResourceGroup: testRG, Name: "pool", SKU: "Standard_D16s_v5", Capacity: 1})
	err := env.srv.InjectFault(testRG, "pool", Fault{Kind: FaultCommitLate, Lag: -1})
	wantError(t, "InjectFault", err, "must not be negative")
	if got := FaultCommitLate.String(); got != "CommitLate" {
		t.Fatalf("String() = %q", got)
	}
}
