package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
)

// Karpenter's kwok provider, taken from the module proxy outside this
// module's go.mod (none of its dependencies enter ours).
const (
	karpenterModule  = "sigs.k8s.io/karpenter"
	karpenterVersion = "v1.15.0"
	// karpenterToolchain is the Go that karpenterVersion's go.mod asks for;
	// the go command fetches it from the module proxy.
	karpenterToolchain = "go1.26.9"
	// karpenterMain is the kwok cloud provider's main package.
	karpenterMain = karpenterModule + "/kwok"
	// karpenterInstanceType is the kwok provider's 64-core amd64 Linux type
	// (64 CPU, 128 Gi) in its stock instance_types.json.
	karpenterInstanceType = "c-64x-amd64-linux"
)

// karpenterCRDs are the CRD files, in the module, that its controllers
// watch: NodePool, NodeClaim, NodeOverlay and CapacityBuffer (the kwok
// chart's), and KWOKNodeClass.
var karpenterCRDs = []string{
	"kwok/charts/crds/karpenter.sh_nodepools.yaml",
	"kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
	"kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
	"kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
	"kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
}

var (
	nodePoolGVR      = schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodepools"}
	nodeClaimGVR     = schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodeclaims"}
	kwokNodeClassGVR = schema.GroupVersionResource{Group: "karpenter.kwok.sh", Version: "v1alpha1", Resource: "kwoknodeclasses"}
	crdGVR           = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// goKarpenter runs the go command outside any module (the system's
// temporary directory), with GOFLAGS cleared, GOWORK off, Karpenter's
// toolchain and env added, and returns its standard output.
func goKarpenter(ctx context.Context, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), append([]string{"GOFLAGS=", "GOWORK=off", "GO111MODULE=on", "GOTOOLCHAIN=" + karpenterToolchain}, env...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return nil, fmt.Errorf("GOTOOLCHAIN=%s go %s: %w\n%s", karpenterToolchain, strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// karpenterModuleDir downloads the module (if needed) and returns its
// directory in the module cache.
func karpenterModuleDir(ctx context.Context) (string, error) {
	out, err := goKarpenter(ctx, nil, "mod", "download", "-json", karpenterModule+"@"+karpenterVersion)
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); err != nil || jerr != nil || m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("downloading %s@%s: %v %v %s", karpenterModule, karpenterVersion, err, jerr, m.Error)
	}
	return m.Dir, nil
}

// buildKarpenter builds the kwok provider's main into
// <root>/.cache/karpenter/<version>/karpenter, once: `go install
// sigs.k8s.io/karpenter/kwok@<version>` with GOBIN a temporary directory
// beside it, then renamed into place (a binary there is always whole).
// Builds are serialised by an flock on that directory.
func buildKarpenter(ctx context.Context, root string) (string, error) {
	dir := filepath.Join(root, ".cache", "karpenter", karpenterVersion)
	bin := filepath.Join(dir, "karpenter")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("building Karpenter: %w", err)
	}
	unlock, err := flock(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return "", fmt.Errorf("building Karpenter: %w", err)
	}
	defer unlock()
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return bin, nil
	}
	say("building Karpenter's kwok provider %s@%s with %s (minutes, once) ...", karpenterMain, karpenterVersion, karpenterToolchain)
	start := time.Now()
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", fmt.Errorf("building Karpenter: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if _, err := goKarpenter(ctx, []string{"GOBIN=" + tmp}, "install", karpenterMain+"@"+karpenterVersion); err != nil {
		return "", fmt.Errorf("building Karpenter: %w", err)
	}
	// go install names the binary after the package's last element.
	if err := os.Rename(filepath.Join(tmp, "kwok"), bin); err != nil {
		return "", fmt.Errorf("building Karpenter: %w", err)
	}
	say("built %s in %s", bin, time.Since(start).Round(time.Second))
	return bin, nil
}

// flock takes an exclusive lock on path, polling so ctx can cancel.
func flock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}

// installCRDs creates the CRDs of the files and waits until each is
// Established.
func installCRDs(ctx context.Context, dc dynamic.Interface, files []string) error {
	crds := dc.Resource(crdGVR)
	var names []string
	for _, f := range files {
		created, err := createCRDs(ctx, crds, f)
		if err != nil {
			return err
		}
		names = append(names, created...)
	}
	for _, n := range names {
		if err := poll(ctx, time.Minute, "CRD "+n+" Established", func() (bool, error) {
			u, err := crds.Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			return hasCondition(u, "Established"), nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// createCRDs creates the CRDs of the YAML file f (one there already is
// fine) and returns their names.
func createCRDs(ctx context.Context, crds dynamic.NamespaceableResourceInterface, f string) ([]string, error) {
	data, err := os.ReadFile(f)
	if err != nil {
		return nil, err
	}
	var names []string
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading %s: %w", f, err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if len(obj) == 0 || u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating CRD %s (%s): %w", u.GetName(), f, err)
		}
		names = append(names, u.GetName())
	}
	return names, nil
}

// hasCondition says whether u's status has the condition type=True.
func hasCondition(u *unstructured.Unstructured, typ string) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == typ && m["status"] == "True" {
			return true
		}
	}
	return false
}

// karpenterNodeClass is the KWOKNodeClass: nodes register bootDelay after
// their NodeClaim is launched, as the ARM simulator's VMs do.
func karpenterNodeClass(bootDelay time.Duration) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "karpenter.kwok.sh/v1alpha1",
		"kind":       "KWOKNodeClass",
		"metadata":   map[string]any{"name": "default"},
		"spec":       map[string]any{"nodeRegistrationDelay": durationString(bootDelay)},
	}}
}

// durationString writes d in KWOKNodeClass's pattern ^([0-9]+(s|m|h))+$.
func durationString(d time.Duration) string {
	return fmt.Sprintf("%ds", int64(d.Round(time.Second)/time.Second))
}

// karpenterNodePool offers only the 64-core type. Consolidation waits 10
// minutes, as our --scale-down-unneeded-time does, so neither side removes
// nodes while it scales up.
func karpenterNodePool() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "karpenter.sh/v1",
		"kind":       "NodePool",
		"metadata":   map[string]any{"name": "default"},
		"spec": map[string]any{
			"template": map[string]any{
				"spec": map[string]any{
					"requirements": []any{
						map[string]any{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": []any{karpenterInstanceType}},
						map[string]any{"key": "karpenter.sh/capacity-type", "operator": "In", "values": []any{"on-demand"}},
					},
					"nodeClassRef": map[string]any{"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
					"expireAfter":  "720h",
				},
			},
			"disruption": map[string]any{
				"consolidationPolicy": "WhenEmptyOrUnderutilized",
				"consolidateAfter":    "10m",
			},
		},
	}}
}

// setupKarpenter installs the CRDs and the NodePool and KWOKNodeClass, and
// marks the node class Ready (the kwok provider has no node class
// controller; its own e2e does the same).
func setupKarpenter(ctx context.Context, cfg *rest.Config, moduleDir string, bootDelay time.Duration) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	files := make([]string, len(karpenterCRDs))
	for i, f := range karpenterCRDs {
		files[i] = filepath.Join(moduleDir, filepath.FromSlash(f))
	}
	if err := installCRDs(ctx, dc, files); err != nil {
		return err
	}
	nc, err := dc.Resource(kwokNodeClassGVR).Create(ctx, karpenterNodeClass(bootDelay), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the KWOKNodeClass: %w", err)
	}
	now := time.Now().UTC().Format(time.RFC3339)
	_ = unstructured.SetNestedSlice(nc.Object, []any{map[string]any{
		"type": "Ready", "status": "True", "reason": "Ready", "message": "",
		"lastTransitionTime": now, "observedGeneration": nc.GetGeneration(),
	}}, "status", "conditions")
	if _, err := dc.Resource(kwokNodeClassGVR).UpdateStatus(ctx, nc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("marking the KWOKNodeClass Ready: %w", err)
	}
	if _, err := dc.Resource(nodePoolGVR).Create(ctx, karpenterNodePool(), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the NodePool: %w", err)
	}
	return nil
}

// karpenterArgs are Karpenter's flags: all its defaults (batching, client
// QPS, leader election, log level) but the ports and the lease's
// namespace, which a process outside a cluster must be given.
func karpenterArgs(metricsPort, healthPort int) []string {
	return []string{
		fmt.Sprintf("--metrics-port=%d", metricsPort),
		fmt.Sprintf("--health-probe-port=%d", healthPort),
		"--leader-election-namespace=kube-system",
	}
}

// startKarpenter starts it and waits until it is ready and the NodePool
// is Ready (it can launch nodes).
func startKarpenter(ctx context.Context, cp *harness.ControlPlane, bin string, env []string, args []string, healthPort int) (*harness.Process, error) {
	p, err := cp.StartProcessEnv(ctx, "karpenter", bin, env, args...)
	if err != nil {
		return nil, err
	}
	dc, err := dynamic.NewForConfig(cp.RESTConfig)
	if err != nil {
		return p, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)
	err = poll(ctx, 2*time.Minute, "Karpenter ready with its NodePool Ready", func() (bool, error) {
		select {
		case <-p.Exited():
			return false, fmt.Errorf("karpenter exited: %v (log %s)", p.ExitErr(), p.LogFile)
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, nil
		}
		np, err := dc.Resource(nodePoolGVR).Get(ctx, "default", metav1.GetOptions{})
		return err == nil && hasCondition(np, "Ready"), nil
	})
	return p, err
}

// poll calls cond every 250 ms until it is true, fails, or timeout passes.
func poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
