package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
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
	// maxRetries bounds a check's retries: a flaky node is a faulty node.
	maxRetries = 10
	// defaultRetryDelay is the pause between attempts when retries are set
	// without retryDelay.
	defaultRetryDelay = 10 * time.Second
	// maxCheckTimeout bounds one check's timeout: DCGM level 4, the
	// slowest check of the library, defaults to 3h.
	maxCheckTimeout = 24 * time.Hour
	// maxDeadline bounds the whole run's deadline.
	maxDeadline = 7 * 24 * time.Hour
	// maxRetryDelay bounds the pause between a check's attempts.
	maxRetryDelay = time.Hour
	// maxMinMatches bounds minMatches (output is read line by line).
	maxMinMatches = 1_000_000
	// maxChecks bounds the number of checks in one configuration.
	maxChecks = 100
	// maxInterval bounds --interval of periodic checks.
	maxInterval = 7 * 24 * time.Hour
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
	// Min and Max, when set, bound the number Match captures (its group
	// named "value", else its first group) on every line it matches.
	Min, Max *float64
	// ValueGroup is the index of that group in Match; 0 without Min/Max.
	ValueGroup int
	// MustNotMatch, when set, fails the check if any line matches it.
	MustNotMatch *regexp.Regexp
	// Retries is how many times a failed check runs again, RetryDelay
	// apart, within the deadline; the last attempt decides.
	Retries    int
	RetryDelay time.Duration
}

// hasThreshold says whether the check compares a captured number.
func (c *checkSpec) hasThreshold() bool { return c.Min != nil || c.Max != nil }

// worstCase is the longest the check can take: every attempt to its
// timeout, with the delays between them.
func (c *checkSpec) worstCase() time.Duration {
	return time.Duration(c.Retries+1)*c.Timeout + time.Duration(c.Retries)*c.RetryDelay
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
	// Min, Max and Retries stay raw so that a wrong value can be quoted
	// with its field.
	Min          json.RawMessage `json:"min,omitempty"`
	Max          json.RawMessage `json:"max,omitempty"`
	MustNotMatch string          `json:"mustNotMatch,omitempty"`
	Retries      json.RawMessage `json:"retries,omitempty"`
	RetryDelay   string          `json:"retryDelay,omitempty"`
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
	} else if len(r.Checks) > maxChecks {
		fail("checks: at most %d checks, got %d", maxChecks, len(r.Checks))
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
		} else if d > maxCheckTimeout {
			fail("%s.timeout: must be at most %s, got %q", field, maxCheckTimeout, rc.Timeout)
		} else {
			ch.Timeout = d
			if d > longest {
				longest, longestAt = d, i
			}
		}

		errs = append(errs, rc.validateOutputRules(field, &ch)...)
		errs = append(errs, rc.validateRetries(field, &ch)...)
		sum += ch.worstCase()
		c.Checks = append(c.Checks, ch)
	}

	if r.Deadline == "" && sum > maxDeadline {
		fail("deadline: the checks' worst case (every timeout and retry) is %s, above %s: set a deadline", sum, maxDeadline)
	} else if r.Deadline == "" {
		c.Deadline = sum
	} else if d, err := time.ParseDuration(r.Deadline); err != nil {
		fail("deadline: invalid duration %q: want a Go duration such as 10m", r.Deadline)
	} else if d <= 0 {
		fail("deadline: must be positive, got %q", r.Deadline)
	} else if d > maxDeadline {
		fail("deadline: must be at most %s, got %q", maxDeadline, r.Deadline)
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

// validateOutputRules checks match, minMatches, min, max and mustNotMatch
// and sets them on ch.
func (rc *rawCheck) validateOutputRules(field string, ch *checkSpec) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
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
		case n < 1 || n > maxMinMatches:
			fail("%s.minMatches: must be between 1 and %d, got %d", field, maxMinMatches, n)
		default:
			ch.MinMatches = n
		}
	}
	for _, b := range []struct {
		name string
		raw  json.RawMessage
		dst  **float64
	}{{"min", rc.Min, &ch.Min}, {"max", rc.Max, &ch.Max}} {
		if b.raw == nil {
			continue
		}
		v, err := strconv.ParseFloat(string(b.raw), 64)
		switch {
		case err != nil:
			fail("%s.%s: want a number, got %s", field, b.name, b.raw)
		case rc.Match == "":
			fail("%s.%s: set to %s without match (whose capture group holds the number)", field, b.name, b.raw)
		default:
			*b.dst = &v
		}
	}
	if ch.Min != nil && ch.Max != nil && *ch.Min > *ch.Max {
		fail("%s.min: %v is greater than max %v", field, *ch.Min, *ch.Max)
	}
	if ch.hasThreshold() && ch.Match != nil {
		if i := ch.Match.SubexpIndex("value"); i > 0 {
			ch.ValueGroup = i
		} else if ch.Match.NumSubexp() >= 1 {
			ch.ValueGroup = 1
		} else {
			fail("%s.match: min/max compare the number match captures, but %q has no capture group: write one such as ([0-9.]+)", field, rc.Match)
		}
	}
	if rc.MustNotMatch != "" {
		re, err := regexp.Compile(rc.MustNotMatch)
		if err != nil {
			fail("%s.mustNotMatch: invalid regexp %q: %w", field, rc.MustNotMatch, err)
		}
		ch.MustNotMatch = re
	}
	return errs
}

// validateRetries checks retries and retryDelay and sets them on ch.
func (rc *rawCheck) validateRetries(field string, ch *checkSpec) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if rc.Retries != nil {
		if n, err := strconv.Atoi(string(rc.Retries)); err != nil || n < 0 || n > maxRetries {
			fail("%s.retries: must be a whole number between 0 and %d, got %s", field, maxRetries, rc.Retries)
		} else {
			ch.Retries = n
		}
	}
	if ch.Retries > 0 {
		ch.RetryDelay = defaultRetryDelay
	}
	if rc.RetryDelay != "" {
		d, err := time.ParseDuration(rc.RetryDelay)
		switch {
		case err != nil:
			fail("%s.retryDelay: invalid duration %q: want a Go duration such as 10s", field, rc.RetryDelay)
		case d < 0 || d > maxRetryDelay:
			fail("%s.retryDelay: must be between 0s and %s, got %q", field, maxRetryDelay, rc.RetryDelay)
		case ch.Retries == 0:
			fail("%s.retryDelay: set to %q without retries", field, rc.RetryDelay)
		default:
			ch.RetryDelay = d
		}
	}
	return errs
}
