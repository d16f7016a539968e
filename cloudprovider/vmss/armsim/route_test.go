package armsim

import (
	"net/http"
	"reflect"
	"testing"
)

func TestParseRoute(t *testing.T) {
	const rgs = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute"
	tests := []struct {
		path string
		want route
		ok   bool
	}{
		{rgs + "/virtualMachines", route{sub: "s", rg: "rg", ops: map[string]string{http.MethodGet: OpListVirtualMachines}}, true},
		{rgs + "/virtualMachines/vm-1/Restart", route{sub: "s", rg: "rg", instance: "vm-1",
			ops: map[string]string{http.MethodPost: OpRestartVirtualMachine}}, true},
		{rgs + "/virtualMachines/vm-1/start", route{}, false},
		{"/subscriptions/s/providers/Microsoft.Compute/skus", route{sub: "s", ops: map[string]string{http.MethodGet: OpListSKUs}}, true},
		{"/SUBSCRIPTIONS/s/PROVIDERS/microsoft.compute/Locations/eastus/operations/op-1",
			route{sub: "s", opID: "op-1", ops: map[string]string{http.MethodGet: OpPollOperation}}, true},
		{rgs + "/virtualMachineScaleSets", route{sub: "s", rg: "rg", ops: map[string]string{http.MethodGet: OpListScaleSets}}, true},
		{rgs + "/virtualMachineScaleSets/ss/", route{sub: "s", rg: "rg", name: "ss",
			ops: map[string]string{http.MethodGet: OpGetScaleSet, http.MethodPatch: OpUpdateScaleSet}}, true},
		{rgs + "/virtualMachineScaleSets/ss/delete", route{sub: "s", rg: "rg", name: "ss",
			ops: map[string]string{http.MethodPost: OpDeleteInstances}}, true},
		{rgs + "/virtualMachineScaleSets/ss/virtualMachines", route{sub: "s", rg: "rg", name: "ss",
			ops: map[string]string{http.MethodGet: OpListVMs}}, true},
		{rgs + "/virtualMachineScaleSets/ss/virtualMachines/3", route{sub: "s", rg: "rg", name: "ss", instance: "3",
			ops: map[string]string{http.MethodGet: OpGetVM}}, true},
		{rgs + "/virtualMachineScaleSets/ss/virtualMachines/3/reimage", route{sub: "s", rg: "rg", name: "ss", instance: "3",
			ops: map[string]string{http.MethodPost: OpReimageVM}}, true},
		{rgs + "/virtualMachineScaleSets/a%2Fb", route{sub: "s", rg: "rg", name: "a/b",
			ops: map[string]string{http.MethodGet: OpGetScaleSet, http.MethodPatch: OpUpdateScaleSet}}, true},
		{rgs + "/virtualMachineScaleSets/ss/virtualMachines/3/reimage/more", route{}, false},
		{rgs + "/virtualMachineScaleSets/ss/start", route{}, false},
		{rgs + "/virtualMachineScaleSets/%zz", route{}, false},
		{rgs + "//virtualMachineScaleSets", route{}, false},
		{"/subscriptions", route{}, false},
		{"/tenants/s/providers/Microsoft.Compute/skus", route{}, false},
		{"/subscriptions/s/providers/Microsoft.Network/skus", route{}, false},
	}
	for _, tt := range tests {
		got, ok := parseRoute(tt.path)
		if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseRoute(%q) = %+v, %v; want %+v, %v", tt.path, got, ok, tt.want, tt.ok)
		}
	}
}
