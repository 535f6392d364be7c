package natsops

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// Two topologies on one account with the same names: the first marks its
// streams and consumers; the second is refused, naming the first, before
// it writes anything, and can delete none of the first's consumers.
// checks P1, P3
func TestProvisionAndRetireRefuseObjectsAnotherTopologyOwns(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	first := testLayout(1, 2, 1)
	first.Owner = Owner{Name: "team-a/ingest", UID: "uid-a"}
	mustProvision(t, nc, first)
	js := mustJetStream(t, nc)
	for s := range 2 {
		ci := mustConsumerInfo(t, js, first.StreamName(0), first.ConsumerDurable(0, s))
		if ci.Config.Metadata[OwnerKey] != "team-a/ingest" || ci.Config.Metadata[OwnerUIDKey] != "uid-a" {
			t.Fatalf("consumer %s metadata %v, want the owner's mark", ci.Name, ci.Config.Metadata)
		}
	}

	second := first
	second.Owner = Owner{Name: "team-b/orders", UID: "uid-b"}
	second.Shards = 3
	rep, err := Provision(testContext(t, 10*time.Second), nc, second)
	var owned *OwnedElsewhereError
	if !errors.As(err, &owned) || !errors.Is(err, ErrOwnedElsewhere) || !slices.Equal(owned.Owners(), []string{"team-a/ingest"}) {
		t.Fatalf("provision by a second topology: %v, want an *OwnedElsewhereError naming team-a/ingest", err)
	}
	if !strings.Contains(err.Error(), "stream "+first.StreamName(0)+" is owned by topology team-a/ingest") {
		t.Fatalf("error %q does not name the stream and its owner", err)
	}
	if len(rep.Created)+len(rep.Updated) != 0 {
		t.Fatalf("refused provision still wrote: %+v", rep)
	}
	if ci := tryConsumerInfo(t, js, first.StreamName(0), second.ConsumerDurable(0, 2)); ci != nil {
		t.Fatalf("refused provision created consumer %s", ci.Name)
	}

	retired, holding, err := RetireConsumers(testContext(t, 10*time.Second), nc, second, []Unit{{0, 0}, {0, 1}})
	if !errors.As(err, &owned) || len(owned.Objects) != 2 || len(retired)+len(holding) != 0 {
		t.Fatalf("retire by a second topology: retired %v holding %v err %v; want both refused, naming the owner", retired, holding, err)
	}
	for s := range 2 {
		if ci := tryConsumerInfo(t, js, first.StreamName(0), first.ConsumerDurable(0, s)); ci == nil {
			t.Fatalf("consumer %s of the first topology was deleted by the second", first.ConsumerDurable(0, s))
		}
	}
	// Its owner retires them (they are drained).
	retired, _, err = RetireConsumers(testContext(t, 10*time.Second), nc, first, []Unit{{0, 0}, {0, 1}})
	if err != nil || len(retired) != 2 {
		t.Fatalf("retire by the owner: retired %v, err %v", retired, err)
	}
}

// Objects without a mark (an operator before marks existed) and objects of
// an earlier ShardTopology of the same namespace/name (deleted; its
// finalizer kept consumers with rows for it) are adopted and re-marked.
func TestProvisionAdoptsUnmarkedObjectsAndThoseOfAnEarlierObjectOfTheSameName(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	l := testLayout(1, 1, 1)
	mustProvision(t, nc, l) // no owner: no marks
	js := mustJetStream(t, nc)
	for _, tc := range []struct {
		name string
		uid  string
	}{
		{"unmarked objects are adopted", "uid-1"},
		{"a successor of the same name adopts its predecessor's", "uid-2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l.Owner = Owner{Name: "team-a/ingest", UID: tc.uid}
			rep := mustProvision(t, nc, l)
			if len(rep.Updated) != 2 {
				t.Fatalf("report %+v: want the stream and the consumer re-marked", rep)
			}
			ci := mustConsumerInfo(t, js, l.StreamName(0), l.ConsumerDurable(0, 0))
			st, err := js.Stream(testContext(t, 5*time.Second), l.StreamName(0))
			if err != nil {
				t.Fatal(err)
			}
			for what, meta := range map[string]map[string]string{"consumer": ci.Config.Metadata, "stream": st.CachedInfo().Config.Metadata} {
				if meta[OwnerKey] != "team-a/ingest" || meta[OwnerUIDKey] != tc.uid {
					t.Fatalf("%s metadata %v, want owner team-a/ingest uid %s", what, meta, tc.uid)
				}
			}
			if again := mustProvision(t, nc, l); len(again.Updated)+len(again.Findings) != 0 {
				t.Fatalf("second provision not a no-op: %+v", again)
			}
		})
	}
}

// A pre-existing stream whose limits can drop rows nobody consumed is
// refused, naming the field and what is allowed; a bounded stream that
// refuses publishes instead (discard new) is allowed.
// checks P3
func TestProvisionRefusesAStreamThatCanDropUnconsumedRows(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	for _, tc := range []struct {
		name   string
		tamper func(*api.StreamConfig)
		field  string // "" means allowed
	}{
		{"max_age expires rows", func(s *api.StreamConfig) { s.MaxAge = 2 * time.Second }, "max_age"},
		{"max_msgs with discard old drops the oldest", func(s *api.StreamConfig) { s.MaxMsgs = 3 }, "max_msgs"},
		{"max_bytes with discard old drops the oldest", func(s *api.StreamConfig) { s.MaxBytes = 1 << 20 }, "max_bytes"},
		{"max_msgs_per_subject drops a subject's oldest", func(s *api.StreamConfig) { s.MaxMsgsPer = 1 }, "max_msgs_per_subject"},
		{"interest retention drops rows without interest", func(s *api.StreamConfig) { s.Retention = api.InterestPolicy }, "retention"},
		{"rollup headers purge a subject", func(s *api.StreamConfig) { s.RollupAllowed = true }, "allow_rollup_hdrs"},
		{"max_msgs with discard new is allowed", func(s *api.StreamConfig) { s.MaxMsgs, s.Discard = 3, api.DiscardNew }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := testLayout(1, 1, 1)
			cfg := l.StreamConfig(0)
			tc.tamper(&cfg)
			mgr, err := manager(testContext(t, 5*time.Second), nc)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := mgr.NewStreamFromDefault(cfg.Name, cfg); err != nil {
				t.Fatalf("create the stream by hand: %v", err)
			}
			_, err = Provision(testContext(t, 10*time.Second), nc, l)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("provision: %v, want the bounded discard-new stream allowed", err)
				}
				return
			}
			var unsafe *UnsafeConfigError
			if !errors.As(err, &unsafe) || len(unsafe.Findings) != 1 || unsafe.Findings[0].Field != tc.field || !strings.Contains(err.Error(), "allowed: ") {
				t.Fatalf("provision: %v, want a refusal naming %s and what is allowed", err, tc.field)
			}
			t.Log(err)
		})
	}
}

// Unit consumers that deliver rows outside the claim that guards them are
// refused: ack none acknowledges rows the handler never settled, a push
// consumer delivers to whoever subscribes, a foreign filter serves another
// unit's rows.
// checks P1, P3
func TestProvisionRefusesUnsafeUnitConsumers(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	for _, tc := range []struct {
		name   string
		tamper func(l Layout, cc *api.ConsumerConfig)
		field  string
	}{
		{"ack policy none", func(_ Layout, cc *api.ConsumerConfig) { cc.AckPolicy = api.AckNone }, "ack_policy"},
		{"a push consumer", func(_ Layout, cc *api.ConsumerConfig) {
			cc.DeliverSubject = "somewhere"
			cc.PriorityPolicy, cc.PriorityGroups, cc.PinnedTTL = api.PriorityNone, nil, 0
		}, "deliver_subject"},
		{"a foreign filter", func(l Layout, cc *api.ConsumerConfig) { cc.FilterSubject = l.StreamSubject(0) }, "filter_subject"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := testLayout(1, 1, 1)
			mgr, err := manager(testContext(t, 5*time.Second), nc)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := mgr.NewStreamFromDefault(l.StreamName(0), l.StreamConfig(0)); err != nil {
				t.Fatal(err)
			}
			cc := l.ConsumerConfig(0, 0)
			tc.tamper(l, &cc)
			if _, err := mgr.NewConsumerFromDefault(l.StreamName(0), cc); err != nil {
				t.Fatalf("create the consumer by hand: %v", err)
			}
			_, err = Provision(testContext(t, 10*time.Second), nc, l)
			var unsafe *UnsafeConfigError
			if !errors.As(err, &unsafe) || !slices.ContainsFunc(unsafe.Findings, func(f Finding) bool { return f.Field == tc.field }) {
				t.Fatalf("provision: %v, want a refusal naming %s", err, tc.field)
			}
			t.Log(err)
		})
	}
}

// What a topology ever provisioned is found again from NATS alone: the
// consumers of a partition stream beyond N (a change to N=2 abandoned
// after it provisioned) are Provision's orphans and in the Inventory.
// checks P3
func TestProvisionReportsTheConsumersOfOrphanStreams(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	l := testLayout(2, 2, 1)
	l.Owner = Owner{Name: "team-a/ingest", UID: "uid-a"}
	mustProvision(t, nc, l)
	l.Partitions = 1
	rep := mustProvision(t, nc, l)
	if !slices.Equal(rep.OrphanStreams, []string{l.StreamName(1)}) || !slices.Equal(rep.Orphans, []Unit{{1, 0}, {1, 1}}) {
		t.Fatalf("report %+v: want stream %s and its two consumers as orphans", rep, l.StreamName(1))
	}
	inv, err := Inventory(testContext(t, 10*time.Second), nc, l)
	if err != nil || !slices.Equal(inv, []Unit{{0, 0}, {0, 1}, {1, 0}, {1, 1}}) {
		t.Fatalf("inventory %v (%v), want every unit consumer of both streams", inv, err)
	}
	other := l
	other.Owner = Owner{Name: "team-b/orders", UID: "uid-b"}
	if inv, err := Inventory(testContext(t, 10*time.Second), nc, other); err != nil || len(inv) != 0 {
		t.Fatalf("inventory of another owner %v (%v), want nothing", inv, err)
	}
}

// Rows no unit consumer will deliver are counted and named: a subject
// with no token after the shard, and rows of a retired unit published
// after it left. Rows the retired consumer delivered are not.
// checks P3
func TestStrandedRowsCountsRowsNoUnitConsumerDelivers(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	js := mustJetStream(t, nc)
	l := testLayout(1, 2, 1)
	l.Owner = Owner{Name: "team-a/ingest", UID: "uid-a"}
	mustProvision(t, nc, l)
	ctx := testContext(t, 30*time.Second)

	if st, err := StrandedRows(ctx, nc, l); err != nil || st.Rows != 0 {
		t.Fatalf("fresh topology: %+v (%v), want nothing stranded", st, err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, l.SubjectPrefix+".ingest.0.1", []byte("no suffix")); err != nil {
			t.Fatal(err)
		}
	}
	// Unit 0.1 delivers two rows and leaves (V 2 -> 1); publishers go on
	// sending it four.
	publishShard(t, js, l, 0, 1, 2)
	for _, m := range fetchNoAck(t, js, l, 0, 1, 2) {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if retired, holding, err := RetireConsumers(ctx, nc, l, []Unit{{0, 1}}); err != nil || len(retired) != 1 || len(holding) != 0 {
		t.Fatalf("retire unit 0.1: retired %v holding %v err %v", retired, holding, err)
	}
	publishShard(t, js, l, 0, 1, 4)

	st, err := StrandedRows(ctx, nc, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(st.Where)
	if st.Rows != 7 || len(st.Where) != 2 || !strings.Contains(st.Where[0], "unit 0.1 (retired): 4 rows") || !strings.Contains(st.Where[1], "subject "+l.SubjectPrefix+".ingest.0.1 (no token after the shard): 3 rows") {
		t.Fatalf("stranded %+v, want 4 rows of retired unit 0.1 and 3 rows without a token after the shard", st)
	}
	if names := mustConsumerNames(t, js, l.StreamName(0)); !slices.Equal(names, []string{l.ConsumerDurable(0, 0)}) {
		t.Fatalf("consumers %v after counting: the probes must go", names)
	}
}

func mustConsumerNames(t testing.TB, js jetstream.JetStream, stream string) []string {
	t.Helper()
	st, err := js.Stream(testContext(t, 5*time.Second), stream)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	lister := st.ConsumerNames(testContext(t, 5*time.Second))
	for n := range lister.Name() {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
