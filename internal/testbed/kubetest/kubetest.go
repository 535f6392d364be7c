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

// Start starts etcd and kube-apiserver and installs the CRDs under
// config/crd/bases.
func Start() (*Environment, error) {
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
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest control plane from %s: %w", assets, err)
	}
	return &Environment{Environment: env, Config: cfg}, nil
}
