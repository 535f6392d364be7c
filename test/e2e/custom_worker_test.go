package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// customWorkerImage is the image name the test kubelet runs as the
// examples/custom-worker binary.
const customWorkerImage = "custom-worker"

// buildCustomWorker builds examples/custom-worker, a module of its own that
// imports only the SDK's public packages: the build fails if the SDK's API
// needs an internal package.
func buildCustomWorker(t *testing.T) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "custom-worker")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(root, "examples", "custom-worker")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build examples/custom-worker (its own module): %v\n%s", err, out)
	}
	return bin
}

// TestCustomWorkerModuleRunsAShardChange runs a V change under the
// operator with every pod running examples/custom-worker, a worker another
// module built on the SDK, judged by the history checker like the
// reference worker.
//
// checks P1, P2, P3
func TestCustomWorkerModuleRunsAShardChange(t *testing.T) {
	in := scenarioInput{
		Name: "custom worker V4->8", From: ownership.Topology{Partitions: 2, Shards: 4},
		Changes: []ownership.Topology{{Partitions: 2, Shards: 8}}, Replicas: 2, Rate: 50,
		Image: customWorkerImage, Binaries: map[string]string{customWorkerImage: buildCustomWorker(t)},
	}
	r := runScenario(t, &sequenced{}, in, "e2e-custom")
	t.Log("\n" + r.Verdict.Table())
	if r.Err != nil {
		t.Errorf("rows lost (P3): %v", r.Err)
	}
	if !r.Verdict.Clean() {
		t.Errorf("the delivery history breaks a promise: %s", r.Verdict.FirstViolation)
	}
	if r.Verdict.Deliveries == 0 {
		t.Errorf("the custom worker recorded no delivery; the test checked nothing")
	}
}
