package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// capture runs the command line in this process with its output in a
// buffer.
func capture(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := NewRootCmd(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestCensusMain is not a test: the census tests run the test binary as the
// command (see runMain), so they see its real exit status.
func TestCensusMain(t *testing.T) {
	args := os.Getenv("KUBECTL_SHARDKEEPER_ARGS")
	if args == "" {
		t.Skip("helper process for the census tests")
	}
	os.Args = append([]string{"kubectl-shardkeeper"}, strings.Split(args, "\x1f")...)
	main()
	os.Exit(0)
}

// runMain runs the command line in a child process and returns its
// stdout, stderr and exit code.
func runMain(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCensusMain$")
	cmd.Env = append(os.Environ(), "KUBECTL_SHARDKEEPER_ARGS="+strings.Join(args, "\x1f"))
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

func sysURL(urls []string) string {
	for i, u := range urls {
		urls[i] = natstest.UserURL(u, natstest.SysUser, natstest.SysPassword)
	}
	return strings.Join(urls, ",")
}

// checks P4
func TestCensusAgainstAMixedClusterListsThe212ServerAndExitsNonZero(t *testing.T) {
	new, old := natstest.Binary(t, natstest.Version214), natstest.Binary(t, natstest.Version212)
	c := natstest.StartProcCluster(t, new, new, old)
	oldName := c.Configs[2].Name

	out, errOut, code := runMain(t, "census", "--server", sysURL(c.URLs()[:1]), "--floor", "2.14.0")
	t.Logf("exit %d\n%s%s", code, out, errOut)
	if code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if !strings.Contains(out, "FLOOR NOT MET, below: "+oldName) || !strings.Contains(errOut, "version floor not met") {
		t.Fatalf("output does not name %s below the floor", oldName)
	}
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, oldName+" ") {
			line = l
		}
	}
	if !strings.Contains(line, "2.12.15") || !strings.Contains(line, "BELOW FLOOR") {
		t.Fatalf("row of %s: %q", oldName, line)
	}
	if strings.Contains(out+errOut, natstest.SysPassword) {
		t.Fatal("the output shows the password")
	}

	out, _, code = runMain(t, "census", "--server", sysURL(c.URLs()[:1]), "-o", "json")
	var census natsops.Census
	if err := json.Unmarshal([]byte(out), &census); err != nil || code != 1 {
		t.Fatalf("json output (exit %d): %v\n%s", code, err, out)
	}
	if len(census.BelowFloor) != 1 || census.BelowFloor[0] != oldName || census.MinVersion != "2.12.15" {
		t.Fatalf("json census: below %v, min %s", census.BelowFloor, census.MinVersion)
	}

	// Below the old server, the floor is met.
	if _, _, code := runMain(t, "census", "--server", sysURL(c.URLs()[:1]), "--floor", "v2.12.0"); code != 0 {
		t.Fatalf("floor 2.12.0: exit %d, want 0", code)
	}
}

func TestCensusOfASingleVersionClusterPasses(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	out, err := capture(t, "census", "--server", sysURL(c.URLs()), "--consumer", "NOPE/nope")
	if err != nil {
		t.Fatalf("census: %v\n%s", err, out)
	}
	for _, want := range []string{"floor met", c.Configs[0].Name, "meta-leader", "NOPE/nope", "(not found)", "Findings:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestCensusRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"census"},
		{"census", "--server", "nats://127.0.0.1:1", "--floor", "2.14"},
		{"census", "--server", "nats://127.0.0.1:1", "-o", "xml"},
		{"census", "ingest", "--server", "nats://127.0.0.1:1"},
		{"census", "--server", "nats://127.0.0.1:1", "--consumer", "nostream"},
	} {
		if _, err := capture(t, args...); !errors.Is(err, plugin.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	// An unreachable server is an error, and the message hides credentials.
	_, err := capture(t, "census", "--server", "nats://sys:topsecret@127.0.0.1:1", "--timeout", "200ms")
	if err == nil || errors.Is(err, plugin.ErrUsage) || strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("unreachable server: %v", err)
	}
}
