package e2e

import (
	"bufio"
	"bytes"
	"io"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

// TestInstallManifestIsAcceptedByTheAPIServer renders what users apply,
// dist/install.yaml (hack/install-manifest.sh, as `make install-manifest`
// runs it), config/namespaced and config/samples, and has the test bed's
// API server validate every object with `kubectl apply --dry-run=server`:
// schemas, CEL rules, RBAC escalation checks and admission. It also checks
// what the install promises: the pinned image, the operator's restricted
// securityContext, HTTPS metrics and the PodDisruptionBudget.
func TestInstallManifestIsAcceptedByTheAPIServer(t *testing.T) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	env, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	// A server-side dry run creates nothing, so the objects of the
	// operator's namespace need it to exist already.
	if _, err := env.Kubectl(nil, "create", "namespace", operatorNamespace); err != nil {
		t.Fatal(err)
	}

	const image = "registry.example/shardkeeper:v0.1.0"
	install := renderInstallManifest(t, image, t.TempDir())
	namespaced, err := kubetest.Kustomize(filepath.Join(root, "config", "namespaced"))
	if err != nil {
		t.Fatal(err)
	}
	samples, err := kubetest.Kustomize(filepath.Join(root, "config", "samples"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		manifests []byte
		args      []string
	}{
		{"dist/install.yaml", install, nil},
		{"config/namespaced", namespaced, nil},
		{"config/samples", samples, []string{"--namespace", "default"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"apply", "--dry-run=server", "-f", "-"}, tt.args...)
			out, err := env.Kubectl(tt.manifests, args...)
			if err != nil {
				t.Fatal(err)
			}
			docs := splitDocs(t, tt.manifests)
			if got := strings.Count(string(out), "(server dry run)"); got != len(docs) {
				t.Fatalf("the API server accepted %d of %d objects:\n%s", got, len(docs), out)
			}
			t.Logf("%d objects accepted", len(docs))
		})
	}

	t.Run("the install is what it promises", func(t *testing.T) {
		kinds := map[string]bool{}
		for _, doc := range splitDocs(t, install) {
			var o struct {
				metav1.TypeMeta `json:",inline"`
				Metadata        metav1.ObjectMeta `json:"metadata"`
			}
			if err := yaml.Unmarshal(doc, &o); err != nil {
				t.Fatal(err)
			}
			kinds[o.Kind+"/"+o.Metadata.Name] = true
			switch o.Kind {
			case "Deployment":
				checkOperatorDeployment(t, doc, image)
			case "Service":
				var svc corev1.Service
				if err := yaml.Unmarshal(doc, &svc); err != nil {
					t.Fatal(err)
				}
				if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8443 || svc.Spec.Ports[0].Name != "https" {
					t.Errorf("metrics Service ports %+v, want https on 8443", svc.Spec.Ports)
				}
			}
		}
		for _, want := range []string{
			"CustomResourceDefinition/shardtopologies.topology.shardkeeper.dev", "Namespace/shardkeeper-system",
			"ServiceAccount/shardkeeper", "ClusterRole/shardkeeper-manager", "ClusterRoleBinding/shardkeeper-manager",
			"ClusterRole/shardkeeper-metrics-auth", "ClusterRole/shardkeeper-metrics-reader",
			"Deployment/shardkeeper", "Service/shardkeeper-metrics", "PodDisruptionBudget/shardkeeper",
		} {
			if !kinds[want] {
				t.Errorf("dist/install.yaml lacks %s", want)
			}
		}
	})
}

// checkOperatorDeployment checks the operator's pod runs as the image's
// non-root user, read-only, without capabilities, with HTTPS metrics.
func checkOperatorDeployment(t *testing.T, doc []byte, image string) {
	t.Helper()
	var d appsv1.Deployment
	if err := yaml.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	psc, csc := pod.SecurityContext, c.SecurityContext
	switch {
	case c.Image != image:
		t.Errorf("image %q, want %q pinned", c.Image, image)
	case psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532:
		t.Errorf("pod securityContext %+v: want runAsNonRoot and runAsUser 65532, the image's user", psc)
	case psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("seccompProfile %+v, want RuntimeDefault", psc.SeccompProfile)
	case csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem:
		t.Errorf("container securityContext %+v: want readOnlyRootFilesystem", csc)
	case csc.Capabilities == nil || len(csc.Capabilities.Drop) != 1 || csc.Capabilities.Drop[0] != "ALL":
		t.Errorf("capabilities %+v, want drop ALL", csc.Capabilities)
	case csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation:
		t.Errorf("allowPrivilegeEscalation must be false")
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--metrics-bind-address=:8443", "--metrics-secure=true", "--leader-elect"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
}

func splitDocs(t *testing.T, b []byte) [][]byte {
	t.Helper()
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		// Skip documents that hold only comments (the manifest's header).
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if len(m) > 0 {
			docs = append(docs, doc)
		}
	}
}
