package vmss

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/reserved"
)

// Tag names in cluster-autoscaler's form. In tag keys, where Azure forbids
// '/', "__" stands for it: ..._label_nvidia.com__gpu.product.
const (
	tagMin             = "min"
	tagMax             = "max"
	tagLabelPrefix     = "k8s.io_cluster-autoscaler_node-template_label_"
	tagTaintPrefix     = "k8s.io_cluster-autoscaler_node-template_taint_"
	tagResourcesPrefix = "k8s.io_cluster-autoscaler_node-template_resources_"
	tagOptionsPrefix   = "k8s.io_cluster-autoscaler_node-template_autoscaling-options_"

	// NodeGroupLabel is the label a scale set's nodes carry with its name.
	NodeGroupLabel = "vmss-autoscaler.io/node-group"
	// AgentPoolLabel is the label AKS puts on a node pool's nodes, with the
	// pool's name; tagAKSPool is the tag naming the pool of an AKS-managed
	// scale set.
	AgentPoolLabel = "kubernetes.azure.com/agentpool"
	tagAKSPool     = "aks-managed-poolName"
	// AcceleratorLabel marks GPU nodes, as AKS does.
	AcceleratorLabel = "kubernetes.azure.com/accelerator"
	// DefaultMaxPods is the pods capacity of a template node without a tag.
	DefaultMaxPods = 110
)

// skuInfo is what a template needs from a resource SKU.
type skuInfo struct {
	name     string
	vcpus    int64
	memoryGB float64
	gpus     int64
	arch     string
}

func skuInfoOf(s *armcompute.ResourceSKU) (skuInfo, bool) {
	if s == nil || s.Name == nil {
		return skuInfo{}, false
	}
	info := skuInfo{name: *s.Name, arch: "amd64"}
	for _, c := range s.Capabilities {
		if c == nil || c.Name == nil || c.Value == nil {
			continue
		}
		switch *c.Name {
		case "vCPUs":
			info.vcpus, _ = strconv.ParseInt(*c.Value, 10, 64)
		case "MemoryGB":
			info.memoryGB, _ = strconv.ParseFloat(*c.Value, 64)
		case "GPUs":
			info.gpus, _ = strconv.ParseInt(*c.Value, 10, 64)
		case "CpuArchitectureType":
			if strings.EqualFold(*c.Value, "Arm64") {
				info.arch = "arm64"
			}
		}
	}
	return info, info.vcpus > 0 && info.memoryGB > 0
}

// tagKey turns a tag suffix into a Kubernetes key.
func tagKey(s string) string { return strings.ReplaceAll(s, "__", "/") }

// templateNode builds the node a scale set would create.
func templateNode(ss *scaleSetView, sku skuInfo, gpuResource string) (*apiv1.Node, error) {
	name := "template-" + ss.name
	capacity := apiv1.ResourceList{
		apiv1.ResourceCPU:              *resource.NewQuantity(sku.vcpus, resource.DecimalSI),
		apiv1.ResourceMemory:           *resource.NewQuantity(int64(math.Round(sku.memoryGB*1024))*1024*1024, resource.BinarySI),
		apiv1.ResourcePods:             *resource.NewQuantity(DefaultMaxPods, resource.DecimalSI),
		apiv1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	if sku.gpus > 0 {
		capacity[apiv1.ResourceName(gpuResource)] = *resource.NewQuantity(sku.gpus, resource.DecimalSI)
	}
	labels := map[string]string{
		apiv1.LabelHostname:           name,
		apiv1.LabelInstanceTypeStable: sku.name,
		apiv1.LabelTopologyRegion:     strings.ToLower(ss.location),
		apiv1.LabelArchStable:         sku.arch,
		apiv1.LabelOSStable:           "linux",
	}
	// A self-managed scale set's nodes carry the node-group label (kubelet
	// --node-labels in its custom data). An AKS node pool's carry the
	// agent-pool label, and ours only when a label tag says so: a template
	// must not promise a label its nodes lack.
	if pool, ok := ss.tags[tagAKSPool]; ok {
		labels[AgentPoolLabel] = pool
	} else {
		labels[NodeGroupLabel] = ss.name
	}
	if len(ss.zones) > 0 {
		labels[apiv1.LabelTopologyZone] = strings.ToLower(ss.location) + "-" + ss.zones[0]
	}
	if sku.gpus > 0 {
		labels[AcceleratorLabel] = "nvidia"
	}
	var taints []apiv1.Taint
	// Pods get what AKS leaves after kube-reserved and the eviction
	// threshold; a resources tag states a resource outright (capacity and
	// allocatable), overriding the estimate.
	overrides := apiv1.ResourceList{}
	keys := make([]string, 0, len(ss.tags))
	for k := range ss.tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := ss.tags[k]
		switch {
		case strings.HasPrefix(k, tagLabelPrefix):
			labels[tagKey(strings.TrimPrefix(k, tagLabelPrefix))] = v
		case strings.HasPrefix(k, tagTaintPrefix):
			val, effect, ok := strings.Cut(v, ":")
			if !ok {
				return nil, fmt.Errorf("scale set %s: tag %s=%q: want <value>:<Effect>", ss.name, k, v)
			}
			e := apiv1.TaintEffect(effect)
			if e != apiv1.TaintEffectNoSchedule && e != apiv1.TaintEffectPreferNoSchedule && e != apiv1.TaintEffectNoExecute {
				return nil, fmt.Errorf("scale set %s: tag %s=%q: unknown taint effect %q", ss.name, k, v, effect)
			}
			taints = append(taints, apiv1.Taint{Key: tagKey(strings.TrimPrefix(k, tagTaintPrefix)), Value: val, Effect: e})
		case strings.HasPrefix(k, tagResourcesPrefix):
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return nil, fmt.Errorf("scale set %s: tag %s=%q: %w", ss.name, k, v, err)
			}
			capacity[apiv1.ResourceName(tagKey(strings.TrimPrefix(k, tagResourcesPrefix)))] = q
			overrides[apiv1.ResourceName(tagKey(strings.TrimPrefix(k, tagResourcesPrefix)))] = q
		}
	}
	allocatable := reserved.Allocatable(capacity)
	for r, q := range overrides {
		allocatable[r] = q
	}
	return &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       apiv1.NodeSpec{Taints: taints},
		Status: apiv1.NodeStatus{
			Capacity:    capacity,
			Allocatable: allocatable,
			Conditions:  []apiv1.NodeCondition{{Type: apiv1.NodeReady, Status: apiv1.ConditionTrue}},
		},
	}, nil
}

// groupOptions applies the scale set's autoscaling-options tags.
func groupOptions(tags map[string]string, d cloudprovider.GroupOptions) cloudprovider.GroupOptions {
	for k, v := range tags {
		if !strings.HasPrefix(k, tagOptionsPrefix) {
			continue
		}
		name := strings.ToLower(strings.TrimPrefix(k, tagOptionsPrefix))
		f, ferr := strconv.ParseFloat(v, 64)
		dur, derr := time.ParseDuration(v)
		switch name {
		case "scaledownutilizationthreshold":
			if ferr == nil {
				d.ScaleDownUtilizationThreshold = f
			}
		case "scaledowngpuutilizationthreshold":
			if ferr == nil {
				d.ScaleDownGPUUtilizationThreshold = f
			}
		case "scaledownunneededtime":
			if derr == nil {
				d.ScaleDownUnneededTime = dur
			}
		case "scaledownunreadytime":
			if derr == nil {
				d.ScaleDownUnreadyTime = dur
			}
		case "maxnodeprovisiontime":
			if derr == nil {
				d.MaxNodeProvisionTime = dur
			}
		}
	}
	return d
}

// discovery is one --node-group-auto-discovery spec: every tag must be
// present, with the value when one is given.
type discovery struct {
	tags map[string]string // value "" means any
}

func parseAutoDiscovery(s string) (discovery, error) {
	rest, ok := strings.CutPrefix(s, "label:")
	if !ok || rest == "" {
		return discovery{}, fmt.Errorf("--node-group-auto-discovery=%q: want label:<tag>[=<value>][,<tag>...]", s)
	}
	d := discovery{tags: map[string]string{}}
	for _, part := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		if k == "" {
			return discovery{}, fmt.Errorf("--node-group-auto-discovery=%q: empty tag name", s)
		}
		d.tags[strings.ToLower(k)] = v
	}
	return d, nil
}

func (d discovery) matches(tags map[string]string) bool {
	lower := make(map[string]string, len(tags))
	for k, v := range tags {
		lower[strings.ToLower(k)] = v
	}
	for k, want := range d.tags {
		v, ok := lower[k]
		if !ok || (want != "" && !strings.EqualFold(v, want)) {
			return false
		}
	}
	return true
}
