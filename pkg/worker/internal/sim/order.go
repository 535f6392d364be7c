package sim

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/publish"
)

// Ordered runs (issue 24): a third of the seeds, chosen from a random
// stream of their own so a seed's other draws stay what they were, run
// spec.rollout.ordering PerKey under SubjectTransform assignment. The
// publisher sends keyed rows to partition streams; a modeled subject
// transform routes each to shard PartitionShard(key, V) of its partition,
// V being what the transform routes over (the active epoch's, moved at
// activation).
//
// Half of them change V: the change is written with its order barrier
// (CreateOrderedPending), the operator records each stream's switch (the
// last row the old transform routed) a while after the activation, and
// lifts an old unit once its consumer acknowledged every row at or below
// the switch. The other half change N (2 -> 3, V fixed): the publisher
// picks the partition (CRC-32 of the key mod its N) and moves to the new
// N a while after the activation, then acknowledges the epoch a while
// later still (rows of moved keys published in between land below the
// switch, in old units that hold them); the operator records each old
// partition's switch as its stream's last row once the publisher
// acknowledged, and lifts an old unit by the ack floor's test or by the
// drained-to mark its holder records between batches (puller.go,
// recordMark; natsops.MarkOf's rule on the modeled consumer). The judge
// checks per-key order (historycheck's PerKey).

// orderState is the ordered run's world: streams, transform, keys and
// the barrier the operator moves on.
type orderState struct {
	// changesN: the run's changes are of N, not of V.
	changesN bool
	// seq is each partition stream's last sequence; routeV the shard
	// count its transform routes over.
	seq    [maxPartitions]uint64
	routeV [maxPartitions]int
	// pubN is the N the publisher routes over, and acked the epoch it
	// acknowledged (pkg/publish.Acknowledge).
	pubN  int
	acked int64
	// keys are the publisher's per-key sequences, by row id; next counts
	// each key's rows.
	keys map[string]historycheck.KeyedRow
	next map[string]int64
	// switched: partitions whose switch is recorded, for the barrier of
	// epoch barrierEpoch.
	barrierEpoch int64
	switchAt     [maxPartitions]uint64
	recorded     [maxPartitions]bool
}

// simPartitions is N at the start of every run, maxPartitions the most a
// change of N makes it.
const (
	simPartitions = 2
	maxPartitions = 3
)

// orderedKeys is how many keys the publisher uses: few, so each key gets
// rows on both sides of a change.
const orderedKeys = 6

// handleTime is how long the handler takes a row: longer in an ordered
// run, so old units still hold rows when a change of V moves their keys.
func (w *world) handleTime() int64 {
	if w.order != nil {
		return w.s.between(ms, 250*ms)
	}
	return w.s.between(ms, 30*ms)
}

// publishGap is the time between two rows the publisher sends: shorter
// in an ordered run, so keys get rows on both sides of a change.
func (w *world) publishGap() int64 {
	if w.order != nil {
		return w.s.between(20*ms, 300*ms)
	}
	return w.s.between(50*ms, 600*ms)
}

// drawOrdered decides whether seed runs ordered.
func drawOrdered(seed int64) bool {
	return rand.New(rand.NewPCG(uint64(seed), 0x0bde)).IntN(3) == 0
}

// drawOrderedN decides whether an ordered seed changes N.
func drawOrderedN(seed int64) bool {
	return rand.New(rand.NewPCG(uint64(seed), 0x0bdf)).IntN(2) == 0
}

func newOrderState(v int, changesN bool) *orderState {
	o := &orderState{changesN: changesN, pubN: simPartitions, acked: 1,
		keys: map[string]historycheck.KeyedRow{}, next: map[string]int64{}}
	for p := range o.routeV {
		o.routeV[p] = v
	}
	return o
}

// publishKeyed publishes the next row of key to partition p's stream,
// where the transform routes it.
func (w *world) publishKeyed(p int, key string) (id, unit string) {
	o := w.order
	o.seq[p]++
	unit = fmt.Sprintf("%d.%d", p, ownership.PartitionShard(key, o.routeV[p]))
	w.nextRow++
	id = fmt.Sprintf("r%d", w.nextRow)
	c := w.cons[unit]
	c.msgs = append(c.msgs, &msg{seq: o.seq[p], rowID: id, key: key})
	w.published[id] = unit
	o.next[key]++
	o.keys[id] = historycheck.KeyedRow{Key: key, Seq: o.next[key]}
	return id, unit
}

// publishOrdered is the ordered publisher's step: a random key's next row
// to the key's partition (pkg/publish's: CRC-32 of the key mod N).
func (w *world) publishOrdered() (id, unit string) {
	key := fmt.Sprintf("k%d", w.s.rng.IntN(orderedKeys))
	return w.publishKeyed(publish.Topology{Partitions: w.order.pubN}.Partition(key), key)
}

// publishProbe publishes a row of a key of its own that the publisher
// sends to unit's partition under the active N and the transform routes
// to unit now.
func (w *world) publishProbe(unit string, partitions int) string {
	u, err := ownership.ParseUnit(unit)
	must(err)
	for i := 0; ; i++ {
		k := fmt.Sprintf("probe-%s-%d", unit, i)
		if ownership.KeyPartition(k, partitions) == u.Partition && ownership.PartitionShard(k, w.order.routeV[u.Partition]) == u.Shard {
			id, _ := w.publishKeyed(u.Partition, k)
			return id
		}
	}
}

// createPending writes the pending epoch of target: ordered runs write a
// change of V or of N with its barrier, from the streams' sequences now.
func (w *world) createPending(active *poolctl.Epoch, target ownership.Topology) (int64, error) {
	ctx := context.Background()
	if w.order == nil || (active.Shards == target.Shards && active.Partitions == target.Partitions) {
		return w.twin.CreatePending(ctx, topology, target.Partitions, target.Shards)
	}
	return w.twin.CreateOrderedPending(ctx, topology, target.Partitions, target.Shards, w.barrierStart(active, target))
}

// barrierStart is the barrier of a change from active to target, read
// from the streams now: for a change of V the old shards whose keys move,
// for a change of N the old partitions whose keys move, every shard of
// each.
func (w *world) barrierStart(active *poolctl.Epoch, target ownership.Topology) poolctl.BarrierStart {
	st := poolctl.BarrierStart{FromShards: active.Shards, Before: map[int]uint64{}}
	parts := make([]int, active.Partitions)
	for p := range parts {
		parts[p] = p
	}
	var err error
	if active.Partitions != target.Partitions {
		st.FromPartitions = active.Partitions
		parts, err = ownership.MovingPartitions(active.Partitions, target.Partitions)
		for s := range active.Shards {
			st.Predecessors = append(st.Predecessors, s)
		}
	} else {
		st.Predecessors, err = ownership.MovingShards(active.Shards, target.Shards)
	}
	must(err)
	for _, p := range parts {
		st.Before[p] = w.order.seq[p]
	}
	return st
}

// barrierUp reports whether the active epoch's barrier holds moved keys:
// the operator starts no change meanwhile.
func (w *world) barrierUp(snap poolctl.Snapshot) bool {
	b := snap.Barrier
	return w.order != nil && b != nil && snap.Active != nil && b.Epoch == snap.Active.Number && !b.Lifted()
}

// activated is the operator's work right after it activated epoch e
// (from `from` to `to`). A change of V: the transform moves (the last row
// each stream routed over the old V is the switch), and the switch is
// recorded a while later, as the operator finds it. A change of N: the
// publisher moves to the new N a while later and acknowledges the epoch
// a while after that; the switches wait for the acknowledgement.
func (w *world) activated(e int64, from, to ownership.Topology) {
	o := w.order
	if o == nil || from == to {
		return
	}
	o.barrierEpoch = e
	o.recorded = [maxPartitions]bool{}
	if from.Partitions != to.Partitions {
		w.s.after(w.s.between(0, 800*ms), nil, func() {
			o.pubN = to.Partitions
			w.tracef("publisher: moved to %d partitions", to.Partitions)
			w.s.after(w.s.between(0, 800*ms), nil, func() {
				o.acked = e
				w.tracef("publisher: acknowledged epoch %d", e)
			})
		})
		return
	}
	for p := range o.routeV {
		o.routeV[p] = to.Shards
		o.switchAt[p] = o.seq[p]
	}
	w.tracef("operator: transform moved to %d shards at sequences %v", to.Shards, o.switchAt)
}

// barrierStep is the operator's OrderBarrier step, every operator step:
// record each partition's switch once found (after a random delay), and
// lift the old units settled up to it.
func (w *world) barrierStep() {
	o := w.order
	if o == nil || o.barrierEpoch == 0 {
		return
	}
	ctx := context.Background()
	b, err := w.twin.OrderBarrier(ctx, topology)
	must(err)
	if b == nil || b.Epoch != o.barrierEpoch {
		return
	}
	for _, pb := range b.Partitions {
		p := pb.Partition
		if !o.recorded[p] {
			if w.s.rng.IntN(3) == 0 || (b.ChangesN() && o.acked < b.Epoch) {
				continue // not found yet, or the publisher not moved: workers hold what came after the sequence read before
			}
			if b.ChangesN() {
				o.switchAt[p] = o.seq[p]
			}
			must(w.twin.RecordSwitch(ctx, topology, o.barrierEpoch, p, o.switchAt[p]))
			o.recorded[p] = true
			w.tracef("operator: switch of partition %d recorded at %d", p, o.switchAt[p])
			continue
		}
		var lift []int
		for _, pr := range pb.Predecessors {
			unit := fmt.Sprintf("%d.%d", p, pr.Shard)
			if !pr.Lifted() && (w.drainedTo(unit, o.switchAt[p]) || w.markPasses(unit, pr.Mark, o.switchAt[p])) {
				lift = append(lift, pr.Shard)
			}
		}
		if len(lift) > 0 {
			must(w.twin.LiftPredecessors(ctx, topology, o.barrierEpoch, p, lift))
			w.tracef("operator: partition %d old shards %v lifted", p, lift)
		}
	}
}

// drainedTo reports whether unit's consumer acknowledged every row at or
// below seq.
func (w *world) drainedTo(unit string, seq uint64) bool {
	for _, m := range w.cons[unit].msgs {
		if m.seq <= seq && m.state != msgAcked {
			return false
		}
	}
	return true
}

// markPasses is natsops.MarkPasses on the model: a recorded mark (0:
// none) reaches seq, or unit has no row above it and at or below seq.
func (w *world) markPasses(unit string, mark, seq uint64) bool {
	if mark == 0 {
		return false
	}
	for _, m := range w.cons[unit].msgs {
		if m.seq > mark && m.seq <= seq {
			return false
		}
	}
	return true
}
