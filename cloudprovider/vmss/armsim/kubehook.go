package armsim

import (
	"cmp"
	"context"
	"crypto/sha1"
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Tag key prefixes through which a scale set declares its nodes' labels and
// taints, as the cluster-autoscaler Azure provider reads them. In the rest of
// the key "__" stands for "/".
const (
	LabelTagPrefix = "k8s.io_cluster-autoscaler_node-template_label_"
	TaintTagPrefix = "k8s.io_cluster-autoscaler_node-template_taint_"
)

// Labels the hook puts on nodes besides the well-known Kubernetes ones.
const (
	// NodeGroupLabel carries the scale set name.
	NodeGroupLabel = "vmss-autoscaler.io/node-group"
	// AcceleratorLabel is "nvidia" on nodes with GPUs, as on AKS.
	AcceleratorLabel = "kubernetes.azure.com/accelerator"
	// GPUResource is the extended resource GPU nodes offer.
	GPUResource v1.ResourceName = "nvidia.com/gpu"
)

// KubeNodeHook is a NodeHook that registers a Kubernetes Node for each
// running VM and deletes it when the VM is gone, the way a kubelet (and the
// cloud node lifecycle controller) would.
type KubeNodeHook struct {
	// Client talks to the cluster. Required.
	Client kubernetes.Interface
	// StartupTaints are added to every node, after the taints from tags.
	StartupTaints []v1.Taint
	// Annotations are set on every node (kwok, for one, needs
	// kwok.x-k8s.io/node=fake to manage a node).
	Annotations map[string]string
}

var _ NodeHook = (*KubeNodeHook)(nil)

// VMRunning creates the VM's Node (named by its lower-cased computer name).
// A Node that already exists is left as it is.
func (h *KubeNodeHook) VMRunning(ctx context.Context, vm VM) error {
	node := h.Node(vm)
	created, err := h.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating node %s for VM %s: %w", node.Name, vm.ProviderID, err)
	}
	// An API server may drop the status on create; set it as a kubelet does.
	if len(created.Status.Capacity) == 0 {
		created.Status = node.Status
		if _, err := h.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting status of node %s for VM %s: %w", node.Name, vm.ProviderID, err)
		}
	}
	klog.V(2).InfoS("Registered node for VM", "node", node.Name, "providerID", vm.ProviderID)
	return nil
}

// VMDeleted deletes the VM's Node; a Node already gone is fine.
func (h *KubeNodeHook) VMDeleted(ctx context.Context, vm VM) error {
	name := nodeName(vm)
	err := h.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting node %s for VM %s: %w", name, vm.ProviderID, err)
	}
	klog.V(2).InfoS("Deleted node for VM", "node", name, "providerID", vm.ProviderID)
	return nil
}

// nodeName is the VM's computer name, lower-cased as Kubernetes node names
// must be.
func nodeName(vm VM) string { return strings.ToLower(vm.ComputerName) }

// Node returns the Node the hook registers for vm.
func (h *KubeNodeHook) Node(vm VM) *v1.Node {
	name := nodeName(vm)
	labels := map[string]string{}
	var taints []v1.Taint
	for key, value := range vm.Tags {
		if k, ok := strings.CutPrefix(key, LabelTagPrefix); ok && k != "" {
			labels[strings.ReplaceAll(k, "__", "/")] = value
		}
		if k, ok := strings.CutPrefix(key, TaintTagPrefix); ok && k != "" {
			taint, err := parseTaint(strings.ReplaceAll(k, "__", "/"), value)
			if err != nil {
				klog.ErrorS(err, "Ignoring invalid taint tag", "scaleSet", vm.ScaleSet, "tag", key)
				continue
			}
			taints = append(taints, taint)
		}
	}
	arch := "amd64"
	if strings.EqualFold(vm.SKU.Arch, ArchArm64) {
		arch = "arm64"
	}
	labels[v1.LabelHostname] = name
	labels[v1.LabelInstanceTypeStable] = vm.SKU.Name
	labels[v1.LabelTopologyRegion] = vm.Location
	if vm.Zone != "" {
		labels[v1.LabelTopologyZone] = vm.Location + "-" + vm.Zone
	}
	labels[v1.LabelArchStable] = arch
	labels[v1.LabelOSStable] = "linux"
	labels[NodeGroupLabel] = vm.ScaleSet
	if vm.SKU.GPUs > 0 {
		labels[AcceleratorLabel] = "nvidia"
	}
	// Map order is random; keep nodes deterministic.
	slices.SortFunc(taints, func(a, b v1.Taint) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(string(a.Effect), string(b.Effect)))
	})
	taints = append(taints, h.StartupTaints...)

	capacity := v1.ResourceList{
		v1.ResourceCPU:              *resource.NewQuantity(int64(vm.SKU.VCPUs), resource.DecimalSI),
		v1.ResourceMemory:           *resource.NewQuantity(int64(vm.SKU.MemoryGB*(1<<30)), resource.BinarySI),
		v1.ResourcePods:             *resource.NewQuantity(110, resource.DecimalSI),
		v1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	if vm.SKU.GPUs > 0 {
		capacity[GPUResource] = *resource.NewQuantity(int64(vm.SKU.GPUs), resource.DecimalSI)
	}
	var annotations map[string]string
	if len(h.Annotations) > 0 {
		annotations = maps.Clone(h.Annotations)
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       v1.NodeSpec{ProviderID: vm.ProviderID, Taints: taints},
		Status: v1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			NodeInfo: v1.NodeSystemInfo{
				Architecture:    arch,
				OperatingSystem: "linux",
				SystemUUID:      systemUUID(vm.ProviderID),
			},
		},
	}
}

// parseTaint parses a taint tag's value, "<value>:<Effect>".
func parseTaint(key, spec string) (v1.Taint, error) {
	i := strings.LastIndex(spec, ":")
	if i < 0 {
		return v1.Taint{}, fmt.Errorf("taint %s=%q: want <value>:<Effect>", key, spec)
	}
	effect := v1.TaintEffect(spec[i+1:])
	switch effect {
	case v1.TaintEffectNoSchedule, v1.TaintEffectPreferNoSchedule, v1.TaintEffectNoExecute:
	default:
		return v1.Taint{}, fmt.Errorf("taint %s=%q: unknown effect %q", key, spec, effect)
	}
	return v1.Taint{Key: key, Value: spec[:i], Effect: effect}, nil
}

// ParseTaint parses "key=value:Effect" (or "key:Effect"), the form of the
// --startup-taint flag.
func ParseTaint(s string) (v1.Taint, error) {
	key, rest, hasValue := strings.Cut(s, "=")
	if !hasValue {
		i := strings.LastIndex(s, ":")
		if i < 0 {
			return v1.Taint{}, fmt.Errorf("taint %q: want key=value:Effect", s)
		}
		key, rest = s[:i], s[i:]
	}
	if key == "" {
		return v1.Taint{}, fmt.Errorf("taint %q: empty key", s)
	}
	return parseTaint(key, rest)
}

// systemUUID derives a stable UUID for a VM. It must not look like a
// number: kwok renders node status through YAML templates, and an instance
// ID such as "0" would come back as an integer.
func systemUUID(providerID string) string {
	h := sha1.Sum([]byte(strings.ToLower(providerID)))
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}
