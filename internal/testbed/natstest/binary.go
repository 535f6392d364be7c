package natstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// Versions of nats-server the mixed-version tests run as separate
// processes. There is no 2.13 release: a real mixed cluster is 2.12 with
// 2.14. 2.15 is the first to cap a stream's consumers by default
// (default_max_consumers, 1000, when neither the stream nor the account
// sets a limit); the embedded servers of StartCluster are 2.15 too (go.mod).
const (
	Version212 = "v2.12.15"
	Version214 = "v2.14.9"
	Version215 = "v2.15.2"
)

var binaryMu sync.Mutex

// Binary returns the path of the nats-server binary of version (such as
// "v2.14.9"), building it with hack/nats-servers.sh the first time on this
// machine. Built binaries are cached outside the clone (testbed.CacheDir),
// so only the first run pays for the build.
func Binary(tb testing.TB, version string) string {
	tb.Helper()
	bin, err := BinaryPath(version)
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// BinaryPath is Binary for callers without a testing.TB.
func BinaryPath(version string) (string, error) {
	if !strings.HasPrefix(version, "v") {
		version = "v" + version
	}
	cache, err := testbed.CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "nats-server", version, "nats-server")
	if fi, err := os.Stat(bin); err == nil && fi.Mode()&0o111 != 0 {
		return bin, nil
	}
	binaryMu.Lock()
	defer binaryMu.Unlock()
	root, err := testbed.RepoRoot()
	if err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "hack", "nats-servers.sh"), version)
	cmd.Stderr = &stderr
	// The script reads the same cache variable as testbed.CacheDir.
	cmd.Env = append(os.Environ(), "SHARDKEEPER_CACHE="+cache)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build nats-server %s with hack/nats-servers.sh: %w: %s", version, err, stderr.String())
	}
	got := strings.TrimSpace(string(out))
	if got != bin {
		return "", fmt.Errorf("hack/nats-servers.sh printed %q, want %q", got, bin)
	}
	return bin, nil
}
