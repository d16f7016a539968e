package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestComplexity(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int
	}{
		{"straight", "x := 1; _ = x", 1},
		{"if and else", "if a { return } else if b { return }", 3},
		{"loops", "for i := 0; i < 3; i++ {}; for range xs {}", 3},
		{"switch: cases, not default", "switch x { case 1, 2: case 3: default: }", 3},
		{"select: comms, not default", "select { case <-c: case d <- 1: default: }", 3},
		{"boolean operators", "_ = a && b || c", 3},
		{"closures count toward their function", "f := func() { if a {} }; f()", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parser.ParseFile(token.NewFileSet(), "x.go", "package x\nfunc f() {"+tc.body+"}", 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := Complexity(f.Decls[0].(*ast.FuncDecl).Body); got != tc.want {
				t.Fatalf("complexity %d, want %d", got, tc.want)
			}
		})
	}
}

// The ratchet: a function above the threshold passes only when listed,
// at most at its listed value; a new one fails, naming itself.
func TestRatchet(t *testing.T) {
	dir := t.TempDir()
	src := "package x\n\nfunc (s *S) Big(a, b, c bool) {\n\tif a {}\n\tif b {}\n\tif c {}\n}\n\ntype S struct{}\n"
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "baseline")
	for _, tc := range []struct {
		name, baseline, wantErr string
	}{
		{"listed at its value", ".:S.Big 4\n", ""},
		{"listed higher", ".:S.Big 9\n", ""},
		{"grew past its value", ".:S.Big 3\n", "above its baseline 3"},
		{"not listed", "# nothing\n", ".:S.Big: complexity 4, above 2"},
		{"malformed", ".:S.Big four\n", "is not \"key complexity\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(base, []byte(tc.baseline), 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err := run([]string{"-over", "2", "-baseline", base, dir}, &out)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one with %q", err, tc.wantErr)
			}
		})
	}
}

// TestMaxShare: the share of functions above 10 fails past -max-share.
func TestMaxShare(t *testing.T) {
	dir := t.TempDir()
	branches := strings.Repeat("\tif a {}\n", 11)
	src := "package x\n\nfunc Big(a bool) {\n" + branches + "}\n\nfunc Small() {}\n\nfunc Smaller() {}\n\nfunc Smallest() {}\n"
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "baseline")
	if err := os.WriteFile(base, []byte(".:Big 12\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		share   string
		wantErr string
	}{
		{"25", ""},
		{"100", ""},
		{"24.9", "25.0 % of the functions are above complexity 10, more than -max-share 24.9 %"},
	} {
		var out bytes.Buffer
		err := run([]string{"-over", "15", "-max-share", tc.share, "-baseline", base, dir}, &out)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("-max-share %s: error %v", tc.share, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("-max-share %s: error %v, want one with %q", tc.share, err, tc.wantErr)
		}
	}
}
