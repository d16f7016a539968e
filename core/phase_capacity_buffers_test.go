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
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// fakeBuffers is the env's CapacityBuffer API: buffers and templates as
// an informer would see them; a status write lands in the same store (a
// stale resourceVersion is a conflict).
type fakeBuffers struct {
	mu        sync.Mutex
	buffers   map[string]*capacitybuffer.CapacityBuffer
	templates *fakeProvreqs // its PodTemplate store
	writes    map[string]int
	rv        int
	// scalables are the Deployments a scalableRef may name (by
	// namespace/name), readErr fails every read of them.
	scalables map[string]*apiv1.PodTemplate
	readErr   error
	// quotas are the namespaces' ResourceQuotas.
	quotas map[string][]*apiv1.ResourceQuota
}

func newFakeBuffers() *fakeBuffers {
	return &fakeBuffers{buffers: map[string]*capacitybuffer.CapacityBuffer{}, templates: newFakeProvreqs(), writes: map[string]int{}}
}

func withBuffers(f *fakeBuffers) envOption {
	return func(e *env) {
		e.buffers = f
		e.opts.CapacityBuffers = true
	}
}

func (f *fakeBuffers) List() ([]*capacitybuffer.CapacityBuffer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*capacitybuffer.CapacityBuffer, 0, len(f.buffers))
	for _, b := range f.buffers {
		out = append(out, b)
	}
	return out, nil
}

func (f *fakeBuffers) PodTemplate(ns, name string) (*apiv1.PodTemplate, error) {
	return f.templates.PodTemplate(ns, name)
}

func (f *fakeBuffers) Scalable(_ context.Context, ns string, ref capacitybuffer.ScalableRef) (*apiv1.PodTemplateSpec, int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.readErr != nil {
		return nil, 0, f.readErr
	}
	if pt, ok := f.scalables[ns+"/"+ref.Name]; ok {
		return &pt.Template, 1, nil
	}
	return nil, 0, &capacitybuffer.ScalableNotFoundError{Namespace: ns, Ref: ref}
}

func (f *fakeBuffers) Quotas(ns string) ([]*apiv1.ResourceQuota, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.quotas[ns], nil
}

func (f *fakeBuffers) UpdateStatus(_ context.Context, b *capacitybuffer.CapacityBuffer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.buffers[capacitybuffer.Key(b)]
	gr := schema.GroupResource{Group: capacitybuffer.Group, Resource: capacitybuffer.Resource}
	if !ok {
		return apierrors.NewNotFound(gr, b.Name)
	}
	if cur.ResourceVersion != b.ResourceVersion {
		return apierrors.NewConflict(gr, b.Name, fmt.Errorf("resourceVersion %s, stored %s", b.ResourceVersion, cur.ResourceVersion))
	}
	f.rv++
	next := cur.DeepCopy()
	next.Status = b.DeepCopy().Status
	next.ResourceVersion = fmt.Sprint(1000 + f.rv)
	f.buffers[capacitybuffer.Key(b)] = next
	f.writes[b.Name]++
	return nil
}

func (f *fakeBuffers) add(bs ...*capacitybuffer.CapacityBuffer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range bs {
		f.buffers[capacitybuffer.Key(b)] = b
	}
}

func (f *fakeBuffers) remove(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.buffers, "default/"+name)
}

func (f *fakeBuffers) get(t testing.TB, name string) *capacitybuffer.CapacityBuffer {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.buffers["default/"+name]
	if !ok {
		t.Fatalf("buffer %s is gone", name)
	}
	return b
}

// wantCond checks a buffer's condition.
func (f *fakeBuffers) wantCond(t testing.TB, name, typ string, status metav1.ConditionStatus, reason, msg string) {
	t.Helper()
	b := f.get(t, name)
	c := apimeta.FindStatusCondition(b.Status.Conditions, typ)
	if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
		t.Fatalf("buffer %s: %s is %+v, want %s (%s) with %q", name, typ, c, status, reason, msg)
	}
}

// buffer is a CapacityBuffer in "default" of replicas chunks of template.
func buffer(name, template string, replicas int32, created time.Time) *capacitybuffer.CapacityBuffer {
	return &capacitybuffer.CapacityBuffer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("cb-" + name), Generation: 1, ResourceVersion: "1",
			CreationTimestamp: metav1.NewTime(created)},
		Spec: capacitybuffer.Spec{PodTemplateRef: &capacitybuffer.LocalObjectRef{Name: template}, Replicas: &replicas},
	}
}

func targetOf(t testing.TB, g *inmemory.Group) int {
	t.Helper()
	n, err := g.TargetSize()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func bufferPods(e *env, state string) float64 {
	return testutil.ToFloat64(e.a.metrics.Buffers.Pods.WithLabelValues(state))
}

// bufferEnv is an env with a GPU group (max maxSize) of ready nodes, and
// CapacityBuffers on with a whole-GPU template "gpu".
func bufferEnv(t *testing.T, ready, maxSize int, opts ...envOption) (*env, *fakeBuffers, *inmemory.Group) {
	f := newFakeBuffers()
	e := newEnv(t, append([]envOption{withBuffers(f)}, opts...)...)
	g := e.provider.AddGroup("gpu", 0, maxSize, gpuTemplate("gpu"), inmemory.WithTarget(ready))
	e.start()
	e.register(g)
	f.templates.add(t, podTemplate("gpu", wholeGPU()...))
	return e, f, g
}

// A buffer on an empty group buys its chunks' nodes at the queue's lowest
// class, says so on its status and in an event, and, once they are
// ready, holds their room without buying more.
func TestCapacityBufferBuysNodesAndHoldsThem(t *testing.T) {
	e, f, g := bufferEnv(t, 0, 10)
	f.add(buffer("warm", "gpu", 2, e.clock.Now()))
	e.run()
	if got := targetOf(t, g); got != 2 {
		t.Fatalf("target %d, want 2 nodes for the buffer's 2 chunks", got)
	}
	f.wantCond(t, "warm", capacitybuffer.ReadyForProvisioning, metav1.ConditionTrue, capacitybuffer.ReasonAttributesSet, "2 chunks of PodTemplate gpu")
	f.wantCond(t, "warm", capacitybuffer.Provisioning, metav1.ConditionTrue, capacitybuffer.ReasonFakePodsInjected, "2 chunks")
	if b := f.get(t, "warm"); b.Status.Replicas == nil || *b.Status.Replicas != 2 || b.Status.PodTemplateRef == nil || b.Status.PodTemplateRef.Name != "gpu" ||
		b.Status.ProvisioningStrategy == nil || *b.Status.ProvisioningStrategy != capacitybuffer.ActiveCapacity {
		t.Fatalf("status %+v", b.Status)
	}
	if ev := e.events(EventBufferScaleUp); len(ev) != 1 || !strings.Contains(ev[0], "node group gpu") {
		t.Fatalf("scale-up events %v, want one naming gpu", ev)
	}
	if got := bufferPods(e, "coming"); got != 2 {
		t.Fatalf("coming chunks %v, want 2", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.NodesReleased.WithLabelValues("gpu", "balloon")); got != 2 {
		t.Fatalf("nodes released at the balloon class %v, want 2 (the queue's lowest)", got)
	}
	writes := f.writes["warm"]
	e.run()
	if got := targetOf(t, g); got != 2 {
		t.Fatalf("target %d after a second loop, want still 2: the chunks wait for the coming nodes", got)
	}
	e.register(g)
	e.run()
	if got, warm := targetOf(t, g), bufferPods(e, "warm"); got != 2 || warm != 2 {
		t.Fatalf("target %d, warm chunks %v; want 2 and 2", got, warm)
	}
	if f.writes["warm"] != writes {
		t.Fatalf("status written %d times more while nothing changed", f.writes["warm"]-writes)
	}
	var st Status
	if err := yaml.Unmarshal([]byte(e.status.writes[len(e.status.writes)-1]), &st); err != nil {
		t.Fatal(err)
	}
	if st.CapacityBuffers == nil || len(st.CapacityBuffers.Buffers) != 1 || st.CapacityBuffers.Buffers[0].Warm != 2 {
		t.Fatalf("status ConfigMap's buffers %+v", st.CapacityBuffers)
	}
}

// The room a buffer holds is free to real pods at once (the scheduler
// does not see the chunks): a pending pod that fits there buys nothing;
// once it runs there, the buffer buys a node to refill itself.
func TestCapacityBufferRoomIsFreeToRealPods(t *testing.T) {
	e, f, g := bufferEnv(t, 2, 10)
	f.add(buffer("warm", "gpu", 2, e.clock.Now()))
	e.run()
	if got := targetOf(t, g); got != 2 {
		t.Fatalf("target %d, want 2: the buffer fits on the 2 ready nodes", got)
	}
	pod := pendingPods(1, "job", wholeGPU()...)[0]
	e.add(pod)
	e.run()
	if got := targetOf(t, g); got != 2 {
		t.Fatalf("target %d, want 2: the pending pod fits in the buffer's room", got)
	}
	nodes := e.nodeNames()
	sort.Strings(nodes)
	bound := pod.DeepCopy()
	bound.Spec.NodeName = nodes[0]
	bound.Status.Conditions = nil
	bound.Status.Phase = apiv1.PodRunning
	if err := e.pods.Update(bound); err != nil {
		t.Fatal(err)
	}
	e.run()
	if got := targetOf(t, g); got != 3 {
		t.Fatalf("target %d, want 3: the buffer refills the room the pod took", got)
	}
	if warm, coming := bufferPods(e, "warm"), bufferPods(e, "coming"); warm != 1 || coming != 1 {
		t.Fatalf("warm %v coming %v, want 1 and 1", warm, coming)
	}
}

// Scale-down keeps the nodes holding a buffer's room, and takes them
// once the buffer is gone: even when the chunk's template says its pods
// may be evicted and the chunk would fit elsewhere (a chunk is no pod:
// its node would look empty to the fresh read before deletion, and no
// eviction may name it).
func TestScaleDownKeepsBufferNodes(t *testing.T) {
	acts := &fakeActions{}
	e, f, g := bufferEnv(t, 2, 10, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	evictable := podTemplate("evictable", to.Requests("1", "1Gi"))
	evictable.Template.Annotations = map[string]string{scaledown.SafeToEvictAnnotation: "true"}
	f.templates.add(t, evictable)
	f.add(buffer("warm", "evictable", 1, e.clock.Now()))
	nodes := e.nodeNames()
	sort.Strings(nodes)
	// The chunk is booked on the first node; the second runs a pod that
	// keeps it (no controller), with room for the chunk.
	e.add(to.Pod("pinned", to.Requests("1", "1Gi"), to.OnNode(nodes[1])))
	for i := 0; i < 4; i++ {
		e.run()
		e.a.WaitForDrains()
		e.clock.Step(time.Minute)
	}
	if got := g.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v, want none: the first node holds the buffer's room", got)
	}
	for _, p := range acts.evictedPods() {
		if strings.Contains(p, "capacity-buffer") {
			t.Fatalf("evicted %v: a buffer's chunk is no pod", acts.evictedPods())
		}
	}
	f.remove("warm")
	for i := 0; i < 4; i++ {
		e.run()
		e.a.WaitForDrains()
		e.clock.Step(time.Minute)
	}
	if got := len(g.Deleted()); got != 1 {
		t.Fatalf("deleted %v, want the buffer's node once the buffer is gone", g.Deleted())
	}
}

// A buffer that cannot be turned into chunks says why on its status, and
// buys nothing; one of another strategy is left alone.
func TestCapacityBufferNotReadyAndOtherStrategies(t *testing.T) {
	e, f, g := bufferEnv(t, 0, 10)
	f.add(buffer("typo", "no-such-template", 2, e.clock.Now()))
	other := buffer("theirs", "gpu", 2, e.clock.Now())
	s := "example.com/their-strategy"
	other.Spec.ProvisioningStrategy = &s
	f.add(other)
	e.run()
	if got := targetOf(t, g); got != 0 {
		t.Fatalf("target %d, want 0", got)
	}
	f.wantCond(t, "typo", capacitybuffer.ReadyForProvisioning, metav1.ConditionFalse, capacitybuffer.ReasonPodTemplateNotFound, "spec.podTemplateRef.name: PodTemplate default/no-such-template")
	f.wantCond(t, "typo", capacitybuffer.Provisioning, metav1.ConditionFalse, capacitybuffer.ReasonNotReady, "")
	if b := f.get(t, "theirs"); len(b.Status.Conditions) != 0 || f.writes["theirs"] != 0 {
		t.Fatalf("a buffer of another strategy was written: %+v", b.Status)
	}
	if got := testutil.ToFloat64(e.a.metrics.Buffers.Buffers.WithLabelValues("not_ready")); got != 1 {
		t.Fatalf("not_ready buffers %v, want 1", got)
	}
}

// Chunks no group can take are reported once per change, as a warning
// event on the buffer, and counted unplaced.
func TestCapacityBufferAboveMax(t *testing.T) {
	e, f, g := bufferEnv(t, 0, 2)
	f.add(buffer("big", "gpu", 3, e.clock.Now()))
	e.run()
	if got := targetOf(t, g); got != 2 {
		t.Fatalf("target %d, want the group's max 2", got)
	}
	ev := e.events(EventBufferNoScaleUp)
	if len(ev) != 1 || !strings.Contains(ev[0], "1 of the buffer's 3 chunks") {
		t.Fatalf("no-scale-up events %v, want one for 1 of 3 chunks", ev)
	}
	e.run() // the reason changes once: the group is at its max now
	_ = e.events(EventBufferNoScaleUp)
	e.run()
	e.run()
	if ev := e.events(EventBufferNoScaleUp); len(ev) != 0 {
		t.Fatalf("no-scale-up events %v while nothing changed, want none (not one per loop)", ev)
	}
	if got := bufferPods(e, "unplaced"); got != 1 {
		t.Fatalf("unplaced %v, want 1", got)
	}
}

// Real pending pods come before a buffer: with one node left under the
// group's max, the pod gets it.
func TestCapacityBufferYieldsToRealPods(t *testing.T) {
	e, f, g := bufferEnv(t, 0, 1)
	f.add(buffer("warm", "gpu", 1, e.clock.Now()))
	e.add(pendingPods(1, "job", wholeGPU()...))
	e.run()
	if got := targetOf(t, g); got != 1 {
		t.Fatalf("target %d, want 1", got)
	}
	if got := bufferPods(e, "unplaced"); got != 1 {
		t.Fatalf("unplaced chunks %v, want 1: the node is the pod's", got)
	}
	for _, ev := range e.events(EventNotTriggerScaleUp) {
		if strings.Contains(ev, "pod didn't trigger scale-up") {
			t.Fatalf("pod event %q: the pod got its node", ev)
		}
	}
}

// A chunk is no gang member: a buffer whose template names a gang (a
// buffer for a training job's shape) does not count as one of its running
// members, or the gang would get fewer nodes than it needs.
func TestCapacityBufferChunksAreNoGangMembers(t *testing.T) {
	e, f, g := bufferEnv(t, 1, 10, withGangs(mins{"train": 2}))
	name := "train"
	tmpl := podTemplate("train-shape", wholeGPU()...)
	tmpl.Template.Spec.SchedulingGroup = &apiv1.PodSchedulingGroup{PodGroupName: &name}
	f.templates.add(t, tmpl)
	f.add(buffer("warm", "train-shape", 1, e.clock.Now()))
	e.add(gangMembers(2, "train"))
	e.run()
	if got := targetOf(t, g); got != 2 {
		t.Fatalf("target %d, want 2: one member in the buffer's room, one new node", got)
	}
}

// After a refused group, the pods planned again go workload first, then
// balloons, then chunks: a displaced balloon gets the last node a group
// has before a buffer's chunk does, and the queue releases balloon demand
// before chunk demand.
func TestCapacityBufferAfterBalloonsInReplanAndQueue(t *testing.T) {
	t.Run("replan after a refused group", func(t *testing.T) {
		f := newFakeBuffers()
		e := newEnv(t, withBuffers(f))
		a := e.provider.AddGroup("gpu-a", 0, 10, gpuTemplate("gpu-a"))
		b := e.provider.AddGroup("gpu-b", 0, 1, gpuTemplate("gpu-b"))
		e.start()
		f.templates.add(t, podTemplate("gpu", wholeGPU()...))
		a.SetIncreaseError(cloudprovider.NewError(cloudprovider.ClassQuota, "QuotaExceeded", "exceeding approved cores quota", nil))
		f.add(buffer("warm", "gpu", 1, e.clock.Now().Add(-time.Hour))) // older than the balloon
		e.add(balloonPod("balloon-0", "gpu-b", to.Unschedulable(), to.CreatedAt(e.clock.Now().Add(-time.Minute))))
		e.run()
		if got := b.Increases(); len(got) != 1 || got[0] != 1 {
			t.Fatalf("gpu-b increases %v, want [1]", got)
		}
		if got := bufferPods(e, "unplaced"); got != 1 {
			t.Fatalf("unplaced chunks %v, want 1: gpu-b's one node is the balloon's", got)
		}
	})
	t.Run("queue", func(t *testing.T) {
		// Two groups: the chunk's demand (for gpu-a) is older than the
		// balloon's (for gpu-b); with room for one node, the balloon's goes.
		f := newFakeBuffers()
		e := newEnv(t, withBuffers(f), smoothing(60, 1, 1000))
		a := e.provider.AddGroup("gpu-a", 0, 10, gpuTemplate("gpu-a"))
		b := e.provider.AddGroup("gpu-b", 0, 10, gpuTemplate("gpu-b"))
		e.start()
		f.templates.add(t, podTemplate("gpu-a", append(wholeGPU(), to.NodeSelector("pool", "gpu-a"))...))
		f.add(buffer("warm", "gpu-a", 1, e.clock.Now().Add(-time.Hour)))
		e.add(balloonPod("balloon-0", "gpu-b", to.Unschedulable(), to.CreatedAt(e.clock.Now().Add(-time.Minute)), to.NodeSelector("pool", "gpu-b")))
		e.run() // the burst of 1
		if got := b.Increases(); len(got) != 1 || got[0] != 1 {
			t.Fatalf("gpu-b increases %v, want [1]: the balloon's node first", got)
		}
		if got := a.Increases(); len(got) != 0 {
			t.Fatalf("gpu-a increases %v, want none yet: the chunk's node waits", got)
		}
		if got := bufferPods(e, "coming"); got != 1 {
			t.Fatalf("coming chunks %v, want 1 (queued)", got)
		}
	})
}

// A buffer whose workload cannot be read (a timeout, a refused read)
// keeps its last chunks, and its nodes, for 10 minutes; then it says so.
func TestCapacityBufferKeepsChunksWhenItsWorkloadCannotBeRead(t *testing.T) {
	acts := &fakeActions{}
	e, f, g := bufferEnv(t, 2, 10, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	f.scalables = map[string]*apiv1.PodTemplate{"default/trainer": podTemplate("trainer", wholeGPU()...)}
	b := buffer("follow", "", 2, e.clock.Now())
	b.Spec.PodTemplateRef = nil
	b.Spec.ScalableRef = &capacitybuffer.ScalableRef{APIGroup: "apps", Kind: "Deployment", Name: "trainer"}
	f.add(b)
	e.run()
	f.wantCond(t, "follow", capacitybuffer.Provisioning, metav1.ConditionTrue, capacitybuffer.ReasonFakePodsInjected, "")
	f.mu.Lock()
	f.readErr = errors.New("the server was unable to return a response in the time allotted")
	f.mu.Unlock()
	writes := f.writes["follow"]
	for i := 0; i < 5; i++ {
		e.clock.Step(time.Minute)
		e.run()
		e.a.WaitForDrains()
	}
	if got := g.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v while the buffer's workload could not be read", got)
	}
	if got := bufferPods(e, "warm"); got != 2 || f.writes["follow"] != writes {
		t.Fatalf("warm %v, %d status writes; want the last 2 chunks and no write", got, f.writes["follow"]-writes)
	}
	e.clock.Step(10 * time.Minute)
	e.run()
	f.wantCond(t, "follow", capacitybuffer.Provisioning, metav1.ConditionFalse, capacitybuffer.ReasonScalableRefUnreadable, "unable to return a response")
}

// A pod that may not preempt (preemptionPolicy Never) still takes a
// buffer's room: the scheduler does not see the chunks.
func TestCapacityBufferRoomIsFreeToPodsThatCannotPreempt(t *testing.T) {
	e, f, g := bufferEnv(t, 1, 10)
	f.add(buffer("warm", "gpu", 1, e.clock.Now()))
	e.run()
	never := apiv1.PreemptNever
	e.add(pendingPods(1, "batch", append(wholeGPU(), func(p *apiv1.Pod) { p.Spec.PreemptionPolicy = &never })...))
	e.run()
	if got := targetOf(t, g); got != 1 {
		t.Fatalf("target %d, want 1: the pod fits in the buffer's room", got)
	}
}

// A buffer's room stays where it was: when a node's pods go, that node is
// the one scale-down takes, not one the buffer held (chunks are placed on
// last loop's nodes first).
func TestCapacityBufferRoomStaysPut(t *testing.T) {
	acts := &fakeActions{}
	e, f, g := bufferEnv(t, 3, 10, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.ScaleDownBrakeClusterShare, o.ScaleDownBrakeGroupShare = 1, 1
	}))
	nodes := e.nodeNames()
	sort.Strings(nodes)
	job := to.Pod("job-0", append(wholeGPU(), to.OnNode(nodes[0]), to.ControlledBy("Job", "job", "job-uid"))...)
	e.add(job)
	f.add(buffer("warm", "gpu", 2, e.clock.Now()))
	e.run()
	if err := e.pods.Delete(job); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		e.clock.Step(time.Minute)
		e.run()
		e.a.WaitForDrains()
	}
	got := g.Deleted()
	if len(got) != 1 || strings.NewReplacer("://", "-", "/", "-").Replace(got[0]) != nodes[0] {
		t.Fatalf("deleted %v, want %s, the node the job left (the buffer held the others)", got, nodes[0])
	}
}

// TestCapacityBufferOverTheBoundSaysSo (#40): under the default bounds
// (100 buffers a namespace), a namespace's 101st buffer is not planned and
// says so on its status, naming the flags; the older 100 are planned,
// and a buffer of another namespace is planned beside them. Before, a
// buffer left out kept no word of it (or a status saying its chunks were
// placed).
func TestCapacityBufferOverTheBoundSaysSo(t *testing.T) {
	e, f, g := bufferEnv(t, 0, 1000)
	if e.a.opts.MaxCapacityBuffersPerNamespace != 100 {
		t.Fatalf("default per-namespace bound %d, want 100", e.a.opts.MaxCapacityBuffersPerNamespace)
	}
	for i := range 101 {
		f.add(buffer(fmt.Sprintf("b%03d", i), "gpu", 1, e.clock.Now().Add(time.Duration(i)*time.Second)))
	}
	other := buffer("theirs", "gpu", 1, e.clock.Now().Add(time.Hour))
	other.Namespace = "team-b"
	f.templates.add(t, func() *apiv1.PodTemplate { pt := podTemplate("gpu", wholeGPU()...); pt.Namespace = "team-b"; return pt }())
	f.add(other)
	e.clock.Step(2 * time.Hour)
	for range 3 { // statuses are written 50 a loop
		e.run()
	}
	if got := targetOf(t, g); got < 50 {
		t.Fatalf("target %d, want the planned buffers' nodes coming (50 at once: the in-flight cap)", got)
	}
	f.mu.Lock()
	theirs := apimeta.FindStatusCondition(f.buffers["team-b/theirs"].Status.Conditions, capacitybuffer.Provisioning)
	f.mu.Unlock()
	if theirs == nil || theirs.Status != metav1.ConditionTrue {
		t.Fatalf("the other namespace's newer buffer: Provisioning %+v, want True: planned beside the 100", theirs)
	}
	f.wantCond(t, "b100", capacitybuffer.Provisioning, metav1.ConditionFalse, capacitybuffer.ReasonLimitReached,
		"--max-capacity-buffers-per-namespace=100, --max-capacity-buffers=1000")
	f.wantCond(t, "b099", capacitybuffer.Provisioning, metav1.ConditionTrue, capacitybuffer.ReasonFakePodsInjected, "")
	if got := testutil.ToFloat64(e.a.metrics.CapacityBuffersSkipped); got != 1 {
		t.Fatalf("skipped buffers %v, want 1", got)
	}
	writes := f.writes["b100"]
	e.run()
	if f.writes["b100"] != writes {
		t.Fatalf("the left-out buffer's status written again while nothing changed")
	}
}

// TestCapacityBufferCappedByResourceQuota (#40): a tenant's namespace may
// request 16 GPUs (a ResourceQuota), 8 of them used by its running pods;
// its buffer of 5 whole-GPU-node chunks (8 GPUs each) buys one node, not
// five, and says which quota binds (LimitedByQuotas); a second buffer of
// the namespace gets none. Before, a buffer bought nodes past every quota
// (no pod, so no quota saw them).
func TestCapacityBufferCappedByResourceQuota(t *testing.T) {
	e, f, g := bufferEnv(t, 0, 10)
	f.quotas = map[string][]*apiv1.ResourceQuota{"default": {{
		ObjectMeta: metav1.ObjectMeta{Name: "gpus", Namespace: "default"},
		Spec:       apiv1.ResourceQuotaSpec{Hard: apiv1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse("16")}},
		Status:     apiv1.ResourceQuotaStatus{Used: apiv1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse("8")}},
	}}}
	f.add(buffer("warm", "gpu", 5, e.clock.Now()), buffer("more", "gpu", 2, e.clock.Now().Add(time.Second)))
	e.run()
	if got := targetOf(t, g); got != 1 {
		t.Fatalf("target %d, want 1 node: the quota leaves 8 GPUs", got)
	}
	f.wantCond(t, "warm", capacitybuffer.ConditionLimitedByQuotas, metav1.ConditionTrue, capacitybuffer.ReasonQuotaLimited,
		"1 of its 5 chunks: ResourceQuota gpus leaves 8 of requests.nvidia.com/gpu, 8 a pod")
	f.wantCond(t, "more", capacitybuffer.ConditionLimitedByQuotas, metav1.ConditionTrue, capacitybuffer.ReasonQuotaLimited, "0 of its 2 chunks")
	if b := f.get(t, "warm"); b.Status.Replicas == nil || *b.Status.Replicas != 1 {
		t.Fatalf("status replicas %v, want 1", b.Status.Replicas)
	}
	// The quota raised: every chunk, and the condition says so.
	f.mu.Lock()
	f.quotas["default"][0].Spec.Hard["requests.nvidia.com/gpu"] = resource.MustParse("80")
	f.mu.Unlock()
	e.run()
	f.wantCond(t, "warm", capacitybuffer.ConditionLimitedByQuotas, metav1.ConditionFalse, capacitybuffer.ReasonQuotaNotLimited, "leave room")
	if got := targetOf(t, g); got != 7 {
		t.Fatalf("target %d once the quota leaves room, want 7 (5 + 2 chunks)", got)
	}
}
