package armsim

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func skuByName(t *testing.T, name string) SKU {
	t.Helper()
	for _, k := range DefaultSKUs() {
		if k.Name == name {
			return k
		}
	}
	t.Fatalf("no SKU %s", name)
	return SKU{}
}

// TestRealismResources writes out, per SKU and formula, the capacity and
// allocatable a registered node reports. The AKS numbers:
//
//	Standard_D16s_v5, 16 vCPU, 64 GiB, 250 pods, AKS 1.29+:
//	  CPU     16000m - 260m kube-reserved                       = 15740m
//	  memory  65536Mi - min(20*250+50, 65536/4)Mi - 100Mi evict = 65536 - 5050 - 100 = 60386Mi
//	Standard_ND96isr_H100_v5, 96 vCPU, 1900 GiB, 250 pods, AKS 1.29+:
//	  CPU     96000m - 1060m                                    = 94940m
//	  memory  1945600Mi - 5050Mi - 100Mi                        = 1940450Mi
//	Before 1.29 (regressive memory, 750Mi eviction):
//	  64 GiB:   25%*4096 + 20%*4096 + 10%*8192 + 6%*49152 = 5611Mi;  65536 - 5611 - 750 = 59175Mi
//	  1900 GiB: ... + 6%*114688 + 2%*1814528 = 45834Mi;          1945600 - 45834 - 750 = 1899016Mi
//	Ephemeral storage (128 GB OS disk): 129886128Ki less nodefs.available 10% = 119703055367 bytes.
func TestRealismResources(t *testing.T) {
	d16 := skuByName(t, "Standard_D16s_v5")
	h100 := skuByName(t, "Standard_ND96isr_H100_v5")
	// The two examples of AKS's docs (Kubernetes 1.29+): 8 GB and 30 pods
	// reserve 650 MB; 4 GB and 70 pods reserve 25% (1000 MB < 1450 MB).
	docs8 := SKU{Name: "docs8", VCPUs: 2, MemoryGB: 8}
	docs4 := SKU{Name: "docs4", VCPUs: 1, MemoryGB: 4}
	aks := func(pods int) Realism { return Realism{Reservation: ReservationAKS, MaxPods: pods} }
	tests := []struct {
		name                    string
		sku                     SKU
		realism                 Realism
		capCPU, capMem, capPods string
		capStorage              string
		allocCPU, allocMem      string
		allocStorage, allocGPUs string
		capGPUs                 string
	}{
		{"D16s_v5 default realism", d16, DefaultRealism(), "16", "64Gi", "250", "129886128Ki", "15740m", "60386Mi", "119703055367", "", ""},
		{"H100 default realism", h100, DefaultRealism(), "96", "1900Gi", "250", "129886128Ki", "94940m", "1940450Mi", "119703055367", "8", "8"},
		{"D16s_v5 before 1.29", d16, Realism{Reservation: ReservationAKSLegacy, MaxPods: 250}, "16", "64Gi", "250", "100Gi", "15740m", "59175Mi", "96636764000", "", ""},
		{"H100 before 1.29", h100, Realism{Reservation: ReservationAKSLegacy, MaxPods: 250}, "96", "1900Gi", "250", "100Gi", "94940m", "1899016Mi", "96636764000", "8", "8"},
		{"AKS docs: 8 GB, 30 pods", docs8, aks(30), "2", "8Gi", "30", "100Gi", "1900m", "7442Mi", "96636764000", "", ""},
		{"AKS docs: 4 GB, 70 pods, 25% cap", docs4, aks(70), "1", "4Gi", "70", "100Gi", "940m", "2972Mi", "96636764000", "", ""},
		{"max pods unset: the kubelet's 110", d16, aks(0), "16", "64Gi", "110", "100Gi", "15740m", "63186Mi", "96636764000", "", ""},
		{"exact: allocatable is capacity", h100, Exact(), "96", "1900Gi", "110", "100Gi", "96", "1900Gi", "100Gi", "8", "8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			capacity, allocatable := tt.realism.Resources(tt.sku)
			want := func(list v1.ResourceList, listName string, name v1.ResourceName, value string) {
				t.Helper()
				got, ok := list[name]
				if value == "" {
					if ok {
						t.Errorf("%s %s = %s, want none", listName, name, got.String())
					}
					return
				}
				if !ok || got.Cmp(resource.MustParse(value)) != 0 {
					t.Errorf("%s %s = %s, want %s", listName, name, got.String(), value)
				}
			}
			want(capacity, "capacity", v1.ResourceCPU, tt.capCPU)
			want(capacity, "capacity", v1.ResourceMemory, tt.capMem)
			want(capacity, "capacity", v1.ResourcePods, tt.capPods)
			want(capacity, "capacity", v1.ResourceEphemeralStorage, tt.capStorage)
			want(capacity, "capacity", GPUResource, tt.capGPUs)
			want(allocatable, "allocatable", v1.ResourceCPU, tt.allocCPU)
			want(allocatable, "allocatable", v1.ResourceMemory, tt.allocMem)
			want(allocatable, "allocatable", v1.ResourcePods, tt.capPods)
			want(allocatable, "allocatable", v1.ResourceEphemeralStorage, tt.allocStorage)
			want(allocatable, "allocatable", GPUResource, tt.allocGPUs)
		})
	}
}

// TestKubeReservedCPU checks AKS's published CPU table (1 to 64 cores) and
// the rule's continuation.
func TestKubeReservedCPU(t *testing.T) {
	for cores, want := range map[int]int64{1: 60, 2: 100, 3: 120, 4: 140, 8: 180, 16: 260, 24: 340, 32: 420, 64: 740, 96: 1060} {
		if got := kubeReservedCPUMilli(cores); got != want {
			t.Errorf("kube-reserved CPU for %d cores = %dm, want %dm", cores, got, want)
		}
	}
}

func TestParseReservation(t *testing.T) {
	for _, r := range []Reservation{ReservationNone, ReservationAKS, ReservationAKSLegacy} {
		got, err := ParseReservation(r.String())
		if err != nil || got != r {
			t.Errorf("ParseReservation(%q) = %v, %v; want %v", r.String(), got, err, r)
		}
	}
	if _, err := ParseReservation("gke"); err == nil || !strings.Contains(err.Error(), `"gke"`) {
		t.Errorf("ParseReservation(gke) error %v, want one naming the value", err)
	}
}

func TestRealismValidate(t *testing.T) {
	tests := []struct {
		name    string
		r       Realism
		wantErr string
	}{
		{"default", DefaultRealism(), ""},
		{"exact", Exact(), ""},
		{"unknown reservation", Realism{Reservation: 7}, "reservation 7"},
		{"negative pods", Realism{MaxPods: -1}, "max pods -1"},
		{"negative storage", Realism{EphemeralStorage: resource.MustParse("-1Gi")}, "ephemeral storage -1Gi"},
		{"negative device plugin delay", Realism{DevicePluginDelay: -time.Second}, "device plugin delay -1s"},
		{"negative taint delay", Realism{StartupTaintDelay: -time.Second}, "startup taint delay -1s"},
		{"taint without effect", Realism{StartupTaints: []v1.Taint{{Key: "a", Value: "b"}}}, "startup taint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.r.Validate()
			wantError(t, "Validate", err, tt.wantErr)
		})
	}
}

func TestAzureProviderID(t *testing.T) {
	tests := []struct{ arm, want string }{
		{
			"azure:///subscriptions/0000-AB/resourceGroups/MC_rg_Cluster_eastus/providers/Microsoft.Compute/virtualMachineScaleSets/H100Pool/virtualMachines/3",
			"azure:///subscriptions/0000-AB/resourceGroups/mc_rg_cluster_eastus/providers/Microsoft.Compute/virtualMachineScaleSets/H100Pool/virtualMachines/3",
		},
		{ // the segment's own case does not matter
			"azure:///subscriptions/s/resourcegroups/RG/providers/Microsoft.Compute/virtualMachineScaleSets/p/virtualMachines/0",
			"azure:///subscriptions/s/resourcegroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/p/virtualMachines/0",
		},
		{"azure:///subscriptions/s/resourceGroups/rg/providers/x", "azure:///subscriptions/s/resourceGroups/rg/providers/x"},
		{"kwok://node-1", "kwok://node-1"},
	}
	for _, tt := range tests {
		got := AzureProviderID(tt.arm)
		if got != tt.want {
			t.Errorf("AzureProviderID(%s)\n = %s\nwant %s", tt.arm, got, tt.want)
		}
		if !strings.EqualFold(got, tt.arm) {
			t.Errorf("AzureProviderID(%s) = %s differs in more than case", tt.arm, got)
		}
	}
}

func TestLabelValue(t *testing.T) {
	tests := []struct{ in, want string }{
		{"MC_rg_cluster_eastus", "MC_rg_cluster_eastus"},
		{"rg(prod)", "rg-prod"},
		{"_rg.", "rg"},
		{strings.Repeat("a", 62) + "_b", strings.Repeat("a", 62)},
	}
	for _, tt := range tests {
		if got := labelValue(tt.in); got != tt.want {
			t.Errorf("labelValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
