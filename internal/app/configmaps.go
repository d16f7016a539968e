package app

import (
	"slices"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// namedConfigMaps caches only the named ConfigMaps of one namespace: an
// informer per name that lists and watches with a metadata.name field
// selector, which RBAC's resourceNames can limit, so the autoscaler needs
// no right to read the namespace's other ConfigMaps (its Secrets' cousins:
// other components keep configuration there).
type namedConfigMaps struct {
	namespace string
	names     []string
	factories map[string]informers.SharedInformerFactory
}

// newNamedConfigMaps registers an informer for each non-empty name.
func newNamedConfigMaps(client kubernetes.Interface, namespace string, names ...string) *namedConfigMaps {
	n := &namedConfigMaps{namespace: namespace, factories: map[string]informers.SharedInformerFactory{}}
	for _, name := range names {
		if name == "" || n.factories[name] != nil {
			continue
		}
		selector := fields.OneTermEqualSelector("metadata.name", name).String()
		f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
			informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.FieldSelector = selector }))
		f.Core().V1().ConfigMaps().Informer()
		n.factories[name] = f
		n.names = append(n.names, name)
	}
	slices.Sort(n.names)
	return n
}

// Start starts every informer.
func (n *namedConfigMaps) Start(stop <-chan struct{}) {
	for _, f := range n.factories {
		f.Start(stop)
	}
}

// WaitForCacheSync waits for every informer; false if one did not sync.
func (n *namedConfigMaps) WaitForCacheSync(stop <-chan struct{}) bool {
	ok := true
	for _, f := range n.factories {
		for _, synced := range f.WaitForCacheSync(stop) {
			ok = ok && synced
		}
	}
	return ok
}

// Shutdown stops every informer and waits for them.
func (n *namedConfigMaps) Shutdown() {
	for _, f := range n.factories {
		f.Shutdown()
	}
}

// Informer is the informer of the named ConfigMap, nil when not watched.
func (n *namedConfigMaps) Informer(name string) cache.SharedIndexInformer {
	f := n.factories[name]
	if f == nil {
		return nil
	}
	return f.Core().V1().ConfigMaps().Informer()
}

// Lister reads the cached ConfigMaps; one that is not watched is not found.
func (n *namedConfigMaps) Lister() corelisters.ConfigMapNamespaceLister { return n }

// List implements corelisters.ConfigMapNamespaceLister.
func (n *namedConfigMaps) List(selector labels.Selector) ([]*apiv1.ConfigMap, error) {
	var out []*apiv1.ConfigMap
	for _, name := range n.names {
		l, err := n.factories[name].Core().V1().ConfigMaps().Lister().ConfigMaps(n.namespace).List(selector)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

// Get implements corelisters.ConfigMapNamespaceLister.
func (n *namedConfigMaps) Get(name string) (*apiv1.ConfigMap, error) {
	f := n.factories[name]
	if f == nil {
		return nil, apierrors.NewNotFound(apiv1.Resource("configmaps"), name)
	}
	return f.Core().V1().ConfigMaps().Lister().ConfigMaps(n.namespace).Get(name)
}
