// Command gen writes the chart's Grafana dashboards, built in Go by
// package dashboards, as JSON files into a directory (go generate passes
// charts/vmss-autoscaler/dashboards) and removes JSON files there that no
// dashboard writes any more. With --check it changes nothing and fails if
// the directory is not what it would write.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/vmss-autoscaler/vmss-autoscaler/charts/dashboards"
)

func main() {
	dir := flag.String("dir", "charts/vmss-autoscaler/dashboards", "directory of the dashboards' JSON files")
	check := flag.Bool("check", false, "only report files that differ from what would be written")
	flag.Parse()
	stale, err := write(*dir, *check)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	if *check && len(stale) > 0 {
		fmt.Fprintf(os.Stderr, "gen: out of date in %s: %v; run go generate ./charts/dashboards\n", *dir, stale)
		os.Exit(1)
	}
}

// write renders the dashboards into dir (unless check) and returns the
// files that were, or would have been, written or removed.
func write(dir string, check bool) ([]string, error) {
	files, err := dashboards.Render()
	if err != nil {
		return nil, err
	}
	changed, err := writeChanged(dir, files, check)
	if err != nil {
		return nil, err
	}
	removed, err := removeStale(dir, files, check)
	if err != nil {
		return nil, err
	}
	return append(changed, removed...), nil
}

// writeChanged writes the files whose content in dir differs (unless
// check) and returns their names, sorted.
func writeChanged(dir string, files map[string][]byte, check bool) ([]string, error) {
	var changed []string
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		path := filepath.Join(dir, name)
		old, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		if bytes.Equal(old, files[name]) {
			continue
		}
		changed = append(changed, name)
		if !check {
			if err := os.WriteFile(path, files[name], 0o644); err != nil {
				return nil, fmt.Errorf("writing %s: %w", path, err)
			}
		}
	}
	return changed, nil
}

// removeStale removes the dashboards of dir that files no longer has
// (unless check) and names each "<name> (removed)".
func removeStale(dir string, files map[string][]byte, check bool) ([]string, error) {
	existing, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, path := range existing {
		if _, ok := files[filepath.Base(path)]; ok {
			continue
		}
		removed = append(removed, filepath.Base(path)+" (removed)")
		if !check {
			if err := os.Remove(path); err != nil {
				return nil, fmt.Errorf("removing %s: %w", path, err)
			}
		}
	}
	return removed, nil
}
