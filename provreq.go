package main

import (
	"context"
	"fmt"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
)

// provisioningRequests builds the ProvisioningRequest client with
// --enable-provisioning-requests, when the API server serves the API (its
// CRD is installed): requests and PodTemplates are watched only then.
// Without the CRD the process runs on, not handling requests, and says so
// (an error line at start); installing the CRD later needs a restart.
func provisioningRequests(ctx context.Context, c *config, cfg *rest.Config, client kubernetes.Interface, factory informers.SharedInformerFactory) (*provreq.Client, error) {
	if !c.core.ProvisioningRequests {
		return nil, nil
	}
	logger := klog.FromContext(ctx)
	served, err := provreq.Served(client.Discovery())
	if err != nil {
		return nil, fmt.Errorf("--enable-provisioning-requests=true: %w", err)
	}
	if !served {
		logger.Error(nil, "--enable-provisioning-requests=true but the API server does not serve ProvisioningRequests: install their CRD "+
			"(config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml of k8s.io/autoscaler/cluster-autoscaler/apis) and restart; "+
			"ProvisioningRequests are not handled until then", "api", provreq.GroupVersion.String())
		return nil, nil
	}
	pc, err := provreq.NewClient(cfg, factory.Core().V1().PodTemplates().Lister())
	if err != nil {
		return nil, fmt.Errorf("--enable-provisioning-requests=true: %w", err)
	}
	logger.Info("ProvisioningRequests: handling check-capacity and best-effort-atomic-scale-up requests",
		"api", provreq.GroupVersion.String(), "classes", []string{provreq.ClassCheckCapacity, provreq.ClassBestEffortAtomic})
	return pc, nil
}
