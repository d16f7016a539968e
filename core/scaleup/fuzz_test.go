package scaleup

import (
	"strings"
	"testing"
)

// The priority expander's ConfigMap is read live: whoever may edit it
// must not be able to crash the loop.
func FuzzParsePriorities(f *testing.F) {
	f.Add("10:\n  - .*gpu.*\n1:\n  - .*\n", "gpu-h100")
	f.Add("x:\n  - a\n", "a")
	f.Add("10:\n  - '('\n", "a")
	f.Add("99999999999999999999:\n  - a\n", "a")
	f.Add("- a\n", "")
	f.Fuzz(func(t *testing.T, data, group string) {
		p, err := ParsePriorities(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "priorities: ") {
				t.Fatalf("ParsePriorities(%q): error %q does not say it is the priorities", data, err)
			}
			return
		}
		prio, ok := p.PriorityOf(group)
		// The highest matching priority wins: no level above it matches.
		for _, l := range p.levels {
			if ok && l.priority <= prio {
				break
			}
			for _, re := range l.res {
				if re.MatchString(group) {
					t.Fatalf("PriorityOf(%q) = %d, %v, but priority %d matches it", group, prio, ok, l.priority)
				}
			}
		}
	})
}
