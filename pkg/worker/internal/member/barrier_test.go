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
	tests := []struct {
		name    string
		barrier *poolctl.OrderBarrier
		unit    ownership.Unit
		seq     uint64
		key     string
		want    bool
	}{
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Permission{Barrier: tt.barrier}
			if got := p.Holds(tt.unit, tt.seq, tt.key); got != tt.want {
				t.Fatalf("Holds(%s, %d, %q) = %v, want %v", tt.unit, tt.seq, tt.key, got, tt.want)
			}
		})
	}
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
