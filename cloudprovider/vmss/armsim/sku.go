package armsim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
)

// CPU architectures a SKU can have, as ARM spells them in the
// CpuArchitectureType capability.
const (
	ArchX64   = "x64"
	ArchArm64 = "Arm64"
)

// SKU is a virtual machine size the simulator offers.
type SKU struct {
	Name     string  // e.g. "Standard_ND96isr_H100_v5"
	Family   string  // e.g. "standardNDSH100v5Family"
	VCPUs    int     // virtual CPUs
	MemoryGB float64 // memory in GiB
	GPUs     int     // NVIDIA GPUs, 0 for none
	Arch     string  // ArchX64 or ArchArm64
	// ExtensionDelay is how long a new VM of the size stays Creating
	// after its OS is up, provisioning its extensions; 0 takes
	// Options.ExtensionDelay.
	ExtensionDelay time.Duration
	// Isolated is an isolated size (one hardware type, one customer),
	// whose scale sets refuse force deletion; the sizes
	// cluster-autoscaler lists as isolated are, without it.
	Isolated bool
}

// GPUExtensionDelay is an ExtensionDelay for GPU sizes: the NVIDIA driver
// is installed at node provisioning ("Create a fully managed GPU node
// pool on AKS"), which takes minutes. Microsoft publishes no figure; five
// minutes is the simulator's assumption. DefaultSKUs leaves it off, so
// that tests keep their timing.
const GPUExtensionDelay = 5 * time.Minute

// DefaultSKUs returns the SKUs the simulator offers when Options.SKUs is empty.
func DefaultSKUs() []SKU {
	return []SKU{
		{Name: "Standard_D16s_v5", Family: "standardDSv5Family", VCPUs: 16, MemoryGB: 64, Arch: ArchX64},
		{Name: "Standard_D64s_v5", Family: "standardDSv5Family", VCPUs: 64, MemoryGB: 256, Arch: ArchX64},
		{Name: "Standard_D16ps_v5", Family: "standardDPSv5Family", VCPUs: 16, MemoryGB: 64, Arch: ArchArm64},
		{Name: "Standard_NC24ads_A100_v4", Family: "StandardNCADSA100v4Family", VCPUs: 24, MemoryGB: 220, GPUs: 1, Arch: ArchX64},
		{Name: "Standard_ND96asr_v4", Family: "standardNDASv4_A100Family", VCPUs: 96, MemoryGB: 900, GPUs: 8, Arch: ArchX64},
		{Name: "Standard_ND96isr_H100_v5", Family: "standardNDSH100v5Family", VCPUs: 96, MemoryGB: 1900, GPUs: 8, Arch: ArchX64},
	}
}

func (k SKU) validate() error {
	switch {
	case k.Name == "":
		return fmt.Errorf("SKU name is empty")
	case k.Family == "":
		return fmt.Errorf("SKU %s: family is empty", k.Name)
	case k.VCPUs <= 0:
		return fmt.Errorf("SKU %s: vCPUs must be positive, got %d", k.Name, k.VCPUs)
	case k.MemoryGB <= 0:
		return fmt.Errorf("SKU %s: memory must be positive, got %v GB", k.Name, k.MemoryGB)
	case k.GPUs < 0:
		return fmt.Errorf("SKU %s: GPUs must not be negative, got %d", k.Name, k.GPUs)
	case k.ExtensionDelay < 0:
		return fmt.Errorf("SKU %s: extension delay must not be negative, got %v", k.Name, k.ExtensionDelay)
	case k.Arch != ArchX64 && k.Arch != ArchArm64:
		return fmt.Errorf("SKU %s: architecture must be %q or %q, got %q", k.Name, ArchX64, ArchArm64, k.Arch)
	}
	return nil
}

// size is the SKU name without its tier prefix, as ARM reports it.
func (k SKU) size() string {
	if _, after, ok := strings.Cut(k.Name, "_"); ok {
		return after
	}
	return k.Name
}

// resourceSKU renders the SKU as ARM's resource SKU list does.
func (k SKU) resourceSKU(location string) *armcompute.ResourceSKU {
	capability := func(name, value string) *armcompute.ResourceSKUCapabilities {
		return &armcompute.ResourceSKUCapabilities{Name: to.Ptr(name), Value: to.Ptr(value)}
	}
	caps := []*armcompute.ResourceSKUCapabilities{
		capability("vCPUs", strconv.Itoa(k.VCPUs)),
		capability("vCPUsAvailable", strconv.Itoa(k.VCPUs)),
		capability("MemoryGB", strconv.FormatFloat(k.MemoryGB, 'f', -1, 64)),
	}
	if k.GPUs > 0 {
		caps = append(caps, capability("GPUs", strconv.Itoa(k.GPUs)))
	}
	caps = append(caps,
		capability("CpuArchitectureType", k.Arch),
		capability("HyperVGenerations", "V2"),
		capability("PremiumIO", "True"),
		capability("AcceleratedNetworkingEnabled", "True"),
	)
	return &armcompute.ResourceSKU{
		ResourceType: to.Ptr("virtualMachines"),
		Name:         to.Ptr(k.Name),
		Tier:         to.Ptr("Standard"),
		Size:         to.Ptr(k.size()),
		Family:       to.Ptr(k.Family),
		Locations:    []*string{to.Ptr(location)},
		LocationInfo: []*armcompute.ResourceSKULocationInfo{{
			Location: to.Ptr(location),
			Zones:    []*string{to.Ptr("1"), to.Ptr("2"), to.Ptr("3")},
		}},
		Capabilities: caps,
		Restrictions: []*armcompute.ResourceSKURestrictions{},
	}
}
