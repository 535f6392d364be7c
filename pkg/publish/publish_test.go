package publish_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/pkg/publish"
	"github.com/shardkeeper/shardkeeper/pkg/shard"
)

// Every row published to Subject(key) is pending in exactly the unit
// consumer Unit(key) names, under both assignments: under a subject
// transform this shows Shard is NATS's own partition() hash.
// checks P3
func TestARowPublishedToItsSubjectReachesTheUnitItsKeyNames(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		prefix     string
		assignment publish.Assignment
	}{
		{"publishers pick the shard", "bypub", publish.ByPublisher},
		{"the stream's transform picks the shard", "bytransform", publish.ByTransform},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			top := publish.Topology{Prefix: tc.prefix, Partitions: 2, Shards: 4, Assignment: tc.assignment}
			l := natsops.Layout{SubjectPrefix: tc.prefix, ConsumerName: "ingest", Partitions: 2, Shards: 4, Replicas: 1,
				PinnedTTL: time.Minute, AckWait: 30 * time.Second, Assignment: natsops.ShardAssignment(tc.assignment)}
			if _, err := natsops.Provision(ctx, nc, l); err != nil {
				t.Fatal(err)
			}
			want := map[shard.Unit]uint64{}
			for i := range 200 {
				key := fmt.Sprintf("key-%d", i)
				subj, err := top.Subject(key)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := js.Publish(ctx, subj, []byte(key)); err != nil {
					t.Fatalf("publish to %s: %v", subj, err)
				}
				want[top.Unit(key)]++
			}
			if len(want) != 8 {
				t.Fatalf("200 keys reached %d of 8 units: the partition and shard hashes are not independent", len(want))
			}
			for p := range 2 {
				for s := range 4 {
					u := shard.Unit{Partition: p, Shard: s}
					// The consumer counts what the stream stored a moment
					// after the publish's ack.
					var got uint64
					deadline := time.Now().Add(10 * time.Second)
					for {
						cons, err := js.Consumer(ctx, l.StreamName(p), l.ConsumerDurable(p, s))
						if err != nil {
							t.Fatal(err)
						}
						if got = cons.CachedInfo().NumPending; got == want[u] || time.Now().After(deadline) {
							break
						}
						time.Sleep(50 * time.Millisecond)
					}
					if got != want[u] {
						t.Errorf("unit %s has %d rows pending, want the %d whose keys name it", u, got, want[u])
					}
				}
			}
		})
	}
}

func TestSubjectNamesTheFormatAndRefusesKeysThatAreNotOneToken(t *testing.T) {
	top := publish.Topology{Prefix: "team-a_ingest", Partitions: 4, Shards: 8}
	key := "order-42"
	got, err := top.Subject(key)
	if err != nil {
		t.Fatal(err)
	}
	u := top.Unit(key)
	if want := fmt.Sprintf("team-a_ingest.ingest.%d.%d.order-42", u.Partition, u.Shard); got != want {
		t.Fatalf("subject %q, want %q", got, want)
	}
	top.Assignment = publish.ByTransform
	if got, _ := top.Subject(key); got != fmt.Sprintf("team-a_ingest.rows.%d.order-42", u.Partition) {
		t.Fatalf("transform subject %q", got)
	}
	for _, bad := range []string{"", "a.b", "a*", ">", "a b"} {
		if _, err := top.Subject(bad); !errors.Is(err, publish.ErrBadKey) {
			t.Errorf("key %q: %v, want ErrBadKey", bad, err)
		}
	}
}

func TestFromStatusFollowsTheActiveEpoch(t *testing.T) {
	o := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "ingest"}}
	if _, err := publish.FromStatus(o); !errors.Is(err, publish.ErrNoEpoch) {
		t.Fatalf("no active epoch: %v, want ErrNoEpoch", err)
	}
	o.Spec.Partitions, o.Spec.ShardsPerPartition = 8, 8 // the spec may be ahead of the epoch
	o.Status.ActiveEpoch = &topologyv1.TopologyEpoch{Number: 3, Partitions: 4, ShardsPerPartition: 2}
	top, err := publish.FromStatus(o)
	if err != nil {
		t.Fatal(err)
	}
	if top != (publish.Topology{Prefix: "team-a_ingest", Partitions: 4, Shards: 2}) {
		t.Fatalf("topology %+v, want the active epoch's 4x2 under the default prefix", top)
	}
}

// What a publisher acknowledges is what the operator reads: the bucket
// names agree, and a publisher's latest epoch wins.
func TestAcknowledgedEpochsAreWhatTheOperatorReads(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := natsops.Layout{SubjectPrefix: "team-a_ingest"}
	if got, err := natsops.PublisherEpochs(ctx, nc, l); err != nil || len(got) != 0 {
		t.Fatalf("before any acknowledgement: %v (%v), want none", got, err)
	}
	for _, a := range []struct {
		name  string
		epoch int64
	}{{"api-1", 1}, {"api-2", 1}, {"api-1", 2}} {
		if err := publish.Acknowledge(ctx, js, "team-a_ingest", a.name, a.epoch); err != nil {
			t.Fatal(err)
		}
	}
	got, err := natsops.PublisherEpochs(ctx, nc, l)
	if err != nil || len(got) != 2 || got["api-1"] != 2 || got["api-2"] != 1 {
		t.Fatalf("publisher epochs %v (%v), want api-1 at 2 and api-2 at 1", got, err)
	}
	if err := publish.Acknowledge(ctx, js, "team-a_ingest", "not.one.token", 2); err == nil {
		t.Fatal("a publisher name with dots was accepted")
	}
}
