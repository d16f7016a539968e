package cloudprovider

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxGroupSize bounds a node group's configured max (flags and tags): a
// guard against typos. What a scale set can really hold (1,000 VMs, fewer
// with a managed custom image or a single placement group) is applied by
// the provider, which clamps the max to it and says so.
const MaxGroupSize = 100000

// NodeGroupSpec is one --nodes=min:max:name flag.
type NodeGroupSpec struct {
	Min, Max int
	Name     string
}

// ParseNodeGroupSpec parses "min:max:name". Errors name the flag and value.
func ParseNodeGroupSpec(s string) (NodeGroupSpec, error) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return NodeGroupSpec{}, fmt.Errorf("--nodes=%q: want min:max:name", s)
	}
	min, err := strconv.Atoi(parts[0])
	if err != nil || min < 0 {
		return NodeGroupSpec{}, fmt.Errorf("--nodes=%q: min %q is not a non-negative integer", s, parts[0])
	}
	max, err := strconv.Atoi(parts[1])
	if err != nil || max < 0 {
		return NodeGroupSpec{}, fmt.Errorf("--nodes=%q: max %q is not a non-negative integer", s, parts[1])
	}
	if min > max {
		return NodeGroupSpec{}, fmt.Errorf("--nodes=%q: min %d is greater than max %d", s, min, max)
	}
	if max == 0 {
		return NodeGroupSpec{}, fmt.Errorf("--nodes=%q: max must be at least 1", s)
	}
	if max > MaxGroupSize {
		return NodeGroupSpec{}, fmt.Errorf("--nodes=%q: max %d is above %d", s, max, MaxGroupSize)
	}
	name := strings.TrimSpace(parts[2])
	if name == "" || strings.ContainsAny(name, " /:") {
		return NodeGroupSpec{}, fmt.Errorf("--nodes=%q: name %q must be a scale set name (no spaces, '/' or ':')", s, parts[2])
	}
	return NodeGroupSpec{Min: min, Max: max, Name: name}, nil
}

// ParseNodeGroupSpecs parses every --nodes flag and rejects duplicates.
func ParseNodeGroupSpecs(specs []string) ([]NodeGroupSpec, error) {
	seen := map[string]bool{}
	out := make([]NodeGroupSpec, 0, len(specs))
	for _, s := range specs {
		sp, err := ParseNodeGroupSpec(s)
		if err != nil {
			return nil, err
		}
		key := strings.ToLower(sp.Name)
		if seen[key] {
			return nil, fmt.Errorf("--nodes=%q: node group %s is given twice", s, sp.Name)
		}
		seen[key] = true
		out = append(out, sp)
	}
	return out, nil
}
