package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/charts"
)

// libraryFixtures holds, per library check, files of its tool's real output
// format: a healthy node's and faulty ones'.
const libraryFixtures = "testdata/library"

// libraryChecks renders the chart with every library check enabled and
// returns the checks of its checks.yaml as the agent parses them.
func libraryChecks(t *testing.T) map[string]checkSpec {
	t.Helper()
	values := map[string]any{"preflight": map[string]any{"library": map[string]any{
		"infiniband": map[string]any{"enabled": true},
		"allReduce":  map[string]any{"enabled": true},
	}}}
	objs, err := charts.Render("../../charts/vmss-autoscaler", values, "vmss-autoscaler", "kube-system")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetName() != "vmss-autoscaler-preflight-checks" {
			continue
		}
		data, _ := o.Object["data"].(map[string]any)
		text, _ := data["checks.yaml"].(string)
		cfg, err := parseConfig([]byte(text))
		if err != nil {
			t.Fatalf("the agent refuses the chart's checks.yaml: %v\n%s", err, text)
		}
		out := map[string]checkSpec{}
		for _, c := range cfg.Checks {
			out[c.Name] = c
		}
		return out
	}
	t.Fatal("no ConfigMap vmss-autoscaler-preflight-checks")
	return nil
}

// TestLibraryChecks runs each check of the chart's library, exactly as the
// chart renders it and the agent parses it, through the agent's runner
// against fixtures of its tool's output: the tool is replaced by a stub of
// the same name that prints the fixture and exits with the given code, and
// records the arguments it got, which must be the command the fixtures'
// format was written for.
func TestLibraryChecks(t *testing.T) {
	t.Parallel()
	checks := libraryChecks(t)
	commands := map[string][]string{
		"gpus":       {"nvidia-smi", "--query-gpu=index,name,pci.bus_id", "--format=csv,noheader"},
		"ecc":        {"nvidia-smi", "--query-gpu=index,ecc.mode.current,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"},
		"xid":        {"dmesg"},
		"infiniband": {"ibstat"},
		"dcgm":       {"dcgmi", "diag", "-r", "1"},
		"all-reduce": {"all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "8"},
	}
	tests := []struct {
		check, fixture string
		exit           int
		failure        failure // empty: the node passes
		reason         string  // part of the failure's reason
	}{
		{"gpus", "healthy.txt", 0, "", ""},
		{"gpus", "seven-gpus.txt", 0, failNoMatch, "7 lines matched"},
		{"gpus", "wrong-model.txt", 0, failNoMatch, "0 lines matched '^\\s*\\d+, NVIDIA H100 80GB HBM3, ', want 8"},
		{"gpus", "unreachable.txt", 0, failForbidden, "Unable to determine the device handle for GPU00000004:00:00.0"},
		{"gpus", "unreachable.txt", 15, failExit, "exit code 15"},

		{"ecc", "healthy.txt", 0, "", ""},
		{"ecc", "uncorrectable.txt", 0, failThreshold, `want at most 0), the first: value "2" in "5, Enabled, 2"`},
		{"ecc", "disabled.txt", 0, failNoMatch, "0 lines matched"},

		{"xid", "healthy.txt", 0, "", ""}, // application XIDs 13 and 31 only
		{"xid", "xid79.txt", 0, failForbidden, "NVRM: Xid (PCI:0003:00:00): 79, pid='<unknown>'"},
		{"xid", "xid94.txt", 0, failForbidden, "NVRM: Xid (PCI:0006:00:00): 94, pid=61377"},
		{"xid", "fallen-off-no-xid.txt", 0, failForbidden, "NVRM: fallen off the bus and is not responding"},

		{"infiniband", "healthy.txt", 0, "", ""}, // 8 × NDR 400 and the Ethernet VF at 100
		{"infiniband", "port-down.txt", 0, failForbidden, `"\t\tState: Down"`},
		{"infiniband", "no-subnet-manager.txt", 0, failForbidden, "8 lines matched mustNotMatch"},
		{"infiniband", "degraded-rate.txt", 0, failNoMatch, "7 lines matched '^\\s*Rate: 400\\s*$', want 8"},

		{"dcgm", "healthy-dcgm3.txt", 0, "", ""},
		{"dcgm", "healthy-dcgm4.txt", 0, "", ""},
		{"dcgm", "row-remap-dcgm3.txt", 0, failForbidden, "| Page Retirement/Row Remap | Fail"},
		{"dcgm", "software-fail-dcgm4.txt", 0, failForbidden, "2 lines matched mustNotMatch"},
		{"dcgm", "no-host-engine.txt", 0, failNoMatch, "0 lines matched '^Successfully ran diagnostic for group'"},

		{"all-reduce", "healthy.txt", 0, "", ""},
		{"all-reduce", "slow-nvlink.txt", 0, failThreshold, `want at least 300), the first: value "92.9613"`},
		{"all-reduce", "wrong-results.txt", 0, failForbidden, "# Out of bounds values : 3 FAILED"},
	}
	used := map[string]bool{}
	verdicts := map[string]map[bool]bool{} // check → passed → seen
	for _, tc := range tests {
		path := filepath.Join(libraryFixtures, tc.check, tc.fixture)
		used[path] = true
		if verdicts[tc.check] == nil {
			verdicts[tc.check] = map[bool]bool{}
		}
		verdicts[tc.check][tc.failure == ""] = true
		t.Run(fmt.Sprintf("%s/%s/exit%d", tc.check, tc.fixture, tc.exit), func(t *testing.T) {
			t.Parallel()
			spec, ok := checks[tc.check]
			if !ok {
				t.Fatalf("the chart's library has no check %q", tc.check)
			}
			if !slices.Equal(spec.Command, commands[tc.check]) {
				t.Fatalf("command %q, but the fixtures are the output of %q", spec.Command, commands[tc.check])
			}
			fixture, err := filepath.Abs(path)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			stub := filepath.Join(dir, spec.Command[0])
			script := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\n' \"$@\" > '%s/args'\ncat '%s'\nexit %d\n", dir, fixture, tc.exit)
			if err := os.WriteFile(stub, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			// Run by the shell, not exec'd: the subtests run in parallel,
			// and a fork by one while another writes its stub leaks the
			// stub's write descriptor into the child until it execs, so
			// executing the stub itself fails now and then with "text file
			// busy" (ETXTBSY, Go issue 22315). The shell only reads it.
			spec.Command = append([]string{"/bin/sh", stub}, spec.Command[1:]...)
			if spec.Retries > 0 {
				spec.RetryDelay = 10 * time.Millisecond // the chart's 10 s, shortened
			}
			res := runWithin(t, runner{}, newConfig([]checkSpec{spec}))
			c := res.Checks[0]
			if c.Passed != (tc.failure == "") || c.Failure != tc.failure || !strings.Contains(c.Reason, tc.reason) {
				t.Fatalf("passed %v, failure %q, reason %q\nwant failure %q with a reason containing %q\noutput:\n%s",
					c.Passed, c.Failure, c.Reason, tc.failure, tc.reason, c.Output)
			}
			if want := spec.Retries + 1; !c.Passed && c.Attempts != want {
				t.Errorf("a failing check ran %d times, want %d (retries %d)", c.Attempts, want, spec.Retries)
			}
			args, err := os.ReadFile(filepath.Join(dir, "args"))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Fields(string(args)); !slices.Equal(got, commands[tc.check][1:]) {
				t.Errorf("the tool got arguments %q, want %q", got, commands[tc.check][1:])
			}
		})
	}
	// Every library check has healthy and faulty fixtures, and every
	// fixture is run.
	for name := range checks {
		if _, ok := commands[name]; !ok {
			continue // the chart's own checks (disk, dns)
		}
		if !verdicts[name][true] || !verdicts[name][false] {
			t.Errorf("check %s needs both a healthy and a faulty fixture", name)
		}
	}
	for name := range commands {
		if _, ok := checks[name]; !ok {
			t.Errorf("the chart's library lost check %s", name)
		}
	}
	files, err := filepath.Glob(filepath.Join(libraryFixtures, "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !used[f] {
			t.Errorf("fixture %s is not used by any case", f)
		}
	}
}
