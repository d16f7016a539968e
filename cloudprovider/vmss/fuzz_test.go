package vmss

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// Scale-set tags and provider IDs come from outside the process: anyone who
// may tag a scale set (or register a Node) writes them. These fuzz tests
// check that no input panics the parsers and that what they accept is
// valid for the API server and within range. make fuzz runs each briefly;
// the seeds below and any crash found (testdata/fuzz) run with go test.

func FuzzParseProviderID(f *testing.F) {
	for _, s := range []string{
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu/virtualMachines/7",
		"AZURE:///SUBSCRIPTIONS/S/RESOURCEGROUPS/MC_RG/PROVIDERS/MICROSOFT.COMPUTE/VIRTUALMACHINESCALESETS/GPU/VIRTUALMACHINES/0",
		"azure:///subscriptions//resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu/virtualMachines/1",
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm1",
		"kwok://node-1", "", "azure://", "azure:////////////",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		_, _ = numericInstanceID(id)
		ref, ok := parseProviderID(id)
		if !ok {
			return
		}
		for name, v := range map[string]string{"subscription": ref.subscription, "resourceGroup": ref.resourceGroup, "scaleSet": ref.scaleSet, "instanceID": ref.instanceID} {
			if v == "" || strings.Contains(v, "/") || v != strings.ToLower(v) {
				t.Fatalf("parseProviderID(%q): %s %q: want a non-empty, lower-case name without '/'", id, name, v)
			}
		}
		again := fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s/virtualMachines/%s",
			ref.subscription, ref.resourceGroup, ref.scaleSet, ref.instanceID)
		if back, ok := parseProviderID(again); !ok || back != ref {
			t.Fatalf("parseProviderID(%q) = %+v; its own form %q parses to %+v, %v", id, ref, again, back, ok)
		}
	})
}

// tagPrefixes are the tag families a fuzzed tag belongs to, by index.
var tagPrefixes = []string{tagLabelPrefix, tagTaintPrefix, tagResourcesPrefix, tagOptionsPrefix, "", tagAKSPool}

func FuzzScaleSetTags(f *testing.F) {
	f.Add(uint8(0), "nvidia.com__gpu.product", "H100", uint8(1), "openai.com__team", "rl:NoSchedule")
	f.Add(uint8(2), "rdma__ib", "8", uint8(3), "scaledownunneededtime", "20m")
	f.Add(uint8(3), "maxnodeprovisiontime", "9999999h", uint8(3), "scaledownutilizationthreshold", "NaN")
	f.Add(uint8(4), "min", "-1", uint8(4), "max", "99999999999999999999")
	f.Add(uint8(2), "memory", "1e400", uint8(1), "a__b__c", ":NoExecute")
	f.Add(uint8(5), "", "pool", uint8(0), "__", "")
	f.Fuzz(func(t *testing.T, kind1 uint8, suffix1, value1 string, kind2 uint8, suffix2, value2 string) {
		tags := map[string]string{
			tagPrefixes[int(kind1)%len(tagPrefixes)] + suffix1: value1,
			tagPrefixes[int(kind2)%len(tagPrefixes)] + suffix2: value2,
		}
		view := &scaleSetView{name: "g", location: "eastus", tags: tags}
		sku := skuInfo{name: "Standard_ND96isr_H100_v5", vcpus: 96, memoryGB: 1900, gpus: 8, arch: "amd64"}
		if n, err := templateNode(view, sku, "nvidia.com/gpu"); err == nil {
			checkTemplate(t, tags, n)
		} else if !strings.Contains(err.Error(), "scale set g: tag ") {
			t.Fatalf("templateNode(%v): error %q does not name the scale set and tag", tags, err)
		}

		d := cloudprovider.GroupOptions{ScaleDownUtilizationThreshold: 0.5, ScaleDownGPUUtilizationThreshold: 0.5,
			ScaleDownUnneededTime: 10 * time.Minute, ScaleDownUnreadyTime: 20 * time.Minute, MaxNodeProvisionTime: 15 * time.Minute}
		o, errs := groupOptions(tags, d)
		for _, err := range errs {
			if !strings.HasPrefix(err.Error(), "tag ") {
				t.Fatalf("groupOptions(%v): error %q does not name the tag", tags, err)
			}
		}
		for name, v := range map[string]float64{"utilization": o.ScaleDownUtilizationThreshold, "gpu utilization": o.ScaleDownGPUUtilizationThreshold} {
			if !(v >= 0 && v <= 1) {
				t.Fatalf("groupOptions(%v): %s threshold %v outside [0, 1]", tags, name, v)
			}
		}
		for name, v := range map[string]time.Duration{"unneeded": o.ScaleDownUnneededTime, "unready": o.ScaleDownUnreadyTime, "provision": o.MaxNodeProvisionTime} {
			if v < 0 || v > maxTagWait {
				t.Fatalf("groupOptions(%v): %s time %s outside [0, %s]", tags, name, v, maxTagWait)
			}
		}
		if o.MaxNodeProvisionTime < time.Second {
			t.Fatalf("groupOptions(%v): provision time %s below 1s", tags, o.MaxNodeProvisionTime)
		}

		if lo, hi, err := groupBounds(tags); err == nil && (lo < 0 || hi < 1 || lo > hi || hi > maxGroupSize) {
			t.Fatalf("groupBounds(%v) = %d, %d: out of range", tags, lo, hi)
		}
	})
}

// checkTemplate fails unless every label, taint and resource of a template
// node would be accepted by the API server and lies in range.
func checkTemplate(t *testing.T, tags map[string]string, n *apiv1.Node) {
	t.Helper()
	for k, v := range n.Labels {
		if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			t.Fatalf("templateNode(%v): invalid label %q=%q", tags, k, v)
		}
	}
	for _, tn := range n.Spec.Taints {
		if len(validation.IsQualifiedName(tn.Key)) > 0 || len(validation.IsValidLabelValue(tn.Value)) > 0 {
			t.Fatalf("templateNode(%v): invalid taint %+v", tags, tn)
		}
	}
	for r, q := range n.Status.Capacity {
		if q.Sign() < 0 || q.Cmp(maxResourceTag) > 0 {
			t.Fatalf("templateNode(%v): capacity %s=%s out of range", tags, r, q.String())
		}
	}
	for r, q := range n.Status.Allocatable {
		if q.Sign() < 0 {
			t.Fatalf("templateNode(%v): allocatable %s=%s negative", tags, r, q.String())
		}
	}
}

func FuzzAutoDiscovery(f *testing.F) {
	f.Add("label:k8s.io_cluster-autoscaler_enabled,k8s.io_cluster-autoscaler_prod=owned", "k8s.io_cluster-autoscaler_enabled", "true")
	f.Add("label:,=,", "", "")
	f.Add("asg:x", "x", "y")
	f.Fuzz(func(t *testing.T, spec, key, value string) {
		d, err := parseAutoDiscovery(spec)
		if err != nil {
			if !strings.Contains(err.Error(), "--node-group-auto-discovery=") {
				t.Fatalf("parseAutoDiscovery(%q): error %q does not name the flag", spec, err)
			}
			return
		}
		if len(d.tags) == 0 {
			t.Fatalf("parseAutoDiscovery(%q) accepted a spec with no tag", spec)
		}
		_ = d.matches(map[string]string{key: value})
	})
}
