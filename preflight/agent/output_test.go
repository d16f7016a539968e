package agent

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCaptureCountsMatchesAcrossWrites(t *testing.T) {
	c := newCapture(&checkSpec{Match: regexp.MustCompile(`^GPU \d+:`)})
	// Lines split at every possible place across writes.
	text := "GPU 0: a\nGPU 1: b\r\nnot a GPU 2: c\nGPU 3: d"
	for i := 0; i < len(text); i += 3 {
		if _, err := c.Write([]byte(text[i:min(i+3, len(text))])); err != nil {
			t.Fatal(err)
		}
	}
	c.finish()
	if c.lines.matches != 3 {
		t.Errorf("matches = %d, want 3", c.lines.matches)
	}
	if got := string(c.output()); got != text {
		t.Errorf("output = %q, want %q", got, text)
	}
}

func TestCaptureKeepsBoundedTail(t *testing.T) {
	c := newCapture(&checkSpec{Match: regexp.MustCompile(`^line`)})
	var all bytes.Buffer
	for i := 0; i < 20000; i++ {
		line := "line " + strings.Repeat("x", i%50) + "\n"
		all.WriteString(line)
		if _, err := c.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if len(c.tail) > 2*captureCap {
			t.Fatalf("after %d bytes the capture holds %d, more than %d", all.Len(), len(c.tail), 2*captureCap)
		}
	}
	c.finish()
	if c.lines.matches != 20000 {
		t.Errorf("matches = %d, want 20000: every line counts, kept or not", c.lines.matches)
	}
	if c.total != int64(all.Len()) {
		t.Errorf("total = %d, want %d", c.total, all.Len())
	}
	if want := all.Bytes()[all.Len()-captureCap:]; !bytes.Equal(c.output(), want) {
		t.Errorf("output is not the last %d bytes written", captureCap)
	}
}

func TestCaptureLongLineMatchesOnItsBeginning(t *testing.T) {
	c := newCapture(&checkSpec{Match: regexp.MustCompile(`^GPU 0:.*x$`)})
	line := "GPU 0: " + strings.Repeat("x", 3*maxLineLength)
	if _, err := c.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	c.finish()
	if c.lines.matches != 1 || cap(c.line) > 2*maxLineLength {
		t.Errorf("matches = %d (want 1), line buffer %d bytes (want at most %d)", c.lines.matches, cap(c.line), 2*maxLineLength)
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		limit      int
		tail, head string
	}{
		{"fits", "hello", 5, "hello", "hello"},
		{"cut", "hello, world", 8, ellipsis + "world", "hello" + ellipsis},
		{"rune boundaries", "ééééé", 8, ellipsis + "éé", "éé" + ellipsis},
		{"invalid UTF-8 replaced", "a\xffb", 10, "a\uFFFDb", "a\uFFFDb"},
		{"limit below the ellipsis", "hello", 2, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tail, head := truncateTail(tc.in, tc.limit), truncateHead(tc.in, tc.limit)
			if tail != tc.tail || head != tc.head {
				t.Fatalf("truncateTail = %q, truncateHead = %q; want %q, %q", tail, head, tc.tail, tc.head)
			}
			for _, s := range []string{tail, head} {
				if len(s) > tc.limit || !utf8.ValidString(s) {
					t.Errorf("%q: longer than %d bytes or invalid UTF-8", s, tc.limit)
				}
			}
		})
	}
}
