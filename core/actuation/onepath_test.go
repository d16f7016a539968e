package actuation

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// deleteCallers lists the uses of a method named DeleteNodes in one Go
// source file, as "file:line:col": calls, and method values (f :=
// g.DeleteNodes), which would be a way around the check too.
func deleteCallers(fset *token.FileSet, path string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "DeleteNodes" {
			out = append(out, fset.Position(sel.Pos()).String())
		}
		return true
	})
	return out, nil
}

// allowedDeleteCaller says whether a file (slash path from the module root)
// may call DeleteNodes: the Remover, and the cloud providers, which
// implement it and wrap one another.
func allowedDeleteCaller(rel string) bool {
	return rel == "core/actuation/remove.go" || strings.HasPrefix(rel, "cloudprovider/")
}

// TestOnlyTheRemoverDeletesMachines is the vet-style check that keeps one
// way to delete a machine: no file of the module outside the Remover and
// the providers calls DeleteNodes (tests excepted). A second path would
// delete machines without looking at their pods again.
func TestOnlyTheRemoverDeletesMachines(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		files++
		calls, err := deleteCallers(fset, path, nil)
		if err != nil {
			return err
		}
		if len(calls) > 0 && !allowedDeleteCaller(rel) {
			t.Errorf("%s calls DeleteNodes at %v: machines are deleted only through actuation.Remover, which looks at their pods again", rel, calls)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("checked only %d files: the walk missed the module", files)
	}
}

// TestDeleteCallerCheckFinds shows the check sees the ways a second path
// would be written.
func TestDeleteCallerCheckFinds(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      int
	}{
		{"a direct call", "package core\nfunc f(g G) { _ = g.DeleteNodes(ctx, ids) }", 1},
		{"through a map of groups", "package core\nfunc f() { l.byID[id].DeleteNodes(ctx, ids) }", 1},
		{"a method value", "package core\nfunc f(g G) { del := g.DeleteNodes; del(ctx, ids) }", 1},
		{"other methods", "package core\nfunc f(g G) { g.DecreaseTargetSize(ctx, -1); g.IncreaseSize(ctx, 1) }", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := deleteCallers(token.NewFileSet(), "x.go", tc.src)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.want {
				t.Fatalf("found %v, want %d", got, tc.want)
			}
		})
	}
	if allowedDeleteCaller("core/phase_scale_down.go") || !allowedDeleteCaller("core/actuation/remove.go") {
		t.Fatal("the allowed files are wrong")
	}
}
