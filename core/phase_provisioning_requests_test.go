package core

import (
	"context"
	"errors"
	"fmt"
	"k8s.io/apimachinery/pkg/api/resource"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// fakeProvreqs is the env's ProvisioningRequest API: the test adds
// requests and templates as an informer would see them, and a status
// write lands in the same store, as the API server and the informer
// would make it (a stale resourceVersion is a conflict).
type fakeProvreqs struct {
	mu        sync.Mutex
	reqs      map[string]*provreq.ProvisioningRequest
	templates cache.Indexer
	writes    map[string]int
	deleted   []string
	rv        int
	// quotas are the namespaces' ResourceQuotas.
	quotas map[string][]*apiv1.ResourceQuota
}

func (f *fakeProvreqs) Quotas(ns string) []*apiv1.ResourceQuota {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.quotas[ns]
}

func newFakeProvreqs() *fakeProvreqs {
	return &fakeProvreqs{reqs: map[string]*provreq.ProvisioningRequest{}, writes: map[string]int{},
		templates: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})}
}

func withProvreqs(f *fakeProvreqs) envOption {
	return func(e *env) {
		e.provreq = f
		e.opts.ProvisioningRequests = true
	}
}

func (f *fakeProvreqs) List() ([]*provreq.ProvisioningRequest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*provreq.ProvisioningRequest, 0, len(f.reqs))
	for _, r := range f.reqs {
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeProvreqs) PodTemplate(ns, name string) (*apiv1.PodTemplate, error) {
	return corelisters.NewPodTemplateLister(f.templates).PodTemplates(ns).Get(name)
}

func (f *fakeProvreqs) UpdateStatus(_ context.Context, r *provreq.ProvisioningRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.reqs[provreq.Key(r)]
	gr := schema.GroupResource{Group: provreq.Group, Resource: provreq.Resource}
	if !ok {
		return apierrors.NewNotFound(gr, r.Name)
	}
	if cur.ResourceVersion != r.ResourceVersion {
		return apierrors.NewConflict(gr, r.Name, fmt.Errorf("resourceVersion %s, stored %s", r.ResourceVersion, cur.ResourceVersion))
	}
	f.rv++
	next := cur.DeepCopy()
	next.Status = r.DeepCopy().Status
	next.ResourceVersion = fmt.Sprint(1000 + f.rv)
	f.reqs[provreq.Key(r)] = next
	f.writes[r.Name]++
	return nil
}

func (f *fakeProvreqs) Delete(_ context.Context, r *provreq.ProvisioningRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.reqs, provreq.Key(r))
	f.deleted = append(f.deleted, r.Name)
	return nil
}

func (f *fakeProvreqs) add(t testing.TB, objs ...any) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range objs {
		switch v := o.(type) {
		case *provreq.ProvisioningRequest:
			f.reqs[provreq.Key(v)] = v
		case *apiv1.PodTemplate:
			if err := f.templates.Add(v); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unknown object %T", o)
		}
	}
}

func (f *fakeProvreqs) get(t testing.TB, name string) *provreq.ProvisioningRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.reqs["default/"+name]
	if !ok {
		t.Fatalf("request %s is gone", name)
	}
	return r
}

func (f *fakeProvreqs) writesOf(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes[name]
}

// cond returns a request's condition, failing the test when it has none.
func (f *fakeProvreqs) cond(t testing.TB, name, typ string) metav1.Condition {
	t.Helper()
	c := provreq.Find(f.get(t, name), typ)
	if c == nil {
		t.Fatalf("request %s has no %s condition: %+v", name, typ, f.get(t, name).Status.Conditions)
	}
	return *c
}

// wantCond checks a request's condition's status, reason and (a part of) its message.
func (f *fakeProvreqs) wantCond(t testing.TB, name, typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	t.Helper()
	c := f.cond(t, name, typ)
	if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
		t.Fatalf("request %s: %s=%s (%s) %q, want %s (%s) with %q", name, typ, c.Status, c.Reason, c.Message, status, reason, msg)
	}
	return c
}

// podTemplate is a PodTemplate in "default" of pods built with opts.
func podTemplate(name string, opts ...to.PodOption) *apiv1.PodTemplate {
	p := to.Pod(name, opts...)
	return &apiv1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("pt-" + name), ResourceVersion: "1"},
		Template:   apiv1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}, Spec: p.Spec},
	}
}

// request is a ProvisioningRequest in "default" for count pods of template.
func request(name, class, template string, count int32, created time.Time, params ...string) *provreq.ProvisioningRequest {
	r := &provreq.ProvisioningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("pr-" + name), Generation: 2, ResourceVersion: "1",
			CreationTimestamp: metav1.NewTime(created)},
		Spec: provreq.ProvisioningRequestSpec{ProvisioningClassName: class,
			PodSets: []provreq.PodSet{{PodTemplateRef: provreq.Reference{Name: template}, Count: count}}},
	}
	for i := 0; i+1 < len(params); i += 2 {
		if r.Spec.Parameters == nil {
			r.Spec.Parameters = map[string]provreq.Parameter{}
		}
		r.Spec.Parameters[params[i]] = provreq.Parameter(params[i+1])
	}
	return r
}

// consumer is a pod consuming request name (with the annotation key given).
func consumer(podName, key, name string, opts ...to.PodOption) *apiv1.Pod {
	p := to.Pod(podName, append(append(wholeGPU(), to.ControlledBy("Job", "consumers", "job-consumers")), opts...)...)
	p.Annotations = map[string]string{key: name}
	return p
}

func provreqMetric(e *env, class, condition string) float64 {
	return testutil.ToFloat64(e.a.metrics.ProvReq.Requests.WithLabelValues(class, condition))
}

// readyGPU is an env with a GPU group of n ready nodes (max 10) and
// ProvisioningRequests on.
func readyGPU(t *testing.T, n int, opts ...envOption) (*env, *fakeProvreqs, *inmemory.Group) {
	f := newFakeProvreqs()
	e := newEnv(t, append([]envOption{withProvreqs(f)}, opts...)...)
	g := e.provider.AddGroup("gpu", 0, 10, gpuTemplate("gpu"), inmemory.WithTarget(n))
	e.start()
	e.register(g)
	f.add(t, podTemplate("train", wholeGPU()...))
	return e, f, g
}

func TestProvisioningRequestCheckCapacityOnExistingNodes(t *testing.T) {
	e, f, g := readyGPU(t, 2)
	f.add(t, request("fits", provreq.ClassCheckCapacity, "train", 2, e.clock.Now()))
	e.run()
	c := f.wantCond(t, "fits", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "its 2 pods fit on ready nodes")
	if c.ObservedGeneration != 2 {
		t.Fatalf("observedGeneration %d, want the request's generation 2", c.ObservedGeneration)
	}
	f.wantCond(t, "fits", provreq.Accepted, metav1.ConditionTrue, provreq.ReasonAccepted, "accepted")
	if got := g.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: check-capacity never buys nodes", got)
	}
	if got := f.writesOf("fits"); got != 1 {
		t.Fatalf("%d status writes, want 1: Accepted and Provisioned go in one", got)
	}
	if evs := e.events(provreq.ReasonCapacityIsFound); len(evs) != 1 {
		t.Fatalf("events %v, want one CapacityIsFound on the request", evs)
	}
	if got := provreqMetric(e, provreq.ClassCheckCapacity, provreq.Provisioned); got != 1 {
		t.Fatalf("provisioning_requests{Provisioned} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.ProvReq.BookedPods.WithLabelValues(provreq.ClassCheckCapacity)); got != 2 {
		t.Fatalf("booked pods %v, want 2", got)
	}
	if n := testutil.CollectAndCount(e.a.metrics.ProvReq.ProvisionDuration); n != 1 {
		t.Fatalf("%d provision-duration series, want 1", n)
	}
	status := e.status.writes[len(e.status.writes)-1]
	for _, want := range []string{"provisioningRequests:", "request: default/fits", "pods: 2"} {
		if !strings.Contains(status, want) {
			t.Fatalf("status without %q:\n%s", want, status)
		}
	}
	e.run()
	if got := f.writesOf("fits"); got != 1 {
		t.Fatalf("%d status writes after an unchanged loop, want still 1", got)
	}
}

// Capacity booked by one request is taken for another; the second is
// retried after 1 minute doubling to 10, and fits once the first
// booking expired (10 minutes).
func TestProvisioningRequestCheckCapacityCountsBookedRoomAndBacksOff(t *testing.T) {
	e, f, g := readyGPU(t, 2)
	start := e.clock.Now()
	f.add(t, request("first", provreq.ClassCheckCapacity, "train", 2, start))
	f.add(t, request("second", provreq.ClassCheckCapacity, "train", 1, start.Add(time.Second)))
	e.run()
	f.wantCond(t, "first", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	f.wantCond(t, "second", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsNotFound,
		"tried again in 1m0s: 0 of its 1 pods fit on the cluster as it is")
	if evs := e.events(provreq.ReasonCapacityIsNotFound); len(evs) != 1 || !strings.Contains(evs[0], "Warning") {
		t.Fatalf("events %v, want one Warning CapacityIsNotFound", evs)
	}
	retries := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute}
	at := start
	for i, wait := range retries {
		writes := f.writesOf("second")
		e.clock.SetTime(at.Add(wait - time.Second))
		e.run()
		if got := f.writesOf("second"); got != writes {
			t.Fatalf("retry %d: tried %s after the last attempt, before its backoff of %s", i+1, wait-time.Second, wait)
		}
		at = at.Add(wait)
		e.clock.SetTime(at)
		e.run()
		if at.Sub(start) >= 10*time.Minute {
			break
		}
		next := min(2*wait, 10*time.Minute)
		f.wantCond(t, "second", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsNotFound, fmt.Sprintf("tried again in %s", next))
	}
	// 15 minutes in: the first booking expired at 10, the second fits.
	f.wantCond(t, "first", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonReservationTimeExpired, "booked for 10m0s")
	f.wantCond(t, "second", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	if got := g.Increases(); len(got) != 0 {
		t.Fatalf("increases %v", got)
	}
}

func TestProvisioningRequestBookingExpiresAfter10Minutes(t *testing.T) {
	e, f, _ := readyGPU(t, 1)
	f.add(t, request("r", provreq.ClassCheckCapacity, "train", 1, e.clock.Now()))
	e.run()
	f.wantCond(t, "r", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	f.setAfter(t, e, "r", provreq.BookingExpired, 10*time.Minute)
	f.wantCond(t, "r", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonReservationTimeExpired, "")
	if got := testutil.ToFloat64(e.a.metrics.ProvReq.BookedPods.WithLabelValues(provreq.ClassCheckCapacity)); got != 0 {
		t.Fatalf("booked pods %v after the booking expired", got)
	}
}

func TestProvisioningRequestNoRetryFails(t *testing.T) {
	e, f, g := readyGPU(t, 0)
	f.add(t, request("once", provreq.ClassCheckCapacity, "train", 1, e.clock.Now(), provreq.NoRetryParameter, "true"))
	e.run()
	f.wantCond(t, "once", provreq.Failed, metav1.ConditionTrue, provreq.ReasonCapacityIsNotFound, `parameters.noRetry is "true"`)
	if c := provreq.Find(f.get(t, "once"), provreq.Provisioned); c != nil {
		t.Fatalf("a noRetry request that failed has a Provisioned condition: %+v", c)
	}
	f.untriedAfter(t, e, g, "once", 20*time.Minute)
}

// setAfter runs a loop a second before d from now, where the request
// must not have the condition yet, and one at d.
func (f *fakeProvreqs) setAfter(t *testing.T, e *env, name, typ string, d time.Duration) {
	t.Helper()
	e.clock.Step(d - time.Second)
	e.run()
	if c := provreq.Find(f.get(t, name), typ); c != nil {
		t.Fatalf("request %s has %s a second before %s: %+v", name, typ, d, c)
	}
	e.clock.Step(time.Second)
	e.run()
}

// untriedAfter runs a loop d later and checks the request was neither
// written nor scaled up for: it is not tried (again) then.
func (f *fakeProvreqs) untriedAfter(t *testing.T, e *env, g *inmemory.Group, name string, d time.Duration) {
	t.Helper()
	writes, increases := f.writesOf(name), len(g.Increases())
	e.clock.Step(d)
	e.run()
	if f.writesOf(name) != writes || len(g.Increases()) != increases {
		t.Fatalf("request %s tried %s later (writes %d, increases %v)", name, d, f.writesOf(name), g.Increases())
	}
}

// The booking ends when pods consuming the request (either annotation
// key) are scheduled for its whole count; until then only the
// unconsumed part stays booked.
func TestProvisioningRequestBookingConsumed(t *testing.T) {
	e, f, _ := readyGPU(t, 2)
	f.add(t, request("r", provreq.ClassCheckCapacity, "train", 2, e.clock.Now()))
	e.run()
	f.wantCond(t, "r", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	nodes := e.nodeNames()
	sort.Strings(nodes)
	e.add(consumer("c-0", provreq.ConsumeAnnotation, "r", to.OnNode(nodes[0])))
	e.run()
	if c := provreq.Find(f.get(t, "r"), provreq.BookingExpired); c != nil {
		t.Fatalf("booking ended with 1 of 2 pods scheduled: %+v", c)
	}
	if got := testutil.ToFloat64(e.a.metrics.ProvReq.BookedPods.WithLabelValues(provreq.ClassCheckCapacity)); got != 1 {
		t.Fatalf("booked pods %v, want 1: the scheduled pod holds its room itself", got)
	}
	e.add(consumer("c-1", provreq.DeprecatedConsumeAnnotation, "r", to.OnNode(nodes[1])))
	e.run()
	f.wantCond(t, "r", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonBookingConsumed, "all 2 pods")
}

// Pods consuming a request whose booking is live trigger no scale-up of
// their own; a pod naming a request that does not exist, or whose booking
// is over (a pod recreated after its node was replaced), is an ordinary pod.
func TestProvisioningRequestConsumersTriggerNoScaleUp(t *testing.T) {
	e, f, g := readyGPU(t, 2)
	f.add(t, request("r", provreq.ClassCheckCapacity, "train", 2, e.clock.Now()))
	e.add(consumer("c-0", provreq.ConsumeAnnotation, "r", to.Unschedulable()))
	e.add(consumer("c-1", provreq.DeprecatedConsumeAnnotation, "r", to.Unschedulable()))
	e.run()
	f.wantCond(t, "r", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	if got := g.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: pods consuming a request bought nodes", got)
	}
	evs := e.events(EventNotTriggerScaleUp)
	if len(evs) != 2 || !strings.Contains(evs[0], "consumes ProvisioningRequest default/r") {
		t.Fatalf("events %v, want both consumers told why", evs)
	}
	e.add(consumer("orphan", provreq.ConsumeAnnotation, "gone", to.Unschedulable()))
	e.run()
	if got := g.Increases(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("increases %v, want [1] for the pod naming no existing request", got)
	}
}

// Consumers of a request whose booking ended are ordinary pods: a pod
// recreated after its node was replaced buys a node.
func TestProvisioningRequestConsumersOfFinishedRequestScaleUp(t *testing.T) {
	for _, tc := range []struct{ cond, reason string }{
		{provreq.BookingExpired, provreq.ReasonBookingConsumed},
		{provreq.Failed, provreq.ReasonCapacityIsNotFound},
	} {
		t.Run(tc.cond, func(t *testing.T) {
			e, f, g := readyGPU(t, 0)
			now := e.clock.Now()
			r := request("done", provreq.ClassBestEffortAtomic, "train", 1, now.Add(-time.Hour))
			provreq.SetCondition(r, provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "", now.Add(-time.Hour))
			provreq.SetCondition(r, tc.cond, metav1.ConditionTrue, tc.reason, "", now.Add(-30*time.Minute))
			f.add(t, r)
			e.add(consumer("recreated", provreq.ConsumeAnnotation, "done", to.Unschedulable()))
			e.run()
			if got := g.Increases(); len(got) != 1 || got[0] != 1 {
				t.Fatalf("increases %v, want [1]: the request's booking is over, its consumer is an ordinary pod", got)
			}
		})
	}
}

// A best-effort-atomic booking outlasts its 10 minutes while its nodes
// boot, and ends once they are up.
func TestProvisioningRequestBestEffortAtomicBookingWaitsForBootingNodes(t *testing.T) {
	e, f, g := readyGPU(t, 0)
	f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 4, e.clock.Now()))
	e.run()
	f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "4 new nodes")
	e.clock.Step(12 * time.Minute) // the machines still boot
	e.run()
	if c := provreq.Find(f.get(t, "job"), provreq.BookingExpired); c != nil {
		t.Fatalf("booking ended while its nodes were still coming: %+v", c)
	}
	if got := g.Increases(); len(got) != 1 {
		t.Fatalf("increases %v: the request was scaled up for again", got)
	}
	e.register(g)
	e.run()
	f.wantCond(t, "job", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonReservationTimeExpired, "")
}

// Once Provisioned, a request whose PodTemplate can no longer be read
// keeps its booking with the pods made before: it never turns Failed.
func TestProvisioningRequestProvisionedSurvivesTemplateLoss(t *testing.T) {
	e, f, _ := readyGPU(t, 1)
	f.add(t, request("r", provreq.ClassCheckCapacity, "train", 1, e.clock.Now()))
	e.run()
	f.wantCond(t, "r", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	if err := f.templates.Delete(podTemplate("train")); err != nil {
		t.Fatal(err)
	}
	e.clock.Step(2 * time.Minute)
	e.run()
	if c := provreq.Find(f.get(t, "r"), provreq.Failed); c != nil {
		t.Fatalf("a Provisioned request failed when its template went: %+v", c)
	}
	if got := testutil.ToFloat64(e.a.metrics.ProvReq.BookedPods.WithLabelValues(provreq.ClassCheckCapacity)); got != 1 {
		t.Fatalf("booked pods %v, want 1: the pods made before stay booked", got)
	}
}

// Without the pods made before (a restart), a Provisioned request whose
// template is gone ends its booking (BookingExpired), never Failed.
func TestProvisioningRequestProvisionedWithoutTemplateExpires(t *testing.T) {
	e, f, _ := readyGPU(t, 1)
	r := request("r", provreq.ClassCheckCapacity, "gone", 1, e.clock.Now().Add(-time.Minute))
	provreq.SetCondition(r, provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "", e.clock.Now().Add(-time.Minute))
	f.add(t, r)
	e.run()
	if c := provreq.Find(f.get(t, "r"), provreq.Failed); c != nil {
		t.Fatalf("a Provisioned request failed when its template went: %+v", c)
	}
	f.wantCond(t, "r", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonReservationTimeExpired, "PodTemplate default/gone")
}

func TestProvisioningRequestBestEffortAtomic(t *testing.T) {
	e, f, g := readyGPU(t, 0)
	f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 8, e.clock.Now()))
	e.run()
	if got := g.Increases(); len(got) != 1 || got[0] != 8 {
		t.Fatalf("increases %v, want [8]: all the request's nodes in one request", got)
	}
	f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "8 new nodes requested from node group gpu")
	if evs := e.events(EventTriggeredScaleUp); len(evs) != 0 {
		t.Fatalf("pod events %v for the request's pods, which are no pods", evs)
	}
	// The next loop books the coming nodes: a pod arriving now buys its own.
	e.run()
	if got := g.Increases(); len(got) != 1 {
		t.Fatalf("increases %v: the request was scaled up for again", got)
	}
	e.add(pendingPods(1, "late", wholeGPU()...))
	e.run()
	if got := g.Increases(); len(got) != 2 || got[1] != 1 {
		t.Fatalf("increases %v, want [8 1]: the 8 coming nodes are booked", got)
	}
	// Up and consumed: the booking ends.
	e.register(g)
	e.run()
	if got := testutil.ToFloat64(e.a.metrics.ProvReq.BookedPods.WithLabelValues(provreq.ClassBestEffortAtomic)); got != 8 {
		t.Fatalf("booked pods %v, want 8 on the ready nodes", got)
	}
	nodes := e.nodeNames()
	sort.Strings(nodes)
	for i := 0; i < 8; i++ {
		e.add(consumer(fmt.Sprintf("job-%d", i), provreq.ConsumeAnnotation, "job", to.OnNode(nodes[i])))
	}
	e.run()
	f.wantCond(t, "job", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonBookingConsumed, "all 8 pods")
}

// TestProvisioningRequestWithinResourceQuota (#40): a tenant whose
// namespace may request 32 GPUs asks for 8 whole-GPU nodes (64 GPUs): the
// request is not provisioned and names the quota (a Kueue user reads
// Provisioned=False, ExceedsResourceQuota), nothing is bought; with the
// quota raised it is. Before, the request bought 8 nodes its pods could
// never run on (their creation refused by the quota).
func TestProvisioningRequestWithinResourceQuota(t *testing.T) {
	e, f, g := readyGPU(t, 0)
	f.mu.Lock()
	f.quotas = map[string][]*apiv1.ResourceQuota{"default": {{
		ObjectMeta: metav1.ObjectMeta{Name: "team-gpus", Namespace: "default"},
		Spec:       apiv1.ResourceQuotaSpec{Hard: apiv1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse("32")}},
	}}}
	f.mu.Unlock()
	f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 8, e.clock.Now()))
	e.run()
	if got := g.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: the request's pods exceed the namespace's quota", got)
	}
	f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonExceedsQuota,
		"its 8 pods exceed what the namespace's ResourceQuotas leave (4 of 8 pods fit: ResourceQuota team-gpus leaves 32 of requests.nvidia.com/gpu, 8 a pod)")
	f.mu.Lock()
	f.quotas["default"][0].Spec.Hard["requests.nvidia.com/gpu"] = resource.MustParse("64")
	f.mu.Unlock()
	e.clock.Step(2 * time.Minute) // past its backoff
	e.run()
	if got := g.Increases(); len(got) != 1 || got[0] != 8 {
		t.Fatalf("increases %v once the quota leaves room, want [8]", got)
	}
}

func TestProvisioningRequestBestEffortAtomicAboveMax(t *testing.T) {
	e, f, g := readyGPU(t, 0)
	f.add(t, request("big", provreq.ClassBestEffortAtomic, "train", 16, e.clock.Now()))
	e.run()
	if got := g.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: 16 nodes do not fit a group of max 10, none may be bought", got)
	}
	f.wantCond(t, "big", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsNotFound,
		"tried again in 1m0s: its 16 pods need new nodes and no node group can take them all: node group gpu can add 10 nodes, the gang needs 16")
	if evs := e.events(EventNotTriggerScaleUp); len(evs) != 0 {
		t.Fatalf("pod events %v for the request's pods, which are no pods", evs)
	}
	f.untriedAfter(t, e, g, "big", 30*time.Second) // within its backoff
}

// A best-effort-atomic request's nodes go through the node-addition queue
// as a gang: larger than the in-flight cap, they wait until nothing else
// is in flight, and the request says so; then they go together.
func TestProvisioningRequestBestEffortAtomicWaitsInTheQueue(t *testing.T) {
	f := newFakeProvreqs()
	e := newEnv(t, withProvreqs(f), withOptions(func(o *Options) { o.MaxNodesInFlight = 4 }))
	g := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(2))
	e.start()
	f.add(t, podTemplate("train", wholeGPU()...))
	f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 8, e.clock.Now()))
	e.run()
	if got := g.Increases(); len(got) != 0 {
		t.Fatalf("increases %v: 6 new nodes over a cap of 4 with 2 in flight must wait", got)
	}
	f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsQueued, "6 new nodes its pods need wait in the node-addition queue")
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "gang: default/provisioningrequest:job") {
		t.Fatalf("status does not list the held request:\n%s", last)
	}
	e.register(g) // the 2 in flight are up: nothing else in flight
	e.run()
	if got := g.Increases(); len(got) != 1 || got[0] != 6 {
		t.Fatalf("increases %v, want [6] (2 pods fit on the nodes that came up)", got)
	}
	f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "6 new nodes")
}

// Scale-down never removes a node whose room is booked: a whole-node
// booking makes its node busy, and a small booking on an otherwise empty
// node keeps the node too, though its booked pod could be moved to the
// busy node (a booked pod is no pod to move). Once the booking is over
// the node goes like any other.
func TestScaleDownKeepsBookedNodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  []to.PodOption
	}{
		{"whole node", wholeGPU()},
		{"one CPU of the node", []to.PodOption{to.Requests("1", "1Gi")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acts := &fakeActions{}
			f := newFakeProvreqs()
			e := newEnv(t, withProvreqs(f), withScaleDown(acts), withOptions(func(o *Options) {
				o.ScaleDownUnneededTime = time.Minute
				o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
			}))
			g := e.provider.AddGroup("gpu", 0, 10, gpuTemplate("gpu"), inmemory.WithTarget(4))
			e.start()
			e.register(g)
			nodes := e.nodeNames()
			sort.Strings(nodes)
			// Booked pods go on the first node that fits (by name); the last
			// one runs a pod that keeps it, with room to spare.
			booked, busy := nodes[0], nodes[3]
			e.add(to.Pod("db", to.Requests("60", "100Gi"), to.OnNode(busy), to.ControlledBy("ReplicaSet", "db", "rs-db")))
			f.add(t, podTemplate("small", tc.pod...))
			f.add(t, request("keep", provreq.ClassCheckCapacity, "small", 1, e.clock.Now()))
			e.run()
			f.wantCond(t, "keep", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
			for i := 0; i < 4; i++ {
				e.clock.Step(time.Minute)
				e.run()
				e.a.WaitForDrains()
			}
			deleted := func() []string {
				var out []string
				for _, id := range g.Deleted() {
					out = append(out, strings.NewReplacer("://", "-", "/", "-").Replace(id))
				}
				sort.Strings(out)
				return out
			}
			if got := deleted(); len(got) != 2 || got[0] != nodes[1] || got[1] != nodes[2] {
				t.Fatalf("deleted %v, want the 2 empty nodes %v: not %s, whose room is booked", got, nodes[1:3], booked)
			}
			if len(acts.evictedPods()) != 0 {
				t.Fatalf("evicted %v: a booked pod is no pod", acts.evictedPods())
			}
			e.clock.Step(7 * time.Minute) // the booking expires
			for i := 0; i < 3; i++ {
				e.run()
				e.a.WaitForDrains()
				e.clock.Step(time.Minute)
			}
			f.wantCond(t, "keep", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonReservationTimeExpired, "")
			if got := deleted(); len(got) != 3 || got[0] != booked {
				t.Fatalf("deleted %v, want %s too once its booking was over", got, booked)
			}
		})
	}
}

// A booking whose pods fit on no ready or coming node (its machine
// failed or was removed) is never revoked: Kueue would deactivate the
// workload. It ends (BookingExpired, CapacityBookingLost) once its pods
// have fit nowhere for 30 s, not at once (a node briefly unusable), and
// not only once its 10 minutes are over (#40: its consumers waited for
// capacity that was not there).
func TestProvisioningRequestCapacityNeverRevoked(t *testing.T) {
	e, f, g := readyGPU(t, 1)
	f.add(t, request("r", provreq.ClassCheckCapacity, "train", 1, e.clock.Now()))
	e.run()
	f.wantCond(t, "r", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	if err := g.DeleteNodes(e.ctx, g.ProviderIDs()); err != nil {
		t.Fatal(err)
	}
	for _, n := range e.nodeNames() {
		if err := e.nodes.Delete(&apiv1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		e.clock.Step(10 * time.Second)
		e.run()
		if c := provreq.Find(f.get(t, "r"), provreq.BookingExpired); c != nil {
			t.Fatalf("booking ended within 30 s of its node missing: %+v", c)
		}
	}
	e.clock.Step(10 * time.Second)
	e.run()
	f.wantCond(t, "r", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonBookingLost, "1 of its pods fit on no ready node")
	if c := provreq.Find(f.get(t, "r"), provreq.CapacityRevoked); c != nil {
		t.Fatalf("capacity revoked: %+v", c)
	}
}

func TestProvisioningRequestLifecycle(t *testing.T) {
	e, f, _ := readyGPU(t, 0)
	now := e.clock.Now()
	week := 7 * 24 * time.Hour
	old := request("old", provreq.ClassBestEffortAtomic, "train", 1, now.Add(-week-time.Minute))
	finished := request("finished", provreq.ClassCheckCapacity, "train", 1, now.Add(-2*week))
	provreq.SetCondition(finished, provreq.Failed, metav1.ConditionTrue, provreq.ReasonCapacityIsNotFound, "no", now.Add(-week-time.Minute))
	recent := request("recent", provreq.ClassCheckCapacity, "train", 1, now.Add(-2*week))
	provreq.SetCondition(recent, provreq.Failed, metav1.ConditionTrue, provreq.ReasonCapacityIsNotFound, "no", now.Add(-week+time.Minute))
	noTemplate := request("no-template", provreq.ClassCheckCapacity, "missing", 1, now)
	other := request("other", "queued-provisioning.gke.io", "train", 1, now)
	instance := request("instance", provreq.ClassCheckCapacity, "train", 1, now, provreq.ProcessorInstanceParameter, "ca-2")
	f.add(t, old, finished, recent, noTemplate, other, instance)
	e.run()
	f.wantCond(t, "old", provreq.Failed, metav1.ConditionTrue, provreq.ReasonExpired, "not provisioned within 168h0m0s")
	if len(f.deleted) != 1 || f.deleted[0] != "finished" {
		t.Fatalf("deleted %v, want only the request finished more than 7 days ago", f.deleted)
	}
	if f.writesOf("no-template") != 1 || provreq.Find(f.get(t, "no-template"), provreq.Failed) != nil {
		t.Fatalf("a request whose template is not in the cache yet failed at once: %+v", f.get(t, "no-template").Status)
	}
	e.clock.Step(time.Minute)
	e.run()
	f.wantCond(t, "no-template", provreq.Failed, metav1.ConditionTrue, provreq.ReasonFailedToCreatePods, "PodTemplate default/missing")
	for _, name := range []string{"other", "instance"} {
		if f.writesOf(name) != 0 {
			t.Fatalf("request %s is not this autoscaler's and was written: %+v", name, f.get(t, name).Status)
		}
	}
}

// Room a request booked on a ready node is taken for pending pods: a pod
// that would fit there buys a node of its own.
func TestProvisioningRequestBookedRoomIsTakenForPendingPods(t *testing.T) {
	e, f, g := readyGPU(t, 1)
	f.add(t, request("r", provreq.ClassCheckCapacity, "train", 1, e.clock.Now()))
	e.run()
	f.wantCond(t, "r", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	e.add(pendingPods(1, "web", wholeGPU()...))
	e.run()
	if got := g.Increases(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("increases %v, want [1]: the ready node's room is booked", got)
	}
}

// Room is booked only on nodes that may take pods: not cordoned, not
// tainted for deletion, not a machine already deleted whose Node lingers.
func TestProvisioningRequestBooksOnlyNodesThatTakePods(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*env, string)
	}{
		{"cordoned", func(e *env, name string) { e.updateNode(name, func(n *apiv1.Node) { n.Spec.Unschedulable = true }) }},
		{"ToBeDeleted", func(e *env, name string) {
			e.updateNode(name, func(n *apiv1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, apiv1.Taint{Key: scaledown.ToBeDeletedTaint, Effect: apiv1.TaintEffectNoSchedule})
			})
		}},
		{"machine deleted", func(e *env, name string) { e.a.preflight.deleted[name] = e.clock.Now() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, _ := readyGPU(t, 2)
			nodes := e.nodeNames()
			sort.Strings(nodes)
			tc.edit(e, nodes[0])
			f.add(t, request("r", provreq.ClassCheckCapacity, "train", 2, e.clock.Now()))
			e.run()
			f.wantCond(t, "r", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsNotFound, "1 of its 2 pods fit")
		})
	}
}

// A failed scale-up is every request's whose pods it carried, not only
// the first's: none is Provisioned.
func TestProvisioningRequestFailedScaleUpIsEveryRequests(t *testing.T) {
	e, f, g := readyGPU(t, 0)
	g.SetIncreaseError(fmt.Errorf("quota exceeded"))
	f.add(t, request("a", provreq.ClassBestEffortAtomic, "train", 2, e.clock.Now()))
	f.add(t, request("b", provreq.ClassBestEffortAtomic, "train", 2, e.clock.Now().Add(time.Second)))
	e.run()
	for _, name := range []string{"a", "b"} {
		f.wantCond(t, name, provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsNotFound, "quota exceeded")
	}
}

// A best-effort-atomic request whose pods fit on ready nodes is
// Provisioned (CapacityIsFound) on scale-up's word that they were placed.
func TestProvisioningRequestBestEffortAtomicFitsOnReadyNodes(t *testing.T) {
	e, f, g := readyGPU(t, 2)
	f.add(t, request("fits", provreq.ClassBestEffortAtomic, "train", 2, e.clock.Now()))
	e.run()
	f.wantCond(t, "fits", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "fit on ready and coming nodes")
	if got := g.Increases(); len(got) != 0 {
		t.Fatalf("increases %v", got)
	}
}

// A balloon's room is free to a request: the scheduler preempts balloons
// for the request's pods, so check-capacity finds the warm node.
func TestProvisioningRequestBalloonRoomIsFree(t *testing.T) {
	e, f, _ := readyGPU(t, 1)
	nodes := e.nodeNames()
	e.add(balloonPod("balloon-0", "gpu", to.OnNode(nodes[0])))
	f.add(t, request("warm", provreq.ClassCheckCapacity, "train", 1, e.clock.Now()))
	e.run()
	f.wantCond(t, "warm", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "its 1 pods fit on ready nodes")
}

// A burst of requests is written over several loops (at most
// maxProvreqStatusWrites a loop), and a leader whose lease lapses in the
// middle of the batch writes no more.
func TestProvisioningRequestStatusWritesBoundedAndFenced(t *testing.T) {
	const n = maxProvreqStatusWrites + 20
	total := func(f *fakeProvreqs) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		s := 0
		for _, w := range f.writes {
			s += w
		}
		return s
	}
	add := func(e *env, f *fakeProvreqs) {
		for i := 0; i < n; i++ {
			f.add(t, request(fmt.Sprintf("r%03d", i), provreq.ClassCheckCapacity, "train", 1, e.clock.Now()))
		}
	}
	t.Run("bounded", func(t *testing.T) {
		e, f, _ := readyGPU(t, 0)
		add(e, f)
		e.run()
		if got := total(f); got != maxProvreqStatusWrites {
			t.Fatalf("%d status writes in the first loop, want %d", got, maxProvreqStatusWrites)
		}
		e.run()
		if got := total(f); got != n {
			t.Fatalf("%d status writes after the second loop, want all %d", got, n)
		}
	})
	t.Run("fenced mid-batch", func(t *testing.T) {
		var f *fakeProvreqs
		e, f, _ := readyGPU(t, 0, func(e *env) {
			e.fence = func() error {
				if f != nil && total(f) >= 3 {
					return errors.New("lease not renewed within the renew deadline")
				}
				return nil
			}
		})
		add(e, f)
		_ = e.a.RunOnce(e.ctx)
		if got := total(f); got != 3 {
			t.Fatalf("%d status writes, want 3: none once the lease lapsed", got)
		}
	})
}

// TestResourceQuotaSharedByRequestsAndBuffers (#40): a namespace may
// request 16 GPUs; its best-effort-atomic request of 2 whole-GPU nodes
// takes them; its CapacityBuffer then gets no chunk (before, each kind of
// virtual pod had the whole quota to itself: 16 GPUs booked and 16 more
// held). And a consumer of the booking that exists but waits to be
// scheduled (already in the quota's status.used) is not counted twice.
func TestResourceQuotaSharedByRequestsAndBuffers(t *testing.T) {
	fb := newFakeBuffers()
	e, f, g := readyGPU(t, 0, withBuffers(fb))
	fb.templates = f
	gpuQuota := func(hard, used string) []*apiv1.ResourceQuota {
		return []*apiv1.ResourceQuota{{
			ObjectMeta: metav1.ObjectMeta{Name: "team-gpus", Namespace: "default"},
			Spec:       apiv1.ResourceQuotaSpec{Hard: apiv1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse(hard)}},
			Status:     apiv1.ResourceQuotaStatus{Used: apiv1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse(used)}},
		}}
	}
	f.mu.Lock()
	f.quotas = map[string][]*apiv1.ResourceQuota{"default": gpuQuota("16", "0")}
	f.mu.Unlock()
	f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 2, e.clock.Now()))
	e.run()
	if got := g.Increases(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("increases %v, want [2] for the request", got)
	}
	fb.add(buffer("warm", "train", 3, e.clock.Now()))
	e.run()
	fb.wantCond(t, "warm", capacitybuffer.ConditionLimitedByQuotas, metav1.ConditionTrue, capacitybuffer.ReasonQuotaLimited, "0 of its 3 chunks")
	if got := g.Increases(); len(got) != 1 {
		t.Fatalf("increases %v: the buffer bought past the quota its namespace's request booked", got)
	}
	// The quota raised to 32; one consumer exists, waiting for a node
	// (the quota's used counts it): the booking counts its other pod
	// only, leaving 16 GPUs: 2 chunks (counted twice, 1).
	f.mu.Lock()
	f.quotas["default"] = gpuQuota("32", "8")
	f.mu.Unlock()
	e.add(consumer("job-0", provreq.ConsumeAnnotation, "job", to.Unschedulable()))
	e.run()
	fb.wantCond(t, "warm", capacitybuffer.ConditionLimitedByQuotas, metav1.ConditionTrue, capacitybuffer.ReasonQuotaLimited, "2 of its 3 chunks")
}

// bind puts pods on nodes, as the scheduler does (it does not see
// bookings): each pod i on nodes[i].
func (e *env) bind(pods []*apiv1.Pod, nodes []string) {
	e.t.Helper()
	for i, p := range pods {
		b := p.DeepCopy()
		b.Spec.NodeName = nodes[i]
		b.Status.Conditions = nil
		b.Status.Phase = apiv1.PodRunning
		if err := e.pods.Update(b); err != nil {
			e.t.Fatal(err)
		}
	}
}

// TestProvisioningRequestBookingsNeverBuyTwice (#40): the scheduler does
// not see bookings, so ordinary pods take booked nodes. A booking then
// holds no room on nodes coming for other pods: a check-capacity
// booking never (it buys nothing), a best-effort-atomic one only on the
// nodes it bought, while they come. Before, the booking's pods moved to
// the nodes coming for the pending pods, which bought them again
// (increases [2 2] for 2 pods; [2 2 2]).
func TestProvisioningRequestBookingsNeverBuyTwice(t *testing.T) {
	for _, tc := range []struct {
		name, class string
		ready       int
		want        []int // increases once the scheduler gave the booked nodes away and 2 more pods wait
	}{
		// 2 pods pending while the room is booked buy 2 (the booked room is
		// taken for pending pods, as in cluster-autoscaler); the scheduler
		// puts them on the booked nodes; 2 more pods wait for the 2 coming.
		{name: "check-capacity", class: provreq.ClassCheckCapacity, ready: 2, want: []int{2}},
		// The request bought 2 nodes; once up, the scheduler gives them to
		// 2 ordinary pods; 2 more pods buy 2 and wait for them.
		{name: "best-effort-atomic", class: provreq.ClassBestEffortAtomic, ready: 0, want: []int{2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, g := readyGPU(t, tc.ready)
			f.add(t, request("r", tc.class, "train", 2, e.clock.Now()))
			e.run()
			if c := f.cond(t, "r", provreq.Provisioned); c.Status != metav1.ConditionTrue {
				t.Fatalf("Provisioned %+v", c)
			}
			var taken []*apiv1.Pod
			if tc.class == provreq.ClassCheckCapacity {
				taken = pendingPods(2, "web", wholeGPU()...)
				e.add(taken)
				e.run()
			} else {
				e.register(g)
				e.run()
				taken = pendingPods(2, "web", wholeGPU()...)
				e.add(taken)
			}
			nodes := e.nodeNames()
			sort.Strings(nodes)
			e.bind(taken, nodes)
			if tc.class == provreq.ClassBestEffortAtomic {
				e.add(pendingPods(2, "more", wholeGPU()...))
				e.run()
			} else {
				e.add(pendingPods(2, "more", wholeGPU()...))
			}
			for range 3 {
				e.clock.Step(10 * time.Second)
				e.run()
			}
			if got := g.Increases(); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("increases %v, want %v: the booking took nodes coming for other pods, which bought them again", got, tc.want)
			}
			e.clock.Step(10 * time.Second)
			e.run()
			f.wantCond(t, "r", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonBookingLost, "fit on no ready node")
		})
	}
}

// TestProvisioningRequestLostBookingFreesItsConsumers (#40): one of a
// booking's 2 nodes is removed a minute after it was Provisioned; its
// first consumer runs on the other, its second waits. Within the 30 s
// grace the booking ends and the waiting consumer buys a node, as any
// pod. Before, it bought nothing until the booking was 10 minutes old.
func TestProvisioningRequestLostBookingFreesItsConsumers(t *testing.T) {
	e, f, g := readyGPU(t, 2)
	f.add(t, request("r", provreq.ClassCheckCapacity, "train", 2, e.clock.Now()))
	e.run()
	f.wantCond(t, "r", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	e.clock.Step(time.Minute)
	nodes := e.nodeNames()
	sort.Strings(nodes)
	ids := g.ProviderIDs()
	sort.Strings(ids)
	if err := g.DeleteNodes(e.ctx, ids[1:]); err != nil {
		t.Fatal(err)
	}
	if err := e.nodes.Delete(&apiv1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[1]}}); err != nil {
		t.Fatal(err)
	}
	e.add(consumer("c-0", provreq.ConsumeAnnotation, "r", to.OnNode(nodes[0])), consumer("c-1", provreq.ConsumeAnnotation, "r", to.Unschedulable()))
	e.run()
	if got := g.Increases(); len(got) != 0 {
		t.Fatalf("increases %v at once: a node missing for a loop is not yet a loss", got)
	}
	for i := 0; i < 4 && len(g.Increases()) == 0; i++ {
		e.clock.Step(10 * time.Second)
		e.run()
	}
	if got := g.Increases(); fmt.Sprint(got) != "[1]" {
		t.Fatalf("increases %v within 40 s of the loss, want [1]: the waiting consumer buys its node", got)
	}
	f.wantCond(t, "r", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonBookingLost, "1 of 2 pods consumed it")
}

// TestProvisioningRequestsOverTheBoundWait (#40): under the default
// bounds (100 live requests a namespace), a namespace's 101st request is
// not planned and says so (Provisioned=False, RequestLimitReached, naming
// the flags); a newer request of another namespace is planned beside the
// 100, and a booked request never counts as left out. Before, every
// request was planned every loop, whatever their number.
func TestProvisioningRequestsOverTheBoundWait(t *testing.T) {
	e, f, _ := readyGPU(t, 1)
	if e.a.opts.MaxProvisioningRequestsPerNamespace != 100 || e.a.opts.MaxProvisioningRequests != 1000 {
		t.Fatalf("default bounds %d per namespace, %d in all; want 100 and 1000", e.a.opts.MaxProvisioningRequestsPerNamespace, e.a.opts.MaxProvisioningRequests)
	}
	start := e.clock.Now()
	for i := range 101 {
		f.add(t, request(fmt.Sprintf("r%03d", i), provreq.ClassCheckCapacity, "train", 1, start.Add(time.Duration(i)*time.Second)))
	}
	theirs := request("theirs", provreq.ClassCheckCapacity, "train", 1, start.Add(time.Hour))
	theirs.Namespace = "team-b"
	pt := podTemplate("train", wholeGPU()...)
	pt.Namespace = "team-b"
	f.add(t, theirs, pt)
	e.clock.Step(2 * time.Hour)
	for range 3 { // conditions are written 100 a loop
		e.run()
	}
	f.wantCond(t, "r000", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
	if c := provreq.Find(f.get(t, "r099"), provreq.Provisioned); c != nil && c.Reason == provreq.ReasonLimitReached {
		t.Fatalf("r099, the namespace's 100th request, left out: %+v", c)
	}
	f.wantCond(t, "r100", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonLimitReached,
		"--max-provisioning-requests-per-namespace=100, --max-provisioning-requests=1000")
	// Accepted, so Kueue shows the message on the workload (it shows a
	// Provisioned message only of an Accepted request).
	f.wantCond(t, "r100", provreq.Accepted, metav1.ConditionTrue, provreq.ReasonAccepted, "")
	f.mu.Lock()
	c := provreq.Find(f.reqs["team-b/theirs"], provreq.Provisioned)
	f.mu.Unlock()
	if c == nil || c.Reason != provreq.ReasonCapacityIsNotFound {
		t.Fatalf("the other namespace's request: Provisioned %+v, want tried (CapacityIsNotFound: the node is booked)", c)
	}
	if got := testutil.ToFloat64(e.a.metrics.ProvReq.Skipped); got != 1 {
		t.Fatalf("skipped requests %v, want 1", got)
	}
	writes := f.writesOf("r100")
	e.run()
	if f.writesOf("r100") != writes {
		t.Fatalf("the left-out request's status written again while nothing changed")
	}
}

// noLoss runs loops over 40 s (past the 30 s grace) and fails if the
// request's booking ended.
func (f *fakeProvreqs) noLoss(t *testing.T, e *env, name string) {
	t.Helper()
	for range 5 {
		e.clock.Step(10 * time.Second)
		e.run()
		if c := provreq.Find(f.get(t, name), provreq.BookingExpired); c != nil {
			t.Fatalf("booking of %s ended: %+v", name, c)
		}
	}
}

// TestProvisioningRequestBookingHoldsWhatItWasPromised (#40, a second
// reader's findings): a best-effort-atomic booking holds the coming nodes
// it bought and those its pods were planned on, across a group whose size
// is unknown for a while, a failover, and a split over two groups; a
// booking never takes nodes coming for other pods because its own came up
// earlier (its claim follows its nodes every loop).
func TestProvisioningRequestBookingHoldsWhatItWasPromised(t *testing.T) {
	t.Run("planned on coming nodes", func(t *testing.T) {
		e, f, g := readyGPU(t, 0)
		if err := g.IncreaseSize(e.ctx, 2); err != nil { // 2 nodes coming, not for it
			t.Fatal(err)
		}
		e.clock.Step(time.Minute)
		f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 8, e.clock.Now()))
		e.run()
		f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "6 new nodes")
		if got := f.get(t, "job").Status.ProvisioningClassDetails[provreq.ClaimDetail]; got != "gpu=8" {
			t.Fatalf("claim detail %q, want gpu=8: the 6 bought and the 2 coming its pods were planned on", got)
		}
		f.noLoss(t, e, "job")
		if got := g.Increases(); fmt.Sprint(got) != "[2 6]" {
			t.Fatalf("increases %v, want [2 6]", got)
		}
	})
	t.Run("found on coming nodes", func(t *testing.T) {
		e, f, g := readyGPU(t, 0)
		if err := g.IncreaseSize(e.ctx, 2); err != nil {
			t.Fatal(err)
		}
		e.clock.Step(time.Minute)
		f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 2, e.clock.Now()))
		e.run()
		f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "")
		f.noLoss(t, e, "job")
		oneMoreBuysOne(t, e, g, "[2 1]")
	})
	t.Run("group size unknown", func(t *testing.T) {
		f := newFakeProvreqs()
		e := newEnv(t, withProvreqs(f))
		g := e.provider.AddGroup("gpu", 0, 10, gpuTemplate("gpu"))
		other := e.provider.AddGroup("gpu2", 0, 10, gpuTemplate("gpu2"))
		e.start()
		f.add(t, podTemplate("train", wholeGPU()...))
		f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 4, e.clock.Now()))
		e.run()
		f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "4 new nodes")
		bought, spare := g, other
		if len(g.Increases()) == 0 {
			bought, spare = other, g
		}
		e.add(consumers(4, "job", to.Unschedulable())...)
		bought.SetSizeUnknown(true)
		f.noLoss(t, e, "job")
		if got := spare.Increases(); len(got) != 0 {
			t.Fatalf("increases of the other group %v: the consumers bought their nodes twice", got)
		}
	})
	t.Run("failover", func(t *testing.T) {
		e, f, g := readyGPU(t, 0)
		f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 4, e.clock.Now()))
		e.run()
		f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "4 new nodes")
		e.failover() // the new leader reads the booking's nodes from its status
		f.noLoss(t, e, "job")
		oneMoreBuysOne(t, e, g, "[4 1]")
	})
	t.Run("split over two groups", func(t *testing.T) {
		f := newFakeProvreqs()
		e := newEnv(t, withProvreqs(f), withOptions(func(o *Options) { o.GangSplit = true }))
		a := e.provider.AddGroup("gpu-a", 0, 3, gpuTemplate("gpu-a"))
		b := e.provider.AddGroup("gpu-b", 0, 4, gpuTemplate("gpu-b"))
		e.start()
		f.add(t, podTemplate("train", wholeGPU()...))
		e.add(pendingPods(1, "web", wholeGPU()...))
		e.run()
		e.clock.Step(time.Minute)
		f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 5, e.clock.Now()))
		e.run()
		f.wantCond(t, "job", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "")
		if got := string(f.get(t, "job").Status.ProvisioningClassDetails[provreq.ClaimDetail]); !strings.Contains(got, "gpu-a=") || !strings.Contains(got, "gpu-b=") {
			t.Fatalf("claim detail %q, want both groups", got)
		}
		f.noLoss(t, e, "job")
		if got := targetOf(t, a) + targetOf(t, b); got != 6 {
			t.Fatalf("targets a %d + b %d, want 6: the job's 5 and the pod's 1, nothing bought again", targetOf(t, a), targetOf(t, b))
		}
	})
	t.Run("claim follows its nodes", func(t *testing.T) {
		e, f, g := readyGPU(t, 0)
		f.add(t, request("job", provreq.ClassBestEffortAtomic, "train", 2, e.clock.Now()))
		e.run()
		e.register(g)
		e.run() // the booking on its 2 ready nodes
		others := pendingPods(2, "others", wholeGPU()...)
		e.add(others)
		e.run() // the others buy 2
		web := pendingPods(2, "web", wholeGPU()...)
		e.add(web)
		nodes := e.nodeNames()
		sort.Strings(nodes)
		e.bind(web, nodes) // the scheduler gives the booked nodes away
		for range 4 {
			e.clock.Step(10 * time.Second)
			e.run()
		}
		if got := g.Increases(); fmt.Sprint(got) != "[2 2]" {
			t.Fatalf("increases %v, want [2 2]: the booking took the nodes coming for the others, which bought them again", got)
		}
	})
}

// oneMoreBuysOne adds a pending whole-GPU pod: the coming nodes being
// the booking's, it buys one node (g's increases then read want).
func oneMoreBuysOne(t *testing.T, e *env, g *inmemory.Group, want string) {
	t.Helper()
	e.add(pendingPods(1, "web", wholeGPU()...))
	e.clock.Step(10 * time.Second)
	e.run()
	if got := g.Increases(); fmt.Sprint(got) != want {
		t.Fatalf("increases %v, want %s: the pod took the booking's coming nodes", got, want)
	}
}

// consumers are n unschedulable whole-GPU pods consuming request name.
func consumers(n int, name string, opts ...to.PodOption) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = consumer(fmt.Sprintf("%s-c-%d", name, i), provreq.ConsumeAnnotation, name, opts...)
	}
	return out
}
