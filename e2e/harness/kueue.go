package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// Modules the e2e tests take from the module proxy, outside this module's
// go.mod: their dependencies never enter ours.
const (
	// KueueModule at KueueVersion: its manager (cmd/kueue) is built into
	// .cache and run against the test control plane; its CRDs are in
	// config/components/crd/bases.
	KueueModule  = "sigs.k8s.io/kueue"
	KueueVersion = "v0.17.0"
	// ProvisioningRequestAPIsModule at ProvisioningRequestAPIsVersion holds
	// the ProvisioningRequest CRD (config/crd), the only version the module
	// proxy serves.
	ProvisioningRequestAPIsModule  = "k8s.io/autoscaler/cluster-autoscaler/apis"
	ProvisioningRequestAPIsVersion = "v0.0.0-20240830133931-adfbe7e45277"
)

// ModuleDir returns a module's directory in the module cache (read only),
// downloading it when it is not there: `go mod download -json
// <path>@<version>`, run outside any module so no go.mod or go.sum changes.
func ModuleDir(ctx context.Context, path, version string) (string, error) {
	out, err := goOutside(ctx, nil, "mod", "download", "-json", path+"@"+version)
	if err != nil {
		return "", fmt.Errorf("downloading module %s@%s: %w", path, version, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("downloading module %s@%s: reading go's answer %q: %w", path, version, out, err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("downloading module %s@%s: %s", path, version, m.Error)
	}
	return m.Dir, nil
}

// BuildKueue builds Kueue's manager at KueueVersion into
// <root>/.cache/kueue/<version>/kueue, once: `go install
// sigs.k8s.io/kueue/cmd/kueue@<version>` with GOBIN there, run outside
// this module with GOFLAGS cleared and GOWORK off, so Kueue builds from its
// own go.mod (it has no replace directives) and none of its dependencies
// enter ours. The path carries the version, so a binary there is the one
// wanted; it appears whole (renamed into place). Builds are serialised
// with the control plane's flock.
func BuildKueue(ctx context.Context) (string, error) {
	logger := klog.FromContext(ctx)
	root, dir, err := binDir()
	if err != nil {
		return "", fmt.Errorf("building Kueue: %w", err)
	}
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return "", fmt.Errorf("building Kueue: %w", err)
	}
	defer unlock()
	gobin := filepath.Join(root, ".cache", "kueue", KueueVersion)
	bin := filepath.Join(gobin, "kueue")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		logger.V(1).Info("Kueue manager is built", "path", bin)
		return bin, nil
	}
	if err := os.MkdirAll(gobin, 0o755); err != nil {
		return "", fmt.Errorf("building Kueue: %w", err)
	}
	logger.Info("Building Kueue's manager (the first build takes minutes)", "module", KueueModule, "version", KueueVersion, "path", bin)
	start := time.Now()
	// Installed into a temporary directory beside it, then renamed: an
	// executable at bin is always whole (go install may copy its output
	// in place, and a build cut short would leave a part of it there for
	// the next run to take as built).
	tmp, err := os.MkdirTemp(gobin, ".build-")
	if err != nil {
		return "", fmt.Errorf("building Kueue: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if _, err := goOutside(ctx, []string{"GOBIN=" + tmp}, "install", KueueModule+"/cmd/kueue@"+KueueVersion); err != nil {
		return "", fmt.Errorf("building Kueue %s: %w", KueueVersion, err)
	}
	if err := os.Rename(filepath.Join(tmp, "kueue"), bin); err != nil {
		return "", fmt.Errorf("building Kueue: %w", err)
	}
	logger.Info("Built Kueue's manager", "path", bin, "duration", time.Since(start).Round(time.Second))
	return bin, nil
}

// goOutside runs the go command in the system's temporary directory
// (outside any module) with GOFLAGS cleared, GOWORK off and env added, and
// returns its standard output; its standard error is in the error.
func goOutside(ctx context.Context, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), append([]string{"GOFLAGS=", "GOWORK=off", "GO111MODULE=on"}, env...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, fmt.Errorf("go %s: %w", strings.Join(args, " "), ctx.Err())
		}
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}
