package measure

import (
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// PodsPerNode is how many pods of res a node of sku holds, from the node
// hook registers for it (AKS's reservations, max pods). A SKU's GPUs
// count though the device plugin advertises them only some seconds after
// registration.
func PodsPerNode(hook *armsim.KubeNodeHook, sku string, res apiv1.ResourceRequirements) (int, error) {
	k := simulatorSKU(sku)
	if k == nil {
		return 0, fmt.Errorf("SKU %s is not one of the simulator's", sku)
	}
	// Where the probe VM is does not change what its node holds.
	n := hook.Node(armsim.VM{ResourceGroup: "probe", ScaleSet: "probe", InstanceID: "0", ComputerName: "probe000000", SKU: *k, Location: "eastus"})
	alloc := n.Status.Allocatable
	fit := int(alloc.Pods().Value())
	for name, q := range res.Requests {
		if q.IsZero() {
			continue
		}
		a, ok := alloc[name]
		if !ok && name == armsim.GPUResource && k.GPUs > 0 {
			a, ok = *resource.NewQuantity(int64(k.GPUs), resource.DecimalSI), true
		}
		if !ok {
			return 0, fmt.Errorf("a %s node has no %s", sku, name)
		}
		fit = min(fit, int(a.MilliValue()/q.MilliValue()))
	}
	if fit < 1 {
		return 0, fmt.Errorf("a pod of %v does not fit a %s node", res.Requests, sku)
	}
	return fit, nil
}

// simulatorSKU is the simulator's SKU of that name, nil if none.
func simulatorSKU(name string) *armsim.SKU {
	for _, s := range armsim.DefaultSKUs() {
		if s.Name == name {
			return &s
		}
	}
	return nil
}
