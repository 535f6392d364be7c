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

// The world row e's operator runs in.
const (
	opNamespace        = "bench"
	opUnrelated        = "unrelated"
	opTopologies       = 10
	opPartitions       = 16
	opShards           = 256
	opMembers          = 4 // per topology
	opSecrets          = 10_000
	opSecretBytes      = 4 << 10
	opSecretCreateJobs = 16
)

// opWorld is the API server with every object, the registry, NATS and
// the members.
type opWorld struct {
	e          *env
	kube       *kubetest.Environment
	k          client.Client
	kubeconfig string
	reg        *poolctl.PG
	natsURL    string
	setup      time.Duration
	stopFleet  func()
}

func newOpWorld(ctx context.Context, e *env) (w *opWorld, err error) {
	start := time.Now()
	w = &opWorld{e: e}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	srv, err := e.natsServer("operator")
	if err != nil {
		return w, err
	}
	w.natsURL = srv.URL()
	dsn, err := e.database(ctx, "bench_operator")
	if err != nil {
		return w, err
	}
	if w.reg, err = poolctl.Open(ctx, poolctl.Config{DSN: dsn, MaxConns: 16}); err != nil {
		return w, fmt.Errorf("open registry: %w", err)
	}
	if err := w.startKube(); err != nil {
		return w, err
	}
	e.say("e: creating %d unrelated Secrets of %d bytes", opSecrets, opSecretBytes)
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
	data := bytes.Repeat([]byte("s"), opSecretBytes)
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
	for i := 0; i < opSecrets && err == nil; i++ {
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

// createTopologies creates the namespace's Secrets, one OnDelete
// StatefulSet per topology (no pods: no controller-manager runs) and the
// topologies.
func (w *opWorld) createTopologies(ctx context.Context, dsn string) error {
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNamespace}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: opNamespace},
			StringData: map[string]string{"dsn": dsn}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "nats", Namespace: opNamespace},
			StringData: map[string]string{"app.creds": natstest.AppUser + ":" + natstest.AppPassword,
				"sys.creds": natstest.SysUser + ":" + natstest.SysPassword}},
	}
	for i := range opTopologies {
		objs = append(objs, statefulSet(fmt.Sprintf("ingest-%d", i)), w.topology(i))
	}
	for _, o := range objs {
		if err := w.k.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

func statefulSet(name string) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	replicas := int32(opMembers)
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: opNamespace},
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
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ingest-%d", i), Namespace: opNamespace},
		Spec: topologyv1.ShardTopologySpec{
			Partitions:         opPartitions,
			ShardsPerPartition: opShards,
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

// startFleet starts opMembers registry-level members per topology.
func (w *opWorld) startFleet() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range opTopologies {
		for j := range opMembers {
			m := &simMember{reg: w.reg, topology: opNamespace + "/" + fmt.Sprintf("ingest-%d", i),
				name: fmt.Sprintf("ingest-%d-%d", i, j)}
			wg.Go(func() { m.run(ctx) })
		}
	}
	w.stopFleet = func() { cancel(); wg.Wait() }
}
