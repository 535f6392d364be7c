package verify

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// maxTrackedSize is the largest file the repository may track outside
// testdata/: a clone should not download build output or data dumps.
const maxTrackedSize = 1 << 20

// sniffLen is how much of a file binaryContent reads, as much as git's
// own binary heuristic (buffer_is_binary) looks at.
const sniffLen = 8000

// TestNoTrackedFileIsABinaryOrLarge fails when git tracks a binary or a
// file larger than 1 MiB, outside any directory named testdata. A
// shardkeeper-worker binary of 29 MB was once committed by `go build` at
// the root; this test is what stops the next one.
func TestNoTrackedFileIsABinaryOrLarge(t *testing.T) {
	root := repoRoot(t)
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files (the check needs a git work tree and git): %v", err)
	}
	var checked int
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" || underTestdata(name) {
			continue
		}
		p := filepath.Join(root, filepath.FromSlash(name))
		st, err := os.Lstat(p)
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the work tree, or a symlink
		}
		checked++
		if st.Size() > maxTrackedSize {
			t.Errorf("%s is tracked and %d bytes, over the %d allowed (only files under a testdata/ directory may be larger)", name, st.Size(), maxTrackedSize)
			continue
		}
		if bin, err := binaryContent(p); err != nil {
			t.Error(err)
		} else if bin {
			t.Errorf("%s is tracked and binary (a NUL byte in its first %d bytes); build output belongs in .gitignore, data under a testdata/ directory", name, sniffLen)
		}
	}
	if checked == 0 {
		t.Fatal("git ls-files listed no file to check")
	}
}

// TestBinaryContentTellsTextFromBinary checks the heuristic the test
// above relies on, so that it cannot pass by judging everything text.
func TestBinaryContentTellsTextFromBinary(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		content []byte
		binary  bool
	}{
		{"go source is text", []byte("package main\n\nfunc main() {}\n"), false},
		{"UTF-8 prose is text", []byte("shardkeeper – räknar\n"), false},
		{"an ELF header is binary", []byte("\x7fELF\x02\x01\x01\x00\x00\x00"), true},
		{"a NUL late in the sniffed prefix is binary", append(bytes.Repeat([]byte("a"), sniffLen-1), 0), true},
		{"a NUL past the sniffed prefix is not seen", append(bytes.Repeat([]byte("a"), sniffLen), 0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "f")
			if err := os.WriteFile(p, tc.content, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := binaryContent(p)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.binary {
				t.Errorf("binaryContent = %v, want %v", got, tc.binary)
			}
		})
	}
	for name, want := range map[string]bool{
		"testdata/x.bin":                 true,
		"internal/foo/testdata/dump.tgz": true,
		"testdata":                       false,
		"mytestdata/x.bin":               false,
		"docs/testdata.md":               false,
	} {
		if got := underTestdata(name); got != want {
			t.Errorf("underTestdata(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestGitignoreCoversEveryBinaryGoBuildMakes finds every main package in
// the repository (this module, examples/ and hack/tools/ modules alike)
// and checks that the binary `go build` leaves behind, in the package's
// directory or, for this module's packages, at the repository's root
// (`go build ./cmd/X`), is ignored.
func TestGitignoreCoversEveryBinaryGoBuildMakes(t *testing.T) {
	root := repoRoot(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is not installed: the check needs it")
	}
	mains := map[string]bool{} // directory, relative to root, slash-separated
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "dist", "testdata", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		if isMainPackage(t, p) {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			mains[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !mains["cmd/shardkeeper-worker"] || !mains["examples/custom-worker"] {
		t.Fatalf("found main packages %v: cmd/shardkeeper-worker and examples/custom-worker are missing, so the walk is broken", mains)
	}
	for dir := range mains {
		base := path.Base(dir)
		if dir == "." {
			base = "shardkeeper" // the module's last path element
		}
		bins := []string{path.Join(dir, base)}
		if !inNestedModule(root, dir) {
			bins = append(bins, base) // go build ./dir at the root
		}
		for _, bin := range bins {
			cmd := exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", bin)
			if err := cmd.Run(); err != nil {
				t.Errorf("%s (what `go build` makes for the main package in %s) is not ignored by .gitignore", bin, dir)
			}
		}
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// inNestedModule reports whether the slash-separated directory dir lies
// in a module of its own (a go.mod between it and the root), whose
// packages `go build` at the root cannot name.
func inNestedModule(root, dir string) bool {
	for d := dir; d != "." && d != "/"; d = path.Dir(d) {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(d), "go.mod")); err == nil {
			return true
		}
	}
	return false
}

// underTestdata reports whether a slash-separated path lies inside a
// directory named testdata, where fixtures of any size or kind may live.
func underTestdata(name string) bool {
	dirs := strings.Split(path.Dir(name), "/")
	for _, d := range dirs {
		if d == "testdata" {
			return true
		}
	}
	return false
}

// binaryContent judges a file as git does: binary when its first sniffLen
// bytes hold a NUL.
func binaryContent(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, sniffLen)
	n, _ := bufio.NewReader(f).Read(buf)
	return bytes.IndexByte(buf[:n], 0) >= 0, nil
}

// isMainPackage reports whether the Go file p declares package main.
func isMainPackage(t *testing.T, p string) bool {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "package ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "package ")) == "main"
		}
	}
	return false
}
