package poolctl

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Tests never skip for lack of PostgreSQL: without it, the tests that need
// it fail with the reason, and the twin's tests (go test -run Twin) pass.
// The test binary runs itself with a PostgreSQL directory that holds no
// server.
func TestWithoutPostgresItsTestsFailAndTheRestPass(t *testing.T) {
	if os.Getenv("SHARDKEEPER_PG_BIN") != "" {
		return // the child: the outer run checks what it does
	}
	cases := []struct {
		name   string
		run    string
		passes bool
		says   string
	}{
		{"a test that needs PostgreSQL", "^TestClaimAdoptionFollowsP5$", false, "this test needs PostgreSQL"},
		{"the twin's tests", "Twin", true, "--- PASS: TestFaultMatrixTwin"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", c.run, "-test.v")
			cmd.Env = append(os.Environ(), "SHARDKEEPER_PG_BIN="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if (err == nil) != c.passes || !strings.Contains(string(out), c.says) {
				t.Fatalf("go test -run %s without PostgreSQL: err %v, want passes=%v saying %q; output:\n%s",
					c.run, err, c.passes, c.says, out)
			}
			if strings.Contains(string(out), "--- SKIP") {
				t.Fatalf("a test skipped:\n%s", out)
			}
		})
	}
}
