package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// fleetInput says what a fleet test needs.
type fleetInput struct {
	partitions, shards int32
	// servers in the NATS cluster (default 1), and stream replicas
	// (default 1).
	servers, replicas int
	floor             string
	// registryProxy puts a faultproxy between the operator and the
	// registry (the test's own handle, f.reg, connects directly).
	registryProxy bool
	// assignment is spec.nats.shardAssignment (default: publishers).
	assignment topologyv1.ShardAssignment
}

// fleet is one test's world: a namespace with the Secrets and StatefulSet a
// ShardTopology names, a NATS cluster, a registry database, and the
// ShardTopology itself (not created yet).
type fleet struct {
	t    *testing.T
	ns   string
	nats *natstest.Cluster
	nc   *nats.Conn
	dsn  string
	reg  *poolctl.PG
	topo *topologyv1.ShardTopology
	// proxy sits between the operator and the registry when asked for.
	proxy *faultproxy.Proxy
}

func newFleet(t *testing.T, in fleetInput) *fleet {
	t.Helper()
	ctx := context.Background()
	if in.servers == 0 {
		in.servers = 1
	}
	if in.replicas == 0 {
		in.replicas = 1
	}
	f := &fleet{t: t, ns: newNamespace(t)}
	f.nats = natstest.StartCluster(t, in.servers)
	f.nc = f.nats.Connect(-1)
	f.dsn = postgres(t).NewTestDatabase(t)
	reg, err := poolctl.Open(ctx, poolctl.Config{DSN: f.dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	f.reg = reg
	operatorDSN := f.dsn
	if in.registryProxy {
		u, err := url.Parse(f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		f.proxy = faultproxy.New(t, u.Host)
		u.Host = f.proxy.Addr()
		operatorDSN = u.String()
	}

	for name, data := range map[string]map[string]string{
		"registry": {"dsn": operatorDSN},
		"nats": {
			"app": natstest.AppUser + ":" + natstest.AppPassword,
			"sys": natstest.SysUser + ":" + natstest.SysPassword,
		},
	} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns}, StringData: data}
		if err := k.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	f.topo = &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: f.ns},
		Spec: topologyv1.ShardTopologySpec{
			Partitions:         in.partitions,
			ShardsPerPartition: in.shards,
			NATS: topologyv1.NATSSpec{
				URLs: f.nats.URLs(),
				// Each fleet has its own NATS cluster; the helpers below
				// name its streams with this prefix.
				SubjectPrefix:              "shardkeeper",
				CredentialsSecretRef:       &topologyv1.SecretKeyRef{Name: "nats", Key: "app"},
				SystemCredentialsSecretRef: &topologyv1.SecretKeyRef{Name: "nats", Key: "sys"},
				Replicas:                   int32(in.replicas),
				VersionFloor:               in.floor,
				ShardAssignment:            in.assignment,
			},
			Registry: topologyv1.RegistrySpec{DSNSecretRef: topologyv1.SecretKeyRef{Name: "registry", Key: "dsn"}},
			Workload: topologyv1.WorkloadSpec{StatefulSetName: "ingest"},
			Rollout: topologyv1.RolloutSpec{
				LeaseTTL:      &metav1.Duration{Duration: 4 * time.Second},
				RenewInterval: &metav1.Duration{Duration: time.Second},
				DrainTimeout:  &metav1.Duration{Duration: 5 * time.Second},
			},
		},
	}
	return f
}

func (f *fleet) key() string { return f.ns + "/ingest" }

// withStatefulSet creates the workload StatefulSet (OnDelete, no pods
// unless a controller manager runs).
func (f *fleet) withStatefulSet(replicas int32, image string) *appsv1.StatefulSet {
	f.t.Helper()
	labels := map[string]string{"app": "ingest"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: f.ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       &replicas,
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers:                    []corev1.Container{{Name: "worker", Image: image}},
					TerminationGracePeriodSeconds: ptrTo[int64](10),
				},
			},
		},
	}
	if err := k.Create(context.Background(), sts); err != nil {
		f.t.Fatal(err)
	}
	return sts
}

func ptrTo[T any](v T) *T { return &v }

func (f *fleet) create() {
	f.t.Helper()
	if err := k.Create(context.Background(), f.topo); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleet) get() *topologyv1.ShardTopology {
	f.t.Helper()
	got := &topologyv1.ShardTopology{}
	if err := k.Get(context.Background(), client.ObjectKeyFromObject(f.topo), got); err != nil {
		f.t.Fatal(err)
	}
	return got
}

// update changes the ShardTopology, retrying on conflicts with the
// operator's writes.
func (f *fleet) update(mutate func(*topologyv1.ShardTopology)) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := &topologyv1.ShardTopology{}
		if err := k.Get(context.Background(), client.ObjectKeyFromObject(f.topo), got); err != nil {
			return err
		}
		mutate(got)
		return k.Update(context.Background(), got)
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleet) snapshot() poolctl.Snapshot {
	f.t.Helper()
	s, err := f.reg.Snapshot(context.Background(), f.key())
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// waitStatus polls the object until cond accepts it.
func (f *fleet) waitStatus(timeout time.Duration, cond func(*topologyv1.ShardTopology) error) *topologyv1.ShardTopology {
	f.t.Helper()
	var last *topologyv1.ShardTopology
	eventually(f.t, timeout, func() error {
		got := &topologyv1.ShardTopology{}
		if err := k.Get(context.Background(), client.ObjectKeyFromObject(f.topo), got); err != nil {
			return err
		}
		last = got
		if err := cond(got); err != nil {
			return fmt.Errorf("%w (phase %s, progress %q, conditions %s)", err, got.Status.Phase, got.Status.Progress, conditionsString(got))
		}
		return nil
	})
	return last
}

// waitReady waits for Ready=True at the current generation.
func (f *fleet) waitReady(timeout time.Duration) *topologyv1.ShardTopology {
	f.t.Helper()
	return f.waitStatus(timeout, func(o *topologyv1.ShardTopology) error {
		if !meta.IsStatusConditionTrue(o.Status.Conditions, topologyv1.ConditionReady) || o.Status.ObservedGeneration != o.Generation {
			return errors.New("not Ready at the current generation")
		}
		return nil
	})
}

func conditionsString(o *topologyv1.ShardTopology) string {
	var parts []string
	for _, c := range o.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s/%s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, " | ")
}

func wantConditionOf(t *testing.T, o *topologyv1.ShardTopology, typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(o.Status.Conditions, typ)
	if c == nil || c.Status != status || c.Reason != reason {
		t.Fatalf("%s = %+v, want %s/%s", typ, c, status, reason)
	}
	return *c
}

// consumers lists the unit consumers on the partition streams 0..n-1.
func (f *fleet) consumers(partitions int) []string {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(f.nc)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for p := range partitions {
		s, err := js.Stream(ctx, fmt.Sprintf("SHARDKEEPER_INGEST_%d", p))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			f.t.Fatal(err)
		}
		names := s.ConsumerNames(ctx)
		for n := range names.Name() {
			out = append(out, n)
		}
		if err := names.Err(); err != nil {
			f.t.Fatal(err)
		}
	}
	sort.Strings(out)
	return out
}

// publish stores n rows of unit p.s.
func (f *fleet) publish(p, s, n int) {
	f.t.Helper()
	js, err := jetstream.New(f.nc)
	if err != nil {
		f.t.Fatal(err)
	}
	l := natsops.Layout{SubjectPrefix: "shardkeeper"}
	for i := range n {
		if _, err := js.Publish(context.Background(), l.ShardSubject(p, s, fmt.Sprintf("row%d", i)), []byte("row")); err != nil {
			f.t.Fatal(err)
		}
	}
}

// publishKeys publishes n rows to partition p under a subject transform,
// one key each.
func (f *fleet) publishKeys(p, n int) {
	f.t.Helper()
	js, err := jetstream.New(f.nc)
	if err != nil {
		f.t.Fatal(err)
	}
	l := natsops.Layout{SubjectPrefix: "shardkeeper"}
	for i := range n {
		if _, err := js.Publish(context.Background(), l.RowSubject(p, fmt.Sprintf("key%d", i)), []byte("row")); err != nil {
			f.t.Fatal(err)
		}
	}
}

// startFleet starts the operator on a fleet of in's shape (its topology
// tweaked by tweak, when given), with a sim worker that claims every unit
// but delivers nothing, and waits for Ready.
func startFleet(t *testing.T, in fleetInput, tweak func(*topologyv1.ShardTopology)) *fleet {
	t.Helper()
	f := newFleet(t, in)
	if tweak != nil {
		tweak(f.topo)
	}
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)
	return f
}

// unitConsumer looks up unit p.s's consumer.
func (f *fleet) unitConsumer(ctx context.Context, p, s int) jetstream.Consumer {
	f.t.Helper()
	js, err := jetstream.New(f.nc)
	if err != nil {
		f.t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, fmt.Sprintf("SHARDKEEPER_INGEST_%d", p), fmt.Sprintf("ingest_%d_%d", p, s))
	if err != nil {
		f.t.Fatal(err)
	}
	return cons
}

// pending is how many rows wait, never delivered, in unit p.s's consumer.
func (f *fleet) pending(p, s int) uint64 {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f.unitConsumer(ctx, p, s).CachedInfo().NumPending
}

// drain pulls and acknowledges every row of unit p.s's consumer, as the
// unit's last owner would.
func (f *fleet) drain(p, s int) int {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return f.drainConsumer(ctx, f.unitConsumer(ctx, p, s))
}

// drainConsumer pulls and acknowledges through cons until a pull brings
// nothing, and returns how many rows it acknowledged.
func (f *fleet) drainConsumer(ctx context.Context, cons jetstream.Consumer) int {
	f.t.Helper()
	n := 0
	for {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second), jetstream.FetchPriorityGroup(natsops.PriorityGroup))
		if err != nil {
			f.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				f.t.Fatal(err)
			}
			got++
		}
		n += got
		if got == 0 {
			return n
		}
	}
}

// streamRows is how many rows partition p's stream stores.
func (f *fleet) streamRows(p int) uint64 {
	f.t.Helper()
	js, err := jetstream.New(f.nc)
	if err != nil {
		f.t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), fmt.Sprintf("SHARDKEEPER_INGEST_%d", p))
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return info.State.Msgs
}

// operatorRun is one operator process: a manager restricted to one
// namespace, as main.go builds it.
type operatorRun struct {
	cancel context.CancelFunc
	done   chan error
}

func startOperator(t *testing.T, ns string) *operatorRun {
	t.Helper()
	return startOperatorWith(t, ns, operator.Options{})
}

// startOperatorWith starts an operator with o's intervals and bounds.
func startOperatorWith(t *testing.T, ns string, opts operator.Options) *operatorRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts.MetricsAddr, opts.ProbeAddr = "0", "0"
	opts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}
	opts.SkipControllerNameValidation = true
	mgr, err := operator.New(ctx, cfg, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	o := &operatorRun{cancel: cancel, done: make(chan error, 1)}
	go func() { o.done <- mgr.Start(ctx) }()
	t.Cleanup(o.stop)
	return o
}

// stop stops the operator and waits for it, as a pod's SIGTERM does.
func (o *operatorRun) stop() {
	if o.cancel == nil {
		return
	}
	o.cancel()
	select {
	case <-o.done:
	case <-time.After(30 * time.Second):
	}
	o.cancel = nil
}

// listEvents lists the namespace's Events with reason, oldest first.
func listEvents(t *testing.T, ns, reason string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	if err := k.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if reason == "" || e.Reason == reason {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].EventTime.Before(&out[j].EventTime) })
	return out
}

// waitEvent waits for an Event with reason whose note contains text.
func waitEvent(t *testing.T, ns, reason, text string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	eventually(t, 20*time.Second, func() error {
		for _, e := range listEvents(t, ns, reason) {
			if strings.Contains(e.Note, text) {
				found = e
				return nil
			}
		}
		return fmt.Errorf("no %s Event with %q", reason, text)
	})
	return found
}

// metricValue reads one series of the operator's metrics registry.
func metricValue(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			if hasLabels(m, labels) {
				switch {
				case m.Gauge != nil:
					return m.Gauge.GetValue(), true
				case m.Counter != nil:
					return m.Counter.GetValue(), true
				}
			}
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}
