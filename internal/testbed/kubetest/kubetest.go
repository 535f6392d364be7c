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

// Environment is a running control plane.
type Environment struct {
	*envtest.Environment
	// Config reaches the API server as an administrator.
	Config *rest.Config

	admin adminKubeconfig
}

// Options tune the control plane.
type Options struct {
	// AuditLogPath, when set, makes kube-apiserver write audit events to
	// this file, one JSON object per line, under AuditPolicy (an
	// audit.k8s.io/v1 Policy). Tests read it as evidence of who did what
	// and when, to the microsecond.
	AuditLogPath string
	AuditPolicy  []byte
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
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest control plane from %s: %w", assets, err)
	}
	return &Environment{Environment: env, Config: cfg}, nil
}
