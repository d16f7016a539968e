package cloudprovider

import (
	"fmt"
	"strings"
	"testing"
)

// --nodes comes from the flags file and the live flags ConfigMap, which
// more people may edit than may run the binary.
func FuzzParseNodeGroupSpec(f *testing.F) {
	for _, s := range []string{"0:10:gpu", "5:2:gpu", "0:1001:gpu", "-1:2:g", "0:0:g", "::", "0:9999999999999999999999:g", "1:2: a/b", "0:8:rg/gpu", "0:8:/", "0:8:a/b/c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := ParseNodeGroupSpec(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--nodes=") {
				t.Fatalf("ParseNodeGroupSpec(%q): error %q does not name the flag", s, err)
			}
			return
		}
		if sp.Min < 0 || sp.Max < 1 || sp.Min > sp.Max || sp.Max > MaxGroupSize || sp.Name == "" || strings.ContainsAny(sp.Name, " /:") ||
			strings.ContainsAny(sp.ResourceGroup, " /:") {
			t.Fatalf("ParseNodeGroupSpec(%q) = %+v: out of range", s, sp)
		}
		again := fmt.Sprintf("%d:%d:%s", sp.Min, sp.Max, sp.Target())
		if back, err := ParseNodeGroupSpec(again); err != nil || back != sp {
			t.Fatalf("ParseNodeGroupSpec(%q) = %+v; its own form %q parses to %+v, %v", s, sp, again, back, err)
		}
	})
}
