package app

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "write docs/reference from the code")

// TestReferencesUpToDate (#43): the flag and metric references of
// docs/reference are the code's: a flag or metric added, renamed or
// reworded without regenerating them fails here.
func TestReferencesUpToDate(t *testing.T) {
	metrics, err := MetricsReference(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"flags.md": FlagsReference(), "metrics.md": metrics} {
		path := filepath.Join("..", "..", "docs", "reference", file)
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v: run go test ./internal/app -run TestReferencesUpToDate -update", err)
		}
		if string(got) != want {
			t.Errorf("docs/reference/%s is not the code's: run go test ./internal/app -run TestReferencesUpToDate -update", file)
		}
	}
}
