package measure

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Usage is a process's resident memory, peak (VmHWM) and current (VmRSS),
// and CPU time (user + system), from /proc.
type Usage struct {
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	RSSMiB     float64 `json:"rssMiB,omitempty"`
	CPUSeconds float64 `json:"cpuSeconds"`
}

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTicks = 100

// ProcUsage reads a live process's usage from /proc/<pid>/status and
// /proc/<pid>/stat. A status without VmHWM is an error; one without VmRSS
// leaves RSSMiB 0.
func ProcUsage(pid int) (Usage, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return Usage{}, err
	}
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return Usage{}, err
	}
	return parseProc(string(status), string(stat))
}

func parseProc(status, stat string) (Usage, error) {
	var u Usage
	if err := u.readStatus(status); err != nil {
		return u, err
	}
	if err := u.readStat(stat); err != nil {
		return u, err
	}
	return u, nil
}

// readStatus reads the resident memory of a /proc/<pid>/status: VmHWM,
// required, and VmRSS.
func (u *Usage) readStatus(status string) error {
	found := false
	for line := range strings.Lines(status) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := peakKB(rest)
			if err != nil {
				return err
			}
			u.PeakRSSMiB, found = kb/1024, true
		}
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb float64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%f kB", &kb); err == nil {
				u.RSSMiB = kb / 1024
			}
		}
	}
	if !found {
		return fmt.Errorf("/proc status: no VmHWM line")
	}
	return nil
}

// peakKB parses the value of a VmHWM line, "<n> kB".
func peakKB(rest string) (float64, error) {
	f := strings.Fields(rest)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("/proc status: VmHWM: unexpected %q", strings.TrimSpace(rest))
	}
	kb, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("/proc status: VmHWM: %w", err)
	}
	return kb, nil
}

// readStat reads the CPU time (user + system) of a /proc/<pid>/stat.
func (u *Usage) readStat(stat string) error {
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return fmt.Errorf("/proc stat: no command name in %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return fmt.Errorf("/proc stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks float64
	for _, s := range f[11:13] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("/proc stat: CPU time %q: %w", s, err)
		}
		ticks += v
	}
	u.CPUSeconds = ticks / clockTicks
	return nil
}

// CPUModel is this machine's CPU model name from /proc/cpuinfo, or "" when
// it does not say.
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	return cpuModel(string(b))
}

// cpuModel is the first "model name" of a /proc/cpuinfo.
func cpuModel(cpuinfo string) string {
	for line := range strings.Lines(cpuinfo) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
