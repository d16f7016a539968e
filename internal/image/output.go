package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// WriteLayout writes idx as an OCI image layout in dir, replacing what was
// there: index.json holds one descriptor, of the image index, named by tag
// (org.opencontainers.image.ref.name), so that `skopeo copy oci:<dir>:<tag>`
// and the like find it.
func WriteLayout(dir string, idx v1.ImageIndex, tag string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{LabelRefName: tag})); err != nil {
		return fmt.Errorf("image layout %s: writing the index: %w", dir, err)
	}
	return nil
}

// ReadLayout returns the image index WriteLayout wrote in dir.
func ReadLayout(dir string) (v1.ImageIndex, error) {
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image layout %s (run make image first): %w", dir, err)
	}
	im, err := root.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image layout %s: index.json: %w", dir, err)
	}
	if len(im.Manifests) != 1 || !im.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("image layout %s: index.json has %d descriptors, want one image index", dir, len(im.Manifests))
	}
	idx, err := root.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("image layout %s: image index %s: %w", dir, im.Manifests[0].Digest, err)
	}
	return idx, nil
}

// WriteArchive writes the layout in dir as an uncompressed tarball (an
// "oci-archive": `skopeo copy oci-archive:<file>`, `podman load`, `docker
// load` with the containerd image store), entries sorted and stamped with
// mtime, so that the same layout always gives the same bytes.
func WriteArchive(dir, file string, mtime time.Time) (err error) {
	var paths []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("image archive: reading %s: %w", dir, err)
	}
	sort.Strings(paths)
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("image archive: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("image archive %s: %w", file, cerr)
		}
	}()
	tw := tar.NewWriter(f)
	for _, p := range paths {
		if err := archiveEntry(tw, dir, p, mtime); err != nil {
			return fmt.Errorf("image archive %s: %w", file, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("image archive %s: %w", file, err)
	}
	return nil
}

func archiveEntry(tw *tar.Writer, dir, p string, mtime time.Time) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(dir, p)
	if err != nil {
		return err
	}
	h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime.UTC().Truncate(time.Second), Mode: 0o644}
	switch {
	case fi.IsDir():
		h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		return tw.WriteHeader(h)
	case fi.Mode().IsRegular():
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
	default:
		return fmt.Errorf("%s: not a regular file or directory", p)
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	src, err := os.Open(p)
	if err != nil {
		return err
	}
	defer src.Close()
	if _, err := io.Copy(tw, src); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// Push pushes the image index of the layout in dir to ref (registry/name:tag
// or @digest) and returns the pushed index's digest. Credentials come from
// the standard keychain (authn.DefaultKeychain: the Docker config file,
// $DOCKER_CONFIG, credential helpers such as `az acr login`'s), unless opts
// say otherwise.
func Push(ctx context.Context, dir, ref string, opts ...remote.Option) (v1.Hash, error) {
	if ref == "" {
		return v1.Hash{}, errors.New("IMAGE: required, e.g. make push IMAGE=myregistry.azurecr.io/vmss-autoscaler:0.1.0")
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("IMAGE=%q: %w", ref, err)
	}
	idx, err := ReadLayout(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image layout %s: %w", dir, err)
	}
	all := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	if err := remote.WriteIndex(r, idx, all...); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing %s to %s: %w", digest, r, err)
	}
	return digest, nil
}
