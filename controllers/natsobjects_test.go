package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/pkg/publish"
)

// streamMeta reads a stream's metadata, nil when the stream is absent.
func (f *fleet) streamMeta(name string) map[string]string {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(f.nc)
	if err != nil {
		f.t.Fatal(err)
	}
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return st.CachedInfo().Config.Metadata
}

// consumerNames lists the consumers of a stream, none when it is absent.
func (f *fleet) consumerNames(stream string) []string {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(f.nc)
	if err != nil {
		f.t.Fatal(err)
	}
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	names := st.ConsumerNames(ctx)
	for n := range names.Name() {
		out = append(out, n)
	}
	if err := names.Err(); err != nil {
		f.t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// second is another ShardTopology in the fleet's namespace, on the same
// NATS account, registry and Secrets, with its own StatefulSet.
func (f *fleet) second(name string) *topologyv1.ShardTopology {
	f.t.Helper()
	createStatefulSet(f.t, f.ns, name)
	t := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns}, Spec: *f.topo.Spec.DeepCopy()}
	t.Spec.Workload.StatefulSetName = name
	return t
}

func getTopology(t *testing.T, key client.ObjectKey) *topologyv1.ShardTopology {
	t.Helper()
	got := &topologyv1.ShardTopology{}
	if err := k.Get(context.Background(), key, got); err != nil {
		t.Fatal(err)
	}
	return got
}

// Two topologies that set no subject prefix, "ingest" and "orders" in one
// namespace on one NATS account, each get streams of their own, marked
// with their owner. Before, both defaulted to "shardkeeper" and shared
// SHARDKEEPER_INGEST_0 and its consumers.
// checks P1
func TestTopologiesWithoutAPrefixGetStreamsOfTheirOwn(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.topo.Spec.NATS.SubjectPrefix = ""
	f.withStatefulSet(0, "w")
	orders := f.second("orders")
	startOperator(t, f.ns)
	f.create()
	if err := k.Create(context.Background(), orders); err != nil {
		t.Fatal(err)
	}
	for _, topo := range []*topologyv1.ShardTopology{f.topo, orders} {
		prefix := f.ns + "_" + topo.Name
		stream := strings.ToUpper(prefix) + "_INGEST_0"
		eventually(t, 60*time.Second, func() error {
			got := getTopology(t, client.ObjectKeyFromObject(topo))
			if got.Status.SubjectPrefix != prefix {
				return fmt.Errorf("%s: status.subjectPrefix %q, want %q", topo.Name, got.Status.SubjectPrefix, prefix)
			}
			if got.Spec.NATS.SubjectPrefix != "" {
				return fmt.Errorf("%s: spec.nats.subjectPrefix %q was written; the default lives in status only", topo.Name, got.Spec.NATS.SubjectPrefix)
			}
			if names := f.consumerNames(stream); !slices.Equal(names, []string{"ingest_0_0", "ingest_0_1"}) {
				return fmt.Errorf("%s: consumers of %s are %v", topo.Name, stream, names)
			}
			if m := f.streamMeta(stream); m[natsops.OwnerKey] != f.ns+"/"+topo.Name || m[natsops.OwnerUIDKey] != string(got.UID) {
				return fmt.Errorf("%s: stream %s metadata %v, want its owner", topo.Name, stream, m)
			}
			return nil
		})
	}
	if m := f.streamMeta("SHARDKEEPER_INGEST_0"); m != nil {
		t.Fatalf("stream SHARDKEEPER_INGEST_0 exists: the old shared default is still used")
	}
}

// A second topology given the same prefix as a Ready one is refused,
// naming the owner, and deleting it leaves the first topology's consumers
// and Ready alone. Before, it reported SpecValid and its deletion removed
// the first topology's consumers.
// checks P1, P3
func TestASecondTopologyOnAnotherTopologysStreamsIsRefusedAndItsDeletionLeavesThemAlone(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)

	orders := f.second("orders") // same prefix "shardkeeper", same consumer name
	if err := k.Create(context.Background(), orders); err != nil {
		t.Fatal(err)
	}
	var st *topologyv1.ShardTopology
	eventually(t, 60*time.Second, func() error {
		st = getTopology(t, client.ObjectKeyFromObject(orders))
		c := meta.FindStatusCondition(st.Status.Conditions, topologyv1.ConditionStalled)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != topologyv1.ReasonNATSObjectsOwnedElsewhere {
			return fmt.Errorf("orders: %s", conditionsString(st))
		}
		return nil
	})
	ready := wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonNATSObjectsOwnedElsewhere)
	if !strings.Contains(ready.Message, "owned by topology "+f.key()) || !strings.Contains(ready.Message, "SHARDKEEPER_INGEST_0") {
		t.Fatalf("Ready message %q does not name the stream and its owner %s", ready.Message, f.key())
	}

	if err := k.Delete(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		err := k.Get(context.Background(), client.ObjectKeyFromObject(orders), &topologyv1.ShardTopology{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("orders still there (%v)", err)
		}
		return nil
	})
	if got := f.consumers(1); !slices.Equal(got, []string{"ingest_0_0", "ingest_0_1"}) {
		t.Fatalf("consumers of the first topology after the second's deletion: %v", got)
	}
	f.waitReady(30 * time.Second)
}

// The envelope reaches the API server before Provision creates anything
// beyond it. The fault: every status write fails during the reconcile that
// starts N 1 -> 2. Before, Provision created SHARDKEEPER_INGEST_1 and its
// consumer anyway and the envelope, kept in memory only, was lost with
// the failed final patch; no later reconcile knew of them.
// checks P3
func TestTheEnvelopeIsRecordedBeforeProvisioningBeyondIt(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 1})
	f.withStatefulSet(0, "w")
	op := startOperator(t, f.ns)
	f.create()
	f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.ActiveEpoch == nil || o.Status.Provisioned == nil {
			return errors.New("no active epoch yet")
		}
		return nil
	})
	op.stop()
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 2 })

	var failed int
	direct, err := client.NewWithWatch(cfg, client.Options{Scheme: k.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	broken := interceptor.NewClient(direct, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			failed++
			return errors.New("injected: the API server refuses status writes")
		},
	})
	r := &controllers.ShardTopologyReconciler{Client: broken, APIReader: k, Recorder: events.NewFakeRecorder(100)}
	_, err = r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(f.topo)})
	if err == nil || failed == 0 {
		t.Fatalf("reconcile: %v after %d refused status writes; the fault did not take effect", err, failed)
	}
	stored := f.get().Status.Provisioned
	if names := f.consumerNames("SHARDKEEPER_INGEST_1"); len(names) > 0 && (stored == nil || stored.Partitions < 2) {
		t.Fatalf("consumers %v of partition 1 exist while the stored envelope is %+v: nothing would ever retire them", names, stored)
	}
}

// Consumers no record names (a change to N=2 abandoned mid-reconcile, its
// envelope lost) are found in NATS: the operator retires them once drained,
// and the finalizer deletes them with the topology. Before, the orphan
// scan looked only at the streams below N and the finalizer only at the
// envelope, so ingest_1_* stayed forever.
// checks P3
func TestConsumersOfAnAbandonedPartitionAreFoundAndRetired(t *testing.T) {
	for _, tc := range []struct {
		name   string
		delete bool
	}{
		{name: "the running topology retires them"},
		{name: "the finalizer deletes them", delete: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, fleetInput{partitions: 1, shards: 2})
			f.withStatefulSet(0, "w")
			op := startOperator(t, f.ns)
			f.create()
			w := startSimWorker(t, f.reg, f.key(), "a", false)
			f.waitReady(60 * time.Second)
			op.stop()

			// What an abandoned N=2 left behind: partition 1's stream and
			// consumers, marked as this topology's, in no record.
			topo := f.get()
			l := natsops.Layout{SubjectPrefix: "shardkeeper", ConsumerName: "ingest", Partitions: 2, Shards: 2, Replicas: 1,
				PinnedTTL: time.Minute, AckWait: 30 * time.Second, Owner: natsops.Owner{Name: f.key(), UID: string(topo.UID)}}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := natsops.Provision(ctx, f.nc, l); err != nil {
				t.Fatal(err)
			}
			if names := f.consumerNames("SHARDKEEPER_INGEST_1"); len(names) != 2 || topo.Status.Provisioned.Partitions != 1 {
				t.Fatalf("setup: consumers %v, envelope %+v", names, topo.Status.Provisioned)
			}

			startOperator(t, f.ns)
			if tc.delete {
				w.stop()
				if err := k.Delete(context.Background(), topo); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, 60*time.Second, func() error {
				if names := f.consumerNames("SHARDKEEPER_INGEST_1"); len(names) > 0 {
					return fmt.Errorf("consumers %v of the abandoned partition remain", names)
				}
				return nil
			})
			if f.streamMeta("SHARDKEEPER_INGEST_1") == nil {
				t.Fatalf("stream SHARDKEEPER_INGEST_1 was deleted: streams hold rows and are never deleted")
			}
			if !tc.delete {
				f.waitReady(30 * time.Second)
			}
		})
	}
}

// A stream whose limits can drop rows nobody consumed, and a unit consumer
// that acknowledges on delivery, stop Ready with a Stalled condition
// naming the field and what is allowed; fixing them brings Ready back.
// Before, the stream produced no finding at all and the consumer only a
// Warning Event, with Ready True.
// checks P3, P7
func TestUnsafeStreamsAndConsumersStopReady(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	op := startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)
	js, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, tc := range []struct {
		name   string
		field  string
		tamper func() error
		fix    func() error
	}{
		{
			name: "a stream with max_age", field: "max_age",
			tamper: func() error {
				return updateStream(ctx, js, "SHARDKEEPER_INGEST_0", func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour })
			},
			fix: func() error {
				return updateStream(ctx, js, "SHARDKEEPER_INGEST_0", func(c *jetstream.StreamConfig) { c.MaxAge = 0 })
			},
		},
		{
			name: "a consumer that acks on delivery", field: "ack_policy",
			tamper: func() error {
				if err := js.DeleteConsumer(ctx, "SHARDKEEPER_INGEST_0", "ingest_0_1"); err != nil {
					return err
				}
				_, err := js.CreateConsumer(ctx, "SHARDKEEPER_INGEST_0", jetstream.ConsumerConfig{Durable: "ingest_0_1",
					FilterSubject: "shardkeeper.ingest.0.1.>", AckPolicy: jetstream.AckNonePolicy})
				return err
			},
			// The operator creates it again, right, once it is gone.
			fix: func() error { return js.DeleteConsumer(ctx, "SHARDKEEPER_INGEST_0", "ingest_0_1") },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.tamper(); err != nil {
				t.Fatalf("tamper: %v", err)
			}
			// Provision runs after every operator start.
			op.stop()
			op = startOperator(t, f.ns)
			st := f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
				c := meta.FindStatusCondition(o.Status.Conditions, topologyv1.ConditionStalled)
				if c == nil || c.Status != metav1.ConditionTrue || c.Reason != topologyv1.ReasonUnsafeNATSConfig {
					return errors.New("not Stalled with UnsafeNATSConfig")
				}
				return nil
			})
			ready := wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonUnsafeNATSConfig)
			if !strings.Contains(ready.Message, tc.field) || !strings.Contains(ready.Message, "allowed: ") {
				t.Fatalf("Ready message %q does not name %s and what is allowed", ready.Message, tc.field)
			}
			if err := tc.fix(); err != nil {
				t.Fatalf("fix: %v", err)
			}
			f.waitReady(90 * time.Second)
		})
	}
}

func updateStream(ctx context.Context, js jetstream.JetStream, name string, mutate func(*jetstream.StreamConfig)) error {
	st, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	mutate(&cfg)
	_, err = js.UpdateStream(ctx, cfg)
	return err
}

// Rows no unit consumer will deliver show in status, in the metric and in
// a Warning Event. Before, a row sent to <prefix>.ingest.<p>.<s> was
// stored, never delivered, and shown nowhere.
// checks P3, P7
func TestStrandedRowsShowInStatusAndMetric(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	op := startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)
	js, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 3 {
		if _, err := js.Publish(ctx, "shardkeeper.ingest.0.1", []byte("no token after the shard")); err != nil {
			t.Fatal(err)
		}
	}
	// The count runs with the drift check: after every operator start.
	op.stop()
	startOperator(t, f.ns)
	st := f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		if sr := o.Status.StrandedRows; sr == nil || sr.Rows != 3 {
			return fmt.Errorf("status.strandedRows %+v, want 3 rows", sr)
		}
		return nil
	})
	if w := st.Status.StrandedRows.Where; len(w) != 1 || !strings.Contains(w[0], "subject shardkeeper.ingest.0.1") {
		t.Fatalf("status.strandedRows.where %v does not name the subject", w)
	}
	// The metric follows the status written, after the patch returns (and
	// its Events are sent): polled, not read once the status shows.
	eventually(t, 30*time.Second, func() error {
		if v, ok := metricValue(t, "shardkeeper_topology_stranded_rows", map[string]string{"namespace": f.ns, "name": "ingest"}); !ok || v != 3 {
			return fmt.Errorf("shardkeeper_topology_stranded_rows = %v (present %t), want 3", v, ok)
		}
		return nil
	})
	waitEvent(t, f.ns, "RowsStranded", "3 rows")
}

// The units a change removed are retired only once every publisher
// acknowledged the active epoch when a publisher still on the old epoch
// may send rows to them: under Publisher assignment any such unit, under
// SubjectTransform the units of partitions a change of N removed (the
// publisher picks the partition, the stream's transform the shard).
// Before, Retire deleted the drained consumers at once, and the old
// epoch's publishers stranded their rows.
// checks P3
func TestRetireWaitsForPublishersToAcknowledgeTheActiveEpoch(t *testing.T) {
	tests := []struct {
		name           string
		in             fleetInput
		change         func(*topologyv1.ShardTopology)
		stream, leaves string
		kept           []string
	}{
		{"Publisher assignment, V 2 -> 1", fleetInput{partitions: 1, shards: 2},
			func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 1 }, "SHARDKEEPER_INGEST_0", "ingest_0_1", []string{"ingest_0_0"}},
		{"SubjectTransform, N 2 -> 1", fleetInput{partitions: 2, shards: 1, assignment: topologyv1.ShardAssignmentSubjectTransform},
			func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 1 }, "SHARDKEEPER_INGEST_1", "ingest_1_0", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := startFleet(t, tt.in, nil)
			js, err := jetstream.New(f.nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := publish.Acknowledge(ctx, js, "shardkeeper", "orders-api", 1); err != nil {
				t.Fatal(err)
			}

			f.update(tt.change)
			f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
				if r := o.Status.Rollout; r == nil || r.Step != topologyv1.StepRetire || !strings.Contains(r.Message, "still on an older epoch: orders-api (epoch 1)") {
					return errors.New("not waiting at Retire for publisher orders-api")
				}
				return nil
			})
			consistently(t, 3*time.Second, func() error {
				if names := f.consumerNames(tt.stream); !slices.Contains(names, tt.leaves) {
					return fmt.Errorf("the leaving unit's consumer was retired while publisher orders-api publishes to epoch 1: %v", names)
				}
				return nil
			})

			if err := publish.Acknowledge(ctx, js, "shardkeeper", "orders-api", 2); err != nil {
				t.Fatal(err)
			}
			f.waitReady(60 * time.Second)
			if names := f.consumerNames(tt.stream); !slices.Equal(names, tt.kept) {
				t.Fatalf("consumers of %s %v after the publisher moved, want %v", tt.stream, names, tt.kept)
			}
		})
	}
}
