package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// elfMachine is what each platform's binary must be built for.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// TestLayoutHoldsAnIndexWithEveryPlatformAndItsOwnBinary cross-compiles a
// small static program for linux/amd64 and linux/arm64 under both image
// names, builds the layouts, and reads them back as a registry client
// would: one image index per image, one manifest per platform, and in each
// platform's layer a binary whose ELF machine is that platform's.
func TestLayoutHoldsAnIndexWithEveryPlatformAndItsOwnBinary(t *testing.T) {
	ctx := t.TempDir()
	platforms, err := ParsePlatforms("linux/amd64,linux/arm64")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range platforms {
		dir := filepath.Join(ctx, p.OS+"_"+p.Architecture)
		for _, im := range Images {
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, im.Name), src)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture, "GOFLAGS=")
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("build for %s: %v\n%s", p, err, b)
			}
		}
	}
	for name, content := range map[string]string{"ca-certificates.crt": "-----BEGIN CERTIFICATE-----\n", "LICENSE": "Apache License\n"} {
		if err := os.WriteFile(filepath.Join(ctx, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	o := Options{Context: ctx, Out: out, Version: "v9.8.7", Revision: "abc", Source: "https://example.invalid/src", Platforms: platforms, Created: time.Unix(0, 0).UTC(), Images: Images}
	if err := Build(o); err != nil {
		t.Fatal(err)
	}

	digests := map[string]v1.Hash{}
	for _, im := range Images {
		t.Run(im.Name, func(t *testing.T) {
			idx := CheckLayout(t, filepath.Join(out, im.Name), "v9.8.7", im.Name, []string{"linux/amd64", "linux/arm64"})
			d, err := idx.Digest()
			if err != nil {
				t.Fatal(err)
			}
			digests[im.Name] = d
		})
	}

	t.Run("the same inputs give the same digests", func(t *testing.T) {
		again := t.TempDir()
		o.Out = again
		if err := Build(o); err != nil {
			t.Fatal(err)
		}
		for _, im := range Images {
			p, err := layout.FromPath(filepath.Join(again, im.Name))
			if err != nil {
				t.Fatal(err)
			}
			ii, err := p.ImageIndex()
			if err != nil {
				t.Fatal(err)
			}
			m, err := ii.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.Manifests[0].Digest != digests[im.Name] {
				t.Errorf("%s: digest %s, first build %s", im.Name, m.Manifests[0].Digest, digests[im.Name])
			}
		}
	})
}

func TestParsePlatformsRefusesWhatIsNotOSSlashArch(t *testing.T) {
	for _, s := range []string{"", "linux", "linux/", "/arm64", "linux/arm/v7/x"} {
		if _, err := ParsePlatforms(s); err == nil {
			t.Errorf("ParsePlatforms(%q) accepted it", s)
		}
	}
}

// CheckLayout reads the OCI layout at dir and checks it holds one image
// index tagged version with exactly the platforms given, each image's
// config and layer saying and holding what the Dockerfile's target would.
// It returns that index.
func CheckLayout(t *testing.T, dir, version, binary string, platforms []string) v1.ImageIndex {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 {
		t.Fatalf("index.json lists %d entries, want 1", len(tm.Manifests))
	}
	desc := tm.Manifests[0]
	if desc.MediaType != types.OCIImageIndex {
		t.Fatalf("index.json's entry is a %s, want an OCI image index", desc.MediaType)
	}
	if ref := desc.Annotations["org.opencontainers.image.ref.name"]; ref != version {
		t.Errorf("ref name %q, want %q", ref, version)
	}
	idx, err := top.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			t.Fatalf("manifest %s has no platform", m.Digest)
		}
		plat := m.Platform.OS + "/" + m.Platform.Architecture
		got = append(got, plat)
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS+"/"+cf.Architecture != plat {
			t.Errorf("%s: the config says %s/%s", plat, cf.OS, cf.Architecture)
		}
		if cf.Config.User != "65532:65532" || !slices.Equal(cf.Config.Entrypoint, []string{"/" + binary}) {
			t.Errorf("%s: user %q entrypoint %v, want 65532:65532 and /%s", plat, cf.Config.User, cf.Config.Entrypoint, binary)
		}
		if v := cf.Config.Labels["org.opencontainers.image.version"]; v != version {
			t.Errorf("%s: label version %q, want %q", plat, v, version)
		}
		files := layerFiles(t, img)
		for _, want := range []string{"etc/ssl/certs/ca-certificates.crt", "licenses/LICENSE"} {
			if _, ok := files[want]; !ok {
				t.Errorf("%s: the layer lacks %s", plat, want)
			}
		}
		bin, ok := files[binary]
		if !ok {
			t.Fatalf("%s: the layer lacks the binary %s (has %v)", plat, binary, keys(files))
		}
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("%s: %s is not an ELF file: %v", plat, binary, err)
		}
		if want := elfMachine[m.Platform.Architecture]; f.Machine != want {
			t.Errorf("%s: %s is built for %s, want %s", plat, binary, f.Machine, want)
		}
	}
	if !slices.Equal(got, platforms) {
		t.Errorf("platforms %v, want %v", got, platforms)
	}
	return idx
}

func layerFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				files[h.Name] = b
			}
		}
		rc.Close()
	}
	return files
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestBuiltLayoutsAreComplete checks layouts `make oci-images` wrote, when
// OCI_CHECK_DIR names their directory (and OCI_CHECK_VERSION their
// version), with the same checks as above and the real binaries:
//
//	OCI_CHECK_DIR=$PWD/bin/oci OCI_CHECK_VERSION=v0.1.0 go test -run TestBuiltLayoutsAreComplete ./hack/ocilayout
func TestBuiltLayoutsAreComplete(t *testing.T) {
	dir, version := os.Getenv("OCI_CHECK_DIR"), os.Getenv("OCI_CHECK_VERSION")
	if dir == "" || version == "" {
		t.Skip("OCI_CHECK_DIR and OCI_CHECK_VERSION are unset: no built layouts to check")
	}
	for _, im := range Images {
		t.Run(im.Name, func(t *testing.T) {
			CheckLayout(t, filepath.Join(dir, im.Name), version, im.Name, []string{"linux/amd64", "linux/arm64"})
		})
	}
}
