package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// provreqSuite is what the ProvisioningRequest and Kueue scenarios share.
//
// An autoscaler started with --enable-provisioning-requests handles every
// request in the cluster (its informer watches all namespaces), as it
// would in its own cluster, and scenarios here share one API server: two
// such scenarios at once would each write the other's requests'
// conditions (each finds none of its own groups fits the other's pods) and
// count them in its metrics. So these scenarios are the sequential
// subtests of one parallel test, TestProvisioningRequestsAndTestKueueAndTestTenant,
// which takes one of the suite's parallel slots; mu only checks that no
// two of them ever overlap. They run in parallel with every other
// scenario.
type provreqSuite struct {
	mu sync.Mutex

	crdOnce sync.Once
	crdErr  error

	// kueueMu guards Kueue's setup, done once for the suite (kueueDone)
	// unless cut short by its context.
	kueueMu   sync.Mutex
	kueueDone bool
	kueueBin  string
	kueueErr  error
}

// The Kueue objects' API and the manager's namespace.
const (
	kueueGroup     = "kueue.x-k8s.io"
	kueueVersion   = "v1beta2"
	kueueNamespace = "kueue-system"
	kueueSecret    = "kueue-webhook-server-cert"
	kueueService   = "kueue-webhook-service"
)

func provreqGVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: provreq.Group, Version: provreq.Version, Resource: provreq.Resource}
}

func kueueGVR(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: kueueGroup, Version: kueueVersion, Resource: resource}
}

// provreqScenario starts a scenario that runs autoscalers with
// --enable-provisioning-requests: alone among such scenarios (a subtest of
// TestProvisioningRequestsAndTestKueueAndTestTenant), with the ProvisioningRequest CRD
// installed (once for the suite, from the module that publishes it). Its
// requests are deleted at its end, before the next such scenario starts.
func provreqScenario(t *testing.T) *scenario {
	t.Helper()
	s := theSuite
	if s == nil {
		t.Fatal("suite not started")
	}
	if !s.provreq.mu.TryLock() {
		t.Fatal("another ProvisioningRequest scenario is running: such scenarios must be sequential subtests of TestProvisioningRequestsAndTestKueueAndTestTenant")
	}
	t.Cleanup(s.provreq.mu.Unlock) // last: after the scenario's own cleanup
	if err := s.provreqCRD(); err != nil {
		t.Fatalf("installing the ProvisioningRequest CRD: %v", err)
	}
	sc := newScenario(t)
	t.Cleanup(sc.deleteRequests) // before the scenario's cleanup stops its autoscalers
	return sc
}

// provreqCRD installs the ProvisioningRequest CRD once for the suite, from
// the module that publishes it.
func (s *suite) provreqCRD() error {
	s.provreq.crdOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		dir, err := harness.ModuleDir(ctx, harness.ProvisioningRequestAPIsModule, harness.ProvisioningRequestAPIsVersion)
		if err != nil {
			s.provreq.crdErr = err
			return
		}
		s.provreq.crdErr = installCRDs(ctx, s.cp.RESTConfig, []string{filepath.Join(dir, "config", "crd", "autoscaling.x-k8s.io_provisioningrequests.yaml")}, nil)
	})
	return s.provreq.crdErr
}

// installCRDs creates the CRDs of YAML files (one or more documents each;
// one that exists is left as it is), changed by patch when not nil, and
// waits until the API server serves them (Established).
func installCRDs(ctx context.Context, cfg *rest.Config, files []string, patch func(*unstructured.Unstructured)) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj map[string]any
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return fmt.Errorf("reading %s: %w", f, err)
			}
			u := &unstructured.Unstructured{Object: obj}
			if len(obj) == 0 || u.GetKind() != "CustomResourceDefinition" {
				continue
			}
			if patch != nil {
				patch(u)
			}
			if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating CRD %s (%s): %w", u.GetName(), f, err)
			}
			names = append(names, u.GetName())
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("no CustomResourceDefinition in %v", files)
	}
	for _, n := range names {
		for {
			u, err := crds.Get(ctx, n, metav1.GetOptions{})
			if err == nil && workloadCondition(u, "Established") {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %w (last error %v)", n, ctx.Err(), err)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

// provreqAutoscaler adds an H100 scale set of capacity nodes (max 10) and
// starts an autoscaler of it with --enable-provisioning-requests, which
// it waits to see served.
func (sc *scenario) provreqAutoscaler(capacity int) (string, *harness.Process) {
	sc.t.Helper()
	gpu := sc.scaleSet("gpu", h100, capacity, nil)
	as := sc.autoscaler("autoscaler", "--nodes=0:10:"+gpu, "--enable-provisioning-requests")
	sc.eventually("ProvisioningRequests handled", 30*time.Second, func() (bool, string) {
		return sc.logContains(as, "ProvisioningRequests: handling"), "not yet"
	})
	return gpu, as
}

// deleteRequests deletes the scenario's requests and waits until they are
// gone: the next ProvisioningRequest scenario's autoscaler must not find
// them.
func (sc *scenario) deleteRequests() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dc := sc.dynamic()
	ri := dc.Resource(provreqGVR()).Namespace(sc.ns)
	if err := ri.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		sc.t.Errorf("deleting the scenario's ProvisioningRequests: %v", err)
		return
	}
	for ctx.Err() == nil {
		l, err := ri.List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) == 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	sc.t.Errorf("the scenario's ProvisioningRequests were not deleted within a minute")
}

func (sc *scenario) dynamic() dynamic.Interface {
	dc, err := dynamic.NewForConfig(sc.s.cp.RESTConfig)
	if err != nil {
		sc.t.Fatal(err)
	}
	return dc
}

// gpuPodSpec is a pod of one whole H100 node (8 GPUs) of scale set set.
func gpuPodSpec(set string) apiv1.PodSpec {
	q := resource.MustParse("8")
	return apiv1.PodSpec{
		NodeSelector:  map[string]string{armsim.NodeGroupLabel: set},
		RestartPolicy: apiv1.RestartPolicyNever,
		Containers: []apiv1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Resources: apiv1.ResourceRequirements{
			Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("90"), apiv1.ResourceMemory: resource.MustParse("1Gi"), armsim.GPUResource: q},
			Limits:   apiv1.ResourceList{armsim.GPUResource: q},
		}}},
	}
}

// podTemplate creates a PodTemplate of whole-node GPU pods of set.
func (sc *scenario) podTemplate(name, set string) {
	sc.t.Helper()
	pt := &apiv1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sc.ns},
		Template: apiv1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}, Spec: gpuPodSpec(set)}}
	if _, err := sc.s.cp.Client.CoreV1().PodTemplates(sc.ns).Create(sc.ctx, pt, metav1.CreateOptions{}); err != nil {
		sc.t.Fatalf("creating PodTemplate %s: %v", name, err)
	}
}

// createRequest creates a ProvisioningRequest for count pods of a template.
func (sc *scenario) createRequest(name, class, template string, count int32, params map[string]string) {
	sc.t.Helper()
	ps := map[string]any{}
	for k, v := range params {
		ps[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": provreq.GroupVersion.String(), "kind": provreq.Kind,
		"metadata": map[string]any{"name": name, "namespace": sc.ns},
		"spec": map[string]any{"provisioningClassName": class, "parameters": ps,
			"podSets": []any{map[string]any{"podTemplateRef": map[string]any{"name": template}, "count": int64(count)}}},
	}}
	if _, err := sc.dynamic().Resource(provreqGVR()).Namespace(sc.ns).Create(sc.ctx, u, metav1.CreateOptions{}); err != nil {
		sc.t.Fatalf("creating ProvisioningRequest %s: %v", name, err)
	}
}

// requests are the scenario's ProvisioningRequests.
func (sc *scenario) requests() []provreq.ProvisioningRequest {
	sc.t.Helper()
	l, err := sc.dynamic().Resource(provreqGVR()).Namespace(sc.ns).List(sc.ctx, metav1.ListOptions{})
	if err != nil {
		sc.t.Fatal(err)
	}
	out := make([]provreq.ProvisioningRequest, len(l.Items))
	for i := range l.Items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(l.Items[i].Object, &out[i]); err != nil {
			sc.t.Fatal(err)
		}
	}
	return out
}

func (sc *scenario) request(name string) (provreq.ProvisioningRequest, bool) {
	for _, r := range sc.requests() {
		if r.Name == name {
			return r, true
		}
	}
	return provreq.ProvisioningRequest{}, false
}

// condition waits for a request's condition to have the status and reason
// and a message with msg in it, and returns it.
func (sc *scenario) condition(name, typ string, status metav1.ConditionStatus, reason, msg string, timeout time.Duration) metav1.Condition {
	sc.t.Helper()
	var got metav1.Condition
	sc.eventually(fmt.Sprintf("ProvisioningRequest %s %s=%s (%s)", name, typ, status, reason), timeout, func() (bool, string) {
		r, ok := sc.request(name)
		if !ok {
			return false, "no such request"
		}
		c := provreq.Find(&r, typ)
		if c == nil {
			return false, fmt.Sprintf("conditions %+v", r.Status.Conditions)
		}
		got = *c
		return c.Status == status && c.Reason == reason && strings.Contains(c.Message, msg), fmt.Sprintf("%s=%s (%s) %q", c.Type, c.Status, c.Reason, c.Message)
	})
	return got
}

// TestProvisioningRequestsAndTestKueueAndTestTenant runs the scenarios
// whose autoscalers handle ProvisioningRequests one after another (see
// provreqSuite), as subtests of one parallel test: it holds one of the
// suite's parallel slots, never one per scenario waiting for its turn. Its
// name matches -run TestProvisioningRequest, -run TestKueue and -run
// TestTenant; one scenario alone is e.g. -run
// 'TestProvisioningRequestsAndTestKueueAndTestTenant/Kueue'. Kueue's manager
// is built (minutes, the first time) and its CRDs installed meanwhile, in
// the background.
func TestProvisioningRequestsAndTestKueueAndTestTenant(t *testing.T) {
	t.Parallel()
	s := theSuite
	if s == nil {
		t.Fatal("suite not started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), kueueSetupTimeout)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.provreq.kueue(ctx, s) // its error is the Kueue scenario's to report
	}()
	t.Cleanup(func() { cancel(); <-done })

	t.Run("BestEffortAtomic", provreqBestEffortAtomic)
	t.Run("AboveMax", provreqAboveMax)
	t.Run("CheckCapacity", provreqCheckCapacity)
	t.Run("KueueAdmitsAGangJobThroughAProvisioningRequest", kueueAdmitsAGangJobThroughAProvisioningRequest)
	t.Run("TenantRequestOverQuota", tenantRequestOverQuota)
	t.Run("TenantCheckCapacityBuysNothing", tenantCheckCapacityBuysNothing)
}

// A best-effort-atomic request for 8 whole-GPU pods buys exactly 8 nodes,
// in one request, and turns Provisioned; its booking holds the coming
// nodes, so the autoscaler buys no more for it.
func provreqBestEffortAtomic(t *testing.T) {
	sc := provreqScenario(t)
	gpu, as := sc.provreqAutoscaler(0)
	sc.podTemplate("train", gpu)
	sc.createRequest("train", provreq.ClassBestEffortAtomic, "train", 8, nil)
	sc.condition("train", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned,
		"8 new nodes requested from node group "+gpu, 2*time.Minute)
	if got := sc.capacity(gpu); got != 8 {
		t.Fatalf("capacity %d, want exactly 8", got)
	}
	sc.registered(gpu, 8)
	sc.stays(gpu, 8, as, 5)
	_, body := sc.get(as, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_scale_ups_total{node_group="`+gpu+`"}`); got != 1 {
		t.Fatalf("scale-up requests %v, want 1: the request's nodes go together", got)
	}
	if got := metricValue(body, `vmss_autoscaler_provisioning_requests{class="`+provreq.ClassBestEffortAtomic+`",condition="Provisioned"}`); got != 1 {
		t.Fatalf("provisioning_requests{Provisioned} = %v, want 1", got)
	}
	if got := metricValue(body, `vmss_autoscaler_provisioning_request_booked_pods{class="`+provreq.ClassBestEffortAtomic+`"}`); got != 8 {
		t.Fatalf("booked pods %v, want 8", got)
	}
	if n := sc.eventsWith(provreq.ReasonCapacityIsProvisioned, "8 new nodes"); n != 1 {
		t.Fatalf("%d CapacityIsProvisioned events on the request, want 1", n)
	}
}

// A best-effort-atomic request above its group's max buys nothing and
// says why, in words a user can act on.
func provreqAboveMax(t *testing.T) {
	sc := provreqScenario(t)
	gpu, as := sc.provreqAutoscaler(0)
	sc.podTemplate("big", gpu)
	sc.createRequest("big", provreq.ClassBestEffortAtomic, "big", 16, nil)
	c := sc.condition("big", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsNotFound,
		"node group "+gpu+" can add 10 nodes, the gang needs 16", time.Minute)
	t.Logf("Provisioned=False message: %s", c.Message)
	sc.condition("big", provreq.Accepted, metav1.ConditionTrue, provreq.ReasonAccepted, "", time.Second)
	sc.stays(gpu, 0, as, 5)
	if n := sc.eventsWith(provreq.ReasonCapacityIsNotFound, "can add 10 nodes"); n < 1 {
		t.Fatal("no CapacityIsNotFound event on the request")
	}
}

// check-capacity: a request for the capacity that exists is Provisioned
// and books it; a second request finds that room taken; one with
// noRetry fails; none buys a node. Pods consuming the first (the
// scheduler places them on its room) end its booking.
func provreqCheckCapacity(t *testing.T) {
	sc := provreqScenario(t)
	gpu, as := sc.provreqAutoscaler(2)
	sc.podTemplate("train", gpu)
	// The nodes are capacity once ready and their GPUs advertised.
	sc.eventually("2 ready nodes advertising their GPUs", 2*time.Minute, readyGPUNodes(sc, gpu, 2))
	sc.createRequest("fits", provreq.ClassCheckCapacity, "train", 2, nil)
	sc.condition("fits", provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsFound, "its 2 pods fit on ready nodes", 2*time.Minute)
	sc.createRequest("booked-out", provreq.ClassCheckCapacity, "train", 1, nil)
	sc.condition("booked-out", provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsNotFound,
		"0 of its 1 pods fit on the cluster as it is", time.Minute)
	sc.createRequest("once", provreq.ClassCheckCapacity, "train", 1, map[string]string{provreq.NoRetryParameter: "true"})
	sc.condition("once", provreq.Failed, metav1.ConditionTrue, provreq.ReasonCapacityIsNotFound, `noRetry is "true"`, time.Minute)
	sc.stays(gpu, 2, as, 3)

	// The consumers: pods annotated with the request's name.
	for i := 0; i < 2; i++ {
		p := &apiv1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("consumer-%d", i), Namespace: sc.ns,
			Annotations: map[string]string{provreq.ConsumeAnnotation: "fits"}}, Spec: gpuPodSpec(gpu)}
		if _, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Create(sc.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sc.eventually("both consumers Running", 2*time.Minute, allRunning(sc, 2))
	sc.condition("fits", provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonBookingConsumed, "all 2 pods", time.Minute)
	if got := sc.capacity(gpu); got != 2 {
		t.Fatalf("capacity %d: check-capacity never buys nodes", got)
	}
}

// --------------------------------------------------------------- Kueue

// kueueAdmitsAGangJobThroughAProvisioningRequest runs Kueue's own
// manager, built from its module, against the suite's API server: a
// ClusterQueue whose admission check is a ProvisioningRequest
// (best-effort-atomic), a LocalQueue, and a Job of 8 whole-GPU pods.
// Kueue creates the request, the autoscaler buys exactly 8 nodes and
// marks it Provisioned, Kueue admits the workload, every pod runs on the
// new nodes and their scheduling ends the booking. A second job that does
// not fit the group's max gets a Provisioned=False a user can read (Kueue
// shows it on the workload) and stays suspended.
func kueueAdmitsAGangJobThroughAProvisioningRequest(t *testing.T) {
	s := theSuite
	if s == nil {
		t.Fatal("suite not started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), kueueSetupTimeout)
	defer cancel()
	start := time.Now()
	kueue, err := s.provreq.kueue(ctx, s) // set up in the background since the parent started
	if err != nil {
		t.Fatalf("setting up Kueue: %v", err)
	}
	t.Logf("Kueue manager ready (waited %s): %s", time.Since(start).Round(time.Second), kueue)
	sc := provreqScenario(t)
	since := time.Now()
	gpu, as := sc.provreqAutoscaler(0)
	prom := sc.prometheus(sc.addr(as))
	sc.startKueue(kueue)
	cq := sc.kueueQueues(gpu)

	sc.kueueJob("train", 8)
	sc.eventually("Kueue's ProvisioningRequest for the job", time.Minute, func() (bool, string) {
		rs := sc.requests()
		return len(rs) == 1, fmt.Sprintf("%d requests", len(rs))
	})
	req := sc.requests()[0].Name
	sc.condition(req, provreq.Provisioned, metav1.ConditionTrue, provreq.ReasonCapacityIsProvisioned, "8 new nodes", 2*time.Minute)
	wl := sc.eventuallyWorkload("train", "Admitted", 2*time.Minute)
	t.Logf("workload %s admitted by ClusterQueue %s", wl, cq)
	sc.eventually("the job's 8 pods Running", 3*time.Minute, allRunning(sc, 8))
	nodes := map[string]bool{}
	for _, n := range sc.nodeList(gpu) {
		nodes[n.Name] = true
	}
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=train"})
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, p := range pods.Items {
		if !nodes[p.Spec.NodeName] {
			t.Fatalf("pod %s on %q, not a node of %s", p.Name, p.Spec.NodeName, gpu)
		}
		if p.Annotations[provreq.ConsumeAnnotation] != req {
			t.Fatalf("pod %s annotations %v: Kueue did not mark it as consuming %s", p.Name, p.Annotations, req)
		}
		used[p.Spec.NodeName] = true
	}
	if len(pods.Items) != 8 || len(used) != 8 || sc.capacity(gpu) != 8 {
		t.Fatalf("%d pods on %d nodes, capacity %d: want 8 on 8 new nodes, no more bought", len(pods.Items), len(used), sc.capacity(gpu))
	}
	sc.condition(req, provreq.BookingExpired, metav1.ConditionTrue, provreq.ReasonBookingConsumed, "all 8 pods", time.Minute)
	_, body := sc.get(as, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_scale_ups_total{node_group="`+gpu+`"}`); got != 1 {
		t.Fatalf("scale-up requests %v, want 1", got)
	}

	// The group can add 2 more nodes: a job of 4 does not fit.
	sc.kueueJob("more", 4)
	var second string
	sc.eventually("Kueue's ProvisioningRequest for the second job", time.Minute, func() (bool, string) {
		for _, r := range sc.requests() {
			if r.Name != req {
				second = r.Name
				return true, ""
			}
		}
		return false, "none yet"
	})
	c := sc.condition(second, provreq.Provisioned, metav1.ConditionFalse, provreq.ReasonCapacityIsNotFound,
		"node group "+gpu+" can add 2 nodes, the gang needs 4", time.Minute)
	sc.eventually("the second workload pending with the autoscaler's message", time.Minute, func() (bool, string) {
		w := sc.workloadOf("more")
		if w == nil {
			return false, "no workload"
		}
		checks, _, _ := unstructured.NestedSlice(w.Object, "status", "admissionChecks")
		for _, ch := range checks {
			m, _ := ch.(map[string]any)
			if m["state"] == "Pending" && strings.Contains(fmt.Sprint(m["message"]), "can add 2 nodes, the gang needs 4") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("admission checks %v", checks)
	})
	t.Logf("second job's Provisioned=False: %s", c.Message)
	if w := sc.workloadOf("more"); workloadCondition(w, "Admitted") {
		t.Fatal("the second workload was admitted")
	}
	job, err := sc.s.cp.Client.BatchV1().Jobs(sc.ns).Get(sc.ctx, "more", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if job.Spec.Suspend == nil || !*job.Spec.Suspend {
		t.Fatal("the second job was unsuspended")
	}
	sc.stays(gpu, 8, as, 3)
	// The Capacity requests dashboard's request panels show this story.
	sc.panelsShowData(prom, "capacity-requests.json", "provisioning_request", since)
}

// kueueSetupTimeout bounds Kueue's setup: its first build takes minutes.
const kueueSetupTimeout = 20 * time.Minute

// kueue builds Kueue's manager and installs its CRDs, its namespace and its
// webhook Secret, once for the suite, and returns the binary. A setup cut
// short by ctx is not kept: the next call starts again.
func (p *provreqSuite) kueue(ctx context.Context, s *suite) (string, error) {
	p.kueueMu.Lock()
	defer p.kueueMu.Unlock()
	if p.kueueDone {
		return p.kueueBin, p.kueueErr
	}
	bin, err := setUpKueue(ctx, s)
	if err != nil && ctx.Err() != nil {
		return "", err
	}
	p.kueueBin, p.kueueErr, p.kueueDone = bin, err, true
	return bin, err
}

func setUpKueue(ctx context.Context, s *suite) (string, error) {
	bin, err := harness.BuildKueue(ctx)
	if err != nil {
		return "", err
	}
	dir, err := harness.ModuleDir(ctx, harness.KueueModule, harness.KueueVersion)
	if err != nil {
		return "", err
	}
	bases := filepath.Join(dir, "config", "components", "crd", "bases")
	entries, err := os.ReadDir(bases)
	if err != nil {
		return "", err
	}
	var files []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") {
			files = append(files, filepath.Join(bases, e.Name()))
		}
	}
	if err := installCRDs(ctx, s.cp.RESTConfig, files, kueueConversion); err != nil {
		return "", err
	}
	if err := kueueNamespaceAndSecret(ctx, s); err != nil {
		return "", err
	}
	return bin, nil
}

// startKueue runs Kueue's manager (bin, from setUpKueue) against the
// suite's API server until the scenario ends. It runs
// without webhooks: none is registered with the API server (the Job is
// created suspended, as Kueue's webhook would make it). Kueue's internal
// certificate management is left on (without it Kueue wants metrics
// certificates at a fixed path): it fills its Secret and injects its CA
// into the conversion settings of its CRDs (installed with them, never
// called: only the storage version is used); this helper writes the
// Secret's certificate where Kueue's webhook server reads it, as a kubelet
// mounting the Secret would.
func (sc *scenario) startKueue(bin string) {
	sc.t.Helper()
	s := sc.s
	health, webhook := freePort(sc.t), freePort(sc.t)
	certDir := sc.t.TempDir()
	cfg := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: %s
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
  webhookServiceName: %s
  webhookSecretName: %s
integrations:
  frameworks: ["batch/job"]
featureGates:
  VisibilityOnDemand: false
`, kueueNamespace, health, webhook, certDir, kueueService, kueueSecret)
	cfgFile := filepath.Join(sc.t.TempDir(), "kueue.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		sc.t.Fatal(err)
	}
	p, err := s.cp.StartProcessEnv(sc.ctx, sc.prefix+"-kueue", bin, []string{"KUBECONFIG=" + s.cp.Kubeconfig},
		"--config="+cfgFile, "--zap-log-level=3")
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.track(p, fmt.Sprintf("127.0.0.1:%d", health))
	// Kueue stops before the scenario's requests are deleted (it would
	// make them again).
	sc.t.Cleanup(func() { _ = p.Stop() })
	// The goroutine ends before the test does (this cleanup runs before
	// the scenario's own): it may report to the test until then.
	ctx, cancel := context.WithCancel(sc.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mountKueueCerts(ctx, s.cp.Client, certDir); err != nil && ctx.Err() == nil {
			sc.t.Errorf("mounting Kueue's webhook certificate: %v", err)
		}
	}()
	sc.t.Cleanup(func() { cancel(); <-done })
}

// mountKueueCerts writes the webhook Secret's certificate and key into
// dir once Kueue filled it, or returns ctx's error. Each file is written
// whole (a temporary file renamed), tls.crt last: Kueue's certificate
// manager waits for that file only, then its webhook server reads both.
func mountKueueCerts(ctx context.Context, client kubernetes.Interface, dir string) error {
	for {
		sec, err := client.CoreV1().Secrets(kueueNamespace).Get(ctx, kueueSecret, metav1.GetOptions{})
		if err == nil && len(sec.Data["tls.crt"]) > 0 && len(sec.Data["tls.key"]) > 0 {
			for _, k := range []string{"ca.crt", "tls.key", "tls.crt"} {
				if v, ok := sec.Data[k]; ok {
					if err := writeFileAtomic(filepath.Join(dir, k), v); err != nil {
						return fmt.Errorf("writing Kueue's %s: %w", k, err)
					}
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// writeFileAtomic writes data to path (mode 0600) through a temporary file
// in its directory renamed over it: a reader sees the old file or the new.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return nil
}

// kueueConversion gives the CRDs Kueue converts between versions the
// conversion webhook settings Kueue's certificate manager fills in (its
// deployment's kustomize patches do the same).
func kueueConversion(crd *unstructured.Unstructured) {
	switch crd.GetName() {
	case "localqueues.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io", "cohorts.kueue.x-k8s.io", "multikueueclusters.kueue.x-k8s.io":
		_ = unstructured.SetNestedMap(crd.Object, map[string]any{
			"strategy": "Webhook",
			"webhook": map[string]any{
				"clientConfig":             map[string]any{"service": map[string]any{"namespace": kueueNamespace, "name": kueueService, "path": "/convert"}},
				"conversionReviewVersions": []any{"v1"},
			},
		}, "spec", "conversion")
	}
}

// kueueNamespaceAndSecret creates Kueue's namespace and the empty Secret
// its certificate manager fills.
func kueueNamespaceAndSecret(ctx context.Context, s *suite) error {
	ns := &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kueueNamespace}}
	if _, err := s.cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", kueueNamespace, err)
	}
	sec := &apiv1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kueueSecret, Namespace: kueueNamespace}}
	if _, err := s.cp.Client.CoreV1().Secrets(kueueNamespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Secret %s/%s: %w", kueueNamespace, kueueSecret, err)
	}
	return nil
}

// kueueQueues creates the scenario's Kueue objects: a ResourceFlavor of
// the scale set's nodes, a ProvisioningRequestConfig (best-effort-atomic),
// its AdmissionCheck, a ClusterQueue for the scenario's namespace with
// that check, and a LocalQueue "lq"; it waits until the ClusterQueue is
// active (Kueue runs) and returns its name.
func (sc *scenario) kueueQueues(set string) string {
	sc.t.Helper()
	dc := sc.dynamic()
	name := func(n string) string { return sc.prefix + "-" + n }
	create := func(resource string, ns string, obj map[string]any) {
		u := &unstructured.Unstructured{Object: obj}
		u.SetAPIVersion(kueueGroup + "/" + kueueVersion)
		var ri dynamic.ResourceInterface = dc.Resource(kueueGVR(resource))
		if ns != "" {
			ri = dc.Resource(kueueGVR(resource)).Namespace(ns)
		}
		if _, err := ri.Create(sc.ctx, u, metav1.CreateOptions{}); err != nil {
			sc.t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		if ns == "" {
			sc.t.Cleanup(func() {
				_ = dc.Resource(kueueGVR(resource)).Delete(context.Background(), u.GetName(), metav1.DeleteOptions{})
			})
		}
	}
	create("resourceflavors", "", map[string]any{"kind": "ResourceFlavor", "metadata": map[string]any{"name": name("h100")},
		"spec": map[string]any{"nodeLabels": map[string]any{armsim.NodeGroupLabel: set}}})
	create("provisioningrequestconfigs", "", map[string]any{"kind": "ProvisioningRequestConfig", "metadata": map[string]any{"name": name("prc")},
		"spec": map[string]any{"provisioningClassName": provreq.ClassBestEffortAtomic, "managedResources": []any{string(armsim.GPUResource)}}})
	create("admissionchecks", "", map[string]any{"kind": "AdmissionCheck", "metadata": map[string]any{"name": name("prov")},
		"spec": map[string]any{"controllerName": "kueue.x-k8s.io/provisioning-request",
			"parameters": map[string]any{"apiGroup": kueueGroup, "kind": "ProvisioningRequestConfig", "name": name("prc")}}})
	create("clusterqueues", "", map[string]any{"kind": "ClusterQueue", "metadata": map[string]any{"name": name("cq")},
		"spec": map[string]any{
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": sc.ns}},
			"resourceGroups": []any{map[string]any{
				"coveredResources": []any{"cpu", "memory", string(armsim.GPUResource)},
				"flavors": []any{map[string]any{"name": name("h100"), "resources": []any{
					map[string]any{"name": "cpu", "nominalQuota": "10000"},
					map[string]any{"name": "memory", "nominalQuota": "100Ti"},
					map[string]any{"name": string(armsim.GPUResource), "nominalQuota": "1000"},
				}}},
			}},
			"admissionChecksStrategy": map[string]any{"admissionChecks": []any{map[string]any{"name": name("prov")}}},
		}})
	create("localqueues", sc.ns, map[string]any{"kind": "LocalQueue", "metadata": map[string]any{"name": "lq", "namespace": sc.ns},
		"spec": map[string]any{"clusterQueue": name("cq")}})
	sc.eventually("Kueue running: the ClusterQueue active", 3*time.Minute, func() (bool, string) {
		u, err := dc.Resource(kueueGVR("clusterqueues")).Get(sc.ctx, name("cq"), metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return workloadCondition(u, "Active"), fmt.Sprintf("status %v", u.Object["status"])
	})
	return name("cq")
}

// kueueJob submits a suspended Job of n whole-GPU pods to LocalQueue "lq"
// (Kueue's webhook would suspend it; none is registered here).
func (sc *scenario) kueueJob(name string, n int32) {
	sc.t.Helper()
	suspend := true
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sc.ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "lq"}},
		Spec: batchv1.JobSpec{Parallelism: &n, Completions: &n, Suspend: &suspend,
			// Training pods run until done: kwok keeps them Running.
			Template: apiv1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{harness.KeepRunningAnnotation: "true"}},
				Spec: gpuPodSpec("")}},
	}
	// The flavor puts its nodes' label in the pods (and the request's template).
	job.Spec.Template.Spec.NodeSelector = nil
	if _, err := sc.s.cp.Client.BatchV1().Jobs(sc.ns).Create(sc.ctx, job, metav1.CreateOptions{}); err != nil {
		sc.t.Fatalf("creating Job %s: %v", name, err)
	}
}

// workloadOf is the Kueue Workload of a Job, or nil.
func (sc *scenario) workloadOf(job string) *unstructured.Unstructured {
	l, err := sc.dynamic().Resource(kueueGVR("workloads")).Namespace(sc.ns).List(sc.ctx, metav1.ListOptions{})
	if err != nil {
		sc.t.Fatal(err)
	}
	for i := range l.Items {
		for _, ref := range l.Items[i].GetOwnerReferences() {
			if ref.Kind == "Job" && ref.Name == job {
				return &l.Items[i]
			}
		}
	}
	return nil
}

// eventuallyWorkload waits for a Job's Workload to have a condition True
// and returns its name.
func (sc *scenario) eventuallyWorkload(job, cond string, timeout time.Duration) string {
	sc.t.Helper()
	var name string
	sc.eventually(fmt.Sprintf("the Workload of Job %s %s", job, cond), timeout, func() (bool, string) {
		w := sc.workloadOf(job)
		if w == nil {
			return false, "no workload"
		}
		name = w.GetName()
		return workloadCondition(w, cond), fmt.Sprintf("status %v", w.Object["status"])
	})
	return name
}

// workloadCondition says a Kueue object has a condition True.
func workloadCondition(u *unstructured.Unstructured, typ string) bool {
	if u == nil {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ && m["status"] == "True" {
			return true
		}
	}
	return false
}
