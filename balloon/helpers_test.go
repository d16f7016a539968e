package balloon

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	appslisters "k8s.io/client-go/listers/apps/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	// The API server's own defaulting, applied by the fake below, so that
	// "server-defaulted fields are not drift" is tested against the real
	// defaulters rather than a list of our own.
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	_ "k8s.io/kubernetes/pkg/apis/scheduling/install"
)

const gpu apiv1.ResourceName = "nvidia.com/gpu"

// --- GroupSpec builder -------------------------------------------------

type specOption func(*GroupSpec)

// spec is a GroupSpec for an 8-GPU node group.
func spec(group string, replicas int32, opts ...specOption) GroupSpec {
	s := GroupSpec{Group: group, Replicas: replicas, Requests: apiv1.ResourceList{
		apiv1.ResourceCPU:    resource.MustParse("94"),
		apiv1.ResourceMemory: resource.MustParse("1800Gi"),
		gpu:                  resource.MustParse("8"),
	}}
	for _, o := range opts {
		o(&s)
	}
	return s
}

func requests(kv ...string) specOption {
	return func(s *GroupSpec) {
		s.Requests = apiv1.ResourceList{}
		for i := 0; i+1 < len(kv); i += 2 {
			s.Requests[apiv1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
	}
}

func tolerates(ts ...apiv1.Toleration) specOption {
	return func(s *GroupSpec) { s.Tolerations = append(s.Tolerations, ts...) }
}

func toleration(key, value string) apiv1.Toleration {
	op := apiv1.TolerationOpEqual
	if value == "" {
		op = apiv1.TolerationOpExists
	}
	return apiv1.Toleration{Key: key, Operator: op, Value: value, Effect: apiv1.TaintEffectNoSchedule}
}

// --- Deployment builder (objects already in the cluster) ----------------

type deployOption func(*appsv1.Deployment)

// deployment is a plain Deployment of someone else's, in kube-system.
func deployment(name string, opts ...deployOption) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: DefaultNamespace, UID: types.UID("uid-" + name)},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: apiv1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       apiv1.PodSpec{Containers: []apiv1.Container{{Name: "app", Image: "example.com/app:1"}}},
			},
		},
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

// balloonDeployment is what o.Deployment makes for s, as if created earlier.
func balloonDeployment(o Options, s GroupSpec, opts ...deployOption) *appsv1.Deployment {
	d := o.Deployment(s)
	d.UID = types.UID("uid-" + d.Name)
	for _, opt := range opts {
		opt(d)
	}
	return d
}

func withLabels(kv ...string) deployOption {
	return func(d *appsv1.Deployment) {
		if d.Labels == nil {
			d.Labels = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Labels[kv[i]] = kv[i+1]
		}
	}
}

func inNamespace(ns string) deployOption {
	return func(d *appsv1.Deployment) { d.Namespace = ns }
}

func beingDeleted() deployOption {
	return func(d *appsv1.Deployment) {
		d.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
		d.Finalizers = []string{"example.com/hold"}
	}
}

func priorityClass(value int32, policy apiv1.PreemptionPolicy) *schedulingv1.PriorityClass {
	return &schedulingv1.PriorityClass{
		ObjectMeta:       metav1.ObjectMeta{Name: DefaultPriorityClassName},
		Value:            value,
		PreemptionPolicy: &policy,
	}
}

// --- a fake API server with an informer fed from it ---------------------

var deploymentsGVR = appsv1.SchemeGroupVersion.WithResource("deployments")

type env struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	lister appslisters.DeploymentLister
	tweak  func(*metav1.ListOptions) // the informer's filter, nil for none
	ctrl   *Controller
}

// newEnv starts a fake clientset holding objs, applies the API server's
// defaults and assigns UIDs on create and update, and runs a Deployment
// informer on it (all namespaces, unfiltered) for the controller's lister.
func newEnv(t *testing.T, o Options, objs ...runtime.Object) *env {
	t.Helper()
	return newEnvWith(t, o, nil, objs...)
}

// newEnvWith is newEnv with the informer's list options changed by tweak
// (nil: unfiltered). The balloon namespace exists with Pod Security
// restricted, unless objs hold a Namespace of that name.
func newEnvWith(t *testing.T, o Options, tweak func(*metav1.ListOptions), objs ...runtime.Object) *env {
	t.Helper()
	if !slices.ContainsFunc(objs, func(obj runtime.Object) bool {
		ns, ok := obj.(*apiv1.Namespace)
		return ok && ns.Name == o.Namespace
	}) {
		objs = append(objs, restricted(o.Namespace))
	}
	return startEnv(t, o, tweak, objs...)
}

// newEnvWithoutNamespace is newEnv without the balloon namespace (unless
// objs hold it).
func newEnvWithoutNamespace(t *testing.T, o Options, objs ...runtime.Object) *env {
	t.Helper()
	return startEnv(t, o, nil, objs...)
}

func startEnv(t *testing.T, o Options, tweak func(*metav1.ListOptions), objs ...runtime.Object) *env {
	t.Helper()
	for _, obj := range objs {
		legacyscheme.Scheme.Default(obj)
	}
	client := fake.NewClientset(objs...)
	uids := 0
	client.PrependReactor("*", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		switch a := action.(type) {
		case k8stesting.CreateActionImpl:
			obj := a.Object.DeepCopyObject()
			legacyscheme.Scheme.Default(obj)
			if m, err := metaOf(obj); err == nil && m.GetUID() == "" {
				uids++
				m.SetUID(types.UID(fmt.Sprintf("uid-%d", uids)))
			}
			a.Object = obj
			return k8stesting.ObjectReaction(client.Tracker())(a)
		case k8stesting.UpdateActionImpl:
			obj := a.Object.DeepCopyObject()
			legacyscheme.Scheme.Default(obj)
			a.Object = obj
			return k8stesting.ObjectReaction(client.Tracker())(a)
		}
		return false, nil, nil
	})
	// The fake clientset's watch does not resume from a resource version:
	// a write between the informer's List and its Watch is lost for good.
	// The env is ready only once the Deployments watch is open.
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("deployments", func(action k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace())
		once.Do(func() { close(watching) })
		return true, w, err
	})
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(tweak))
	deployments := factory.Apps().V1().Deployments()
	lister := deployments.Lister()
	deployments.Informer()
	// t.Context is cancelled before cleanups run, so Shutdown returns.
	logger, _ := ktesting.NewTestContext(t)
	ctx := klog.NewContext(t.Context(), logger)
	factory.Start(ctx.Done())
	t.Cleanup(factory.Shutdown)
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("informer for %v did not sync", typ)
		}
	}
	select {
	case <-watching:
	case <-time.After(10 * time.Second):
		t.Fatal("the Deployments informer never opened its watch")
	}
	e := &env{t: t, ctx: ctx, client: client, lister: lister, tweak: tweak, ctrl: NewController(client, lister, o)}
	return e
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no ObjectMeta", obj)
	}
	return m, nil
}

// sync runs one Sync after the informer caught up with every write so far.
func (e *env) sync(specs ...GroupSpec) (Result, error) {
	e.t.Helper()
	e.waitForCache()
	e.client.ClearActions()
	return e.ctrl.Sync(e.ctx, specs)
}

// waitForCache polls, with a deadline, until the lister holds exactly the
// Deployments the fake API server holds.
func (e *env) waitForCache() {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		obj, err := e.client.Tracker().List(deploymentsGVR, appsv1.SchemeGroupVersion.WithKind("Deployment"), "")
		if err != nil {
			return false, err
		}
		stored := obj.(*appsv1.DeploymentList).Items
		if e.tweak != nil {
			var opts metav1.ListOptions
			e.tweak(&opts)
			sel, err := labels.Parse(opts.LabelSelector)
			if err != nil {
				return false, err
			}
			stored = slices.DeleteFunc(stored, func(d appsv1.Deployment) bool { return !sel.Matches(labels.Set(d.Labels)) })
		}
		cached, err := e.lister.List(labels.Everything())
		if err != nil || len(cached) != len(stored) {
			return false, err
		}
		for i := range stored {
			c, err := e.lister.Deployments(stored[i].Namespace).Get(stored[i].Name)
			if err != nil || !equality.Semantic.DeepEqual(c, &stored[i]) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		e.t.Fatalf("informer cache did not catch up with the fake API server: %v", err)
	}
}

// writes are the create/update/delete/patch actions since the last sync.
func (e *env) writes() []string {
	var out []string
	for _, a := range e.client.Actions() {
		switch a.GetVerb() {
		case "create", "update", "delete", "patch":
			name := ""
			switch a := a.(type) {
			case k8stesting.CreateActionImpl:
				if m, err := metaOf(a.Object); err == nil {
					name = m.GetName()
				}
			case k8stesting.UpdateActionImpl:
				if m, err := metaOf(a.Object); err == nil {
					name = m.GetName()
				}
			case k8stesting.DeleteActionImpl:
				name = a.Name
			}
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource+" "+name)
		}
	}
	return out
}

// reads are the API reads (get/list) since the last sync, informer
// list/watch excluded (it does not re-list within a test).
func (e *env) reads() []string {
	var out []string
	for _, a := range e.client.Actions() {
		if a.GetVerb() == "get" {
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	return out
}

// get reads a Deployment from the fake API server.
func (e *env) get(ns, name string) *appsv1.Deployment {
	e.t.Helper()
	d, err := e.client.Tracker().Get(deploymentsGVR, ns, name)
	if err != nil {
		e.t.Fatalf("getting Deployment %s/%s: %v", ns, name, err)
	}
	return d.(*appsv1.Deployment)
}

// exists reports whether the fake API server holds the Deployment.
func (e *env) exists(ns, name string) bool {
	_, err := e.client.Tracker().Get(deploymentsGVR, ns, name)
	return err == nil
}

// edit changes a Deployment in the fake API server, as a user would.
func (e *env) edit(ns, name string, f func(*appsv1.Deployment)) {
	e.t.Helper()
	d := e.get(ns, name).DeepCopy()
	f(d)
	if _, err := e.client.AppsV1().Deployments(ns).Update(e.ctx, d, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("editing Deployment %s/%s: %v", ns, name, err)
	}
}
