package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// nodeSKU is the node both sides buy and the floor packs: an 8-GPU ND H100
// v5 (96 vCPU, 1,900 GiB).
const nodeSKU = "Standard_ND96isr_H100_v5"

// defaultBudget is how long a replay of the whole window takes at the
// default compression.
const defaultBudget = 20 * time.Minute

// shortLived is a replayed lifetime shorter than a real control plane
// schedules a pod in: such pods are likely deleted before they run.
const shortLived = time.Second

// resources are what a pod asks for or a node offers.
type resources struct {
	CPUMilli  int64 `json:"cpuMilli"`
	MemoryMiB int64 `json:"memoryMiB"`
	GPUs      int64 `json:"gpus"`
}

func (r resources) fits(in resources) bool {
	return r.CPUMilli <= in.CPUMilli && r.MemoryMiB <= in.MemoryMiB && r.GPUs <= in.GPUs
}

func (r resources) minus(o resources) resources {
	return resources{r.CPUMilli - o.CPUMilli, r.MemoryMiB - o.MemoryMiB, r.GPUs - o.GPUs}
}

func (r resources) plus(o resources) resources {
	return resources{r.CPUMilli + o.CPUMilli, r.MemoryMiB + o.MemoryMiB, r.GPUs + o.GPUs}
}

// nodeShape is the node every side gets: what a node of SKU offers pods
// once registered, as the ARM simulator's node hook registers it (AKS's
// kube-reserved and eviction threshold taken off, its max pods).
type nodeShape struct {
	SKU         string    `json:"sku"`
	Allocatable resources `json:"allocatable"`
	MaxPods     int       `json:"maxPods"`
}

// shapeOf is the node shape of sku from the simulator's SKU table and its
// default realism (what ours gets; phase 2 gives Karpenter's instance
// type the same).
func shapeOf(sku string) (nodeShape, error) {
	i := slices.IndexFunc(armsim.DefaultSKUs(), func(s armsim.SKU) bool { return s.Name == sku })
	if i < 0 {
		return nodeShape{}, fmt.Errorf("node SKU %q is not one of the ARM simulator's", sku)
	}
	k := armsim.DefaultSKUs()[i]
	_, alloc := armsim.DefaultRealism().Resources(k)
	return nodeShape{SKU: sku, MaxPods: int(alloc.Pods().Value()), Allocatable: resources{
		CPUMilli:  alloc.Cpu().MilliValue(),
		MemoryMiB: alloc.Memory().Value() >> 20,
		GPUs:      int64(k.GPUs),
	}}, nil
}

// window is the part of the trace replayed, in trace time.
type window struct {
	Start time.Duration
	// Length 0: to the trace's end.
	Length time.Duration
}

// workloadOptions say how a trace becomes a workload.
type workloadOptions struct {
	Window window
	// Compression is trace seconds per replayed second; 0: the window's
	// span over Budget, rounded up (at least 1).
	Compression float64
	Budget      time.Duration
	Node        nodeShape
}

// pod is a trace pod as replayed.
type pod struct {
	Name string    `json:"name"`
	Req  resources `json:"requests"`
	// SharedGPU: the trace's pod asked for a share of one GPU (gpu_milli
	// below 1000); it takes a whole one here, as Kubernetes's
	// nvidia.com/gpu counts whole GPUs.
	SharedGPU bool `json:"sharedGPU,omitempty"`
	// WholeNode: a pod of a node's every GPU, made to ask for the node's
	// whole allocatable CPU and memory too, so nothing shares its node.
	WholeNode bool `json:"wholeNode,omitempty"`
	// NeverScheduled: the trace never scheduled it (pod_phase Pending);
	// replayed all the same, since the autoscalers see its request.
	NeverScheduled bool `json:"neverScheduled,omitempty"`
	// Create and Delete are offsets from the replay's start, compressed.
	Create time.Duration `json:"create"`
	Delete time.Duration `json:"delete"`
}

// spec is the pod's spec: a pause container asking for its requests
// (GPUs as limits too, as extended resources must be).
func (p pod) spec() apiv1.PodSpec {
	req := apiv1.ResourceList{
		apiv1.ResourceCPU:    *resource.NewMilliQuantity(p.Req.CPUMilli, resource.DecimalSI),
		apiv1.ResourceMemory: *resource.NewQuantity(p.Req.MemoryMiB<<20, resource.BinarySI),
	}
	var limits apiv1.ResourceList
	if p.Req.GPUs > 0 {
		gpus := *resource.NewQuantity(p.Req.GPUs, resource.DecimalSI)
		req[armsim.GPUResource] = gpus
		limits = apiv1.ResourceList{armsim.GPUResource: gpus}
	}
	return apiv1.PodSpec{Containers: []apiv1.Container{{
		Name: "pause", Image: "registry.k8s.io/pause:3.10",
		Resources: apiv1.ResourceRequirements{Requests: req, Limits: limits},
	}}}
}

// eventKind is what an event does to its pod.
type eventKind int

const (
	// deleteEvent sorts before createEvent at the same instant: a pod
	// leaving frees its room for one arriving.
	deleteEvent eventKind = iota
	createEvent
)

func (k eventKind) String() string {
	if k == deleteEvent {
		return "delete"
	}
	return "create"
}

// event is a pod created or deleted At after the replay's start.
type event struct {
	At   time.Duration
	Kind eventKind
	Pod  int // index in workload.Pods
}

// workload is the compressed schedule.
type workload struct {
	Pods   []pod   `json:"-"`
	Events []event `json:"-"`
	// Start and End bound the window in trace time (seconds).
	Start       int64   `json:"windowStartSeconds"`
	End         int64   `json:"windowEndSeconds"`
	Compression float64 `json:"compression"`
	// Span is the replay's length: the window compressed.
	Span time.Duration `json:"span"`
	Node nodeShape     `json:"node"`
	// Unfit are the window's trace pods no node holds, skipped.
	Unfit []string `json:"unfit,omitempty"`
	// What the model changed or kept: counts of replayed pods.
	SharedGPU      int `json:"sharedGPU"`
	WholeNode      int `json:"wholeNode"`
	NeverScheduled int `json:"neverScheduled"`
	// EndsAtEnd were never deleted in the trace or outlive the window:
	// they end at the window's end.
	EndsAtEnd int `json:"endsAtEnd"`
	// ShortLived live less than shortLived once compressed.
	ShortLived int `json:"shortLived"`
	// MedianLifetime is the median replayed lifetime.
	MedianLifetime time.Duration `json:"medianLifetime"`
}

// buildWorkload turns the trace's pods created in the window into the
// compressed schedule. Pods alive at the window's start but created before
// it are not replayed: the replay starts from an empty cluster.
func buildWorkload(tr *trace, o workloadOptions) (*workload, error) {
	w, err := frame(tr, o)
	if err != nil {
		return nil, err
	}
	var lifetimes []time.Duration
	for _, tp := range tr.Pods {
		if tp.Created < w.Start || tp.Created > w.End || tp.Created == w.End && w.End != tr.End {
			continue
		}
		if !requestOf(tp).fits(o.Node.Allocatable) {
			w.Unfit = append(w.Unfit, fmt.Sprintf("%s (%d CPU milli, %d MiB, %d GPUs)", tp.Name, tp.CPUMilli, tp.MemoryMiB, tp.GPUs))
			continue
		}
		p := w.model(tp)
		w.Pods = append(w.Pods, p)
		lifetimes = append(lifetimes, p.Delete-p.Create)
	}
	if len(w.Pods) == 0 {
		return nil, fmt.Errorf("window %s from %s: no pod of the trace that a node holds is created in it", o.Window.Length, o.Window.Start)
	}
	slices.Sort(lifetimes)
	w.MedianLifetime = lifetimes[(len(lifetimes)-1)/2]
	w.Events = schedule(w.Pods)
	return w, nil
}

// frame checks the window and the compression and returns the workload
// without pods.
func frame(tr *trace, o workloadOptions) (*workload, error) {
	start := int64(o.Window.Start / time.Second)
	if o.Window.Start < 0 || o.Window.Length < 0 {
		return nil, fmt.Errorf("window %s from %s: neither may be negative", o.Window.Length, o.Window.Start)
	}
	if start >= tr.End {
		return nil, fmt.Errorf("window start %s: the trace ends at %s", o.Window.Start, time.Duration(tr.End)*time.Second)
	}
	end := tr.End
	if o.Window.Length > 0 {
		end = min(end, start+int64(math.Ceil(o.Window.Length.Seconds())))
	}
	c, err := compression(o.Compression, o.Budget, end-start)
	if err != nil {
		return nil, err
	}
	w := &workload{Start: start, End: end, Compression: c, Node: o.Node}
	w.Span = w.at(end)
	return w, nil
}

// compression is c, checked, or when c is 0 the default: span seconds of
// trace over budget, rounded up, at least 1.
func compression(c float64, budget time.Duration, span int64) (float64, error) {
	switch {
	case c == 0 && budget <= 0:
		return 0, fmt.Errorf("budget %s: want a positive time for the default compression", budget)
	case c == 0:
		return max(1, math.Ceil(float64(span)/budget.Seconds())), nil
	case c < 1 || math.IsInf(c, 0) || math.IsNaN(c):
		return 0, fmt.Errorf("compression %v: want at least 1 (trace seconds per replayed second)", c)
	}
	return c, nil
}

// at is the replay offset of trace second s.
func (w *workload) at(s int64) time.Duration {
	return time.Duration(math.Round(float64(s-w.Start) / w.Compression * float64(time.Second)))
}

// requestOf is what a trace pod asks for, GPUs as whole GPUs.
func requestOf(tp tracePod) resources {
	return resources{CPUMilli: tp.CPUMilli, MemoryMiB: tp.MemoryMiB, GPUs: tp.GPUs}
}

// model makes a trace pod a replayed one, counting what the model changes.
func (w *workload) model(tp tracePod) pod {
	p := pod{Name: tp.Name, Req: requestOf(tp), NeverScheduled: tp.Scheduled == absent}
	if tp.GPUs > 0 && tp.GPUMilli < 1000 {
		p.SharedGPU = true
		w.SharedGPU++
	}
	if tp.GPUs >= w.Node.Allocatable.GPUs {
		p.WholeNode = true
		p.Req = w.Node.Allocatable
		w.WholeNode++
	}
	if p.NeverScheduled {
		w.NeverScheduled++
	}
	deleted := tp.Deleted
	if deleted == absent || deleted > w.End {
		deleted = w.End
		w.EndsAtEnd++
	}
	p.Create, p.Delete = w.at(tp.Created), w.at(deleted)
	if p.Delete-p.Create < shortLived {
		w.ShortLived++
	}
	return p
}

// schedule is the pods' creations and deletions by time, then by pod. At
// the same instant deletions come first, but for a pod created then too
// (no lifetime once compressed): its deletion follows its creation.
func schedule(pods []pod) []event {
	ev := make([]event, 0, 2*len(pods))
	for i, p := range pods {
		ev = append(ev, event{At: p.Create, Kind: createEvent, Pod: i}, event{At: p.Delete, Kind: deleteEvent, Pod: i})
	}
	rank := func(e event) int {
		if e.Kind == deleteEvent && pods[e.Pod].Create == e.At {
			return 2
		}
		return int(e.Kind)
	}
	slices.SortFunc(ev, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.At, b.At), cmp.Compare(rank(a), rank(b)), cmp.Compare(a.Pod, b.Pod))
	})
	return ev
}
