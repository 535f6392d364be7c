package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// adminKubeconfig is the kubeconfig file Kubectl uses, written on first use
// and removed by Stop.
type adminKubeconfig struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// Stop removes what the environment wrote for kubectl and stops the
// control plane.
func (e *Environment) Stop() error {
	if e.admin.dir != "" {
		_ = os.RemoveAll(e.admin.dir)
	}
	err := e.Environment.Stop()
	if e.logDir != "" {
		_ = os.RemoveAll(e.logDir)
	}
	return err
}

// Kubectl runs kubectl (from PATH) against the control plane as a cluster
// administrator, with stdin as its input, and returns what it printed.
func (e *Environment) Kubectl(stdin []byte, args ...string) ([]byte, error) {
	e.admin.once.Do(func() {
		var b []byte
		if b, e.admin.err = Kubeconfig(e.Config); e.admin.err != nil {
			return
		}
		if e.admin.dir, e.admin.err = os.MkdirTemp("", "shardkeeper-kubectl-"); e.admin.err != nil {
			return
		}
		e.admin.path = filepath.Join(e.admin.dir, "kubeconfig")
		e.admin.err = os.WriteFile(e.admin.path, b, 0o600)
	})
	if e.admin.err != nil {
		return nil, fmt.Errorf("write the administrator's kubeconfig: %w", e.admin.err)
	}
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig=" + e.admin.path}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %v: %w\n%s", args, err, out)
	}
	return out, nil
}

// Apply applies manifests (a multi-document YAML stream) server-side as
// the administrator.
func (e *Environment) Apply(manifests []byte) error {
	_, err := e.Kubectl(manifests, "apply", "--server-side", "--field-manager=shardkeeper-tests", "-f", "-")
	return err
}

// Kustomize renders a kustomization directory the way users install it:
// with `kubectl kustomize`.
func Kustomize(dir string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("kubectl", "kustomize", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w\n%s", dir, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// ServiceAccountToken asks the TokenRequest API for a token of the
// ServiceAccount namespace/name, valid for ttl: the credential a pod of
// that ServiceAccount would get.
func (e *Environment) ServiceAccountToken(ctx context.Context, namespace, name string, ttl time.Duration) (string, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return "", err
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(ttl.Seconds()))}}
	got, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return got.Status.Token, nil
}

// TokenConfig is a client configuration of the control plane that
// authenticates with token only: it carries the API server's CA, none of
// the administrator's credentials.
func (e *Environment) TokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            e.Config.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.Config.CAData},
		BearerToken:     token,
		QPS:             e.Config.QPS,
		Burst:           e.Config.Burst,
	}
}

// Kubeconfig writes cfg (server, CA, and a bearer token or a client
// certificate) as a kubeconfig file's contents.
func Kubeconfig(cfg *rest.Config) ([]byte, error) {
	const name = "shardkeeper-testbed"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		Token:                 cfg.BearerToken,
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return nil, fmt.Errorf("write kubeconfig: %w", err)
	}
	return b, nil
}
