// Package e2e runs the autoscaler binary, as users run it, against a real
// control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, kwok) and the ARM simulator spoken to over HTTPS.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

const subscription = "5e2e0000-0000-0000-0000-000000000001"

// suite is the package's shared control plane and ARM simulator.
type suite struct {
	cp         *harness.ControlPlane
	sim        *armsim.Server
	hook       *filterHook
	never      *neverKill // the never-kill invariant (invariant_test.go)
	autoscaler string
	caFile     string
	tokenFile  string

	mu   sync.Mutex
	runs map[string]int // scenarios started per name, for -count=N

	provreq provreqSuite // the ProvisioningRequest and Kueue scenarios' share (provreq_test.go)
}

// run counts a scenario's runs: a name run again (go test -count=10) gets
// a suffix, so its scale sets and logs do not collide with the last run's.
func (s *suite) run(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs == nil {
		s.runs = map[string]int{}
	}
	s.runs[name]++
	return s.runs[name]
}

// filterHook registers nodes through the Kubernetes hook, except for
// scale sets whose VMs must never register (the provision-timeout test) and
// scale sets a test gave a hook of their own (other realism). It hands
// every deletion to the never-kill invariant's watcher, whatever the scale set.
type filterHook struct {
	inner   armsim.NodeHook
	watcher armsim.DeletionWatcher
	mu      sync.Mutex
	silent  map[string]bool
	own     map[string]armsim.NodeHook
}

// use registers a scale set's VMs through h.
func (h *filterHook) use(scaleSet string, hook armsim.NodeHook) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.own[strings.ToLower(scaleSet)] = hook
}

func (h *filterHook) hookFor(vm armsim.VM) armsim.NodeHook {
	h.mu.Lock()
	defer h.mu.Unlock()
	if o, ok := h.own[strings.ToLower(vm.ScaleSet)]; ok {
		return o
	}
	return h.inner
}

func (h *filterHook) silence(scaleSet string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.silent[strings.ToLower(scaleSet)] = true
}

func (h *filterHook) isSilent(vm armsim.VM) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.silent[strings.ToLower(vm.ScaleSet)]
}

func (h *filterHook) VMRunning(ctx context.Context, vm armsim.VM) error {
	if h.isSilent(vm) {
		return nil
	}
	return h.hookFor(vm).VMRunning(ctx, vm)
}

func (h *filterHook) VMDeleted(ctx context.Context, vm armsim.VM) error {
	return h.hookFor(vm).VMDeleted(ctx, vm)
}

// VMRepaired is armsim.RepairWatcher's: told to the VM's hook when it
// watches repairs (a scenario's fault hook clears what a fix clears).
func (h *filterHook) VMRepaired(ctx context.Context, vm armsim.VM, action string, fixed bool) error {
	if w, ok := h.hookFor(vm).(armsim.RepairWatcher); ok {
		return w.VMRepaired(ctx, vm, action, fixed)
	}
	return nil
}

// VMsDeleting is armsim.DeletionWatcher's: the never-kill check.
func (h *filterHook) VMsDeleting(ctx context.Context, vms []armsim.VM) {
	h.watcher.VMsDeleting(ctx, vms)
}

// realisticHook registers nodes as AKS kubelets do (armsim.DefaultRealism:
// allocatable below capacity, lower-cased resource groups in providerIDs,
// GPUs advertised 20 s after registration), for kwok to run.
func realisticHook(cp *harness.ControlPlane) *armsim.KubeNodeHook {
	h := armsim.NewKubeNodeHook(cp.Client)
	h.Annotations = map[string]string{"kwok.x-k8s.io/node": "fake"}
	return h
}

// theSuite is set once by TestMain, before any test runs, and only read after.
var theSuite *suite

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		return 0
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	bins, err := harness.BuildBinaries(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building control-plane binaries:", err)
		return 1
	}
	autoscaler, err := harness.BuildGoBinary(ctx, "./cmd/vmss-autoscaler", "vmss-autoscaler")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building the autoscaler:", err)
		return 1
	}
	cp, err := harness.Start(ctx, bins, harness.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting the control plane:", err)
		return 1
	}
	defer cp.Stop()
	klog.InfoS("Control plane up", "after", time.Since(start).Round(time.Second), "logs", cp.LogDir)
	never := newNeverKill(cp.Client)
	if err := never.start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: never-kill invariant:", err)
		return 1
	}
	hook := &filterHook{inner: realisticHook(cp), watcher: never, silent: map[string]bool{}, own: map[string]armsim.NodeHook{}}
	// VMs boot in 1 s ± 0.5 s: compressed, but not in lockstep.
	// Repairs compressed too: a reboot in 10 s, a reimage or redeploy in 20 s.
	sim, err := armsim.New(armsim.Options{SubscriptionID: subscription, Location: "eastus", BootDelay: time.Second,
		BootJitter: 500 * time.Millisecond, Seed: 1, Hook: hook, Throttling: suiteThrottling(),
		RestartDuration: 10 * time.Second, ReimageDuration: 20 * time.Second, RedeployDuration: 20 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: ARM simulator:", err)
		return 1
	}
	if err := sim.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: ARM simulator:", err)
		return 1
	}
	defer sim.Close()
	go sim.Run(ctx)
	caFile := filepath.Join(cp.Dir, "armsim-ca.pem")
	tokenFile := filepath.Join(cp.Dir, "arm-token")
	if err := os.WriteFile(caFile, sim.CACertPEM(), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if err := os.WriteFile(tokenFile, []byte("e2e-token"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	theSuite = &suite{cp: cp, sim: sim, hook: hook, never: never, autoscaler: autoscaler, caFile: caFile, tokenFile: tokenFile}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, cp.LogHint())
	}
	return code
}

func freePort(t testing.TB) int {
	t.Helper()
	port, err := freePortErr()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// issuedPorts are the ports freePortErr handed out in this process: the
// kernel may offer a port again once its probe listener is closed, and
// scenarios running in parallel must not be given the same one before its
// process binds it.
var issuedPorts = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

func freePortErr() (int, error) {
	issuedPorts.Lock()
	defer issuedPorts.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !issuedPorts.m[port] {
			issuedPorts.m[port] = true
			return port, nil
		}
	}
	return 0, fmt.Errorf("finding a free port: the kernel offered 100 ports already handed out")
}

// vmListCompression is how much shorter the suite's VM-list intervals are
// than production's (--azure-vm-list-interval 5 s against 5 minutes).
const vmListCompression = 60

// suiteThrottling is the simulator's throttling for the suite: Azure's
// policies as the simulator models them (armsim.ComputePolicies), with
// the subscription's windowed VM-list policies (HighCostGetVMScaleSet3Min
// and 30Min) scaled by vmListCompression. Every scenario's autoscaler
// lists VMs 60 times as often as in production, and up to E2E_PARALLEL of
// them share the one subscription those windows count: unscaled, the
// suite empties the 3-minute window within a minute and a scenario that
// starts then never gets its first VM list (its deletions are refused:
// "instance ... is not in its last VM list yet"). Scaled, the ratio of
// the suite's lists to the window is production's. The per-scale-set
// buckets (a set's Update and Delete: 12 tokens refilled 4 a minute) stay
// as Azure has them: each binds one scenario's scale sets, in real time.
// Scenarios about VM-list throttling inject it (ThrottlePolicy).
func suiteThrottling() armsim.Throttling {
	policies := armsim.ComputePolicies()
	for _, name := range []string{armsim.PolicyHighCostGetVMScaleSet3Min, armsim.PolicyHighCostGetVMScaleSet30Min} {
		p, ok := armsim.ComputePolicy(name)
		if !ok {
			panic("armsim has no policy " + name)
		}
		p.Capacity *= vmListCompression
		policies = armsim.WithPolicy(policies, p)
	}
	return armsim.Throttling{Compute: policies}
}
