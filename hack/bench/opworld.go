package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// opShape is the world a steady-state row's operator runs in: how many
// topologies of what shape, claimed by how many members each, beside how
// many unrelated Secrets. The first `watched` topologies are in
// opNamespace, the rest in opMoreNamespace, so that an operator watching
// opNamespace alone (--watch-namespace) is a baseline on the same NATS
// cluster, every other topology's consumers included.
type opShape struct {
	row                  string
	what                 string
	topologies, watched  int
	partitions, shards   int
	members              int // per topology
	secrets, secretBytes int
	// variants are the ways the operator is run, the baseline first.
	variants []opVariant
	// provisionFirst is the index of the variant that runs first: the
	// one that watches every topology, so every consumer exists before
	// the baseline runs.
	provisionFirst int
	rssGoal        int64
}

const (
	opNamespace        = "bench"
	opMoreNamespace    = "bench-more"
	opUnrelated        = "unrelated"
	opSecretCreateJobs = 16
)

// shapeE is row e: 10 topologies of 16 x 256 units beside 10,000
// Secrets; the baseline is the Secret cache the operator had before.
var shapeE = opShape{row: "e", what: "10 x 4096 units + 10,000 Secrets", topologies: 10, watched: 10,
	partitions: 16, shards: 256, members: 4, secrets: 10_000, secretBytes: 4 << 10, rssGoal: 128 << 20,
	variants: []opVariant{
		{name: "full Secret informer (before)", args: []string{"--full-secret-cache"}},
		{name: "metadata-only Secret watch (now)"},
	}}

// shapeE2 is row e2: 100 topologies of 2 x 128 units on one NATS
// cluster; the baseline is the same operator watching 10 of them, on the
// same cluster, so the ratio is what the other 90 cost it.
var shapeE2 = opShape{row: "e2", what: "100 x 256 units on one NATS cluster", topologies: 100, watched: 10,
	partitions: 2, shards: 128, members: 2, rssGoal: 256 << 20, provisionFirst: 1,
	variants: []opVariant{
		{name: "10 of the topologies (--watch-namespace=" + opNamespace + ")", args: []string{"--watch-namespace=" + opNamespace}, watchesOnly: opNamespace},
		{name: "all 100 topologies"},
	}}

// namespaceOf is where topology i lives.
func (sh opShape) namespaceOf(i int) string {
	if i < sh.watched {
		return opNamespace
	}
	return opMoreNamespace
}

// opWorld is the API server with every object, the registry, NATS and
// the members.
type opWorld struct {
	e          *env
	sh         opShape
	kube       *kubetest.Environment
	k          client.Client
	kubeconfig string
	reg        *poolctl.PG
	natsURL    string
	setup      time.Duration
	stopFleet  func()
}

func newOpWorld(ctx context.Context, e *env, sh opShape) (w *opWorld, err error) {
	start := time.Now()
	w = &opWorld{e: e, sh: sh}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	srv, err := e.natsServer("operator-" + sh.row)
	if err != nil {
		return w, err
	}
	w.natsURL = srv.URL()
	dsn, err := e.database(ctx, "bench_operator_"+sh.row)
	if err != nil {
		return w, err
	}
	if w.reg, err = poolctl.Open(ctx, poolctl.Config{DSN: dsn, MaxConns: 16}); err != nil {
		return w, fmt.Errorf("open registry: %w", err)
	}
	if err := w.startKube(); err != nil {
		return w, err
	}
	e.say("%s: creating %d unrelated Secrets of %d bytes", sh.row, sh.secrets, sh.secretBytes)
	if err := w.createUnrelatedSecrets(ctx); err != nil {
		return w, err
	}
	if err := w.createTopologies(ctx, dsn); err != nil {
		return w, err
	}
	w.startFleet()
	w.setup = time.Since(start)
	return w, nil
}

func (w *opWorld) close() {
	if w.stopFleet != nil {
		w.stopFleet()
	}
	if w.kube != nil {
		_ = w.kube.Stop()
	}
	if w.reg != nil {
		w.reg.Close()
	}
}

// startKube starts etcd and kube-apiserver and writes a kubeconfig for
// the operator process.
func (w *opWorld) startKube() error {
	kube, err := kubetest.Start()
	if err != nil {
		return err
	}
	w.kube = kube
	scheme, err := operator.NewScheme()
	if err != nil {
		return err
	}
	if w.k, err = client.New(kube.Config, client.Options{Scheme: scheme}); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	user, err := kube.AddUser(envtest.User{Name: "shardkeeper-operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("add the operator's user: %w", err)
	}
	cfg, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	w.kubeconfig = filepath.Join(w.e.dir, "kubeconfig")
	return os.WriteFile(w.kubeconfig, cfg, 0o600)
}

func (w *opWorld) createUnrelatedSecrets(ctx context.Context) error {
	if err := w.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opUnrelated}}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	data := bytes.Repeat([]byte("s"), w.sh.secretBytes)
	jobs := make(chan int)
	errs := make(chan error, opSecretCreateJobs)
	var wg sync.WaitGroup
	for range opSecretCreateJobs {
		wg.Go(func() {
			for i := range jobs {
				s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("unrelated-%05d", i), Namespace: opUnrelated},
					Data: map[string][]byte{"data": data}}
				if err := w.k.Create(ctx, s); err != nil {
					errs <- fmt.Errorf("create Secret %d: %w", i, err)
					return
				}
			}
		})
	}
	var err error
	for i := 0; i < w.sh.secrets && err == nil; i++ {
		select {
		case jobs <- i:
		case err = <-errs:
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	if err != nil {
		return err
	}
	return <-errs
}

// createTopologies creates each namespace's Secrets, one OnDelete
// StatefulSet per topology (no pods: no controller-manager runs) and the
// topologies.
func (w *opWorld) createTopologies(ctx context.Context, dsn string) error {
	var objs []client.Object
	for _, ns := range w.namespaces() {
		objs = append(objs,
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: ns},
				StringData: map[string]string{"dsn": dsn}},
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "nats", Namespace: ns},
				StringData: map[string]string{"app.creds": natstest.AppUser + ":" + natstest.AppPassword,
					"sys.creds": natstest.SysUser + ":" + natstest.SysPassword}})
	}
	for i := range w.sh.topologies {
		objs = append(objs, w.statefulSet(i), w.topology(i))
	}
	for _, o := range objs {
		if err := w.k.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// namespaces are the namespaces the world's topologies live in.
func (w *opWorld) namespaces() []string {
	if w.sh.watched < w.sh.topologies {
		return []string{opNamespace, opMoreNamespace}
	}
	return []string{opNamespace}
}

func (w *opWorld) statefulSet(i int) *appsv1.StatefulSet {
	name := fmt.Sprintf("ingest-%d", i)
	labels := map[string]string{"app": name}
	replicas := int32(w.sh.members)
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.sh.namespaceOf(i)},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       &replicas,
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "shardkeeper-worker"}}},
			},
		},
	}
}

func (w *opWorld) topology(i int) *topologyv1.ShardTopology {
	return &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ingest-%d", i), Namespace: w.sh.namespaceOf(i)},
		Spec: topologyv1.ShardTopologySpec{
			Partitions:         int32(w.sh.partitions),
			ShardsPerPartition: int32(w.sh.shards),
			NATS: topologyv1.NATSSpec{
				URLs:                       []string{w.natsURL},
				CredentialsSecretRef:       &topologyv1.SecretKeyRef{Name: "nats", Key: "app.creds"},
				SystemCredentialsSecretRef: &topologyv1.SecretKeyRef{Name: "nats", Key: "sys.creds"},
				SubjectPrefix:              fmt.Sprintf("t%d", i),
				Replicas:                   1,
			},
			Registry: topologyv1.RegistrySpec{DSNSecretRef: topologyv1.SecretKeyRef{Name: "registry", Key: "dsn"}},
			Workload: topologyv1.WorkloadSpec{StatefulSetName: fmt.Sprintf("ingest-%d", i)},
		},
	}
}

// startFleet starts the shape's registry-level members per topology.
func (w *opWorld) startFleet() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range w.sh.topologies {
		for j := range w.sh.members {
			m := &simMember{reg: w.reg, topology: w.sh.namespaceOf(i) + "/" + fmt.Sprintf("ingest-%d", i),
				name: fmt.Sprintf("ingest-%d-%d", i, j)}
			wg.Go(func() { m.run(ctx) })
		}
	}
	w.stopFleet = func() { cancel(); wg.Wait() }
}
