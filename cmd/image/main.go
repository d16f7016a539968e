// Command image builds and pushes the vmss-autoscaler container image
// without a Docker daemon (internal/image, go-containerregistry):
//
//	go run ./cmd/image build [--out .cache/image] [--version V] [--revision R] [--preflight-base B]   # make image
//	go run ./cmd/image push  [--layout .cache/image/oci] registry/name:tag                         # make push IMAGE=...
//
// build cross-compiles a static binary per platform, assembles the OCI
// image index and writes it as an OCI image layout (<out>/oci) and an
// oci-archive tarball (<out>/vmss-autoscaler-<version>.oci.tar). With
// --preflight-base it also builds the preflight agent's image: the same
// binaries on a GPU-tools base (<out>/preflight-oci). push sends a layout
// to a registry with the standard keychain (docker login, az acr login,
// credential helpers).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/image"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	klog.Flush()
	if err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "image:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("want a subcommand: build or push")
	}
	switch args[0] {
	case "build":
		return build(ctx, args[1:])
	case "push":
		return push(ctx, args[1:])
	default:
		return fmt.Errorf("unknown subcommand %q: want build or push", args[0])
	}
}

func newFlagSet(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	gfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gfs)
	fs.AddGoFlagSet(gfs)
	return fs
}

// buildOptions are build's flags, resolved.
type buildOptions struct {
	root, out, version, revision, source, caCerts string
	platforms                                     []string
	// preflightBase, when set, is a GPU-tools image to build the preflight
	// agent's image on.
	preflightBase string
}

func build(ctx context.Context, args []string) error {
	var o buildOptions
	fs := newFlagSet("build")
	fs.StringVar(&o.root, "root", ".", "module root (holds go.mod and the chart)")
	fs.StringVar(&o.out, "out", ".cache/image", "output folder (git-ignored): oci/ (the layout), bin/, the .oci.tar archive")
	fs.StringVar(&o.version, "version", "", "version: the tag, the org.opencontainers.image.version label and --version; default: the chart's appVersion")
	fs.StringVar(&o.revision, "revision", "", "commit: the org.opencontainers.image.revision label and --version; default: git rev-parse HEAD (+ -dirty)")
	fs.StringVar(&o.source, "source", image.Source, "the org.opencontainers.image.source label")
	fs.StringVar(&o.caCerts, "ca-certificates", image.DefaultCACerts, "PEM bundle of CA certificates copied into the image (from this machine)")
	fs.StringSliceVar(&o.platforms, "platforms", []string{"linux/amd64", "linux/arm64"}, "platforms of the image index")
	fs.StringVar(&o.preflightBase, "preflight-base", "", "also build the preflight agent's image on this GPU-tools image (e.g. NVIDIA's DCGM image), pulled with the standard keychain, into <out>/preflight-oci")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("build: unexpected arguments %q", fs.Args())
	}
	return buildImage(ctx, o)
}

func buildImage(ctx context.Context, o buildOptions) error {
	root, err := filepath.Abs(o.root)
	if err != nil {
		return fmt.Errorf("--root=%s: %w", o.root, err)
	}
	// Inputs first: a mistake fails before minutes of compiling.
	platforms, err := parsePlatforms(o.platforms)
	if err != nil {
		return err
	}
	created, err := o.resolveInputs(ctx, root)
	if err != nil {
		return err
	}
	base, err := pullBase(ctx, o.preflightBase, platforms)
	if err != nil {
		return err
	}
	out := o.out
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	opts := image.Options{CACerts: o.caCerts, Version: o.version, Revision: o.revision, Source: o.source, Created: created}
	if opts.Binaries, err = buildBinaries(ctx, root, out, platforms, o.version, o.revision); err != nil {
		return err
	}
	if err := o.writeImage(opts, out); err != nil {
		return err
	}
	if base == nil {
		return nil
	}
	return o.writePreflightImage(opts, base, out)
}

// parsePlatforms parses --platforms.
func parsePlatforms(values []string) ([]image.Platform, error) {
	var platforms []image.Platform
	for _, s := range values {
		p, err := image.ParsePlatform(s)
		if err != nil {
			return nil, fmt.Errorf("--platforms: %w", err)
		}
		platforms = append(platforms, p)
	}
	return platforms, nil
}

// resolveInputs sets the version and revision not given (the chart's
// appVersion, the checkout's commit), checks them and the CA
// certificates, and returns the images' creation time.
func (o *buildOptions) resolveInputs(ctx context.Context, root string) (time.Time, error) {
	var err error
	if o.version == "" {
		if o.version, err = image.ChartAppVersion(root); err != nil {
			return time.Time{}, err
		}
	}
	if err := image.ValidateVersion(o.version); err != nil {
		return time.Time{}, fmt.Errorf("--version: %w", err)
	}
	if _, err := image.ReadCACerts(o.caCerts); err != nil {
		return time.Time{}, err
	}
	if o.revision == "" {
		if o.revision, err = image.GitRevision(ctx, root); err != nil {
			return time.Time{}, fmt.Errorf("--revision not given and %w", err)
		}
	}
	return image.CreatedTime(ctx, root, os.Getenv)
}

// pullBase pulls the preflight image's base, nil without one.
func pullBase(ctx context.Context, ref string, platforms []image.Platform) (*image.Base, error) {
	if ref == "" {
		return nil, nil
	}
	klog.FromContext(ctx).Info("Pulling the preflight image's base", "base", ref)
	base, err := image.PullBase(ctx, ref, platforms)
	if err != nil {
		return nil, fmt.Errorf("--preflight-base: %w", err)
	}
	return base, nil
}

// buildBinaries builds the binary of each platform under out and returns
// their paths.
func buildBinaries(ctx context.Context, root, out string, platforms []image.Platform, version, revision string) (map[image.Platform]string, error) {
	logger := klog.FromContext(ctx)
	bins := map[image.Platform]string{}
	for _, p := range platforms {
		bin := filepath.Join(out, "bin", p.OS+"-"+p.Architecture, "vmss-autoscaler")
		logger.Info("Building binary", "platform", p, "version", version, "revision", revision)
		if err := image.BuildBinary(ctx, root, p, version, revision, bin); err != nil {
			return nil, err
		}
		bins[p] = bin
	}
	return bins, nil
}

// writeImage builds the autoscaler's image of opts into out and says
// where it is.
func (o *buildOptions) writeImage(opts image.Options, out string) error {
	idx, err := image.Build(opts)
	if err != nil {
		return err
	}
	where, err := writeOutputs(idx, out, "oci", "vmss-autoscaler", o.version, opts.Created)
	if err != nil {
		return err
	}
	fmt.Printf("built vmss-autoscaler %s (revision %s) for %s\n%spush it with: make push IMAGE=<registry>/vmss-autoscaler:%s\n",
		o.version, o.revision, strings.Join(o.platforms, ", "), where, o.version)
	return nil
}

// writePreflightImage builds the preflight image of opts on base into
// out and says where it is.
func (o *buildOptions) writePreflightImage(opts image.Options, base *image.Base, out string) error {
	pidx, err := image.OnBase(opts, base)
	if err != nil {
		return fmt.Errorf("preflight image: %w", err)
	}
	where, err := writeOutputs(pidx, out, "preflight-oci", "vmss-autoscaler-preflight", o.version, opts.Created)
	if err != nil {
		return err
	}
	fmt.Printf("built the preflight image on %s (%s)\n%spush it with: make push IMAGE=... PREFLIGHT_IMAGE=<registry>/vmss-autoscaler-preflight:%s\n",
		o.preflightBase, base.Digest, where, o.version)
	return nil
}

// writeOutputs writes idx as the layout <out>/<dir> and the archive
// <out>/<name>-<version>.oci.tar, and says where, with the digest.
func writeOutputs(idx v1.ImageIndex, out, dir, name, version string, created time.Time) (string, error) {
	layoutDir := filepath.Join(out, dir)
	if err := image.WriteLayout(layoutDir, idx, version); err != nil {
		return "", err
	}
	archive := filepath.Join(out, name+"-"+version+".oci.tar")
	if err := image.WriteArchive(layoutDir, archive, created); err != nil {
		return "", err
	}
	digest, err := idx.Digest()
	if err != nil {
		return "", fmt.Errorf("%s: %w", layoutDir, err)
	}
	return fmt.Sprintf("  index   %s\n  layout  %s\n  archive %s\n", digest, layoutDir, archive), nil
}

func push(ctx context.Context, args []string) error {
	fs := newFlagSet("push")
	layoutDir := fs.String("layout", ".cache/image/oci", "the OCI layout make image wrote")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("push: %w", err)
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("push: want one image reference (registry/name:tag), got %q", fs.Args())
	}
	digest, err := image.Push(ctx, *layoutDir, fs.Arg(0))
	if err != nil {
		return err
	}
	fmt.Printf("pushed %s@%s\n", fs.Arg(0), digest)
	return nil
}
