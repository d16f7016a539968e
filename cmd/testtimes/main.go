// Command testtimes runs `go test -json` and prints what a plain `go test`
// prints (each package's result line and the whole output of the tests
// that failed, never that of those that passed), then the slowest tests,
// so that every run of make test says what each e2e test costs. The JSON
// stream is kept in a file for a closer look.
//
//	go run ./cmd/testtimes -json-out .cache/e2e.json -slowest 20 -- go test -json ./e2e/...
//
// It exits with the test command's status.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// summary reads events and prints the plain output to out.
type summary struct {
	out io.Writer
	// pending holds the output of each running test until its result:
	// printed if it failed, dropped if it passed.
	pending map[[2]string][]string
	times   []testTime
}

type testTime struct {
	pkg, test string
	took      time.Duration
	failed    bool
}

func newSummary(out io.Writer) *summary {
	return &summary{out: out, pending: map[[2]string][]string{}}
}

func (s *summary) add(e event) {
	key := [2]string{e.Package, e.Test}
	if e.Test == "" {
		s.addPackage(key, e)
		return
	}
	s.addTest(key, e)
}

// addPackage records a package's event: its result line is printed; the
// rest (TestMain's output, build errors, PASS/FAIL) only if the package
// fails.
func (s *summary) addPackage(key [2]string, e event) {
	switch {
	case e.Action == "output":
		if isResultLine(e.Output) {
			fmt.Fprint(s.out, e.Output)
		} else {
			s.pending[key] = append(s.pending[key], e.Output)
		}
	case e.Action == "fail":
		s.printPending(key)
	case e.Action == "pass" || e.Action == "skip":
		delete(s.pending, key)
	}
}

// addTest records a test's event: its output, printed only if it fails,
// and the time of a top-level test that ended.
func (s *summary) addTest(key [2]string, e event) {
	switch {
	case e.Action == "output":
		s.pending[key] = append(s.pending[key], e.Output)
	case e.Action == "pass" || e.Action == "skip":
		delete(s.pending, key)
		if e.Action == "pass" && !strings.Contains(e.Test, "/") {
			s.times = append(s.times, testTime{pkg: e.Package, test: e.Test, took: secs(e.Elapsed)})
		}
	case e.Action == "fail":
		s.printPending(key)
		if !strings.Contains(e.Test, "/") {
			s.times = append(s.times, testTime{pkg: e.Package, test: e.Test, took: secs(e.Elapsed), failed: true})
		}
	}
}

// printPending prints and forgets the output kept for key.
func (s *summary) printPending(key [2]string) {
	for _, line := range s.pending[key] {
		fmt.Fprint(s.out, line)
	}
	delete(s.pending, key)
}

// flush prints the output of tests that never ended (a timeout's panic
// kills the binary mid-test): what they said is what explains it.
func (s *summary) flush() {
	keys := make([][2]string, 0, len(s.pending))
	for k := range s.pending {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		fmt.Fprintf(s.out, "--- output of %s %s, which did not end:\n", k[0], k[1])
		for _, line := range s.pending[k] {
			fmt.Fprint(s.out, line)
		}
	}
}

// slowest prints the n slowest top-level tests and their share of the sum.
func (s *summary) slowest(n int) {
	if n <= 0 || len(s.times) == 0 {
		return
	}
	sort.SliceStable(s.times, func(i, j int) bool { return s.times[i].took > s.times[j].took })
	var total time.Duration
	for _, t := range s.times {
		total += t.took
	}
	fmt.Fprintf(s.out, "slowest tests (of %d; %s of test time in all):\n", len(s.times), total.Round(time.Second))
	for _, t := range s.times[:min(n, len(s.times))] {
		mark := ""
		if t.failed {
			mark = " FAILED"
		}
		fmt.Fprintf(s.out, "  %6.1fs  %s %s%s\n", t.took.Seconds(), shortPkg(t.pkg), t.test, mark)
	}
}

// isResultLine says whether a package-level line is go test's result for
// the package ("ok  \tpkg\t1.2s", "FAIL\tpkg\t…", "?   \tpkg\t[no test files]").
func isResultLine(line string) bool {
	for _, p := range []string{"ok  \t", "FAIL\t", "?   \t"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

func shortPkg(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

func main() {
	jsonOut := flag.String("json-out", "", "file to keep the JSON stream in (\"\": not kept)")
	n := flag.Int("slowest", 20, "how many of the slowest tests to print")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "testtimes: no test command given (e.g. -- go test -json ./e2e/...)")
		os.Exit(2)
	}
	os.Exit(run(flag.Args(), *jsonOut, *n))
}

func run(args []string, jsonOut string, n int) int {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testtimes: %v\n", err)
		return 2
	}
	var keep io.Writer = io.Discard
	if jsonOut != "" {
		f, err := os.Create(jsonOut)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testtimes: keeping the JSON stream: %v\n", err)
			return 2
		}
		defer f.Close()
		keep = f
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testtimes: starting %s: %v\n", args[0], err)
		return 2
	}
	s := newSummary(os.Stdout)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		fmt.Fprintf(keep, "%s\n", line)
		var e event
		if json.Unmarshal(line, &e) != nil {
			fmt.Println(string(line)) // not JSON: go test's own message
			continue
		}
		s.add(e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "testtimes: reading the test output: %v\n", err)
	}
	err = cmd.Wait()
	s.flush()
	s.slowest(n)
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode()
	case err != nil:
		fmt.Fprintf(os.Stderr, "testtimes: %v\n", err)
		return 2
	}
	return 0
}
