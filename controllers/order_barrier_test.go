package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/api/meta"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/publish"
)

// startPerKeyFleet is startFleet for a topology of partitions x shards
// under SubjectTransform with ordering PerKey (tweaked by tweak, when
// given).
func startPerKeyFleet(t *testing.T, partitions, shards int32, tweak func(*topologyv1.ShardTopology)) *fleet {
	t.Helper()
	return startFleet(t, fleetInput{partitions: partitions, shards: shards, assignment: topologyv1.ShardAssignmentSubjectTransform},
		func(o *topologyv1.ShardTopology) {
			o.Spec.Rollout.Ordering = topologyv1.OrderingPerKey
			if tweak != nil {
				tweak(o)
			}
		})
}

// A change of V under spec.rollout.ordering PerKey (issue 24): the
// operator writes the barrier before activating, records the stream's
// switch once the transform moved, shows the new units waiting for their
// old ones, lifts each old unit once it drained to the switch (and not
// before), holds the next change until every old unit is lifted, and then
// rolls that one (16 -> 12: old shards feed new ones by residue mod 4, not
// by halves) under a barrier of its own.
func TestPerKeyChangeOfVLiftsEachOldUnitOnceDrainedToTheSwitch(t *testing.T) {
	f := startPerKeyFleet(t, 1, 8, nil)

	// A backlog in every old unit (nobody pulls: the sim worker claims
	// but does not deliver).
	const rows = 200
	f.publishKeys(0, rows)
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 16 })
	st := f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		b := o.Status.OrderBarrier
		if b == nil || b.Switched != 1 || b.CheckedAt == nil {
			return fmt.Errorf("order barrier %+v, want one partition switched and checked", b)
		}
		return nil
	})
	b := st.Status.OrderBarrier
	if b.Epoch != 2 || b.FromShards != 8 || b.ToShards != 16 || b.Predecessors != 8 || b.Lifted != 0 || b.UnitsWaiting != 8 {
		t.Fatalf("order barrier %+v: want epoch 2, 8 -> 16, 8 old units none lifted, 8 new units waiting", b)
	}
	if a := st.Status.ActiveEpoch; a == nil || a.Number != 2 {
		t.Fatalf("active epoch %+v, want 2", a)
	}
	// 8 -> 16 moves keys from s to s+8 only.
	for _, w := range b.Waiting {
		var p, s int
		if _, err := fmt.Sscanf(w.Unit, "%d.%d", &p, &s); err != nil {
			t.Fatal(err)
		}
		if want := []string{fmt.Sprintf("0.%d", s-8)}; s < 8 || !slices.Equal(w.For, want) {
			t.Fatalf("unit %s waits for %v, want %v", w.Unit, w.For, want)
		}
	}
	reg, err := f.reg.OrderBarrier(context.Background(), f.key())
	if err != nil {
		t.Fatal(err)
	}
	if p0, _ := reg.Partition(0); !p0.Switched || p0.SwitchSeq != rows || p0.BeforeSeq != rows {
		t.Fatalf("partition 0 %+v: want the switch at %d, the last row before it (nothing was published meanwhile)", p0, rows)
	}
	if c := meta.FindStatusCondition(st.Status.Conditions, topologyv1.ConditionReady); c == nil || c.Status == "True" {
		t.Fatalf("Ready %+v while every old unit holds rows: want False", c)
	}

	// The next change waits for the barrier.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 12 })
	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if r := o.Status.Rollout; r == nil || !strings.Contains(r.Message, "waits for the order barrier of epoch 2") {
			return fmt.Errorf("rollout %+v, want the change to 12 waiting for the barrier", r)
		}
		return nil
	})
	if p := f.snapshot().Pending; p != nil {
		t.Fatalf("epoch %d pending while the barrier is up", p.Number)
	}

	// Drain old units 0..3: exactly they are lifted.
	for s := range 4 {
		f.drain(0, s)
	}
	st = f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if b := o.Status.OrderBarrier; b == nil || b.Lifted != 4 {
			return fmt.Errorf("order barrier %+v, want 4 old units lifted", b)
		}
		return nil
	})
	reg, err = f.reg.OrderBarrier(context.Background(), f.key())
	if err != nil {
		t.Fatal(err)
	}
	p0, _ := reg.Partition(0)
	if w := p0.Waiting(); !slices.Equal(w, []int{4, 5, 6, 7}) {
		t.Fatalf("old units waiting %v after 0..3 drained, want 4..7", w)
	}
	for _, d := range st.Status.OrderBarrier.Draining {
		if d.Pending == 0 || d.SwitchSeq == nil || *d.SwitchSeq != rows {
			t.Fatalf("draining %+v: want rows pending below the switch %d", d, rows)
		}
	}

	// Drain the rest: the barrier lifts, and the change to 12 starts
	// with a barrier of its own.
	for s := 4; s < 8; s++ {
		f.drain(0, s)
	}
	waitEvent(t, f.ns, "OrderBarrierLifted", "epoch 2")
	st = f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		b := o.Status.OrderBarrier
		if b == nil || b.Epoch < 3 {
			return fmt.Errorf("order barrier %+v, want epoch 3's", b)
		}
		return nil
	})
	b = st.Status.OrderBarrier
	pairs, err := ownership.BarrierPairs(16, 12)
	if err != nil {
		t.Fatal(err)
	}
	if b.FromShards != 16 || b.ToShards != 12 || b.Predecessors != 16 || b.UnitsWaiting > 12 {
		t.Fatalf("order barrier %+v: want 16 -> 12 with all 16 old units as predecessors (%d pairs)", b, len(pairs))
	}
	// Nothing is pending in any unit now, so every old unit is lifted
	// at once, and the topology goes Ready.
	st = f.waitReady(60 * time.Second)
	if b := st.Status.OrderBarrier; b == nil || b.Lifted != b.Predecessors || b.UnitsWaiting != 0 {
		t.Fatalf("Ready with order barrier %+v: want every old unit lifted", b)
	}
	if st.Status.ActiveEpoch.ShardsPerPartition != 12 {
		t.Fatalf("active %+v, want 12 shards", st.Status.ActiveEpoch)
	}
}

// A change of N under spec.rollout.ordering PerKey (issue 24): the
// operator writes the barrier with the pending epoch (every old partition
// whose keys move, every shard of each), records no switch while a
// publisher still names the old epoch (status names it), then records
// each old partition's last row once it names the new one, and lifts an
// old unit once its ack floor passed the switch, or once its holder's
// drained-to mark did (rows still pending: the floor alone would not).
// An old unit whose unacknowledged rows reach max_ack_pending (as held
// rows of keys moving in can make them) is named in status.
func TestPerKeyChangeOfNRecordsTheSwitchOncePublishersMovedAndLiftsByFloorOrMark(t *testing.T) {
	ctx := context.Background()
	const ackLimit = 100
	f := startPerKeyFleet(t, 2, 2, func(o *topologyv1.ShardTopology) { o.Spec.NATS.MaxAckPending = ackLimit })

	js, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	acknowledge := func(epoch int64) {
		t.Helper()
		if err := publish.Acknowledge(ctx, js, "shardkeeper", "pub", epoch); err != nil {
			t.Fatal(err)
		}
	}
	acknowledge(1)
	// A backlog in every old unit, routed as a publisher on N 2 routes.
	l := natsops.Layout{SubjectPrefix: "shardkeeper"}
	for i := range 800 {
		key := fmt.Sprintf("key%d", i)
		if _, err := js.Publish(ctx, l.RowSubject(ownership.KeyPartition(key, 2), key), []byte("row")); err != nil {
			t.Fatal(err)
		}
	}
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 3 })
	st := f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		if b := o.Status.OrderBarrier; b == nil || len(b.PublishersBehind) == 0 || b.CheckedAt == nil {
			return fmt.Errorf("order barrier %+v, want publishers behind, checked", b)
		}
		return nil
	})
	b := st.Status.OrderBarrier
	// gcd(2, 3) = 1: both old partitions feed the others, every new unit
	// has a predecessor.
	if b.Epoch != 2 || b.FromPartitions != 2 || b.ToPartitions != 3 || b.FromShards != 2 || b.ToShards != 2 ||
		b.Partitions != 2 || b.Switched != 0 || b.Predecessors != 4 || b.Lifted != 0 || b.UnitsWaiting != 6 {
		t.Fatalf("order barrier %+v: want epoch 2, N 2 -> 3 at V 2, 2 old partitions unswitched, 4 old units, 6 new units waiting", b)
	}
	if !slices.Equal(b.PublishersBehind, []string{"pub (epoch 1)"}) {
		t.Fatalf("publishers behind %v, want pub at epoch 1", b.PublishersBehind)
	}
	for _, w := range b.Waiting {
		if w.Unit == "2.1" && !slices.Equal(w.For, []string{"0.1", "1.1"}) {
			t.Fatalf("new unit 2.1 waits for %v, want 0.1 and 1.1 (the shard stays)", w.For)
		}
	}
	if c := meta.FindStatusCondition(st.Status.Conditions, topologyv1.ConditionReady); c == nil || !strings.Contains(c.Message, "publishers still on an older epoch: pub (epoch 1)") {
		t.Fatalf("Ready %+v: want its message to name the publisher the switches wait for", c)
	}

	acknowledge(2)
	f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		if b := o.Status.OrderBarrier; b == nil || b.Switched != 2 || len(b.PublishersBehind) != 0 {
			return fmt.Errorf("order barrier %+v, want both switches recorded, nobody behind", b)
		}
		return nil
	})
	reg, err := f.reg.OrderBarrier(ctx, f.key())
	if err != nil {
		t.Fatal(err)
	}
	for _, pb := range reg.Partitions {
		// Nothing was published since the backlog: the switch is the
		// stream's last row, the one read before the pending epoch.
		if rows := f.streamRows(pb.Partition); pb.SwitchSeq != rows || pb.BeforeSeq != rows {
			t.Fatalf("partition %d %+v: want the switch and the sequence before both at its last row %d", pb.Partition, pb, rows)
		}
	}

	// By the ack floor: 0.0 drains.
	f.drain(0, 0)
	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if b := o.Status.OrderBarrier; b == nil || b.Lifted != 1 {
			return fmt.Errorf("order barrier %+v, want 0.0 lifted", b)
		}
		return nil
	})
	// By the mark: 0.1's holder records every row up to the switch as
	// settled while they are still pending.
	p0, _ := reg.Partition(0)
	claims, err := f.reg.Claims(ctx, f.key())
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(claims, func(c poolctl.ClaimInfo) bool { return c.Unit == "0.1" })
	if i < 0 || claims[i].Owner != "a" {
		t.Fatalf("claims %+v: want 0.1 held by a", claims)
	}
	tok := poolctl.Token{Topology: f.key(), Unit: "0.1", Member: "a", Epoch: claims[i].Epoch}
	if err := f.reg.MarkDrained(ctx, tok, 2, p0.SwitchSeq); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if b := o.Status.OrderBarrier; b == nil || b.Lifted != 2 {
			return fmt.Errorf("order barrier %+v, want 0.1 lifted by its mark", b)
		}
		return nil
	})
	if n := f.pending(0, 1); n == 0 {
		t.Fatal("0.1 has no rows pending: the floor alone could have lifted it")
	}

	// 1.0's consumer at its max_ack_pending: named in status.
	held := f.holdUnacknowledged(1, 0, ackLimit)
	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		b := o.Status.OrderBarrier
		if b == nil || !slices.Equal(b.AtAckLimit, []string{"1.0"}) {
			return fmt.Errorf("order barrier %+v, want 1.0 at its ack limit", b)
		}
		if c := meta.FindStatusCondition(o.Status.Conditions, topologyv1.ConditionReady); c == nil || !strings.Contains(c.Message, "maxAckPending") {
			return fmt.Errorf("Ready %+v: want its message to name the ack limit", c)
		}
		return nil
	})
	held.ackAll()
	f.drain(1, 1)
	waitEvent(t, f.ns, "OrderBarrierLifted", "change of N (2 -> 3 partitions)")
	st = f.waitReady(60 * time.Second)
	if b := st.Status.OrderBarrier; b == nil || b.Lifted != b.Predecessors || b.UnitsWaiting != 0 {
		t.Fatalf("Ready with order barrier %+v: want every old unit lifted", b)
	}
}

// Under PerKey a spec that differs from the active epoch in both N and V
// (two updates the rollout had not taken yet; one update may not change
// both) rolls out as two changes, V first, each under a barrier of its
// own, and no change goes unordered.
func TestPerKeyRollsAChangeOfNAndVAsTwoOrderedChanges(t *testing.T) {
	f := startPerKeyFleet(t, 1, 2, nil)

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Rollout.Paused = true })
	f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if c := meta.FindStatusCondition(o.Status.Conditions, topologyv1.ConditionRolloutPaused); c == nil || c.Status != "True" || o.Status.ObservedGeneration != o.Generation {
			return fmt.Errorf("want RolloutPaused=True at the current generation")
		}
		return nil
	})
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 2 })
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Rollout.Paused = false })

	waitEvent(t, f.ns, "EpochActivated", "epoch 2 (1x4) is active")
	waitEvent(t, f.ns, "OrderBarrierLifted", "epoch 2's change of V (2 -> 4 shards)")
	waitEvent(t, f.ns, "EpochActivated", "epoch 3 (2x4) is active")
	st := f.waitReady(60 * time.Second)
	if a := st.Status.ActiveEpoch; a == nil || a.Number != 3 || a.Partitions != 2 || a.ShardsPerPartition != 4 {
		t.Fatalf("active %+v, want epoch 3 at 2x4", a)
	}
	if b := st.Status.OrderBarrier; b == nil || b.Epoch != 3 || b.FromPartitions != 1 || b.ToPartitions != 2 || b.Lifted != b.Predecessors {
		t.Fatalf("order barrier %+v, want epoch 3's change of N (1 -> 2), lifted", b)
	}
	if evs := listEvents(t, f.ns, "OrderNotKept"); len(evs) > 0 {
		t.Fatalf("a change went unordered: %s", evs[0].Note)
	}
}

// heldRows are rows fetched from a unit's consumer and not acknowledged,
// with the consumer handle that pulled them (it holds the pin).
type heldRows struct {
	f    *fleet
	cons jetstream.Consumer
	msgs []jetstream.Msg
}

// holdUnacknowledged fetches n rows of unit p.s and keeps them
// unacknowledged, as a worker holding rows does.
func (f *fleet) holdUnacknowledged(p, s, n int) *heldRows {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := &heldRows{f: f, cons: f.unitConsumer(ctx, p, s)}
	for len(h.msgs) < n && ctx.Err() == nil {
		batch, err := h.cons.Fetch(n-len(h.msgs), jetstream.FetchMaxWait(time.Second), jetstream.FetchPriorityGroup(natsops.PriorityGroup))
		if err != nil {
			f.t.Fatal(err)
		}
		for m := range batch.Messages() {
			h.msgs = append(h.msgs, m)
		}
	}
	if len(h.msgs) < n {
		f.t.Fatalf("unit %d.%d gave %d rows, want %d held", p, s, len(h.msgs), n)
	}
	return h
}

// ackAll acknowledges the held rows and drains the rest of the unit with
// the same handle (another would not hold the pin).
func (h *heldRows) ackAll() {
	h.f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, m := range h.msgs {
		if err := m.DoubleAck(ctx); err != nil {
			h.f.t.Fatal(err)
		}
	}
	h.f.drainConsumer(ctx, h.cons)
}
