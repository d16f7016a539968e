package balloon

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Policy is a node group's warm pool: how many nodes balloons keep warm.
//
// A fixed policy keeps Fixed nodes warm whatever the group's size. A
// proportional one keeps ceil(Ratio × groupSize) nodes, clamped to
// [Min, Max] (Max 0: no upper bound).
type Policy struct {
	// Proportional selects Ratio/Min/Max over Fixed.
	Proportional bool
	// Fixed is the warm-node count of a fixed policy.
	Fixed int
	// Ratio is the warm share of a proportional policy, in (0, 1].
	Ratio float64
	// Min and Max bound a proportional policy's target; Max 0 means no bound.
	Min, Max int
}

// WarmTarget is how many nodes of a group to keep warm.
//
// groupSize is the group's current target size as the cloud reports it, and
// so includes the warm nodes themselves: a 10% pool on a 100-node group is 10
// of those 100. Adding warm nodes grows the size, which grows the target;
// for a Ratio below 1 this settles (at about Ratio/(1-Ratio) warm nodes per
// busy node), but at 100% only Max (or the group's max size) stops it, so
// give a 100% pool a max. A negative groupSize counts as 0. The core still
// caps what it adds at the group's max size.
func (p Policy) WarmTarget(groupSize int) int {
	if !p.Proportional {
		return max(p.Fixed, 0)
	}
	groupSize = max(groupSize, 0)
	// Ceil with a tolerance for binary fractions: 0.1 × 30 is
	// 3.0000000000000004 in float64, and 10% of 30 nodes is 3, not 4.
	n := int(math.Ceil(p.Ratio*float64(groupSize) - 1e-9))
	n = max(n, p.Min, 0)
	if p.Max > 0 {
		n = min(n, p.Max)
	}
	return n
}

// String renders the policy in its flag form (without the group).
func (p Policy) String() string {
	if !p.Proportional {
		return strconv.Itoa(p.Fixed)
	}
	s := strconv.FormatFloat(p.Ratio*100, 'f', -1, 64) + "%"
	if p.Min != 0 || p.Max != 0 {
		s += ":" + strconv.Itoa(p.Min)
	}
	if p.Max != 0 {
		s += ":" + strconv.Itoa(p.Max)
	}
	return s
}

// PolicyFormat is the flag value's shape, for help texts.
const PolicyFormat = "<group>:<count> or <group>:<percent>%[:<min>[:<max>]]"

// ParsePolicies reads the values of a repeatable flag (flag is its name,
// e.g. "--warm-pool"), one node group each:
//
//	<group>:<count>                        fixed: gpu-a100:2
//	<group>:<percent>%[:<min>[:<max>]]     proportional: gpu-h100:10%:1:20
//
// count, min are non-negative integers; max, when given, is a positive
// integer not below min (omit it for no bound); percent is in (0, 100].
// A group may be given once. The group must be a valid label value, since
// it becomes the balloon label's value.
func ParsePolicies(flag string, values []string) (map[string]Policy, error) {
	out := make(map[string]Policy, len(values))
	seen := make(map[string]string, len(values))
	for _, v := range values {
		group, p, err := parsePolicy(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", flag, v, err)
		}
		if prev, dup := seen[group]; dup {
			return nil, fmt.Errorf("%s: %q: node group %q already has a warm pool (%q)", flag, v, group, prev)
		}
		seen[group] = v
		out[group] = p
	}
	return out, nil
}

func parsePolicy(v string) (string, Policy, error) {
	fields := strings.Split(v, ":")
	if len(fields) < 2 {
		return "", Policy{}, fmt.Errorf("want %s", PolicyFormat)
	}
	group, amount, bounds := fields[0], fields[1], fields[2:]
	if err := validateGroup(group); err != nil {
		return "", Policy{}, err
	}
	var p Policy
	var err error
	if pct, proportional := strings.CutSuffix(amount, "%"); proportional {
		p, err = parseProportional(pct, bounds)
	} else {
		p, err = parseFixed(amount, bounds)
	}
	if err != nil {
		return "", Policy{}, err
	}
	return group, p, nil
}

// validateGroup checks a policy's node group: a non-empty label value.
func validateGroup(group string) error {
	if group == "" {
		return fmt.Errorf("empty node group")
	}
	if errs := validation.IsValidLabelValue(group); len(errs) > 0 {
		return fmt.Errorf("node group %q is not a valid label value: %s", group, strings.Join(errs, "; "))
	}
	return nil
}

// parseFixed parses a fixed policy's count (it takes no bounds).
func parseFixed(amount string, bounds []string) (Policy, error) {
	if len(bounds) > 0 {
		return Policy{}, fmt.Errorf("min and max apply only to a percent (%s)", PolicyFormat)
	}
	n, err := nonNegative(amount)
	if err != nil {
		return Policy{}, fmt.Errorf("count must be an integer between 0 and %d", MaxWarmNodes)
	}
	return Policy{Fixed: n}, nil
}

// parseProportional parses a proportional policy's percent (without its
// "%") and bounds, [min[, max]].
func parseProportional(pct string, bounds []string) (Policy, error) {
	f, err := strconv.ParseFloat(pct, 64)
	if err != nil || !(f > 0 && f <= 100) {
		return Policy{}, fmt.Errorf("percent must be a number in (0, 100]")
	}
	p := Policy{Proportional: true, Ratio: f / 100}
	if p.Min, p.Max, err = parseBounds(bounds); err != nil {
		return Policy{}, err
	}
	if p.Max > 0 && p.Min > p.Max {
		return Policy{}, fmt.Errorf("min %d is greater than max %d", p.Min, p.Max)
	}
	return p, nil
}

// parseBounds parses a proportional policy's bounds, [min[, max]] (max
// 0: none given).
func parseBounds(bounds []string) (lo, hi int, err error) {
	switch {
	case len(bounds) > 2:
		return 0, 0, fmt.Errorf("too many fields: want %s", PolicyFormat)
	case len(bounds) == 2:
		if hi, err = nonNegative(bounds[1]); err != nil || hi == 0 {
			return 0, 0, fmt.Errorf("max must be an integer between 1 and %d (omit it for no bound)", MaxWarmNodes)
		}
		fallthrough
	case len(bounds) == 1:
		if lo, err = nonNegative(bounds[0]); err != nil {
			return 0, 0, fmt.Errorf("min must be an integer between 0 and %d", MaxWarmNodes)
		}
	}
	return lo, hi, nil
}

// MaxWarmNodes bounds a warm pool's count, min and max: far above any
// group (a scale set holds at most 1,000 instances).
const MaxWarmNodes = 100_000

func nonNegative(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, err
	}
	if n < 0 || n > MaxWarmNodes {
		return 0, fmt.Errorf("%d is outside [0, %d]", n, MaxWarmNodes)
	}
	return n, nil
}
