// Command ocilayout writes the operator and worker images as OCI image
// layouts, each an image index with one image per platform (linux/amd64
// and linux/arm64 by default), without Docker, BuildKit or emulation: the
// Dockerfile only copies prebuilt static binaries, so each platform's
// image is one layer of files cross-compiled on this machine.
//
//	make oci-images VERSION=v0.1.0   # writes bin/oci/shardkeeper and bin/oci/shardkeeper-worker
//	skopeo copy --all oci:bin/oci/shardkeeper:v0.1.0 docker://registry.example/shardkeeper:v0.1.0
//
// The context directory holds ca-certificates.crt and LICENSE, and per
// platform a directory <os>_<arch> with both binaries (make oci-images
// fills it). Each image has what the Dockerfile's target has on scratch:
// the binary at /, the CA bundle, the LICENSE under /licenses, user
// 65532:65532, the binary as entrypoint and the same OCI labels. The
// distroless base of `make docker-build` is not pulled here (nothing can be
// pulled offline); the binaries need nothing from it.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Image is one image the layout holds, as a target of the Dockerfile.
type Image struct {
	// Name of the layout's directory and of the binary in the context.
	Name        string
	Title       string
	Description string
}

// Images are the Dockerfile's two targets, with its labels.
var Images = []Image{
	{Name: "shardkeeper", Title: "shardkeeper", Description: "shardkeeper operator: rolls shard topologies of NATS JetStream ingest fleets"},
	{Name: "shardkeeper-worker", Title: "shardkeeper-worker", Description: "shardkeeper reference worker: pulls its units from NATS JetStream and writes each row to PostgreSQL behind the claim's write guard"},
}

// Options say what Build writes.
type Options struct {
	Context   string
	Out       string
	Version   string
	Revision  string
	Source    string
	Platforms []v1.Platform
	// Created stamps every image; fixed, so that the same binaries give
	// the same digests.
	Created time.Time
	Images  []Image
}

func main() {
	var (
		o         Options
		platforms string
	)
	flag.StringVar(&o.Context, "context", "bin/image", "directory with ca-certificates.crt, LICENSE and <os>_<arch>/<binary> for each platform")
	flag.StringVar(&o.Out, "out", "bin/oci", "directory to write one OCI layout per image into")
	flag.StringVar(&o.Version, "version", "dev", "the images' version: their tag (ref name) and org.opencontainers.image.version")
	flag.StringVar(&o.Revision, "revision", "unknown", "org.opencontainers.image.revision")
	flag.StringVar(&o.Source, "source", "https://github.com/shardkeeper/shardkeeper", "org.opencontainers.image.source")
	flag.StringVar(&platforms, "platforms", "linux/amd64 linux/arm64", "platforms, os/arch, separated by spaces or commas")
	flag.Parse()
	var err error
	if o.Platforms, err = ParsePlatforms(platforms); err != nil {
		fmt.Fprintln(os.Stderr, "ocilayout:", err)
		os.Exit(2)
	}
	o.Created = time.Unix(0, 0).UTC()
	o.Images = Images
	if err := Build(o); err != nil {
		fmt.Fprintln(os.Stderr, "ocilayout:", err)
		os.Exit(1)
	}
}

// ParsePlatforms reads "linux/amd64 linux/arm64" (or comma-separated).
func ParsePlatforms(s string) ([]v1.Platform, error) {
	var out []v1.Platform
	for _, p := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		osName, arch, ok := strings.Cut(p, "/")
		if !ok || osName == "" || arch == "" || strings.Contains(arch, "/") {
			return nil, fmt.Errorf("platform %q: want os/arch, such as linux/arm64", p)
		}
		out = append(out, v1.Platform{OS: osName, Architecture: arch})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("platforms: none given")
	}
	return out, nil
}

// Build writes, for each image, an OCI layout at Out/<name> whose
// index.json names one image index (ref name Version) with one image per
// platform.
func Build(o Options) error {
	caBundle, err := os.ReadFile(filepath.Join(o.Context, "ca-certificates.crt"))
	if err != nil {
		return fmt.Errorf("context: %w", err)
	}
	license, err := os.ReadFile(filepath.Join(o.Context, "LICENSE"))
	if err != nil {
		return fmt.Errorf("context: %w", err)
	}
	for _, im := range o.Images {
		var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		for _, p := range o.Platforms {
			dir := filepath.Join(o.Context, p.OS+"_"+p.Architecture)
			bin, err := os.ReadFile(filepath.Join(dir, im.Name))
			if err != nil {
				return fmt.Errorf("image %s for %s: %w", im.Name, p, err)
			}
			img, err := platformImage(o, im, p, bin, caBundle, license)
			if err != nil {
				return fmt.Errorf("image %s for %s: %w", im.Name, p, err)
			}
			plat := p
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
		}
		idx = mutate.Annotations(idx, labels(o, im)).(v1.ImageIndex)
		dir := filepath.Join(o.Out, im.Name)
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		l, err := layout.Write(dir, empty.Index)
		if err != nil {
			return fmt.Errorf("layout %s: %w", dir, err)
		}
		if err := l.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": o.Version})); err != nil {
			return fmt.Errorf("layout %s: %w", dir, err)
		}
		d, err := idx.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "ocilayout: wrote %s (%s, %s)\n", dir, o.Version, d)
	}
	return nil
}

func labels(o Options, im Image) map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":      o.Source,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.vendor":      "The shardkeeper authors",
		"org.opencontainers.image.title":       im.Title,
		"org.opencontainers.image.description": im.Description,
	}
}

// platformImage is one platform's image: a single layer with the binary,
// the CA bundle and the LICENSE, run as 65532:65532.
func platformImage(o Options, im Image, p v1.Platform, bin, caBundle, license []byte) (v1.Image, error) {
	layerTar, err := rootfs(o.Created, []file{
		{"etc/", nil, 0o755},
		{"etc/ssl/", nil, 0o755},
		{"etc/ssl/certs/", nil, 0o755},
		{"etc/ssl/certs/ca-certificates.crt", caBundle, 0o644},
		{"licenses/", nil, 0o755},
		{"licenses/LICENSE", license, 0o644},
		{im.Name, bin, 0o755},
	})
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: o.Created},
		CreatedBy: "ocilayout: COPY " + im.Name + ", the CA bundle and LICENSE",
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: o.Created}
	cf.Config.User = "65532:65532"
	cf.Config.Entrypoint = []string{"/" + im.Name}
	cf.Config.Labels = labels(o, im)
	return mutate.ConfigFile(img, cf)
}

type file struct {
	name    string
	content []byte
	mode    int64
}

// rootfs is a tar of files owned by root with a fixed time, so that the
// layer's digest depends on the content only.
func rootfs(mtime time.Time, files []file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: mtime, Format: tar.FormatPAX}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.content))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
