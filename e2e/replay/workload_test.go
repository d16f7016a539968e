package main

import (
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// h100 is the node shape of nodeSKU, failing t when there is none.
func h100(t testing.TB) nodeShape {
	t.Helper()
	n, err := shapeOf(nodeSKU)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestShapeOf(t *testing.T) {
	for _, tc := range []struct {
		sku     string
		want    nodeShape
		wantErr string
	}{
		// armsim's realism test works these out: 96000m less 1060m
		// kube-reserved; 1,945,600 MiB less 5,050 reserved and 100 evicted.
		{nodeSKU, nodeShape{SKU: nodeSKU, MaxPods: 250, Allocatable: resources{CPUMilli: 94940, MemoryMiB: 1940450, GPUs: 8}}, ""},
		{"Standard_D16s_v5", nodeShape{SKU: "Standard_D16s_v5", MaxPods: 250, Allocatable: resources{CPUMilli: 15740, MemoryMiB: 60386}}, ""},
		{"Standard_Nope", nodeShape{}, `"Standard_Nope" is not one of the ARM simulator's`},
	} {
		t.Run(tc.sku, func(t *testing.T) {
			got, err := shapeOf(tc.sku)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("shapeOf = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// testTrace parses rows (without the header), failing t when they are wrong.
func testTrace(t testing.TB, rows string) *trace {
	t.Helper()
	tr, err := parseTrace(strings.NewReader(header+rows), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// rows: a trace of 2,400 s. a shares a GPU; b takes a whole node; c asks
// for more CPU than a node has; d is never deleted; e was never scheduled;
// f is CPU-only and created late.
const rows = `a,4000,8192,1,460,,LS,Running,0,1200,0
b,32000,65536,8,1000,,LS,Running,600,1800,600
c,120000,65536,8,1000,,LS,Failed,600,700,600
d,1000,1024,2,1000,,BE,Running,1200,,1200
e,1000,1024,1,1000,,BE,Pending,1800,2400,
f,2000,2048,0,0,,BE,Running,2000,2100,2000
`

func TestBuildWorkload(t *testing.T) {
	node := h100(t)
	tr := testTrace(t, rows)
	for _, tc := range []struct {
		name        string
		o           workloadOptions
		pods        []string
		compression float64
		span        time.Duration
		unfit       int
		wantErr     string
	}{
		{"whole trace, default compression: 2,400 s in 20 minutes", workloadOptions{Budget: 20 * time.Minute}, []string{"a", "b", "d", "e", "f"}, 2, 20 * time.Minute, 1, ""},
		{"a budget longer than the trace: never stretched", workloadOptions{Budget: time.Hour}, []string{"a", "b", "d", "e", "f"}, 1, 40 * time.Minute, 1, ""},
		{"compression rounded up", workloadOptions{Budget: 7 * time.Minute}, []string{"a", "b", "d", "e", "f"}, 6, 400 * time.Second, 1, ""},
		{"given compression", workloadOptions{Compression: 100}, []string{"a", "b", "d", "e", "f"}, 100, 24 * time.Second, 1, ""},
		{"a window", workloadOptions{Window: window{Start: 600 * time.Second, Length: 600 * time.Second}, Compression: 10}, []string{"b"}, 10, time.Minute, 1, ""},
		{"a window to the end", workloadOptions{Window: window{Start: 1200 * time.Second}, Compression: 10}, []string{"d", "e", "f"}, 10, 2 * time.Minute, 0, ""},
		{"a window past the end", workloadOptions{Window: window{Start: 3000 * time.Second}, Compression: 10}, nil, 0, 0, 0, "window start 50m0s: the trace ends at 40m0s"},
		{"a window without pods", workloadOptions{Window: window{Start: 100 * time.Second, Length: 100 * time.Second}, Compression: 10}, nil, 0, 0, 0, "no pod of the trace"},
		{"negative window", workloadOptions{Window: window{Start: -time.Second}, Compression: 10}, nil, 0, 0, 0, "neither may be negative"},
		{"compression below 1", workloadOptions{Compression: 0.5}, nil, 0, 0, 0, "compression 0.5: want at least 1"},
		{"no budget", workloadOptions{}, nil, 0, 0, 0, "budget 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Node = node
			w, err := buildWorkload(tr, tc.o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range w.Pods {
				names = append(names, p.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.pods, ",") || w.Compression != tc.compression || w.Span != tc.span || len(w.Unfit) != tc.unfit {
				t.Errorf("pods %v, compression %v, span %s, unfit %v; want %v, %v, %s, %d", names, w.Compression, w.Span, w.Unfit, tc.pods, tc.compression, tc.span, tc.unfit)
			}
			if len(w.Events) != 2*len(w.Pods) {
				t.Errorf("%d events for %d pods", len(w.Events), len(w.Pods))
			}
		})
	}
}

func TestModel(t *testing.T) {
	node := h100(t)
	w, err := buildWorkload(testTrace(t, rows), workloadOptions{Compression: 10, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	s := time.Second
	want := map[string]pod{
		"a": {Name: "a", Req: resources{4000, 8192, 1}, SharedGPU: true, Create: 0, Delete: 120 * s},
		"b": {Name: "b", Req: node.Allocatable, WholeNode: true, Create: 60 * s, Delete: 180 * s},
		"d": {Name: "d", Req: resources{1000, 1024, 2}, Create: 120 * s, Delete: 240 * s},
		"e": {Name: "e", Req: resources{1000, 1024, 1}, NeverScheduled: true, Create: 180 * s, Delete: 240 * s},
		"f": {Name: "f", Req: resources{2000, 2048, 0}, Create: 200 * s, Delete: 210 * s},
	}
	for _, p := range w.Pods {
		if p != want[p.Name] {
			t.Errorf("pod %s = %+v, want %+v", p.Name, p, want[p.Name])
		}
	}
	if w.SharedGPU != 1 || w.WholeNode != 1 || w.NeverScheduled != 1 || w.EndsAtEnd != 1 || w.ShortLived != 0 || w.MedianLifetime != 120*s {
		t.Errorf("counts: shared %d, whole node %d, never scheduled %d, ends at end %d, short-lived %d, median lifetime %s; want 1, 1, 1, 1, 0, 2m0s",
			w.SharedGPU, w.WholeNode, w.NeverScheduled, w.EndsAtEnd, w.ShortLived, w.MedianLifetime)
	}
	if len(w.Unfit) != 1 || !strings.HasPrefix(w.Unfit[0], "c (120000 CPU milli") {
		t.Errorf("unfit %v, want c", w.Unfit)
	}
	// A window cuts the pods that outlive it (a and b) and counts short
	// lives (b, 400 ms; a lives 1 s).
	w, err = buildWorkload(testTrace(t, rows), workloadOptions{Window: window{Length: 1000 * s}, Compression: 1000, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Pods) != 2 || w.Pods[0].Delete != s || w.Pods[1].Delete != s || w.EndsAtEnd != 2 || w.ShortLived != 1 {
		t.Errorf("window of 1,000 s: pods %+v, ends at end %d, short-lived %d; want a and b cut at 1 s, 2, 1", w.Pods, w.EndsAtEnd, w.ShortLived)
	}
}

func TestSchedule(t *testing.T) {
	s := time.Second
	pods := []pod{
		{Name: "p0", Create: 0, Delete: 2 * s},
		{Name: "p1", Create: 2 * s, Delete: 3 * s},
		{Name: "p2", Create: 2 * s, Delete: 2 * s}, // no lifetime once compressed
		{Name: "p3", Create: s, Delete: 2 * s},
	}
	var got []string
	for _, e := range schedule(pods) {
		got = append(got, e.Kind.String()+" "+pods[e.Pod].Name+" "+e.At.String())
	}
	want := []string{"create p0 0s", "create p3 1s", "delete p0 2s", "delete p3 2s", "create p1 2s", "create p2 2s", "delete p2 2s", "delete p1 3s"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("schedule:\n%s\nwant:\n%s", strings.Join(got, "; "), strings.Join(want, "; "))
	}
}

func TestSpec(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    pod
		gpus string
	}{
		{"GPUs as requests and limits", pod{Req: resources{1500, 2048, 2}}, "2"},
		{"no GPUs, no limits", pod{Req: resources{1500, 2048, 0}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.p.spec().Containers[0]
			r := c.Resources
			if r.Requests.Cpu().Cmp(resource.MustParse("1500m")) != 0 || r.Requests.Memory().Cmp(resource.MustParse("2Gi")) != 0 {
				t.Errorf("requests %v, want 1500m CPU and 2Gi", r.Requests)
			}
			for _, list := range []apiv1.ResourceList{r.Requests, r.Limits} {
				got, ok := list[armsim.GPUResource]
				if tc.gpus == "" && ok || tc.gpus != "" && (!ok || got.Cmp(resource.MustParse(tc.gpus)) != 0) {
					t.Errorf("GPUs %v, want %q", list, tc.gpus)
				}
			}
			if len(r.Limits) > 1 {
				t.Errorf("limits %v: only GPUs", r.Limits)
			}
		})
	}
}
