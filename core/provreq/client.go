package provreq

import (
	"context"
	"fmt"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/crclient"
)

// API is what the loop needs of the cluster for requests: reads from
// informer caches, writes through the API server.
type API interface {
	// List returns the requests in the cache (shared: read only).
	List() ([]*ProvisioningRequest, error)
	// PodTemplate returns a PodTemplate from the cache (shared: read only).
	PodTemplate(namespace, name string) (*apiv1.PodTemplate, error)
	// UpdateStatus writes a request's status (its resourceVersion guards
	// against a concurrent change: a conflict is an error).
	UpdateStatus(ctx context.Context, r *ProvisioningRequest) error
	// Delete deletes a request, only if it is still the same object (UID).
	Delete(ctx context.Context, r *ProvisioningRequest) error
	// Quotas returns a namespace's ResourceQuotas from the cache (shared:
	// read only; nil when none or unreadable).
	Quotas(namespace string) []*apiv1.ResourceQuota
}

// Client is the API over an informer of requests, a PodTemplate lister
// and a REST client that speaks JSON (custom resources have no protobuf).
type Client struct {
	rest      rest.Interface
	informer  cache.SharedIndexInformer
	templates corelisters.PodTemplateLister
	quotas    corelisters.ResourceQuotaLister
}

var _ API = (*Client)(nil)

// NewClient builds the client from cfg (copied; JSON) and the
// PodTemplate lister of an informer factory the caller starts.
func NewClient(cfg *rest.Config, templates corelisters.PodTemplateLister, quotas corelisters.ResourceQuotaLister) (*Client, error) {
	rc, inf, err := crclient.New(cfg, GroupVersion, addKnownTypes, Resource, &ProvisioningRequest{})
	if err != nil {
		return nil, err
	}
	return &Client{rest: rc, informer: inf, templates: templates, quotas: quotas}, nil
}

// Quotas implements API.
func (c *Client) Quotas(namespace string) []*apiv1.ResourceQuota {
	qs, err := c.quotas.ResourceQuotas(namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	return qs
}

// Informer is the requests' informer: the caller runs it and waits for its sync.
func (c *Client) Informer() cache.SharedIndexInformer { return c.informer }

// List implements API.
func (c *Client) List() ([]*ProvisioningRequest, error) {
	return crclient.List[*ProvisioningRequest](c.informer, Resource)
}

// PodTemplate implements API.
func (c *Client) PodTemplate(namespace, name string) (*apiv1.PodTemplate, error) {
	return c.templates.PodTemplates(namespace).Get(name)
}

// UpdateStatus implements API.
func (c *Client) UpdateStatus(ctx context.Context, r *ProvisioningRequest) error {
	err := c.rest.Put().Namespace(r.Namespace).Resource(Resource).Name(r.Name).SubResource("status").
		Body(r).Do(ctx).Error()
	if err != nil {
		// %w keeps a Conflict recognisable.
		return fmt.Errorf("updating status of %s %s: %w", Kind, Key(r), err)
	}
	return nil
}

// Delete implements API.
func (c *Client) Delete(ctx context.Context, r *ProvisioningRequest) error {
	uid := r.UID
	err := c.rest.Delete().Namespace(r.Namespace).Resource(Resource).Name(r.Name).
		Body(&metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}).Do(ctx).Error()
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s: %w", Kind, Key(r), err)
	}
	return nil
}

// Served says whether the API server serves the ProvisioningRequest API
// (its CRD is installed), or why it could not tell.
func Served(d discovery.DiscoveryInterface) (bool, error) {
	return crclient.Served(d, GroupVersion, Resource)
}
