package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControllerManager is a running kube-controller-manager.
type ControllerManager struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
	dir  string
}

// StartControllerManager runs kube-controller-manager against the
// environment's API server with only the named controllers (for example
// "statefulset-controller"), as a cluster administrator.
func (e *Environment) StartControllerManager(controllers ...string) (*ControllerManager, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	user, err := e.AddUser(envtest.User{Name: "kube-controller-manager", Groups: []string{"system:masters"}}, e.Config)
	if err != nil {
		return nil, fmt.Errorf("add kube-controller-manager user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "shardkeeper-kcm-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	log := &bytes.Buffer{}
	cmd := exec.Command(filepath.Join(assets, "kube-controller-manager"),
		"--kubeconfig="+path,
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--concurrent-statefulset-syncs=5",
		"--v=1",
	)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	cm := &ControllerManager{cmd: cmd, done: make(chan struct{}), log: log, dir: dir}
	go func() { _ = cmd.Wait(); close(cm.done) }()
	select {
	case <-cm.done:
		return nil, fmt.Errorf("kube-controller-manager exited at start:\n%s", log.String())
	case <-time.After(500 * time.Millisecond):
	}
	return cm, nil
}

// Log is what the controller manager has written so far.
func (cm *ControllerManager) Log() string { return cm.log.String() }

// Stop terminates the controller manager and waits for it to exit.
func (cm *ControllerManager) Stop(ctx context.Context) error {
	defer os.RemoveAll(cm.dir)
	_ = cm.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-cm.done:
		return nil
	case <-ctx.Done():
		_ = cm.cmd.Process.Kill()
		<-cm.done
		return ctx.Err()
	}
}
