package balloon

import (
	"strings"
	"testing"
)

// --warm-pool comes from the flags file and the live flags ConfigMap.
func FuzzParsePolicies(f *testing.F) {
	for _, s := range []string{"gpu:4", "gpu:10%", "gpu:10%:2", "gpu:10%:2:8", "gpu:10%:9:2", "gpu:-1", "gpu:0.0001%", ":3", "gpu:999999999999999999999", "a b:1", "gpu:NaN%"} {
		f.Add(s, 100)
	}
	f.Fuzz(func(t *testing.T, v string, size int) {
		pols, err := ParsePolicies("--warm-pool", []string{v})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--warm-pool: ") {
				t.Fatalf("ParsePolicies(%q): error %q does not name the flag", v, err)
			}
			return
		}
		for group, p := range pols {
			if group == "" {
				t.Fatalf("ParsePolicies(%q): empty group accepted", v)
			}
			if p.Fixed < 0 || p.Fixed > MaxWarmNodes || p.Min < 0 || p.Min > MaxWarmNodes || p.Max < 0 || p.Max > MaxWarmNodes || (p.Max > 0 && p.Min > p.Max) {
				t.Fatalf("ParsePolicies(%q) = %+v: out of range", v, p)
			}
			if p.Proportional && !(p.Ratio > 0 && p.Ratio <= 1) {
				t.Fatalf("ParsePolicies(%q): ratio %v accepted", v, p.Ratio)
			}
			n := p.WarmTarget(size)
			if n < 0 || (p.Max > 0 && n > p.Max) || (!p.Proportional && n != p.Fixed) {
				t.Fatalf("%q.WarmTarget(%d) = %d", v, size, n)
			}
			if p.Proportional && size >= 0 && size <= MaxWarmNodes && n > max(size, p.Min) {
				t.Fatalf("%q.WarmTarget(%d) = %d: more than the group and the minimum", v, size, n)
			}
		}
	})
}
