package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

const (
	version   = "v0.1.0"
	imageRepo = "registry.example/shardkeeper"
)

var platforms = []struct{ os, arch string }{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}

// TestReleaseWritesEveryArtifactPinnedToItsVersion runs hack/release.sh
// (what `make release VERSION=v0.1.0` runs) into a temporary directory
// and checks every file it promises.
func TestReleaseWritesEveryArtifactPinnedToItsVersion(t *testing.T) {
	root := repoRoot(t)
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "VERSION="+version, "IMAGE_REPO="+imageRepo, "REVISION=0123abc")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/release.sh: %v\n%s", err, b)
	}

	want := []string{"checksums.txt", "install-namespaced.yaml", "install.yaml", "shardkeeper-0.1.0.tgz", "shardkeeper.yaml"}
	for _, p := range platforms {
		want = append(want, archiveName(p.os, p.arch))
	}
	slices.Sort(want)
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("release files:\n got  %v\n want %v", got, want)
	}

	t.Run("install manifests run the release's image", func(t *testing.T) {
		for _, name := range []string{"install.yaml", "install-namespaced.yaml"} {
			b := read(t, filepath.Join(out, name))
			images := regexp.MustCompile(`(?m)^\s+image: (\S+)$`).FindAllStringSubmatch(string(b), -1)
			if len(images) != 1 || images[0][1] != imageRepo+":"+version {
				t.Errorf("%s: images %v, want only %s:%s", name, images, imageRepo, version)
			}
		}
		if !bytes.Contains(read(t, filepath.Join(out, "install-namespaced.yaml")), []byte("--watch-namespace=$(POD_NAMESPACE)")) {
			t.Error("install-namespaced.yaml does not limit the operator to its namespace")
		}
	})

	t.Run("the chart is versioned and defaults to the release's image", func(t *testing.T) {
		files := untar(t, filepath.Join(out, "shardkeeper-0.1.0.tgz"))
		var chart struct{ Name, Version, AppVersion string }
		if err := yaml.Unmarshal(files["shardkeeper/Chart.yaml"], &chart); err != nil {
			t.Fatal(err)
		}
		if chart.Name != "shardkeeper" || chart.Version != "0.1.0" || chart.AppVersion != version {
			t.Errorf("Chart.yaml: name %q version %q appVersion %q, want shardkeeper 0.1.0 %s", chart.Name, chart.Version, chart.AppVersion, version)
		}
		var values struct {
			Image struct{ Repository, Tag string }
		}
		if err := yaml.Unmarshal(files["shardkeeper/values.yaml"], &values); err != nil {
			t.Fatal(err)
		}
		if values.Image.Repository != imageRepo || values.Image.Tag != "" {
			t.Errorf("values.yaml: image %+v, want repository %s and the tag left to appVersion", values.Image, imageRepo)
		}
		// Every file of charts/shardkeeper is packaged, and nothing else.
		var tree []string
		src := filepath.Join(root, "charts", "shardkeeper")
		err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(src, p)
				tree = append(tree, "shardkeeper/"+filepath.ToSlash(rel))
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var packaged []string
		for name := range files {
			packaged = append(packaged, name)
		}
		slices.Sort(tree)
		slices.Sort(packaged)
		if !slices.Equal(tree, packaged) {
			t.Errorf("packaged %v\nwant %v", packaged, tree)
		}
	})

	t.Run("plugin archives hold each platform's binary", func(t *testing.T) {
		for _, p := range platforms {
			files := untar(t, filepath.Join(out, archiveName(p.os, p.arch)))
			if len(files) != 2 || files["LICENSE"] == nil {
				t.Errorf("%s/%s: archive holds %d files, want kubectl-shardkeeper and LICENSE", p.os, p.arch, len(files))
			}
			bin := files["kubectl-shardkeeper"]
			if got := machine(t, p.os, bin); got != p.arch {
				t.Errorf("%s/%s: kubectl-shardkeeper is built for %s", p.os, p.arch, got)
			}
			if !bytes.Contains(bin, []byte(version)) {
				t.Errorf("%s/%s: the binary does not carry %s", p.os, p.arch, version)
			}
			if p.os == runtime.GOOS && p.arch == runtime.GOARCH {
				exe := filepath.Join(t.TempDir(), "kubectl-shardkeeper")
				if err := os.WriteFile(exe, bin, 0o755); err != nil {
					t.Fatal(err)
				}
				outb, err := exec.Command(exe, "version").CombinedOutput()
				if err != nil || !strings.Contains(string(outb), version) {
					t.Errorf("kubectl-shardkeeper version: %v\n%s\nwant it to name %s", err, outb, version)
				}
			}
		}
	})

	t.Run("checksums match every file", func(t *testing.T) {
		sums := map[string]string{}
		sc := bufio.NewScanner(bytes.NewReader(read(t, filepath.Join(out, "checksums.txt"))))
		for sc.Scan() {
			sum, name, ok := strings.Cut(sc.Text(), "  ")
			if !ok {
				t.Fatalf("checksums.txt: line %q is not `sum  name`", sc.Text())
			}
			sums[name] = sum
		}
		for _, name := range want {
			if name == "checksums.txt" {
				continue
			}
			if got := sha256File(t, filepath.Join(out, name)); sums[name] != got {
				t.Errorf("checksums.txt gives %s %q, the file's is %s", name, sums[name], got)
			}
		}
	})

	t.Run("the krew manifest names the archives with their sums", func(t *testing.T) {
		manifest := filepath.Join(out, "shardkeeper.yaml")
		validate := exec.Command("go", "run", "./hack/krewmanifest", "-validate", manifest)
		validate.Dir = root
		if b, err := validate.CombinedOutput(); err != nil {
			t.Fatalf("krew rules: %v\n%s", err, b)
		}
		var plugin struct {
			Spec struct {
				Version   string
				Platforms []struct {
					URI, Sha256, Bin string
					Selector         struct{ MatchLabels map[string]string }
				}
			}
		}
		if err := yaml.Unmarshal(read(t, manifest), &plugin); err != nil {
			t.Fatal(err)
		}
		if plugin.Spec.Version != version {
			t.Errorf("spec.version %q, want %s", plugin.Spec.Version, version)
		}
		if len(plugin.Spec.Platforms) != len(platforms) {
			t.Fatalf("%d platforms, want %d", len(plugin.Spec.Platforms), len(platforms))
		}
		for _, pl := range plugin.Spec.Platforms {
			name := archiveName(pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"])
			if !strings.HasSuffix(pl.URI, "/releases/download/"+version+"/"+name) {
				t.Errorf("%v: uri %s does not name %s of %s", pl.Selector.MatchLabels, pl.URI, name, version)
			}
			if got := sha256File(t, filepath.Join(out, name)); pl.Sha256 != got {
				t.Errorf("%v: sha256 %s, the archive's is %s", pl.Selector.MatchLabels, pl.Sha256, got)
			}
		}
	})
}

func TestReleaseRefusesAVersionThatIsNotATagOrNotInTheChangelog(t *testing.T) {
	root := repoRoot(t)
	for _, v := range []string{"latest", "0.1.0", "v0.1", "v9.9.9"} {
		out := t.TempDir()
		cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), out)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "VERSION="+v)
		b, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("VERSION=%s: release.sh succeeded", v)
		} else if !strings.Contains(string(b), v) {
			t.Errorf("VERSION=%s: the refusal does not name it: %s", v, b)
		}
		if entries, _ := os.ReadDir(out); len(entries) > 0 {
			t.Errorf("VERSION=%s: release.sh wrote %d files before refusing", v, len(entries))
		}
	}
}

// TestTheTreeNamesTheNewestChangelogVersion keeps one version in every
// place a user reads one: a checkout installs the release it belongs to,
// never :latest.
func TestTheTreeNamesTheNewestChangelogVersion(t *testing.T) {
	root := repoRoot(t)
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+[^\]]*)\]`).FindSubmatch(read(t, filepath.Join(root, "CHANGELOG.md")))
	if m == nil {
		t.Fatal("CHANGELOG.md has no `## [X.Y.Z]` entry")
	}
	newest := "v" + string(m[1])
	var chart struct{ Version, AppVersion string }
	if err := yaml.Unmarshal(read(t, filepath.Join(root, "charts", "shardkeeper", "Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	checks := map[string]string{
		"charts/shardkeeper/Chart.yaml appVersion": chart.AppVersion,
		"charts/shardkeeper/Chart.yaml version":    "v" + chart.Version,
		"config/manager newTag":                    field(t, root, "config/manager/kustomization.yaml", `(?m)^\s+newTag: (\S+)$`),
		"config/samples worker image":              field(t, root, "config/samples/worker_statefulset.yaml", `(?m)^\s+image: shardkeeper-worker:(\S+)$`),
	}
	for where, v := range checks {
		if v != newest {
			t.Errorf("%s is %q, want the newest CHANGELOG.md entry %s", where, v, newest)
		}
	}
}

func field(t *testing.T, root, file, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindSubmatch(read(t, filepath.Join(root, file)))
	if m == nil {
		t.Fatalf("%s: no match for %s", file, re)
	}
	return string(m[1])
}

func archiveName(goos, arch string) string {
	return "kubectl-shardkeeper_" + version + "_" + goos + "_" + arch + ".tar.gz"
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	s := sha256.Sum256(read(t, p))
	return hex.EncodeToString(s[:])
}

func untar(t *testing.T, p string) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(read(t, p)))
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s is owned by %d:%d, want root", p, h.Name, h.Uid, h.Gid)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

// machine says which GOARCH an executable of goos was built for.
func machine(t *testing.T, goos string, bin []byte) string {
	t.Helper()
	switch goos {
	case "linux":
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("not ELF: %v", err)
		}
		return map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}[f.Machine]
	case "darwin":
		f, err := macho.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("not Mach-O: %v", err)
		}
		return map[macho.Cpu]string{macho.CpuAmd64: "amd64", macho.CpuArm64: "arm64"}[f.Cpu]
	}
	t.Fatalf("no check for %s", goos)
	return ""
}
