package balloon

import (
	"reflect"
	"strings"
	"testing"
)

func TestWarmTarget(t *testing.T) {
	pct := func(percent float64, minN, maxN int) Policy {
		return Policy{Proportional: true, Ratio: percent / 100, Min: minN, Max: maxN}
	}
	for _, tc := range []struct {
		name   string
		policy Policy
		size   int
		want   int
	}{
		{"fixed", Policy{Fixed: 3}, 100, 3},
		{"fixed ignores size", Policy{Fixed: 3}, 0, 3},
		{"fixed zero", Policy{Fixed: 0}, 50, 0},
		{"fixed negative is zero", Policy{Fixed: -2}, 50, 0},
		{"zero value is fixed zero", Policy{}, 50, 0},
		{"exact", pct(10, 0, 0), 100, 10},
		{"rounds up", pct(10, 0, 0), 101, 11},
		{"rounds up a sliver", pct(10, 0, 0), 1, 1},
		{"binary fraction is not rounded up: 10% of 30", pct(10, 0, 0), 30, 3},
		{"binary fraction: 7% of 100", pct(7, 0, 0), 100, 7},
		{"binary fraction: 30% of 70", pct(30, 0, 0), 70, 21},
		{"fractional percent", pct(12.5, 0, 0), 8, 1},
		{"fractional percent rounds up", pct(12.5, 0, 0), 9, 2},
		{"100%", pct(100, 0, 0), 40, 40},
		{"zero size", pct(10, 0, 0), 0, 0},
		{"zero size raised to min", pct(10, 1, 0), 0, 1},
		{"negative size counts as zero", pct(10, 2, 0), -5, 2},
		{"below min", pct(10, 5, 20), 20, 5},
		{"within bounds", pct(10, 1, 20), 150, 15},
		{"above max", pct(10, 1, 20), 1000, 20},
		{"max 0 is no bound", pct(10, 1, 0), 10000, 1000},
		{"min equals max", pct(50, 4, 4), 100, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.policy.WarmTarget(tc.size); got != tc.want {
				t.Fatalf("%+v.WarmTarget(%d) = %d, want %d", tc.policy, tc.size, got, tc.want)
			}
		})
	}
}

func TestParsePolicies(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   map[string]Policy
	}{
		{"none", nil, map[string]Policy{}},
		{"fixed", []string{"gpu-a100:2"}, map[string]Policy{"gpu-a100": {Fixed: 2}}},
		{"fixed zero", []string{"gpu:0"}, map[string]Policy{"gpu": {Fixed: 0}}},
		{"percent", []string{"gpu:10%"}, map[string]Policy{"gpu": {Proportional: true, Ratio: 0.1}}},
		{"percent and min", []string{"gpu:10%:1"}, map[string]Policy{"gpu": {Proportional: true, Ratio: 0.1, Min: 1}}},
		{"percent, min and max", []string{"gpu-h100:10%:1:20"}, map[string]Policy{"gpu-h100": {Proportional: true, Ratio: 0.1, Min: 1, Max: 20}}},
		{"fractional percent", []string{"gpu:2.5%"}, map[string]Policy{"gpu": {Proportional: true, Ratio: 0.025}}},
		{"100 percent", []string{"gpu:100%:0:8"}, map[string]Policy{"gpu": {Proportional: true, Ratio: 1, Max: 8}}},
		{"min equals max", []string{"gpu:10%:3:3"}, map[string]Policy{"gpu": {Proportional: true, Ratio: 0.1, Min: 3, Max: 3}}},
		{"mixed case and dots (VMSS names)", []string{"H100Pool:1", "pool.b_2:5%"}, map[string]Policy{
			"H100Pool": {Fixed: 1}, "pool.b_2": {Proportional: true, Ratio: 0.05}}},
		{"several groups", []string{"a:1", "b:20%:2:10"}, map[string]Policy{
			"a": {Fixed: 1}, "b": {Proportional: true, Ratio: 0.2, Min: 2, Max: 10}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePolicies("--warm-pool", tc.values)
			if err != nil {
				t.Fatalf("ParsePolicies(%q) = %v", tc.values, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParsePolicies(%q) = %+v, want %+v", tc.values, got, tc.want)
			}
		})
	}
}

func TestParsePoliciesErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		values  []string
		wantErr string
	}{
		{"no colon", []string{"gpu"}, `--warm-pool: "gpu": want <group>:<count> or <group>:<percent>%[:<min>[:<max>]]`},
		{"empty", []string{""}, `--warm-pool: "": want <group>:<count>`},
		{"empty group", []string{":2"}, `--warm-pool: ":2": empty node group`},
		{"group not a label value", []string{"gpu pool:2"}, `--warm-pool: "gpu pool:2": node group "gpu pool" is not a valid label value`},
		{"count not a number", []string{"gpu:abc"}, `--warm-pool: "gpu:abc": count must be an integer between 0 and 100000`},
		{"count empty", []string{"gpu:"}, `--warm-pool: "gpu:": count must be an integer between 0 and 100000`},
		{"count negative", []string{"gpu:-1"}, `--warm-pool: "gpu:-1": count must be an integer between 0 and 100000`},
		{"count fractional", []string{"gpu:1.5"}, `--warm-pool: "gpu:1.5": count must be an integer between 0 and 100000`},
		{"bounds on a count", []string{"gpu:2:1:3"}, `--warm-pool: "gpu:2:1:3": min and max apply only to a percent`},
		{"percent not a number", []string{"gpu:ten%"}, `--warm-pool: "gpu:ten%": percent must be a number in (0, 100]`},
		{"percent empty", []string{"gpu:%"}, `--warm-pool: "gpu:%": percent must be a number in (0, 100]`},
		{"percent zero", []string{"gpu:0%"}, `--warm-pool: "gpu:0%": percent must be a number in (0, 100]`},
		{"percent negative", []string{"gpu:-5%"}, `--warm-pool: "gpu:-5%": percent must be a number in (0, 100]`},
		{"percent over 100", []string{"gpu:100.5%"}, `--warm-pool: "gpu:100.5%": percent must be a number in (0, 100]`},
		{"percent NaN", []string{"gpu:NaN%"}, `--warm-pool: "gpu:NaN%": percent must be a number in (0, 100]`},
		{"percent Inf", []string{"gpu:Inf%"}, `--warm-pool: "gpu:Inf%": percent must be a number in (0, 100]`},
		{"min not a number", []string{"gpu:10%:x"}, `--warm-pool: "gpu:10%:x": min must be an integer between 0 and 100000`},
		{"min empty", []string{"gpu:10%:"}, `--warm-pool: "gpu:10%:": min must be an integer between 0 and 100000`},
		{"min negative", []string{"gpu:10%:-1:5"}, `--warm-pool: "gpu:10%:-1:5": min must be an integer between 0 and 100000`},
		{"max not a number", []string{"gpu:10%:1:x"}, `--warm-pool: "gpu:10%:1:x": max must be an integer between 1 and 100000`},
		{"max zero", []string{"gpu:10%:0:0"}, `--warm-pool: "gpu:10%:0:0": max must be an integer between 1 and 100000 (omit it for no bound)`},
		{"max negative", []string{"gpu:10%:0:-3"}, `--warm-pool: "gpu:10%:0:-3": max must be an integer between 1 and 100000`},
		{"min above max", []string{"gpu-h100:10%:20:1"}, `--warm-pool: "gpu-h100:10%:20:1": min 20 is greater than max 1`},
		{"too many fields", []string{"gpu:10%:1:2:3"}, `--warm-pool: "gpu:10%:1:2:3": too many fields`},
		{"duplicate group", []string{"gpu:1", "other:2", "gpu:10%"}, `--warm-pool: "gpu:10%": node group "gpu" already has a warm pool ("gpu:1")`},
		{"count past the bound", []string{"gpu:200000"}, `--warm-pool: "gpu:200000": count must be an integer between 0 and 100000`},
		{"max past the bound", []string{"gpu:10%:1:9999999"}, `--warm-pool: "gpu:10%:1:9999999": max must be an integer between 1 and 100000 (omit it for no bound)`},
		{"error after good values", []string{"a:1", "b:x"}, `--warm-pool: "b:x": count must be an integer between 0 and 100000`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePolicies("--warm-pool", tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParsePolicies(%q) = %v, %v; want an error containing %q", tc.values, got, err, tc.wantErr)
			}
			if got != nil {
				t.Fatalf("ParsePolicies(%q) returned %v with its error", tc.values, got)
			}
		})
	}
}

func TestParsePoliciesNamesTheFlag(t *testing.T) {
	_, err := ParsePolicies("--balloon-warm-pool", []string{"gpu:abc"})
	if err == nil || !strings.HasPrefix(err.Error(), `--balloon-warm-pool: "gpu:abc": `) {
		t.Fatalf("error %v does not start with the flag and value", err)
	}
}

func TestPolicyStringRoundTrips(t *testing.T) {
	for _, v := range []string{"g:0", "g:3", "g:10%", "g:2.5%", "g:10%:1", "g:10%:1:20", "g:10%:0:20", "g:100%:0:8"} {
		t.Run(v, func(t *testing.T) {
			ps, err := ParsePolicies("--warm-pool", []string{v})
			if err != nil {
				t.Fatal(err)
			}
			if got := "g:" + ps["g"].String(); got != v {
				t.Fatalf("String() = %q, want %q", got, v)
			}
		})
	}
}
