package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

// images are the operator and worker images one test run built.
type images struct {
	operator, worker string
	// version is what the Makefile stamped into the binaries (the images'
	// org.opencontainers.image.version label).
	version string
}

// requireDocker fails the test, loudly, when the Docker engine does not
// answer: a test that needs images must not pass by skipping.
func requireDocker(t *testing.T) {
	t.Helper()
	out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput()
	if err != nil {
		t.Fatalf("this test runs the project's images and needs a Docker engine, but `docker info` failed: %v\n%s", err, out)
	}
}

// buildImages runs `make docker-build` with BASE_IMAGE=scratch (nothing
// can be pulled) under tags of this run only, so that concurrent runs on
// one engine cannot swap each other's images; the tags are removed at the
// end. The Go build cache keeps the binaries' rebuild short after the
// first run.
func buildImages(t *testing.T) images {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	run := fmt.Sprintf("e2e-%d-%d", os.Getpid(), time.Now().UnixNano())
	im := images{operator: "shardkeeper:" + run, worker: "shardkeeper-worker:" + run}
	began := time.Now()
	cmd := exec.Command("make", "--no-print-directory", "docker-build", "IMG="+im.operator, "WORKER_IMG="+im.worker, "BASE_IMAGE=scratch")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", im.operator, im.worker).Run() })
	if err != nil {
		t.Fatalf("make docker-build: %v\n%s", err, out)
	}
	t.Logf("make docker-build built %s and %s in %s", im.operator, im.worker, time.Since(began).Round(time.Second))
	for _, img := range []string{im.operator, im.worker} {
		labels := inspectLabels(t, img)
		for _, k := range []string{"org.opencontainers.image.source", "org.opencontainers.image.version", "org.opencontainers.image.revision"} {
			if labels[k] == "" {
				t.Fatalf("image %s has no %s label (labels: %v)", img, k, labels)
			}
		}
		im.version = labels["org.opencontainers.image.version"]
		user, err := exec.Command("docker", "image", "inspect", "--format", "{{.Config.User}}", img).Output()
		if err != nil || strings.TrimSpace(string(user)) != "65532:65532" {
			t.Fatalf("image %s runs as %q (%v), want 65532:65532", img, strings.TrimSpace(string(user)), err)
		}
		v, err := exec.Command("docker", "run", "--rm", img, "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(v), im.version) {
			t.Fatalf("docker run %s --version: %q (%v), want the version %s", img, v, err, im.version)
		}
	}
	return im
}

func inspectLabels(t *testing.T, img string) map[string]string {
	t.Helper()
	out, err := exec.Command("docker", "image", "inspect", "--format", "{{json .Config.Labels}}", img).Output()
	if err != nil {
		t.Fatalf("docker image inspect %s: %v", img, err)
	}
	labels := map[string]string{}
	if err := yaml.Unmarshal(out, &labels); err != nil {
		t.Fatal(err)
	}
	return labels
}

// TestOperatorImageRunsTheRolloutUnderItsOwnRBAC builds the operator and
// worker images with `make docker-build` and runs the V 8 -> 16 scenario
// (with the pod roll) with the operator started from its image, as a
// container, the way dist/install.yaml deploys it: that manifest is applied
// for real, the container gets the Deployment's arguments, a kubeconfig
// holding a TokenRequest token of the operator's ServiceAccount (nothing
// else), leader election on, probes and HTTPS metrics answering. One
// worker pod, ingest-0, runs from the worker image too.
//
// checks P1, P2, P3, P7
func TestOperatorImageRunsTheRolloutUnderItsOwnRBAC(t *testing.T) {
	requireDocker(t)
	im := buildImages(t)
	var w *world
	s := &sequenced{startOperator: func(ww *world) {
		w = ww
		startOperatorContainer(ww, im)
	}}
	in := scenarioInput{Name: "V8->16 from images", From: ownership.Topology{Partitions: 4, Shards: 8},
		Changes: []ownership.Topology{{Partitions: 4, Shards: 16}}, RollPods: true, Replicas: 4, Rate: 200,
		ContainerPods: []string{"ingest-0"}, WorkerContainerImage: im.worker}
	r := runScenario(t, s, in, "e2e-image")
	printSideBySide(t, []scenarioResult{r})
	switch {
	case r.Err != nil:
		t.Errorf("rows lost (P3): %v", r.Err)
	case !r.Verdict.Clean():
		t.Errorf("the delivery history breaks a promise: %s", r.Verdict.FirstViolation)
	case r.Verdict.Published == 0:
		t.Errorf("nothing was published; the scenario checked nothing")
	}

	// ingest-0 ran the worker image, not the local binary: only the
	// image's binary carries the Makefile's version.
	addr, ok := w.kubelet.Addr("ingest-0")
	if !ok {
		t.Fatal("ingest-0 is not running")
	}
	body := get(t, "http://"+addr+"/metrics", "")
	if want := fmt.Sprintf(`version=%q`, im.version); !regexp.MustCompile(`shardkeeper_build_info\{[^}]*` + regexp.QuoteMeta(want)).MatchString(body) {
		t.Errorf("ingest-0's metrics lack shardkeeper_build_info with %s: it did not run the worker image", want)
	}
}

// startOperatorContainer applies the install manifest pinned to the
// operator image, then runs the image as the Deployment's pod would run:
// its arguments, its ServiceAccount's token, a read-only root file system,
// no capabilities. Only the listen addresses change (the container shares
// the host's network) and the Lease's namespace is named (a pod learns it
// from its ServiceAccount mount).
func startOperatorContainer(w *world, im images) {
	t := w.t
	t.Helper()
	manifest := renderInstallManifest(t, im.operator, t.TempDir())
	if err := w.env.Apply(manifest); err != nil {
		t.Fatal(err)
	}
	dep := &appsv1.Deployment{}
	if err := w.k.Get(context.Background(), client.ObjectKey{Namespace: operatorNamespace, Name: "shardkeeper"}, dep); err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if c.Image != im.operator {
		t.Fatalf("the install manifest's Deployment runs %q, want the image it was rendered for, %q", c.Image, im.operator)
	}
	if sc := dep.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Fatalf("the Deployment's runAsUser must be the image's user 65532: %+v", sc)
	}

	// A kubeconfig with the ServiceAccount's token and the API server's
	// CA only; the container's user reads it, so it is not 0600.
	kc, err := kubetest.Kubeconfig(w.env.TokenConfig(w.token(operatorNamespace, operatorSA)))
	if err != nil {
		t.Fatal(err)
	}
	kcPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o644); err != nil {
		t.Fatal(err)
	}
	probePort, err1 := testbed.FreePort()
	metricsPort, err2 := testbed.FreePort()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	args := append(replaceFlags(c.Args, map[string]string{
		"--health-probe-bind-address": fmt.Sprintf("127.0.0.1:%d", probePort),
		"--metrics-bind-address":      fmt.Sprintf("127.0.0.1:%d", metricsPort),
	}), "--leader-election-namespace="+operatorNamespace)
	name := fmt.Sprintf("shardkeeper-e2e-operator-%d", time.Now().UnixNano())
	dockerArgs := []string{"run", "--rm", "--name", name, "--network", "host",
		"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--volume", kcPath + ":/var/run/shardkeeper/kubeconfig:ro", "--env", "KUBECONFIG=/var/run/shardkeeper/kubeconfig",
		im.operator}
	cmd := exec.Command("docker", append(dockerArgs, args...)...)
	logs := w.logs.writer("operator")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// SIGTERM: the operator releases its Lease on the way out.
		_ = exec.Command("docker", "stop", "--time", "10", name).Run()
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = exec.Command("docker", "rm", "--force", name).Run()
			<-exited
		}
	})

	probes := fmt.Sprintf("http://127.0.0.1:%d", probePort)
	fleettest.Eventually(t, time.Minute, func() error {
		select {
		case <-exited:
			t.Fatalf("the operator container exited at start; its output:\n%s", w.logs.read("operator"))
		default:
		}
		for _, p := range []string{"/healthz", "/readyz"} {
			if code, _, err := fetch(probes+p, ""); err != nil || code != http.StatusOK {
				return fmt.Errorf("GET %s%s: %d %v", probes, p, code, err)
			}
		}
		return nil
	})
	fleettest.Eventually(t, time.Minute, func() error {
		lease := &coordinationv1.Lease{}
		if err := w.k.Get(context.Background(), client.ObjectKey{Namespace: operatorNamespace, Name: "shardkeeper.topology.shardkeeper.dev"}, lease); err != nil {
			return fmt.Errorf("no leader election Lease yet: %w", err)
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("the Lease has no holder")
		}
		return nil
	})
	checkSecureMetrics(w, fmt.Sprintf("https://127.0.0.1:%d/metrics", metricsPort), im.version)
	t.Logf("operator image %s running as container %s: probes answer, it holds the leader Lease", im.operator, name)
}

// checkSecureMetrics reads the operator's metrics as a scraper would: with
// the token of a ServiceAccount bound to shardkeeper-metrics-reader. A
// request without a token must be refused.
func checkSecureMetrics(w *world, url, version string) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	if err := w.k.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scraper", Namespace: operatorNamespace}}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "scraper-reads-shardkeeper-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "shardkeeper-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "scraper", Namespace: operatorNamespace}},
	}
	if err := w.k.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	// The metrics server starts beside the probes, not before them: wait
	// until it answers at all, then judge the answer.
	var code int
	fleettest.Eventually(t, 30*time.Second, func() error {
		var err error
		code, _, err = fetch(url, "")
		return err
	})
	if code != http.StatusUnauthorized {
		t.Fatalf("GET %s without a token: %d, want 401", url, code)
	}
	body := get(t, url, w.token(operatorNamespace, "scraper"))
	if want := fmt.Sprintf(`version=%q`, version); !regexp.MustCompile(`shardkeeper_build_info\{[^}]*` + regexp.QuoteMeta(want) + `[^}]*\} 1`).MatchString(body) {
		t.Fatalf("the operator's metrics lack shardkeeper_build_info{...%s} 1", want)
	}
}

// get fetches url (bearer token optional) until it answers 200 and returns
// the body.
func get(t *testing.T, url, token string) string {
	t.Helper()
	var body string
	fleettest.Eventually(t, 30*time.Second, func() error {
		code, b, err := fetch(url, token)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", url, code, b)
		}
		body = b
		return nil
	})
	return body
}

// fetch GETs url; HTTPS certificates are self-signed and not verified.
func fetch(url, token string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// replaceFlags gives each --flag=value argument in set its new value.
func replaceFlags(args []string, set map[string]string) []string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if v, ok := set[name]; ok {
			a = name + "=" + v
		}
		out = append(out, a)
	}
	return out
}

// renderInstallManifest renders dist/install.yaml's content for image the
// way `make install-manifest` does, into dir.
func renderInstallManifest(t *testing.T, image, dir string) []byte {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "install.yaml")
	cmd := exec.Command(filepath.Join(root, "hack", "install-manifest.sh"), image, out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/install-manifest.sh: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
