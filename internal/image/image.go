// Package image builds the vmss-autoscaler container image with
// go-containerregistry, without a Docker daemon: an OCI image index of one
// image per platform, each a static binary, the CA certificates and a
// non-root user on an empty base (no shell, no package manager). It is
// written as an OCI image layout (and an oci-archive tarball of it) and
// pushed from there with the standard keychain. `make image` and `make
// push` run it through cmd/image.
package image

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image is made of; the chart's securityContext (runAsUser 65532)
// and Deployment (args only, no command) rely on these.
const (
	// BinaryPath is the entrypoint.
	BinaryPath = "/usr/local/bin/vmss-autoscaler"
	// CACertsPath is where Go (and most TLS stacks) look for the system
	// roots on Linux.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// UID and GID of the user the image runs as: "nonroot", as in
	// distroless images, so that runAsNonRoot can verify it.
	UID = 65532
	GID = 65532
	// User is the config's User field.
	User = "65532:65532"
	// DefaultCACerts is the machine's bundle the build copies by default
	// (Debian's ca-certificates package).
	DefaultCACerts = "/etc/ssl/certs/ca-certificates.crt"
	// Source is the org.opencontainers.image.source label by default.
	Source = "https://github.com/vmss-autoscaler/vmss-autoscaler"
)

// OCI annotation / label keys (image-spec annotations.md).
const (
	LabelSource      = "org.opencontainers.image.source"
	LabelVersion     = "org.opencontainers.image.version"
	LabelRevision    = "org.opencontainers.image.revision"
	LabelCreated     = "org.opencontainers.image.created"
	LabelTitle       = "org.opencontainers.image.title"
	LabelDescription = "org.opencontainers.image.description"
	LabelRefName     = "org.opencontainers.image.ref.name"
)

// tagRE is what an image tag may be (the distribution spec's reference grammar).
var tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// ValidateVersion checks that v can be the image's tag (and so its
// version label and the binary's --version).
func ValidateVersion(v string) error {
	if !tagRE.MatchString(v) {
		return fmt.Errorf("version %q: must be usable as an image tag: letters, digits, '_', '.', '-', at most 128, not starting with '.' or '-'", v)
	}
	return nil
}

// Platform is an OS and architecture, "linux/amd64".
type Platform struct{ OS, Architecture string }

func (p Platform) String() string { return p.OS + "/" + p.Architecture }

// ParsePlatform parses "os/arch".
func ParsePlatform(s string) (Platform, error) {
	osName, arch, ok := strings.Cut(s, "/")
	if !ok || osName == "" || arch == "" || strings.Contains(arch, "/") {
		return Platform{}, fmt.Errorf("platform %q: want os/arch, such as linux/amd64", s)
	}
	if osName != "linux" {
		return Platform{}, fmt.Errorf("platform %q: only linux images are built", s)
	}
	return Platform{OS: osName, Architecture: arch}, nil
}

// DefaultPlatforms are the platforms `make image` builds.
func DefaultPlatforms() []Platform {
	return []Platform{{"linux", "amd64"}, {"linux", "arm64"}}
}

// Options describe an image build.
type Options struct {
	// Binaries maps each platform to the static binary built for it.
	Binaries map[Platform]string
	// CACerts is the PEM bundle copied to CACertsPath.
	CACerts string
	// Version, Revision and Source become the OCI labels and annotations.
	Version, Revision, Source string
	// Created is the image's creation time and every file's mtime: a
	// fixed time (the commit's) makes the build reproducible.
	Created time.Time
}

func (o *Options) validate() error {
	var errs []error
	if len(o.Binaries) == 0 {
		errs = append(errs, errors.New("binaries: at least one platform is required"))
	}
	for p, bin := range o.Binaries {
		errs = append(errs, binaryErrors(p, bin)...)
	}
	if err := ValidateVersion(o.Version); err != nil {
		errs = append(errs, err)
	}
	if o.Revision == "" || strings.ContainsFunc(o.Revision, unicode.IsSpace) {
		errs = append(errs, fmt.Errorf("revision %q: required, without spaces", o.Revision))
	}
	if o.Source == "" {
		errs = append(errs, errors.New("source: required"))
	}
	return errors.Join(errs...)
}

// binaryErrors checks a platform of Binaries and its binary: os/arch,
// a regular file.
func binaryErrors(p Platform, bin string) []error {
	var errs []error
	if p.OS == "" || p.Architecture == "" {
		errs = append(errs, fmt.Errorf("binaries: platform %q: want os/arch", p))
	}
	if fi, err := os.Stat(bin); err != nil {
		errs = append(errs, fmt.Errorf("binaries[%s]=%s: %w", p, bin, err))
	} else if !fi.Mode().IsRegular() {
		errs = append(errs, fmt.Errorf("binaries[%s]=%s: not a regular file", p, bin))
	}
	return errs
}

// ReadCACerts reads a PEM bundle of CA certificates and checks that it
// holds at least one certificate. A missing file says how to get one.
func ReadCACerts(file string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("CA certificates %s: not found: install the ca-certificates package (apt-get install ca-certificates) or point CA_CERTS / --ca-certificates at a PEM bundle: %w", file, err)
	}
	if err != nil {
		return nil, fmt.Errorf("CA certificates %s: %w", file, err)
	}
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return nil, fmt.Errorf("CA certificates %s: certificate %d: %w", file, n+1, err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("CA certificates %s: no PEM certificate in %d bytes", file, len(data))
	}
	return data, nil
}

// Build assembles the image index: one image per platform, platforms in
// name order. Every image has two layers: the base (users, CA
// certificates, directories; the same bytes for every platform, so a
// registry stores it once) and the binary.
func Build(o Options) (v1.ImageIndex, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("image options: %w", err)
	}
	certs, err := ReadCACerts(o.CACerts)
	if err != nil {
		return nil, err
	}
	created := o.Created.UTC().Truncate(time.Second)
	base, err := layer(baseFiles(certs), created, types.OCILayer)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	labels := o.labels(created)
	scratch := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	return assemble(o, created, labels, types.OCIImageIndex, func(p Platform) (platformed, error) {
		bin, err := binaryLayer(o, p, created, types.OCILayer)
		if err != nil {
			return platformed{}, err
		}
		img, err := mutate.Append(scratch,
			mutate.Addendum{Layer: base, History: history(created, "users, CA certificates", "base")},
			mutate.Addendum{Layer: bin, History: history(created, BinaryPath, "binary")})
		if err != nil {
			return platformed{}, err
		}
		img, err = withConfig(img, created, func(cf *v1.ConfigFile) {
			cf.OS, cf.Architecture = p.OS, p.Architecture
			cf.Config = v1.Config{
				User:       User,
				Entrypoint: []string{BinaryPath},
				WorkingDir: "/",
				Env:        []string{"SSL_CERT_FILE=" + CACertsPath},
				Labels:     labels,
			}
		})
		return platformed{img, &v1.Platform{OS: p.OS, Architecture: p.Architecture}}, err
	})
}

// labels are the OCI labels (and annotations) of the image.
func (o *Options) labels(created time.Time) map[string]string {
	return map[string]string{
		LabelSource: o.Source, LabelVersion: o.Version, LabelRevision: o.Revision,
		LabelCreated: created.Format(time.RFC3339), LabelTitle: "vmss-autoscaler",
		LabelDescription: "Cluster autoscaler for Kubernetes GPU clusters on Azure VM Scale Sets",
	}
}

// platformed is an image and the platform its index entry says.
type platformed struct {
	img      v1.Image
	platform *v1.Platform
}

// assemble builds one image per platform of o.Binaries, in name order,
// into an index of media type mt annotated with labels.
func assemble(o Options, created time.Time, labels map[string]string, mt types.MediaType, build func(Platform) (platformed, error)) (v1.ImageIndex, error) {
	platforms := make([]Platform, 0, len(o.Binaries))
	for p := range o.Binaries {
		platforms = append(platforms, p)
	}
	sort.Slice(platforms, func(i, j int) bool { return platforms[i].String() < platforms[j].String() })
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		pi, err := build(p)
		if err != nil {
			return nil, fmt.Errorf("image for %s: %w", p, err)
		}
		img := pi.img
		if mt == types.OCIImageIndex {
			img = mutate.Annotations(img, labels).(v1.Image)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: pi.platform}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, mt), adds...)
	if mt != types.OCIImageIndex {
		return idx, nil // a Docker manifest list has no annotations
	}
	return mutate.Annotations(idx, labels).(v1.ImageIndex), nil
}

// binaryLayer is the layer holding the binary built for p.
func binaryLayer(o Options, p Platform, created time.Time, mt types.MediaType) (v1.Layer, error) {
	bin, err := os.ReadFile(o.Binaries[p])
	if err != nil {
		return nil, fmt.Errorf("binaries[%s]: %w", p, err)
	}
	l, err := layer(binaryFiles(bin), created, mt)
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	return l, nil
}

func history(created time.Time, what, comment string) v1.History {
	return v1.History{Created: v1.Time{Time: created}, CreatedBy: "vmss-autoscaler image: " + what, Comment: comment}
}

// withConfig edits img's config file and dates it.
func withConfig(img v1.Image, created time.Time, edit func(*v1.ConfigFile)) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	edit(cf)
	cf.Created = v1.Time{Time: created}
	return mutate.ConfigFile(img, cf)
}

// file is one entry of a layer.
type file struct {
	name     string // without a leading slash
	mode     int64  // permission bits (and sticky)
	dir      bool
	uid, gid int
	data     []byte
}

// baseFiles is the base layer: the nonroot user, the CA bundle, a /tmp
// and a home. No shell: /etc/passwd names /sbin/nologin, which does not
// exist either.
func baseFiles(certs []byte) []file {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		fmt.Sprintf("nonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, GID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", GID)
	return []file{
		{name: "etc", dir: true, mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/ssl", dir: true, mode: 0o755},
		{name: "etc/ssl/certs", dir: true, mode: 0o755},
		{name: strings.TrimPrefix(CACertsPath, "/"), mode: 0o644, data: certs},
		{name: "home", dir: true, mode: 0o755},
		{name: "home/nonroot", dir: true, mode: 0o700, uid: UID, gid: GID},
		{name: "root", dir: true, mode: 0o700},
		{name: "tmp", dir: true, mode: 0o1777},
	}
}

func binaryFiles(bin []byte) []file {
	var out []file
	dir := strings.TrimPrefix(path.Dir(BinaryPath), "/")
	for _, d := range strings.Split(dir, "/") {
		prefix := d
		if len(out) > 0 {
			prefix = out[len(out)-1].name + "/" + d
		}
		out = append(out, file{name: prefix, dir: true, mode: 0o755})
	}
	return append(out, file{name: strings.TrimPrefix(BinaryPath, "/"), mode: 0o755, data: bin})
}

// layer writes files as an uncompressed tar, every entry with mtime t,
// and returns it as a gzip-compressed layer of media type mt (OCI, or
// Docker's for a Docker base).
func layer(files []file, t time.Time, mt types.MediaType) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: t}
		if f.uid == UID {
			h.Uname, h.Gname = "nonroot", "nonroot"
		} else {
			h.Uname, h.Gname = "root", "root"
		}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar header %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(mt))
}
