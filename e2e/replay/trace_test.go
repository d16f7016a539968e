package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// header is the trace's header line; the rows below are made up.
const header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"

func TestParseTrace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		csv     string
		pods    int
		end     int64
		wantErr string
	}{
		{"two pods", header + "a,1000,2048,1,500,,LS,Running,10,100,12\nb,2000,4096,8,1000,,BE,Succeeded,20,50,20\n", 2, 100, ""},
		{"never deleted, never scheduled", header + "a,1000,2048,0,0,,LS,Pending,10,,\n", 1, 10, ""},
		{"columns in another order, one more", "extra,scheduled_time,deletion_time,creation_time,pod_phase,qos,gpu_spec,gpu_milli,num_gpu,memory_mib,cpu_milli,name\n" +
			"x,5,70,5,Running,LS,,1000,2,1,1,a\n", 1, 70, ""},
		{"the end is the latest time", header + "a,1,1,0,0,,LS,Running,10,30,\nb,1,1,0,0,,LS,Running,40,,40\n", 2, 40, ""},
		{"empty file", "", 0, 0, "empty: no header line"},
		{"header only", header, 0, 0, "no pods after the header"},
		{"a column missing", "name,cpu_milli\na,1\n", 0, 0, `line 1: no column "memory_mib"`},
		{"not a number", header + "a,1000,2048,1,1000,,LS,Running,10,100,12\nb,lots,1,0,0,,LS,Running,1,2,1\n", 0, 0, `line 3: column cpu_milli: "lots" is not a whole number`},
		{"negative", header + "a,1000,-1,1,1000,,LS,Running,10,100,12\n", 0, 0, `line 2: column memory_mib: "-1" is less than 0`},
		{"deleted before created", header + "a,1,1,0,0,,LS,Running,10,9,10\n", 0, 0, "line 2: column deletion_time: 9 is before creation_time 10"},
		{"scheduled before created", header + "a,1,1,0,0,,LS,Running,10,20,3\n", 0, 0, "line 2: column scheduled_time: 3 is before creation_time 10"},
		{"more than a GPU's share", header + "a,1,1,1,1500,,LS,Running,1,2,1\n", 0, 0, "line 2: column gpu_milli: 1500 is more than one GPU"},
		{"a share without GPUs", header + "a,1,1,0,500,,LS,Running,1,2,1\n", 0, 0, "line 2: column gpu_milli: 500 with num_gpu 0"},
		{"GPUs without a share", header + "a,1,1,2,0,,LS,Running,1,2,1\n", 0, 0, "line 2: column gpu_milli: 0 with num_gpu 2"},
		{"no name", header + ",1,1,0,0,,LS,Running,1,2,1\n", 0, 0, "line 2: column name: empty"},
		{"a name twice", header + "a,1,1,0,0,,LS,Running,1,2,1\na,1,1,0,0,,LS,Running,1,2,1\n", 0, 0, `line 3: column name: "a" is also on line 2`},
		{"a short row", header + "a,1,1\n", 0, 0, "wrong number of fields"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := parseTrace(strings.NewReader(tc.csv), "t.csv")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "t.csv") {
					t.Fatalf("error %v, want one starting t.csv naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(tr.Pods) != tc.pods || tr.End != tc.end {
				t.Errorf("%d pods ending at %d, want %d ending at %d", len(tr.Pods), tr.End, tc.pods, tc.end)
			}
		})
	}
}

func TestParseTraceFields(t *testing.T) {
	tr, err := parseTrace(strings.NewReader(header+"a,1500,2048,1,460,V100,LS,Running,10,100,12\nb,1,2,0,0,,BE,Pending,20,,\n"), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []tracePod{
		{Name: "a", CPUMilli: 1500, MemoryMiB: 2048, GPUs: 1, GPUMilli: 460, GPUSpec: "V100", QoS: "LS", Phase: "Running", Created: 10, Deleted: 100, Scheduled: 12},
		{Name: "b", CPUMilli: 1, MemoryMiB: 2, QoS: "BE", Phase: "Pending", Created: 20, Deleted: absent, Scheduled: absent},
	}
	for i, w := range want {
		if tr.Pods[i] != w {
			t.Errorf("pod %d = %+v, want %+v", i, tr.Pods[i], w)
		}
	}
}

func TestReadTrace(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.csv")
	if err := os.WriteFile(good, []byte(header+"a,1,1,0,0,,LS,Running,1,2,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if tr, err := readTrace(good); err != nil || len(tr.Pods) != 1 || tr.Source != good {
		t.Fatalf("readTrace = %+v, %v", tr, err)
	}
	missing := filepath.Join(dir, "nope.csv")
	_, err := readTrace(missing)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("error %v does not wrap os.ErrNotExist", err)
	}
	for _, want := range []string{missing, "alibaba/clusterdata", "cluster-trace-gpu-v2023", "--trace", "TRACE=", traceFile} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestDefaultTracePath(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "repo")
	if got := defaultTracePath(root); got != "" {
		t.Errorf("no trace beside the repository: got %q, want \"\"", got)
	}
	p := filepath.Join(base, "shared", "traces", traceFile)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(header), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := defaultTracePath(root); got != p {
		t.Errorf("got %q, want %q", got, p)
	}
}
