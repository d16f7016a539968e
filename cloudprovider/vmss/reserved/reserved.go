// Package reserved says what AKS keeps back on a Linux node for the
// kubelet and the system, by its published formula ("Node resource
// reservations" in the AKS documentation), so a template built from a
// VM size alone offers pods what a real node of that size will:
//
//	allocatable = capacity − kube-reserved − eviction threshold
//
// CPU, kube-reserved, in millicores, by the cores on the host:
//
//	cores     1   2   4   8  16  32  64
//	reserved 60 100 140 180 260 420 740
//
// that is 60m for the first core, 40m for the second, 20m each for the
// third and fourth, and 10m for every core after; beyond 64 cores (an
// ND96 H100 VM has 96) the same 10m a core continues the table.
//
// Memory, AKS 1.29 and later: kube-reserved is the smaller of
// 20 MiB × the node's max pods + 50 MiB and 25 % of the memory, and the
// kubelet evicts below 100 MiB available (memory.available<100Mi).
//
// Only a node (its allocatable, as the kubelet reports it) says the truth:
// this estimate is for node groups with no node to learn from.
package reserved

import (
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

const (
	mi = int64(1) << 20
	// EvictionThreshold is the kubelet's hard eviction threshold for
	// memory on AKS 1.29+ nodes (memory.available<100Mi).
	EvictionThreshold = 100 * mi
)

// CPU returns the kube-reserved CPU in millicores of a host with cores.
func CPU(cores int64) int64 {
	var m int64
	for c := int64(1); c <= cores; c++ {
		switch {
		case c == 1:
			m += 60
		case c == 2:
			m += 40
		case c <= 4:
			m += 20
		default:
			m += 10
		}
	}
	return m
}

// Memory returns the kube-reserved memory in bytes of a host with memory
// bytes and maxPods pods.
func Memory(memory, maxPods int64) int64 {
	return min(20*mi*maxPods+50*mi, memory/4)
}

// Allocatable returns capacity less kube-reserved and, for memory, the
// eviction threshold; other resources are left as they are.
func Allocatable(capacity apiv1.ResourceList) apiv1.ResourceList {
	out := capacity.DeepCopy()
	if c, ok := capacity[apiv1.ResourceCPU]; ok {
		milli := c.MilliValue()
		out[apiv1.ResourceCPU] = *resource.NewMilliQuantity(max(0, milli-CPU(milli/1000)), resource.DecimalSI)
	}
	if m, ok := capacity[apiv1.ResourceMemory]; ok {
		pods := int64(110)
		if p, ok := capacity[apiv1.ResourcePods]; ok {
			pods = p.Value()
		}
		out[apiv1.ResourceMemory] = *resource.NewQuantity(max(0, m.Value()-Memory(m.Value(), pods)-EvictionThreshold), resource.BinarySI)
	}
	return out
}
