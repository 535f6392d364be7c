package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubelet"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
)

// namespace is where the demo's objects live.
const namespace = "demo"

// parts are the running pieces, stopped in reverse order of start.
type parts struct {
	dir  string
	pg   *pgtest.Server
	dsn  string
	nats *natstest.Cluster
	env  *kubetest.Environment
	k    client.Client
	cs   kubernetes.Interface
	// kubelet runs the worker pods; the checker requires a history of
	// every process it started.
	kubelet *kubelet.Kubelet
	stops   []func()
}

func (p *parts) onStop(f func()) { p.stops = append(p.stops, f) }

// historyDir is where the workers write their delivery histories.
func (p *parts) historyDir() string { return filepath.Join(p.dir, "history") }

// sinkDelayFile is the workers' WORKER_HANDLER_DELAY_FILE: while it exists
// every sink write waits the duration written in it.
func (p *parts) sinkDelayFile() string { return filepath.Join(p.dir, "sink.delay") }

func (p *parts) stop() {
	say("stopping everything the demo started")
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
}

// startParts starts PostgreSQL, NATS, the control plane, the kubelet and
// the operator. On error it stops what it started.
func startParts(ctx context.Context) (p *parts, err error) {
	p = &parts{}
	defer func() {
		if err != nil {
			p.stop()
			p = nil
		}
	}()
	if p.dir, err = os.MkdirTemp("", "shardkeeper-demo-"); err != nil {
		return p, err
	}
	p.onStop(func() { os.RemoveAll(p.dir) })

	say("starting PostgreSQL (Debian's packages, a throwaway cluster on a free port)")
	if p.pg, err = pgtest.Start(ctx); err != nil {
		return p, err
	}
	p.onStop(p.pg.Stop)
	if p.dsn, err = p.pg.NewDatabase(ctx, "shardkeeper"); err != nil {
		return p, err
	}

	say("starting a 3-server NATS JetStream cluster (in-process nats-server)")
	if p.nats, err = natstest.Start(filepath.Join(p.dir, "nats"), 3); err != nil {
		return p, err
	}
	p.onStop(p.nats.Shutdown)

	say("starting kube-apiserver, etcd and kube-controller-manager (built from source on first use; minutes)")
	if p.env, err = kubetest.Start(); err != nil {
		return p, err
	}
	p.onStop(func() { _ = p.env.Stop() })
	cm, err := p.env.StartControllerManager("statefulset-controller")
	if err != nil {
		return p, err
	}
	p.onStop(func() { _ = cm.Stop(context.Background()) })

	scheme, err := operator.NewScheme()
	if err != nil {
		return p, err
	}
	if p.k, err = client.New(p.env.Config, client.Options{Scheme: scheme}); err != nil {
		return p, err
	}
	p.cs = kubernetes.NewForConfigOrDie(p.env.Config)
	if err := p.startKubelet(ctx); err != nil {
		return p, err
	}
	return p, p.startOperator(ctx)
}

// startKubelet runs the demo namespace's pods as reference worker
// processes on this machine.
func (p *parts) startKubelet(ctx context.Context) error {
	say("building the reference worker (cmd/shardkeeper-worker)")
	bin, err := fleettest.BuildWorker()
	if err != nil {
		return err
	}
	p.onStop(func() { os.RemoveAll(filepath.Dir(bin)) })
	logs, err := os.Create(filepath.Join(p.dir, "workers.log"))
	if err != nil {
		return err
	}
	kl := &kubelet.Kubelet{
		Client: p.cs, Namespace: namespace, ProbeAddrEnv: "WORKER_HEALTH_ADDR",
		Images: map[string]string{"shardkeeper-worker": bin},
		Env: func(pod *corev1.Pod) []string {
			// What the pod spec would take from Secrets in a real cluster.
			return []string{"SHARDKEEPER_TOPOLOGY=" + namespace + "/ingest", "REGISTRY_DSN=" + p.dsn,
				"NATS_URL=" + natstest.UserURL(p.nats.URLs()[0], natstest.AppUser, natstest.AppPassword),
				"WORKER_HISTORY_DIR=" + p.historyDir()}
		},
		Output: func(string) io.Writer { return logs },
	}
	p.kubelet = kl
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = kl.Run(kctx) }()
	p.onStop(func() { cancel(); <-done; logs.Close() })
	return nil
}

func (p *parts) startOperator(ctx context.Context) error {
	mgr, err := operator.New(ctx, p.env.Config, operator.Options{MetricsAddr: "0", ProbeAddr: "0",
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}}})
	if err != nil {
		return err
	}
	octx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(octx) }()
	p.onStop(func() { cancel(); <-done })
	say("operator running")
	return nil
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}
