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

// NodeGroupSpec is one --nodes=min:max:name (or min:max:rg/name) flag.
type NodeGroupSpec struct {
	Min, Max int
	// ResourceGroup is the resource group the flag names the scale set in
	// ("rg/name"), "" when it gives the name alone. A name alone must be
	// unambiguous: scale sets of one name in several resource groups are
	// each named with theirs.
	ResourceGroup string
	Name          string
}

// Target is the scale set as the flag names it: "name" or "rg/name".
func (sp NodeGroupSpec) Target() string {
	if sp.ResourceGroup == "" {
		return sp.Name
	}
	return sp.ResourceGroup + "/" + sp.Name
}

// ParseNodeGroupSpec parses "min:max:name" or "min:max:rg/name". Errors
// name the flag and value.
func ParseNodeGroupSpec(s string) (NodeGroupSpec, error) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return NodeGroupSpec{}, fmt.Errorf("--nodes=%q: want min:max:name or min:max:resource-group/name", s)
	}
	min, max, err := parseGroupSizes(s, parts[0], parts[1])
	if err != nil {
		return NodeGroupSpec{}, err
	}
	rg, name, err := parseGroupTarget(s, parts[2])
	if err != nil {
		return NodeGroupSpec{}, err
	}
	return NodeGroupSpec{Min: min, Max: max, ResourceGroup: rg, Name: name}, nil
}

// parseGroupSizes parses the min and max of --nodes=s: non-negative, min
// at most max, max from 1 to MaxGroupSize.
func parseGroupSizes(s, minText, maxText string) (min, max int, err error) {
	min, err = strconv.Atoi(minText)
	if err != nil || min < 0 {
		return 0, 0, fmt.Errorf("--nodes=%q: min %q is not a non-negative integer", s, minText)
	}
	max, err = strconv.Atoi(maxText)
	if err != nil || max < 0 {
		return 0, 0, fmt.Errorf("--nodes=%q: max %q is not a non-negative integer", s, maxText)
	}
	if min > max {
		return 0, 0, fmt.Errorf("--nodes=%q: min %d is greater than max %d", s, min, max)
	}
	if max == 0 {
		return 0, 0, fmt.Errorf("--nodes=%q: max must be at least 1", s)
	}
	if max > MaxGroupSize {
		return 0, 0, fmt.Errorf("--nodes=%q: max %d is above %d", s, max, MaxGroupSize)
	}
	return min, max, nil
}

// parseGroupTarget parses the scale set of --nodes=s, "name" or
// "rg/name"; rg is "" for a name alone.
func parseGroupTarget(s, text string) (rg, name string, err error) {
	target := strings.TrimSpace(text)
	rg, name, qualified := strings.Cut(target, "/")
	if !qualified {
		rg, name = "", target
	}
	if name == "" || strings.ContainsAny(name, " /:") {
		return "", "", fmt.Errorf("--nodes=%q: name %q must be a scale set name (no spaces, '/' or ':'), "+
			"or a resource group and one (resource-group/name)", s, text)
	}
	if qualified && (rg == "" || strings.ContainsAny(rg, " :")) {
		return "", "", fmt.Errorf("--nodes=%q: resource group %q of scale set %s must be a resource group name (no spaces, '/' or ':')", s, rg, name)
	}
	return rg, name, nil
}

// ParseNodeGroupSpecs parses every --nodes flag and rejects duplicates: a
// scale set given twice, or a name given alone and with a resource group
// (rg1/gpu and rg2/gpu are two node groups; gpu and rg1/gpu are one given
// twice, or an ambiguous one).
func ParseNodeGroupSpecs(specs []string) ([]NodeGroupSpec, error) {
	seen := map[string]string{}   // lower-case target -> flag value
	byName := map[string]string{} // lower-case name -> a flag value naming it
	out := make([]NodeGroupSpec, 0, len(specs))
	for _, s := range specs {
		sp, err := ParseNodeGroupSpec(s)
		if err != nil {
			return nil, err
		}
		key, name := strings.ToLower(sp.Target()), strings.ToLower(sp.Name)
		if prev, dup := seen[key]; dup {
			return nil, fmt.Errorf("--nodes=%q: node group %s is given twice (also --nodes=%q)", s, sp.Target(), prev)
		}
		if prev, ok := byName[name]; ok && (sp.ResourceGroup == "" || seen[name] != "") {
			return nil, fmt.Errorf("--nodes=%q: scale set name %s is given alone and with a resource group (also --nodes=%q): "+
				"give each scale set of that name with its resource group", s, sp.Name, prev)
		}
		seen[key], byName[name] = s, s
		out = append(out, sp)
	}
	return out, nil
}
