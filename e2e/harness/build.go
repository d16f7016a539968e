package harness

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// KubeVersion is the Kubernetes release the control plane binaries are built
// from; it must match the k8s.io/kubernetes requirement in go.mod.
const KubeVersion = "v1.36.3"

const (
	kubeMajor = "1"
	kubeMinor = "36"
	// kubeGitCommit and kubeBuildDate are fixed placeholders: the binaries
	// are built from the module cache, not from a git checkout, and a
	// constant build date keeps the link step reproducible.
	kubeGitCommit = "0000000000000000000000000000000000000000"
	kubeBuildDate = "1970-01-01T00:00:00Z"

	cacheBinDir   = ".cache/bin"
	lockFileName  = ".lock"
	stampFileName = ".stamp-control-plane"

	lockPollInterval = 250 * time.Millisecond
)

// Binaries holds the absolute paths of the built binaries.
type Binaries struct{ APIServer, ControllerManager, Scheduler, Kwok string }

// controlPlanePackages returns the packages of the control plane binaries;
// `go build -o <dir>/` names each binary after the last path element.
func controlPlanePackages() []string {
	return []string{
		"k8s.io/kubernetes/cmd/kube-apiserver",
		"k8s.io/kubernetes/cmd/kube-controller-manager",
		"k8s.io/kubernetes/cmd/kube-scheduler",
		"sigs.k8s.io/kwok/cmd/kwok",
	}
}

// versionLDFlags returns the -ldflags value that stamps the Kubernetes
// version into component-base and client-go, so the servers report
// KubeVersion instead of v0.0.0-master.
func versionLDFlags() string {
	vars := []struct{ name, value string }{
		{"gitVersion", KubeVersion},
		{"gitMajor", kubeMajor},
		{"gitMinor", kubeMinor},
		{"gitTreeState", "clean"},
		{"gitCommit", kubeGitCommit},
		{"buildDate", kubeBuildDate},
	}
	var parts []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		for _, v := range vars {
			parts = append(parts, fmt.Sprintf("-X %s.%s=%s", pkg, v.name, v.value))
		}
	}
	return strings.Join(parts, " ")
}

// RepoRoot returns the module root (directory of go.mod), found via
// `go env GOMOD` or by walking up from the working directory.
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		gomod := strings.TrimSpace(string(out))
		if gomod != "" && gomod != os.DevNull {
			return filepath.Dir(gomod), nil
		}
	}
	wd, wdErr := os.Getwd()
	if wdErr != nil {
		return "", fmt.Errorf("finding module root: getting working directory: %w", wdErr)
	}
	for dir := wd; ; {
		if _, statErr := os.Stat(filepath.Join(dir, "go.mod")); statErr == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	if err != nil {
		return "", fmt.Errorf("finding module root: `go env GOMOD` failed (%w) and no go.mod above %s", err, wd)
	}
	return "", fmt.Errorf("finding module root: no go.mod above %s", wd)
}

// binDir returns <root>/.cache/bin, creating it.
func binDir() (root, dir string, err error) {
	root, err = RepoRoot()
	if err != nil {
		return "", "", err
	}
	dir = filepath.Join(root, filepath.FromSlash(cacheBinDir))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("creating binary cache %s: %w", dir, err)
	}
	return root, dir, nil
}

// BuildBinaries builds kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok with `go build -ldflags <version ldflags> -o
// <root>/.cache/bin/ <packages>`, skipping the build when the binaries exist
// and a stamp file records the same sha256 of go.mod+go.sum (and of the build
// flags). It is safe to call from several test processes at once: builds are
// serialised with an flock on .cache/bin/.lock.
func BuildBinaries(ctx context.Context) (Binaries, error) {
	logger := klog.FromContext(ctx)
	root, dir, err := binDir()
	if err != nil {
		return Binaries{}, fmt.Errorf("building control plane binaries: %w", err)
	}
	bins := Binaries{
		APIServer:         filepath.Join(dir, "kube-apiserver"),
		ControllerManager: filepath.Join(dir, "kube-controller-manager"),
		Scheduler:         filepath.Join(dir, "kube-scheduler"),
		Kwok:              filepath.Join(dir, "kwok"),
	}

	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return Binaries{}, fmt.Errorf("building control plane binaries: %w", err)
	}
	defer unlock()

	ldflags := versionLDFlags()
	pkgs := controlPlanePackages()
	stamp, err := buildStamp(root, ldflags, pkgs)
	if err != nil {
		return Binaries{}, fmt.Errorf("building control plane binaries: %w", err)
	}
	stampPath := filepath.Join(dir, stampFileName)
	if upToDate(stampPath, stamp, bins) {
		logger.V(1).Info("Control plane binaries are up to date", "dir", dir)
		return bins, nil
	}
	// Drop the stamp first: a build interrupted half way must not look valid.
	if err := os.Remove(stampPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Binaries{}, fmt.Errorf("building control plane binaries: removing stamp: %w", err)
	}

	logger.Info("Building control plane binaries (the first build takes several minutes)", "packages", pkgs, "dir", dir)
	start := time.Now()
	args := append([]string{"build", "-ldflags", ldflags, "-o", dir + string(filepath.Separator)}, pkgs...)
	if err := runGo(ctx, root, args...); err != nil {
		return Binaries{}, fmt.Errorf("building control plane binaries: %w", err)
	}
	logger.Info("Built control plane binaries", "dir", dir, "duration", time.Since(start).Round(time.Millisecond))

	if err := os.WriteFile(stampPath, []byte(stamp+"\n"), 0o644); err != nil {
		return Binaries{}, fmt.Errorf("building control plane binaries: writing stamp: %w", err)
	}
	return bins, nil
}

// BuildGoBinary builds one package of this module (e.g.
// "./cmd/vmss-autoscaler" or
// "./cmd/armsim") into .cache/bin/<name> and returns its absolute path. It
// always rebuilds; Go's build cache makes an unchanged rebuild fast.
func BuildGoBinary(ctx context.Context, pkg, name string) (string, error) {
	logger := klog.FromContext(ctx)
	if name == "" || strings.ContainsRune(name, filepath.Separator) || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("building %s: invalid binary name %q", pkg, name)
	}
	root, dir, err := binDir()
	if err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	defer unlock()

	out := filepath.Join(dir, name)
	start := time.Now()
	if err := runGo(ctx, root, "build", "-o", out, pkg); err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	logger.Info("Built Go binary", "package", pkg, "path", out, "duration", time.Since(start).Round(time.Millisecond))
	return out, nil
}

// runGo runs the go command in dir and returns its combined output in the
// error when it fails.
func runGo(ctx context.Context, dir string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// buildStamp hashes go.mod, go.sum and the build flags.
func buildStamp(root, ldflags string, pkgs []string) (string, error) {
	h := sha256.New()
	for _, name := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			return "", fmt.Errorf("reading %s for the build stamp: %w", name, err)
		}
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
	}
	fmt.Fprintf(h, "ldflags %s\npackages %s\n", ldflags, strings.Join(pkgs, " "))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// upToDate reports whether the stamp file holds stamp and every binary exists.
func upToDate(stampPath, stamp string, bins Binaries) bool {
	data, err := os.ReadFile(stampPath)
	if err != nil || strings.TrimSpace(string(data)) != stamp {
		return false
	}
	for _, p := range []string{bins.APIServer, bins.ControllerManager, bins.Scheduler, bins.Kwok} {
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// lockDir takes an exclusive flock on dir/.lock, polling so that ctx can
// cancel the wait, and returns the function that releases it.
func lockDir(ctx context.Context, dir string) (func(), error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening lock file: %w", err)
	}
	fd := int(f.Fd())
	ticker := time.NewTicker(lockPollInterval)
	defer ticker.Stop()
	logged := false
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !logged {
			klog.FromContext(ctx).Info("Waiting for another build to release the lock", "lock", path)
			logged = true
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for lock %s: %w", path, context.Cause(ctx))
		case <-ticker.C:
		}
	}
	return func() {
		_ = syscall.Flock(fd, syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}
