package poolctl

import (
	"context"
	"slices"
	"testing"
)

// barrierRegistry is a registry the operator writes the barrier to,
// under its token: PG or the twin (which the member simulator uses).
type barrierRegistry interface {
	Registry
	OrderBarriers
}

// operatorBarrier is r as the holder of a fresh operator token.
func operatorBarrier(t *testing.T, r testRegistry, topo, holder string) (barrierRegistry, OperatorToken) {
	t.Helper()
	ctx := context.Background()
	switch r := r.(type) {
	case *PG:
		tok, err := r.TakeOperatorToken(ctx, topo, holder)
		must(t, err)
		return r.AsOperator(tok), tok
	case *Twin:
		tok, err := r.TakeOperatorToken(ctx, topo, holder)
		must(t, err)
		return r.AsOperator(tok), tok
	}
	t.Fatalf("%T has no operator token", r)
	return nil, OperatorToken{}
}

// The order barrier's lifecycle, on PostgreSQL and on the twin alike:
// written with its pending epoch and seen with it, the switch recorded
// once, predecessors lifted only after it, never added to a pending epoch
// written without one, a later change's barrier replacing the earlier
// one, and every write fenced by the operator token.
func TestOrderBarrierIsWrittenSwitchedAndLifted(t *testing.T) {
	forBackends(t, orderBarrierLifecycle)
}

func orderBarrierLifecycle(t *testing.T, r testRegistry) {
	ctx := context.Background()
	topo := newTopology(t, r, testParams, 2, 8)
	op, tok := operatorBarrier(t, r, topo, "operator-0")

	if b, err := op.OrderBarrier(ctx, topo); err != nil || b != nil {
		t.Fatalf("no barrier written: got %+v, %v; want nil", b, err)
	}
	start := BarrierStart{FromShards: 8, Before: map[int]uint64{0: 100, 1: 7}, Predecessors: []int{0, 1, 2, 3, 4, 5, 6, 7}}
	e2, err := op.CreateOrderedPending(ctx, topo, 2, 16, start)
	must(t, err)
	// A repeat returns the pending epoch and changes nothing.
	again, err := op.CreateOrderedPending(ctx, topo, 2, 16, BarrierStart{FromShards: 8, Before: map[int]uint64{0: 500, 1: 500}, Predecessors: []int{1}})
	must(t, err)
	if again != e2 {
		t.Fatalf("repeat: epoch %d, want the pending %d", again, e2)
	}

	b, err := op.OrderBarrier(ctx, topo)
	must(t, err)
	if b == nil || b.Epoch != e2 || b.FromShards != 8 || b.ToShards != 16 || len(b.Partitions) != 2 {
		t.Fatalf("barrier %+v, want epoch %d, 8 -> 16, two partitions", b, e2)
	}
	p1, _ := b.Partition(1)
	if p1.BeforeSeq != 7 || p1.Switched || len(p1.Waiting()) != 8 || b.Lifted() {
		t.Fatalf("partition 1 %+v: want before 7, no switch, 8 predecessors waiting", p1)
	}

	// Nothing is lifted before the switch is recorded: the workers would
	// not know which rows came before it.
	err = op.LiftPredecessors(ctx, topo, e2, 0, []int{3})
	wantErr(t, "lift before the switch", err, ErrInvalid)

	// The pending epoch and its barrier are seen together: a member that
	// acknowledges the freeze has the barrier.
	if snap, err := r.Snapshot(ctx, topo); err != nil || snap.Pending == nil || snap.Barrier == nil || snap.Barrier.Epoch != e2 {
		t.Fatalf("snapshot while epoch %d is pending: barrier %+v, %v; want its barrier", e2, snap.Barrier, err)
	}
	must(t, op.Activate(ctx, topo, e2))
	if snap, err := r.Snapshot(ctx, topo); err != nil || snap.Barrier == nil || snap.Barrier.Epoch != e2 || snap.Active.Number != e2 {
		t.Fatalf("snapshot after activating epoch %d: barrier %+v, %v; want epoch %d's", e2, snap.Barrier, err, e2)
	}
	must(t, op.RecordSwitch(ctx, topo, e2, 0, 150))
	must(t, op.RecordSwitch(ctx, topo, e2, 0, 999)) // the first stands
	wantErr(t, "switch of a partition with no barrier", op.RecordSwitch(ctx, topo, e2, 5, 1), ErrEpochState)
	must(t, op.LiftPredecessors(ctx, topo, e2, 0, []int{3, 5}))
	must(t, op.LiftPredecessors(ctx, topo, e2, 0, []int{3}))

	b, err = op.OrderBarrier(ctx, topo)
	must(t, err)
	p0, _ := b.Partition(0)
	if !p0.Switched || p0.SwitchSeq != 150 {
		t.Fatalf("partition 0 switch %d (recorded %v), want 150", p0.SwitchSeq, p0.Switched)
	}
	if w := p0.Waiting(); !slices.Equal(w, []int{0, 1, 2, 4, 6, 7}) || !p0.Lifted(3) || p0.Lifted(4) {
		t.Fatalf("partition 0 waits for %v, want all but 3 and 5", w)
	}

	// A pending epoch written without a barrier never gets one: members
	// may have acknowledged its freeze without it.
	e3, err := op.CreatePending(ctx, topo, 2, 12)
	must(t, err)
	got, err := op.CreateOrderedPending(ctx, topo, 2, 12, BarrierStart{FromShards: 16, Before: map[int]uint64{0: 300}, Predecessors: []int{0, 4}})
	must(t, err)
	if b, err := op.OrderBarrier(ctx, topo); got != e3 || err != nil || b.Epoch != e2 {
		t.Fatalf("ordered pending over plain pending %d: epoch %d, barrier %+v, %v; want %d and epoch %d's barrier untouched", e3, got, b, err, e3, e2)
	}
	wantErr(t, "ordered pending of another shape", func() error {
		_, err := op.CreateOrderedPending(ctx, topo, 2, 10, BarrierStart{FromShards: 16, Before: map[int]uint64{0: 1}, Predecessors: []int{0}})
		return err
	}(), ErrPendingExists)
	must(t, op.Retire(ctx, topo, e3))

	// A later change's barrier replaces the earlier one.
	e4, err := op.CreateOrderedPending(ctx, topo, 2, 12, BarrierStart{FromShards: 16,
		Before: map[int]uint64{0: 300, 1: 40}, Predecessors: []int{0, 4}})
	must(t, err)
	b, err = op.OrderBarrier(ctx, topo)
	must(t, err)
	if b.Epoch != e4 || b.FromShards != 16 || b.ToShards != 12 {
		t.Fatalf("after the next change the barrier is %+v, want epoch %d's", b, e4)
	}
	if pg, ok := r.(*PG); ok {
		var n int
		must(t, pg.Pool().QueryRow(ctx, `SELECT count(*) FROM shardkeeper.order_barriers WHERE topology = $1 AND epoch = $2`, topo, e2).Scan(&n))
		if n != 0 {
			t.Fatalf("%d rows of epoch %d's barrier left after epoch %d's was written", n, e2, e4)
		}
	}
	wantErr(t, "a barrier that changes nothing", func() error {
		_, err := op.CreateOrderedPending(ctx, topo, 2, 12, BarrierStart{FromShards: 12})
		return err
	}(), ErrInvalid)

	// An older leader's writes are refused, like every operator write.
	_, t2 := operatorBarrier(t, r, topo, "operator-1")
	wantFenced(t, "RecordSwitch by the old leader", op.RecordSwitch(ctx, topo, e4, 1, 50), tok.Epoch, t2.Epoch, "operator-1")
	wantFenced(t, "LiftPredecessors by the old leader", op.LiftPredecessors(ctx, topo, e4, 0, []int{4}), tok.Epoch, t2.Epoch, "operator-1")
	_, err = op.CreateOrderedPending(ctx, topo, 2, 12, BarrierStart{FromShards: 16, Before: map[int]uint64{0: 1}, Predecessors: []int{0}})
	wantFenced(t, "CreateOrderedPending by the old leader", err, tok.Epoch, t2.Epoch, "operator-1")
	// A write without a token, bypassing the handle, is refused by the
	// table's trigger.
	if pg, ok := r.(*PG); ok {
		_, err = pg.Pool().Exec(ctx, `DELETE FROM shardkeeper.order_barriers WHERE topology = $1`, topo)
		if _, ok := OperatorFenced(err); !ok {
			t.Fatalf("a delete without a token: %v, want the operator check's refusal", err)
		}
	}
}

// The registry side of a change of N's barrier, on PostgreSQL and on the
// twin alike: its rows (old partitions, every shard, N before and after,
// V unchanged) are written and read with the pending epoch, a change of
// N and V at once or an old partition out of range is refused, and the
// drained-to marks are written only under a valid claim token, only
// raise, are read beside their unit's row and go with their barrier.
func TestOrderBarrierOfAChangeOfNKeepsTheHoldersMarks(t *testing.T) {
	forBackends(t, orderBarrierOfN)
}

func orderBarrierOfN(t *testing.T, r testRegistry) {
	ctx := context.Background()
	topo := newTopology(t, r, testParams, 4, 4)
	a, err := r.Join(ctx, topo, "a")
	must(t, err)
	b, err := r.Join(ctx, topo, "b")
	must(t, err)
	ca, err := r.Claim(ctx, a.MemberRef, 1, "2.1")
	must(t, err)
	cb, err := r.Claim(ctx, b.MemberRef, 1, "0.3")
	must(t, err)
	op, _ := operatorBarrier(t, r, topo, "operator-0")
	marks := r.(OrderMarks)

	for _, bad := range []struct {
		name               string
		partitions, shards int
		start              BarrierStart
	}{
		{"N and V at once", 6, 8, BarrierStart{FromPartitions: 4, FromShards: 4, Before: map[int]uint64{0: 0}, Predecessors: []int{0}}},
		{"N unchanged", 4, 4, BarrierStart{FromPartitions: 4, FromShards: 4, Before: map[int]uint64{0: 0}, Predecessors: []int{0}}},
		{"an old partition out of range", 6, 4, BarrierStart{FromPartitions: 4, FromShards: 4, Before: map[int]uint64{4: 0}, Predecessors: []int{0}}},
	} {
		_, err := op.CreateOrderedPending(ctx, topo, bad.partitions, bad.shards, bad.start)
		wantErr(t, bad.name, err, ErrInvalid)
	}

	// 4 -> 6: old partitions 0-3 all feed a new one (gcd 2).
	start := BarrierStart{FromPartitions: 4, FromShards: 4, Before: map[int]uint64{0: 0, 1: 0, 2: 0, 3: 0}, Predecessors: []int{0, 1, 2, 3}}
	e2, err := op.CreateOrderedPending(ctx, topo, 6, 4, start)
	must(t, err)
	bar, err := op.OrderBarrier(ctx, topo)
	must(t, err)
	if bar == nil || !bar.ChangesN() || bar.FromPartitions != 4 || bar.ToPartitions != 6 || bar.FromShards != 4 || bar.ToShards != 4 || len(bar.Partitions) != 4 {
		t.Fatalf("barrier %+v, want a change of N 4 -> 6 at V 4 over old partitions 0-3", bar)
	}
	if snap, err := r.Snapshot(ctx, topo); err != nil || snap.Barrier == nil || !snap.Barrier.ChangesN() || snap.Barrier.ToPartitions != 6 {
		t.Fatalf("snapshot's barrier %+v, %v; want the change of N's", snap.Barrier, err)
	}

	markOf := func(p, s int) uint64 {
		t.Helper()
		bar, err := op.OrderBarrier(ctx, topo)
		must(t, err)
		pb, ok := bar.Partition(p)
		if !ok {
			t.Fatalf("no barrier rows for old partition %d", p)
		}
		for _, pr := range pb.Predecessors {
			if pr.Shard == s {
				return pr.Mark
			}
		}
		t.Fatalf("no barrier row for unit %d.%d", p, s)
		return 0
	}
	must(t, marks.MarkDrained(ctx, ca.Token, e2, 40))
	must(t, marks.MarkDrained(ctx, ca.Token, e2, 30)) // lower: kept at 40
	if got := markOf(2, 1); got != 40 {
		t.Fatalf("unit 2.1's mark %d, want 40 (a lower one does not lower it)", got)
	}
	if got := markOf(0, 3); got != 0 {
		t.Fatalf("unit 0.3's mark %d before its holder recorded one, want 0", got)
	}
	// Another member's token for a unit it does not hold is refused.
	forged := cb.Token
	forged.Unit = "2.1"
	wantErr(t, "a mark under another member's token", marks.MarkDrained(ctx, forged, e2, 90), ErrStaleEpoch)
	// So is the holder's token once it released the unit.
	must(t, r.Release(ctx, cb.Token))
	wantErr(t, "a mark under a released token", marks.MarkDrained(ctx, cb.Token, e2, 90), ErrStaleEpoch)
	if got := markOf(0, 3); got != 0 {
		t.Fatalf("unit 0.3's mark %d after refused writes, want 0", got)
	}

	// The next change's barrier drops this one's marks.
	must(t, op.Retire(ctx, topo, e2))
	e3, err := op.CreateOrderedPending(ctx, topo, 6, 4, start)
	must(t, err)
	if e3 == e2 {
		t.Fatalf("the next change reused epoch %d", e2)
	}
	if got := markOf(2, 1); got != 0 {
		t.Fatalf("unit 2.1's mark %d under the next change's barrier, want 0 (the earlier barrier's mark is gone)", got)
	}
	if pg, ok := r.(*PG); ok {
		var n int
		must(t, pg.Pool().QueryRow(ctx, `SELECT count(*) FROM shardkeeper.order_marks WHERE topology = $1 AND epoch = $2`, topo, e2).Scan(&n))
		if n != 0 {
			t.Fatalf("%d marks of epoch %d's barrier left after epoch %d's was written", n, e2, e3)
		}
	}
}
