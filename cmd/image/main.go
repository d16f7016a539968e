// Command image builds and pushes the vmss-autoscaler container image
// without a Docker daemon (internal/image, go-containerregistry):
//
//	go run ./cmd/image build [--out .cache/image] [--version V] [--revision R]   # make image
//	go run ./cmd/image push  [--layout .cache/image/oci] registry/name:tag       # make push IMAGE=...
//
// build cross-compiles a static binary per platform, assembles the OCI
// image index and writes it as an OCI image layout (<out>/oci) and an
// oci-archive tarball (<out>/vmss-autoscaler-<version>.oci.tar). push sends
// that layout to a registry with the standard keychain (docker login, az
// acr login, credential helpers).
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
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("build: unexpected arguments %q", fs.Args())
	}
	return buildImage(ctx, o)
}

func buildImage(ctx context.Context, o buildOptions) error {
	logger := klog.FromContext(ctx)
	root, err := filepath.Abs(o.root)
	if err != nil {
		return fmt.Errorf("--root=%s: %w", o.root, err)
	}
	// Inputs first: a mistake fails before minutes of compiling.
	var platforms []image.Platform
	for _, s := range o.platforms {
		p, err := image.ParsePlatform(s)
		if err != nil {
			return fmt.Errorf("--platforms: %w", err)
		}
		platforms = append(platforms, p)
	}
	if o.version == "" {
		if o.version, err = image.ChartAppVersion(root); err != nil {
			return err
		}
	}
	if err := image.ValidateVersion(o.version); err != nil {
		return fmt.Errorf("--version: %w", err)
	}
	if _, err := image.ReadCACerts(o.caCerts); err != nil {
		return err
	}
	if o.revision == "" {
		if o.revision, err = image.GitRevision(ctx, root); err != nil {
			return fmt.Errorf("--revision not given and %w", err)
		}
	}
	created, err := image.CreatedTime(ctx, root, os.Getenv)
	if err != nil {
		return err
	}
	out := o.out
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	opts := image.Options{Binaries: map[image.Platform]string{}, CACerts: o.caCerts,
		Version: o.version, Revision: o.revision, Source: o.source, Created: created}
	for _, p := range platforms {
		bin := filepath.Join(out, "bin", p.OS+"-"+p.Architecture, "vmss-autoscaler")
		logger.Info("Building binary", "platform", p, "version", o.version, "revision", o.revision)
		if err := image.BuildBinary(ctx, root, p, o.version, o.revision, bin); err != nil {
			return err
		}
		opts.Binaries[p] = bin
	}
	idx, err := image.Build(opts)
	if err != nil {
		return err
	}
	layoutDir := filepath.Join(out, "oci")
	if err := image.WriteLayout(layoutDir, idx, o.version); err != nil {
		return err
	}
	archive := filepath.Join(out, "vmss-autoscaler-"+o.version+".oci.tar")
	if err := image.WriteArchive(layoutDir, archive, created); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("built vmss-autoscaler %s (revision %s) for %s\n  index   %s\n  layout  %s\n  archive %s\npush it with: make push IMAGE=<registry>/vmss-autoscaler:%s\n",
		o.version, o.revision, strings.Join(o.platforms, ", "), digest, layoutDir, archive, o.version)
	return nil
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
