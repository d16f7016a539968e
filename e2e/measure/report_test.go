package measure

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		v        any
		markdown string
		wantJSON string
		wantErr  string
	}{
		{"a report", struct {
			Size  string  `json:"size"`
			Usage []Usage `json:"usage"`
		}{"ci", []Usage{{PeakRSSMiB: 2, CPUSeconds: 1}}}, "# report\n",
			"{\n  \"size\": \"ci\",\n  \"usage\": [\n    {\n      \"peakRSSMiB\": 2,\n      \"cpuSeconds\": 1\n    }\n  ]\n}\n", ""},
		{"not JSON", func() {}, "", "", "unsupported type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			err := WriteReport(dir, tc.v, tc.markdown)
			if wantedErr(t, err, tc.wantErr) {
				return
			}
			for name, want := range map[string]string{"report.json": tc.wantJSON, "report.md": tc.markdown} {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil || string(b) != want {
					t.Errorf("%s: %q, %v; want %q", name, b, err, want)
				}
			}
		})
	}
	if err := WriteReport(filepath.Join(t.TempDir(), "missing"), 1, ""); err == nil || !strings.Contains(err.Error(), "writing report.json") {
		t.Errorf("a missing folder: %v", err)
	}
}
