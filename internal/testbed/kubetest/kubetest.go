// Package kubetest starts a Kubernetes control plane for tests and the demo:
// controller-runtime's envtest running kube-apiserver and etcd that
// hack/testbin.sh builds from their Go modules, with the project's CRDs
// installed.
//
// It owns finding the binaries and starting and stopping the control plane;
// what runs against it belongs to the callers.
package kubetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// Assets returns the directory holding kube-apiserver, etcd and
// kube-controller-manager: $KUBEBUILDER_ASSETS when set, else the output of
// hack/testbin.sh, which builds them on first use (several minutes) and
// reuses its cache afterwards.
func Assets() (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "hack", "testbin.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/testbin.sh: %w\n%s", err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// captureOutput sends kube-apiserver's and etcd's output to files in a
// new directory, so a control plane that does not start can be
// diagnosed; envtest otherwise discards it. It leaves the output alone
// (and returns "") when KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT attaches
// it to this process's. The caller closes the files once the processes
// started: each child writes through descriptors of its own.
func captureOutput(env *envtest.Environment) (string, []*os.File, error) {
	if os.Getenv("KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT") == "true" {
		return "", nil, nil
	}
	dir, err := os.MkdirTemp("", "shardkeeper-controlplane-")
	if err != nil {
		return "", nil, fmt.Errorf("control plane log directory: %w", err)
	}
	var files []*os.File
	for _, name := range []string{"apiserver.log", "etcd.log"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			closeAll(files)
			return "", nil, fmt.Errorf("control plane log: %w", err)
		}
		files = append(files, f)
	}
	a := env.ControlPlane.GetAPIServer()
	a.Out, a.Err = files[0], files[0]
	if env.ControlPlane.Etcd == nil {
		env.ControlPlane.Etcd = &envtest.Etcd{}
	}
	env.ControlPlane.Etcd.Out, env.ControlPlane.Etcd.Err = files[1], files[1]
	return dir, files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// Environment is a running control plane.
type Environment struct {
	*envtest.Environment
	// Config reaches the API server as an administrator.
	Config *rest.Config

	admin adminKubeconfig
	// logDir holds kube-apiserver's and etcd's output; Stop removes it.
	logDir string
}

// StartTimeoutEnv is envtest's setting for how long each control plane
// process may take to become healthy.
const StartTimeoutEnv = "KUBEBUILDER_CONTROLPLANE_START_TIMEOUT"

// defaultStartTimeout replaces envtest's 20s, which a kube-apiserver on a
// loaded 2-core machine (load average 12 seen with make demo) overran.
const defaultStartTimeout = time.Minute

// StartError is a control plane that did not start: the error envtest
// gave, with where the processes' output went and what to try.
type StartError struct {
	Err error
	// LogDir holds apiserver.log and etcd.log (kept after a failure).
	LogDir string
	// Timeout is how long each process was given.
	Timeout time.Duration
}

func (e *StartError) Error() string {
	return fmt.Sprintf("%v; kube-apiserver's output is in %s, etcd's in %s; "+
		"a busy machine may need longer than %s: set %s (e.g. %s=3m), "+
		"or %s=true to see the output on this terminal",
		e.Err, filepath.Join(e.LogDir, "apiserver.log"), filepath.Join(e.LogDir, "etcd.log"), e.Timeout,
		StartTimeoutEnv, StartTimeoutEnv, "KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT")
}

func (e *StartError) Unwrap() error { return e.Err }

// Options tune the control plane.
type Options struct {
	// AuditLogPath, when set, makes kube-apiserver write audit events to
	// this file, one JSON object per line, under AuditPolicy (an
	// audit.k8s.io/v1 Policy). Tests read it as evidence of who did what
	// and when, to the microsecond.
	AuditLogPath string
	AuditPolicy  []byte
	// StartTimeout bounds each process's start; zero means $KUBEBUILDER_CONTROLPLANE_START_TIMEOUT, or 1m.
	StartTimeout time.Duration
}

// Start starts etcd and kube-apiserver and installs the CRDs under
// config/crd/bases.
func Start() (*Environment, error) { return StartWith(Options{}) }

// StartWith is Start with options.
func StartWith(o Options) (*Environment, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	if o.AuditLogPath != "" {
		policy := filepath.Join(filepath.Dir(o.AuditLogPath), "audit-policy.yaml")
		if err := os.WriteFile(policy, o.AuditPolicy, 0o600); err != nil {
			return nil, fmt.Errorf("write audit policy: %w", err)
		}
		args := env.ControlPlane.GetAPIServer().Configure()
		args.Set("audit-policy-file", policy)
		args.Set("audit-log-path", o.AuditLogPath)
		args.Set("audit-log-format", "json")
		// Write each event as it happens: a test reads the log while the
		// server runs.
		args.Set("audit-log-mode", "blocking")
	}
	env.ControlPlaneStartTimeout = o.StartTimeout
	if env.ControlPlaneStartTimeout == 0 && os.Getenv(StartTimeoutEnv) == "" {
		env.ControlPlaneStartTimeout = defaultStartTimeout
	}
	logDir, logs, err := captureOutput(env)
	if err != nil {
		return nil, err
	}
	cfg, err := env.Start()
	closeAll(logs)
	if err != nil {
		_ = env.Stop()
		if logDir == "" {
			return nil, fmt.Errorf("start envtest control plane from %s: %w", assets, err)
		}
		return nil, &StartError{Err: fmt.Errorf("start envtest control plane from %s: %w", assets, err), LogDir: logDir, Timeout: env.ControlPlaneStartTimeout}
	}
	return &Environment{Environment: env, Config: cfg, logDir: logDir}, nil
}
