package app

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
func provisioningRequests(ctx context.Context, c *config, cfg *rest.Config, client kubernetes.Interface, factory informers.SharedInformerFactory) (*provreq.Client, error) {
	pc, err := customResourceAPI(ctx, c.core.ProvisioningRequests, "enable-provisioning-requests", "ProvisioningRequests", provreq.GroupVersion.String(),
		"config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml of k8s.io/autoscaler/cluster-autoscaler/apis",
		func() (bool, error) { return provreq.Served(client.Discovery()) },
		func() (*provreq.Client, error) {
			return provreq.NewClient(cfg, factory.Core().V1().PodTemplates().Lister(), factory.Core().V1().ResourceQuotas().Lister())
		})
	if pc != nil {
		klog.FromContext(ctx).Info("ProvisioningRequests: handling check-capacity and best-effort-atomic-scale-up requests",
			"api", provreq.GroupVersion.String(), "classes", []string{provreq.ClassCheckCapacity, provreq.ClassBestEffortAtomic})
	}
	return pc, err
}

// customResourceAPI builds the client of a custom resource API that the
// flag turns on, when the API server serves it. Without its CRD the
// process runs on, not handling the API, and says so (an error line at
// start); installing the CRD later needs a restart. A nil client and no
// error: off, or not served.
func customResourceAPI[T any](ctx context.Context, on bool, flag, what, api, crd string, served func() (bool, error), build func() (*T, error)) (*T, error) {
	if !on {
		return nil, nil
	}
	ok, err := served()
	if err != nil {
		return nil, fmt.Errorf("--%s=true: %w", flag, err)
	}
	if !ok {
		klog.FromContext(ctx).Error(nil, fmt.Sprintf("--%s=true but the API server does not serve %s: install their CRD (%s) and restart; %s are not handled until then",
			flag, what, crd, what), "api", api)
		return nil, nil
	}
	cl, err := build()
	if err != nil {
		return nil, fmt.Errorf("--%s=true: %w", flag, err)
	}
	return cl, nil
}
