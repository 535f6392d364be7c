package natsops

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

func TestProvisionCreatesStreamsAndUnitConsumersOnce(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(-1)
	l := testLayout(2, 3, 3)

	rep := mustProvision(t, nc, l)
	if len(rep.Created) != 2+2*3 || len(rep.Updated) != 0 || len(rep.Findings) != 0 {
		t.Fatalf("first provision: %+v, want 2 streams and 6 consumers created", rep)
	}

	js := mustJetStream(t, nc)
	ctx := testContext(t, 10*time.Second)
	for p := range 2 {
		st, err := js.Stream(ctx, l.StreamName(p))
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		if !slices.Equal(cfg.Subjects, []string{l.StreamSubject(p)}) || cfg.Replicas != 3 || cfg.SubjectTransform != nil {
			t.Fatalf("stream %s: subjects %v, replicas %d, transform %v", cfg.Name, cfg.Subjects, cfg.Replicas, cfg.SubjectTransform)
		}
		for s := range 3 {
			ci := mustConsumerInfo(t, js, l.StreamName(p), l.ConsumerDurable(p, s))
			got := ci.Config
			if got.Durable != l.ConsumerDurable(p, s) || got.FilterSubject != l.FilterSubject(p, s) ||
				got.AckPolicy != jetstream.AckExplicitPolicy || got.DeliverPolicy != jetstream.DeliverAllPolicy ||
				got.MaxDeliver != -1 || got.Replicas != 3 || got.AckWait != l.AckWait ||
				got.PriorityPolicy != jetstream.PriorityPolicyPinned || !slices.Equal(got.PriorityGroups, []string{PriorityGroup}) ||
				got.PinnedTTL != l.PinnedTTL {
				t.Fatalf("unit consumer %d.%d has %+v", p, s, got)
			}
		}
	}

	again := mustProvision(t, nc, l)
	if len(again.Created)+len(again.Updated)+len(again.Findings)+len(again.Orphans)+len(again.OrphanStreams) != 0 {
		t.Fatalf("second provision was not a no-op: %+v", again)
	}

	// With one partition fewer, the second stream is reported, and kept.
	l.Partitions = 1
	fewer := mustProvision(t, nc, l)
	if !slices.Equal(fewer.OrphanStreams, []string{l.StreamName(1)}) || len(fewer.Created) != 0 {
		t.Fatalf("provision of N=1: %+v, want stream %s reported as an orphan", fewer, l.StreamName(1))
	}
	if _, err := js.Stream(ctx, l.StreamName(1)); err != nil {
		t.Fatalf("orphan stream: %v", err)
	}
}

func TestProvisionReportsDriftAndCorrectsOnlyWhatIsSafe(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(-1)
	l := testLayout(1, 2, 1)
	mustProvision(t, nc, l)

	// Someone edits the objects by hand.
	ctx := testContext(t, 10*time.Second)
	jsa := jsAPI{nc}
	st, err := jsa.streamInfo(ctx, l.StreamName(0))
	if err != nil {
		t.Fatal(err)
	}
	scfg := st.Config
	scfg.Replicas = 3
	if err := jsa.updateStream(ctx, scfg); err != nil {
		t.Fatalf("tamper with stream: %v", err)
	}
	cons, err := jsa.consumerInfo(ctx, l.StreamName(0), l.ConsumerDurable(0, 1))
	if err != nil {
		t.Fatal(err)
	}
	ccfg := cons.Config
	ccfg.AckWait = 5 * time.Second
	ccfg.PinnedTTL = time.Hour
	ccfg.MaxAckPending = 1000 // NATS's default: what consumers provisioned before the layout set it have
	if err := jsa.updateConsumer(ctx, l.StreamName(0), ccfg); err != nil {
		t.Fatalf("tamper with consumer: %v", err)
	}
	cons0, err := jsa.consumerInfo(ctx, l.StreamName(0), l.ConsumerDurable(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	ccfg0 := cons0.Config
	ccfg0.FilterSubject = l.FilterSubject(0, 7)
	ccfg0.AckWait = 5 * time.Second
	if err := jsa.updateConsumer(ctx, l.StreamName(0), ccfg0); err != nil {
		t.Fatalf("tamper with consumer: %v", err)
	}

	// The foreign filter is refused (it would deliver another unit's rows
	// under this unit's claim); everything else is still provisioned.
	rep, err := Provision(testContext(t, 20*time.Second), nc, l)
	var unsafe *UnsafeConfigError
	if !errors.As(err, &unsafe) || len(unsafe.Findings) != 1 || unsafe.Findings[0].Field != "filter_subject" {
		t.Fatalf("provision over a foreign filter: %v, want an *UnsafeConfigError naming filter_subject", err)
	}
	consumer := consumerObject(l.StreamName(0), l.ConsumerDurable(0, 1))
	refused := consumerObject(l.StreamName(0), l.ConsumerDurable(0, 0))
	want := []Finding{
		// A refused consumer is left exactly as it is.
		{Object: refused, Field: "ack_wait", Want: "30s", Got: "5s"},
		{Object: refused, Field: "filter_subject", Want: l.FilterSubject(0, 0) + " only: another filter delivers rows of other units under this unit's claim",
			Got: l.FilterSubject(0, 7), Unsafe: true},
		{Object: consumer, Field: "ack_wait", Want: "30s", Got: "5s", Updated: true},
		{Object: consumer, Field: "max_ack_pending", Want: fmt.Sprint(DefaultMaxAckPending), Got: "1000", Updated: true},
		{Object: consumer, Field: "priority_timeout", Want: "2m0s", Got: "1h0m0s", Updated: true},
		{Object: streamObject(l.StreamName(0)), Field: "num_replicas", Want: "1", Got: "3", Updated: true},
	}
	got := slices.Clone(rep.Findings)
	slices.SortFunc(got, func(a, b Finding) int {
		if a.Object != b.Object {
			return cmpString(a.Object, b.Object)
		}
		return cmpString(a.Field, b.Field)
	})
	if !slices.Equal(got, want) {
		t.Fatalf("findings:\n got  %v\n want %v", got, want)
	}
	for _, f := range got {
		t.Log(f)
	}

	js := mustJetStream(t, nc)
	ci := mustConsumerInfo(t, js, l.StreamName(0), l.ConsumerDurable(0, 1))
	if ci.Config.AckWait != l.AckWait || ci.Config.PinnedTTL != l.PinnedTTL || ci.Config.MaxAckPending != DefaultMaxAckPending {
		t.Fatalf("safe drift not corrected: ack_wait %s, priority_timeout %s, max_ack_pending %d", ci.Config.AckWait, ci.Config.PinnedTTL, ci.Config.MaxAckPending)
	}
	if ci := mustConsumerInfo(t, js, l.StreamName(0), l.ConsumerDurable(0, 0)); ci.Config.FilterSubject != l.FilterSubject(0, 7) {
		t.Fatalf("filter changed to %s: a unit's rows must never be re-pointed silently", ci.Config.FilterSubject)
	}
	stream, err := js.Stream(testContext(t, 10*time.Second), l.StreamName(0))
	if err != nil {
		t.Fatal(err)
	}
	if r := stream.CachedInfo().Config.Replicas; r != 1 {
		t.Fatalf("stream replicas %d after provision, want 1", r)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checks P3
func TestRetireDeletesOnlyDrainedConsumers(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(-1)
	wide := testLayout(1, 3, 3)
	mustProvision(t, nc, wide)
	js := mustJetStream(t, nc)

	// Units 0.1 and 0.2 leave the topology. 0.1 has a row never delivered,
	// 0.2 a row delivered and not acknowledged.
	publishShard(t, js, wide, 0, 1, 1)
	publishShard(t, js, wide, 0, 2, 1)
	held := fetchNoAck(t, js, wide, 0, 2, 1)

	narrow := wide
	narrow.Shards = 1
	rep := mustProvision(t, nc, narrow)
	if !slices.Equal(rep.Orphans, []Unit{{0, 1}, {0, 2}}) {
		t.Fatalf("orphans %v, want units 0.1 and 0.2", rep.Orphans)
	}

	ctx := testContext(t, 20*time.Second)
	retired, holding, err := RetireConsumers(ctx, nc, wide, rep.Orphans)
	if err != nil {
		t.Fatal(err)
	}
	if len(retired) != 0 {
		t.Fatalf("retired %v while they held rows", retired)
	}
	wantHolding := []Holding{{Unit: Unit{0, 1}, Pending: 1}, {Unit: Unit{0, 2}, AckPending: 1}}
	if !slices.Equal(holding, wantHolding) {
		t.Fatalf("holding %+v, want %+v", holding, wantHolding)
	}
	for _, u := range rep.Orphans {
		mustConsumerInfo(t, js, wide.StreamName(0), wide.ConsumerDurable(u.Partition, u.Shard))
	}

	// The owners work their rows off.
	for _, m := range append(held, fetchNoAck(t, js, wide, 0, 1, 1)...) {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	retired, holding, err = RetireConsumers(ctx, nc, wide, rep.Orphans)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(retired, rep.Orphans) || len(holding) != 0 {
		t.Fatalf("retired %v, holding %v after draining; want both retired", retired, holding)
	}
	for _, u := range rep.Orphans {
		if _, err := js.Consumer(ctx, wide.StreamName(0), wide.ConsumerDurable(u.Partition, u.Shard)); err == nil {
			t.Fatalf("consumer of unit %s still exists", u)
		}
	}
	// Retiring again is a no-op, and the remaining unit is untouched.
	if retired, _, err := RetireConsumers(ctx, nc, wide, rep.Orphans); err != nil || len(retired) != 2 {
		t.Fatalf("second retire: %v, %v", retired, err)
	}
	mustConsumerInfo(t, js, wide.StreamName(0), wide.ConsumerDurable(0, 0))
	if again := mustProvision(t, nc, narrow); len(again.Orphans)+len(again.Created) != 0 {
		t.Fatalf("provision after retire: %+v", again)
	}
}

// Found by the chaos suite (scenario 1: V 8 -> 4 -> 8): a unit that
// leaves and later comes back must not replay to its new owner the rows
// its retired consumer delivered and had acknowledged; rows published to
// it after the retirement must still be delivered.
//
// checks P3 (and that duplicates stay explained)
func TestARetiredUnitThatComesBackResumesWhereItStopped(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(-1)
	wide := testLayout(1, 2, 1)
	mustProvision(t, nc, wide)
	js := mustJetStream(t, nc)
	ctx := testContext(t, 30*time.Second)

	publishShard(t, js, wide, 0, 1, 3)
	for _, m := range fetchNoAck(t, js, wide, 0, 1, 3) {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	narrow := wide
	narrow.Shards = 1
	rep := mustProvision(t, nc, narrow)
	if retired, _, err := RetireConsumers(ctx, nc, wide, rep.Orphans); err != nil || len(retired) != 1 {
		t.Fatalf("retire unit 0.1: %v, %v", retired, err)
	}
	// A row for the unit while it has no consumer, then the unit comes
	// back.
	publishShard(t, js, wide, 0, 1, 1)
	mustProvision(t, nc, wide)
	info := mustConsumerInfo(t, js, wide.StreamName(0), wide.ConsumerDurable(0, 1))
	if info.NumPending != 1 {
		t.Fatalf("the unit's new consumer has %d rows pending, want 1: the 3 its retired consumer acknowledged came back", info.NumPending)
	}
	if again := mustProvision(t, nc, wide); len(again.Findings) != 0 {
		t.Fatalf("provision after the unit came back finds drift: %v", again.Findings)
	}
}

func TestTransformRoutesRowsToShardsWithPartition(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	l := testLayout(1, 4, 1)
	l.Assignment = AssignByTransform
	mustProvision(t, nc, l)
	js := mustJetStream(t, nc)
	ctx := testContext(t, 20*time.Second)

	keys := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"}
	for _, k := range keys {
		if _, err := js.Publish(ctx, l.RowSubject(0, k), []byte(k)); err != nil {
			t.Fatalf("publish key %s: %v", k, err)
		}
	}
	// Every row lands in exactly one unit, under its key, and the same key
	// always in the same unit.
	eventually(t, 10*time.Second, "every row counted by a unit consumer", func() bool {
		n := uint64(0)
		for s := range 4 {
			n += mustConsumerInfo(t, js, l.StreamName(0), l.ConsumerDurable(0, s)).NumPending
		}
		return n == uint64(len(keys))
	})
	seen := map[string]int{}
	total := 0
	for s := range 4 {
		ci := mustConsumerInfo(t, js, l.StreamName(0), l.ConsumerDurable(0, s))
		n := int(ci.NumPending)
		total += n
		if n == 0 {
			continue
		}
		for _, m := range fetchNoAck(t, js, l, 0, s, n) {
			want := l.ShardSubject(0, s, string(m.Data()))
			if m.Subject() != want {
				t.Fatalf("row %s stored as %s, want %s", m.Data(), m.Subject(), want)
			}
			seen[string(m.Data())] = s
		}
	}
	if total != len(keys) || len(seen) != len(keys) {
		t.Fatalf("%d rows reached unit consumers (%d keys), want %d", total, len(seen), len(keys))
	}
	shards := map[int]bool{}
	for _, s := range seen {
		shards[s] = true
	}
	if len(shards) < 2 {
		t.Fatalf("all keys hashed to one shard: %v", seen)
	}
	// A row that does not fit the one-token key shape is refused, not
	// stored where no unit reads it.
	if _, err := js.Publish(ctx, l.RowSubject(0, "a.b"), nil, jetstream.WithRetryAttempts(0)); err == nil {
		t.Fatal("a two-token key was accepted")
	}

	// Doubling V re-points the transform, which this package owns.
	l.Shards = 8
	rep := mustProvision(t, nc, l)
	if len(rep.Created) != 4 {
		t.Fatalf("created %v, want the 4 new unit consumers", rep.Created)
	}
	i := slices.IndexFunc(rep.Findings, func(f Finding) bool { return f.Field == "subject_transform" })
	if i < 0 || !rep.Findings[i].Updated {
		t.Fatalf("findings %v: want the subject transform updated", rep.Findings)
	}
	st, err := js.Stream(ctx, l.StreamName(0))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.SubjectTransform; got == nil || got.Destination != l.Transform(0).Destination {
		t.Fatalf("transform %+v, want %+v", got, l.Transform(0))
	}
}

// A new shape's consumers are provisioned while the transform keeps the
// active shape's V (TransformShards): rows go only to units someone may
// claim. Provisioning without it moves the transform.
func TestTransformShardsKeepRowsOnTheActiveShardsUntilTheTransformMoves(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	js := mustJetStream(t, nc)
	ctx := testContext(t, 20*time.Second)
	l := testLayout(1, 4, 1)
	l.Assignment = AssignByTransform
	l.TransformShards = 2
	mustProvision(t, nc, l)

	// pending reads each unit's pending count once all want rows are
	// counted (a consumer counts a stored row a moment after the ack).
	pending := func(want uint64) []uint64 {
		t.Helper()
		var out []uint64
		eventually(t, 10*time.Second, fmt.Sprintf("%d rows pending over the unit consumers", want), func() bool {
			out = make([]uint64, 4)
			total := uint64(0)
			for s := range 4 {
				out[s] = mustConsumerInfo(t, js, l.StreamName(0), l.ConsumerDurable(0, s)).NumPending
				total += out[s]
			}
			return total == want
		})
		return out
	}
	publish := func(prefix string) {
		t.Helper()
		for i := range 40 {
			if _, err := js.Publish(ctx, l.RowSubject(0, fmt.Sprintf("%s%d", prefix, i)), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("a")
	got := pending(40)
	if got[0]+got[1] != 40 || got[2] != 0 || got[3] != 0 || got[0] == 0 || got[1] == 0 {
		t.Fatalf("pending per shard %v: want all 40 rows on shards 0 and 1 while consumers 0..3 exist", got)
	}

	l.TransformShards = 0
	rep := mustProvision(t, nc, l)
	if i := slices.IndexFunc(rep.Findings, func(f Finding) bool { return f.Field == "subject_transform" }); i < 0 || !rep.Findings[i].Updated || len(rep.Created) != 0 {
		t.Fatalf("report %+v: want only the subject transform updated", rep)
	}
	publish("b")
	after := pending(80)
	if after[2] == 0 || after[3] == 0 {
		t.Fatalf("pending per shard %v after the transform moved: want the new rows over all 4 shards", after)
	}

	// A shape with fewer shards than the transform routes over (a new
	// partition while V shrinks) still gets a consumer for every routed
	// shard; those beyond the shape are orphans.
	narrow := testLayout(1, 2, 1)
	narrow.Assignment, narrow.TransformShards = AssignByTransform, 4
	rep = mustProvision(t, nc, narrow)
	if len(rep.Created) != 5 || !slices.Equal(rep.Orphans, []Unit{{0, 2}, {0, 3}}) {
		t.Fatalf("report %+v: want the stream and 4 consumers created, shards 2 and 3 reported as orphans", rep)
	}
}

func TestStreamDriftAddsSubjectsButNeverRemovesThem(t *testing.T) {
	l := testLayout(1, 1, 1)
	want := l.StreamConfig(0)
	got := want
	got.Subjects = []string{"legacy.>"}
	fs, next := streamDrift(want, got, false)
	if next == nil || !slices.Equal(next.Subjects, []string{"legacy.>", l.StreamSubject(0)}) {
		t.Fatalf("next %+v, want the layout's subject added to legacy.>", next)
	}
	if len(fs) != 1 || !fs[0].Updated {
		t.Fatalf("findings %v", fs)
	}
	got.Subjects = []string{l.StreamSubject(0), "legacy.>"}
	fs, next = streamDrift(want, got, false)
	if next != nil || len(fs) != 1 || fs[0].Updated {
		t.Fatalf("extra subject: next %+v findings %v; want reported, not removed", next, fs)
	}
	got = want
	got.Storage = api.MemoryStorage
	got.SubjectTransform = &api.SubjectTransformConfig{Source: "x.*", Destination: "y.*"}
	fs, next = streamDrift(want, got, false)
	if next != nil || len(fs) != 2 {
		t.Fatalf("storage and foreign transform: next %+v findings %v; want two reports and no update", next, fs)
	}
}

// RetireConsumers keeps to its caller's deadline when every answer is
// slow: each step gets what is left of the deadline, not the deadline as
// it stood when the call began. With every request taking about 0.8s and
// a 2s deadline, it ends within a second of the deadline; before the fix
// the first unit's steps ran to completion (about 4 requests) past it.
func TestRetireConsumersKeepsToTheDeadlineWhenAnswersAreSlow(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	l := testLayout(1, 4, 1)
	mustProvision(t, c.Connect(0), l)
	narrow := l
	narrow.Shards = 1
	rep := mustProvision(t, c.Connect(0), narrow)
	if len(rep.Orphans) != 3 {
		t.Fatalf("orphans %v, want 3", rep.Orphans)
	}
	u, err := url.Parse(c.URLs()[0])
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.New(t, u.Host)
	slow := natstest.ConnectURL(t, "nats://"+proxy.Addr(), natstest.AppUser, natstest.AppPassword)
	proxy.SetLatency(400 * time.Millisecond)
	// The fault took effect: one request takes the latency both ways.
	start := time.Now()
	if err := slow.Flush(); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 700*time.Millisecond {
		t.Fatalf("a round trip through the proxy took %s, want the added latency", rtt)
	}
	const deadline = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start = time.Now()
	retired, _, err := RetireConsumers(ctx, slow, l, rep.Orphans)
	took := time.Since(start)
	t.Logf("RetireConsumers returned after %s (deadline %s): retired %v, err %v", took.Round(time.Millisecond), deadline, retired, err)
	if took > deadline+time.Second {
		t.Fatalf("RetireConsumers took %s with a %s deadline", took.Round(time.Millisecond), deadline)
	}
	if err == nil && len(retired) == len(rep.Orphans) {
		t.Fatal("every unit retired within the deadline: the answers were not slow enough to show anything")
	}
}
