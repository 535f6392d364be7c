package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubelet"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// WorkerImage is the image name the test kubelet runs as the reference
// worker binary.
const WorkerImage = "shardkeeper-worker"

// world is one scenario's running parts.
type world struct {
	t       *testing.T
	ns      string
	fleet   *fleettest.Fleet
	env     *kubetest.Environment
	k       client.Client
	cs      kubernetes.Interface
	kubelet *kubelet.Kubelet
	logs    *logSet
}

// startWorld starts a control plane with the StatefulSet controller, NATS,
// PostgreSQL and a kubelet running reference workers in namespace ns.
func startWorld(t *testing.T, ns string, o fleettest.Options) *world {
	t.Helper()
	o.Topology = ns + "/ingest"
	w := &world{t: t, ns: ns, fleet: fleettest.StartInfra(t, o), logs: &logSet{logs: map[string]*syncBuffer{}}}
	env, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cm, err := env.StartControllerManager("statefulset-controller")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cm.Stop(context.Background()) })
	w.env = env
	scheme, err := operator.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if w.k, err = client.New(env.Config, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	w.cs = kubernetes.NewForConfigOrDie(env.Config)
	ctx := context.Background()
	if err := w.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}

	kctx, cancel := context.WithCancel(context.Background())
	w.kubelet = &kubelet.Kubelet{
		Client: w.cs, Namespace: ns, ProbeAddrEnv: "WORKER_HEALTH_ADDR",
		Images: map[string]string{WorkerImage: fleettest.WorkerBinary(t)},
		// Secrets a real pod would get from its spec.
		Env:    func(p *corev1.Pod) []string { return w.fleet.Env(p.Name) },
		Output: w.logs.writer,
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = w.kubelet.Run(kctx) }()
	t.Cleanup(func() { cancel(); <-done })
	t.Cleanup(func() {
		if t.Failed() {
			w.logs.dump(t)
		}
	})
	return w
}

// createStatefulSet creates the worker StatefulSet with env on top of the
// reference worker's defaults.
func (w *world) createStatefulSet(replicas int32, env map[string]string) {
	w.t.Helper()
	labels := map[string]string{"app": "ingest"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: w.ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       ptr.To(replicas),
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					Containers: []corev1.Container{{
						Name: "worker", Image: WorkerImage,
						Args: []string{"--drain-timeout", w.fleet.Opts.DrainTimeout.String()},
						Env:  envVars(env),
					}},
				},
			},
		},
	}
	if err := w.k.Create(context.Background(), sts); err != nil {
		w.t.Fatal(err)
	}
}

func envVars(m map[string]string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for k, v := range m {
		out = append(out, corev1.EnvVar{Name: k, Value: v})
	}
	return out
}

// updateTemplateEnv changes the StatefulSet's pod template env (a template
// change: OnDelete pods keep running the old revision until deleted).
func (w *world) updateTemplateEnv(set map[string]string) {
	w.t.Helper()
	ctx := context.Background()
	sts := &appsv1.StatefulSet{}
	if err := w.k.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "ingest"}, sts); err != nil {
		w.t.Fatal(err)
	}
	c := &sts.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for k, v := range set {
		env[k] = v
	}
	c.Env = envVars(env)
	if err := w.k.Update(ctx, sts); err != nil {
		w.t.Fatal(err)
	}
}

// waitPodsReady waits until the StatefulSet has n ready pods, all of its
// update revision.
func (w *world) waitPodsReady(n int32, timeout time.Duration) {
	w.t.Helper()
	fleettest.Eventually(w.t, timeout, func() error {
		sts := &appsv1.StatefulSet{}
		if err := w.k.Get(context.Background(), client.ObjectKey{Namespace: w.ns, Name: "ingest"}, sts); err != nil {
			return err
		}
		st := sts.Status
		if st.ReadyReplicas != n || st.UpdatedReplicas != n || st.ObservedGeneration != sts.Generation {
			return fmt.Errorf("statefulset: ready %d updated %d of %d (observed generation %d of %d)",
				st.ReadyReplicas, st.UpdatedReplicas, n, st.ObservedGeneration, sts.Generation)
		}
		return nil
	})
}

// natsURLs are the cluster's client URLs (credentials come from Secrets).
func (w *world) natsURLs() []string { return w.fleet.NATS.URLs() }

// secrets creates the Secrets a ShardTopology names.
func (w *world) createSecrets() {
	w.t.Helper()
	ctx := context.Background()
	for name, data := range map[string]map[string]string{
		"ingest-registry": {"dsn": w.fleet.DSN},
		"ingest-nats": {
			"app.creds": natstest.AppUser + ":" + natstest.AppPassword,
			"sys.creds": natstest.SysUser + ":" + natstest.SysPassword,
		},
	} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns}, StringData: data}
		if err := w.k.Create(ctx, s); err != nil {
			w.t.Fatal(err)
		}
	}
}

// syncBuffer is a concurrency-safe log buffer.
type syncBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

// logSet keeps every pod process's output, dumped to files on failure.
type logSet struct {
	mu   sync.Mutex
	logs map[string]*syncBuffer
	n    int
}

func (l *logSet) writer(pod string) io.Writer {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	b := &syncBuffer{}
	l.logs[fmt.Sprintf("%s.%d", pod, l.n)] = b
	return b
}

func (l *logSet) dump(t *testing.T) {
	dir, err := os.MkdirTemp("", "shardkeeper-e2e-logs-")
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, b := range l.logs {
		b.mu.Lock()
		_ = os.WriteFile(filepath.Join(dir, name+".log"), b.b, 0o644)
		b.mu.Unlock()
	}
	t.Logf("worker logs written to %s", dir)
}

// sts reads the worker StatefulSet.
func sts(w *world) *appsv1.StatefulSet {
	w.t.Helper()
	s := &appsv1.StatefulSet{}
	if err := w.k.Get(context.Background(), client.ObjectKey{Namespace: w.ns, Name: "ingest"}, s); err != nil {
		w.t.Fatal(err)
	}
	return s
}
