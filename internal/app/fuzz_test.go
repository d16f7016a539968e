package app

import (
	"testing"

	"github.com/spf13/pflag"
)

// The flags YAML is the --config file and the live flags ConfigMap, read
// by every replica on every edit: no content may crash it.
func FuzzFlagsYAML(f *testing.F) {
	f.Add([]byte("scan-interval: 10s\nnodes:\n  - 0:10:gpu\nwarm-pool: [gpu:10%:1:4]\nexpander: priority,least-waste\n"))
	f.Add([]byte("scan-interval: 9999999h\n"))
	f.Add([]byte("nodes: {a: b}\n"))
	f.Add([]byte("max-nodes-total: 1e400\npreflight-taint: ':'\n"))
	f.Add([]byte("config: x\nazure-cache-ttl: 0s\n"))
	f.Add([]byte("- a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var p providerFlags
		c, _, err := parseConfigFrom(nil, func(fs *pflag.FlagSet) { p.register(fs) }, data, "fuzz")
		if err != nil {
			return
		}
		// What is accepted passes validation again (no state leaks between
		// the parse and the check).
		if err := c.core.Validate(); err != nil {
			t.Fatalf("accepted %q, but its options do not validate: %v", data, err)
		}
	})
}
