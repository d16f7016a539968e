package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

// testTimeout bounds the whole package run, including a cold build of the
// control plane binaries (5-8 minutes on 2 cores).
const testTimeout = 35 * time.Minute

// keep keeps the control plane directory (logs, certificates, kubeconfig)
// after a successful run; it is always kept after a failure.
var keep = flag.Bool("keep", false, "keep the control plane directory after a successful run")

// shared is the control plane that TestMain starts for all tests of the
// package; nil in -short mode.
var shared *ControlPlane

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

// runTests builds the binaries, starts one control plane, runs the tests,
// stops the control plane and checks that everything has exited.
func runTests(m *testing.M) int {
	if testing.Short() {
		fmt.Println("harness: -short: not starting a control plane; tests that need one are skipped")
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	begin := time.Now()
	bins, err := BuildBinaries(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	fmt.Printf("harness: binaries ready in %s\n", time.Since(begin).Round(time.Millisecond))

	begin = time.Now()
	cp, err := Start(ctx, bins, Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	fmt.Printf("harness: control plane started in %s\n", time.Since(begin).Round(time.Millisecond))
	shared = cp

	code := m.Run()

	begin = time.Now()
	cp.Stop()
	fmt.Printf("harness: control plane stopped in %s\n", time.Since(begin).Round(time.Millisecond))
	if err := checkStopped(cp); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: after Stop: %v\n", err)
		code = 1
	}
	if code != 0 {
		fmt.Fprintln(os.Stderr, cp.LogHint())
		return code
	}
	if *keep {
		fmt.Println(cp.LogHint())
		return code
	}
	if err := os.RemoveAll(cp.Dir); err != nil {
		fmt.Fprintf(os.Stderr, "harness: removing %s: %v\n", cp.Dir, err)
	}
	return code
}

// checkStopped verifies that every process has exited and etcd is closed.
func checkStopped(cp *ControlPlane) error {
	var errs []error
	cp.mu.Lock()
	procs := append(append([]*Process(nil), cp.core...), cp.extra...)
	cp.mu.Unlock()
	if len(cp.core) != 4 {
		errs = append(errs, fmt.Errorf("want 4 control plane processes, have %d", len(cp.core)))
	}
	for _, p := range procs {
		if !p.exited() {
			errs = append(errs, fmt.Errorf("%s (pid %d) is still running", p.Name, p.Pid()))
		}
	}
	select {
	case <-cp.etcd.Server.StopNotify():
	default:
		errs = append(errs, errors.New("etcd server has not stopped"))
	}
	for _, u := range cp.etcd.Config().ListenClientUrls {
		if conn, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
			_ = conn.Close()
			errs = append(errs, fmt.Errorf("etcd still accepts connections on %s", u.Host))
		}
	}
	if _, err := os.Stat(cp.etcdDataDir); !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("etcd data dir %s not removed (stat: %v)", cp.etcdDataDir, err))
	}
	return errors.Join(errs...)
}

// controlPlane returns the shared control plane, skipping the test in -short
// mode, and prints where the logs are if the test fails.
func controlPlane(t *testing.T) *ControlPlane {
	t.Helper()
	if shared == nil {
		t.Skip("no control plane in -short mode")
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(shared.LogHint())
		}
	})
	return shared
}

// pollUntil calls cond every 100ms until it returns true or timeout passes,
// then fails the test with the last message cond gave.
func pollUntil(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, msg)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("waiting for %s: %v", what, t.Context().Err())
		case <-ticker.C:
		}
	}
}

func TestServerVersionAndGangSchedulingAPI(t *testing.T) {
	cp := controlPlane(t)
	v, err := cp.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if v.GitVersion != KubeVersion || v.Major != kubeMajor || v.Minor != kubeMinor {
		t.Errorf("server version = %s (major %q, minor %q), want %s: version ldflags not applied", v.GitVersion, v.Major, v.Minor, KubeVersion)
	}
	resources, err := cp.Client.Discovery().ServerResourcesForGroupVersion("scheduling.k8s.io/v1alpha2")
	if err != nil {
		t.Fatalf("scheduling.k8s.io/v1alpha2 not served: %v", err)
	}
	served := map[string]bool{}
	for _, r := range resources.APIResources {
		served[r.Name] = true
	}
	for _, want := range []string{"workloads", "podgroups"} {
		if !served[want] {
			t.Errorf("scheduling.k8s.io/v1alpha2 does not serve %s; served: %v", want, served)
		}
	}
}

func TestNewNamespace(t *testing.T) {
	cp := controlPlane(t)
	ctx := t.Context()
	a, err := cp.NewNamespace(ctx, "ns-test")
	if err != nil {
		t.Fatal(err)
	}
	b, err := cp.NewNamespace(ctx, "ns-test")
	if err != nil {
		t.Fatal(err)
	}
	if a == b || !strings.HasPrefix(a, "ns-test-") {
		t.Errorf("NewNamespace gave %q and %q, want two distinct ns-test-* names", a, b)
	}
	for _, ns := range []string{a, b} {
		if err := cp.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
	}
}

// TestKwokNodeRunsDeployment checks the whole chain: kwok makes an annotated
// node Ready, the controller manager lifts its not-ready taint and creates
// the Deployment's pods, the scheduler binds them, kwok runs them.
func TestKwokNodeRunsDeployment(t *testing.T) {
	cp := controlPlane(t)
	ctx := t.Context()
	const replicas = 5
	begin := time.Now()

	nodeName := fmt.Sprintf("kwok-node-%d", time.Now().UnixNano()%1_000_000)
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        nodeName,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels: map[string]string{
				corev1.LabelHostname:           nodeName,
				corev1.LabelOSStable:           "linux",
				corev1.LabelArchStable:         "amd64",
				corev1.LabelInstanceTypeStable: "Standard_D8s_v5",
			},
		},
		Spec: corev1.NodeSpec{
			ProviderID: "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/e2e/providers/Microsoft.Compute/virtualMachineScaleSets/pool0/virtualMachines/0",
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating node: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Client.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), nodeName, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting node %s: %v", nodeName, err)
		}
	})

	pollUntil(t, time.Minute, "node "+nodeName+" Ready without the not-ready taint", func() (bool, string) {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		for _, taint := range n.Spec.Taints {
			if taint.Key == corev1.TaintNodeNotReady {
				return false, fmt.Sprintf("ready=%v, taints %v", ready, n.Spec.Taints)
			}
		}
		return ready, fmt.Sprintf("conditions %v", n.Status.Conditions)
	})
	t.Logf("node %s Ready after %s", nodeName, time.Since(begin).Round(time.Millisecond))

	ns, err := cp.NewNamespace(ctx, "kwok-deploy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Client.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
	})
	podLabels := map[string]string{"app": "sleepy"}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "sleepy", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](replicas),
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{corev1.LabelHostname: nodeName},
					Containers: []corev1.Container{{
						Name:  "app",
						Image: "registry.invalid/sleepy:1", // kwok pulls nothing
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU:    resource.MustParse("500m"),
							corev1.ResourceMemory: resource.MustParse("512Mi"),
						}},
					}},
				},
			},
		},
	}
	if _, err := cp.Client.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating deployment: %v", err)
	}
	deployed := time.Now()

	selector := labels.SelectorFromSet(podLabels).String()
	pollUntil(t, 2*time.Minute, fmt.Sprintf("%d pods Running on %s", replicas, nodeName), func() (bool, string) {
		pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		running := 0
		var states []string
		for _, p := range pods.Items {
			states = append(states, fmt.Sprintf("%s: node=%q phase=%s", p.Name, p.Spec.NodeName, p.Status.Phase))
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == nodeName {
				running++
			}
		}
		return running == replicas && len(pods.Items) == replicas, fmt.Sprintf("%d/%d running: %s", running, replicas, strings.Join(states, "; "))
	})
	t.Logf("%d pods Running %s after the Deployment was created", replicas, time.Since(deployed).Round(time.Millisecond))
}

// TestStartProcess checks the process management used for the autoscaler
// and simulators: graceful stop, escalation to SIGKILL, kill, logs.
func TestStartProcess(t *testing.T) {
	cp := controlPlane(t)
	ctx := t.Context()
	bin, err := BuildGoBinary(ctx, "./e2e/harness/testdata/sleeper", "harness-sleeper")
	if err != nil {
		t.Fatal(err)
	}
	waitForLog := func(p *Process, want string) {
		t.Helper()
		pollUntil(t, 30*time.Second, fmt.Sprintf("%q in %s", want, p.LogFile), func() (bool, string) {
			data, err := os.ReadFile(p.LogFile)
			return err == nil && strings.Contains(string(data), want), string(data)
		})
	}

	t.Run("graceful", func(t *testing.T) {
		p, err := cp.StartProcess(ctx, "sleeper-graceful", bin)
		if err != nil {
			t.Fatal(err)
		}
		if p.Pid() <= 0 {
			t.Errorf("Pid() = %d", p.Pid())
		}
		waitForLog(p, "ready")
		if err := p.Stop(); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		select {
		case <-p.Exited():
		default:
			t.Fatal("Exited() not closed after Stop")
		}
		if err := p.ExitErr(); err != nil {
			t.Errorf("ExitErr() = %v, want nil (exit 0 on SIGTERM)", err)
		}
		waitForLog(p, "got SIGTERM")
		if err := p.Stop(); err != nil {
			t.Errorf("second Stop: %v", err)
		}
	})

	t.Run("ignores SIGTERM", func(t *testing.T) {
		p, err := cp.StartProcess(ctx, "sleeper-stubborn", bin, "-ignore-term")
		if err != nil {
			t.Fatal(err)
		}
		waitForLog(p, "ready")
		begin := time.Now()
		if err := p.Stop(); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(begin); took < stopGracePeriod {
			t.Errorf("Stop returned after %s, before the %s grace period", took, stopGracePeriod)
		}
		var exitErr *exec.ExitError
		if err := p.ExitErr(); !errors.As(err, &exitErr) || !strings.Contains(exitErr.String(), "killed") {
			t.Errorf("ExitErr() = %v, want killed", err)
		}
	})

	t.Run("kill", func(t *testing.T) {
		p, err := cp.StartProcess(ctx, "sleeper-kill", bin)
		if err != nil {
			t.Fatal(err)
		}
		waitForLog(p, "ready")
		if err := p.Kill(); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		<-p.Exited()
		if p.ExitErr() == nil {
			t.Error("ExitErr() = nil after SIGKILL")
		}
	})

	t.Run("left running for ControlPlane.Stop", func(t *testing.T) {
		// TestMain's checkStopped verifies that Stop ends it.
		p, err := cp.StartProcess(ctx, "sleeper-left-running", bin)
		if err != nil {
			t.Fatal(err)
		}
		waitForLog(p, "ready")
	})

	if _, err := cp.StartProcess(ctx, "../escape", bin); err == nil {
		t.Error("StartProcess accepted a name with a path separator")
	}
}

// TestStartFailsCleanly checks that a component that dies during start-up
// makes Start fail with its log quoted, and that what had started (etcd)
// is stopped again.
func TestStartFailsCleanly(t *testing.T) {
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Skipf("no false binary: %v", err)
	}
	dir := t.TempDir()
	bins := Binaries{APIServer: falseBin, ControllerManager: falseBin, Scheduler: falseBin, Kwok: falseBin}
	cp, err := Start(t.Context(), bins, Options{Dir: dir})
	if err == nil {
		cp.Stop()
		t.Fatal("Start succeeded with /bin/false as kube-apiserver")
	}
	t.Logf("Start failed as expected: %v", err)
	for _, want := range []string{"kube-apiserver exited unexpectedly", dir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q does not mention %q", err, want)
		}
	}
	if _, statErr := os.Stat(dir + "/logs/etcd.log"); statErr != nil {
		t.Errorf("etcd log not kept: %v", statErr)
	}
	if _, statErr := os.Stat(dir + "/etcd"); !errors.Is(statErr, os.ErrNotExist) {
		t.Errorf("etcd data not removed after the failed start (stat: %v)", statErr)
	}
}

// TestFaults: with etcd frozen a write hangs (and nothing is stored);
// thawed, the API server answers again. The API server killed refuses
// connections; started again, it serves with its old state.
func TestFaults(t *testing.T) {
	cp := controlPlane(t)
	ctx := t.Context()
	cms := cp.Client.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	cp.FreezeEtcd()
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := cms.Create(short, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "frozen"}}, metav1.CreateOptions{})
	cancel()
	cp.ThawEtcd()
	if err == nil {
		t.Fatal("a write succeeded while etcd was frozen")
	}
	pollUntil(t, time.Minute, "the API server answering after the thaw", func() (bool, string) {
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "thawed"}}, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	if err := cp.KillComponent(APIServer); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Get(ctx, "thawed", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server answered after it was killed")
	}
	if err := cp.StartComponent(ctx, APIServer); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Get(ctx, "thawed", metav1.GetOptions{}); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if err := cp.KillComponent("no-such"); err == nil {
		t.Fatal("killing an unknown component: no error")
	}
}
