package vmss

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

func TestParseProviderID(t *testing.T) {
	tests := []struct {
		in   string
		ok   bool
		want vmRef
	}{
		{"azure:///subscriptions/S/resourceGroups/RG-One/providers/Microsoft.Compute/virtualMachineScaleSets/gpu-A/virtualMachines/17", true,
			vmRef{"s", "rg-one", "gpu-a", "17"}},
		{"azure:///subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/x/virtualmachines/0", true,
			vmRef{"s", "rg", "x", "0"}},
		{"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm1", false, vmRef{}},
		{"aws:///us-east-1a/i-123", false, vmRef{}},
		{"", false, vmRef{}},
	}
	for _, tc := range tests {
		got, ok := parseProviderID(tc.in)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseProviderID(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestClassOfCode(t *testing.T) {
	tests := []struct {
		status int
		code   string
		msg    string
		want   cloudprovider.ErrorClass
	}{
		{409, "OperationNotAllowed", "Operation could not be completed as it results in exceeding approved standardNDSH100v5Family Cores quota", cloudprovider.ClassQuota},
		{409, "QuotaExceeded", "", cloudprovider.ClassQuota},
		{200, "AllocationFailed", "", cloudprovider.ClassOutOfCapacity},
		{200, "ZonalAllocationFailed", "", cloudprovider.ClassOutOfCapacity},
		{200, "OverconstrainedAllocationRequest", "", cloudprovider.ClassOutOfCapacity},
		{409, "SkuNotAvailable", "", cloudprovider.ClassOutOfCapacity},
		{409, "OperationPreempted", "", cloudprovider.ClassConflict},
		{409, "Conflict", "another operation is in progress", cloudprovider.ClassConflict},
		{409, "ScopeLocked", "The scope '/subscriptions/s/resourceGroups/rg' cannot perform write operation because following scope(s) are locked", cloudprovider.ClassOther},
		{403, "DenyAssignmentAuthorizationFailed", "the access is denied because of the deny assignment", cloudprovider.ClassOther},
		{429, "TooManyRequests", "", cloudprovider.ClassThrottled},
		{500, "InternalServerError", "", cloudprovider.ClassOther},
		{409, "OperationNotAllowed", "scale set is being deleted", cloudprovider.ClassConflict},
		{400, "InvalidParameter", "The value 1016 of parameter 'sku.capacity' is out of range. The value must be between 0 and 1000, inclusive.", cloudprovider.ClassSizeLimit},
		{409, "OperationNotAllowed", "Unable to create or update Virtual Machine Scale Set 'gpu' as it exceeds the total limit of '100' Virtual Machine instances.", cloudprovider.ClassSizeLimit},
		{400, "InvalidParameter", "Parameter 'constrainedMaximumCapacity' is not allowed.", cloudprovider.ClassOther},
	}
	for _, tc := range tests {
		if got := classOfCode(tc.status, tc.code, tc.msg); got != tc.want {
			t.Errorf("classOfCode(%d, %s, %q) = %s, want %s", tc.status, tc.code, tc.msg, got, tc.want)
		}
	}
	err := classify(&azcore.ResponseError{StatusCode: http.StatusConflict, ErrorCode: "QuotaExceeded"})
	if !cloudprovider.IsQuota(err) {
		t.Fatalf("classify(QuotaExceeded) = %v, not a quota error", err)
	}
	if !cloudprovider.IsThrottled(classify(&errThrottled{kind: kindRead, until: time.Now()})) {
		t.Fatal("held-back request is not a throttled error")
	}
	if plain := errors.New("x"); classify(plain) != plain {
		t.Fatal("unclassified error was wrapped")
	}
}

func TestTemplateNodeFromSKUAndTags(t *testing.T) {
	view := &scaleSetView{name: "gpu-h100", location: "eastus", zones: []string{"2"}, tags: map[string]string{
		tagLabelPrefix + "nvidia.com__gpu.product": "H100",
		tagTaintPrefix + "openai.com__team":        "rl:NoSchedule",
		tagResourcesPrefix + "rdma__ib":            "8",
		"unrelated":                                "x",
	}}
	sku := skuInfo{name: "Standard_ND96isr_H100_v5", vcpus: 96, memoryGB: 1900, gpus: 8, arch: "amd64"}
	n, err := templateNode(view, sku, "nvidia.com/gpu")
	if err != nil {
		t.Fatal(err)
	}
	alloc := n.Status.Allocatable
	if got := alloc.Name("nvidia.com/gpu", "").Value(); got != 8 {
		t.Errorf("gpus %d, want 8", got)
	}
	// Capacity is the SKU's; allocatable what AKS leaves after
	// kube-reserved (1060m of 96 cores; 2250Mi for 110 pods) and the
	// 100Mi eviction threshold.
	if got := n.Status.Capacity.Cpu().Value(); got != 96 {
		t.Errorf("cpu capacity %d, want 96", got)
	}
	if got := n.Status.Capacity.Memory().Value(); got != 1900*1024*1024*1024 {
		t.Errorf("memory capacity %d, want 1900Gi", got)
	}
	if got := alloc.Cpu().MilliValue(); got != 96000-1060 {
		t.Errorf("allocatable cpu %dm, want 94940m", got)
	}
	if got := alloc.Memory().Value(); got != (1900*1024-2250-100)*1024*1024 {
		t.Errorf("allocatable memory %d, want 1943250Mi", got)
	}
	if got := alloc.Pods().Value(); got != DefaultMaxPods {
		t.Errorf("pods %d", got)
	}
	if got := alloc.Name("rdma/ib", "").Value(); got != 8 {
		t.Errorf("rdma/ib %d, want 8 from the resources tag", got)
	}
	wantLabels := map[string]string{
		apiv1.LabelInstanceTypeStable: "Standard_ND96isr_H100_v5", apiv1.LabelTopologyRegion: "eastus",
		apiv1.LabelTopologyZone: "eastus-2", apiv1.LabelArchStable: "amd64", apiv1.LabelOSStable: "linux",
		AcceleratorLabel: "nvidia", NodeGroupLabel: "gpu-h100", "nvidia.com/gpu.product": "H100",
	}
	for k, v := range wantLabels {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "openai.com/team" || n.Spec.Taints[0].Value != "rl" || n.Spec.Taints[0].Effect != apiv1.TaintEffectNoSchedule {
		t.Errorf("taints %+v", n.Spec.Taints)
	}
	view.tags[tagTaintPrefix+"bad"] = "x:Sometimes"
	if _, err := templateNode(view, sku, "nvidia.com/gpu"); err == nil || !strings.Contains(err.Error(), "unknown taint effect") {
		t.Errorf("bad taint effect accepted: %v", err)
	}
}

func TestAutoDiscovery(t *testing.T) {
	d, err := parseAutoDiscovery("label:k8s.io_cluster-autoscaler_enabled,k8s.io_cluster-autoscaler_prod=owned")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tags map[string]string
		want bool
	}{
		{map[string]string{"k8s.io_cluster-autoscaler_enabled": "true", "k8s.io_cluster-autoscaler_prod": "owned"}, true},
		{map[string]string{"K8S.IO_CLUSTER-AUTOSCALER_ENABLED": "1", "k8s.io_cluster-autoscaler_prod": "OWNED"}, true},
		{map[string]string{"k8s.io_cluster-autoscaler_enabled": "true"}, false},
		{map[string]string{"k8s.io_cluster-autoscaler_enabled": "true", "k8s.io_cluster-autoscaler_prod": "shared"}, false},
	}
	for _, tc := range tests {
		if got := d.matches(tc.tags); got != tc.want {
			t.Errorf("matches(%v) = %v, want %v", tc.tags, got, tc.want)
		}
	}
	for _, bad := range []string{"asg:tag=x", "label:", "label:,x"} {
		if _, err := parseAutoDiscovery(bad); err == nil {
			t.Errorf("parseAutoDiscovery(%q) accepted", bad)
		}
	}
}

func TestGroupOptionsFromTags(t *testing.T) {
	d := cloudprovider.GroupOptions{ScaleDownUtilizationThreshold: 0.5, MaxNodeProvisionTime: 15 * time.Minute, ScaleDownUnneededTime: 10 * time.Minute}
	opt := func(name string) string { return tagOptionsPrefix + name }
	tests := []struct {
		name     string
		tags     map[string]string
		want     cloudprovider.GroupOptions
		wantErrs []string
	}{
		{"valid values apply", map[string]string{opt("scaledownutilizationthreshold"): "0.3", opt("maxnodeprovisiontime"): "25m", opt("ScaleDownUnneededTime"): "5m"},
			cloudprovider.GroupOptions{ScaleDownUtilizationThreshold: 0.3, MaxNodeProvisionTime: 25 * time.Minute, ScaleDownUnneededTime: 5 * time.Minute}, nil},
		{"not a duration", map[string]string{opt("scaledownunneededtime"): "soon"}, d,
			[]string{`tag ` + opt("scaledownunneededtime") + `="soon": not a duration`}},
		{"duration too long", map[string]string{opt("maxnodeprovisiontime"): "2000h"}, d,
			[]string{"tag " + opt("maxnodeprovisiontime") + "=2000h0m0s: must be between 1s and 168h0m0s"}},
		{"negative duration", map[string]string{opt("scaledownunreadytime"): "-1m"}, d,
			[]string{"tag " + opt("scaledownunreadytime") + "=-1m0s: must be between 0s and 168h0m0s"}},
		{"provision time zero", map[string]string{opt("maxnodeprovisiontime"): "0s"}, d,
			[]string{"tag " + opt("maxnodeprovisiontime") + "=0s: must be between 1s and 168h0m0s"}},
		{"share above 1", map[string]string{opt("scaledownutilizationthreshold"): "5"}, d,
			[]string{"tag " + opt("scaledownutilizationthreshold") + "=5: must be between 0 and 1"}},
		{"share NaN", map[string]string{opt("scaledowngpuutilizationthreshold"): "NaN"}, d,
			[]string{"tag " + opt("scaledowngpuutilizationthreshold") + "=NaN: must be between 0 and 1"}},
		{"share not a number", map[string]string{opt("scaledowngpuutilizationthreshold"): "half"}, d,
			[]string{"tag " + opt("scaledowngpuutilizationthreshold") + `="half": not a number`}},
		{"good and bad together", map[string]string{opt("scaledownutilizationthreshold"): "0.2", opt("scaledownunneededtime"): "99999h"},
			cloudprovider.GroupOptions{ScaleDownUtilizationThreshold: 0.2, MaxNodeProvisionTime: 15 * time.Minute, ScaleDownUnneededTime: 10 * time.Minute},
			[]string{"tag " + opt("scaledownunneededtime") + "=99999h0m0s: must be between 0s and 168h0m0s"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := groupOptions(tc.tags, d)
			if got != tc.want {
				t.Errorf("options %+v, want %+v", got, tc.want)
			}
			if len(errs) != len(tc.wantErrs) {
				t.Fatalf("errors %v, want %v", errs, tc.wantErrs)
			}
			for i, err := range errs {
				if !strings.HasPrefix(err.Error(), tc.wantErrs[i]) {
					t.Errorf("error %q, want it to start with %q", err, tc.wantErrs[i])
				}
			}
		})
	}
}

func TestGroupBoundsFromTags(t *testing.T) {
	tests := []struct {
		name             string
		tags             map[string]string
		wantMin, wantMax int
		wantErr          string
	}{
		{"valid", map[string]string{"min": "0", "max": "40"}, 0, 40, ""},
		{"spaces", map[string]string{"min": " 2", "max": "3 "}, 2, 3, ""},
		{"past a scale set's limit: clamped by the provider, not refused", map[string]string{"min": "0", "max": "2500"}, 0, 2500, ""},
		{"missing max", map[string]string{"min": "0"}, 0, 0, "tag max: missing"},
		{"not a number", map[string]string{"min": "zero", "max": "4"}, 0, 0, `tag min="zero": not an integer`},
		{"negative", map[string]string{"min": "-1", "max": "4"}, 0, 0, "tag min=-1: must be between 0 and 100000"},
		{"a typo", map[string]string{"min": "0", "max": "5000000"}, 0, 0, "tag max=5000000: must be between 0 and 100000"},
		{"max zero", map[string]string{"min": "0", "max": "0"}, 0, 0, "tag max=0: must be at least 1"},
		{"min above max", map[string]string{"min": "9", "max": "2"}, 0, 0, "tag min=9 is greater than tag max=2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi, err := groupBounds(tc.tags)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || lo != tc.wantMin || hi != tc.wantMax {
				t.Fatalf("groupBounds = %d, %d, %v; want %d, %d", lo, hi, err, tc.wantMin, tc.wantMax)
			}
		})
	}
}

func TestTemplateTagsRefused(t *testing.T) {
	tests := []struct {
		name, tag, value, wantErr string
	}{
		{"label key", tagLabelPrefix + "bad key", "x", `is not a label key`},
		{"label value", tagLabelPrefix + "team", "has spaces", `not a label value`},
		{"taint without effect", tagTaintPrefix + "team", "rl", `want <value>:<Effect>`},
		{"taint effect", tagTaintPrefix + "team", "rl:Sometimes", `unknown taint effect "Sometimes"`},
		{"taint key", tagTaintPrefix + "a__b__c", "rl:NoSchedule", `is not a taint key`},
		{"taint value", tagTaintPrefix + "team", "r l:NoSchedule", `is not a taint value`},
		{"resource quantity", tagResourcesPrefix + "rdma__ib", "lots", `tag ` + tagResourcesPrefix + `rdma__ib="lots"`},
		{"negative resource", tagResourcesPrefix + "rdma__ib", "-8", `must be between 0 and 1Pi`},
		{"huge resource", tagResourcesPrefix + "memory", "9Ei", `must be between 0 and 1Pi`},
		{"resource name", tagResourcesPrefix + "bad name", "1", `is not a resource name`},
		// Exponents that make resource.ParseQuantity build 10^exponent as a
		// big integer: seconds for the first, no end for the others.
		{"exponent of millions", tagResourcesPrefix + "memory", "1e9999999", `decimal exponent "9999999": want a whole number between -30 and 30`},
		{"negative exponent of millions", tagResourcesPrefix + "memory", "1e-9999999", `decimal exponent "-9999999"`},
		{"exponent at the int32 bound", tagResourcesPrefix + "memory", "9E+999999999", `decimal exponent "+999999999"`},
		{"exponent past int32", tagResourcesPrefix + "memory", "2E6024865272343", `decimal exponent "6024865272343"`},
		{"exponent past int64", tagResourcesPrefix + "memory", "1e-99999999999999999999", `decimal exponent "-99999999999999999999"`},
		{"exponent in range, value not", tagResourcesPrefix + "memory", "1e30", `must be between 0 and 1Pi`},
		{"long mantissa", tagResourcesPrefix + "memory", "0." + strings.Repeat("0", 60) + "1", `longer than 40 characters`},
	}
	sku := skuInfo{name: "Standard_D4s_v5", vcpus: 4, memoryGB: 16, arch: "amd64"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			view := &scaleSetView{name: "g", location: "eastus", tags: map[string]string{tc.tag: tc.value}}
			_, err := templateNode(view, sku, "nvidia.com/gpu")
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "scale set g: tag "+tc.tag) {
				t.Fatalf("templateNode: %v; want an error naming scale set g, tag %s and containing %q", err, tc.tag, tc.wantErr)
			}
		})
	}
}

func TestResourceTagQuantityForms(t *testing.T) {
	tests := []struct{ value, want string }{
		{"8", "8"},
		{"60Gi", "60Gi"},
		{"15500m", "15500m"},
		{"1.5e3", "1500"},
		{"2e+3", "2k"},
		{"25e-1", "2500m"},
		{"1e15", "1e15"},
		{"1P", "1P"},
		{"0.5Ti", "512Gi"},
	}
	for _, tc := range tests {
		t.Run(tc.value, func(t *testing.T) {
			_, q, err := resourceTag(tagResourcesPrefix+"memory", tc.value)
			if err != nil || q.Cmp(resource.MustParse(tc.want)) != 0 {
				t.Fatalf("resourceTag(%q) = %s, %v; want %s", tc.value, q.String(), err, tc.want)
			}
		})
	}
}

// vmOf is a VM as each API answers it: a Uniform scale set's VM (the
// scale-set VM API) and a Flexible one's (the Virtual Machines API), with
// the same provisioning state and instance view statuses.
type vmOf struct {
	uniform  *armcompute.VirtualMachineScaleSetVM
	flexible *armcompute.VirtualMachine
}

func testVM(prov string, statuses ...string) vmOf {
	var view []*armcompute.InstanceViewStatus
	for _, c := range statuses {
		view = append(view, &armcompute.InstanceViewStatus{Code: to.Ptr(c), Message: to.Ptr("m")})
	}
	return vmOf{
		uniform: &armcompute.VirtualMachineScaleSetVM{ID: to.Ptr("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/g/virtualMachines/1"),
			Properties: &armcompute.VirtualMachineScaleSetVMProperties{ProvisioningState: to.Ptr(prov), InstanceView: &armcompute.VirtualMachineScaleSetVMInstanceView{Statuses: view}}},
		flexible: &armcompute.VirtualMachine{ID: to.Ptr("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/g_0a1b2c3d"),
			Properties: &armcompute.VirtualMachineProperties{ProvisioningState: to.Ptr(prov), InstanceView: &armcompute.VirtualMachineInstanceView{Statuses: view}}},
	}
}

// TestInstanceStateFromProvisioningAndPowerState: the same states map to
// the same instance whichever API listed the VM.
func TestInstanceStateFromProvisioningAndPowerState(t *testing.T) {
	vm := testVM
	tests := []struct {
		name      string
		vm        vmOf
		state     cloudprovider.InstanceState
		errClass  cloudprovider.ErrorClass
		errorCode string
		// failedRunning is the code of a VM Failed while it runs (no Error).
		failedRunning string
	}{
		{"running", vm("Succeeded", "ProvisioningState/succeeded", "PowerState/running"), cloudprovider.InstanceRunning, 0, "", ""},
		{"creating", vm("Creating", "ProvisioningState/creating"), cloudprovider.InstanceCreating, 0, "", ""},
		{"provisioned but starting", vm("Succeeded", "ProvisioningState/succeeded", "PowerState/starting"), cloudprovider.InstanceCreating, 0, "", ""},
		{"restarted, reimaged or redeployed: booting again", vm("Updating", "ProvisioningState/updating", "PowerState/starting"), cloudprovider.InstanceRunning, 0, "", ""},
		{"deleting", vm("Deleting", "ProvisioningState/deleting"), cloudprovider.InstanceDeleting, 0, "", ""},
		{"deallocated", vm("Succeeded", "ProvisioningState/succeeded", "PowerState/deallocated"), cloudprovider.InstanceDeleting, 0, "", ""},
		{"allocation failed", vm("Failed", "ProvisioningState/failed/AllocationFailed"), cloudprovider.InstanceRunning, cloudprovider.ClassOutOfCapacity, "AllocationFailed", ""},
		{"quota failed", vm("Failed", "ProvisioningState/failed/QuotaExceeded"), cloudprovider.InstanceRunning, cloudprovider.ClassQuota, "QuotaExceeded", ""},
		{"failed without instance view code", vm("Failed"), cloudprovider.InstanceRunning, cloudprovider.ClassOther, "ProvisioningFailed", ""},
		// A running VM whose extension, disk attach or model update failed:
		// Failed, and running on; no error.
		{"extension failed while running", vm("Failed", "ProvisioningState/failed/VMExtensionProvisioningError", "PowerState/running"), cloudprovider.InstanceRunning, 0, "", "VMExtensionProvisioningError"},
		{"disk attach failed while starting", vm("Failed", "ProvisioningState/failed/AttachDiskWhileBeingDetached", "PowerState/starting"), cloudprovider.InstanceRunning, 0, "", "AttachDiskWhileBeingDetached"},
		{"failed and stopped", vm("Failed", "ProvisioningState/failed/OSProvisioningTimedOut", "PowerState/stopped"), cloudprovider.InstanceRunning, cloudprovider.ClassOther, "OSProvisioningTimedOut", ""},
		{"failed and deallocated", vm("Failed", "ProvisioningState/failed/AllocationFailed", "PowerState/deallocated"), cloudprovider.InstanceRunning, cloudprovider.ClassOutOfCapacity, "AllocationFailed", ""},
	}
	for _, tc := range tests {
		uniform, okU := statusOfScaleSetVM(tc.vm.uniform)
		flexible, okF := statusOfVirtualMachine(tc.vm.flexible)
		if !okU || !okF {
			t.Fatalf("%s: VM without an ID", tc.name)
		}
		for _, api := range []struct {
			name string
			vm   vmStatus
		}{{"uniform", uniform}, {"flexible", flexible}} {
			t.Run(tc.name+"/"+api.name, func(t *testing.T) {
				in := instanceOf(api.vm)
				if in.State != tc.state {
					t.Errorf("state %s, want %s", in.State, tc.state)
				}
				switch {
				case tc.errorCode == "" && in.Error != nil:
					t.Errorf("unexpected error %+v", in.Error)
				case tc.errorCode != "" && (in.Error == nil || in.Error.Code != tc.errorCode || in.Error.Class != tc.errClass):
					t.Errorf("error %+v, want code %s class %s", in.Error, tc.errorCode, tc.errClass)
				}
				switch {
				case tc.failedRunning == "" && in.FailedRunning != nil:
					t.Errorf("unexpected failed-while-running %+v", in.FailedRunning)
				case tc.failedRunning != "" && (in.FailedRunning == nil || in.FailedRunning.Code != tc.failedRunning):
					t.Errorf("failed-while-running %+v, want code %s", in.FailedRunning, tc.failedRunning)
				}
				if want := "azure://" + *map[string]*string{"uniform": tc.vm.uniform.ID, "flexible": tc.vm.flexible.ID}[api.name]; in.ProviderID != want {
					t.Errorf("provider ID %s, want %s", in.ProviderID, want)
				}
			})
		}
	}
	if _, ok := statusOfVirtualMachine(&armcompute.VirtualMachine{}); ok {
		t.Fatal("a VM without an ID was read")
	}
}

func TestTemplateResourceTagsOverrideTheReservedEstimate(t *testing.T) {
	view := &scaleSetView{name: "cpu", location: "eastus", tags: map[string]string{
		tagResourcesPrefix + "cpu":    "15500m",
		tagResourcesPrefix + "memory": "60Gi",
	}}
	n, err := templateNode(view, skuInfo{name: "Standard_D16s_v5", vcpus: 16, memoryGB: 64, arch: "amd64"}, "nvidia.com/gpu")
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Status.Allocatable.Cpu().MilliValue(); got != 15500 {
		t.Errorf("allocatable cpu %dm, want the tag's 15500m", got)
	}
	if got := n.Status.Allocatable.Memory().Value(); got != 60<<30 {
		t.Errorf("allocatable memory %d, want the tag's 60Gi", got)
	}
}

func TestTemplateOfAnAKSNodePool(t *testing.T) {
	sku := skuInfo{name: "Standard_D16s_v5", vcpus: 16, memoryGB: 64, arch: "amd64"}
	for _, tc := range []struct {
		name      string
		tags      map[string]string
		wantGroup string
		wantPool  string
	}{
		{"self-managed: the node-group label", nil, "aks-web-1234-vmss", ""},
		{"AKS pool: the agent-pool label only", map[string]string{tagAKSPool: "web"}, "", "web"},
		{"AKS pool with our label in a tag: both", map[string]string{tagAKSPool: "web", tagLabelPrefix + "vmss-autoscaler.io__node-group": "aks-web-1234-vmss"}, "aks-web-1234-vmss", "web"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := templateNode(&scaleSetView{name: "aks-web-1234-vmss", location: "eastus", tags: tc.tags}, sku, "nvidia.com/gpu")
			if err != nil {
				t.Fatal(err)
			}
			if n.Labels[NodeGroupLabel] != tc.wantGroup || n.Labels[AgentPoolLabel] != tc.wantPool {
				t.Fatalf("labels %v, want node-group %q agent-pool %q", n.Labels, tc.wantGroup, tc.wantPool)
			}
		})
	}
}

// TestIsPlaceholder: a placeholder's provider ID has the Uniform form
// with a failed-op instance; a Flexible VM of a scale set named failed-op
// is a VM.
func TestIsPlaceholder(t *testing.T) {
	for id, want := range map[string]bool{
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu/virtualMachines/failed-op3-0": true,
		"azure:///subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/gpu/virtualmachines/failed-op3-0": true,
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu/virtualMachines/3":            false,
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/failed-op_0a1b2c3d":                       false,
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/gpu_0a1b2c3d":                             false,
	} {
		if got := isPlaceholder(id); got != want {
			t.Errorf("isPlaceholder(%s) = %v, want %v", id, got, want)
		}
	}
}
