package member

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// barrier8to16 is the barrier of a change 8 -> 16 of partition 0, switched
// at 100, with old units lifted as given.
func barrier8to16(switched bool, lifted ...int) *poolctl.OrderBarrier {
	pb := poolctl.PartitionBarrier{Partition: 0, BeforeSeq: 90, SwitchSeq: 100, Switched: switched}
	for s := range 8 {
		pr := poolctl.BarrierPredecessor{Shard: s}
		for _, l := range lifted {
			if l == s {
				pr.LiftedAt = time.Unix(1, 0)
			}
		}
		pb.Predecessors = append(pb.Predecessors, pr)
	}
	return &poolctl.OrderBarrier{Epoch: 2, FromShards: 8, ToShards: 16, Partitions: []poolctl.PartitionBarrier{pb}}
}

// keyFor finds a key routed to old shard old under 8 and new shard neu
// under 16.
func keyFor(t *testing.T, old, neu int) string {
	t.Helper()
	for i := range 100000 {
		k := fmt.Sprintf("k%d", i)
		if ownership.PartitionShard(k, 8) == old && ownership.PartitionShard(k, 16) == neu {
			return k
		}
	}
	t.Fatalf("no key moves %d -> %d", old, neu)
	return ""
}

func TestPermissionHoldsOnlyMovedKeysRowsAfterTheSwitch(t *testing.T) {
	moved := keyFor(t, 3, 11)  // moves from 0.3 into 0.11
	unmoved := keyFor(t, 3, 3) // stays in 0.3
	u11, u3 := ownership.Unit{Partition: 0, Shard: 11}, ownership.Unit{Partition: 0, Shard: 3}
	tests := []holdsCase{
		{"a moved key's row after the switch waits for its old unit", barrier8to16(true), u11, 101, moved, true},
		{"it flows once its old unit is lifted", barrier8to16(true, 3), u11, 101, moved, false},
		{"another old unit's lift does not free it", barrier8to16(true, 0, 1, 2, 4, 5, 6, 7), u11, 101, moved, true},
		{"a row at or below the switch never waits", barrier8to16(true), u11, 100, moved, false},
		{"an unmoved key never waits", barrier8to16(true), u3, 500, unmoved, false},
		{"switch not recorded yet: a moved key's row above the sequence read before waits", barrier8to16(false), u11, 95, moved, true},
		{"switch not recorded yet: rows at or below the sequence read before do not", barrier8to16(false), u11, 90, moved, false},
		{"another partition has no barrier", barrier8to16(true), ownership.Unit{Partition: 1, Shard: 11}, 500, moved, false},
		{"no barrier, nothing waits", nil, u11, 500, moved, false},
	}
	checkHolds(t, tests)
}

// The core publishes the barrier a snapshot shows, and publishes again
// when a later snapshot shows an old unit lifted; an unchanged barrier
// publishes nothing.
func TestTheCorePublishesTheBarrierItReads(t *testing.T) {
	h := newHarness(t)
	err := h.run(func(h *harness) {
		h.holding(2)
		if h.perm.Barrier != nil {
			h.fail("barrier %+v published before any snapshot showed one", h.perm.Barrier)
		}
		s := snapshot(1, 2, false, 0)
		s.Barrier = barrier8to16(true)
		h.tick(s)
		if h.perm.Barrier == nil || h.perm.Barrier.Epoch != 2 || h.perm.Barrier.Lifted() {
			h.fail("permission barrier %+v after a snapshot with epoch 2's, nothing lifted", h.perm.Barrier)
		}
		before := h.perm
		s.Barrier = barrier8to16(true)
		h.tick(s)
		if h.perm != before {
			h.fail("an unchanged barrier published a new permission")
		}
		s.Barrier = barrier8to16(true, 3)
		h.tick(s)
		if pb, _ := h.perm.Barrier.Partition(0); !pb.Lifted(3) {
			h.fail("old unit 0.3 lifted in the registry but not in the permission")
		}
		if !h.delivering("0.0", 1) || !h.delivering("0.1", 1) {
			h.fail("a barrier change revoked delivery")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// barrierN4to6 is the barrier of a change of N 4 -> 6 at V 4: old
// partitions 0-3, every shard, with old units lifted as given.
func barrierN4to6(lifted ...ownership.Unit) *poolctl.OrderBarrier {
	b := &poolctl.OrderBarrier{Epoch: 2, FromShards: 4, ToShards: 4, FromPartitions: 4, ToPartitions: 6}
	for p := range 4 {
		pb := poolctl.PartitionBarrier{Partition: p, Switched: true, SwitchSeq: 1000}
		for s := range 4 {
			pr := poolctl.BarrierPredecessor{Shard: s}
			for _, l := range lifted {
				if l == (ownership.Unit{Partition: p, Shard: s}) {
					pr.LiftedAt = time.Unix(1, 0)
				}
			}
			pb.Predecessors = append(pb.Predecessors, pr)
		}
		b.Partitions = append(b.Partitions, pb)
	}
	return b
}

// before sets partition p's BeforeSeq in b.
func before(b *poolctl.OrderBarrier, p int, seq uint64) *poolctl.OrderBarrier {
	b.Partitions[p].BeforeSeq = seq
	return b
}

// keyForN finds a key in shard shard (of V 4) that a change of N moves
// from partition old (of 4) to neu (of 6).
func keyForN(t *testing.T, old, neu, shard int) string {
	t.Helper()
	for i := range 100000 {
		k := fmt.Sprintf("k%d", i)
		if ownership.KeyPartition(k, 4) == old && ownership.KeyPartition(k, 6) == neu && ownership.PartitionShard(k, 4) == shard {
			return k
		}
	}
	t.Fatalf("no key of shard %d moves from partition %d to %d", shard, old, neu)
	return ""
}

// Under a change of N a moved key's row waits in its new partition at any
// sequence (publishers switch one by one: no sequence splits the stream),
// until its old unit in the same shard is lifted; unmoved keys never wait,
// and the units that feed each other (0 and 2 in 4 -> 6) hold only the
// keys moving in.
func TestPermissionHoldsAMovedKeysRowsUnderAChangeOfNUntilItsOldUnitIsLifted(t *testing.T) {
	into0 := keyForN(t, 2, 0, 1) // 2.1 -> 0.1
	into2 := keyForN(t, 0, 2, 1) // 0.1 -> 2.1
	into4 := keyForN(t, 0, 4, 3) // 0.3 -> 4.3
	stays := keyForN(t, 1, 1, 2) // stays in 1.2
	u := func(p, s int) ownership.Unit { return ownership.Unit{Partition: p, Shard: s} }
	tests := []holdsCase{
		{"a key moved into an old partition waits for its old unit", barrierN4to6(), u(0, 1), 5, into0, true},
		{"at any sequence, below the old stream's S too", barrierN4to6(), u(0, 1), 1, into0, true},
		{"and the unit it came from holds the keys moving the other way", barrierN4to6(), u(2, 1), 7, into2, true},
		{"it flows once its old unit is lifted", barrierN4to6(u(2, 1)), u(0, 1), 5, into0, false},
		{"another shard's lift of the same old partition does not free it", barrierN4to6(u(2, 0), u(2, 2), u(2, 3)), u(0, 1), 5, into0, true},
		{"a key moved into a new partition waits too", barrierN4to6(), u(4, 3), 3, into4, true},
		{"an unmoved key never waits", barrierN4to6(), u(1, 2), 5, stays, false},
		{"a key the old shape routed to the unit is not held there", barrierN4to6(), u(2, 1), 5, into0, false},
		{"a row stored before the barrier was written never waits (an earlier change moved its key)", before(barrierN4to6(), 0, 40), u(0, 1), 40, into0, false},
		{"a row above that sequence waits", before(barrierN4to6(), 0, 40), u(0, 1), 41, into0, true},
	}
	checkHolds(t, tests)
}

// holdsCase is one row of a Permission.Holds table.
type holdsCase struct {
	name    string
	barrier *poolctl.OrderBarrier
	unit    ownership.Unit
	seq     uint64
	key     string
	want    bool
}

func checkHolds(t *testing.T, tests []holdsCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Permission{Barrier: tt.barrier}
			if got := p.Holds(tt.unit, tt.seq, tt.key); got != tt.want {
				t.Fatalf("Holds(%s, %d, %q) = %v, want %v", tt.unit, tt.seq, tt.key, got, tt.want)
			}
		})
	}
}
