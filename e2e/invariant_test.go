package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// The never-kill invariant, held by every scenario of the suite: the
// autoscaler never kills a running pod without an eviction that gave it its
// grace. It has two halves.
//
//   - At the moment a VM starts deleting (the simulator's DeletionWatcher,
//     called while ARM handles the request, before the autoscaler hears the
//     answer; in Azure the machine's processes die then), no pod bound to
//     its node may still be alive: every pod on it must be a DaemonSet or
//     mirror pod, have finished (Succeeded, Failed), or be past its
//     deletionTimestamp (its grace ran out: the kubelet would have killed
//     it anyway). Attributed to the scale set.
//   - Every pod evicted through the Eviction API (condition DisruptionTarget,
//     reason EvictionByEvictionAPI) is given its own grace period,
//     min(terminationGracePeriodSeconds, --max-graceful-termination-sec), as
//     its deletionGracePeriodSeconds. Attributed to the scenario by the
//     pod's namespace; pods of other namespaces (balloon namespaces, whose
//     placeholders are evicted with none by design) are not checked.
//
// A scenario's cleanup fails the test for every violation recorded for its
// scale sets and namespace, once its autoscalers are stopped. Deletions
// made by Go calls to the simulator (SetCapacity) are not ARM requests and
// are not checked; nor are Spot evictions (EvictSpotVMs: Azure's doing).
// A Spot VM deallocated by an eviction runs nothing: its deletion by the
// autoscaler kills nothing, whatever pods are still bound to its departed
// node (the pod garbage collector takes them later).

const (
	// defaultMaxGracefulTerminationSec is the autoscaler's default
	// --max-graceful-termination-sec.
	defaultMaxGracefulTerminationSec = 600
	// defaultTerminationGracePeriodSec is the API server's default
	// terminationGracePeriodSeconds.
	defaultTerminationGracePeriodSec = 30
	// evictionReason is the DisruptionTarget condition's reason an eviction
	// through the Eviction API sets.
	evictionReason = "EvictionByEvictionAPI"
	// sentinelLabel marks the pod a scenario's cleanup creates to know the
	// pod informer has delivered every event before it.
	sentinelLabel = "e2e.vmss-autoscaler.io/never-kill-sentinel"
	// checkTimeout bounds a node's check (listing its pods, with retries).
	checkTimeout = 30 * time.Second
)

// violationKind is how a pod was treated against the invariant.
type violationKind int

const (
	// killed: running, not deleted, when its VM started deleting.
	killed violationKind = iota
	// cutShort: deleted (evicted or not), but its VM started deleting
	// before its grace ran out.
	cutShort
	// shortGrace: evicted with less than its own grace.
	shortGrace
	// unchecked: the node's pods could not be listed when its VM started
	// deleting, so nothing could be checked.
	unchecked
)

// violation is one breach of the never-kill invariant.
type violation struct {
	kind     violationKind
	pod      string // namespace/name; "" for unchecked
	phase    apiv1.PodPhase
	node     string
	scaleSet string
	// evicted: the pod had the DisruptionTarget/EvictionByEvictionAPI condition.
	evicted bool
	// deletionTimestamp and gracePeriod are the pod's, if it was deleted.
	deletionTimestamp *metav1.Time
	gracePeriod       *int64
	// own is the grace the pod was owed (shortGrace): terminationGracePeriodSeconds
	// capped by maxGrace, the scenario's --max-graceful-termination-sec.
	own, maxGrace int64
	at            time.Time // when the VM started deleting, or the eviction was seen
	err           error     // unchecked
}

func (v violation) String() string {
	at := v.at.Format("15:04:05.000")
	switch v.kind {
	case killed:
		return fmt.Sprintf("NEVER-KILL INVARIANT: pod %s (%s) was running on node %s when the autoscaler deleted its VM (scale set %s) at %s (no eviction)",
			v.pod, v.phase, v.node, v.scaleSet, at)
	case cutShort:
		how := "deleted without an eviction"
		if v.evicted {
			how = "evicted"
		}
		return fmt.Sprintf("NEVER-KILL INVARIANT: pod %s (%s) was %s (grace %s, deletionTimestamp %s) but its VM (node %s, scale set %s) was deleted at %s, %s before its grace ran out",
			v.pod, v.phase, how, seconds(v.gracePeriod), v.deletionTimestamp.UTC().Format(time.RFC3339), v.node, v.scaleSet, at,
			v.deletionTimestamp.Sub(v.at).Round(100*time.Millisecond))
	case shortGrace:
		return fmt.Sprintf("NEVER-KILL INVARIANT: pod %s was evicted with a grace of %s, its own is %ds (terminationGracePeriodSeconds capped at --max-graceful-termination-sec=%d), seen at %s",
			v.pod, seconds(v.gracePeriod), v.own, v.maxGrace, at)
	}
	return fmt.Sprintf("NEVER-KILL INVARIANT: the pods on node %s could not be listed when its VM (scale set %s) started deleting at %s, so nothing could be checked: %v",
		v.node, v.scaleSet, at, v.err)
}

func seconds(p *int64) string {
	if p == nil {
		return "none"
	}
	return strconv.FormatInt(*p, 10) + "s"
}

// neverKill checks the invariant for the whole suite: it is the simulator's
// DeletionWatcher (through filterHook) and runs a pod informer over all
// namespaces. Safe for concurrent use.
type neverKill struct {
	client kubernetes.Interface

	mu sync.Mutex
	// idle is signalled when inflight, the VMsDeleting calls running,
	// drops.
	idle     *sync.Cond
	inflight int
	bySet    map[string][]violation // by lower-cased scale set name
	byNS     map[string][]violation // eviction violations by namespace
	scen     map[string]*nsState    // the scenarios' namespaces
	checked  map[types.UID]bool     // evicted pods whose grace was checked
}

// nsState is what the invariant knows of a scenario's namespace.
type nsState struct {
	// maxGrace is the lowest --max-graceful-termination-sec the scenario's
	// autoscalers were started with (its default if none was given).
	maxGrace int64
	// sentinel is closed when the informer sees the sentinel pod.
	sentinel chan struct{}
}

func newNeverKill(client kubernetes.Interface) *neverKill {
	n := &neverKill{client: client, bySet: map[string][]violation{}, byNS: map[string][]violation{},
		scen: map[string]*nsState{}, checked: map[types.UID]bool{}}
	n.idle = sync.NewCond(&n.mu)
	return n
}

var _ armsim.DeletionWatcher = (*neverKill)(nil)

// start runs the pod informer until ctx ends; it returns once the
// informer has synced.
func (n *neverKill) start(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(n.client, 0)
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { n.podSeen(obj) },
		UpdateFunc: func(_, obj any) { n.podSeen(obj) },
		DeleteFunc: n.podGone,
	}); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("pod informer: cache not synced")
	}
	return nil
}

// register makes ns a scenario's namespace, whose evictions are checked.
func (n *neverKill) register(ns string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.scen[ns] = &nsState{maxGrace: defaultMaxGracefulTerminationSec}
}

// maxGrace records that an autoscaler of the scenario of ns was started
// with --max-graceful-termination-sec=sec: the lowest one given is the cap.
func (n *neverKill) maxGrace(ns string, sec int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if st := n.scen[ns]; st != nil && sec < st.maxGrace {
		st.maxGrace = sec
	}
}

// VMsDeleting checks the pods on the VMs' nodes (armsim.DeletionWatcher).
func (n *neverKill) VMsDeleting(ctx context.Context, vms []armsim.VM) {
	at := time.Now() // the machines' processes die now
	n.mu.Lock()
	n.inflight++
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.inflight--
		n.idle.Broadcast()
	}()
	// The check ends even if the caller hangs up.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
	defer cancel()
	for _, vm := range vms {
		if vm.Deallocated {
			continue // evicted: its processes died with the eviction
		}
		found := n.checkNode(ctx, vm, at)
		if len(found) == 0 {
			continue
		}
		for _, v := range found {
			klog.ErrorS(nil, v.String())
		}
		n.mu.Lock()
		key := strings.ToLower(vm.ScaleSet)
		n.bySet[key] = append(n.bySet[key], found...)
		n.mu.Unlock()
	}
}

// checkNode lists the pods bound to the VM's node, by a quorum read, and
// returns those the deletion at at kills.
func (n *neverKill) checkNode(ctx context.Context, vm armsim.VM, at time.Time) []violation {
	node := vm.NodeName()
	var pods *apiv1.PodList
	var lastErr error
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(), ResourceVersion: ""}
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, lastErr = n.client.CoreV1().Pods("").List(ctx, opts)
		return lastErr == nil, nil
	})
	if err != nil {
		return []violation{{kind: unchecked, node: node, scaleSet: vm.ScaleSet, at: at, err: errors.Join(err, lastErr)}}
	}
	var out []violation
	for i := range pods.Items {
		if v, ok := killedBy(&pods.Items[i], at); !ok {
			v.node, v.scaleSet = node, vm.ScaleSet
			out = append(out, v)
		}
	}
	return out
}

// killedBy judges a pod on a machine that starts deleting at at: ok when
// its death then breaks nothing, else the violation (without node and
// scale set).
func killedBy(p *apiv1.Pod, at time.Time) (violation, bool) {
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "DaemonSet" {
		return violation{}, true
	}
	if _, mirror := p.Annotations[apiv1.MirrorPodAnnotationKey]; mirror {
		return violation{}, true
	}
	if p.Status.Phase == apiv1.PodSucceeded || p.Status.Phase == apiv1.PodFailed {
		return violation{}, true
	}
	// deletionTimestamp has whole seconds on the wire, rounded down: a pod
	// at it may have a fraction of a second of grace left, which the
	// kubelet does not wait for either.
	if dt := p.DeletionTimestamp; dt != nil && !at.Before(dt.Time) {
		return violation{}, true
	}
	v := violation{kind: killed, pod: p.Namespace + "/" + p.Name, phase: p.Status.Phase, evicted: evicted(p),
		deletionTimestamp: p.DeletionTimestamp, gracePeriod: p.DeletionGracePeriodSeconds, at: at}
	if p.DeletionTimestamp != nil {
		v.kind = cutShort
	}
	return v, false
}

// evicted says whether the pod was evicted through the Eviction API.
func evicted(p *apiv1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == apiv1.DisruptionTarget && c.Reason == evictionReason {
			return true
		}
	}
	return false
}

// podSeen checks, once per pod, the grace of an eviction, and notes a
// scenario's sentinel.
func (n *neverKill) podSeen(obj any) {
	p, ok := obj.(*apiv1.Pod)
	if !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.scen[p.Namespace]
	if st == nil {
		return
	}
	if p.Labels[sentinelLabel] != "" {
		if st.sentinel != nil {
			close(st.sentinel)
			st.sentinel = nil
		}
		return
	}
	// No balloon.DefaultLabel exception: balloons live in balloon
	// namespaces, never checked here, and a scenario's pod labelled like one
	// is no balloon to the autoscaler (balloon.Options.IsBalloon) and is
	// owed its grace period like any other.
	if p.DeletionTimestamp == nil || !evicted(p) || n.checked[p.UID] {
		return
	}
	n.checked[p.UID] = true
	own := int64(defaultTerminationGracePeriodSec)
	if g := p.Spec.TerminationGracePeriodSeconds; g != nil {
		own = *g
	}
	want := min(own, st.maxGrace)
	if p.DeletionGracePeriodSeconds != nil && *p.DeletionGracePeriodSeconds >= want {
		return
	}
	v := violation{kind: shortGrace, pod: p.Namespace + "/" + p.Name, phase: p.Status.Phase, node: p.Spec.NodeName, evicted: true,
		deletionTimestamp: p.DeletionTimestamp, gracePeriod: p.DeletionGracePeriodSeconds, own: want, maxGrace: st.maxGrace, at: time.Now()}
	klog.ErrorS(nil, v.String())
	n.byNS[p.Namespace] = append(n.byNS[p.Namespace], v)
}

func (n *neverKill) podGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if p, ok := obj.(*apiv1.Pod); ok {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.checked, p.UID)
	}
}

// settle waits until no VMsDeleting call is running and the pod informer
// has delivered every event up to now in ns (it creates a sentinel pod
// there, which never runs, and waits to see it: one watch delivers events
// in order). It may be called more than once.
func (n *neverKill) settle(ctx context.Context, ns string) error {
	n.mu.Lock()
	for n.inflight > 0 {
		n.idle.Wait() // calls end within checkTimeout
	}
	st := n.scen[ns]
	if st == nil {
		n.mu.Unlock()
		return fmt.Errorf("namespace %s is not a scenario's", ns)
	}
	seen := make(chan struct{})
	st.sentinel = seen
	n.mu.Unlock()

	pod := &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "never-kill-sentinel-", Namespace: ns, Labels: map[string]string{sentinelLabel: "true"}},
		Spec: apiv1.PodSpec{
			// Never scheduled, never run.
			SchedulingGates:              []apiv1.PodSchedulingGate{{Name: sentinelLabel}},
			AutomountServiceAccountToken: new(false),
			SecurityContext: &apiv1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(65534)),
				SeccompProfile: &apiv1.SeccompProfile{Type: apiv1.SeccompProfileTypeRuntimeDefault}},
			Containers: []apiv1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				SecurityContext: &apiv1.SecurityContext{AllowPrivilegeEscalation: new(false),
					Capabilities: &apiv1.Capabilities{Drop: []apiv1.Capability{"ALL"}}}}},
		},
	}
	if _, err := n.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the sentinel pod: %w", err)
	}
	select {
	case <-seen:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the pod informer to see the sentinel pod: %w", ctx.Err())
	}
}

// take removes and returns the violations recorded for the scale sets and
// the namespace.
func (n *neverKill) take(ns string, sets []string) []violation {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []violation
	for _, s := range sets {
		key := strings.ToLower(s)
		out = append(out, n.bySet[key]...)
		delete(n.bySet, key)
	}
	out = append(out, n.byNS[ns]...)
	delete(n.byNS, ns)
	slices.SortStableFunc(out, func(a, b violation) int { return a.at.Compare(b.at) })
	return out
}

// unregister forgets a scenario's namespace.
func (n *neverKill) unregister(ns string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.scen, ns)
	delete(n.byNS, ns)
}

// maxGraceFlag returns the value of --max-graceful-termination-sec among
// args (the last one given), if any.
func maxGraceFlag(args []string) (int64, bool, error) {
	const name = "--max-graceful-termination-sec"
	var val string
	found := false
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, name+"="):
			val, found = strings.TrimPrefix(a, name+"="), true
		case a == name && i+1 < len(args):
			val, found = args[i+1], true
		}
	}
	if !found {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(val, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%s=%q: %w", name, val, err)
	}
	return n, true, nil
}

// neverKillViolations takes the never-kill violations recorded so far for
// the scenario's scale sets and namespace: they are no longer reported
// when the scenario ends. For a test that provokes one on purpose.
func (sc *scenario) neverKillViolations() []violation {
	return sc.s.never.take(sc.ns, sc.sets)
}

// checkNeverKill fails the test for every never-kill violation recorded for
// the scenario. Its autoscalers must be stopped: it waits for the checks
// of deletions under way and for the pod informer to catch up first.
func (sc *scenario) checkNeverKill() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sc.s.never.settle(ctx, sc.ns); err != nil {
		sc.t.Errorf("NEVER-KILL INVARIANT: evictions at the end of the scenario may be unchecked: %v", err)
	}
	for _, v := range sc.s.never.take(sc.ns, sc.sets) {
		sc.t.Error(v.String())
	}
	sc.s.never.unregister(sc.ns)
}

// runningPodOf runs app, a Deployment of one replica on the scale set, and
// returns its pod once Running.
func (sc *scenario) runningPodOf(app, set string) apiv1.Pod {
	sc.t.Helper()
	sc.workload(app, 1, "1", 0, set)
	var pod apiv1.Pod
	sc.eventually(app+" Running", time.Minute, func() (bool, string) {
		pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Status.Phase == apiv1.PodRunning && p.DeletionTimestamp == nil {
				pod = p
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items))
	})
	return pod
}

// staticToken is an ARM credential handing out a fixed bearer token (the
// simulator takes any).
type staticToken string

func (s staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: string(s), ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// armScaleSets is an armcompute client of the simulator, as a user (or an
// operator's script) would call ARM, besides the autoscaler.
func (sc *scenario) armScaleSets() *armcompute.VirtualMachineScaleSetsClient {
	sc.t.Helper()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: sc.s.sim.CertPool(), MinVersion: tls.VersionTLS12}}}
	sc.t.Cleanup(hc.CloseIdleConnections)
	client, err := armcompute.NewVirtualMachineScaleSetsClient(subscription, staticToken("e2e-token-"+sc.prefix), &arm.ClientOptions{
		ClientOptions: policy.ClientOptions{
			Cloud: cloud.Configuration{Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
				cloud.ResourceManager: {Endpoint: sc.s.sim.URL(), Audience: sc.s.sim.URL()},
			}},
			Transport: hc,
			Retry:     policy.RetryOptions{MaxRetries: -1},
		},
	})
	if err != nil {
		sc.t.Fatal(err)
	}
	return client
}

// readyNode waits for the set's one node to be Ready and returns its name.
func (sc *scenario) readyNode(set string) string {
	sc.t.Helper()
	sc.eventually("the node of "+set+" Ready", time.Minute, func() (bool, string) {
		n := sc.readyNodesOf()[set]
		return n == 1, fmt.Sprintf("%d Ready nodes", n)
	})
	return sc.nodeNames(set)[0]
}

// barePod runs a pod without a controller on node (bound by nodeName),
// whose process takes exitDelay to exit on SIGTERM ("" for at once), and
// returns it once Running.
func (sc *scenario) barePod(name, node, exitDelay string, grace int64) *apiv1.Pod {
	sc.t.Helper()
	pod := &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sc.ns},
		Spec: apiv1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &grace,
			Containers: []apiv1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("100m")}}}},
		},
	}
	if exitDelay != "" {
		pod.Annotations = map[string]string{harness.PodDeleteDelayAnnotation: exitDelay}
	}
	pods := sc.s.cp.Client.CoreV1().Pods(sc.ns)
	if _, err := pods.Create(sc.ctx, pod, metav1.CreateOptions{}); err != nil {
		sc.t.Fatal(err)
	}
	sc.eventually(name+" Running", time.Minute, func() (bool, string) {
		p, err := pods.Get(sc.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return p.Status.Phase == apiv1.PodRunning, string(p.Status.Phase)
	})
	return pod
}

// The never-kill invariant fails when it should. With no autoscaler, on
// one node: a Deployment's pod runs; a pod whose process takes 60 s to
// exit is evicted with its grace of 30 s; another is evicted with a grace
// of 1 s though its own is 30 s. The VM is then deleted through ARM. The
// invariant has recorded, by the time ARM answers, exactly: the first pod
// killed without an eviction, the second cut short with ~30 s of its grace
// left, and the third evicted with too little grace. They are taken, so
// the scenario's own check passes.
func TestNeverKillInvariantCatchesAKill(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	set := sc.scaleSet("cpu", "Standard_D16s_v5", 1, nil)
	node := sc.readyNode(set)
	victim := sc.runningPodOf("victim", set)
	if victim.Spec.NodeName != node {
		t.Fatalf("victim on %q, want %s", victim.Spec.NodeName, node)
	}
	slow := sc.barePod("slow", node, "60s", 30)
	short := sc.barePod("short", node, "", 30)
	evict := func(name string, grace int64) {
		must(t, sc.s.cp.Client.PolicyV1().Evictions(sc.ns).Evict(sc.ctx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: name, Namespace: sc.ns},
			DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: &grace},
		}))
	}
	evict(slow.Name, 30)
	evict(short.Name, 1)
	// short is gone (its process exits at once), so its VM's deletion does
	// not cut it short too; the informer has seen both evictions; slow is
	// terminating still.
	sc.eventually(short.Name+" gone", 30*time.Second, func() (bool, string) {
		_, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, short.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	must(t, sc.s.never.settle(sc.ctx, sc.ns))
	cur, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).Get(sc.ctx, slow.Name, metav1.GetOptions{})
	must(t, err)
	if cur.DeletionTimestamp == nil {
		t.Fatalf("pod %s not terminating after its eviction", slow.Name)
	}

	st, err := sc.s.sim.ScaleSet(sc.rg, set)
	must(t, err)
	if len(st.VMs) != 1 || strings.ToLower(st.VMs[0].ComputerName) != node {
		t.Fatalf("scale set VMs %+v, want one, of node %s", st.VMs, node)
	}
	deleted := time.Now()
	_, err = sc.armScaleSets().BeginDeleteInstances(sc.ctx, sc.rg, set,
		armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{&st.VMs[0].InstanceID}}, nil)
	must(t, err)

	got := sc.neverKillViolations()
	var lines []string
	for _, v := range got {
		lines = append(lines, v.String())
	}
	t.Logf("violations recorded:\n%s", strings.Join(lines, "\n"))
	if len(got) != 3 {
		t.Fatalf("%d violations recorded, want 3", len(got))
	}
	byPod := map[string]violation{}
	for _, v := range got {
		byPod[v.pod] = v
	}
	want := []struct {
		pod     string
		kind    violationKind
		evicted bool
		text    string
	}{
		{victim.Name, killed, false, fmt.Sprintf("NEVER-KILL INVARIANT: pod %s/%s (Running) was running on node %s when the autoscaler deleted its VM (scale set %s)", sc.ns, victim.Name, node, set)},
		{slow.Name, cutShort, true, fmt.Sprintf("NEVER-KILL INVARIANT: pod %s/%s (Running) was evicted (grace 30s, ", sc.ns, slow.Name)},
		{short.Name, shortGrace, true, fmt.Sprintf("NEVER-KILL INVARIANT: pod %s/%s was evicted with a grace of 1s, its own is 30s", sc.ns, short.Name)},
	}
	for _, w := range want {
		v, ok := byPod[sc.ns+"/"+w.pod]
		switch {
		case !ok:
			t.Errorf("no violation for pod %s", w.pod)
			continue
		case v.kind != w.kind || v.evicted != w.evicted || v.node != node:
			t.Errorf("pod %s: kind %d, evicted %v, node %s; want kind %d, evicted %v, node %s", w.pod, v.kind, v.evicted, v.node, w.kind, w.evicted, node)
		case !strings.HasPrefix(v.String(), w.text):
			t.Errorf("pod %s: message %q, want it to begin %q", w.pod, v.String(), w.text)
		}
		if w.kind != shortGrace && v.scaleSet != set {
			t.Errorf("pod %s: scale set %q, want %s", w.pod, v.scaleSet, set)
		}
	}
	if v := byPod[sc.ns+"/"+slow.Name]; v.deletionTimestamp != nil {
		// Evicted at most a few seconds before, with 30 s of grace.
		if left := v.deletionTimestamp.Sub(deleted); left < 20*time.Second || left > 30*time.Second {
			t.Errorf("slow had %s of grace left when its VM was deleted, want 20-30 s", left)
		}
	}
	if left := sc.neverKillViolations(); len(left) != 0 {
		t.Errorf("violations left after taking them: %v", left)
	}
}

// kwok takes a deleted pod's time: a pod whose process exits 6 s after
// SIGTERM, under a grace of 30 s, goes after 6 s; one whose process would
// take 60 s, under a grace of 3 s, goes when its grace runs out (the
// kubelet's SIGKILL). Bounds are measured around the deletion so that a
// slow machine can only make a pod look longer-lived when it is not the
// pod that is slow: a pod gone early always shows.
func TestKwokPodTerminationTakesItsTime(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	set := sc.scaleSet("kwok", "Standard_D16s_v5", 1, nil)
	node := sc.readyNode(set)
	type watched struct {
		name, exitDelay          string
		grace                    int64
		before, after            time.Time // around the DELETE call
		lastSeen, goneAt         time.Time // a GET started at lastSeen found it; one answered at goneAt did not
		minPresent, minGone, max time.Duration
	}
	pods := []*watched{
		// Its process exits at 6 s: still there at 4 s (measured after the
		// DELETE), not gone before 6 s (measured before it), gone well
		// before its grace ends (not a random time up to it).
		{name: "exits-at-6s", exitDelay: "6s", grace: 30, minPresent: 4 * time.Second, minGone: 6 * time.Second, max: 20 * time.Second},
		// Killed at its grace end, 3 s rounded down to a whole second of
		// deletionTimestamp: more than 2 s, far less than the 60 s its
		// process would take.
		{name: "killed-at-3s", exitDelay: "60s", grace: 3, minGone: 2 * time.Second, max: 20 * time.Second},
	}
	for _, w := range pods {
		sc.barePod(w.name, node, w.exitDelay, 30)
	}
	client := sc.s.cp.Client.CoreV1().Pods(sc.ns)
	for _, w := range pods {
		w.before = time.Now()
		must(t, client.Delete(sc.ctx, w.name, metav1.DeleteOptions{GracePeriodSeconds: &w.grace}))
		w.after = time.Now()
	}
	sc.eventually("both pods gone", 30*time.Second, func() (bool, string) {
		left := 0
		for _, w := range pods {
			if !w.goneAt.IsZero() {
				continue
			}
			start := time.Now()
			_, err := client.Get(sc.ctx, w.name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				w.goneAt = time.Now()
			case err == nil:
				w.lastSeen = start
				left++
			default:
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d pods left", left)
	})
	for _, w := range pods {
		present, gone := w.lastSeen.Sub(w.after), w.goneAt.Sub(w.before)
		t.Logf("%s (exits after %s, grace %ds): seen %s after its deletion, gone %s after", w.name, w.exitDelay, w.grace,
			present.Round(time.Millisecond), gone.Round(time.Millisecond))
		switch {
		case w.lastSeen.IsZero():
			t.Errorf("%s: never seen after its deletion", w.name)
		case present < w.minPresent:
			t.Errorf("%s: last seen %s after its deletion, want it there at %s at least", w.name, present, w.minPresent)
		}
		if gone < w.minGone || gone > w.max {
			t.Errorf("%s: gone %s after its deletion, want between %s and %s", w.name, gone, w.minGone, w.max)
		}
	}
}

// The never-kill rules for one pod on a machine that starts deleting.
func TestNeverKillJudgesPods(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 500e6, time.UTC)
	ts := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: at.Add(d).Truncate(time.Second)} }
	evictedCond := []apiv1.PodCondition{{Type: apiv1.DisruptionTarget, Status: apiv1.ConditionTrue, Reason: evictionReason}}
	tests := []struct {
		name string
		pod  apiv1.Pod
		ok   bool
		kind violationKind
	}{
		{"running", apiv1.Pod{Status: apiv1.PodStatus{Phase: apiv1.PodRunning}}, false, killed},
		{"pending, bound", apiv1.Pod{Status: apiv1.PodStatus{Phase: apiv1.PodPending}}, false, killed},
		{"DaemonSet", apiv1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{
			{Kind: "DaemonSet", Name: "ds", Controller: new(true)}}}, Status: apiv1.PodStatus{Phase: apiv1.PodRunning}}, true, 0},
		{"owned by a DaemonSet, not its controller", apiv1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{
			{Kind: "DaemonSet", Name: "ds"}}}, Status: apiv1.PodStatus{Phase: apiv1.PodRunning}}, false, killed},
		{"mirror", apiv1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{apiv1.MirrorPodAnnotationKey: "x"}}}, true, 0},
		{"succeeded", apiv1.Pod{Status: apiv1.PodStatus{Phase: apiv1.PodSucceeded}}, true, 0},
		{"failed", apiv1.Pod{Status: apiv1.PodStatus{Phase: apiv1.PodFailed}}, true, 0},
		{"evicted, grace over", apiv1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ts(-time.Second)},
			Status: apiv1.PodStatus{Phase: apiv1.PodRunning, Conditions: evictedCond}}, true, 0},
		{"evicted, grace ends this second", apiv1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ts(0)},
			Status: apiv1.PodStatus{Phase: apiv1.PodRunning, Conditions: evictedCond}}, true, 0},
		{"evicted, grace left", apiv1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ts(time.Second)},
			Status: apiv1.PodStatus{Phase: apiv1.PodRunning, Conditions: evictedCond}}, false, cutShort},
		{"deleted, grace left", apiv1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ts(10 * time.Second)},
			Status: apiv1.PodStatus{Phase: apiv1.PodRunning}}, false, cutShort},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, ok := killedBy(&tt.pod, at)
			if ok != tt.ok || (!ok && v.kind != tt.kind) {
				t.Fatalf("killedBy = %v (kind %d), want ok %v (kind %d)", ok, v.kind, tt.ok, tt.kind)
			}
		})
	}
}

func TestMaxGraceFlag(t *testing.T) {
	tests := []struct {
		args    []string
		want    int64
		found   bool
		wantErr bool
	}{
		{nil, 0, false, false},
		{[]string{"--nodes=0:5:x", "--max-graceful-termination-sec=5"}, 5, true, false},
		{[]string{"--max-graceful-termination-sec", "7"}, 7, true, false},
		{[]string{"--max-graceful-termination-sec=5", "--max-graceful-termination-sec=9"}, 9, true, false},
		{[]string{"--max-graceful-termination-sec=x"}, 0, false, true},
	}
	for _, tt := range tests {
		got, found, err := maxGraceFlag(tt.args)
		if got != tt.want || found != tt.found || (err != nil) != tt.wantErr {
			t.Errorf("maxGraceFlag(%q) = %d, %v, %v; want %d, %v, error %v", tt.args, got, found, err, tt.want, tt.found, tt.wantErr)
		}
	}
}
