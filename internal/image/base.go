package image

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Labels naming the base of an image built on one (image-spec annotations).
const (
	LabelBaseName   = "org.opencontainers.image.base.name"
	LabelBaseDigest = "org.opencontainers.image.base.digest"
)

// Base is a pulled base image: its reference, digest, and its image for
// each platform asked for.
type Base struct {
	Ref    string
	Digest v1.Hash
	Images map[Platform]v1.Image
	// platforms are the index entries' platforms (with their variants,
	// such as arm64 v8), kept for the new index.
	platforms map[Platform]*v1.Platform
}

// PullBase reads ref (an image index, or a single image) from its
// registry with the standard keychain, unless opts say otherwise, and
// picks its image for each platform. A platform the base does not have is
// an error naming it: the preflight image must run where the autoscaler's
// does.
func PullBase(ctx context.Context, ref string, platforms []Platform, opts ...remote.Option) (*Base, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("base image %q: %w", ref, err)
	}
	all := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	desc, err := remote.Get(r, all...)
	if err != nil {
		return nil, fmt.Errorf("base image %s: %w", ref, err)
	}
	b := &Base{Ref: ref, Digest: desc.Digest, Images: map[Platform]v1.Image{}, platforms: map[Platform]*v1.Platform{}}
	pick := b.pickFromIndex
	if !desc.MediaType.IsIndex() {
		pick = b.pickSingle
	}
	if err := pick(desc, platforms); err != nil {
		return nil, err
	}
	return b, nil
}

// pickSingle takes the image desc is for every platform: it must be of
// each.
func (b *Base) pickSingle(desc *remote.Descriptor, platforms []Platform) error {
	img, err := desc.Image()
	if err != nil {
		return fmt.Errorf("base image %s: %w", b.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("base image %s: config: %w", b.Ref, err)
	}
	for _, p := range platforms {
		if cf.OS != p.OS || cf.Architecture != p.Architecture {
			return fmt.Errorf("base image %s is a single %s/%s image, no %s one", b.Ref, cf.OS, cf.Architecture, p)
		}
		b.Images[p], b.platforms[p] = img, &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
	}
	return nil
}

// pickFromIndex takes each platform's image of the index desc is.
func (b *Base) pickFromIndex(desc *remote.Descriptor, platforms []Platform) error {
	idx, err := desc.ImageIndex()
	if err != nil {
		return fmt.Errorf("base image %s: %w", b.Ref, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return fmt.Errorf("base image %s: %w", b.Ref, err)
	}
	for _, p := range platforms {
		found := platformImage(im, p)
		if found == nil {
			return fmt.Errorf("base image %s has no %s image", b.Ref, p)
		}
		img, err := idx.Image(found.Digest)
		if err != nil {
			return fmt.Errorf("base image %s for %s: %w", b.Ref, p, err)
		}
		b.Images[p], b.platforms[p] = img, found.Platform
	}
	return nil
}

// platformImage is the index's first image for p, nil without one.
func platformImage(im *v1.IndexManifest, p Platform) *v1.Descriptor {
	for i, d := range im.Manifests {
		if d.Platform != nil && d.Platform.OS == p.OS && d.Platform.Architecture == p.Architecture && d.MediaType.IsImage() {
			return &im.Manifests[i]
		}
	}
	return nil
}

// OnBase builds the binaries into base, for the preflight agent, whose
// checks run the GPU tools a base such as NVIDIA's DCGM image has: per
// platform, the base image plus the binary's layer, the binary as
// entrypoint (no cmd), the base's user, environment and working directory
// kept, and the labels of Build plus the base's name and digest. The index
// is an OCI index, or a Docker manifest list over a Docker base.
func OnBase(o Options, base *Base) (v1.ImageIndex, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("image options: %w", err)
	}
	created := o.Created.UTC().Truncate(time.Second)
	labels := o.labels(created)
	labels[LabelBaseName] = base.Ref
	labels[LabelBaseDigest] = base.Digest.String()
	labels[LabelTitle] = "vmss-autoscaler-preflight"
	indexType := types.OCIImageIndex
	for p := range o.Binaries {
		img, ok := base.Images[p]
		if !ok {
			return nil, fmt.Errorf("base image %s: no %s image pulled", base.Ref, p)
		}
		if mt, err := img.MediaType(); err != nil {
			return nil, fmt.Errorf("base image %s for %s: %w", base.Ref, p, err)
		} else if mt == types.DockerManifestSchema2 {
			indexType = types.DockerManifestList
		}
	}
	return assemble(o, created, labels, indexType, func(p Platform) (platformed, error) {
		img := base.Images[p]
		layerType := types.OCILayer
		if mt, _ := img.MediaType(); mt == types.DockerManifestSchema2 {
			layerType = types.DockerLayer
		}
		bin, err := binaryLayer(o, p, created, layerType)
		if err != nil {
			return platformed{}, err
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: bin, History: history(created, BinaryPath, "binary")})
		if err != nil {
			return platformed{}, err
		}
		img, err = withConfig(img, created, func(cf *v1.ConfigFile) {
			cf.Config.Entrypoint = []string{BinaryPath}
			cf.Config.Cmd = nil
			merged := maps.Clone(cf.Config.Labels)
			if merged == nil {
				merged = map[string]string{}
			}
			maps.Copy(merged, labels)
			cf.Config.Labels = merged
		})
		return platformed{img, base.platforms[p]}, err
	})
}
