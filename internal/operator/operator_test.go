package operator_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

// The operator's identity in config/rbac and config/namespaced.
const (
	operatorNamespace = "shardkeeper-system"
	operatorSA        = "shardkeeper"
)

// bed is one control plane with the operator's RBAC applied and a client
// config that authenticates as the operator's ServiceAccount.
type bed struct {
	t     *testing.T
	env   *kubetest.Environment
	admin client.Client
	// asOperator reaches the API server with the ServiceAccount's token
	// only, and records every request.
	asOperator *rest.Config
	requests   *requestLog
}

func TestMain(m *testing.M) {
	// SHARDKEEPER_TEST_LOG=1 shows the operator's logs.
	if os.Getenv("SHARDKEEPER_TEST_LOG") == "1" {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	os.Exit(m.Run())
}

// startBed starts a control plane, applies manifests (rendered RBAC) and
// returns a config of the operator's ServiceAccount. Each test gets a
// control plane of its own: the RBAC under test is cluster-scoped, and one
// test's bindings would lend the next one permissions.
func startBed(t *testing.T, manifests []byte) *bed {
	t.Helper()
	env, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme, err := operator.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	b := &bed{t: t, env: env, admin: admin, requests: &requestLog{}}
	b.createNamespace(operatorNamespace)
	if err := env.Apply(manifests); err != nil {
		t.Fatal(err)
	}
	b.asOperator = b.token(operatorNamespace, operatorSA)
	b.asOperator.WrapTransport = b.requests.wrap
	return b
}

func (b *bed) token(ns, sa string) *rest.Config {
	b.t.Helper()
	tok, err := b.env.ServiceAccountToken(context.Background(), ns, sa, time.Hour)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.env.TokenConfig(tok)
}

func (b *bed) createNamespace(name string) {
	b.t.Helper()
	if err := b.admin.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		b.t.Fatal(err)
	}
}

// startOperator runs the operator's manager with o under the
// ServiceAccount's config until the test ends.
func (b *bed) startOperator(o operator.Options) {
	b.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if o.MetricsAddr == "" {
		o.MetricsAddr = "0"
	}
	o.ProbeAddr, o.SkipControllerNameValidation = "0", true
	mgr, err := operator.New(ctx, b.asOperator, o)
	if err != nil {
		cancel()
		b.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	b.t.Cleanup(func() { cancel(); <-done })
}

// createTopology creates, in ns, a worker StatefulSet and a ShardTopology
// that references the Secrets "nats" and "registry"; "nats" is created
// with it, "registry" is left to the test.
func (b *bed) createTopology(ns string) *topologyv1.ShardTopology {
	b.t.Helper()
	ctx := context.Background()
	b.createSecret(ns, "nats", "sys.creds")
	labels := map[string]string{"app": "ingest"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "shardkeeper-worker"}}},
			},
		},
	}
	if err := b.admin.Create(ctx, sts); err != nil {
		b.t.Fatal(err)
	}
	topo := &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: ns},
		Spec: topologyv1.ShardTopologySpec{
			Partitions: 2, ShardsPerPartition: 2,
			NATS: topologyv1.NATSSpec{
				URLs:                       []string{"nats://nats:4222"},
				SystemCredentialsSecretRef: &topologyv1.SecretKeyRef{Name: "nats", Key: "sys.creds"},
			},
			Registry: topologyv1.RegistrySpec{DSNSecretRef: topologyv1.SecretKeyRef{Name: "registry", Key: "dsn"}},
			Workload: topologyv1.WorkloadSpec{StatefulSetName: "ingest"},
		},
	}
	if err := b.admin.Create(ctx, topo); err != nil {
		b.t.Fatal(err)
	}
	return topo
}

func (b *bed) createSecret(ns, name, key string) {
	b.t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string][]byte{key: []byte("value-of-" + key)}}
	if err := b.admin.Create(context.Background(), s); err != nil {
		b.t.Fatal(err)
	}
}

// waitStalled waits until the topology's Stalled condition is status with
// reason.
func (b *bed) waitStalled(topo *topologyv1.ShardTopology, status metav1.ConditionStatus, reason string) {
	b.t.Helper()
	testbed.Eventually(b.t, 30*time.Second, func() error {
		got := &topologyv1.ShardTopology{}
		if err := b.admin.Get(context.Background(), client.ObjectKeyFromObject(topo), got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, topologyv1.ConditionStalled)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("Stalled is %+v, want %s/%s", c, status, reason)
		}
		return nil
	})
}

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, rel)
}

func render(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := kubetest.Kustomize(repoPath(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The operator runs cluster-wide as its own ServiceAccount, bound only by
// config/rbac. It must get from a new ShardTopology to a stall on its
// missing Secret, and out of it when the Secret appears, without one
// request refused; and it must hold no Secret's data in a cache: Secrets
// are listed and watched metadata-only, and read one by one, by name, in
// the topology's namespace. Its metrics answer only callers allowed to GET
// /metrics.
//
// checks P7 (the stall and its end are in status)
func TestOperatorUnderConfigRBACWatchesSecretsMetadataOnly(t *testing.T) {
	b := startBed(t, render(t, "config/rbac"))
	ctx := context.Background()

	// A Secret no topology references, in a namespace with none.
	b.createNamespace("bystander")
	b.createSecret("bystander", "unrelated", "password")

	port, err := testbed.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", port)
	b.startOperator(operator.Options{MetricsAddr: metricsAddr, MetricsSecure: true})

	b.createNamespace("ingest")
	topo := b.createTopology("ingest")
	b.waitStalled(topo, metav1.ConditionTrue, topologyv1.ReasonSecretNotFound)
	// The watch brings the topology back when the Secret appears; its DSN
	// reaches nothing, so a connection error replaces the stall.
	b.createSecret("ingest", "registry", "dsn")
	b.waitStalled(topo, metav1.ConditionFalse, topologyv1.ReasonReconcileError)

	for _, r := range b.requests.all() {
		if r.status == http.StatusForbidden {
			t.Errorf("the API server refused %s %s: config/rbac lacks a permission the operator uses", r.method, r.path)
		}
		switch res, ns, name := r.resource(); {
		case res == "secrets" && name == "" && !strings.Contains(r.accept, "as=PartialObjectMetadata"):
			t.Errorf("%s %s?%s asks for whole Secrets (Accept %q): a cache would hold every Secret's data", r.method, r.path, r.query, r.accept)
		case res == "secrets" && name != "" && (ns != "ingest" || !slices.Contains([]string{"nats", "registry"}, name)):
			t.Errorf("%s %s reads a Secret no topology references", r.method, r.path)
		case res == "pods":
			t.Errorf("%s %s: nothing was rolled, so no pod should be read", r.method, r.path)
		}
	}
	if !b.requests.sawSecretsWatch() {
		t.Errorf("no watch of Secrets was seen: the recorder or the watch is broken, and the checks above prove nothing")
	}

	t.Run("metrics need a token allowed to GET /metrics", func(t *testing.T) {
		// A scraper's ServiceAccount, bound to the metrics-reader role of
		// config/rbac, and one bound to nothing.
		for _, sa := range []string{"scraper", "nobody"} {
			if err := b.admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: "bystander"}}); err != nil {
				t.Fatal(err)
			}
		}
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "scraper-reads-shardkeeper-metrics"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "shardkeeper-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "scraper", Namespace: "bystander"}},
		}
		if err := b.admin.Create(ctx, crb); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name  string
			token string
			want  int
		}{
			{"no token is unauthorized", "", http.StatusUnauthorized},
			{"a token without metrics-reader is forbidden", b.token("bystander", "nobody").BearerToken, http.StatusForbidden},
			{"a metrics-reader token reads the metrics", b.token("bystander", "scraper").BearerToken, http.StatusOK},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				code, body := scrape(t, metricsAddr, tt.token)
				if code != tt.want {
					t.Fatalf("GET https://%s/metrics: %d, want %d\n%s", metricsAddr, code, tt.want, body)
				}
				if tt.want == http.StatusOK && !strings.Contains(body, "shardkeeper_build_info{") {
					t.Fatalf("metrics lack shardkeeper_build_info:\n%s", body)
				}
			})
		}
	})
}

// scrape GETs the operator's /metrics over HTTPS (self-signed: not
// verified) with token.
func scrape(t *testing.T, addr, token string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	var resp *http.Response
	testbed.Eventually(t, 20*time.Second, func() error {
		resp, err = c.Do(req)
		return err
	})
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Least privilege works both ways: with one verb fewer than config/rbac
// grants (patch on shardtopologies/status), the operator cannot report
// anything, and the API server says so. This is the check that makes the
// RBAC-bound runs mean something: a role too small fails them.
func TestARoleMissingOneVerbIsRefused(t *testing.T) {
	manifests := withoutVerb(t, render(t, "config/rbac"), "shardkeeper-manager", "shardtopologies/status", "patch")
	b := startBed(t, manifests)
	b.startOperator(operator.Options{})
	b.createNamespace("ingest")
	topo := b.createTopology("ingest")

	testbed.Eventually(t, 30*time.Second, func() error {
		for _, r := range b.requests.all() {
			if r.method == http.MethodPatch && strings.HasSuffix(r.path, "/shardtopologies/ingest/status") && r.status == http.StatusForbidden {
				return nil
			}
		}
		return errors.New("no status patch refused yet")
	})
	got := &topologyv1.ShardTopology{}
	if err := b.admin.Get(context.Background(), client.ObjectKeyFromObject(topo), got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 0 {
		t.Fatalf("status was written without the patch verb: %+v", got.Status.Conditions)
	}
}

// withoutVerb removes verb from the rules of ClusterRole role covering
// resource in a rendered manifest stream.
func withoutVerb(t *testing.T, manifests []byte, role, resource, verb string) []byte {
	t.Helper()
	var out bytes.Buffer
	removed := false
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var cr rbacv1.ClusterRole
		if err := yaml.Unmarshal(doc, &cr); err != nil {
			t.Fatal(err)
		}
		if cr.Kind == "ClusterRole" && cr.Name == role {
			var kept []rbacv1.PolicyRule
			for _, rule := range cr.Rules {
				if slices.Contains(rule.Resources, resource) && slices.Contains(rule.Verbs, verb) {
					rule.Verbs = slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v == verb })
					removed = true
				}
				if len(rule.Verbs) > 0 { // a rule without verbs is invalid
					kept = append(kept, rule)
				}
			}
			cr.Rules = kept
			if doc, err = yaml.Marshal(&cr); err != nil {
				t.Fatal(err)
			}
		}
		out.WriteString("---\n")
		out.Write(doc)
	}
	if !removed {
		t.Fatalf("ClusterRole %s grants no %s on %s: nothing to remove", role, verb, resource)
	}
	return out.Bytes()
}

// config/namespaced runs the operator on a Role in its own namespace: it
// reconciles a ShardTopology there (first sight, the stall on a missing
// Secret, its end when the Secret appears) without one request refused,
// and it never lists or watches anything cluster-wide.
func TestNamespacedOverlayRunsOnItsRole(t *testing.T) {
	b := startBed(t, render(t, "config/namespaced"))
	var crbs rbacv1.ClusterRoleBindingList
	if err := b.admin.List(context.Background(), &crbs); err != nil {
		t.Fatal(err)
	}
	for _, crb := range crbs.Items {
		if crb.RoleRef.Name == "shardkeeper-manager" {
			t.Fatalf("config/namespaced binds the manager role cluster-wide (%s)", crb.Name)
		}
	}
	b.startOperator(operator.Options{WatchNamespaces: []string{operatorNamespace}})
	topo := b.createTopology(operatorNamespace)
	b.waitStalled(topo, metav1.ConditionTrue, topologyv1.ReasonSecretNotFound)
	b.createSecret(operatorNamespace, "registry", "dsn")
	b.waitStalled(topo, metav1.ConditionFalse, topologyv1.ReasonReconcileError)

	for _, r := range b.requests.all() {
		if r.status == http.StatusForbidden {
			t.Errorf("the API server refused %s %s: the namespaced Role lacks a permission the operator uses", r.method, r.path)
		}
		if res, ns, _ := r.resource(); res != "" && ns == "" && r.method == http.MethodGet {
			t.Errorf("%s %s?%s reads cluster-wide in namespaced mode", r.method, r.path, r.query)
		}
	}
}

// request is one API request the operator made and the answer's status.
type request struct {
	method, path, query, accept string
	status                      int
}

// resource splits a core or group API path into resource, namespace and
// name ("" where absent); subresources are part of resource.
func (r request) resource() (res, ns, name string) {
	parts := strings.Split(strings.Trim(r.path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "", "", ""
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		ns, parts = parts[1], parts[2:]
		if len(parts) == 0 {
			return "namespaces", "", ns
		}
	}
	switch len(parts) {
	case 1:
		return parts[0], ns, ""
	case 2:
		return parts[0], ns, parts[1]
	case 3:
		return parts[0] + "/" + parts[2], ns, parts[1]
	}
	return "", "", ""
}

// requestLog records every request made through a wrapped transport.
type requestLog struct {
	mu   sync.Mutex
	reqs []request
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		r := request{method: req.Method, path: req.URL.Path, query: req.URL.RawQuery, accept: req.Header.Get("Accept")}
		if resp != nil {
			r.status = resp.StatusCode
		}
		l.mu.Lock()
		l.reqs = append(l.reqs, r)
		l.mu.Unlock()
		return resp, err
	})
}

func (l *requestLog) all() []request {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

func (l *requestLog) sawSecretsWatch() bool {
	for _, r := range l.all() {
		if res, _, name := r.resource(); res == "secrets" && name == "" && strings.Contains(r.query, "watch=true") {
			return true
		}
	}
	return false
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Leader election under config/rbac: client-go's leader elector records
// its "became leader" Event through the core events API (controller-
// runtime hands it a record.EventRecorder), not events.k8s.io. With only
// events.k8s.io granted, every election logged `events is forbidden` and
// left no Event.
func TestLeaderElectionRecordsItsEventUnderConfigRBAC(t *testing.T) {
	b := startBed(t, render(t, "config/rbac"))
	b.startOperator(operator.Options{LeaderElect: true, LeaderElectionNamespace: operatorNamespace, LeaderElectionID: "shardkeeper-test"})
	testbed.Eventually(t, 60*time.Second, func() error {
		var evs corev1.EventList
		if err := b.admin.List(context.Background(), &evs, client.InNamespace(operatorNamespace)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "LeaderElection" && e.InvolvedObject.Kind == "Lease" && e.InvolvedObject.Name == "shardkeeper-test" {
				return nil
			}
		}
		var refused []string
		for _, r := range b.requests.all() {
			if r.status == http.StatusForbidden {
				refused = append(refused, r.method+" "+r.path)
			}
		}
		return fmt.Errorf("no LeaderElection Event on Lease shardkeeper-test yet (%d Events; refused requests: %v)", len(evs.Items), refused)
	})
	for _, r := range b.requests.all() {
		if r.status == http.StatusForbidden {
			t.Errorf("the API server refused %s %s: config/rbac lacks a permission leader election uses", r.method, r.path)
		}
	}
}
