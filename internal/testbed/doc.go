// Package testbed holds what tests and the demo need to start real parts on
// loopback: a throwaway PostgreSQL (pgtest), in-process and separate-process
// NATS servers (natstest), an envtest control plane built from source
// (kubetest), a test kubelet running local processes as pods (kubelet) and a
// TCP proxy that injects latency and cuts (faultproxy). Each subpackage
// starts, hands over addresses, and stops; none of them knows anything about
// shardkeeper's own logic. This package adds the small helpers they share.
package testbed

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond every 50ms until it returns nil, and fails the
// test with cond's last error when timeout passes first. Tests wait for
// conditions with it instead of sleeping.
func Eventually(tb testing.TB, timeout time.Duration, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not within %s: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago and that
// this process has not handed out before (the kernel may offer a port
// again once its listener closed, and a cluster's servers are configured
// before any binds). Another process may take it before the caller binds
// it; callers that start servers retry on a bind failure.
func FreePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port, nil
		}
	}
	return 0, fmt.Errorf("find free port: the kernel offered only ports handed out before")
}

var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// RepoRoot finds the module root (the directory holding go.mod with the
// shardkeeper module) from the working directory upwards, so tests in any
// package can find hack/ and config/.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && isRootModule(b) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no shardkeeper go.mod above the working directory")
		}
		dir = parent
	}
}

func isRootModule(gomod []byte) bool {
	const want = "module github.com/shardkeeper/shardkeeper\n"
	return len(gomod) >= len(want) && string(gomod[:len(want)]) == want
}

// CacheDir is where built binaries and other slow-to-make assets live,
// outside any clone: $SHARDKEEPER_CACHE, else the user cache directory.
func CacheDir() (string, error) {
	if d := os.Getenv("SHARDKEEPER_CACHE"); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find cache directory: %w", err)
	}
	return filepath.Join(base, "shardkeeper"), nil
}
