package measure

import (
	"os"
	"strings"
	"testing"
)

func TestParseProc(t *testing.T) {
	// peer's and scale's cases, from when each had its own copy.
	const (
		apiserverStatus = "Name:\tkube-apiserver\nVmPeak:\t 9000 kB\nVmHWM:\t  524288 kB\nVmRSS:\t 400000 kB\n"
		apiserverStat   = "4242 (kube api server) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 566 0 0 20 0 12 0 100 0 0"
	)
	for _, tc := range []struct {
		name, status, stat string
		want               Usage
	}{
		{"command name with parentheses", "Name:\tx\nVmHWM:\t  204800 kB\nVmRSS:\t 1024 kB\n",
			"1234 (a (b) c) S 1 1 1 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 8 0 100 0 0", Usage{PeakRSSMiB: 200, RSSMiB: 1, CPUSeconds: 4}},
		{"command name with spaces", apiserverStatus, apiserverStat, Usage{PeakRSSMiB: 512, RSSMiB: 390.625, CPUSeconds: 18}},
		{"no VmRSS", "VmHWM:\t 2048 kB\n", apiserverStat, Usage{PeakRSSMiB: 2, CPUSeconds: 18}},
		{"VmRSS not in kB is left out", "VmHWM:\t 2048 kB\nVmRSS:\t 3 pages\n", apiserverStat, Usage{PeakRSSMiB: 2, CPUSeconds: 18}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := parseProc(tc.status, tc.stat)
			if err != nil {
				t.Fatal(err)
			}
			if u != tc.want {
				t.Errorf("got %+v, want %+v", u, tc.want)
			}
		})
	}
	for _, tc := range []struct{ name, status, stat, want string }{
		{"no VmHWM", "Name:\tx\n", apiserverStat, "no VmHWM"},
		{"only VmRSS", "VmRSS: 1 kB\n", apiserverStat, "no VmHWM"},
		{"VmHWM in pages", "VmHWM:\t 12 pages\n", apiserverStat, "VmHWM"},
		{"VmHWM not a number", "VmHWM:\t lots kB\n", apiserverStat, "VmHWM"},
		{"short stat", apiserverStatus, "1 (x) S 1 2", "fields"},
		{"no command", apiserverStatus, "1 x S", "command name"},
		{"CPU time not a number", apiserverStatus, "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 5 0 0", "CPU time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseProc(tc.status, tc.stat)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestProcUsage(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	u, err := ProcUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.PeakRSSMiB <= 0 || u.RSSMiB <= 0 || u.RSSMiB > u.PeakRSSMiB {
		t.Errorf("this process: %+v, want 0 < RSS <= peak RSS", u)
	}
	if _, err := ProcUsage(-1); err == nil {
		t.Error("ProcUsage(-1) read a process")
	}
}

func TestCPUModel(t *testing.T) {
	for _, tc := range []struct{ name, cpuinfo, want string }{
		{"first of several", "processor\t: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\n\nprocessor\t: 1\nmodel name\t: other\n", "AMD EPYC 7763 64-Core Processor"},
		{"none (arm64)", "processor\t: 0\nBogoMIPS\t: 50.00\n", ""},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cpuModel(tc.cpuinfo); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
