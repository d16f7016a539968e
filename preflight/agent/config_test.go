package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const exampleConfig = `
deadline: 10m
outputLimit: 2048
checks:
- name: gpus
  command: ["nvidia-smi", "-L"]
  timeout: 30s
  match: '^GPU \d+:'
  minMatches: 8
- name: dcgm
  command: ["dcgmi", "diag", "-r", "1"]
  timeout: 5m
- name: disk
  command: ["sh", "-c", "dd if=/dev/zero of=/mnt/scratch/preflight bs=1M count=64 oflag=direct && rm /mnt/scratch/preflight"]
  timeout: 1m
- name: dns
  command: ["getent", "hosts", "kubernetes.default.svc.cluster.local"]
  timeout: 10s
`

func TestParseConfigExample(t *testing.T) {
	c, err := parseConfig([]byte(exampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	if c.Deadline != 10*time.Minute || c.OutputLimit != 2048 || len(c.Checks) != 4 {
		t.Fatalf("config = deadline %s, outputLimit %d, %d checks; want 10m, 2048, 4", c.Deadline, c.OutputLimit, len(c.Checks))
	}
	gpus := c.Checks[0]
	if gpus.Name != "gpus" || gpus.Timeout != 30*time.Second || gpus.MinMatches != 8 || gpus.Match.String() != `^GPU \d+:` {
		t.Errorf("checks[0] = %+v", gpus)
	}
	if got := strings.Join(c.Checks[1].Command, " "); got != "dcgmi diag -r 1" {
		t.Errorf("checks[1].command = %q", got)
	}
	if c.Checks[1].Match != nil || c.Checks[1].MinMatches != 0 {
		t.Errorf("checks[1] has a match without one configured: %+v", c.Checks[1])
	}
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig([]byte(`
checks:
- name: a
  command: ["true"]
  timeout: 30s
  match: ok
- name: b
  command: ["true"]
  timeout: 1m
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.OutputLimit != defaultOutputLimit {
		t.Errorf("outputLimit = %d, want the default %d", c.OutputLimit, defaultOutputLimit)
	}
	if want := 90 * time.Second; c.Deadline != want {
		t.Errorf("deadline = %s, want the sum of the timeouts %s", c.Deadline, want)
	}
	if c.Checks[0].MinMatches != 1 {
		t.Errorf("minMatches = %d, want 1 when match is set", c.Checks[0].MinMatches)
	}
}

func TestParseConfigRejectsBadFields(t *testing.T) {
	// yamlCheck builds one check's YAML from "key: value" lines, two-space indented.
	yamlCheck := func(lines ...string) string {
		return "- " + strings.Join(lines, "\n  ") + "\n"
	}
	good := yamlCheck(`name: ok`, `command: ["true"]`, `timeout: 1s`)
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"not YAML", "checks: [", "parse YAML"},
		{"unknown field", "checks:\n" + yamlCheck(`name: a`, `command: ["true"]`, `timeout: 1s`, `timout: 2s`), `unknown field "timout"`},
		{"no checks", "deadline: 1m\n", "checks: at least one check is required"},
		{"missing name", "checks:\n" + yamlCheck(`command: ["true"]`, `timeout: 1s`), "checks[0].name: required"},
		{"bad name", "checks:\n" + yamlCheck(`name: "gpu check"`, `command: ["true"]`, `timeout: 1s`), `checks[0].name: must be at most 63 letters, digits, '.', '_' or '-', starting and ending with a letter or digit, got "gpu check"`},
		{"duplicate name", "checks:\n" + good + good, `checks[1].name: duplicate name "ok" (also checks[0].name)`},
		{"empty command", "checks:\n" + good + yamlCheck(`name: b`, `command: []`, `timeout: 1s`), "checks[1].command: must not be empty"},
		{"missing command", "checks:\n" + yamlCheck(`name: b`, `timeout: 1s`), "checks[0].command: must not be empty"},
		{"empty program", "checks:\n" + yamlCheck(`name: b`, `command: ["", "x"]`, `timeout: 1s`), `checks[0].command[0]: the program must not be empty, got ["" "x"]`},
		{"missing timeout", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`), "checks[0].timeout: required"},
		{"zero timeout", "checks:\n" + good + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 0s`), `checks[1].timeout: must be positive, got "0s"`},
		{"negative timeout", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: -5s`), `checks[0].timeout: must be positive, got "-5s"`},
		{"bad timeout", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: soon`), `checks[0].timeout: invalid duration "soon"`},
		{"number timeout", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 30`), `checks[0].timeout: invalid duration "30"`},
		{"bad regexp", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `match: "("`), `checks[0].match: invalid regexp "(": error parsing regexp: missing closing ): ` + "`(`"},
		{"minMatches without match", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `minMatches: 8`), "checks[0].minMatches: set to 8 without match"},
		{"zero minMatches", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `match: x`, `minMatches: 0`), "checks[0].minMatches: must be at least 1, got 0"},
		{"bad deadline", "deadline: tomorrow\nchecks:\n" + good, `deadline: invalid duration "tomorrow"`},
		{"zero deadline", "deadline: 0s\nchecks:\n" + good, `deadline: must be positive, got "0s"`},
		{"deadline shorter than a timeout", "deadline: 1m\nchecks:\n" + good + yamlCheck(`name: dcgm`, `command: ["true"]`, `timeout: 5m`),
			`deadline: "1m" is shorter than checks[1].timeout "5m" (dcgm)`},
		{"zero outputLimit", "outputLimit: 0\nchecks:\n" + good, "outputLimit: must be between 1 and 65536, got 0"},
		{"huge outputLimit", "outputLimit: 1000000\nchecks:\n" + good, "outputLimit: must be between 1 and 65536, got 1000000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConfig([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("parseConfig accepted it: %+v", c)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseConfigReportsEveryError(t *testing.T) {
	_, err := parseConfig([]byte(`
checks:
- name: a
  command: []
  timeout: 0s
- name: a
  command: ["true"]
  timeout: 1s
  match: "["
`))
	if err == nil {
		t.Fatal("parseConfig accepted it")
	}
	for _, want := range []string{"checks[0].command", "checks[0].timeout", "checks[1].name: duplicate", "checks[1].match"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v\nwant it to mention %q", err, want)
		}
	}
}

func TestLoadConfigNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	if _, err := loadConfig(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("err = %v, want one naming %s", err, missing)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("checks: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "checks: at least one") {
		t.Errorf("err = %v, want one naming %s and the field", err, bad)
	}
}
