package fairshare

import (
	"fmt"
	"testing"
)

type item struct{ ns, name string }

func nsOf(x item) string { return x.ns }

// TestTake (#40): objects over the bounds are left out, the namespaces
// taking turns oldest first: 500 of one tenant, created first, leave room
// for another's newer one (before, the oldest 500 took every place), and
// what a namespace holds already counts against both bounds.
func TestTake(t *testing.T) {
	var items []item
	for i := range 500 {
		items = append(items, item{"noisy", fmt.Sprint("n", i)})
	}
	items = append(items, item{"quiet", "q0"}, item{"other", "o0"}, item{"other", "o1"})
	count := func(xs []item) map[string]int {
		c := map[string]int{}
		for _, x := range xs {
			c[x.ns]++
		}
		return c
	}
	for _, tc := range []struct {
		name          string
		perNS, total  int
		held          map[string]int
		want          map[string]int
		first         string
		leftFirstName string
	}{
		{name: "turns", perNS: 100, total: 50, want: map[string]int{"quiet": 1, "other": 2, "noisy": 47},
			first: "[{noisy n0} {quiet q0} {other o0} {noisy n1} {other o1}]", leftFirstName: "n47"},
		{name: "per namespace", perNS: 3, total: 1000, want: map[string]int{"quiet": 1, "other": 2, "noisy": 3}, leftFirstName: "n3"},
		{name: "held counts against both", perNS: 3, total: 10, held: map[string]int{"other": 2, "quiet": 3},
			want: map[string]int{"other": 1, "noisy": 3}, leftFirstName: "n3"},
		{name: "held past the total", perNS: 3, total: 2, held: map[string]int{"noisy": 3}, want: map[string]int{}, leftFirstName: "n0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kept, left := Take(items, nsOf, tc.perNS, tc.total, tc.held)
			if len(kept)+len(left) != len(items) {
				t.Fatalf("kept %d + left %d != %d", len(kept), len(left), len(items))
			}
			if got := count(kept); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("kept per namespace %v, want %v", got, tc.want)
			}
			if tc.first != "" && fmt.Sprint(kept[:5]) != tc.first {
				t.Fatalf("kept first %v, want %s: the namespaces in turns, each oldest first", kept[:5], tc.first)
			}
			if left[0].name != tc.leftFirstName {
				t.Fatalf("left first %v, want %s: the rest, oldest first", left[0], tc.leftFirstName)
			}
		})
	}
}
