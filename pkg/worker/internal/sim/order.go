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
// activation). A change of V is written with its order barrier
// (CreateOrderedPending), the operator records each stream's switch (the
// last row the old transform routed) a while after the activation, and
// lifts an old unit once its consumer acknowledged every row at or below
// the switch. The judge checks per-key order (historycheck's PerKey).

// orderState is the ordered run's world: streams, transform, keys and
// the barrier the operator moves on.
type orderState struct {
	// seq is each partition stream's last sequence; routeV the shard
	// count its transform routes over.
	seq    [simPartitions]uint64
	routeV [simPartitions]int
	// keys are the publisher's per-key sequences, by row id; next counts
	// each key's rows.
	keys map[string]historycheck.KeyedRow
	next map[string]int64
	// switched: partitions whose switch is recorded, for the barrier of
	// epoch barrierEpoch.
	barrierEpoch int64
	switchAt     [simPartitions]uint64
	recorded     [simPartitions]bool
}

// simPartitions is N in every run.
const simPartitions = 2

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

func newOrderState(v int) *orderState {
	o := &orderState{keys: map[string]historycheck.KeyedRow{}, next: map[string]int64{}}
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
	return w.publishKeyed(publish.Topology{Partitions: simPartitions}.Partition(key), key)
}

// publishProbe publishes a row of a key of its own that the transform
// routes to unit now.
func (w *world) publishProbe(unit string) string {
	u, err := ownership.ParseUnit(unit)
	must(err)
	for i := 0; ; i++ {
		if k := fmt.Sprintf("probe-%s-%d", unit, i); ownership.PartitionShard(k, w.order.routeV[u.Partition]) == u.Shard {
			id, _ := w.publishKeyed(u.Partition, k)
			return id
		}
	}
}

// createPending writes the pending epoch of 2 x shards: ordered runs write
// a change of V with its barrier, from the streams' sequences now.
func (w *world) createPending(active *poolctl.Epoch, shards int) (int64, error) {
	ctx := context.Background()
	if w.order == nil || active.Shards == shards {
		return w.twin.CreatePending(ctx, topology, simPartitions, shards)
	}
	return w.twin.CreateOrderedPending(ctx, topology, simPartitions, shards, w.barrierStart(active.Shards, shards))
}

// barrierStart is the barrier of a change of V from `from` to `to`, read
// from the streams now.
func (w *world) barrierStart(from, to int) poolctl.BarrierStart {
	preds, err := ownership.MovingShards(from, to)
	must(err)
	st := poolctl.BarrierStart{FromShards: from, Before: map[int]uint64{}, Predecessors: preds}
	for p, seq := range w.order.seq {
		st.Before[p] = seq
	}
	return st
}

// barrierUp reports whether the active epoch's barrier holds moved keys:
// the operator starts no change meanwhile.
func (w *world) barrierUp(snap poolctl.Snapshot) bool {
	b := snap.Barrier
	return w.order != nil && b != nil && snap.Active != nil && b.Epoch == snap.Active.Number && !b.Lifted()
}

// activated is the operator's work right after it activated epoch e of
// shards from `from`: the transform moves (the last row each stream
// routed over the old V is the switch), and the switch is recorded a
// while later, as the operator finds it.
func (w *world) activated(e int64, from, shards int) {
	o := w.order
	if o == nil || from == shards {
		return
	}
	o.barrierEpoch = e
	for p := range o.routeV {
		o.routeV[p] = shards
		o.switchAt[p], o.recorded[p] = o.seq[p], false
	}
	w.tracef("operator: transform moved to %d shards at sequences %v", shards, o.switchAt)
}

// barrierStep is the operator's OrderBarrier step, every operator step:
// record each partition's switch once found (after a random delay), and
// lift the old units drained to it.
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
	for p := range o.recorded {
		if !o.recorded[p] {
			if w.s.rng.IntN(3) == 0 {
				continue // not found yet: workers hold what came after the sequence read before
			}
			must(w.twin.RecordSwitch(ctx, topology, o.barrierEpoch, p, o.switchAt[p]))
			o.recorded[p] = true
			w.tracef("operator: switch of partition %d recorded at %d", p, o.switchAt[p])
			continue
		}
		pb, ok := b.Partition(p)
		if !ok {
			continue
		}
		var lift []int
		for _, s := range pb.Waiting() {
			if w.drainedTo(fmt.Sprintf("%d.%d", p, s), o.switchAt[p]) {
				lift = append(lift, s)
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
