package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/version"
)

// ChartFile is the chart whose appVersion is the image's version: the
// chart's image tag defaults to it, so `make image` and `helm install`
// agree without anyone passing a tag.
const ChartFile = "charts/vmss-autoscaler/Chart.yaml"

// ChartAppVersion reads appVersion from the chart under the module root.
func ChartAppVersion(root string) (string, error) {
	file := filepath.Join(root, filepath.FromSlash(ChartFile))
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("chart appVersion: %w", err)
	}
	var ch struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &ch); err != nil {
		return "", fmt.Errorf("chart appVersion: %s: %w", file, err)
	}
	if ch.AppVersion == "" {
		return "", fmt.Errorf("chart appVersion: %s has none", file)
	}
	return ch.AppVersion, nil
}

// GitRevision returns the commit checked out in root, with "-dirty" when
// tracked files were changed.
func GitRevision(ctx context.Context, root string) (string, error) {
	rev, err := git(ctx, root, "rev-parse", "HEAD")
	if err != nil {
		return "", err
	}
	status, err := git(ctx, root, "status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return "", err
	}
	if status != "" {
		rev += "-dirty"
	}
	return rev, nil
}

// CreatedTime is the image's creation time: $SOURCE_DATE_EPOCH when set
// (reproducible-builds.org), else the commit's time, so that building the
// same commit twice gives the same digest.
func CreatedTime(ctx context.Context, root string, getenv func(string) string) (time.Time, error) {
	if s := getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970: %w", s, err)
		}
		return time.Unix(sec, 0).UTC(), nil
	}
	out, err := git(ctx, root, "log", "-1", "--format=%ct")
	if err != nil {
		return time.Time{}, err
	}
	sec, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("commit time %q: %w", out, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s in %s: %w: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// BuildBinary builds the module's command (./cmd/vmss-autoscaler of root)
// for p into out: a
// static binary (CGO_ENABLED=0, so it runs on an empty base), without local
// paths (-trimpath) or symbol tables (-s -w), with version and commit
// stamped (internal/version).
func BuildBinary(ctx context.Context, root string, p Platform, ver, commit, out string) error {
	ldflags := "-s -w " + version.LDFlags(ver, commit)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, "./cmd/vmss-autoscaler")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build for %s: %w\n%s", p, err, bytes.TrimSpace(output))
	}
	return nil
}
