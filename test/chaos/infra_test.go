package chaos

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/operatorproc"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
)

// operatorUser is the user the operator process authenticates as; its
// permissions are config/rbac's, nothing more.
const operatorUser = "shardkeeper-operator"

// operatorNamespace holds the operator's leader election Lease.
const operatorNamespace = "shardkeeper-system"

// Leader election of the operator process: short, so a killed leader's
// successor takes over within seconds, but with room for a loaded
// machine's slow API server before a healthy leader gives up.
const (
	leaseDuration = 6 * time.Second
	renewDeadline = 4 * time.Second
	retryPeriod   = time.Second
	// censusInterval is how often the operator takes a census at least.
	censusInterval = 3 * time.Second
)

// infra is what every scenario shares: a control plane with the
// StatefulSet controller and an audit log of pod deletions, a NATS
// cluster of server processes, a PostgreSQL server and the operator
// process. Scenarios run one after another, each in its own namespace,
// database and subject prefix, and leave the shared parts running.
type infra struct {
	env   *kubetest.Environment
	k     client.Client
	cs    kubernetes.Interface
	nats  *natstest.ProcCluster
	pg    *pgtest.Server
	op    *operatorproc.Proc
	audit string
	dir   string
}

// startInfra starts the shared parts and stops them when t ends.
func startInfra(t *testing.T) *infra {
	t.Helper()
	began := time.Now()
	in := &infra{dir: mustTempDir(t, "shardkeeper-chaos-shared-")}
	in.startControlPlane(t)
	in.nats = natstest.StartProcCluster(t, natsBinaries(t)...)
	in.pg = pgtest.New(t)
	in.startOperator(t)
	// The worker binary too, once, before any scenario's clock runs.
	fleettest.WorkerBinary(t)
	t.Logf("chaos: shared parts up in %s (NATS %s, PostgreSQL on port %d, operator pid %d)",
		time.Since(began).Round(time.Second), in.nats.Name, in.pg.Port, in.op.Pid())
	return in
}

// natsBinaries are the cluster's servers: three 2.14.9 processes.
func natsBinaries(t *testing.T) []string {
	bin := natstest.Binary(t, natstest.Version214)
	return []string{bin, bin, bin}
}

// auditPolicy records every pod deletion, with the user and the instant
// the API server received it: the evidence that the operator never
// deletes a pod holding units.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["delete", "deletecollection"]
  resources: [{group: "", resources: ["pods"]}]
- level: None
`

func (in *infra) startControlPlane(t *testing.T) {
	t.Helper()
	in.audit = filepath.Join(in.dir, "audit", "audit.log")
	if err := os.MkdirAll(filepath.Dir(in.audit), 0o755); err != nil {
		t.Fatal(err)
	}
	env, err := kubetest.StartWith(kubetest.Options{AuditLogPath: in.audit, AuditPolicy: []byte(auditPolicy)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cm, err := env.StartControllerManager("statefulset-controller")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cm.Stop(context.Background()) })
	in.env = env
	scheme, err := operator.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if in.k, err = client.New(env.Config, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	in.cs = kubernetes.NewForConfigOrDie(env.Config)
}

// startOperator grants the operator's user config/rbac's roles, writes its
// kubeconfig and starts the operator process under a supervisor.
func (in *infra) startOperator(t *testing.T) {
	t.Helper()
	kubeconfig := in.operatorKubeconfig(t)
	op, err := operatorproc.New(operatorproc.Options{
		Kubeconfig: kubeconfig,
		LogPath:    filepath.Join(in.dir, "operator.log"),
		Args: []string{
			"--leader-elect", "--leader-election-namespace=" + operatorNamespace,
			"--leader-elect-lease-duration=" + leaseDuration.String(),
			"--leader-elect-renew-deadline=" + renewDeadline.String(),
			"--leader-elect-retry-period=" + retryPeriod.String(),
			"--census-interval=" + censusInterval.String(),
			"--metrics-bind-address=0",
			"--health-probe-bind-address=0",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Start(); err != nil {
		t.Fatal(err)
	}
	in.op = op
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); op.Supervise(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if exits := op.UnexpectedExits(); len(exits) > 0 {
			t.Logf("chaos: the operator exited on its own %d times (restarted by the supervisor): %v", len(exits), exits)
		}
		if t.Failed() {
			t.Logf("the operator's log is %s", filepath.Join(in.dir, "operator.log"))
		}
	})
}

// operatorKubeconfig creates the operator's user with the roles of
// config/rbac and returns the path of its kubeconfig.
func (in *infra) operatorKubeconfig(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	user, err := in.env.AddUser(envtest.User{Name: operatorUser}, in.env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}); err != nil {
		t.Fatal(err)
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: operatorUser}}
	var role rbacv1.ClusterRole
	readManifest(t, "config/rbac/role.yaml", &role)
	var election rbacv1.Role
	readManifest(t, "config/rbac/leader_election_role.yaml", &election)
	election.Namespace = operatorNamespace
	objs := []client.Object{
		&role,
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "shardkeeper-manager"}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}},
		&election,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "shardkeeper-leader-election", Namespace: operatorNamespace}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: election.Name}},
	}
	for _, o := range objs {
		if err := in.k.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	b, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(in.dir, "operator.kubeconfig")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// readManifest reads one object of the repository's config/ into obj.
func readManifest(t *testing.T, rel string, obj any) {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, obj); err != nil {
		t.Fatalf("parse %s: %v", rel, err)
	}
}

// healthy brings the shared parts back to health after a scenario that
// may have failed half way: every NATS server running with JetStream
// ready, PostgreSQL resumed, the operator running.
func (in *infra) healthy(t *testing.T) {
	t.Helper()
	_ = in.pg.SignalAll(syscall.SIGCONT)
	for _, p := range in.nats.Procs {
		if !p.Running() {
			if err := p.Start(30 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := in.nats.Ready(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	if !in.op.Running() {
		if err := in.op.Start(); err != nil {
			t.Fatal(err)
		}
	}
}
