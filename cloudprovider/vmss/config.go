package vmss

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/bounds"
)

// Auth modes.
const (
	AuthDefault          = "default"           // DefaultAzureCredential: environment, workload identity, managed identity, Azure CLI
	AuthWorkloadIdentity = "workload-identity" // federated token file (AKS workload identity)
	AuthManagedIdentity  = "managed-identity"  // the VM's or pod's managed identity
	AuthClientSecret     = "client-secret"     // a service principal's secret
	AuthTokenFile        = "token-file"        // a bearer token read from a file (sovereign test clouds, the ARM simulator)
)

// PublicARMEndpoint is Azure public cloud's Resource Manager.
const PublicARMEndpoint = "https://management.azure.com"

// Config configures the provider. Zero values take the documented defaults.
type Config struct {
	SubscriptionID string
	ResourceGroups []string
	// ARMEndpoint is the Resource Manager endpoint (sovereign clouds, the simulator).
	ARMEndpoint string
	// TokenAudience is the audience tokens are requested for; defaults to
	// the public cloud's when ARMEndpoint is the public one, else ARMEndpoint.
	TokenAudience string
	// AuthorityHost is the Entra ID authority; empty for the public cloud.
	AuthorityHost string
	Auth          string
	TenantID      string
	ClientID      string
	// ClientSecretFile holds the service principal's secret (client-secret mode).
	ClientSecretFile string
	// TokenFile holds a bearer token (token-file mode).
	TokenFile string
	// CAFile adds a CA to trust for ARMEndpoint.
	CAFile string

	NodeGroups []cloudprovider.NodeGroupSpec
	// AutoDiscovery specs in CA's form, "label:tag1,tag2=value".
	AutoDiscovery []string
	// CacheTTL is how long the scale-set cache is used before one List of
	// scale sets per resource group refreshes it (±10% jitter), and the VM
	// lists that are due run.
	CacheTTL time.Duration
	// VMListInterval is how often a quiet scale set's VMs are listed
	// (±10% jitter): cluster-autoscaler's 5 minutes. VMListActiveInterval
	// is how often while something is happening to it (a write, machines
	// coming, going or failed, a capacity its VMs do not match, Spot).
	VMListInterval       time.Duration
	VMListActiveInterval time.Duration
	// VMListBudget bounds the VM lists of all scale sets per 30 minutes
	// (a third of the 900 the subscription's HighCostGetVMScaleSet30Min
	// allows in Microsoft's example, which every client shares); a first
	// list is never refused.
	VMListBudget int
	// VMListParallelism bounds the VM lists in flight at once.
	VMListParallelism int
	// AllowAKSManaged manages scale sets of AKS node pools, which AKS does
	// not support writing directly.
	AllowAKSManaged bool
	// SKUCacheTTL is how long the resource SKU list of a location is kept.
	SKUCacheTTL time.Duration
	// ForceDelete asks ARM to force-delete instances on scale-down.
	ForceDelete bool
	// ConcurrentScaleUps lets IncreaseSize send a capacity write while
	// this process's previous scale-up of the scale set is still running
	// (ARM supersedes the earlier operation: OperationPreempted). False,
	// the default: at most one capacity write in flight per scale set; a
	// scale-up asked for meanwhile is refused unsent as throttled, and the
	// core sends the absolute target once the operation ends, which delays
	// it by up to one operation (minutes for GPU VMs: operations last
	// until the VMs are provisioned). See nodegroup.go's IncreaseSize.
	ConcurrentScaleUps bool
	// LROPollInterval is how often a background watcher polls a long-running operation.
	LROPollInterval time.Duration
	// GPUResourceName is the resource GPUs are advertised as on template nodes.
	GPUResourceName string

	Clock      clock.Clock
	Registerer prometheus.Registerer
	// Credential and Transport override auth and HTTP (tests).
	Credential azcore.TokenCredential
	Transport  policy.Transporter
}

func (c *Config) defaults() {
	c.endpointDefaults()
	c.refreshDefaults()
	if c.GPUResourceName == "" {
		c.GPUResourceName = "nvidia.com/gpu"
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
}

// endpointDefaults fills in the Resource Manager endpoint (without a
// trailing '/'), the token audience and the auth mode.
func (c *Config) endpointDefaults() {
	if c.ARMEndpoint == "" {
		c.ARMEndpoint = PublicARMEndpoint
	}
	c.ARMEndpoint = strings.TrimRight(c.ARMEndpoint, "/")
	if c.TokenAudience == "" {
		if c.ARMEndpoint == PublicARMEndpoint {
			c.TokenAudience = PublicARMEndpoint
		} else {
			c.TokenAudience = c.ARMEndpoint
		}
	}
	if c.Auth == "" {
		c.Auth = AuthDefault
	}
}

// refreshDefaults fills in how often what is read from ARM is read
// again: the caches, the VM lists, the operation polls.
func (c *Config) refreshDefaults() {
	if c.CacheTTL == 0 {
		c.CacheTTL = time.Minute
	}
	if c.VMListInterval == 0 {
		c.VMListInterval = 5 * time.Minute
	}
	if c.VMListActiveInterval == 0 {
		c.VMListActiveInterval = time.Minute
	}
	if c.VMListBudget == 0 {
		c.VMListBudget = 300
	}
	if c.VMListParallelism == 0 {
		c.VMListParallelism = 8
	}
	if c.SKUCacheTTL == 0 {
		c.SKUCacheTTL = 12 * time.Hour
	}
	if c.LROPollInterval == 0 {
		c.LROPollInterval = 10 * time.Second
	}
	if c.LROPollInterval < time.Second {
		c.LROPollInterval = time.Second // the SDK's poller refuses less
	}
}

// Validate checks the configuration; errors name the flag.
func (c *Config) Validate() error {
	return bounds.First(
		c.validateScope,
		c.validateNodeGroups,
		c.validateEndpoint,
		c.validateIntervals,
		c.validateVMListLimits,
		func() error { return bounds.Duration("sku cache TTL", c.SKUCacheTTL, time.Minute, 7*24*time.Hour) },
		c.validateAuth,
	)
}

// validateScope checks that there is a subscription, resource groups and
// node groups to manage.
func (c *Config) validateScope() error {
	if c.SubscriptionID == "" {
		return fmt.Errorf("--azure-subscription-id: required (or AZURE_SUBSCRIPTION_ID)")
	}
	if len(c.ResourceGroups) == 0 {
		return fmt.Errorf("--azure-resource-groups: at least one resource group is required")
	}
	if len(c.NodeGroups) == 0 && len(c.AutoDiscovery) == 0 {
		return fmt.Errorf("--nodes or --node-group-auto-discovery: no node groups configured")
	}
	return nil
}

// validateNodeGroups checks each --nodes, whose resource group must be
// one of --azure-resource-groups, and each auto-discovery spec.
func (c *Config) validateNodeGroups() error {
	for _, ng := range c.NodeGroups {
		if err := validateName(ng.Name); err != nil {
			return fmt.Errorf("--nodes: %w", err)
		}
		if ng.ResourceGroup != "" && !slices.ContainsFunc(c.ResourceGroups, func(rg string) bool { return strings.EqualFold(rg, ng.ResourceGroup) }) {
			return fmt.Errorf("--nodes=%d:%d:%s: resource group %q is not one of --azure-resource-groups (%s)",
				ng.Min, ng.Max, ng.Target(), ng.ResourceGroup, strings.Join(c.ResourceGroups, ","))
		}
	}
	for _, d := range c.AutoDiscovery {
		if _, err := parseAutoDiscovery(d); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validateEndpoint() error {
	if !strings.HasPrefix(c.ARMEndpoint, "https://") {
		return fmt.Errorf("--azure-arm-endpoint=%q: must be an https:// URL", c.ARMEndpoint)
	}
	return nil
}

// validateIntervals checks the cache TTL, the operation poll interval and
// the VM list intervals.
func (c *Config) validateIntervals() error {
	return bounds.First(
		func() error { return bounds.Duration("--azure-cache-ttl", c.CacheTTL, time.Second, time.Hour) },
		func() error {
			return bounds.Duration("--azure-operation-poll-interval", c.LROPollInterval, time.Second, time.Hour)
		},
		func() error {
			return bounds.Duration("--azure-vm-list-interval", c.VMListInterval, time.Second, 2*time.Hour)
		},
		func() error {
			return bounds.Duration("--azure-vm-list-active-interval", c.VMListActiveInterval, time.Second, c.VMListInterval)
		},
	)
}

// validateVMListLimits checks the VM list budget and parallelism.
func (c *Config) validateVMListLimits() error {
	if c.VMListBudget < 1 || c.VMListBudget > 10000 {
		return fmt.Errorf("--azure-vm-list-budget=%d: must be between 1 and 10000 VM lists per 30 minutes", c.VMListBudget)
	}
	if c.VMListParallelism < 1 || c.VMListParallelism > 64 {
		return fmt.Errorf("--azure-vm-list-parallelism=%d: must be between 1 and 64", c.VMListParallelism)
	}
	return nil
}

// validateAuth checks the auth mode and what it needs.
func (c *Config) validateAuth() error {
	switch c.Auth {
	case AuthDefault, AuthWorkloadIdentity, AuthManagedIdentity:
	case AuthClientSecret:
		if c.TenantID == "" || c.ClientID == "" || c.ClientSecretFile == "" {
			return fmt.Errorf("--azure-auth=client-secret: needs --azure-tenant-id, --azure-client-id and --azure-client-secret-file")
		}
	case AuthTokenFile:
		if c.TokenFile == "" && c.Credential == nil {
			return fmt.Errorf("--azure-auth=token-file: needs --azure-token-file")
		}
	default:
		return fmt.Errorf("--azure-auth=%q: want one of %s, %s, %s, %s, %s", c.Auth, AuthDefault, AuthWorkloadIdentity, AuthManagedIdentity, AuthClientSecret, AuthTokenFile)
	}
	return nil
}

func validateName(n string) error {
	if n == "" || strings.ContainsAny(n, "/ ") {
		return fmt.Errorf("scale set name %q is not valid", n)
	}
	return nil
}

// cloudConfig is the azcore cloud configuration for the endpoint.
func (c *Config) cloudConfig() cloud.Configuration {
	cc := cloud.AzurePublic
	if c.AuthorityHost != "" {
		cc.ActiveDirectoryAuthorityHost = c.AuthorityHost
	}
	cc.Services = map[cloud.ServiceName]cloud.ServiceConfiguration{
		cloud.ResourceManager: {Endpoint: c.ARMEndpoint, Audience: c.TokenAudience},
	}
	return cc
}

// transport returns the HTTP transport, trusting CAFile when set.
func (c *Config) transport() (policy.Transporter, error) {
	if c.Transport != nil {
		return c.Transport, nil
	}
	if c.CAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("--azure-ca-file=%s: %w", c.CAFile, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--azure-ca-file=%s: no PEM certificate found", c.CAFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

// credential builds the token credential for the configured mode.
func (c *Config) credential(tr policy.Transporter) (azcore.TokenCredential, error) {
	if c.Credential != nil {
		return c.Credential, nil
	}
	opts := azcore.ClientOptions{Cloud: c.cloudConfig(), Transport: tr}
	switch c.Auth {
	case AuthWorkloadIdentity:
		return c.workloadIdentityCredential(opts)
	case AuthManagedIdentity:
		return c.managedIdentityCredential(opts)
	case AuthClientSecret:
		return c.clientSecretCredential(opts)
	case AuthTokenFile:
		return &tokenFile{path: c.TokenFile}, nil
	default:
		return c.defaultCredential(opts)
	}
}

func (c *Config) workloadIdentityCredential(opts azcore.ClientOptions) (azcore.TokenCredential, error) {
	cred, err := azidentity.NewWorkloadIdentityCredential(&azidentity.WorkloadIdentityCredentialOptions{
		ClientOptions: opts, TenantID: c.TenantID, ClientID: c.ClientID})
	if err != nil {
		return nil, fmt.Errorf("--azure-auth=workload-identity: %w", err)
	}
	return cred, nil
}

// managedIdentityCredential is the managed identity's credential: the
// one of --azure-client-id, if given.
func (c *Config) managedIdentityCredential(opts azcore.ClientOptions) (azcore.TokenCredential, error) {
	o := &azidentity.ManagedIdentityCredentialOptions{ClientOptions: opts}
	if c.ClientID != "" {
		o.ID = azidentity.ClientID(c.ClientID)
	}
	cred, err := azidentity.NewManagedIdentityCredential(o)
	if err != nil {
		return nil, fmt.Errorf("--azure-auth=managed-identity: %w", err)
	}
	return cred, nil
}

// clientSecretCredential is the service principal's credential, its
// secret read from --azure-client-secret-file.
func (c *Config) clientSecretCredential(opts azcore.ClientOptions) (azcore.TokenCredential, error) {
	secret, err := os.ReadFile(c.ClientSecretFile)
	if err != nil {
		return nil, fmt.Errorf("--azure-client-secret-file=%s: %w", c.ClientSecretFile, err)
	}
	cred, err := azidentity.NewClientSecretCredential(c.TenantID, c.ClientID, strings.TrimSpace(string(secret)),
		&azidentity.ClientSecretCredentialOptions{ClientOptions: opts})
	if err != nil {
		return nil, fmt.Errorf("--azure-auth=client-secret: %w", err)
	}
	return cred, nil
}

func (c *Config) defaultCredential(opts azcore.ClientOptions) (azcore.TokenCredential, error) {
	cred, err := azidentity.NewDefaultAzureCredential(&azidentity.DefaultAzureCredentialOptions{
		ClientOptions: opts, TenantID: c.TenantID})
	if err != nil {
		return nil, fmt.Errorf("--azure-auth=default: %w", err)
	}
	return cred, nil
}

// tokenFile is a credential that reads a bearer token from a file on each
// request, so a rotated token is picked up.
type tokenFile struct{ path string }

func (t *tokenFile) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	b, err := os.ReadFile(t.path)
	if err != nil {
		return azcore.AccessToken{}, fmt.Errorf("reading token file %s: %w", t.path, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return azcore.AccessToken{}, fmt.Errorf("token file %s is empty", t.path)
	}
	return azcore.AccessToken{Token: tok, ExpiresOn: time.Now().Add(5 * time.Minute)}, nil
}
