package armsim

import (
	"cmp"
	"context"
	"crypto/sha1"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
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

// Labels AKS puts on its nodes.
const (
	// AgentPoolLabel names the node's AKS node pool; the simulator uses the
	// scale set's name, as AKS names a pool's scale set after it.
	AgentPoolLabel = "kubernetes.azure.com/agentpool"
	// ClusterLabel carries the cluster's node resource group.
	ClusterLabel = "kubernetes.azure.com/cluster"
)

// KubeNodeHook is a NodeHook that registers a Kubernetes Node for each
// running VM and deletes it when the VM is gone, the way a kubelet (and the
// cloud node lifecycle controller) would. Realism says how close to a real
// AKS node the Node is; its zero value is the exact mode, so use
// NewKubeNodeHook (or set Realism to DefaultRealism()) for nodes as AKS
// registers them.
//
// A node's later changes (GPUs advertised, startup taints removed) are timed
// by Clock and made by the hook's own goroutines; they stop when the ctx
// given to VMRunning ends, when VMDeleted is called for the VM, or when the
// node is gone (a deleted node is never recreated or updated). Use a
// KubeNodeHook through a pointer only.
type KubeNodeHook struct {
	// Client talks to the cluster. Required.
	Client kubernetes.Interface
	// RegisterTaints are put on every node at registration, after the
	// taints from tags, and left there (kubelet's --register-with-taints:
	// the preflight taint, say).
	RegisterTaints []v1.Taint
	// Annotations are set on every node (kwok, for one, needs
	// kwok.x-k8s.io/node=fake to manage a node).
	Annotations map[string]string
	// Realism is how the node departs from its SKU's ideal; the zero value
	// is Exact().
	Realism Realism
	// Clock times the delayed updates; nil means the real clock.
	Clock clock.WithDelayedExecution

	mu      sync.Mutex
	pending map[string][]*delayedUpdate // by node name
	running sync.WaitGroup
	// gpuFaults are DegradeNextGPUs' GPUs dead from the start (nodehealth.go).
	gpuFaults gpuFaults
	// problems are, by node, the conditions SetNodeCondition set True
	// (their types), which a repair that fixes the VM clears.
	problems map[string]map[v1.NodeConditionType]bool
}

var (
	_ NodeHook      = (*KubeNodeHook)(nil)
	_ RepairWatcher = (*KubeNodeHook)(nil)
)

// NewKubeNodeHook returns a hook registering nodes through client as AKS
// registers them (DefaultRealism), timed by the real clock.
func NewKubeNodeHook(client kubernetes.Interface) *KubeNodeHook {
	return &KubeNodeHook{Client: client, Realism: DefaultRealism()}
}

// VMRunning creates the VM's Node (named by its lower-cased computer name)
// and, when Realism delays them, schedules the GPUs' advertisement and the
// startup taints' removal. A Node that already exists with its status set
// is left as it is.
func (h *KubeNodeHook) VMRunning(ctx context.Context, vm VM) error {
	if err := h.Realism.Validate(); err != nil {
		return fmt.Errorf("registering node for VM %s: %w", vm.ProviderID, err)
	}
	node := h.Node(vm)
	h.dealGPUFault(vm, node)
	nodes := h.Client.CoreV1().Nodes()
	created, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// A retry after setting the status failed, or someone else's node.
		if created, err = nodes.Get(ctx, node.Name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("reading node %s for VM %s: %w", node.Name, vm.ProviderID, err)
		}
		if len(created.Status.Capacity) > 0 || created.Spec.ProviderID != node.Spec.ProviderID {
			return nil
		}
	} else if err != nil {
		return fmt.Errorf("creating node %s for VM %s: %w", node.Name, vm.ProviderID, err)
	}
	// An API server may drop the status on create; set it as a kubelet does.
	if len(created.Status.Capacity) == 0 {
		created.Status = node.Status
		if _, err := nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting status of node %s for VM %s: %w", node.Name, vm.ProviderID, err)
		}
	}
	h.scheduleUpdates(ctx, vm, created)
	klog.V(2).InfoS("Registered node for VM", "node", node.Name, "providerID", node.Spec.ProviderID)
	return nil
}

// VMDeleted deletes the VM's Node, and cancels its pending updates; a Node
// already gone is fine.
func (h *KubeNodeHook) VMDeleted(ctx context.Context, vm VM) error {
	name := nodeName(vm)
	h.cancel(name)
	h.mu.Lock()
	delete(h.problems, name)
	h.mu.Unlock()
	err := h.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting node %s for VM %s: %w", name, vm.ProviderID, err)
	}
	klog.V(2).InfoS("Deleted node for VM", "node", name, "providerID", vm.ProviderID)
	return nil
}

// NodeName is the name of the VM's Node as KubeNodeHook registers it: the
// VM's computer name, lower-cased as Kubernetes node names must be.
func (vm VM) NodeName() string { return strings.ToLower(vm.ComputerName) }

func nodeName(vm VM) string { return vm.NodeName() }

// tagLabelsAndTaints are the labels and taints the VM's scale set tags ask
// for; a taint tag that does not parse is logged and ignored.
func tagLabelsAndTaints(vm VM) (map[string]string, []v1.Taint) {
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
	return labels, taints
}

// nodeArch is the kubernetes.io/arch of the SKU's nodes.
func nodeArch(sku SKU) string {
	if strings.EqualFold(sku.Arch, ArchArm64) {
		return "arm64"
	}
	return "amd64"
}

// addVMLabels sets the well-known labels a node of the VM has, over those
// of tags.
func addVMLabels(labels map[string]string, vm VM, name, arch string) {
	labels[v1.LabelHostname] = name
	labels[v1.LabelInstanceTypeStable] = vm.SKU.Name
	labels[v1.LabelTopologyRegion] = vm.Location
	if vm.Zone != "" {
		labels[v1.LabelTopologyZone] = vm.Location + "-" + vm.Zone
	}
	labels[v1.LabelArchStable] = arch
	labels[v1.LabelOSStable] = "linux"
	labels[NodeGroupLabel] = vm.ScaleSet
	labels[AgentPoolLabel] = labelValue(vm.ScaleSet)
	labels[ClusterLabel] = labelValue(vm.ResourceGroup)
	if vm.SKU.GPUs > 0 {
		labels[AcceleratorLabel] = "nvidia"
	}
}

// Node returns the Node the hook registers for vm: as it is at
// registration, before the device plugin and network agents have run.
func (h *KubeNodeHook) Node(vm VM) *v1.Node {
	name := nodeName(vm)
	now := metav1.NewTime(h.clock().Now())
	labels, taints := tagLabelsAndTaints(vm)
	arch := nodeArch(vm.SKU)
	addVMLabels(labels, vm, name, arch)
	if vm.Spot { // as AKS registers a Spot node pool's nodes
		labels[ScaleSetPriorityLabel] = ScaleSetPrioritySpot
		taints = append(taints, v1.Taint{Key: ScaleSetPriorityLabel, Value: ScaleSetPrioritySpot, Effect: v1.TaintEffectNoSchedule})
	}
	// Map order is random; keep nodes deterministic.
	slices.SortFunc(taints, func(a, b v1.Taint) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(string(a.Effect), string(b.Effect)))
	})
	taints = append(taints, h.RegisterTaints...)
	if h.Realism.StartupTaintDelay > 0 {
		taints = append(taints, h.Realism.StartupTaints...)
	}

	capacity, allocatable := h.Realism.Resources(vm.SKU)
	if h.Realism.DevicePluginDelay > 0 {
		delete(capacity, GPUResource)
		delete(allocatable, GPUResource)
	}
	providerID := vm.ProviderID
	if h.Realism.AzureProviderIDs {
		providerID = AzureProviderID(providerID)
	}
	var annotations map[string]string
	if len(h.Annotations) > 0 {
		annotations = maps.Clone(h.Annotations)
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       v1.NodeSpec{ProviderID: providerID, Taints: taints},
		Status: v1.NodeStatus{
			Capacity:    capacity,
			Allocatable: allocatable,
			// A kubelet registers its Node NotReady, as it first posts it:
			// the not-ready taint then stays until the node is Ready. With
			// no Ready condition at all, the node lifecycle controller
			// lifts the admission plugin's not-ready taint and the
			// scheduler binds pods to a node no kubelet runs yet.
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionFalse, Reason: "KubeletNotReady",
				Message: "container runtime status check may not have completed yet", LastHeartbeatTime: now, LastTransitionTime: now}},
			NodeInfo: v1.NodeSystemInfo{
				Architecture:    arch,
				OperatingSystem: "linux",
				SystemUUID:      systemUUID(vm.ProviderID),
			},
		},
	}
}

// labelValue makes s a valid label value as AKS does for names it puts in
// labels: at most 63 characters, starting and ending alphanumeric, other
// characters outside [-_.A-Za-z0-9] replaced by '-'.
func labelValue(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			b[i] = '-'
		}
	}
	if len(b) > validation.LabelValueMaxLength {
		b = b[:validation.LabelValueMaxLength]
	}
	// Every byte is ASCII now.
	return strings.TrimFunc(string(b), func(r rune) bool { return !isAlnum(byte(r)) })
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
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
