// Package docs holds the documentation's tests: every link between the
// repository's pages resolves, and every test the guarantees name exists.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const root = ".."

// markdown returns the repository's markdown files (not the caches).
func markdown(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	linkRE    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile("(?m)^#{1,6} (.+)$")
	fenceRE   = regexp.MustCompile("(?ms)^```.*?^```")
)

// anchors are a page's heading anchors, as GitHub makes them.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	text = fenceRE.ReplaceAllString(text, "")
	for _, m := range headingRE.FindAllStringSubmatch(text, -1) {
		out[slug(m[1])] = true
	}
	return out
}

func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(title)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestLinksResolve (#43): every relative link of every page names a file
// that exists, and an anchor that page has.
func TestLinksResolve(t *testing.T) {
	pages := map[string]map[string]bool{}
	read := func(path string) (map[string]bool, error) {
		if a, ok := pages[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		pages[path] = anchors(string(b))
		return pages[path], nil
	}
	for _, page := range markdown(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := fenceRE.ReplaceAllString(string(b), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if regexp.MustCompile(`^[a-z]+:`).MatchString(target) {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), filepath.FromSlash(path))
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %s: %v", page, target, err)
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			a, err := read(file)
			if err != nil {
				t.Fatal(err)
			}
			if !a[frag] {
				t.Errorf("%s: link %s: %s has no heading #%s", page, target, file, frag)
			}
		}
	}
}

// TestGuaranteesNameRealTests (#43): every test docs/guarantees.md names
// exists (TestX, or a prefix TestX… of one), so a guarantee never rests on
// a test that was renamed or removed.
func TestGuaranteesNameRealTests(t *testing.T) {
	b, err := os.ReadFile("guarantees.md")
	if err != nil {
		t.Fatal(err)
	}
	var funcs []string
	funcRE := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range funcRE.FindAllStringSubmatch(string(src), -1) {
				funcs = append(funcs, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`Test[A-Za-z0-9_]+(…)?`).FindAllString(string(b), -1)
	if len(named) == 0 {
		t.Fatal("docs/guarantees.md names no test")
	}
	for _, n := range named {
		prefix, isPrefix := strings.CutSuffix(n, "…")
		found := false
		for _, f := range funcs {
			if f == n || isPrefix && strings.HasPrefix(f, prefix) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("docs/guarantees.md names %s, which no test is", n)
		}
	}
}
