// Command complexity is the lint's complexity ratchet (#43): it computes
// each function's cyclomatic complexity from go/ast (gocyclo's rule: one,
// plus one per if, for, range, non-default case or select clause, && and
// ||; closures count toward the function that holds them) and fails when
// a function is above the threshold and not in the baseline, or above its
// baseline value: the functions listed may only shrink, and no new one
// joins them. -write records the current offenders as the new baseline.
//
//	go run ./cmd/complexity -over 15 -baseline .complexity-baseline .
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "complexity:", err)
		os.Exit(1)
	}
}

// Func is one function's complexity, keyed "package/dir:Recv.Name" (the
// package's directory, so moving a function between the files of its
// package keeps its key).
type Func struct {
	Key        string
	Complexity int
}

func run(args []string, out io.Writer) error {
	fl := flag.NewFlagSet("complexity", flag.ContinueOnError)
	over := fl.Int("over", 15, "the threshold: a function above it must be in the baseline, at most at its value there")
	baseline := fl.String("baseline", ".complexity-baseline", "file of the functions allowed above the threshold: one \"key complexity\" a line")
	write := fl.Bool("write", false, "write the current offenders as the baseline instead of checking")
	list := fl.Int("list", -1, "print every function above this complexity, most complex first, and check nothing")
	maxShare := fl.Float64("max-share", 100, "the most functions above 10 may be, in percent of all; more fails")
	if err := fl.Parse(args); err != nil {
		return err
	}
	roots := fl.Args()
	if len(roots) == 0 {
		roots = []string{"."}
	}
	funcs, err := measureAll(roots)
	if err != nil {
		return err
	}
	if *list >= 0 {
		printAbove(out, funcs, *list)
		return nil
	}
	offenders := above(funcs, *over)
	above10 := len(above(funcs, 10))
	share := 100 * float64(above10) / float64(max(1, len(funcs)))
	fmt.Fprintf(out, "%d functions, %d (%.1f %%) above 10, %d above %d\n", len(funcs), above10, share, len(offenders), *over)
	if *write {
		return writeBaseline(*baseline, offenders)
	}
	if share > *maxShare {
		return fmt.Errorf("%.1f %% of the functions are above complexity 10, more than -max-share %g %%: split some (-list 10 prints them)", share, *maxShare)
	}
	allowed, err := readBaseline(*baseline)
	if err != nil {
		return err
	}
	if bad := baselineViolations(offenders, allowed, *over); len(bad) > 0 {
		return errors.New(strings.Join(bad, "\n"))
	}
	return nil
}

// measureAll measures the functions under each root.
func measureAll(roots []string) ([]Func, error) {
	var funcs []Func
	for _, root := range roots {
		fs, err := Measure(root)
		if err != nil {
			return nil, err
		}
		funcs = append(funcs, fs...)
	}
	return funcs, nil
}

// above are the functions above threshold, in their order.
func above(funcs []Func, threshold int) []Func {
	var out []Func
	for _, f := range funcs {
		if f.Complexity > threshold {
			out = append(out, f)
		}
	}
	return out
}

// baselineViolations says which offenders (above over) are not in the
// baseline allowed, or above their value there.
func baselineViolations(offenders []Func, allowed map[string]int, over int) []string {
	var bad []string
	for _, f := range offenders {
		limit, ok := allowed[f.Key]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s: complexity %d, above %d: split it (a new function may not join the baseline)", f.Key, f.Complexity, over))
		case f.Complexity > limit:
			bad = append(bad, fmt.Sprintf("%s: complexity %d, above its baseline %d: the listed functions may only shrink", f.Key, f.Complexity, limit))
		}
	}
	return bad
}

// Measure returns the complexity of every function of the non-test Go
// files under root, skipping hidden and testdata directories.
func Measure(root string) ([]Func, error) {
	var out []Func
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skippedDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !isSourceFile(d.Name()) {
			return nil
		}
		funcs, err := measureFile(fset, root, path)
		out = append(out, funcs...)
		return err
	})
	return out, err
}

// skippedDir says Measure does not enter a directory of this name:
// hidden, testdata, vendor.
func skippedDir(name string) bool {
	return strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor"
}

// isSourceFile says a file of this name is non-test Go.
func isSourceFile(name string) bool {
	return strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go")
}

// measureFile returns the complexity of the functions of the file at
// path, keyed by its directory relative to root.
func measureFile(fset *token.FileSet, root, path string) ([]Func, error) {
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	rel, _ := filepath.Rel(root, path)
	var out []Func
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		out = append(out, Func{Key: filepath.ToSlash(filepath.Dir(rel)) + ":" + funcName(fd), Complexity: Complexity(fd.Body)})
	}
	return out, nil
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	for {
		switch v := t.(type) {
		case *ast.StarExpr:
			t = v.X
			continue
		case *ast.IndexExpr:
			t = v.X
			continue
		case *ast.IndexListExpr:
			t = v.X
			continue
		}
		break
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// Complexity is gocyclo's cyclomatic complexity of a body.
func Complexity(body ast.Node) int {
	c := 1
	ast.Inspect(body, func(n ast.Node) bool {
		switch v := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if v.List != nil {
				c++
			}
		case *ast.CommClause:
			if v.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if v.Op == token.LAND || v.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

func readBaseline(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the baseline: %w", err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, v, ok := strings.Cut(line, " ")
		c, err := strconv.Atoi(strings.TrimSpace(v))
		if !ok || err != nil {
			return nil, fmt.Errorf("%s:%d: %q is not \"key complexity\"", path, n, line)
		}
		out[key] = c
	}
	return out, sc.Err()
}

func writeBaseline(path string, offenders []Func) error {
	sort.Slice(offenders, func(i, j int) bool { return offenders[i].Key < offenders[j].Key })
	var b strings.Builder
	b.WriteString("# Functions allowed above the complexity threshold (cmd/complexity, make lint):\n# each may only shrink; split one and run `go run ./cmd/complexity -write` to lower the list.\n")
	for _, f := range offenders {
		fmt.Fprintf(&b, "%s %d\n", f.Key, f.Complexity)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// printAbove prints the functions above threshold, most complex first.
func printAbove(out io.Writer, funcs []Func, threshold int) {
	sorted := slices.Clone(funcs)
	slices.SortStableFunc(sorted, func(a, b Func) int { return b.Complexity - a.Complexity })
	for _, f := range sorted {
		if f.Complexity > threshold {
			fmt.Fprintf(out, "%d %s\n", f.Complexity, f.Key)
		}
	}
}
