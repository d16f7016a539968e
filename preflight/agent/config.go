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
	c := &checkConfig{}
	n, err := r.outputLimit()
	if err != nil {
		errs = append(errs, err)
	}
	c.OutputLimit = n
	if err := checkCount(len(r.Checks)); err != nil {
		errs = append(errs, err)
	}
	seen := map[string]int{}
	var longest, sum time.Duration
	longestAt := -1
	for i := range r.Checks {
		ch, chErrs := r.Checks[i].validate(i, seen)
		errs = append(errs, chErrs...)
		if ch.Timeout > longest {
			longest, longestAt = ch.Timeout, i
		}
		sum += ch.worstCase()
		c.Checks = append(c.Checks, ch)
	}
	d, err := r.deadline(sum, longest, longestAt)
	if err != nil {
		errs = append(errs, err)
	}
	c.Deadline = d
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// outputLimit is outputLimit as written, else the default (also with
// the error of a value out of bounds).
func (r *rawConfig) outputLimit() (int, error) {
	if r.OutputLimit == nil {
		return defaultOutputLimit, nil
	}
	if n := *r.OutputLimit; n < 1 || n > maxOutputLimit {
		return defaultOutputLimit, fmt.Errorf("outputLimit: must be between 1 and %d, got %d", maxOutputLimit, n)
	}
	return *r.OutputLimit, nil
}

// checkCount checks that there are n checks, at least one, at most
// maxChecks.
func checkCount(n int) error {
	if n == 0 {
		return errors.New("checks: at least one check is required")
	}
	if n > maxChecks {
		return fmt.Errorf("checks: at most %d checks, got %d", maxChecks, n)
	}
	return nil
}

// deadline is the run's deadline: as written, else the checks' worst case
// (sum). It must leave the longest timeout, checks[longestAt]'s, room to
// run.
func (r *rawConfig) deadline(sum, longest time.Duration, longestAt int) (time.Duration, error) {
	if r.Deadline == "" {
		if sum > maxDeadline {
			return 0, fmt.Errorf("deadline: the checks' worst case (every timeout and retry) is %s, above %s: set a deadline", sum, maxDeadline)
		}
		return sum, nil
	}
	d, err := time.ParseDuration(r.Deadline)
	switch {
	case err != nil:
		return 0, fmt.Errorf("deadline: invalid duration %q: want a Go duration such as 10m", r.Deadline)
	case d <= 0:
		return 0, fmt.Errorf("deadline: must be positive, got %q", r.Deadline)
	case d > maxDeadline:
		return 0, fmt.Errorf("deadline: must be at most %s, got %q", maxDeadline, r.Deadline)
	case longestAt >= 0 && d < longest:
		return 0, fmt.Errorf("deadline: %q is shorter than checks[%d].timeout %q (%s), which could then never run to its timeout",
			r.Deadline, longestAt, r.Checks[longestAt].Timeout, r.Checks[longestAt].Name)
	}
	return d, nil
}

// validate checks the i-th check (seen holds the names of those before
// it, by index) and returns its spec with what is valid of it.
func (rc *rawCheck) validate(i int, seen map[string]int) (checkSpec, []error) {
	var errs []error
	field := fmt.Sprintf("checks[%d]", i)
	ch := checkSpec{Name: rc.Name, Command: rc.Command}
	if err := rc.validateName(field, i, seen); err != nil {
		errs = append(errs, err)
	}
	if err := rc.validateCommand(field); err != nil {
		errs = append(errs, err)
	}
	d, err := rc.timeout(field)
	if err != nil {
		errs = append(errs, err)
	}
	ch.Timeout = d
	errs = append(errs, rc.validateOutputRules(field, &ch)...)
	errs = append(errs, rc.validateRetries(field, &ch)...)
	return ch, errs
}

// validateName checks the name: required, well-formed, and unique (seen
// records it at i).
func (rc *rawCheck) validateName(field string, i int, seen map[string]int) error {
	if rc.Name == "" {
		return fmt.Errorf("%s.name: required", field)
	}
	if len(rc.Name) > maxNameLength || !checkName.MatchString(rc.Name) {
		return fmt.Errorf("%s.name: must be at most %d letters, digits, '.', '_' or '-', starting and ending with a letter or digit, got %q", field, maxNameLength, rc.Name)
	}
	j, dup := seen[rc.Name]
	seen[rc.Name] = i
	if dup {
		return fmt.Errorf("%s.name: duplicate name %q (also checks[%d].name)", field, rc.Name, j)
	}
	return nil
}

// validateCommand checks that the command names a program.
func (rc *rawCheck) validateCommand(field string) error {
	if len(rc.Command) == 0 {
		return fmt.Errorf("%s.command: must not be empty", field)
	}
	if rc.Command[0] == "" {
		return fmt.Errorf("%s.command[0]: the program must not be empty, got %q", field, rc.Command)
	}
	return nil
}

// timeout is the check's timeout: required, positive, at most
// maxCheckTimeout (0 with the error otherwise).
func (rc *rawCheck) timeout(field string) (time.Duration, error) {
	if rc.Timeout == "" {
		return 0, fmt.Errorf("%s.timeout: required", field)
	}
	d, err := time.ParseDuration(rc.Timeout)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s.timeout: invalid duration %q: want a Go duration such as 30s or 5m", field, rc.Timeout)
	case d <= 0:
		return 0, fmt.Errorf("%s.timeout: must be positive, got %q", field, rc.Timeout)
	case d > maxCheckTimeout:
		return 0, fmt.Errorf("%s.timeout: must be at most %s, got %q", field, maxCheckTimeout, rc.Timeout)
	}
	return d, nil
}

// validateOutputRules checks match, minMatches, min, max and mustNotMatch
// and sets them on ch.
func (rc *rawCheck) validateOutputRules(field string, ch *checkSpec) []error {
	errs := rc.validateMatch(field, ch)
	errs = append(errs, rc.validateThresholds(field, ch)...)
	if rc.MustNotMatch != "" {
		re, err := regexp.Compile(rc.MustNotMatch)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.mustNotMatch: invalid regexp %q: %w", field, rc.MustNotMatch, err))
		}
		ch.MustNotMatch = re
	}
	return errs
}

// validateMatch checks match and minMatches and sets them on ch.
func (rc *rawCheck) validateMatch(field string, ch *checkSpec) []error {
	var errs []error
	if rc.Match != "" {
		re, err := regexp.Compile(rc.Match)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.match: invalid regexp %q: %w", field, rc.Match, err))
		}
		ch.Match = re
		ch.MinMatches = 1
	}
	if rc.MinMatches != nil {
		switch n := *rc.MinMatches; {
		case rc.Match == "":
			errs = append(errs, fmt.Errorf("%s.minMatches: set to %d without match", field, n))
		case n < 1 || n > maxMinMatches:
			errs = append(errs, fmt.Errorf("%s.minMatches: must be between 1 and %d, got %d", field, maxMinMatches, n))
		default:
			ch.MinMatches = n
		}
	}
	return errs
}

// validateThresholds checks min and max, sets them on ch, and finds the
// group of match that captures the number they bound.
func (rc *rawCheck) validateThresholds(field string, ch *checkSpec) []error {
	errs := rc.parseBounds(field, ch)
	if ch.Min != nil && ch.Max != nil && *ch.Min > *ch.Max {
		errs = append(errs, fmt.Errorf("%s.min: %v is greater than max %v", field, *ch.Min, *ch.Max))
	}
	if ch.hasThreshold() && ch.Match != nil {
		if i, ok := valueGroup(ch.Match); ok {
			ch.ValueGroup = i
		} else {
			errs = append(errs, fmt.Errorf("%s.match: min/max compare the number match captures, but %q has no capture group: write one such as ([0-9.]+)", field, rc.Match))
		}
	}
	return errs
}

// parseBounds parses min and max, each a number that needs match, into
// ch.
func (rc *rawCheck) parseBounds(field string, ch *checkSpec) []error {
	var errs []error
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
			errs = append(errs, fmt.Errorf("%s.%s: want a number, got %s", field, b.name, b.raw))
		case rc.Match == "":
			errs = append(errs, fmt.Errorf("%s.%s: set to %s without match (whose capture group holds the number)", field, b.name, b.raw))
		default:
			*b.dst = &v
		}
	}
	return errs
}

// valueGroup is the group of re that captures the number: the one named
// "value", else the first; false when re has none.
func valueGroup(re *regexp.Regexp) (int, bool) {
	if i := re.SubexpIndex("value"); i > 0 {
		return i, true
	}
	if re.NumSubexp() >= 1 {
		return 1, true
	}
	return 0, false
}

// validateRetries checks retries and retryDelay and sets them on ch.
func (rc *rawCheck) validateRetries(field string, ch *checkSpec) []error {
	var errs []error
	if err := rc.validateRetryCount(field, ch); err != nil {
		errs = append(errs, err)
	}
	if ch.Retries > 0 {
		ch.RetryDelay = defaultRetryDelay
	}
	if err := rc.validateRetryDelay(field, ch); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// validateRetryCount checks retries, a whole number up to maxRetries, and
// sets it on ch.
func (rc *rawCheck) validateRetryCount(field string, ch *checkSpec) error {
	if rc.Retries == nil {
		return nil
	}
	n, err := strconv.Atoi(string(rc.Retries))
	if err != nil || n < 0 || n > maxRetries {
		return fmt.Errorf("%s.retries: must be a whole number between 0 and %d, got %s", field, maxRetries, rc.Retries)
	}
	ch.Retries = n
	return nil
}

// validateRetryDelay checks retryDelay, which needs retries, and sets it
// on ch.
func (rc *rawCheck) validateRetryDelay(field string, ch *checkSpec) error {
	if rc.RetryDelay == "" {
		return nil
	}
	d, err := time.ParseDuration(rc.RetryDelay)
	switch {
	case err != nil:
		return fmt.Errorf("%s.retryDelay: invalid duration %q: want a Go duration such as 10s", field, rc.RetryDelay)
	case d < 0 || d > maxRetryDelay:
		return fmt.Errorf("%s.retryDelay: must be between 0s and %s, got %q", field, maxRetryDelay, rc.RetryDelay)
	case ch.Retries == 0:
		return fmt.Errorf("%s.retryDelay: set to %q without retries", field, rc.RetryDelay)
	}
	ch.RetryDelay = d
	return nil
}
