package measure

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// WriteReport writes a tool's report to dir: v as report.json (indented)
// and markdown as report.md.
func WriteReport(dir string, v any, markdown string) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing report.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(markdown), 0o644); err != nil {
		return fmt.Errorf("writing report.md: %w", err)
	}
	return nil
}
