package agent

import (
	"bytes"
	"regexp"
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
// last captureCap bytes and counts the lines that match a regexp as the
// output streams by, so that memory stays bounded however much the check
// prints and matches are counted over all of it. Not safe for concurrent
// writes; the runner has a single reader feeding it.
type capture struct {
	match   *regexp.Regexp // nil: no counting
	matches int
	total   int64  // bytes written
	tail    []byte // the last bytes written (at most 2×captureCap before trimming)
	line    []byte // the current, unterminated line (at most maxLineLength)
}

func newCapture(match *regexp.Regexp) *capture { return &capture{match: match} }

// Write never fails.
func (c *capture) Write(p []byte) (int, error) {
	c.total += int64(len(p))
	c.tail = append(c.tail, p...)
	if len(c.tail) > 2*captureCap {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-captureCap:]...)
	}
	if c.match == nil {
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
	line := bytes.TrimSuffix(c.line, []byte("\r"))
	if c.match.Match(line) {
		c.matches++
	}
	c.line = c.line[:0]
}

// finish counts a last line that has no newline. Call it once, after the
// last Write.
func (c *capture) finish() {
	if c.match != nil && len(c.line) > 0 {
		c.endLine()
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
