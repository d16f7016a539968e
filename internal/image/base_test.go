package image

import (
	"context"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// toolsBase is a stand-in for a GPU-tools base such as NVIDIA's DCGM
// image: per platform a layer with a shell and dcgmi, root, a PATH, a cmd.
// docker: Docker media types (as many registries' images still have).
func toolsBase(t *testing.T, docker bool, platforms ...Platform) v1.ImageIndex {
	t.Helper()
	manifest, config, index, layerType := types.OCIManifestSchema1, types.OCIConfigJSON, types.OCIImageIndex, types.OCILayer
	if docker {
		manifest, config, index, layerType = types.DockerManifestSchema2, types.DockerConfigJSON, types.DockerManifestList, types.DockerLayer
	}
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		l, err := layer([]file{
			{name: "bin", dir: true, mode: 0o755}, {name: "bin/sh", mode: 0o755, data: []byte("sh " + p.Architecture)},
			{name: "usr", dir: true, mode: 0o755}, {name: "usr/bin", dir: true, mode: 0o755},
			{name: "usr/bin/dcgmi", mode: 0o755, data: []byte("dcgmi")},
		}, testCreated, layerType)
		if err != nil {
			t.Fatal(err)
		}
		img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, manifest), config), l)
		if err != nil {
			t.Fatal(err)
		}
		img, err = withConfig(img, testCreated, func(cf *v1.ConfigFile) {
			cf.OS, cf.Architecture = p.OS, p.Architecture
			cf.Config = v1.Config{User: "0", Env: []string{"PATH=/usr/bin:/bin"}, Cmd: []string{"/bin/sh"},
				Labels: map[string]string{"com.nvidia.dcgm": "4.2.3", LabelVersion: "base-version"}}
		})
		if err != nil {
			t.Fatal(err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Architecture}}})
	}
	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, index), adds...)
}

// pushBase serves a registry on 127.0.0.1 holding idx as <host>/dcgm:base.
func pushBase(t *testing.T, idx v1.ImageIndex) string {
	t.Helper()
	srv := httptest.NewServer(registry.New())
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/dcgm:base"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	return ref
}

// TestPreflightImageOnABase: the binaries built into a GPU-tools base
// pulled from a registry keep the base's tools, user and environment, run
// the binary, and carry our labels and the base's name and digest; OCI and
// Docker bases alike.
func TestPreflightImageOnABase(t *testing.T) {
	b := buildImage(t)
	for _, docker := range []bool{false, true} {
		name := "OCI base"
		if docker {
			name = "Docker base"
		}
		t.Run(name, func(t *testing.T) {
			ref := pushBase(t, toolsBase(t, docker, DefaultPlatforms()...))
			base, err := PullBase(context.Background(), ref, DefaultPlatforms())
			if err != nil {
				t.Fatal(err)
			}
			idx, err := OnBase(b.opts, base)
			if err != nil {
				t.Fatal(err)
			}
			wantIndex := types.OCIImageIndex
			if docker {
				wantIndex = types.DockerManifestList
			}
			if mt, _ := idx.MediaType(); mt != wantIndex {
				t.Errorf("index media type %s, want %s", mt, wantIndex)
			}
			imgs := images(t, idx)
			if len(imgs) != 2 {
				t.Fatalf("platforms %v", imgs)
			}
			for platform, img := range imgs {
				cf, err := img.ConfigFile()
				if err != nil {
					t.Fatal(err)
				}
				c := cf.Config
				if cf.OS+"/"+cf.Architecture != platform || c.User != "0" || !slices.Equal(c.Entrypoint, []string{BinaryPath}) || len(c.Cmd) != 0 ||
					!slices.Contains(c.Env, "PATH=/usr/bin:/bin") {
					t.Errorf("%s config: %s/%s user %q entrypoint %q cmd %q env %q", platform, cf.OS, cf.Architecture, c.User, c.Entrypoint, c.Cmd, c.Env)
				}
				for k, want := range map[string]string{LabelVersion: b.opts.Version, LabelRevision: testRevision, LabelBaseName: ref,
					LabelBaseDigest: base.Digest.String(), "com.nvidia.dcgm": "4.2.3"} {
					if c.Labels[k] != want {
						t.Errorf("%s label %s = %q, want %q", platform, k, c.Labels[k], want)
					}
				}
				fs := files(t, img)
				arch := strings.TrimPrefix(platform, "linux/")
				if string(fs["/bin/sh"].data) != "sh "+arch || string(fs["/usr/bin/dcgmi"].data) != "dcgmi" {
					t.Errorf("%s: the base's tools are gone or from another platform", platform)
				}
				if bin := fs[BinaryPath]; bin.h == nil || bin.h.Mode != 0o755 {
					t.Errorf("%s: no binary at %s", platform, BinaryPath)
				}
				ls, _ := img.Layers()
				last, _ := ls[len(ls)-1].MediaType()
				if (docker && last != types.DockerLayer) || (!docker && last != types.OCILayer) {
					t.Errorf("%s: binary layer media type %s in a %v base", platform, last, name)
				}
			}
		})
	}
}

func TestPullBaseRejectsMissingPlatforms(t *testing.T) {
	amd64 := Platform{"linux", "amd64"}
	ref := pushBase(t, toolsBase(t, false, amd64))
	if _, err := PullBase(context.Background(), ref, DefaultPlatforms()); err == nil || !strings.Contains(err.Error(), "has no linux/arm64 image") ||
		!strings.Contains(err.Error(), ref) {
		t.Errorf("err = %v, want one naming %s and linux/arm64", err, ref)
	}
	if base, err := PullBase(context.Background(), ref, []Platform{amd64}); err != nil || base.Images[amd64] == nil {
		t.Errorf("PullBase(amd64) = %v, %v", base, err)
	}
	// A single image (no index) is its own platform only.
	one := toolsBase(t, false, amd64)
	img, err := one.Image(mustDigest(t, one))
	if err != nil {
		t.Fatal(err)
	}
	single := strings.TrimSuffix(ref, ":base") + ":single"
	r, _ := name.ParseReference(single)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	if _, err := PullBase(context.Background(), single, DefaultPlatforms()); err == nil || !strings.Contains(err.Error(), "single linux/amd64 image, no linux/arm64 one") {
		t.Errorf("err = %v", err)
	}
	if _, err := PullBase(context.Background(), single, []Platform{amd64}); err != nil {
		t.Errorf("a single amd64 base for amd64: %v", err)
	}
}

// mustDigest is the digest of idx's first manifest.
func mustDigest(t *testing.T, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) == 0 {
		t.Fatalf("index: %v", err)
	}
	return im.Manifests[0].Digest
}
