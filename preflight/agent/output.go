package agent

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

const (
	// captureCap is how much of a check's combined output is kept in
	// memory: the last captureCap bytes. Checks such as DCGM diagnostics can
	// print megabytes; the end is where the error is.
	captureCap = 64 << 10
	// maxLineLength bounds the line buffer used for matching; a longer line
	// is matched on its first maxLineLength bytes.
	maxLineLength = 64 << 10
	// ellipsis marks truncated text.
	ellipsis = "…"
)

// capture is the writer a check's stdout and stderr share. It keeps the
// last captureCap bytes and applies the check's line rules (match and its
// thresholds, mustNotMatch) as the output streams by, so that memory stays
// bounded however much the check prints and every line is judged. Not safe
// for concurrent writes; the runner has a single reader feeding it.
type capture struct {
	rules *checkSpec // nil: no line rules
	lines lineStats
	total int64  // bytes written
	tail  []byte // the last bytes written (at most 2×captureCap before trimming)
	line  []byte // the current, unterminated line (at most maxLineLength)
}

// lineStats is what the line rules saw.
type lineStats struct {
	matches int // lines matching Match
	// values out of [Min, Max] (or not numbers) among the matches, and the
	// first such line and its value
	violations     int
	firstViolation string
	violationValue string
	// lines matching MustNotMatch, and the first
	forbidden      int
	firstForbidden string
}

// quotedLineLimit bounds a line quoted in a failure reason.
const quotedLineLimit = 200

func newCapture(rules *checkSpec) *capture {
	if rules != nil && rules.Match == nil && rules.MustNotMatch == nil {
		rules = nil
	}
	return &capture{rules: rules}
}

// Write never fails.
func (c *capture) Write(p []byte) (int, error) {
	c.total += int64(len(p))
	c.tail = append(c.tail, p...)
	if len(c.tail) > 2*captureCap {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-captureCap:]...)
	}
	if c.rules == nil {
		return len(p), nil
	}
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			c.addToLine(rest)
			break
		}
		c.addToLine(rest[:i])
		c.endLine()
		rest = rest[i+1:]
	}
	return len(p), nil
}

func (c *capture) addToLine(p []byte) {
	if room := maxLineLength - len(c.line); room < len(p) {
		p = p[:max(room, 0)]
	}
	c.line = append(c.line, p...)
}

func (c *capture) endLine() {
	c.lines.observe(c.rules, bytes.TrimSuffix(c.line, []byte("\r")))
	c.line = c.line[:0]
}

// observe applies the rules to one line of output.
func (s *lineStats) observe(r *checkSpec, line []byte) {
	if r.MustNotMatch != nil && r.MustNotMatch.Match(line) {
		if s.forbidden == 0 {
			s.firstForbidden = truncateHead(string(line), quotedLineLimit)
		}
		s.forbidden++
	}
	switch {
	case r.Match == nil:
	case !r.hasThreshold():
		if r.Match.Match(line) {
			s.matches++
		}
	default:
		s.observeValue(r, line)
	}
}

// observeValue counts a line matching the rules' Match, and the number
// it captures if out of [Min, Max] or not a number.
func (s *lineStats) observeValue(r *checkSpec, line []byte) {
	m := r.Match.FindSubmatch(line)
	if m == nil {
		return
	}
	s.matches++
	raw := string(m[r.ValueGroup])
	v, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	if err == nil && !math.IsNaN(v) && r.inRange(v) {
		return
	}
	if s.violations == 0 {
		s.firstViolation = truncateHead(string(line), quotedLineLimit)
		s.violationValue = truncateHead(raw, quotedLineLimit)
	}
	s.violations++
}

// inRange says v is within the check's Min and Max (those set).
func (c *checkSpec) inRange(v float64) bool {
	return (c.Min == nil || v >= *c.Min) && (c.Max == nil || v <= *c.Max)
}

// finish judges a last line that has no newline. Call it once, after the
// last Write.
func (c *capture) finish() {
	if c.rules != nil && len(c.line) > 0 {
		c.endLine()
	}
}

// verdict judges the output of a check that exited 0: forbidden lines
// first, then numbers out of range, then too few matches. It returns an
// empty failure when the output passes.
func (s *lineStats) verdict(r *checkSpec) (failure, string) {
	switch {
	case r.MustNotMatch != nil && s.forbidden > 0:
		return failForbidden, fmt.Sprintf("%d %s matched mustNotMatch '%s', the first: %q",
			s.forbidden, plural(s.forbidden, "line", "lines"), r.MustNotMatch, s.firstForbidden)
	case r.hasThreshold() && s.violations > 0:
		return failThreshold, fmt.Sprintf("%d of %d %s matching '%s' out of range (%s), the first: value %q in %q",
			s.violations, s.matches, plural(s.matches, "line", "lines"), r.Match, rangeText(r.Min, r.Max), s.violationValue, s.firstViolation)
	case r.Match != nil && s.matches < r.MinMatches:
		return failNoMatch, fmt.Sprintf("%d %s matched '%s', want %d", s.matches, plural(s.matches, "line", "lines"), r.Match, r.MinMatches)
	}
	return "", ""
}

// rangeText says what a threshold wants: "want at least 180", "want at
// most 0", "want between 1 and 2".
func rangeText(lo, hi *float64) string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	switch {
	case lo != nil && hi != nil:
		return fmt.Sprintf("want between %s and %s", f(*lo), f(*hi))
	case lo != nil:
		return "want at least " + f(*lo)
	default:
		return "want at most " + f(*hi)
	}
}

// output returns the kept output, the last captureCap bytes.
func (c *capture) output() []byte {
	if len(c.tail) > captureCap {
		return c.tail[len(c.tail)-captureCap:]
	}
	return c.tail
}

// truncateTail returns s as valid UTF-8 in at most limit bytes, keeping its
// end (where a failing command's error usually is) behind an ellipsis.
func truncateTail(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= limit {
		return s
	}
	if limit <= len(ellipsis) {
		return ""
	}
	i := len(s) - (limit - len(ellipsis))
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return ellipsis + s[i:]
}

// truncateHead returns s as valid UTF-8 in at most limit bytes, keeping its
// beginning.
func truncateHead(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= limit {
		return s
	}
	if limit <= len(ellipsis) {
		return ""
	}
	i := limit - len(ellipsis)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + ellipsis
}
