package chaos

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubelet"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// workerImage is the image name the test kubelet runs as the reference
// worker binary.
const workerImage = "shardkeeper-worker"

// Timing of every scenario's fleet. The lease is short so takeovers take
// seconds, with room for a loaded machine: renewals every 600ms, a query
// bound of 750ms and a grace of 1.35s (the operator derives both from the
// spec, as leaseParams does).
const (
	leaseTTL      = 3 * time.Second
	renewInterval = 600 * time.Millisecond
	drainTimeout  = 10 * time.Second
	ackWait       = 10 * time.Second
	pinnedTTL     = 30 * time.Second
	// readyTimeout bounds every wait for the ShardTopology to be Ready.
	readyTimeout = 4 * time.Minute
)

// sceneParams are the registry's lease parameters the operator derives
// from the spec's lease TTL and renew interval.
func sceneParams() poolctl.Params {
	qb := min(2*time.Second, leaseTTL/4)
	return poolctl.Params{LeaseTTL: leaseTTL, RenewInterval: renewInterval, QueryBound: qb, Grace: renewInterval + qb}
}

// scene is one scenario's world on the shared parts: its namespace, its
// database behind its own fault proxy, its fleet (registry, histories,
// publisher), a kubelet running its pods, and a watch of its
// ShardTopology's status.
type scene struct {
	t       *testing.T
	in      *infra
	input   specInput
	ns      string
	fleet   *fleettest.Fleet
	proxy   *faultproxy.Proxy
	kubelet *kubelet.Kubelet
	logDir  string
	status  *timeline
	pub     *fleettest.Publisher
	follow  *follower
	params  poolctl.Params
	js      jetstream.JetStream

	// disturbed is when the scenario's first fault or change began; calm
	// when its last one ended. The scenario's window is [disturbed,
	// ready].
	disturbed, calm time.Time
	// shapes are every shape the spec asked for, the first included:
	// units in all of them are in the topology throughout.
	shapes []ownership.Topology
	// notes are scenario-specific findings for the log.
	notes []string
	rolls int

	hookMu    sync.Mutex
	stopHooks []func(pod, addr string)
}

// beforeStop adds a hook the kubelet runs before it stops a deleted pod's
// process.
func (s *scene) beforeStop(h func(pod, addr string)) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.stopHooks = append(s.stopHooks, h)
}

// newScene starts the scenario's fleet at in.From with in.Replicas pods
// under the operator, waits for Ready, and starts publishing.
func newScene(t *testing.T, inf *infra, in specInput) *scene {
	t.Helper()
	inf.healthy(t)
	id := strings.ToLower(in.ID)
	s := &scene{t: t, in: inf, input: in, ns: "chaos-" + id, params: sceneParams(), shapes: []ownership.Topology{in.From}}
	s.logDir = mustTempDir(t, "shardkeeper-chaos-"+id+"-")
	prefix := "chaos" + id
	if in.DefaultPrefix {
		prefix = topologyv1.DefaultSubjectPrefixFor(s.ns, "ingest")
	}
	rowPrefix := ""
	if in.SharesRegistry {
		// One sink table for both scenes: each reads only its own rows.
		rowPrefix = id + "-"
	}
	s.fleet = fleettest.StartInfra(t, fleettest.Options{
		Partitions: in.From.Partitions, Shards: in.From.Shards, Params: s.params,
		AckWait: in.ackWait(), DrainTimeout: drainTimeout, Topology: s.ns + "/ingest",
		NATS: natsView{t: t, c: inf.nats}, PG: inf.pg, SubjectPrefix: prefix, RegistryDSN: in.RegistryDSN, RowPrefix: rowPrefix,
		Assignment: natsops.ShardAssignment(in.Assignment), Ordering: historycheck.Ordering(in.Ordering),
	})
	target := fmt.Sprintf("127.0.0.1:%d", inf.pg.Port)
	if in.RegistryAddr != "" {
		target = in.RegistryAddr
	}
	s.proxy = faultproxy.New(t, target)
	s.fleet.ClientDSN = viaProxy(t, s.fleet.DSN, s.proxy.Addr())
	ctx := context.Background()
	if err := inf.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}); err != nil {
		t.Fatal(err)
	}
	s.createSecrets()
	s.startKubelet()
	s.createStatefulSet(in.Replicas)
	s.status = watchTopology(t, inf.env.Config, s.ns)
	s.createTopology()
	t.Cleanup(s.teardown)
	s.waitReady(in.From, readyTimeout)
	s.pub = s.fleet.StartPublisher(in.From, in.Rate)
	s.follow = startFollower(s, s.pub)
	t.Cleanup(func() { s.stopTraffic() })
	s.awaitFlow()
	if in.CleanCensus {
		s.awaitCleanCensus()
	}
	return s
}

// awaitCleanCensus waits until the operator's latest published census
// allows RESET.
func (s *scene) awaitCleanCensus() {
	s.t.Helper()
	began := time.Now()
	s.awaitRegistry("a census allowing RESET", 6*time.Minute, func(sn poolctl.Snapshot) bool { return sn.Reset.Published && sn.Reset.Allowed })
	if waited := time.Since(began); waited > 10*time.Second {
		s.note("waited %s for a census that sees every NATS server before the fault", waited.Round(time.Second))
	}
}

// awaitFlow waits until rows reach the sink from every unit of the first
// shape, so a scenario's fault lands on flowing units (and the gaps it
// causes are measured from a write before it).
func (s *scene) awaitFlow() {
	s.t.Helper()
	s.eventually(time.Minute, func() error {
		seen := map[string]bool{}
		for _, w := range s.sinkWrites() {
			seen[w.Unit] = true
		}
		if len(seen) < s.input.From.Len() {
			return fmt.Errorf("rows of %d of %d units written so far", len(seen), s.input.From.Len())
		}
		return nil
	})
}

func mustTempDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// viaProxy is dsn with its host and port replaced by the proxy's.
func viaProxy(t *testing.T, dsn, proxy string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxy
	return u.String()
}

// natsView is the shared NATS cluster as one scenario's fleet sees it:
// connections belong to the scenario's test, so a failure is its own.
type natsView struct {
	t testing.TB
	c *natstest.ProcCluster
}

func (v natsView) URLs() []string { return v.c.URLs() }

func (v natsView) url(i int) string {
	if i < 0 {
		return v.c.URL()
	}
	return v.c.URLs()[i]
}

func (v natsView) Connect(i int, opts ...nats.Option) *nats.Conn {
	return natstest.ConnectURL(v.t, v.url(i), natstest.AppUser, natstest.AppPassword, opts...)
}

func (v natsView) ConnectSys(i int, opts ...nats.Option) *nats.Conn {
	return natstest.ConnectURL(v.t, v.url(i), natstest.SysUser, natstest.SysPassword, opts...)
}

// createSecrets creates the Secrets the ShardTopology names: the DSN
// through the proxy, the application and system credentials.
func (s *scene) createSecrets() {
	s.t.Helper()
	for name, data := range map[string]map[string]string{
		"ingest-registry": {"dsn": s.fleet.ClientDSN},
		"ingest-nats": {
			"app.creds": natstest.AppUser + ":" + natstest.AppPassword,
			"sys.creds": natstest.SysUser + ":" + natstest.SysPassword,
		},
	} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns}, StringData: data}
		if err := s.in.k.Create(context.Background(), sec); err != nil {
			s.t.Fatal(err)
		}
	}
}

// startKubelet runs the namespace's pods as reference worker processes.
// Each gets its own handler-delay file (delayFile), so a test can slow one
// running worker down.
func (s *scene) startKubelet() {
	s.kubelet = &kubelet.Kubelet{
		Client: s.in.cs, Namespace: s.ns, ProbeAddrEnv: "WORKER_HEALTH_ADDR",
		Images: map[string]string{workerImage: fleettest.WorkerBinary(s.t)},
		Env: func(p *corev1.Pod) []string {
			return append(s.fleet.Env(p.Name), "WORKER_HANDLER_DELAY_FILE="+s.delayFile(p.Name))
		},
		Output: s.output,
		BeforeStop: func(pod, addr string) {
			s.hookMu.Lock()
			hooks := slices.Clone(s.stopHooks)
			s.hookMu.Unlock()
			for _, h := range hooks {
				h(pod, addr)
			}
		},
	}
	// The checker requires a history of every process the kubelet starts.
	s.fleet.AddProcesses(fleettest.KubeletProcesses(s.kubelet))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.kubelet.Run(ctx) }()
	s.t.Cleanup(func() { cancel(); <-done })
}

var outputMu sync.Mutex

// output is where one pod process's output goes: a file per start.
func (s *scene) output(pod string) io.Writer {
	outputMu.Lock()
	defer outputMu.Unlock()
	path := filepath.Join(s.logDir, fmt.Sprintf("%s.%d.log", pod, time.Now().UnixNano()))
	f, err := os.Create(path)
	if err != nil {
		return io.Discard
	}
	return f
}

// delayFile is the file whose duration pod's worker waits before each
// sink write, while it exists.
func (s *scene) delayFile(pod string) string { return filepath.Join(s.logDir, pod+".delay") }

// slowSink makes pod's worker wait d before each sink write from now on;
// d == 0 removes the delay and ends the writes' waits. It returns when
// the change was made, for awaitInFlight.
func (s *scene) slowSink(pod string, d time.Duration) time.Time {
	s.t.Helper()
	at := time.Now()
	if d == 0 {
		if err := os.Remove(s.delayFile(pod)); err != nil && !os.IsNotExist(err) {
			s.t.Fatal(err)
		}
		return at
	}
	if err := os.WriteFile(s.delayFile(pod), []byte(d.String()), 0o644); err != nil {
		s.t.Fatal(err)
	}
	return at
}

// createStatefulSet creates the worker StatefulSet (OnDelete, so only the
// operator rolls it).
func (s *scene) createStatefulSet(replicas int32) {
	s.t.Helper()
	labels := map[string]string{"app": "ingest"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: s.ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       ptr.To(replicas),
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					Containers: []corev1.Container{{
						Name: "worker", Image: workerImage,
						Args: []string{"--drain-timeout", drainTimeout.String(), "-v", "1"},
					}},
				},
			},
		},
	}
	if err := s.in.k.Create(context.Background(), sts); err != nil {
		s.t.Fatal(err)
	}
}

// createTopology creates the ShardTopology at in.From.
func (s *scene) createTopology() {
	s.t.Helper()
	in := s.input
	floor := in.VersionFloor
	prefix := s.fleet.Layout.SubjectPrefix
	if in.DefaultPrefix {
		prefix = "" // the operator derives the fleet's from namespace and name
	}
	st := &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: s.ns},
		Spec: topologyv1.ShardTopologySpec{
			Partitions: int32(in.From.Partitions), ShardsPerPartition: int32(in.From.Shards),
			NATS: topologyv1.NATSSpec{
				URLs:                       s.in.nats.URLs(),
				CredentialsSecretRef:       &topologyv1.SecretKeyRef{Name: "ingest-nats", Key: "app.creds"},
				SystemCredentialsSecretRef: &topologyv1.SecretKeyRef{Name: "ingest-nats", Key: "sys.creds"},
				SubjectPrefix:              prefix,
				Replicas:                   3,
				AckWait:                    &metav1.Duration{Duration: in.ackWait()},
				PinnedTTL:                  &metav1.Duration{Duration: pinnedTTL},
				VersionFloor:               floor,
				ShardAssignment:            in.Assignment,
			},
			Registry: topologyv1.RegistrySpec{DSNSecretRef: topologyv1.SecretKeyRef{Name: "ingest-registry", Key: "dsn"}},
			Workload: topologyv1.WorkloadSpec{StatefulSetName: "ingest"},
			Rollout: topologyv1.RolloutSpec{
				DrainTimeout:  &metav1.Duration{Duration: drainTimeout},
				LeaseTTL:      &metav1.Duration{Duration: leaseTTL},
				RenewInterval: &metav1.Duration{Duration: renewInterval},
				Ordering:      in.Ordering,
			},
		},
	}
	if err := s.in.k.Create(context.Background(), st); err != nil {
		s.t.Fatal(err)
	}
}

// teardown lets the shared parts go on without this scenario: the
// ShardTopology goes at once (orphan policy: nothing is retired), the
// pods' processes are killed with the kubelet, and the streams are
// deleted so the NATS cluster does not carry them into the next scenario.
func (s *scene) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := client.ObjectKey{Namespace: s.ns, Name: "ingest"}
	_ = s.updateTopology(func(st *topologyv1.ShardTopology) {
		if st.Annotations == nil {
			st.Annotations = map[string]string{}
		}
		st.Annotations[topologyv1.DeletionPolicyAnnotation] = topologyv1.DeletionPolicyOrphan
	})
	_ = s.in.k.Delete(ctx, &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}})
	_ = s.in.k.Delete(ctx, &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: s.ns}})
	nc, err := nats.Connect(s.in.nats.URL(), nats.UserInfo(natstest.AppUser, natstest.AppPassword))
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	for p := 0; p < max(16, s.input.From.Partitions); p++ {
		_ = js.DeleteStream(ctx, s.fleet.Layout.StreamName(p))
	}
}

// stopTraffic stops the publisher and the follower; it returns what was
// published. Safe to call twice.
func (s *scene) stopTraffic() map[string]ownership.Unit {
	if s.follow != nil {
		s.follow.stop()
		s.follow = nil
	}
	var published map[string]ownership.Unit
	if s.pub != nil {
		published = s.pub.Stop()
		s.pub = nil
	}
	return published
}

// note records a scenario finding for the log.
func (s *scene) note(format string, args ...any) {
	s.t.Helper()
	msg := fmt.Sprintf(format, args...)
	s.notes = append(s.notes, msg)
	s.t.Log(msg)
}

// disturb marks the start of the scenario's disturbance (the first fault
// or change); later calls keep the first.
func (s *scene) disturb() {
	if s.disturbed.IsZero() {
		s.disturbed = time.Now()
	}
}

// settle marks the end of the scenario's last fault or change.
func (s *scene) settle() { s.calm = time.Now() }

// jetstream is a JetStream context on the shared cluster for the scene's
// test.
func (s *scene) jetstream() jetstream.JetStream {
	s.t.Helper()
	if s.js == nil {
		js, err := jetstream.New(s.fleet.NATS.Connect(-1))
		if err != nil {
			s.t.Fatal(err)
		}
		s.js = js
	}
	return s.js
}

// natsUnit is u in natsops' terms.
func natsUnit(u ownership.Unit) natsops.Unit {
	return natsops.Unit{Partition: u.Partition, Shard: u.Shard}
}

// alwaysThere reports whether unit is in every shape the spec asked for.
func (s *scene) alwaysThere(unit string) bool {
	u, err := ownership.ParseUnit(unit)
	if err != nil {
		return false
	}
	for _, sh := range s.shapes {
		if !sh.Contains(u) {
			return false
		}
	}
	return true
}
