package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// traceFile is the OpenB pod list of the Alibaba GPU cluster trace.
const traceFile = "openb_pod_list_default.csv"

// traceCitation is what the trace's README asks figures from it to cite.
const traceCitation = `Alibaba cluster-trace-gpu-v2023 (github.com/alibaba/clusterdata, folder cluster-trace-gpu-v2023), OpenB pod list: ` +
	`Q. Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC 2023`

// absent is a time the trace leaves empty: a pod never deleted (running
// at the trace's end) or never scheduled.
const absent int64 = -1

// The trace's columns; a file may order them as it likes and add others.
var traceColumns = []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"}

// tracePod is one row of the trace, as it is. Times are seconds from the
// trace's start; Deleted and Scheduled are absent when the trace has none.
type tracePod struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	// GPUs is num_gpu; GPUMilli is gpu_milli, the share of one GPU a
	// GPU-sharing pod asks for (1000 for a whole GPU, 0 without GPUs).
	GPUs      int64
	GPUMilli  int64
	GPUSpec   string
	QoS       string
	Phase     string
	Created   int64
	Deleted   int64
	Scheduled int64
}

// trace is a parsed pod list.
type trace struct {
	Source string
	Pods   []tracePod
	// End is the trace's last time (seconds): its latest creation,
	// deletion or scheduling.
	End int64
}

// missingTraceError says where to get the trace.
func missingTraceError(path string, err error) error {
	return fmt.Errorf("trace %s: %w; it is %s of the Alibaba GPU cluster trace: the public repository alibaba/clusterdata (github.com/alibaba/clusterdata), "+
		"folder cluster-trace-gpu-v2023; download it (it states no licence: keep it outside the repository) and pass its path with --trace (make replay TRACE=<path>)",
		path, err, traceFile)
}

// defaultTracePath is ../shared/traces/openb_pod_list_default.csv beside
// the repository root, or "" when that file is not there.
func defaultTracePath(root string) string {
	p := filepath.Join(filepath.Dir(root), "shared", "traces", traceFile)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// readTrace reads and validates the trace at path.
func readTrace(path string) (*trace, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, missingTraceError(path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	return parseTrace(f, path)
}

// parseTrace parses a pod list from r; source names it in errors.
func parseTrace(r io.Reader, source string) (*trace, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: empty: no header line (want %s)", source, strings.Join(traceColumns, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	idx, err := columnIndex(header)
	if err != nil {
		return nil, fmt.Errorf("%s line 1: %w", source, err)
	}
	t := &trace{Source: source}
	seen := map[string]int{}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		line, _ := cr.FieldPos(0)
		p, err := parseRow(rowParser{rec: rec, idx: idx}, seen, line)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %w", source, line, err)
		}
		t.Pods = append(t.Pods, p)
		t.End = max(t.End, p.Created, p.Deleted, p.Scheduled)
	}
	if len(t.Pods) == 0 {
		return nil, fmt.Errorf("%s: no pods after the header", source)
	}
	return t, nil
}

// columnIndex maps each of traceColumns to its place in header.
func columnIndex(header []string) (map[string]int, error) {
	idx := map[string]int{}
	for i, h := range header {
		idx[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, c := range traceColumns {
		if _, ok := idx[c]; !ok {
			return nil, fmt.Errorf("no column %q in the header %q (want %s)", c, strings.Join(header, ","), strings.Join(traceColumns, ","))
		}
	}
	return idx, nil
}

// parseRow parses and checks one row; seen maps names to their lines.
func parseRow(p rowParser, seen map[string]int, line int) (tracePod, error) {
	pod := tracePod{
		Name:      p.str("name"),
		CPUMilli:  p.num("cpu_milli", 0),
		MemoryMiB: p.num("memory_mib", 0),
		GPUs:      p.num("num_gpu", 0),
		GPUMilli:  p.num("gpu_milli", 0),
		GPUSpec:   p.str("gpu_spec"),
		QoS:       p.str("qos"),
		Phase:     p.str("pod_phase"),
		Created:   p.num("creation_time", 0),
	}
	pod.Deleted = p.optional("deletion_time", pod.Created)
	pod.Scheduled = p.optional("scheduled_time", pod.Created)
	if p.err != nil {
		return pod, p.err
	}
	if pod.Name == "" {
		return pod, errors.New("column name: empty")
	}
	if first, dup := seen[pod.Name]; dup {
		return pod, fmt.Errorf("column name: %q is also on line %d", pod.Name, first)
	}
	seen[pod.Name] = line
	return pod, checkGPUs(pod)
}

// checkGPUs checks num_gpu and gpu_milli agree: a share of a GPU only with
// GPUs, at most a whole one.
func checkGPUs(p tracePod) error {
	switch {
	case p.GPUMilli > 1000:
		return fmt.Errorf("column gpu_milli: %d is more than one GPU (1000)", p.GPUMilli)
	case p.GPUs == 0 && p.GPUMilli != 0:
		return fmt.Errorf("column gpu_milli: %d with num_gpu 0", p.GPUMilli)
	case p.GPUs > 0 && p.GPUMilli == 0:
		return fmt.Errorf("column gpu_milli: 0 with num_gpu %d", p.GPUs)
	}
	return nil
}

// rowParser reads a row's fields by column name, keeping the first error.
type rowParser struct {
	rec []string
	idx map[string]int
	err error
}

func (p *rowParser) str(col string) string {
	return strings.TrimSpace(p.rec[p.idx[col]])
}

// num parses a whole number of at least lo.
func (p *rowParser) num(col string, lo int64) int64 {
	v := p.str(col)
	if p.err != nil {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil:
		p.err = fmt.Errorf("column %s: %q is not a whole number: %w", col, v, err)
	case n < lo:
		p.err = fmt.Errorf("column %s: %q is less than %d", col, v, lo)
	}
	return n
}

// optional parses a time of at least lo, or absent when empty.
func (p *rowParser) optional(col string, lo int64) int64 {
	if p.str(col) == "" {
		return absent
	}
	v := p.num(col, 0)
	if p.err == nil && v < lo {
		p.err = fmt.Errorf("column %s: %d is before creation_time %d", col, v, lo)
	}
	return v
}
