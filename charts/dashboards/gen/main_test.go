package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestWrite: gen writes every dashboard, reports what it changed, removes
// JSON no dashboard writes, and with --check changes nothing.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	stray := filepath.Join(dir, "old.json")
	if err := os.WriteFile(stray, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed, err := write(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"arm.json", "balloons.json", "capacity-requests.json", "health.json", "overview.json", "preflight.json", "smoothing.json", "old.json (removed)"}
	if !slices.Equal(changed, want) {
		t.Fatalf("--check on an empty dir reported %v, want %v", changed, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "arm.json")); err == nil {
		t.Fatal("--check wrote a file")
	}
	if _, err := write(dir, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stray); err == nil {
		t.Error("a JSON file no dashboard writes was kept")
	}
	if changed, err := write(dir, true); err != nil || len(changed) != 0 {
		t.Errorf("after writing, --check reports %v, %v", changed, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "arm.json"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, _ := write(dir, true); !slices.Equal(changed, []string{"arm.json"}) {
		t.Errorf("a hand-edited file: --check reports %v, want [arm.json]", changed)
	}
}
