package app

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// clients builds the cloud provider and the Kubernetes clients: the
// loop's (protobuf, its own rate, watched by the adaptive node-addition
// rate) and the configuration the secure listener's reviews copy.
func (a *app) clients(ctx context.Context) error {
	c := a.c
	provider, err := newCloudProvider(ctx, c, &a.prov, a.reg)
	if err != nil {
		return err
	}
	a.provider = provider
	if closer, ok := provider.(interface{ Close() }); ok {
		a.onStop(closer.Close)
	}

	restCfg, err := kubeConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = c.kubeClientQPS, c.kubeClientBurst
	restCfg.UserAgent = "vmss-autoscaler"
	// Built-in types in protobuf (JSON as the fallback the server may
	// answer with); the dynamic client of CRDs sets JSON itself.
	restCfg.ContentType = c.kubeAPIContentType
	restCfg.AcceptContentTypes = c.kubeAPIContentType
	if c.kubeAPIContentType != contentTypeJSON {
		restCfg.AcceptContentTypes += "," + contentTypeJSON
	}
	// The secure listener's reviews get a client of their own, copied
	// before the observer below wraps this one (secureserve.NewReviewClient).
	a.reviewCfg = rest.CopyConfig(restCfg)
	// The adaptive node-addition rate watches the API server through the
	// autoscaler's own requests: latency, 429s, 5xx.
	a.observer = ratelimit.NewObserver(c.core.NodeAdditionAdaptiveOptions.LatencyThreshold, nil)
	restCfg.Wrap(a.observer.Wrap)
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("building Kubernetes client: %w", err)
	}
	a.restCfg, a.client = restCfg, client
	return nil
}

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration (set --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig=%s: %w", path, err)
	}
	return cfg, nil
}

// providerFlags are the Azure provider's own flags.
type providerFlags struct {
	cfg           vmss.Config
	resourceGroup []string
	discovery     []string
}

func (p *providerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&p.cfg.SubscriptionID, "azure-subscription-id", os.Getenv("AZURE_SUBSCRIPTION_ID"), "subscription of the scale sets (default $AZURE_SUBSCRIPTION_ID)")
	fs.StringSliceVar(&p.resourceGroup, "azure-resource-groups", nil, "resource groups holding the scale sets, comma-separated")
	fs.StringArrayVar(&p.discovery, "node-group-auto-discovery", nil, "discover scale sets by tags, CA's form: label:k8s.io_cluster-autoscaler_enabled,k8s.io_cluster-autoscaler_<cluster> (min and max from the min/max tags); repeatable; --nodes wins")
	fs.StringVar(&p.cfg.ARMEndpoint, "azure-arm-endpoint", vmss.PublicARMEndpoint, "Azure Resource Manager endpoint (sovereign clouds, the ARM simulator)")
	fs.StringVar(&p.cfg.TokenAudience, "azure-token-audience", "", "token audience for ARM; default: the endpoint's")
	fs.StringVar(&p.cfg.AuthorityHost, "azure-authority-host", "", "Entra ID authority host; default: public cloud")
	fs.StringVar(&p.cfg.Auth, "azure-auth", vmss.AuthDefault, "credential: default (DefaultAzureCredential order), workload-identity, managed-identity, client-secret, token-file")
	fs.StringVar(&p.cfg.TenantID, "azure-tenant-id", os.Getenv("AZURE_TENANT_ID"), "tenant ID (default $AZURE_TENANT_ID)")
	fs.StringVar(&p.cfg.ClientID, "azure-client-id", os.Getenv("AZURE_CLIENT_ID"), "client ID of the identity (default $AZURE_CLIENT_ID)")
	fs.StringVar(&p.cfg.ClientSecretFile, "azure-client-secret-file", "", "file holding the client secret (client-secret auth)")
	fs.StringVar(&p.cfg.TokenFile, "azure-token-file", "", "file holding a bearer token (token-file auth)")
	fs.StringVar(&p.cfg.CAFile, "azure-ca-file", "", "extra CA certificate (PEM) to trust for the ARM endpoint")
	fs.DurationVar(&p.cfg.CacheTTL, "azure-cache-ttl", time.Minute, "scale-set cache lifetime (jittered ±10%): one List of scale sets per resource group per refresh (sizes, tags, SKUs); VM lists follow --azure-vm-list-interval")
	fs.DurationVar(&p.cfg.VMListInterval, "azure-vm-list-interval", 5*time.Minute, "how often a quiet scale set's VMs are listed (jittered ±10%; cluster-autoscaler's 5 minutes); a list that fails keeps the last instances")
	fs.DurationVar(&p.cfg.VMListActiveInterval, "azure-vm-list-active-interval", time.Minute, "how often a scale set's VMs are listed while something happens to it (a write, machines coming, going or failed, a size its VMs do not match, Spot)")
	fs.IntVar(&p.cfg.VMListBudget, "azure-vm-list-budget", 300, "most VM lists of all scale sets per 30 minutes (a third of the 900 Microsoft's example of HighCostGetVMScaleSet30Min allows a whole subscription); a scale set's first list is never refused")
	fs.IntVar(&p.cfg.VMListParallelism, "azure-vm-list-parallelism", 8, "most VM lists in flight at once")
	fs.BoolVar(&p.cfg.AllowAKSManaged, "azure-allow-aks-managed-scale-sets", false, "manage scale sets of AKS node pools (aks-managed-* tags), which AKS does not support writing directly; off: such scale sets are refused")
	fs.BoolVar(&p.cfg.ForceDelete, "azure-force-delete", false, "force-delete instances on scale-down")
	fs.BoolVar(&p.cfg.ConcurrentScaleUps, "azure-concurrent-scale-ups", false, "send a scale set's capacity write while its previous scale-up operation still runs (ARM preempts the earlier one, as cluster-autoscaler's writes do); off: at most one capacity write in flight per scale set, and demand that arrives meanwhile waits for the operation to end (minutes for GPU VMs)")
	fs.DurationVar(&p.cfg.LROPollInterval, "azure-operation-poll-interval", 10*time.Second, "how often long-running ARM operations are polled in the background")
}

func newCloudProvider(_ context.Context, c *config, p *providerFlags, reg prometheus.Registerer) (cloudprovider.CloudProvider, error) {
	if c.cloudProvider != "azure" {
		return nil, fmt.Errorf("--cloud-provider=%q: only azure is supported", c.cloudProvider)
	}
	cfg := p.cfg
	cfg.ResourceGroups = p.resourceGroup
	cfg.AutoDiscovery = p.discovery
	cfg.NodeGroups = c.nodeGroupSpecs
	cfg.GPUResourceName = string(c.core.GPUResourceName)
	cfg.Registerer = reg
	prov, err := vmss.New(cfg)
	if err != nil {
		return nil, err
	}
	return prov, nil
}
