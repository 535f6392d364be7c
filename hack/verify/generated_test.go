// Package verify holds tests of the repository itself rather than of a
// package: that generated files are current, that git tracks no binary
// or large file and ignores what `go build` leaves behind, and that the
// shipped binaries link neither the NATS server nor Helm.
package verify

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// TestGeneratedFilesAreCurrent regenerates deepcopy, CRD and RBAC into a
// temporary directory and fails when the committed copies differ, so a
// marker change without `make generate` cannot pass CI.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "hack", "generate.sh"), out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/generate.sh: %v\n%s", err, b)
	}
	pairs := map[string]string{
		"object/zz_generated.deepcopy.go":                   "api/v1alpha1/zz_generated.deepcopy.go",
		"crd/topology.shardkeeper.dev_shardtopologies.yaml": "config/crd/bases/topology.shardkeeper.dev_shardtopologies.yaml",
		"rbac/role.yaml": "config/rbac/role.yaml",
	}
	for generated, committed := range pairs {
		want, err := os.ReadFile(filepath.Join(out, generated))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, committed))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is stale: run `make generate` and commit the result", committed)
		}
	}
}
