package capacitybuffer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"sync"
	"time"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/crclient"
)

// API is what the loop needs of the cluster for buffers: reads from
// caches, status writes through the API server.
type API interface {
	// List returns the buffers in the cache (shared: read only).
	List() ([]*CapacityBuffer, error)
	// PodTemplate returns a PodTemplate from the cache (shared: read only).
	PodTemplate(namespace, name string) (*apiv1.PodTemplate, error)
	// Scalable returns the pod template and the replicas of a buffer's
	// scalableRef (a cached read: see ScalableRefresh).
	Scalable(ctx context.Context, namespace string, ref ScalableRef) (*apiv1.PodTemplateSpec, int32, error)
	// UpdateStatus writes a buffer's status (its resourceVersion guards
	// against a concurrent change: a conflict is an error).
	UpdateStatus(ctx context.Context, b *CapacityBuffer) error
	// Quotas returns a namespace's ResourceQuotas from the cache (shared:
	// read only).
	Quotas(namespace string) ([]*apiv1.ResourceQuota, error)
}

// ScalableRefresh is how long a scalable object read for a buffer is used
// before it is read again: the workloads a buffer follows are not in the
// autoscaler's informers (Deployments, StatefulSets, ReplicaSets and Jobs
// of every namespace would cost memory on a large cluster for a handful
// of buffers), and one read per buffer per loop would cost the API server
// more than the buffer is worth.
const ScalableRefresh = 30 * time.Second

// Client is the API over an informer of buffers, a PodTemplate lister, a
// REST client that speaks JSON and a clientset for scalable objects.
type Client struct {
	rest      rest.Interface
	informer  cache.SharedIndexInformer
	templates corelisters.PodTemplateLister
	quotas    corelisters.ResourceQuotaLister
	scalables *scalableCache
}

var _ API = (*Client)(nil)

// NewClient builds the client from cfg (copied; JSON), the PodTemplate
// and ResourceQuota listers of an informer factory the caller starts, and
// a clientset.
func NewClient(cfg *rest.Config, templates corelisters.PodTemplateLister, quotas corelisters.ResourceQuotaLister, cs kubernetes.Interface) (*Client, error) {
	rc, inf, err := crclient.New(cfg, GroupVersion, addKnownTypes, Resource, &CapacityBuffer{})
	if err != nil {
		return nil, err
	}
	return &Client{rest: rc, informer: inf, templates: templates, quotas: quotas,
		scalables: &scalableCache{read: clientsetScalable(cs), ttl: ScalableRefresh, now: time.Now, entries: map[string]scalableEntry{}}}, nil
}

// Informer is the buffers' informer: the caller runs it and waits for its sync.
func (c *Client) Informer() cache.SharedIndexInformer { return c.informer }

// List implements API.
func (c *Client) List() ([]*CapacityBuffer, error) {
	return crclient.List[*CapacityBuffer](c.informer, Resource)
}

// PodTemplate implements API.
func (c *Client) PodTemplate(namespace, name string) (*apiv1.PodTemplate, error) {
	return c.templates.PodTemplates(namespace).Get(name)
}

// Quotas implements API.
func (c *Client) Quotas(namespace string) ([]*apiv1.ResourceQuota, error) {
	return c.quotas.ResourceQuotas(namespace).List(labels.Everything())
}

// Scalable implements API.
func (c *Client) Scalable(ctx context.Context, namespace string, ref ScalableRef) (*apiv1.PodTemplateSpec, int32, error) {
	return c.scalables.get(ctx, namespace, ref)
}

// UpdateStatus implements API.
func (c *Client) UpdateStatus(ctx context.Context, b *CapacityBuffer) error {
	err := c.rest.Put().Namespace(b.Namespace).Resource(Resource).Name(b.Name).SubResource("status").
		Body(b).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("updating status of %s %s: %w", Kind, Key(b), err)
	}
	return nil
}

// Served says whether the API server serves the CapacityBuffer API (its
// CRD is installed), or why it could not tell.
func Served(d discovery.DiscoveryInterface) (bool, error) {
	return crclient.Served(d, GroupVersion, Resource)
}

// readScalable reads a scalable object's pod template and replicas.
type readScalable func(ctx context.Context, namespace string, ref ScalableRef) (*apiv1.PodTemplateSpec, int32, error)

// SupportedScalables are the kinds a scalableRef may name: those whose
// pod template is in their spec.
var supportedScalables = []string{"apps/Deployment", "apps/StatefulSet", "apps/ReplicaSet", "batch/Job"}

// UnsupportedScalableError says a scalableRef names a kind this
// autoscaler cannot read a pod template from.
type UnsupportedScalableError struct{ Ref ScalableRef }

func (e *UnsupportedScalableError) Error() string {
	return fmt.Sprintf("spec.scalableRef: apiGroup %q kind %q is not supported: one of %v", e.Ref.APIGroup, e.Ref.Kind, supportedScalables)
}

// ScalableNotFoundError says a scalableRef names no object.
type ScalableNotFoundError struct {
	Namespace string
	Ref       ScalableRef
}

func (e *ScalableNotFoundError) Error() string {
	return fmt.Sprintf("spec.scalableRef: %s %s/%s not found", e.Ref.Kind, e.Namespace, e.Ref.Name)
}

func clientsetScalable(cs kubernetes.Interface) readScalable {
	return func(ctx context.Context, ns string, ref ScalableRef) (*apiv1.PodTemplateSpec, int32, error) {
		opts := metav1.GetOptions{}
		switch ref.APIGroup + "/" + ref.Kind {
		case "apps/Deployment":
			d, err := cs.AppsV1().Deployments(ns).Get(ctx, ref.Name, opts)
			if err != nil {
				return nil, 0, err
			}
			return &d.Spec.Template, replicasOr1(d.Spec.Replicas), nil
		case "apps/StatefulSet":
			s, err := cs.AppsV1().StatefulSets(ns).Get(ctx, ref.Name, opts)
			if err != nil {
				return nil, 0, err
			}
			return &s.Spec.Template, replicasOr1(s.Spec.Replicas), nil
		case "apps/ReplicaSet":
			r, err := cs.AppsV1().ReplicaSets(ns).Get(ctx, ref.Name, opts)
			if err != nil {
				return nil, 0, err
			}
			return &r.Spec.Template, replicasOr1(r.Spec.Replicas), nil
		case "batch/Job":
			j, err := cs.BatchV1().Jobs(ns).Get(ctx, ref.Name, opts)
			if err != nil {
				return nil, 0, err
			}
			return &j.Spec.Template, replicasOr1(j.Spec.Parallelism), nil
		}
		return nil, 0, &UnsupportedScalableError{Ref: ref}
	}
}

// replicasOr1 is a replicas field as the API server defaults it.
func replicasOr1(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

// scalableCache keeps each scalable object read for about ttl (a few
// seconds of jitter per object, so the reads of many buffers spread out),
// and bounds what reading costs the loop: each read has readTimeout, at
// most refreshBurst reads are made at once and refreshPerSecond after (an
// expired entry past the budget is served as it is: stale by a few
// seconds), and a failed read is not tried again for ttl/2 (the last good
// read is served meanwhile, up to maxStale; after that, the error).
// Missing and unsupported objects are answers, kept like good reads.
type scalableCache struct {
	read    readScalable
	ttl     time.Duration
	now     func() time.Time
	mu      sync.Mutex
	entries map[string]scalableEntry
	// tokens and refilled are the read budget.
	tokens   float64
	refilled time.Time
}

// The read budget and bounds (see scalableCache).
const (
	readTimeout      = 5 * time.Second
	refreshBurst     = 10
	refreshPerSecond = 2.0
	maxStale         = 10 * time.Minute
)

type scalableEntry struct {
	at       time.Time // of the last good read or answer
	template *apiv1.PodTemplateSpec
	replicas int32
	err      error // an answer: not found, unsupported
	// failed is when a read last failed (zero: it did not), failErr why.
	failed  time.Time
	failErr error
}

func (c *scalableCache) get(ctx context.Context, ns string, ref ScalableRef) (*apiv1.PodTemplateSpec, int32, error) {
	key := ns + "/" + ref.APIGroup + "/" + ref.Kind + "/" + ref.Name
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	fresh := ok && !e.at.IsZero() && now.Sub(e.at) < c.ttl+jitter(key)
	backingOff := ok && !e.failed.IsZero() && now.Sub(e.failed) < c.ttl/2
	switch {
	case fresh:
		return e.template, e.replicas, e.err
	case backingOff:
		return c.stale(e, now)
	case !c.take(now):
		if ok {
			return c.stale(e, now)
		}
		return nil, 0, fmt.Errorf("reading spec.scalableRef %s %s/%s: deferred, too many reads of scalable objects at once", ref.Kind, ns, ref.Name)
	}
	e = c.readEntry(ctx, ns, ref, e, now)
	c.entries[key] = e
	c.prune(now)
	if !e.failed.IsZero() {
		return c.stale(e, now)
	}
	return e.template, e.replicas, e.err
}

// readEntry reads the object now, within readTimeout: a good read or an
// answer (unsupported, not found) makes a new entry; a failure is noted
// on e, which keeps its last good read.
func (c *scalableCache) readEntry(ctx context.Context, ns string, ref ScalableRef, e scalableEntry, now time.Time) scalableEntry {
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	t, r, err := c.read(rctx, ns, ref)
	cancel()
	var unsupported *UnsupportedScalableError
	switch {
	case err == nil, errors.As(err, &unsupported):
		return scalableEntry{at: now, template: t, replicas: r, err: err}
	case apierrors.IsNotFound(err):
		return scalableEntry{at: now, err: &ScalableNotFoundError{Namespace: ns, Ref: ref}}
	}
	e.failed, e.failErr = now, fmt.Errorf("reading spec.scalableRef %s %s/%s: %w", ref.Kind, ns, ref.Name, err)
	return e
}

// stale serves the last good read while a read fails or waits, up to
// maxStale, and the failure after that.
func (c *scalableCache) stale(e scalableEntry, now time.Time) (*apiv1.PodTemplateSpec, int32, error) {
	if !e.at.IsZero() && now.Sub(e.at) < maxStale {
		return e.template, e.replicas, e.err
	}
	if e.failErr != nil {
		return nil, 0, e.failErr
	}
	return nil, 0, errors.New("reading spec.scalableRef: no read yet")
}

// take spends one read of the budget, if there is one.
func (c *scalableCache) take(now time.Time) bool {
	if c.refilled.IsZero() {
		c.tokens = refreshBurst
	} else {
		c.tokens = math.Min(refreshBurst, c.tokens+now.Sub(c.refilled).Seconds()*refreshPerSecond)
	}
	c.refilled = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

// prune drops the entries of objects no buffer asked for in a long time.
func (c *scalableCache) prune(now time.Time) {
	if len(c.entries) <= maxCacheEntries {
		return
	}
	for k, old := range c.entries {
		last := old.at
		if old.failed.After(last) {
			last = old.failed
		}
		if now.Sub(last) >= maxStale {
			delete(c.entries, k)
		}
	}
}

// jitter spreads the objects' refreshes over 10 s, the same for an object
// every time.
func jitter(key string) time.Duration {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return time.Duration(h.Sum32()%10000) * time.Millisecond
}

// maxCacheEntries is the number of entries above which old ones are
// dropped (buffers deleted long ago).
const maxCacheEntries = 1024
