package armsim

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/reserved"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Realism says how far a node registered by KubeNodeHook departs from the
// ideal node its SKU describes, the way a real AKS node does. DefaultRealism
// is a node as AKS registers it; the zero Realism (Exact) is the ideal node:
// allocatable equal to capacity, ARM's provider ID, GPUs at once.
//
// What a real node does, and so what the realistic defaults model:
//
//   - Allocatable is capacity less kube-reserved and the hard eviction
//     threshold (Kubernetes' node allocatable; AKS sets no system-reserved).
//     AKS reserves CPU by a regressive table of the core count and memory by
//     a formula that changed with Kubernetes 1.29 (see Reservation). AKS
//     docs: "Node resource reservations in Azure Kubernetes Service".
//   - Ephemeral storage: the OS disk's filesystem, of which the kubelet's
//     nodefs.available<10% hard eviction threshold is not allocatable.
//   - Pods: the node pool's max pods (250 on Azure CNI Overlay, AKS's
//     recommended network plugin; 110 on kubenet, 30 on Azure CNI node
//     subnet).
//   - Provider IDs: cloud-provider-azure writes a scale set VM's
//     spec.providerID with the resource group lower-cased
//     (getVmssMachineID: strings.ToLower(resourceGroup)), while ARM returns
//     resource IDs with the resource group as it was created (AKS node
//     resource groups start "MC_"). The two differ in case only.
//   - GPUs: the kubelet knows nvidia.com/gpu only once the NVIDIA device
//     plugin (a DaemonSet) has started on the node and registered with it,
//     some seconds after the node registered and turned Ready.
//   - Startup taints: network agents (Cilium's
//     node.cilium.io/agent-not-ready, for one) taint a new node until their
//     agent runs on it, then remove the taint.
//
// Boot-time jitter belongs to the ARM side (Options.BootJitter).
type Realism struct {
	// Reservation is the formula for allocatable CPU and memory.
	// ReservationNone (the zero value): allocatable = capacity.
	Reservation Reservation
	// MaxPods is the node's pods capacity; 0 means the kubelet's default,
	// 110.
	MaxPods int
	// EphemeralStorage is the node's ephemeral-storage capacity; zero means
	// 100Gi. When Reservation is not ReservationNone, 10% of it (the
	// nodefs.available<10% eviction threshold) is not allocatable.
	EphemeralStorage resource.Quantity
	// AzureProviderIDs writes the node's providerID as cloud-provider-azure
	// does, resource group lower-cased; false writes ARM's resource ID as it
	// is.
	AzureProviderIDs bool
	// DevicePluginDelay is how long after registering a GPU node gets
	// nvidia.com/gpu in its capacity and allocatable; 0 = at registration.
	DevicePluginDelay time.Duration
	// StartupTaints are put on every node at registration and removed
	// StartupTaintDelay later, as a network agent does once it runs. With
	// a zero delay they are never put on.
	StartupTaints     []v1.Taint
	StartupTaintDelay time.Duration
}

// Realistic defaults.
const (
	// DefaultMaxPods is AKS's default max pods with Azure CNI Overlay.
	DefaultMaxPods = 250
	// DefaultDevicePluginDelay is how long the NVIDIA device plugin takes
	// to advertise GPUs after the node registers.
	DefaultDevicePluginDelay = 20 * time.Second
	// DefaultStartupTaintDelay is how long a startup taint stays when
	// Realism.StartupTaints has any.
	DefaultStartupTaintDelay = 15 * time.Second
	// exactMaxPods is the kubelet's default max pods.
	exactMaxPods = 110
)

// DefaultEphemeralStorage is the ephemeral-storage capacity an AKS node
// reports with AKS's default 128 GB OS disk (its filesystem, as kubelet
// measures it): 129886128Ki.
func DefaultEphemeralStorage() resource.Quantity { return resource.MustParse("129886128Ki") }

// exactEphemeralStorage is the ephemeral-storage capacity in exact mode.
func exactEphemeralStorage() resource.Quantity { return resource.MustParse("100Gi") }

// DefaultRealism is a node as AKS registers it on Kubernetes 1.29 and later
// with Azure CNI Overlay: AKS's reservations, 250 pods, a 128 GB OS disk,
// provider IDs as cloud-provider-azure writes them and GPUs 20 s after
// registration. It has no startup taints (set StartupTaints to model a
// network agent's).
func DefaultRealism() Realism {
	return Realism{
		Reservation:       ReservationAKS,
		MaxPods:           DefaultMaxPods,
		EphemeralStorage:  DefaultEphemeralStorage(),
		AzureProviderIDs:  true,
		DevicePluginDelay: DefaultDevicePluginDelay,
		StartupTaintDelay: DefaultStartupTaintDelay,
	}
}

// Exact is the ideal node, for tests whose subject is not the node's
// realism: allocatable equal to capacity (110 pods, 100Gi ephemeral
// storage), ARM's resource ID as the providerID, GPUs at registration, no
// startup taints. It is the zero Realism.
func Exact() Realism { return Realism{} }

// Validate reports the first invalid field, naming it and its value.
func (r Realism) Validate() error {
	var errs []error
	if r.Reservation < ReservationNone || r.Reservation > ReservationAKSLegacy {
		errs = append(errs, fmt.Errorf("reservation %d: unknown", int(r.Reservation)))
	}
	if r.MaxPods < 0 {
		errs = append(errs, fmt.Errorf("max pods %d: must not be negative", r.MaxPods))
	}
	if r.EphemeralStorage.Sign() < 0 {
		errs = append(errs, fmt.Errorf("ephemeral storage %s: must not be negative", r.EphemeralStorage.String()))
	}
	if r.DevicePluginDelay < 0 {
		errs = append(errs, fmt.Errorf("device plugin delay %v: must not be negative", r.DevicePluginDelay))
	}
	if r.StartupTaintDelay < 0 {
		errs = append(errs, fmt.Errorf("startup taint delay %v: must not be negative", r.StartupTaintDelay))
	}
	for _, t := range r.StartupTaints {
		if _, err := ParseTaint(t.ToString()); err != nil {
			errs = append(errs, fmt.Errorf("startup taint: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("realism: %w", err)
	}
	return nil
}

// maxPods is the node's pods capacity.
func (r Realism) maxPods() int {
	if r.MaxPods == 0 {
		return exactMaxPods
	}
	return r.MaxPods
}

// Resources returns the capacity and allocatable a node of the SKU reports
// once it is fully up (GPUs included; the hook adds them
// DevicePluginDelay after registration).
func (r Realism) Resources(sku SKU) (capacity, allocatable v1.ResourceList) {
	storage := r.EphemeralStorage
	if storage.IsZero() {
		storage = exactEphemeralStorage()
	}
	memoryBytes := int64(sku.MemoryGB * (1 << 30))
	pods := int64(r.maxPods())
	capacity = v1.ResourceList{
		v1.ResourceCPU:              *resource.NewQuantity(int64(sku.VCPUs), resource.DecimalSI),
		v1.ResourceMemory:           *resource.NewQuantity(memoryBytes, resource.BinarySI),
		v1.ResourcePods:             *resource.NewQuantity(pods, resource.DecimalSI),
		v1.ResourceEphemeralStorage: storage,
	}
	if sku.GPUs > 0 {
		capacity[GPUResource] = *resource.NewQuantity(int64(sku.GPUs), resource.DecimalSI)
	}
	allocatable = capacity.DeepCopy()
	if r.Reservation == ReservationNone {
		return capacity, allocatable
	}
	cpuMilli := max(int64(sku.VCPUs)*1000-kubeReservedCPUMilli(sku.VCPUs), 0)
	reservedMi, evictionMi := r.Reservation.memoryMi(memoryBytes>>20, r.maxPods())
	allocatable[v1.ResourceCPU] = *resource.NewMilliQuantity(cpuMilli, resource.DecimalSI)
	allocatable[v1.ResourceMemory] = *resource.NewQuantity(max(memoryBytes-(reservedMi+evictionMi)<<20, 0), resource.BinarySI)
	allocatable[v1.ResourceEphemeralStorage] = *resource.NewQuantity(storage.Value()-nodefsEvictionBytes(storage.Value()), resource.BinarySI)
	return capacity, allocatable
}

// Reservation is a formula for the CPU and memory a node keeps from pods
// (kube-reserved plus the memory.available hard eviction threshold).
//
// CPU, every formula: AKS's regressive kube-reserved table, 6% of the first
// core, 4% of the second, 2% of the third and fourth and 1% of every core
// above four. AKS publishes it for 1 to 64 cores: 60, 100, 140, 180, 260,
// 420 and 740 millicores for 1, 2, 4, 8, 16, 32 and 64 cores; the same
// rule gives 1060m for 96 cores.
//
// Memory is in MiB, as the kubelet flags AKS writes are (AKS's docs say
// "MB"); see ReservationAKS and ReservationAKSLegacy.
//
// Worked examples, with 250 max pods (the table test has them all):
//
//	SKU                       capacity            allocatable (aks)       allocatable (aks-legacy)
//	Standard_D16s_v5          16 CPU, 64 GiB      15740m, 60386Mi         15740m, 59175Mi
//	Standard_ND96isr_H100_v5  96 CPU, 1900 GiB    94940m, 1940450Mi       94940m, 1899016Mi
type Reservation int

const (
	// ReservationNone reserves nothing: allocatable equals capacity.
	ReservationNone Reservation = iota
	// ReservationAKS is AKS's formula for Kubernetes 1.29 and later:
	// kube-reserved memory is 20 MiB per max pod plus 50 MiB, capped at 25%
	// of the node's memory, and the eviction threshold is
	// memory.available<100Mi. 250 pods reserve 5,050 MiB + 100 MiB on any
	// node of 20 GiB or more.
	ReservationAKS
	// ReservationAKSLegacy is AKS's formula before Kubernetes 1.29:
	// kube-reserved memory is regressive, 25% of the first 4 GiB, 20% of the
	// next 4, 10% of the next 8, 6% of the next 112 and 2% of the rest, and
	// the eviction threshold is memory.available<750Mi.
	ReservationAKSLegacy
)

// String returns the name ParseReservation accepts.
func (r Reservation) String() string {
	switch r {
	case ReservationNone:
		return "none"
	case ReservationAKS:
		return "aks"
	case ReservationAKSLegacy:
		return "aks-legacy"
	}
	return fmt.Sprintf("Reservation(%d)", int(r))
}

// ParseReservation parses "aks", "aks-legacy" or "none".
func ParseReservation(s string) (Reservation, error) {
	for _, r := range []Reservation{ReservationNone, ReservationAKS, ReservationAKSLegacy} {
		if s == r.String() {
			return r, nil
		}
	}
	return 0, fmt.Errorf("reservation %q: want aks, aks-legacy or none", s)
}

// memoryMi returns the kube-reserved memory and the eviction threshold in
// MiB for a node of memoryMi MiB and maxPods pods.
func (r Reservation) memoryMi(memoryMi int64, maxPods int) (kubeReserved, eviction int64) {
	switch r {
	case ReservationAKS:
		return reserved.Memory(memoryMi<<20, int64(maxPods)) >> 20, reserved.EvictionThreshold >> 20
	case ReservationAKSLegacy:
		return regressive(memoryMi, []bracket{{4 << 10, 25}, {8 << 10, 20}, {16 << 10, 10}, {128 << 10, 6}, {-1, 2}}), 750
	}
	return 0, 0
}

// bracket is a band of a regressive reservation: percent of the amount up
// to upTo (-1: no bound) above the previous band's bound.
type bracket struct {
	upTo    int64
	percent int64
}

// regressive sums each band's percent of the part of amount in the band,
// truncating the total once at the end.
func regressive(amount int64, bands []bracket) int64 {
	var sum, lower int64
	for _, b := range bands {
		if amount <= lower {
			break
		}
		upper := amount
		if b.upTo >= 0 && b.upTo < amount {
			upper = b.upTo
		}
		sum += (upper - lower) * b.percent
		lower = b.upTo
	}
	return sum / 100
}

// kubeReservedCPUMilli is AKS's kube-reserved CPU for a node of vcpus cores
// (the same table as the autoscaler's estimate for a group at zero).
func kubeReservedCPUMilli(vcpus int) int64 { return reserved.CPU(int64(vcpus)) }

// nodefsEvictionBytes is the kubelet's nodefs.available<10% hard eviction
// threshold for a filesystem of capacity bytes, computed as the kubelet does
// (a float32 percentage times the capacity), so that allocatable matches a
// real node to the byte: 129886128Ki gives 119703055367.
func nodefsEvictionBytes(capacity int64) int64 {
	const percent float32 = 0.1
	return int64(float64(capacity) * float64(percent))
}

// AzureProviderID returns the providerID cloud-provider-azure writes for a
// scale set VM whose ARM provider ID ("azure://" + resource ID) is armID:
// the same string with the resource group lower-cased. That holds for a
// Uniform scale set's VM (.../virtualMachineScaleSets/<set>/virtualMachines/<id>)
// and a Flexible one's (.../virtualMachines/<name>, the VM's resource ID
// from the instance metadata). Anything without a resourceGroups segment
// is returned as it is.
func AzureProviderID(armID string) string {
	parts := strings.Split(armID, "/")
	for i := 0; i+1 < len(parts); i++ {
		if strings.EqualFold(parts[i], "resourceGroups") {
			parts[i+1] = strings.ToLower(parts[i+1])
			return strings.Join(parts, "/")
		}
	}
	return armID
}
