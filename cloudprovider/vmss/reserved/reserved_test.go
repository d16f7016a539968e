package reserved

import (
	"testing"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestCPUFollowsAKSTable(t *testing.T) {
	for cores, want := range map[int64]int64{1: 60, 2: 100, 4: 140, 8: 180, 16: 260, 32: 420, 64: 740, 96: 1060} {
		if got := CPU(cores); got != want {
			t.Errorf("CPU(%d cores) = %dm, want %dm", cores, got, want)
		}
	}
}

func TestMemoryFollowsAKSExamples(t *testing.T) {
	gb := int64(1) << 30
	for _, tc := range []struct {
		name          string
		memory, pods  int64
		wantReserved  int64
		wantAllocated string
	}{
		// The documentation's examples: 8 GB and 30 pods reserve 650 MB;
		// 4 GB and 70 pods reserve 25 %, 1 GB.
		{"8 GiB, 30 pods", 8 * gb, 30, 650 * mi, "7442Mi"},
		{"4 GiB, 70 pods", 4 * gb, 70, 1024 * mi, "2972Mi"},
		{"D16s_v5: 64 GiB, 110 pods", 64 * gb, 110, 2250 * mi, "63186Mi"},
		{"ND96isr_H100_v5: 1900 GiB, 110 pods", 1900 * gb, 110, 2250 * mi, "1943250Mi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Memory(tc.memory, tc.pods); got != tc.wantReserved {
				t.Fatalf("Memory = %d Mi, want %d Mi", got/mi, tc.wantReserved/mi)
			}
			alloc := Allocatable(apiv1.ResourceList{
				apiv1.ResourceMemory: *resource.NewQuantity(tc.memory, resource.BinarySI),
				apiv1.ResourcePods:   *resource.NewQuantity(tc.pods, resource.DecimalSI),
			})
			want := resource.MustParse(tc.wantAllocated)
			if got := alloc[apiv1.ResourceMemory]; got.Cmp(want) != 0 {
				t.Fatalf("allocatable memory %s, want %s", got.String(), want.String())
			}
		})
	}
}

func TestAllocatableLeavesOtherResources(t *testing.T) {
	capacity := apiv1.ResourceList{
		apiv1.ResourceCPU:    resource.MustParse("96"),
		"nvidia.com/gpu":     resource.MustParse("8"),
		apiv1.ResourcePods:   resource.MustParse("110"),
		apiv1.ResourceMemory: resource.MustParse("1900Gi"),
	}
	alloc := Allocatable(capacity)
	if got := alloc[apiv1.ResourceCPU]; got.MilliValue() != 96000-1060 {
		t.Fatalf("allocatable CPU %s, want 94940m", got.String())
	}
	if got := alloc["nvidia.com/gpu"]; got.Value() != 8 {
		t.Fatalf("GPUs %s, want 8 untouched", got.String())
	}
	if got := capacity[apiv1.ResourceCPU]; got.Value() != 96 {
		t.Fatalf("capacity changed to %s", got.String())
	}
}
