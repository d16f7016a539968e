// Package crclient builds what the autoscaler needs to read and write a
// custom resource it has its own Go types for: a JSON REST client (custom
// resources have no protobuf), an informer over all namespaces, and
// whether the API server serves the resource (its CRD is installed).
package crclient

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// New returns a REST client of gv (cfg is copied) whose scheme has the
// types addTypes registers, and an informer of resource over all
// namespaces whose objects are of obj's type. The caller runs the
// informer.
func New(cfg *rest.Config, gv schema.GroupVersion, addTypes func(*runtime.Scheme) error, resource string, obj runtime.Object) (rest.Interface, cache.SharedIndexInformer, error) {
	scheme := runtime.NewScheme()
	if err := addTypes(scheme); err != nil {
		return nil, nil, fmt.Errorf("registering %s types: %w", gv, err)
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.AcceptContentTypes = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, nil, fmt.Errorf("building REST client of %s %s: %w", gv, resource, err)
	}
	lw := cache.NewListWatchFromClient(rc, resource, metav1.NamespaceAll, fields.Everything())
	return rc, cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{}), nil
}

// List returns the informer's objects as T (shared: read only).
func List[T runtime.Object](inf cache.SharedIndexInformer, resource string) ([]T, error) {
	objs := inf.GetStore().List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		t, ok := o.(T)
		if !ok {
			return nil, fmt.Errorf("listing %s from cache: unexpected object %T", resource, o)
		}
		out = append(out, t)
	}
	return out, nil
}

// Served says whether the API server serves resource in gv, or why it
// could not tell.
func Served(d discovery.DiscoveryInterface, gv schema.GroupVersion, resource string) (bool, error) {
	res, err := d.ServerResourcesForGroupVersion(gv.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", gv, err)
	}
	for _, r := range res.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}
