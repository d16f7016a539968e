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
		{"zero minMatches", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `match: x`, `minMatches: 0`), "checks[0].minMatches: must be between 1 and 1000000, got 0"},
		{"huge minMatches", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `match: x`, `minMatches: 2000000`), "checks[0].minMatches: must be between 1 and 1000000, got 2000000"},
		{"timeout a week", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 168h`), `checks[0].timeout: must be at most 24h0m0s, got "168h"`},
		{"deadline a month", "deadline: 720h\nchecks:\n" + good, `deadline: must be at most 168h0m0s, got "720h"`},
		{"retryDelay a day", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `retries: 2`, `retryDelay: 24h`), `checks[0].retryDelay: must be between 0s and 1h0m0s, got "24h"`},
		{"bad deadline", "deadline: tomorrow\nchecks:\n" + good, `deadline: invalid duration "tomorrow"`},
		{"zero deadline", "deadline: 0s\nchecks:\n" + good, `deadline: must be positive, got "0s"`},
		{"deadline shorter than a timeout", "deadline: 1m\nchecks:\n" + good + yamlCheck(`name: dcgm`, `command: ["true"]`, `timeout: 5m`),
			`deadline: "1m" is shorter than checks[1].timeout "5m" (dcgm)`},
		{"zero outputLimit", "outputLimit: 0\nchecks:\n" + good, "outputLimit: must be between 1 and 65536, got 0"},
		{"bad mustNotMatch", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `mustNotMatch: "Xid ("`), `checks[0].mustNotMatch: invalid regexp "Xid ("`},
		{"min without match", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `min: 180`), "checks[0].min: set to 180 without match"},
		{"max without match", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `max: 0`), "checks[0].max: set to 0 without match"},
		{"threshold without a group", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `match: 'bandwidth: \d+'`, `min: 180`),
			`checks[0].match: min/max compare the number match captures, but "bandwidth: \\d+" has no capture group`},
		{"min above max", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `match: '(\d+)'`, `min: 5`, `max: 1`), "checks[0].min: 5 is greater than max 1"},
		{"min not a number", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `match: '(\d+)'`, `min: lots`), `checks[0].min: want a number, got "lots"`},
		{"max a list", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `match: '(\d+)'`, `max: [1]`), `checks[0].max: want a number, got [1]`},
		{"negative retries", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `retries: -1`), "checks[0].retries: must be a whole number between 0 and 10, got -1"},
		{"too many retries", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `retries: 50`), "checks[0].retries: must be a whole number between 0 and 10, got 50"},
		{"fractional retries", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `retries: 1.5`), "checks[0].retries: must be a whole number between 0 and 10, got 1.5"},
		{"bad retryDelay", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `retries: 2`, `retryDelay: later`), `checks[0].retryDelay: invalid duration "later"`},
		{"negative retryDelay", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `retries: 2`, `retryDelay: -1s`), `checks[0].retryDelay: must be between 0s and 1h0m0s, got "-1s"`},
		{"retryDelay without retries", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `retryDelay: 5s`), `checks[0].retryDelay: set to "5s" without retries`},
		{"misspelt rule", "checks:\n" + yamlCheck(`name: b`, `command: ["true"]`, `timeout: 1s`, `mustNotMatches: x`), `unknown field "mustNotMatches"`},
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

func TestParseConfigOutputRulesAndRetries(t *testing.T) {
	c, err := parseConfig([]byte(`
checks:
- name: ecc
  command: ["nvidia-smi", "--query-gpu=index,ecc.mode.current,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"]
  timeout: 30s
  match: '^\d+, Enabled, (\d+)$'
  minMatches: 8
  max: 0
- name: nccl
  command: ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8"]
  timeout: 5m
  match: '^# Avg bus bandwidth\s*:\s*(?P<value>[0-9.]+)'
  min: 180.5
  retries: 2
  retryDelay: 30s
- name: xid
  command: ["dmesg"]
  timeout: 10s
  mustNotMatch: 'NVRM: Xid \(PCI:[^)]*\): (48|79),'
  retries: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	ecc, nccl, xid := c.Checks[0], c.Checks[1], c.Checks[2]
	if ecc.Max == nil || *ecc.Max != 0 || ecc.Min != nil || ecc.ValueGroup != 1 || ecc.MinMatches != 8 {
		t.Errorf("ecc = %+v, want max 0 on group 1, 8 matches", ecc)
	}
	if nccl.Min == nil || *nccl.Min != 180.5 || nccl.ValueGroup != 1 || nccl.Retries != 2 || nccl.RetryDelay != 30*time.Second {
		t.Errorf("nccl = %+v, want min 180.5 on the value group, 2 retries 30s apart", nccl)
	}
	if xid.MustNotMatch == nil || xid.Match != nil || xid.Retries != 1 || xid.RetryDelay != defaultRetryDelay {
		t.Errorf("xid = %+v, want mustNotMatch only, 1 retry after the default delay", xid)
	}
	// The default deadline covers every attempt and delay: 30s + 3×5m + 2×30s + 2×10s + 10s.
	if want := 30*time.Second + 15*time.Minute + time.Minute + 20*time.Second + 10*time.Second; c.Deadline != want {
		t.Errorf("deadline = %s, want %s", c.Deadline, want)
	}

	// A named group "value" wins over the first group.
	c, err = parseConfig([]byte("checks:\n- {name: a, command: [x], timeout: 1s, match: '^(GPU|CPU) temp (?P<value>\\d+)', max: 85}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Checks[0].ValueGroup != 2 {
		t.Errorf("value group = %d, want 2 (the group named value)", c.Checks[0].ValueGroup)
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
