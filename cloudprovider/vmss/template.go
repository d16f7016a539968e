package vmss

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/reserved"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/bounds"
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
	// SpotLabel=SpotValue is the label, and with NoSchedule the taint, of
	// a Spot scale set's nodes, as AKS puts them.
	SpotLabel = "kubernetes.azure.com/scalesetpriority"
	SpotValue = "spot"
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
		info.setCapability(*c.Name, *c.Value)
	}
	return info, info.vcpus > 0 && info.memoryGB > 0
}

// setCapability takes what a template needs from a SKU capability.
func (info *skuInfo) setCapability(name, value string) {
	switch name {
	case "vCPUs":
		info.vcpus, _ = strconv.ParseInt(value, 10, 64)
	case "MemoryGB":
		info.memoryGB, _ = strconv.ParseFloat(value, 64)
	case "GPUs":
		info.gpus, _ = strconv.ParseInt(value, 10, 64)
	case "CpuArchitectureType":
		if strings.EqualFold(value, "Arm64") {
			info.arch = "arm64"
		}
	}
}

// tagKey turns a tag suffix into a Kubernetes key.
func tagKey(s string) string { return strings.ReplaceAll(s, "__", "/") }

// labelTag parses a node-template label tag: the key (after the prefix,
// "__" for '/') must be a label key, the value a label value.
func labelTag(k, v string) (string, error) {
	key := tagKey(strings.TrimPrefix(k, tagLabelPrefix))
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return "", fmt.Errorf("tag %s: %q is not a label key: %s", k, key, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
		return "", fmt.Errorf("tag %s=%q: not a label value: %s", k, v, strings.Join(errs, "; "))
	}
	return key, nil
}

// taintTag parses a node-template taint tag, value "<value>:<Effect>".
func taintTag(k, v string) (apiv1.Taint, error) {
	val, effect, ok := strings.Cut(v, ":")
	if !ok {
		return apiv1.Taint{}, fmt.Errorf("tag %s=%q: want <value>:<Effect>", k, v)
	}
	e := apiv1.TaintEffect(effect)
	if e != apiv1.TaintEffectNoSchedule && e != apiv1.TaintEffectPreferNoSchedule && e != apiv1.TaintEffectNoExecute {
		return apiv1.Taint{}, fmt.Errorf("tag %s=%q: unknown taint effect %q", k, v, effect)
	}
	key := tagKey(strings.TrimPrefix(k, tagTaintPrefix))
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return apiv1.Taint{}, fmt.Errorf("tag %s: %q is not a taint key: %s", k, key, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(val); len(errs) > 0 {
		return apiv1.Taint{}, fmt.Errorf("tag %s=%q: %q is not a taint value: %s", k, v, val, strings.Join(errs, "; "))
	}
	return apiv1.Taint{Key: key, Value: val, Effect: e}, nil
}

// maxResourceTag bounds a resources tag: far above any machine (a
// petabyte of memory, a million GPUs), low enough that arithmetic on it
// cannot overflow.
var maxResourceTag = resource.MustParse("1Pi")

// Bounds on a quantity's text, checked before resource.ParseQuantity sees
// it. ParseQuantity's cost grows with the decimal exponent: it builds
// 10^exponent as a big integer, so "1e9999999" takes seconds and
// "9E+999999999" does not end (kubernetes/kubernetes PRs 131063, 139412,
// 141306). Anyone who may tag a scale set could otherwise stall every loop
// of the autoscaler with one tag. No machine needs more than a few digits
// and an exponent of ±30 to state a resource within maxResourceTag.
const (
	maxQuantityLen      = 40
	maxQuantityExponent = 30
)

// boundedQuantity parses s as a resource quantity after checking that its
// length and decimal exponent are within the bounds above.
func boundedQuantity(s string) (resource.Quantity, error) {
	if len(s) > maxQuantityLen {
		return resource.Quantity{}, fmt.Errorf("longer than %d characters", maxQuantityLen)
	}
	// A quantity is <sign><digits>[.<digits>]<suffix>; the suffix is a
	// decimal exponent when it is e or E followed by a signed number (a bare
	// "E" is exa, "Ei" is exbi).
	num := strings.TrimLeft(s, "+-")
	suffix := strings.TrimLeft(num, "0123456789.")
	if len(suffix) > 1 && (suffix[0] == 'e' || suffix[0] == 'E') && suffix != "Ei" {
		exp, err := strconv.Atoi(suffix[1:])
		if err != nil || exp < -maxQuantityExponent || exp > maxQuantityExponent {
			return resource.Quantity{}, fmt.Errorf("decimal exponent %q: want a whole number between -%d and %d", suffix[1:], maxQuantityExponent, maxQuantityExponent)
		}
	}
	return resource.ParseQuantity(s)
}

// resourceTag parses a node-template resources tag: a resource name and a
// non-negative quantity.
func resourceTag(k, v string) (apiv1.ResourceName, resource.Quantity, error) {
	name := tagKey(strings.TrimPrefix(k, tagResourcesPrefix))
	if errs := validation.IsQualifiedName(name); len(errs) > 0 {
		return "", resource.Quantity{}, fmt.Errorf("tag %s: %q is not a resource name: %s", k, name, strings.Join(errs, "; "))
	}
	q, err := boundedQuantity(strings.TrimSpace(v))
	if err != nil {
		return "", resource.Quantity{}, fmt.Errorf("tag %s=%q: %w", k, v, err)
	}
	if q.Sign() < 0 || q.Cmp(maxResourceTag) > 0 {
		return "", resource.Quantity{}, fmt.Errorf("tag %s=%q: must be between 0 and %s", k, v, maxResourceTag.String())
	}
	return apiv1.ResourceName(name), q, nil
}

// templateNode builds the node a scale set would create.
func templateNode(ss *scaleSetView, sku skuInfo, gpuResource string) (*apiv1.Node, error) {
	name := "template-" + ss.name
	capacity := templateCapacity(sku, gpuResource)
	labels, err := templateLabels(ss, sku, name)
	if err != nil {
		return nil, err
	}
	// Pods get what AKS leaves after kube-reserved and the eviction
	// threshold; a resources tag states a resource outright (capacity and
	// allocatable), overriding the estimate.
	taints, overrides, err := applyTemplateTags(ss, labels, capacity)
	if err != nil {
		return nil, err
	}
	if ss.spot {
		// As AKS registers a Spot node pool's nodes: only pods that
		// tolerate eviction land there (a taint from tags may say so too).
		labels[SpotLabel] = SpotValue
		if !slices.ContainsFunc(taints, func(t apiv1.Taint) bool { return t.Key == SpotLabel }) {
			taints = append(taints, apiv1.Taint{Key: SpotLabel, Value: SpotValue, Effect: apiv1.TaintEffectNoSchedule})
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

// templateCapacity is a template node's capacity as its SKU has it, GPUs
// as gpuResource.
func templateCapacity(sku skuInfo, gpuResource string) apiv1.ResourceList {
	capacity := apiv1.ResourceList{
		apiv1.ResourceCPU:              *resource.NewQuantity(sku.vcpus, resource.DecimalSI),
		apiv1.ResourceMemory:           *resource.NewQuantity(int64(math.Round(sku.memoryGB*1024))*1024*1024, resource.BinarySI),
		apiv1.ResourcePods:             *resource.NewQuantity(DefaultMaxPods, resource.DecimalSI),
		apiv1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	if sku.gpus > 0 {
		capacity[apiv1.ResourceName(gpuResource)] = *resource.NewQuantity(sku.gpus, resource.DecimalSI)
	}
	return capacity
}

// templateLabels are the labels of the scale set's template node (named
// name), before its label tags.
func templateLabels(ss *scaleSetView, sku skuInfo, name string) (map[string]string, error) {
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
		if errs := validation.IsValidLabelValue(pool); len(errs) > 0 {
			return nil, fmt.Errorf("scale set %s: tag %s=%q: not a label value: %s", ss.name, tagAKSPool, pool, strings.Join(errs, "; "))
		}
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
	return labels, nil
}

// applyTemplateTags applies the scale set's node-template tags, in key
// order: labels to labels, resources to capacity (and the overrides of
// allocatable returned), taints returned.
func applyTemplateTags(ss *scaleSetView, labels map[string]string, capacity apiv1.ResourceList) ([]apiv1.Taint, apiv1.ResourceList, error) {
	var taints []apiv1.Taint
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
			key, err := labelTag(k, v)
			if err != nil {
				return nil, nil, fmt.Errorf("scale set %s: %w", ss.name, err)
			}
			labels[key] = v
		case strings.HasPrefix(k, tagTaintPrefix):
			t, err := taintTag(k, v)
			if err != nil {
				return nil, nil, fmt.Errorf("scale set %s: %w", ss.name, err)
			}
			taints = append(taints, t)
		case strings.HasPrefix(k, tagResourcesPrefix):
			name, q, err := resourceTag(k, v)
			if err != nil {
				return nil, nil, fmt.Errorf("scale set %s: %w", ss.name, err)
			}
			capacity[name] = q
			overrides[name] = q
		}
	}
	return taints, overrides, nil
}

// Ranges of the autoscaling-options tags.
const (
	maxTagWait   = 7 * 24 * time.Hour
	maxGroupSize = cloudprovider.MaxGroupSize
)

// groupOptions applies the scale set's autoscaling-options tags. A tag whose
// value does not parse or is out of range keeps the default and is
// reported: each error names the tag and its value.
func groupOptions(tags map[string]string, d cloudprovider.GroupOptions) (cloudprovider.GroupOptions, []error) {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		if strings.HasPrefix(k, tagOptionsPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		if err := applyOptionTag(&d, k, tags[k]); err != nil {
			errs = append(errs, err)
		}
	}
	return d, errs
}

// applyOptionTag applies one autoscaling-options tag to d; an unknown
// option is ignored.
func applyOptionTag(d *cloudprovider.GroupOptions, k, v string) error {
	switch strings.ToLower(strings.TrimPrefix(k, tagOptionsPrefix)) {
	case "scaledownutilizationthreshold":
		return shareTag(k, v, &d.ScaleDownUtilizationThreshold)
	case "scaledowngpuutilizationthreshold":
		return shareTag(k, v, &d.ScaleDownGPUUtilizationThreshold)
	case "scaledownunneededtime":
		return waitTag(k, v, 0, &d.ScaleDownUnneededTime)
	case "scaledownunreadytime":
		return waitTag(k, v, 0, &d.ScaleDownUnreadyTime)
	case "maxnodeprovisiontime":
		return waitTag(k, v, time.Second, &d.MaxNodeProvisionTime)
	}
	return nil
}

// shareTag parses a share from 0 to 1 into dst, which it leaves alone on
// an error.
func shareTag(k, v string, dst *float64) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		return fmt.Errorf("tag %s=%q: not a number", k, v)
	}
	if err := bounds.Float("tag "+k, f, 0, 1); err != nil {
		return err
	}
	*dst = f
	return nil
}

// waitTag parses a duration from lo to maxTagWait into dst, which it
// leaves alone on an error.
func waitTag(k, v string, lo time.Duration, dst *time.Duration) error {
	dur, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("tag %s=%q: not a duration (e.g. 10m)", k, v)
	}
	if err := bounds.Duration("tag "+k, dur, lo, maxTagWait); err != nil {
		return err
	}
	*dst = dur
	return nil
}

// groupBounds reads a discovered scale set's min and max tags; errors name
// the tag and its value.
func groupBounds(tags map[string]string) (int, int, error) {
	count := func(k string) (int, error) {
		v, ok := tags[k]
		if !ok {
			return 0, fmt.Errorf("tag %s: missing", k)
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return 0, fmt.Errorf("tag %s=%q: not an integer", k, v)
		}
		if err := bounds.Int("tag "+k, n, 0, maxGroupSize); err != nil {
			return 0, err
		}
		return n, nil
	}
	minSize, err := count(tagMin)
	if err != nil {
		return 0, 0, err
	}
	maxSize, err := count(tagMax)
	if err != nil {
		return 0, 0, err
	}
	if maxSize < 1 {
		return 0, 0, fmt.Errorf("tag %s=%d: must be at least 1", tagMax, maxSize)
	}
	if minSize > maxSize {
		return 0, 0, fmt.Errorf("tag %s=%d is greater than tag %s=%d", tagMin, minSize, tagMax, maxSize)
	}
	return minSize, maxSize, nil
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
