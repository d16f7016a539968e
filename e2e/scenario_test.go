package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// scenario is one test's slice of the suite: its own resource group of
// scale sets, namespace and autoscaler processes.
type scenario struct {
	t      *testing.T
	ctx    context.Context
	s      *suite
	ns     string
	rg     string
	prefix string
	sets   []string
	mu     sync.Mutex // procs and addrs, added to by supervisors
	procs  []*harness.Process
	addrs  map[*harness.Process]string
	// failover: the autoscalers get a 4 s lease (3 s renew deadline), for
	// scenarios that kill or freeze a leader and wait for another to take
	// over. Others get a 15 s lease: scenarios run in parallel on two
	// CPUs, and a leader that misses its renew deadline exits.
	failover bool
}

var nonAlnum = regexp.MustCompile(`[^a-z0-9]+`)

func newScenario(t *testing.T) *scenario {
	t.Helper()
	if theSuite == nil {
		t.Fatal("suite not started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	short := nonAlnum.ReplaceAllString(strings.ToLower(strings.TrimPrefix(t.Name(), "Test")), "")
	if len(short) > 20 {
		short = short[:20]
	}
	if n := theSuite.run(short); n > 1 {
		short = short[:min(len(short), 17)] + strconv.Itoa(n)
	}
	ns, err := theSuite.cp.NewNamespace(ctx, "e2e-"+short)
	if err != nil {
		t.Fatal(err)
	}
	theSuite.never.register(ns)
	sc := &scenario{t: t, ctx: ctx, s: theSuite, ns: ns, rg: "MC_e2e_" + short + "_eastus", prefix: short, addrs: map[*harness.Process]string{}}
	t.Cleanup(func() {
		cancel() // supervisors start nothing more
		sc.mu.Lock()
		procs := append([]*harness.Process(nil), sc.procs...)
		sc.mu.Unlock()
		for _, p := range procs {
			_ = p.Stop()
		}
		// Every scenario holds the never-kill invariant: checked once its
		// autoscalers are stopped, before its pods go with the namespace.
		sc.checkNeverKill()
		if t.Failed() {
			t.Log(theSuite.cp.LogHint())
			for _, p := range procs {
				t.Logf("autoscaler log: %s", p.LogFile)
			}
		}
		_ = theSuite.cp.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	return sc
}

// scaleSet adds a scale set to the scenario's resource group and returns its name.
func (sc *scenario) scaleSet(name, sku string, capacity int, tags map[string]string) string {
	sc.t.Helper()
	full := sc.prefix + "-" + name
	if err := sc.s.sim.AddScaleSet(armsim.ScaleSetSpec{ResourceGroup: sc.rg, Name: full, SKU: sku, Capacity: capacity, Tags: tags}); err != nil {
		sc.t.Fatal(err)
	}
	sc.sets = append(sc.sets, full)
	return full
}

// autoscaler starts the binary with the scenario's flags plus extra ones.
func (sc *scenario) autoscaler(name string, extra ...string) *harness.Process {
	sc.t.Helper()
	p, err := sc.startAutoscaler(name, extra...)
	if err != nil {
		sc.t.Fatal(err)
	}
	return p
}

// startAutoscaler is autoscaler without failing the test (for goroutines).
func (sc *scenario) startAutoscaler(name string, extra ...string) (*harness.Process, error) {
	port, err := freePortErr()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{
		"--kubeconfig=" + sc.s.cp.Kubeconfig,
		"--namespace=" + sc.ns,
		"--leader-elect-resource-name=vmss-autoscaler",
		"--address=" + addr,
		"--azure-subscription-id=" + subscription,
		"--azure-resource-groups=" + sc.rg,
		"--azure-arm-endpoint=" + sc.s.sim.URL(),
		"--azure-ca-file=" + sc.s.caFile,
		"--azure-auth=token-file",
		"--azure-token-file=" + sc.s.tokenFile,
		"--azure-cache-ttl=1s",
		// VM lists compressed as the cache is (5 min and 1 min in
		// production, 300 per 30 minutes).
		"--azure-vm-list-interval=5s", "--azure-vm-list-active-interval=1s", "--azure-vm-list-budget=10000",
		"--azure-operation-poll-interval=1s",
		"--scan-interval=1s",
		// The follow-up pace compressed with the scan interval (5 s in
		// production). The suite's simulator throttles as Azure does
		// (the Compute RP's per-scale-set and subscription buckets,
		// armsim.ComputePolicies), uncompressed: a scale set's 12
		// Update tokens refilled 4 a minute bind a set written every
		// second, and the provider's pacing near the floor and the
		// queue's merged writes are exercised by every scale-up.
		"--node-group-write-interval=1s",
		"--new-pod-scale-up-delay=0s",
		"--kube-client-qps=100", "--kube-client-burst=200",
		"-v=2",
	}
	if grace, ok, err := maxGraceFlag(extra); err != nil {
		return nil, err
	} else if ok {
		sc.s.never.maxGrace(sc.ns, grace) // evictions are owed no more
	}
	if sc.failover {
		args = append(args, "--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms")
	} else {
		args = append(args, "--leader-elect-lease-duration=15s", "--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=2s")
	}
	p, err := sc.s.cp.StartProcess(sc.ctx, sc.prefix+"-"+name, sc.s.autoscaler, append(args, extra...)...)
	if err != nil {
		return nil, err
	}
	sc.track(p, addr)
	return p, nil
}

// track records a process the scenario started, serving on addr: stopped
// at the end, its log named when the test fails.
func (sc *scenario) track(p *harness.Process, addr string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.procs = append(sc.procs, p)
	sc.addrs[p] = addr
}

// workload creates a Deployment whose pods may only land on the given scale sets.
func (sc *scenario) workload(name string, replicas int32, cpu string, gpus int64, sets ...string) {
	sc.t.Helper()
	sc.create(sc.deployment(name, replicas, cpu, gpus, sets...))
}

func (sc *scenario) create(d *appsv1.Deployment) {
	sc.t.Helper()
	if _, err := sc.s.cp.Client.AppsV1().Deployments(sc.ns).Create(sc.ctx, d, metav1.CreateOptions{}); err != nil {
		sc.t.Fatal(err)
	}
}

// deployment builds a Deployment of pause pods limited to the scale sets.
func (sc *scenario) deployment(name string, replicas int32, cpu string, gpus int64, sets ...string) *appsv1.Deployment {
	req := apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse(cpu), apiv1.ResourceMemory: resource.MustParse("1Gi")}
	if gpus > 0 {
		req[armsim.GPUResource] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	lim := apiv1.ResourceList{}
	if gpus > 0 {
		lim[armsim.GPUResource] = req[armsim.GPUResource]
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sc.ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: apiv1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: apiv1.PodSpec{
					Containers: []apiv1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
						Resources: apiv1.ResourceRequirements{Requests: req, Limits: lim}}},
					Affinity: &apiv1.Affinity{NodeAffinity: &apiv1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &apiv1.NodeSelector{NodeSelectorTerms: []apiv1.NodeSelectorTerm{{
							MatchExpressions: []apiv1.NodeSelectorRequirement{{Key: armsim.NodeGroupLabel, Operator: apiv1.NodeSelectorOpIn, Values: sets}},
						}}},
					}},
				},
			},
		},
	}
	return d
}

// eventually polls cond every 250ms until it holds or the timeout passes.
func (sc *scenario) eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	sc.t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			sc.t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, last)
		}
		select {
		case <-sc.ctx.Done():
			sc.t.Fatal(sc.ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// running counts the scenario's Running pods.
func (sc *scenario) podPhases() map[apiv1.PodPhase]int {
	pods, err := sc.s.cp.Client.CoreV1().Pods(sc.ns).List(sc.ctx, metav1.ListOptions{})
	if err != nil {
		sc.t.Fatal(err)
	}
	out := map[apiv1.PodPhase]int{}
	for _, p := range pods.Items {
		out[p.Status.Phase]++
	}
	return out
}

// nodesOf counts the nodes (registered, Ready or not) per scale set of the scenario.
func (sc *scenario) nodesOf() map[string]int {
	return sc.countNodes(func(*apiv1.Node) bool { return true })
}

// readyNodesOf counts the Ready nodes per scale set of the scenario.
func (sc *scenario) readyNodesOf() map[string]int {
	return sc.countNodes(func(n *apiv1.Node) bool {
		for _, c := range n.Status.Conditions {
			if c.Type == apiv1.NodeReady {
				return c.Status == apiv1.ConditionTrue
			}
		}
		return false
	})
}

func (sc *scenario) countNodes(keep func(*apiv1.Node) bool) map[string]int {
	out := map[string]int{}
	for _, n := range sc.nodeList() {
		if keep(&n) {
			out[n.Labels[armsim.NodeGroupLabel]]++
		}
	}
	return out
}

// nodeList lists the nodes of the scenario's scale sets (or of the sets
// given) by their node-group label: scenarios run in parallel, and a poll
// every 250 ms of every node in the cluster is load on the API server.
func (sc *scenario) nodeList(sets ...string) []apiv1.Node {
	if len(sets) == 0 {
		sets = sc.sets
	}
	if len(sets) == 0 {
		return nil
	}
	sel := armsim.NodeGroupLabel + " in (" + strings.Join(sets, ",") + ")"
	nodes, err := sc.s.cp.Client.CoreV1().Nodes().List(sc.ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		sc.t.Fatal(err)
	}
	return nodes.Items
}

func (sc *scenario) capacity(set string) int {
	st, err := sc.s.sim.ScaleSet(sc.rg, set)
	if err != nil {
		sc.t.Fatal(err)
	}
	return st.Capacity
}

// events lists the scenario namespace's events with a reason.
func (sc *scenario) events(reason string) []apiv1.Event {
	evs, err := sc.s.cp.Client.CoreV1().Events(sc.ns).List(sc.ctx, metav1.ListOptions{})
	if err != nil {
		sc.t.Fatal(err)
	}
	var out []apiv1.Event
	for _, e := range evs.Items {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// addr is the metrics and health address of one of the scenario's autoscalers.
func (sc *scenario) addr(p *harness.Process) string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.addrs[p]
}

// ownARMToken gives the scenario's autoscalers an ARM token of their own:
// the flag to pass them and the caller the simulator names them by, to
// throttle them alone (armsim ThrottleCaller) or tell their writes apart.
func (sc *scenario) ownARMToken(name string) (flag, caller string) {
	sc.t.Helper()
	token := "e2e-token-" + sc.prefix + "-" + name
	file := filepath.Join(sc.t.TempDir(), "arm-token-"+name)
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		sc.t.Fatal(err)
	}
	return "--azure-token-file=" + file, armsim.CallerOf(token)
}

func (sc *scenario) get(p *harness.Process, path string) (int, string) {
	addr := sc.addr(p)
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (sc *scenario) logContains(p *harness.Process, s string) bool {
	b, err := os.ReadFile(p.LogFile)
	return err == nil && strings.Contains(string(b), s)
}

func allRunning(sc *scenario, want int) func() (bool, string) {
	return func() (bool, string) {
		ph := sc.podPhases()
		return ph[apiv1.PodRunning] == want, fmt.Sprintf("pods %v, nodes %v", ph, sc.nodesOf())
	}
}

// metricValue reads an unlabelled sample from a Prometheus text body, or -1.
func metricValue(body, name string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return -1
}
