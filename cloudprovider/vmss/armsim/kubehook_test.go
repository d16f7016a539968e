package armsim

import (
	"context"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestKubeNodeHookNode registers nodes in exact mode: labels and taints
// from tags, resources equal to the SKU's, ARM's provider ID.
func TestKubeNodeHookNode(t *testing.T) {
	skus := map[string]SKU{}
	for _, k := range DefaultSKUs() {
		skus[k.Name] = k
	}
	registered := v1.Taint{Key: "node.example.com/initializing", Value: "true", Effect: v1.TaintEffectNoSchedule}
	tests := []struct {
		name            string
		vm              VM
		wantLabels      map[string]string
		absentLabels    []string
		wantTaints      []v1.Taint
		wantCapacity    map[v1.ResourceName]string
		wantNoGPU       bool
		wantArch        string
		wantAnnotations map[string]string
	}{
		{
			name: "zoned GPU VM with template tags",
			vm: VM{
				ResourceGroup: "rg", ScaleSet: "H100Pool", InstanceID: "37", ComputerName: "H100Pool000011",
				ProviderID: "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/H100Pool/virtualMachines/37",
				SKU:        skus["Standard_ND96isr_H100_v5"], Location: "eastus", Zone: "2",
				Tags: map[string]string{
					LabelTagPrefix + "team":              "ml",
					LabelTagPrefix + "example.com__pool": "gpu",
					TaintTagPrefix + "nvidia.com__gpu":   "present:NoSchedule",
					TaintTagPrefix + "dedicated":         "ml:NoExecute",
					TaintTagPrefix + "broken":            "no-effect",
					"unrelated":                          "x",
				},
			},
			wantLabels: map[string]string{
				"kubernetes.io/hostname":           "h100pool000011",
				"node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5",
				"topology.kubernetes.io/region":    "eastus",
				"topology.kubernetes.io/zone":      "eastus-2",
				"kubernetes.io/arch":               "amd64",
				"kubernetes.io/os":                 "linux",
				"kubernetes.azure.com/accelerator": "nvidia",
				"vmss-autoscaler.io/node-group":    "H100Pool",
				"kubernetes.azure.com/agentpool":   "H100Pool",
				"kubernetes.azure.com/cluster":     "rg",
				"team":                             "ml",
				"example.com/pool":                 "gpu",
			},
			absentLabels: []string{"unrelated"},
			wantTaints: []v1.Taint{
				{Key: "dedicated", Value: "ml", Effect: v1.TaintEffectNoExecute},
				{Key: "nvidia.com/gpu", Value: "present", Effect: v1.TaintEffectNoSchedule},
				registered,
			},
			wantCapacity: map[v1.ResourceName]string{
				v1.ResourceCPU: "96", v1.ResourceMemory: "1900Gi", GPUResource: "8",
				v1.ResourcePods: "110", v1.ResourceEphemeralStorage: "100Gi",
			},
			wantArch:        "amd64",
			wantAnnotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		},
		{
			name: "unzoned Arm64 VM",
			vm: VM{
				ResourceGroup: "rg", ScaleSet: "arm", InstanceID: "0", ComputerName: "arm000000",
				ProviderID: "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/arm/virtualMachines/0",
				SKU:        skus["Standard_D16ps_v5"], Location: "westus3",
			},
			wantLabels: map[string]string{
				"kubernetes.io/arch":            "arm64",
				"topology.kubernetes.io/region": "westus3",
				"vmss-autoscaler.io/node-group": "arm",
			},
			absentLabels:    []string{"topology.kubernetes.io/zone", "kubernetes.azure.com/accelerator"},
			wantTaints:      []v1.Taint{registered},
			wantCapacity:    map[v1.ResourceName]string{v1.ResourceCPU: "16", v1.ResourceMemory: "64Gi"},
			wantNoGPU:       true,
			wantArch:        "arm64",
			wantAnnotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			hook := &KubeNodeHook{
				Client:         client,
				RegisterTaints: []v1.Taint{registered},
				Annotations:    map[string]string{"kwok.x-k8s.io/node": "fake"},
				Realism:        Exact(), // this test is about labels, taints and the exact resources
			}
			ctx := context.Background()
			if err := hook.VMRunning(ctx, tt.vm); err != nil {
				t.Fatalf("VMRunning: %v", err)
			}
			// Idempotent: a retried call finds the node and succeeds.
			if err := hook.VMRunning(ctx, tt.vm); err != nil {
				t.Fatalf("second VMRunning: %v", err)
			}
			nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil || len(nodes.Items) != 1 {
				t.Fatalf("listing nodes: %v, %d nodes", err, len(nodes.Items))
			}
			node := nodes.Items[0]
			if node.Name != tt.wantLabels["kubernetes.io/hostname"] && tt.wantLabels["kubernetes.io/hostname"] != "" {
				t.Errorf("node name %s", node.Name)
			}
			if node.Spec.ProviderID != tt.vm.ProviderID {
				t.Errorf("providerID %s, want %s", node.Spec.ProviderID, tt.vm.ProviderID)
			}
			// Registered NotReady, as a kubelet registers: never without a
			// Ready condition (the scheduler would bind to it).
			if c := node.Status.Conditions; len(c) != 1 || c[0].Type != v1.NodeReady || c[0].Status != v1.ConditionFalse || c[0].Reason != "KubeletNotReady" {
				t.Errorf("conditions %+v, want Ready False (KubeletNotReady)", c)
			}
			for k, want := range tt.wantLabels {
				if got, ok := node.Labels[k]; !ok || got != want {
					t.Errorf("label %s = %q, want %q", k, got, want)
				}
			}
			for _, k := range tt.absentLabels {
				if v, ok := node.Labels[k]; ok {
					t.Errorf("unexpected label %s=%s", k, v)
				}
			}
			if !slices.EqualFunc(node.Spec.Taints, tt.wantTaints, func(a, b v1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) {
				t.Errorf("taints %v, want %v", node.Spec.Taints, tt.wantTaints)
			}
			for name, want := range tt.wantCapacity {
				for listName, list := range map[string]v1.ResourceList{"capacity": node.Status.Capacity, "allocatable": node.Status.Allocatable} {
					got, ok := list[name]
					if !ok || got.Cmp(resource.MustParse(want)) != 0 {
						t.Errorf("%s %s = %v, want %s", listName, name, got.String(), want)
					}
				}
			}
			if _, ok := node.Status.Capacity[GPUResource]; tt.wantNoGPU && ok {
				t.Errorf("non-GPU node has %s capacity", GPUResource)
			}
			if node.Status.NodeInfo.Architecture != tt.wantArch {
				t.Errorf("nodeInfo.architecture %s, want %s", node.Status.NodeInfo.Architecture, tt.wantArch)
			}
			for k, want := range tt.wantAnnotations {
				if got := node.Annotations[k]; got != want {
					t.Errorf("annotation %s = %q, want %q", k, got, want)
				}
			}

			for range 2 { // the second time the node is already gone
				if err := hook.VMDeleted(ctx, tt.vm); err != nil {
					t.Fatalf("VMDeleted: %v", err)
				}
			}
			if _, err := client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("node still there after VMDeleted: %v", err)
			}
		})
	}
}

func TestParseTaint(t *testing.T) {
	tests := []struct {
		in      string
		want    v1.Taint
		wantErr bool
	}{
		{"a=b:NoSchedule", v1.Taint{Key: "a", Value: "b", Effect: v1.TaintEffectNoSchedule}, false},
		{"example.com/x=y:z:NoExecute", v1.Taint{Key: "example.com/x", Value: "y:z", Effect: v1.TaintEffectNoExecute}, false},
		{"a:PreferNoSchedule", v1.Taint{Key: "a", Effect: v1.TaintEffectPreferNoSchedule}, false},
		{"a=b", v1.Taint{}, true},
		{"a=b:Sometimes", v1.Taint{}, true},
		{"=b:NoSchedule", v1.Taint{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTaint(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseTaint(%q) error %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if !tt.wantErr && (got.Key != tt.want.Key || got.Value != tt.want.Value || got.Effect != tt.want.Effect) {
				t.Fatalf("ParseTaint(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}
