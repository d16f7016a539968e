package agent

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"time"

	"sigs.k8s.io/yaml"
)

const (
	// defaultOutputLimit is how many bytes of a failing check's output are
	// kept when the config does not say.
	defaultOutputLimit = 2048
	// maxOutputLimit bounds outputLimit: the output ends up in a Node
	// annotation, and every Node's annotations share a 256 KiB budget.
	maxOutputLimit = 64 << 10
	// maxNameLength keeps check names short enough for events and logs.
	maxNameLength = 63
)

// checkName is what a check may be called: it is printed in the failure
// annotation and the event as "check <name>: ...".
var checkName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)

// checkConfig is a validated check configuration.
type checkConfig struct {
	// Deadline bounds all checks together.
	Deadline time.Duration
	// OutputLimit is how many bytes of a check's output the result keeps,
	// and the size cap of the failure annotation.
	OutputLimit int
	// Checks run in this order; the first failure stops the run.
	Checks []checkSpec
}

// checkSpec is one command the node must pass.
type checkSpec struct {
	Name    string
	Command []string
	Timeout time.Duration
	// Match, when set, must match at least MinMatches lines of the combined
	// output (besides exit code 0) for the check to pass.
	Match      *regexp.Regexp
	MinMatches int
}

// rawConfig is the YAML as written, before validation. Durations stay
// strings so that errors can quote what the user wrote; optional numbers are
// pointers so that an explicit 0 can be told from an absent field.
type rawConfig struct {
	Deadline    string     `json:"deadline,omitempty"`
	OutputLimit *int       `json:"outputLimit,omitempty"`
	Checks      []rawCheck `json:"checks"`
}

type rawCheck struct {
	Name       string   `json:"name"`
	Command    []string `json:"command"`
	Timeout    string   `json:"timeout"`
	Match      string   `json:"match,omitempty"`
	MinMatches *int     `json:"minMatches,omitempty"`
}

// loadConfig reads and validates the check configuration at path.
func loadConfig(path string) (*checkConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read checks: %w", err)
	}
	c, err := parseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("checks file %s: %w", path, err)
	}
	return c, nil
}

// parseConfig parses YAML (unknown fields are errors, to catch typos) and
// validates it. All validation errors are returned, each naming the field
// and the offending value.
func parseConfig(data []byte) (*checkConfig, error) {
	var raw rawConfig
	if err := yaml.UnmarshalStrict(data, &raw); err != nil {
		return nil, fmt.Errorf("parse YAML: %w", err)
	}
	return raw.validate()
}

func (r *rawConfig) validate() (*checkConfig, error) {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	c := &checkConfig{OutputLimit: defaultOutputLimit}
	if r.OutputLimit != nil {
		if n := *r.OutputLimit; n < 1 || n > maxOutputLimit {
			fail("outputLimit: must be between 1 and %d, got %d", maxOutputLimit, n)
		} else {
			c.OutputLimit = n
		}
	}

	if len(r.Checks) == 0 {
		fail("checks: at least one check is required")
	}
	seen := map[string]int{}
	var longest time.Duration
	longestAt := -1
	var sum time.Duration
	for i, rc := range r.Checks {
		field := fmt.Sprintf("checks[%d]", i)
		ch := checkSpec{Name: rc.Name, Command: rc.Command}

		switch {
		case rc.Name == "":
			fail("%s.name: required", field)
		case len(rc.Name) > maxNameLength || !checkName.MatchString(rc.Name):
			fail("%s.name: must be at most %d letters, digits, '.', '_' or '-', starting and ending with a letter or digit, got %q", field, maxNameLength, rc.Name)
		default:
			if j, dup := seen[rc.Name]; dup {
				fail("%s.name: duplicate name %q (also checks[%d].name)", field, rc.Name, j)
			}
			seen[rc.Name] = i
		}

		if len(rc.Command) == 0 {
			fail("%s.command: must not be empty", field)
		} else if rc.Command[0] == "" {
			fail("%s.command[0]: the program must not be empty, got %q", field, rc.Command)
		}

		if rc.Timeout == "" {
			fail("%s.timeout: required", field)
		} else if d, err := time.ParseDuration(rc.Timeout); err != nil {
			fail("%s.timeout: invalid duration %q: want a Go duration such as 30s or 5m", field, rc.Timeout)
		} else if d <= 0 {
			fail("%s.timeout: must be positive, got %q", field, rc.Timeout)
		} else {
			ch.Timeout = d
			sum += d
			if d > longest {
				longest, longestAt = d, i
			}
		}

		if rc.Match != "" {
			re, err := regexp.Compile(rc.Match)
			if err != nil {
				fail("%s.match: invalid regexp %q: %w", field, rc.Match, err)
			}
			ch.Match = re
			ch.MinMatches = 1
		}
		if rc.MinMatches != nil {
			switch n := *rc.MinMatches; {
			case rc.Match == "":
				fail("%s.minMatches: set to %d without match", field, n)
			case n < 1:
				fail("%s.minMatches: must be at least 1, got %d", field, n)
			default:
				ch.MinMatches = n
			}
		}
		c.Checks = append(c.Checks, ch)
	}

	if r.Deadline == "" {
		c.Deadline = sum
	} else if d, err := time.ParseDuration(r.Deadline); err != nil {
		fail("deadline: invalid duration %q: want a Go duration such as 10m", r.Deadline)
	} else if d <= 0 {
		fail("deadline: must be positive, got %q", r.Deadline)
	} else if longestAt >= 0 && d < longest {
		fail("deadline: %q is shorter than checks[%d].timeout %q (%s), which could then never run to its timeout",
			r.Deadline, longestAt, r.Checks[longestAt].Timeout, r.Checks[longestAt].Name)
	} else {
		c.Deadline = d
	}

	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}
