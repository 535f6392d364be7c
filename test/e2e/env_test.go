package e2e

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubelet"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// WorkerImage is the image name the test kubelet runs as the reference
// worker binary.
const WorkerImage = "shardkeeper-worker"

// worldOptions are what a scenario asks of the test bed beyond the fleet.
type worldOptions struct {
	fleettest.Options
	// ContainerPods run as containers of WorkerContainerImage instead of
	// local processes (pod names, such as "ingest-0").
	ContainerPods []string
	// WorkerContainerImage is the worker image for ContainerPods.
	WorkerContainerImage string
	// Image is the image the StatefulSet's pods run (default WorkerImage)
	// and Binaries maps images beyond WorkerImage to local binaries.
	Image    string
	Binaries map[string]string
}

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
	// image is what the worker StatefulSet's pods run.
	image string
}

// startWorld starts a control plane with the StatefulSet controller, NATS,
// PostgreSQL and a kubelet running reference workers in namespace ns, and
// creates the Secrets the sample ShardTopology and StatefulSet name.
func startWorld(t *testing.T, ns string, o worldOptions) *world {
	t.Helper()
	o.Topology = ns + "/ingest"
	if o.SubjectPrefix == "" {
		// The sample ShardTopology sets no prefix: the operator derives
		// the topology's own, and the fleet's publishers must use it.
		o.SubjectPrefix = topologyv1.DefaultSubjectPrefixFor(ns, "ingest")
	}
	w := &world{t: t, ns: ns, fleet: fleettest.StartInfra(t, o.Options), logs: &logSet{logs: map[string]*syncBuffer{}},
		image: cmp.Or(o.Image, WorkerImage)}
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

	w.createSecrets()

	kctx, cancel := context.WithCancel(context.Background())
	w.kubelet = &kubelet.Kubelet{
		Client: w.cs, Namespace: ns, ProbeAddrEnv: "WORKER_HEALTH_ADDR",
		Images: kubeletImages(t, o.Binaries),
		// The pod spec says the rest (createStatefulSet); the delivery
		// history is the test bed's own evidence.
		Env:    func(*corev1.Pod) []string { return []string{"WORKER_HISTORY_DIR=" + w.fleet.HistoryDir} },
		Output: w.logs.writer,
	}
	if len(o.ContainerPods) > 0 {
		// The image runs as uid 65532; it writes its history file here.
		if err := os.Chmod(w.fleet.HistoryDir, 0o777); err != nil {
			t.Fatal(err)
		}
		w.kubelet.Mounts = []string{w.fleet.HistoryDir}
		w.kubelet.Container = func(p *corev1.Pod) (string, bool) {
			return o.WorkerContainerImage, slices.Contains(o.ContainerPods, p.Name)
		}
	}
	// The checker requires a history of every process the kubelet starts.
	w.fleet.AddProcesses(fleettest.KubeletProcesses(w.kubelet))
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

// kubeletImages maps image names to the local binaries the kubelet runs: the
// reference worker, and extra.
func kubeletImages(t *testing.T, extra map[string]string) map[string]string {
	out := map[string]string{WorkerImage: fleettest.WorkerBinary(t)}
	maps.Copy(out, extra)
	return out
}

// createStatefulSet creates the worker StatefulSet and its
// PodDisruptionBudget from config/samples/worker_statefulset.yaml, adapting
// only what the test bed must: the image (a local binary), the env values
// that point at this bed's NATS and handover bound (the NATS password goes
// in the URL: the sample's .creds file needs an operator-mode NATS), the
// replica count, and env for the strategy on top.
func (w *world) createStatefulSet(replicas int32, env map[string]string) {
	w.t.Helper()
	sts, pdb := workerSample(w.t)
	sts.Namespace, pdb.Namespace = w.ns, w.ns
	sts.Spec.Replicas = ptr.To(replicas)
	c := &sts.Spec.Template.Spec.Containers[0]
	c.Image = w.image
	adapted := map[string]string{
		"NATS_URL":   natstest.UserURL(w.natsURLs()[0], natstest.AppUser, natstest.AppPassword),
		"NATS_CREDS": "",
	}
	maps.Copy(adapted, env)
	setEnv(c, adapted)
	ctx := context.Background()
	if err := w.k.Create(ctx, sts); err != nil {
		w.t.Fatal(err)
	}
	if err := w.k.Create(ctx, pdb); err != nil {
		w.t.Fatal(err)
	}
}

// workerSample reads the worker StatefulSet and PodDisruptionBudget users
// copy from config/samples.
func workerSample(t *testing.T) (*appsv1.StatefulSet, *policyv1.PodDisruptionBudget) {
	t.Helper()
	var sts *appsv1.StatefulSet
	var pdb *policyv1.PodDisruptionBudget
	for _, doc := range sampleDocs(t, "worker_statefulset.yaml") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		var into any
		switch meta.Kind {
		case "StatefulSet":
			sts = &appsv1.StatefulSet{}
			into = sts
		case "PodDisruptionBudget":
			pdb = &policyv1.PodDisruptionBudget{}
			into = pdb
		default:
			t.Fatalf("worker_statefulset.yaml: unexpected kind %q", meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Fatalf("worker_statefulset.yaml: %v", err)
		}
	}
	if sts == nil || pdb == nil || len(sts.Spec.Template.Spec.Containers) != 1 {
		t.Fatal("worker_statefulset.yaml must hold one StatefulSet with one container and one PodDisruptionBudget")
	}
	return sts, pdb
}

// sampleDocs splits a file of config/samples into its YAML documents.
func sampleDocs(t *testing.T, name string) [][]byte {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "samples", name))
	if err != nil {
		t.Fatal(err)
	}
	return splitDocs(t, b)
}

// setEnv gives the container's env entries of set these values, replacing
// any value source they had, and appends the ones it lacks; the other
// entries keep their place (a $(VAR) reference needs its variable first).
func setEnv(c *corev1.Container, set map[string]string) {
	done := map[string]bool{}
	for i := range c.Env {
		if v, ok := set[c.Env[i].Name]; ok {
			c.Env[i] = corev1.EnvVar{Name: c.Env[i].Name, Value: v}
			done[c.Env[i].Name] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		if !done[k] {
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: set[k]})
		}
	}
}

// updateTemplateEnv changes the StatefulSet's pod template env (a template
// change: OnDelete pods keep running the old revision until deleted).
func (w *world) updateTemplateEnv(set map[string]string) {
	w.t.Helper()
	ctx := context.Background()
	// The StatefulSet controller writes the object's status meanwhile,
	// which moves its resourceVersion: read and update again on a
	// conflict (a CI run failed on one).
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sts := &appsv1.StatefulSet{}
		if err := w.k.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "ingest"}, sts); err != nil {
			return err
		}
		setEnv(&sts.Spec.Template.Spec.Containers[0], set)
		return w.k.Update(ctx, sts)
	})
	if err != nil {
		w.t.Fatal(err)
	}
}

// waitPodsReady waits until the StatefulSet has n ready pods, all of its
// update revision.
func (w *world) waitPodsReady(n int32, timeout time.Duration) {
	w.t.Helper()
	fleettest.Eventually(w.t, timeout, func() error { return w.podsReady(n) })
}

// podsReady says why the StatefulSet does not have n ready pods of its
// update revision, or nil when it has.
func (w *world) podsReady(n int32) error {
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
}

// natsURLs are the cluster's client URLs (credentials come from Secrets).
func (w *world) natsURLs() []string { return w.fleet.NATS.URLs() }

// createSecrets creates the Secrets the samples name: the registry DSN the
// operator and the workers read, and NATS credentials the operator reads
// ("user:password", one of the forms the operator accepts).
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

// read is everything the processes of name wrote so far.
func (l *logSet) read(name string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for k, buf := range l.logs {
		if strings.HasPrefix(k, name+".") {
			buf.mu.Lock()
			b.Write(buf.b)
			buf.mu.Unlock()
		}
	}
	return b.String()
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
