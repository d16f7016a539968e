package app

import (
	"context"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
)

// capacityBuffers builds the CapacityBuffer client with
// --enable-capacity-buffers, when the API server serves the API (its CRD
// is installed): buffers and PodTemplates are watched only then.
func capacityBuffers(ctx context.Context, c *config, cfg *rest.Config, client kubernetes.Interface, factory informers.SharedInformerFactory) (*capacitybuffer.Client, error) {
	bc, err := customResourceAPI(ctx, c.core.CapacityBuffers, "enable-capacity-buffers", "CapacityBuffers", capacitybuffer.GroupVersion.String(),
		"the chart's crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
		func() (bool, error) { return capacitybuffer.Served(client.Discovery()) },
		func() (*capacitybuffer.Client, error) {
			return capacitybuffer.NewClient(cfg, factory.Core().V1().PodTemplates().Lister(), factory.Core().V1().ResourceQuotas().Lister(), client)
		})
	if bc != nil {
		klog.FromContext(ctx).Info("CapacityBuffers: serving the active-capacity strategy",
			"api", capacitybuffer.GroupVersion.String(), "strategy", capacitybuffer.ActiveCapacity)
	}
	return bc, err
}
