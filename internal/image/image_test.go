package image

import (
	"archive/tar"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vmss-autoscaler/vmss-autoscaler/charts"
)

const testRevision = "0123456789abcdef0123456789abcdef01234567"

var testCreated = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// tmpRoot holds what the tests build once (binaries, layout); TestMain removes it.
var tmpRoot string

func TestMain(m *testing.M) {
	code := m.Run()
	if tmpRoot != "" {
		_ = os.RemoveAll(tmpRoot)
	}
	os.Exit(code)
}

// built is the image the tests inspect: the real binary for both default
// platforms, stamped with the chart's appVersion, as `make image` builds it.
type built struct {
	opts   Options
	idx    v1.ImageIndex
	layout string
	certs  []byte
}

var buildOnce = sync.OnceValues(func() (*built, error) {
	dir, err := os.MkdirTemp("", "vmss-autoscaler-image-test")
	if err != nil {
		return nil, err
	}
	tmpRoot = dir
	root, err := filepath.Abs("../..")
	if err != nil {
		return nil, err
	}
	ver, err := ChartAppVersion(root)
	if err != nil {
		return nil, err
	}
	certs := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(certs, testCA(), 0o644); err != nil {
		return nil, err
	}
	o := Options{Binaries: map[Platform]string{}, CACerts: certs, Version: ver, Revision: testRevision, Source: Source, Created: testCreated}
	ctx := context.Background()
	for _, p := range DefaultPlatforms() {
		bin := filepath.Join(dir, p.Architecture, "vmss-autoscaler")
		if err := BuildBinary(ctx, root, p, ver, testRevision, bin); err != nil {
			return nil, err
		}
		o.Binaries[p] = bin
	}
	idx, err := Build(o)
	if err != nil {
		return nil, err
	}
	layout := filepath.Join(dir, "oci")
	if err := WriteLayout(layout, idx, ver); err != nil {
		return nil, err
	}
	// What the tests inspect is what was written, read back.
	if idx, err = ReadLayout(layout); err != nil {
		return nil, err
	}
	data, _ := os.ReadFile(certs)
	return &built{opts: o, idx: idx, layout: layout, certs: data}, nil
})

func buildImage(t *testing.T) *built {
	t.Helper()
	b, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testCA is a freshly made self-signed CA certificate in PEM.
func testCA() []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "image test CA"},
		NotBefore: testCreated, NotAfter: testCreated.Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// images returns the index's images by platform.
func images(t *testing.T, idx v1.ImageIndex) map[string]v1.Image {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1.Image{}
	for _, d := range im.Manifests {
		if d.Platform == nil {
			t.Fatalf("manifest %s has no platform", d.Digest)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		out[d.Platform.OS+"/"+d.Platform.Architecture] = img
	}
	return out
}

// files reads an image's flattened filesystem: path → header and content.
func files(t *testing.T, img v1.Image) map[string]fileEntry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]fileEntry{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out["/"+strings.TrimSuffix(h.Name, "/")] = fileEntry{h, data}
	}
}

type fileEntry struct {
	h    *tar.Header
	data []byte
}

func TestImageIndex(t *testing.T) {
	b := buildImage(t)
	mt, err := b.idx.MediaType()
	if err != nil || mt != types.OCIImageIndex {
		t.Fatalf("index media type %s (%v), want %s", mt, err, types.OCIImageIndex)
	}
	im, err := b.idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range im.Manifests {
		platforms = append(platforms, d.Platform.String())
		if d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("%s: media type %s, want %s", d.Platform, d.MediaType, types.OCIManifestSchema1)
		}
	}
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Errorf("platforms %v, want %v", platforms, want)
	}
	for k, want := range map[string]string{LabelSource: Source, LabelVersion: b.opts.Version, LabelRevision: testRevision} {
		if im.Annotations[k] != want {
			t.Errorf("index annotation %s = %q, want %q", k, im.Annotations[k], want)
		}
	}
}

func TestImageConfig(t *testing.T) {
	b := buildImage(t)
	for platform, img := range images(t, b.idx) {
		t.Run(platform, func(t *testing.T) {
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if got := cf.OS + "/" + cf.Architecture; got != platform {
				t.Errorf("config platform %s, want %s", got, platform)
			}
			c := cf.Config
			if c.User != "65532:65532" {
				t.Errorf("user %q, want 65532:65532 (non-root, the chart's runAsUser)", c.User)
			}
			if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/vmss-autoscaler"}) || len(c.Cmd) != 0 {
				t.Errorf("entrypoint %q cmd %q, want the binary and no cmd (the chart passes args)", c.Entrypoint, c.Cmd)
			}
			for k, want := range map[string]string{
				"org.opencontainers.image.source":   "https://github.com/vmss-autoscaler/vmss-autoscaler",
				"org.opencontainers.image.version":  b.opts.Version,
				"org.opencontainers.image.revision": testRevision,
				"org.opencontainers.image.created":  "2026-03-01T12:00:00Z",
			} {
				if c.Labels[k] != want {
					t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
				}
			}
			if !cf.Created.Time.Equal(testCreated) {
				t.Errorf("created %s, want %s", cf.Created.Time, testCreated)
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 2 || m.Annotations[LabelVersion] != b.opts.Version {
				t.Errorf("manifest: config %s, %d layers, annotations %v", m.Config.MediaType, len(m.Layers), m.Annotations)
			}
			for _, l := range m.Layers {
				if l.MediaType != types.OCILayer {
					t.Errorf("layer %s media type %s, want %s", l.Digest, l.MediaType, types.OCILayer)
				}
			}
		})
	}
}

func TestImageFiles(t *testing.T) {
	b := buildImage(t)
	machines := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}
	var baseLayers []v1.Hash
	for platform, img := range images(t, b.idx) {
		t.Run(platform, func(t *testing.T) {
			fs := files(t, img)
			passwd := string(fs["/etc/passwd"].data)
			if !strings.Contains(passwd, "nonroot:x:65532:65532:") || !strings.Contains(string(fs["/etc/group"].data), "nonroot:x:65532:") {
				t.Errorf("no nonroot user 65532 in /etc/passwd, /etc/group:\n%s", passwd)
			}
			if got := fs["/etc/ssl/certs/ca-certificates.crt"]; string(got.data) != string(b.certs) || got.h.Mode != 0o644 {
				t.Errorf("CA bundle: %d bytes mode %o, want the %d bytes given, 0644", len(got.data), got.h.Mode, len(b.certs))
			}
			if tmp := fs["/tmp"]; tmp.h == nil || tmp.h.Mode != 0o1777 {
				t.Errorf("/tmp missing or not 1777")
			}
			for _, shell := range []string{"/bin/sh", "/bin/bash", "/bin/busybox", "/usr/bin/sh", "/sbin/nologin"} {
				if _, ok := fs[shell]; ok {
					t.Errorf("%s is in the image; it must have no shell", shell)
				}
			}
			bin, ok := fs["/usr/local/bin/vmss-autoscaler"]
			if !ok {
				t.Fatal("no /usr/local/bin/vmss-autoscaler")
			}
			if bin.h.Mode != 0o755 || bin.h.Uid != 0 {
				t.Errorf("binary mode %o uid %d, want 0755 root-owned (not writable by the user)", bin.h.Mode, bin.h.Uid)
			}
			for p, f := range fs {
				if !f.h.ModTime.Equal(testCreated) {
					t.Errorf("%s mtime %s, want %s (reproducible)", p, f.h.ModTime, testCreated)
				}
			}
			ef, err := elf.NewFile(strings.NewReader(string(bin.data)))
			if err != nil {
				t.Fatal(err)
			}
			if ef.Machine != machines[platform] {
				t.Errorf("binary for %s is %s", platform, ef.Machine)
			}
			for _, p := range ef.Progs {
				if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
					t.Errorf("binary is dynamically linked (%s): the image has no libc", p.Type)
				}
			}
			ls, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			d, err := ls[0].Digest()
			if err != nil {
				t.Fatal(err)
			}
			baseLayers = append(baseLayers, d)
		})
	}
	if len(baseLayers) == 2 && baseLayers[0] != baseLayers[1] {
		t.Errorf("base layers differ across platforms (%s, %s): the same bytes should be stored once", baseLayers[0], baseLayers[1])
	}
}

// TestImageBinaryRuns runs the binary taken out of the image's layer for
// this machine's platform: --version prints what the build stamped.
func TestImageBinaryRuns(t *testing.T) {
	b := buildImage(t)
	platform := runtime.GOOS + "/" + runtime.GOARCH
	img, ok := images(t, b.idx)[platform]
	if !ok {
		t.Skipf("no image for this machine's platform %s", platform)
	}
	bin := filepath.Join(t.TempDir(), "vmss-autoscaler")
	if err := os.WriteFile(bin, files(t, img)["/usr/local/bin/vmss-autoscaler"].data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, arg := range []string{"--version", "version"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", arg, err, out)
		}
		want := fmt.Sprintf("vmss-autoscaler %s (commit %s, ", b.opts.Version, testRevision)
		if !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), platform) {
			t.Errorf("%s printed %q, want it to start with %q and name %s", arg, out, want, platform)
		}
	}
}

// TestChartAppVersionIsTheImageVersion: make image tags and stamps the
// chart's appVersion, and the chart's default image tag is that version,
// so the chart installs the image make image built.
func TestChartAppVersionIsTheImageVersion(t *testing.T) {
	b := buildImage(t)
	objs, err := charts.Render("../../charts/vmss-autoscaler", nil, "vmss-autoscaler", "kube-system")
	if err != nil {
		t.Fatal(err)
	}
	var images []string
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
			continue
		}
		images = append(images, containerImages(o.Object)...)
	}
	if len(images) < 2 {
		t.Fatalf("found %d container images in the chart", len(images))
	}
	for _, img := range images {
		ref, err := name.ParseReference(img)
		if err != nil {
			t.Fatalf("chart image %q: %v", img, err)
		}
		if ref.Identifier() != b.opts.Version {
			t.Errorf("chart image %s: tag %s, want the image version %s (Chart.yaml appVersion)", img, ref.Identifier(), b.opts.Version)
		}
	}
}

// containerImages lists the images of a workload's pod template.
func containerImages(obj map[string]any) []string {
	cs, _, _ := unstructured.NestedSlice(obj, "spec", "template", "spec", "containers")
	var out []string
	for _, c := range cs {
		if m, ok := c.(map[string]any); ok {
			img, _ := m["image"].(string)
			out = append(out, img)
		}
	}
	return out
}

func TestBuildIsReproducible(t *testing.T) {
	b := buildImage(t)
	first, err := b.idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(b.opts)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := again.Digest(); d != first {
		t.Errorf("same inputs, digests %s and %s", first, d)
	}
	o := b.opts
	o.Revision = "fedcba9876543210fedcba9876543210fedcba98"
	other, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := other.Digest(); d == first {
		t.Errorf("another revision gave the same digest %s", d)
	}

	// The archive of the layout: the same bytes twice, and a layout inside.
	dir := t.TempDir()
	a1, a2 := filepath.Join(dir, "1.tar"), filepath.Join(dir, "2.tar")
	for _, a := range []string{a1, a2} {
		if err := WriteArchive(b.layout, a, testCreated); err != nil {
			t.Fatal(err)
		}
	}
	d1, _ := os.ReadFile(a1)
	d2, _ := os.ReadFile(a2)
	if string(d1) != string(d2) {
		t.Error("two archives of one layout differ")
	}
	names := map[string]bool{}
	tr := tar.NewReader(strings.NewReader(string(d1)))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names[h.Name] = true
	}
	dgst := first.Hex
	for _, want := range []string{"oci-layout", "index.json", "blobs/sha256/" + dgst} {
		if !names[want] {
			t.Errorf("archive lacks %s", want)
		}
	}
}

// TestPush pushes the layout to an in-process registry on 127.0.0.1 that
// demands basic auth, with the credentials in a Docker config file: the
// standard keychain must find them.
func TestPush(t *testing.T) {
	b := buildImage(t)
	const user, pass = "pusher", "s3cret"
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	reg := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != want {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"credentials required"}]}`, http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/vmss-autoscaler:" + b.opts.Version
	ctx := context.Background()

	t.Setenv("DOCKER_CONFIG", t.TempDir())
	if _, err := Push(ctx, b.layout, ref); err == nil || !strings.Contains(err.Error(), "401 Unauthorized") {
		t.Fatalf("push without credentials: err = %v, want 401 Unauthorized", err)
	}
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
	if err := os.WriteFile(filepath.Join(os.Getenv("DOCKER_CONFIG"), "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	digest, err := Push(ctx, b.layout, ref)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := b.idx.Digest(); d != digest {
		t.Errorf("pushed %s, the layout's index is %s", digest, d)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	auth := remote.WithAuth(&authn.Basic{Username: user, Password: pass})
	desc, err := remote.Get(r, auth)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != digest || desc.MediaType != types.OCIImageIndex {
		t.Errorf("registry has %s (%s) at %s, want the index %s", desc.Digest, desc.MediaType, ref, digest)
	}
	arm, err := remote.Image(r, auth, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "arm64"}))
	if err != nil {
		t.Fatal(err)
	}
	if cf, err := arm.ConfigFile(); err != nil || cf.Architecture != "arm64" || cf.Config.User != User {
		t.Errorf("pulled arm64 image: %+v, %v", cf, err)
	}

	for _, tc := range []struct{ ref, want string }{
		{"", "IMAGE: required"},
		{"UPPER/case:tag", `IMAGE="UPPER/case:tag"`},
	} {
		if _, err := Push(ctx, b.layout, tc.ref); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Push(%q): err = %v, want %q", tc.ref, err, tc.want)
		}
	}
	if _, err := Push(ctx, filepath.Join(t.TempDir(), "none"), ref); err == nil || !strings.Contains(err.Error(), "make image") {
		t.Errorf("Push without a layout: err = %v, want a hint to run make image", err)
	}
}

func TestReadCACerts(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := testCA()
	tests := []struct {
		name, file, want string
	}{
		{"a bundle", write("ok.pem", append(append([]byte("# comment\n"), good...), good...)), ""},
		{"missing", filepath.Join(dir, "missing.pem"), "not found: install the ca-certificates package"},
		{"not PEM", write("text.pem", []byte("hello\n")), "no PEM certificate in 6 bytes"},
		{"only a key", write("key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})), "no PEM certificate"},
		{"broken certificate", write("bad.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}})), "certificate 1:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCACerts(tc.file)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.file) {
				t.Fatalf("err = %v, want one naming %s and containing %q", err, tc.file, tc.want)
			}
		})
	}
}

func TestBuildRejectsBadOptions(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	certs := filepath.Join(dir, "ca.pem")
	for p, data := range map[string][]byte{bin: []byte("\x7fELF"), certs: testCA()} {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ok := func() Options {
		return Options{Binaries: map[Platform]string{{"linux", "amd64"}: bin}, CACerts: certs, Version: "0.1.0", Revision: "abc", Source: Source}
	}
	tests := []struct {
		name   string
		change func(*Options)
		want   string
	}{
		{"no binaries", func(o *Options) { o.Binaries = nil }, "binaries: at least one platform"},
		{"missing binary", func(o *Options) { o.Binaries[Platform{"linux", "arm64"}] = filepath.Join(dir, "nope") }, "binaries[linux/arm64]="},
		{"version not a tag", func(o *Options) { o.Version = "1.0 beta" }, `version "1.0 beta": must be usable as an image tag`},
		{"version with a plus", func(o *Options) { o.Version = "1.0+build" }, `version "1.0+build"`},
		{"no revision", func(o *Options) { o.Revision = "" }, `revision "": required`},
		{"no source", func(o *Options) { o.Source = "" }, "source: required"},
		{"no certificates", func(o *Options) { o.CACerts = filepath.Join(dir, "none.pem") }, "CA certificates"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := ok()
			tc.change(&o)
			if _, err := Build(o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := Build(ok()); err != nil {
		t.Fatalf("good options: %v", err)
	}
}

func TestParsePlatform(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"linux/amd64", "linux/amd64", ""},
		{"linux/arm64", "linux/arm64", ""},
		{"amd64", "", "want os/arch"},
		{"windows/amd64", "", "only linux images"},
		{"linux/arm/v7", "", "want os/arch"},
	} {
		p, err := ParsePlatform(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParsePlatform(%q) err = %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || p.String() != tc.want {
			t.Errorf("ParsePlatform(%q) = %v, %v", tc.in, p, err)
		}
	}
}
