package main

import (
	"strings"
	"testing"
)

// TestSummary: a plain go test's output from the JSON stream (a failed
// test's output in full, a passed one's never, the package lines), and
// the slowest top-level tests.
func TestSummary(t *testing.T) {
	events := []event{
		{Action: "run", Package: "p", Test: "TestA"},
		{Action: "output", Package: "p", Test: "TestA", Output: "=== RUN   TestA\n"},
		{Action: "output", Package: "p", Test: "TestA", Output: "    a_test.go:1: quiet\n"},
		{Action: "run", Package: "p", Test: "TestB"},
		{Action: "output", Package: "p", Test: "TestB", Output: "    b_test.go:9: boom\n"},
		{Action: "run", Package: "p", Test: "TestB/sub"},
		{Action: "output", Package: "p", Test: "TestB/sub", Output: "        sub: ok\n"},
		{Action: "pass", Package: "p", Test: "TestB/sub", Elapsed: 50},
		{Action: "output", Package: "p", Test: "TestA", Output: "--- PASS: TestA (2.00s)\n"},
		{Action: "pass", Package: "p", Test: "TestA", Elapsed: 2},
		{Action: "output", Package: "p", Test: "TestB", Output: "--- FAIL: TestB (7.00s)\n"},
		{Action: "fail", Package: "p", Test: "TestB", Elapsed: 7},
		{Action: "run", Package: "p", Test: "TestC"},
		{Action: "output", Package: "p", Test: "TestC", Output: "    c_test.go:3: hung here\n"},
		{Action: "output", Package: "p", Output: "main: control plane up\n"},
		{Action: "output", Package: "p", Output: "FAIL\tp\t9.1s\n"},
		{Action: "fail", Package: "p"},
		{Action: "output", Package: "q", Output: "q: quiet TestMain\n"},
		{Action: "output", Package: "q", Output: "PASS\n"},
		{Action: "output", Package: "q", Output: "ok  \tq\t1.0s\n"},
		{Action: "pass", Package: "q"},
	}
	var out strings.Builder
	s := newSummary(&out)
	for _, e := range events {
		s.add(e)
	}
	s.flush()
	s.slowest(1)
	got := out.String()
	for _, want := range []string{"b_test.go:9: boom\n--- FAIL: TestB (7.00s)\n", "FAIL\tp\t9.1s\n", "main: control plane up\n", "ok  \tq\t1.0s\n", "c_test.go:3: hung here", "slowest tests (of 2; 9s of test time in all):\n     7.0s  p TestB FAILED\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"quiet", "sub: ok", "PASS: TestA", "TestA\n", "PASS\n"} {
		if strings.Contains(got, not) {
			t.Errorf("output has %q, from a test that passed:\n%s", not, got)
		}
	}
}
