package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// fillTemplate fills plugins/shardkeeper.yaml for v1.2.3 with archives
// whose content is their name, and returns the manifest and one sum.
func fillTemplate(t *testing.T) (string, string) {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(root, "plugins", "shardkeeper.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	var sum string
	for _, p := range []string{"linux_amd64", "linux_arm64", "darwin_amd64", "darwin_arm64"} {
		name := "kubectl-shardkeeper_v1.2.3_" + p + ".tar.gz"
		if err := os.WriteFile(filepath.Join(dist, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256([]byte(name))
		sum = hex.EncodeToString(s[:])
	}
	out, err := Fill(tmpl, "v1.2.3", dist)
	if err != nil {
		t.Fatal(err)
	}
	return string(out), sum
}

func TestFillPutsEachArchivesURLAndSumInTheManifest(t *testing.T) {
	m, lastSum := fillTemplate(t)
	if err := Validate([]byte(m), "v1.2.3"); err != nil {
		t.Fatalf("the filled template fails krew's rules: %v\n%s", err, m)
	}
	for _, want := range []string{
		`version: "v1.2.3"`,
		"uri: https://github.com/shardkeeper/shardkeeper/releases/download/v1.2.3/kubectl-shardkeeper_v1.2.3_darwin_arm64.tar.gz\n    sha256: " + lastSum,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("the manifest lacks %q:\n%s", want, m)
		}
	}
	if strings.Contains(m, "{{") {
		t.Errorf("the manifest still holds template actions:\n%s", m)
	}
}

func TestFillRefusesAMissingArchiveOrABadVersion(t *testing.T) {
	root, _ := testbed.RepoRoot()
	tmpl, err := os.ReadFile(filepath.Join(root, "plugins", "shardkeeper.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Fill(tmpl, "v1.2.3", t.TempDir()); err == nil || !strings.Contains(err.Error(), "linux_amd64") {
		t.Errorf("Fill without archives: %v, want an error naming the archive", err)
	}
	if _, err := Fill(tmpl, "1.2.3", t.TempDir()); err == nil || !strings.Contains(err.Error(), "1.2.3") {
		t.Errorf("Fill of 1.2.3: %v, want an error naming the version", err)
	}
}

// TestValidateRefusesWhatKrewRefuses breaks a valid manifest one rule at
// a time: each must fail, naming the field.
func TestValidateRefusesWhatKrewRefuses(t *testing.T) {
	good, sum := fillTemplate(t)
	firstPlatform := "  - selector:\n      matchLabels:\n        os: linux\n        arch: amd64\n"
	for _, tc := range []struct {
		name, old, new, field string
	}{
		{"a wrong kind", "kind: Plugin", "kind: Plugins", "kind"},
		{"a wrong apiVersion", "v1alpha2", "v1alpha1", "apiVersion"},
		{"an unsafe name", "name: shardkeeper", "name: Shard/Keeper", "metadata.name"},
		{"a version that is not semver", `version: "v1.2.3"`, `version: "1.2"`, "spec.version"},
		{"another version than the release's", `version: "v1.2.3"`, `version: "v1.2.4"`, "spec.version"},
		{"no short description", "shortDescription: Day-2 operations on shardkeeper ShardTopologies", "shortDescription: \"\"", "spec.shortDescription"},
		{"a plain http uri", "uri: https://", "uri: http://", ".uri"},
		{"a short sum", "sha256: " + sum, "sha256: " + sum[:10], ".sha256"},
		{"an absolute bin", "bin: kubectl-shardkeeper", "bin: /usr/bin/kubectl-shardkeeper", ".bin"},
		{"a bin outside the plugin", "bin: kubectl-shardkeeper", "bin: ../kubectl-shardkeeper", ".bin"},
		{"two platforms with one selector", "os: darwin\n        arch: amd64", "os: linux\n        arch: amd64", ".selector"},
		{"an unknown field", firstPlatform, firstPlatform + "    sha512: abc\n", "unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(good, tc.old) {
				t.Fatalf("the manifest has no %q to break", tc.old)
			}
			bad := strings.Replace(good, tc.old, tc.new, 1)
			err := Validate([]byte(bad), "v1.2.3")
			if err == nil {
				t.Fatalf("accepted:\n%s", bad)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %s", err, tc.field)
			}
		})
	}
}
