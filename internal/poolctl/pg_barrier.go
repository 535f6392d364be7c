package poolctl

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// OrderBarrier is the order barrier of one change of V or of N (issue
// 24): for every partition, the old units whose keys moved (the
// predecessors), the stream sequence up to which their rows are the old
// shape's, and which predecessors acknowledged every row at or below it.
// A moved key's rows wait in its new unit while its predecessor is not
// lifted.
//
// A change of V (FromPartitions 0): a partition's predecessors are its
// old shards whose keys move to other shards (ownership.Predecessors),
// and its switch is where the subject transform moved. A change of N
// (FromPartitions and ToPartitions set, V unchanged): Partitions are the
// old partitions whose keys move (ownership.PartitionPredecessors), a
// predecessor is the shard s of old unit (p, s), and the switch is S_p,
// the stream's last row once every publisher acknowledged the new epoch.
type OrderBarrier struct {
	// Epoch is the epoch whose activation moved the keys.
	Epoch int64
	// FromShards and ToShards are V before and after the change (equal
	// for a change of N).
	FromShards, ToShards int
	// FromPartitions and ToPartitions are N before and after a change of
	// N; both 0 for a change of V.
	FromPartitions, ToPartitions int
	// Partitions are sorted by partition.
	Partitions []PartitionBarrier
}

// ChangesN reports whether b is the barrier of a change of N.
func (b *OrderBarrier) ChangesN() bool { return b.FromPartitions != 0 }

// PartitionBarrier is one partition stream's part of an OrderBarrier.
type PartitionBarrier struct {
	Partition int
	// BeforeSeq is a stream sequence read before the transform moved:
	// every row at or below it was routed over FromShards.
	BeforeSeq uint64
	// SwitchSeq is the last row routed over FromShards; valid when
	// Switched.
	SwitchSeq uint64
	Switched  bool
	// Predecessors are sorted by shard.
	Predecessors []BarrierPredecessor
}

// BarrierPredecessor is one old shard of a partition whose keys moved.
type BarrierPredecessor struct {
	Shard int
	// LiftedAt is when the operator found the shard's consumer had
	// acknowledged every row at or below SwitchSeq; zero while it waits.
	LiftedAt time.Time
	// Mark is the unit's drained-to mark under a change of N
	// (OrderMarks): every row of the unit at or below it is acknowledged
	// or is a moved-in key's row its holder holds. 0: none recorded.
	Mark uint64
}

// Lifted reports whether the predecessor was lifted.
func (b BarrierPredecessor) Lifted() bool { return !b.LiftedAt.IsZero() }

// Lifted reports whether every predecessor of every partition was lifted.
func (b *OrderBarrier) Lifted() bool {
	for _, p := range b.Partitions {
		for _, pr := range p.Predecessors {
			if !pr.Lifted() {
				return false
			}
		}
	}
	return true
}

// Partition returns partition p's part, if the barrier has one.
func (b *OrderBarrier) Partition(p int) (PartitionBarrier, bool) {
	i, ok := slices.BinarySearchFunc(b.Partitions, p, func(pb PartitionBarrier, p int) int { return pb.Partition - p })
	if !ok {
		return PartitionBarrier{}, false
	}
	return b.Partitions[i], true
}

// Waiting lists the predecessors not lifted yet.
func (p PartitionBarrier) Waiting() []int {
	var out []int
	for _, pr := range p.Predecessors {
		if !pr.Lifted() {
			out = append(out, pr.Shard)
		}
	}
	return out
}

// Lifted reports whether old shard s is lifted (or is no predecessor).
func (p PartitionBarrier) Lifted(s int) bool {
	for _, pr := range p.Predecessors {
		if pr.Shard == s {
			return pr.Lifted()
		}
	}
	return true
}

// BarrierStart is the order barrier a change starts with. A change of V:
// the old V, per partition a stream sequence read while the transform
// routes over it, and the old shards whose keys move. A change of N: the
// old N and V (unchanged), the old partitions whose keys move (Before's
// keys, each its stream's last sequence before the pending epoch was
// written), and every shard.
type BarrierStart struct {
	FromShards int
	// FromPartitions is the old N of a change of N, 0 for a change of V.
	FromPartitions int
	// Before maps each partition to its stream's last sequence, read
	// before the pending epoch is written (the transform then still
	// routes over FromShards, and does until the activation).
	Before map[int]uint64
	// Predecessors are the old shards whose keys move (the same in every
	// partition).
	Predecessors []int
}

// validate checks b for a change to toPartitions x toShards.
func (b BarrierStart) validate(topology string, toPartitions, toShards int) error {
	switch {
	case b.FromShards < 1 || b.FromShards > 1024:
		return fmt.Errorf("order barrier of %s: %d old shards: %w", topology, b.FromShards, ErrInvalid)
	case b.FromPartitions == 0 && b.FromShards == toShards:
		return fmt.Errorf("order barrier of %s (%d -> %d shards): V does not change: %w", topology, b.FromShards, toShards, ErrInvalid)
	case b.FromPartitions != 0 && (b.FromPartitions < 1 || b.FromPartitions > 1024 || b.FromPartitions == toPartitions || b.FromShards != toShards):
		return fmt.Errorf("order barrier of %s (%dx%d -> %dx%d): a change of N must change N alone: %w",
			topology, b.FromPartitions, b.FromShards, toPartitions, toShards, ErrInvalid)
	}
	for _, s := range b.Predecessors {
		if s < 0 || s >= b.FromShards {
			return fmt.Errorf("order barrier of %s: predecessor %d outside [0, %d): %w", topology, s, b.FromShards, ErrInvalid)
		}
	}
	for p := range b.Before {
		if b.FromPartitions != 0 && (p < 0 || p >= b.FromPartitions) {
			return fmt.Errorf("order barrier of %s: old partition %d outside [0, %d): %w", topology, p, b.FromPartitions, ErrInvalid)
		}
	}
	return nil
}

// nullablePartitions is N for the barrier rows: NULL for a change of V.
func nullablePartitions(n int) *int32 {
	if n == 0 {
		return nil
	}
	v := int32(n)
	return &v
}

// OrderBarriers is the registry side of the order barrier. PG implements
// it; the writes are operator writes (fenced by the operator token).
type OrderBarriers interface {
	// CreateOrderedPending is CreatePending for a change of V or of N
	// that keeps per-key order: the new
	// pending epoch and its barrier (nothing lifted, no switch recorded)
	// are written together, deleting every earlier epoch's barrier, so
	// every snapshot that shows the epoch pending shows its barrier, and
	// every freeze acknowledgement is made by a member that published it
	// to its pullers before the transform can move. An existing pending
	// epoch of that shape is returned as it is, with the barrier it was
	// written with or none: a barrier added later could miss members
	// that acknowledged the freeze without it, so none is.
	CreateOrderedPending(ctx context.Context, topology string, partitions, shards int, b BarrierStart) (int64, error)
	// RecordSwitch records partition's switch sequence for epoch's
	// barrier, once: a repeat keeps the first.
	RecordSwitch(ctx context.Context, topology string, epoch int64, partition int, seq uint64) error
	// LiftPredecessors lifts old shards of partition in epoch's barrier,
	// once its switch is recorded. Lifting a lifted one changes nothing.
	LiftPredecessors(ctx context.Context, topology string, epoch int64, partition int, shards []int) error
	// OrderBarrier reads the latest barrier (nil when there is none).
	OrderBarrier(ctx context.Context, topology string) (*OrderBarrier, error)
}

var _ OrderBarriers = (*PG)(nil)

// createOrderedPendingSQL is createPendingSQL that also writes the new
// epoch's barrier rows ($4 from_shards; $5, $6 partitions and their
// before sequences; $7 predecessors; $8 from_partitions, NULL for a
// change of V) and deletes earlier epochs' rows and marks, only when it
// created the epoch.
const createOrderedPendingSQL = createPendingCTEs + `,
	del AS (DELETE FROM shardkeeper.order_barriers WHERE topology = $1 AND epoch < (SELECT epoch FROM ins)),
	delm AS (DELETE FROM shardkeeper.order_marks WHERE topology = $1 AND epoch < (SELECT epoch FROM ins)),
	bar AS (
		INSERT INTO shardkeeper.order_barriers (topology, epoch, from_shards, to_shards, partition, predecessor, before_seq,
		                                        from_partitions, to_partitions)
		SELECT $1, ins.epoch, $4, $3, b.partition, pr, b.before_seq, $8::int, CASE WHEN $8::int IS NULL THEN NULL ELSE $2::int END
		  FROM ins, unnest($5::int[], $6::bigint[]) AS b(partition, before_seq), unnest($7::int[]) AS pr)` + createPendingResult

// CreateOrderedPending implements OrderBarriers in one fenced pipeline
// under the topology row's lock.
func (p *PG) CreateOrderedPending(ctx context.Context, topology string, partitions, shards int, b BarrierStart) (int64, error) {
	if err := b.validate(topology, partitions, shards); err != nil {
		return 0, err
	}
	parts := make([]int32, 0, len(b.Before))
	for part := range b.Before {
		parts = append(parts, int32(part))
	}
	slices.Sort(parts)
	before := make([]int64, len(parts))
	for i, part := range parts {
		before[i] = int64(b.Before[int(part)])
	}
	preds := make([]int32, len(b.Predecessors))
	for i, s := range b.Predecessors {
		preds[i] = int32(s)
	}
	return p.createPending(ctx, topology, partitions, shards, func(bt *pgx.Batch) {
		bt.Queue(createOrderedPendingSQL, topology, partitions, shards, b.FromShards, parts, before, preds, nullablePartitions(b.FromPartitions))
	})
}

// RecordSwitch implements OrderBarriers in one fenced statement.
func (p *PG) RecordSwitch(ctx context.Context, topology string, epoch int64, partition int, seq uint64) error {
	var n int
	err := p.opQueryRow(ctx, topology, `
		WITH u AS (UPDATE shardkeeper.order_barriers SET switch_seq = $4
		            WHERE topology = $1 AND epoch = $2 AND partition = $3 AND switch_seq IS NULL RETURNING 1)
		SELECT (SELECT count(*) FROM shardkeeper.order_barriers WHERE topology = $1 AND epoch = $2 AND partition = $3)::int`,
		[]any{topology, epoch, partition, int64(seq)}, &n)
	if err != nil {
		return fmt.Errorf("record the switch of %s partition %d (epoch %d) at %d: %w", topology, partition, epoch, seq, err)
	}
	if n == 0 {
		return fmt.Errorf("record the switch of %s partition %d: epoch %d has no barrier there: %w", topology, partition, epoch, ErrEpochState)
	}
	return nil
}

// LiftPredecessors implements OrderBarriers in one fenced statement.
func (p *PG) LiftPredecessors(ctx context.Context, topology string, epoch int64, partition int, shards []int) error {
	ss := make([]int32, len(shards))
	for i, s := range shards {
		ss[i] = int32(s)
	}
	var unswitched int
	err := p.opQueryRow(ctx, topology, `
		WITH u AS (UPDATE shardkeeper.order_barriers SET lifted_at = clock_timestamp()
		            WHERE topology = $1 AND epoch = $2 AND partition = $3 AND predecessor = ANY($4::int[])
		              AND lifted_at IS NULL AND switch_seq IS NOT NULL RETURNING 1)
		SELECT count(*)::int FROM shardkeeper.order_barriers
		 WHERE topology = $1 AND epoch = $2 AND partition = $3 AND predecessor = ANY($4::int[]) AND switch_seq IS NULL`,
		[]any{topology, epoch, partition, ss}, &unswitched)
	if err != nil {
		return fmt.Errorf("lift predecessors %v of %s partition %d (epoch %d): %w", shards, topology, partition, epoch, err)
	}
	if unswitched > 0 {
		return fmt.Errorf("lift predecessors of %s partition %d (epoch %d): its switch is not recorded yet: %w", topology, partition, epoch, ErrInvalid)
	}
	return nil
}

// barrierRowsJSON aggregates the order_barriers rows b (with their marks)
// into the JSON array barrierOf reads; the caller names b in its FROM.
const barrierRowsJSON = `coalesce(json_agg(json_build_object(
	         'epoch', b.epoch, 'from', b.from_shards, 'to', b.to_shards, 'partition', b.partition, 'predecessor', b.predecessor,
	         'before', b.before_seq, 'switch', b.switch_seq, 'liftedAt', b.lifted_at,
	         'fromPartitions', b.from_partitions, 'toPartitions', b.to_partitions,
	         'mark', (SELECT m.drained_to FROM shardkeeper.order_marks m
	                   WHERE m.topology = b.topology AND m.epoch = b.epoch AND m.unit = b.partition || '.' || b.predecessor))
	       ORDER BY b.partition, b.predecessor), '[]'::json)`

// orderBarrierSQL reads the latest epoch's barrier as JSON rows.
const orderBarrierSQL = `
	SELECT ` + barrierRowsJSON + `
	  FROM shardkeeper.order_barriers b WHERE b.topology = $1
	   AND b.epoch = (SELECT max(epoch) FROM shardkeeper.order_barriers WHERE topology = $1)`

type barrierRow struct {
	Epoch          int64      `json:"epoch"`
	From           int        `json:"from"`
	To             int        `json:"to"`
	Partition      int        `json:"partition"`
	Predecessor    int        `json:"predecessor"`
	Before         uint64     `json:"before"`
	Switch         *uint64    `json:"switch"`
	LiftedAt       *time.Time `json:"liftedAt"`
	FromPartitions *int       `json:"fromPartitions"`
	ToPartitions   *int       `json:"toPartitions"`
	Mark           *uint64    `json:"mark"`
}

// OrderBarrier implements OrderBarriers in one statement.
func (p *PG) OrderBarrier(ctx context.Context, topology string) (*OrderBarrier, error) {
	var raw []byte
	if err := p.pool.QueryRow(ctx, orderBarrierSQL, topology).Scan(&raw); err != nil {
		return nil, fmt.Errorf("read the order barrier of %s: %w", topology, err)
	}
	var rows []barrierRow
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, fmt.Errorf("read the order barrier of %s: %w", topology, err)
	}
	return barrierOf(rows), nil
}

// barrierOf groups rows (sorted by partition and predecessor) of one
// epoch.
func barrierOf(rows []barrierRow) *OrderBarrier {
	if len(rows) == 0 {
		return nil
	}
	b := &OrderBarrier{Epoch: rows[0].Epoch, FromShards: rows[0].From, ToShards: rows[0].To}
	if rows[0].FromPartitions != nil && rows[0].ToPartitions != nil {
		b.FromPartitions, b.ToPartitions = *rows[0].FromPartitions, *rows[0].ToPartitions
	}
	for _, r := range rows {
		if n := len(b.Partitions); n == 0 || b.Partitions[n-1].Partition != r.Partition {
			pb := PartitionBarrier{Partition: r.Partition, BeforeSeq: r.Before}
			if r.Switch != nil {
				pb.SwitchSeq, pb.Switched = *r.Switch, true
			}
			b.Partitions = append(b.Partitions, pb)
		}
		pr := BarrierPredecessor{Shard: r.Predecessor}
		if r.LiftedAt != nil {
			pr.LiftedAt = *r.LiftedAt
		}
		if r.Mark != nil {
			pr.Mark = *r.Mark
		}
		pb := &b.Partitions[len(b.Partitions)-1]
		pb.Predecessors = append(pb.Predecessors, pr)
	}
	return b
}

// OrderMarks is the worker side of the order barrier of a change of N:
// the holder of an old unit records how far its rows are settled
// (natsops.MarkOf), under its claim token.
type OrderMarks interface {
	// MarkDrained records that every row of t's unit at or below seq is
	// acknowledged or held as a moved-in key's row, for the barrier of
	// epoch. A guarded write: refused with a *StaleEpochError unless the
	// token is valid; a lower mark than the one recorded changes nothing.
	MarkDrained(ctx context.Context, t Token, epoch int64, seq uint64) error
}

var _ OrderMarks = (*PG)(nil)

// MarkDrained implements OrderMarks: a guarded write in one statement,
// which holds the claim row (FOR SHARE) until it commits.
func (p *PG) MarkDrained(ctx context.Context, t Token, epoch int64, seq uint64) error {
	return p.guardedWrite(ctx, t, fmt.Sprintf("mark drained to %d (barrier of epoch %d)", seq, epoch), `ok AS (
			SELECT 1 FROM shardkeeper.claims cl, t, shardkeeper.members m
			 WHERE `+tokenHeldSQL+`
			   FOR SHARE OF cl),
		upd AS (
			INSERT INTO shardkeeper.order_marks AS om (topology, epoch, unit, drained_to, member, claim_epoch, marked_at)
			SELECT $1, $5, $2, $6, $3, $4, t.now FROM t WHERE EXISTS (SELECT 1 FROM ok)
			ON CONFLICT (topology, epoch, unit) DO UPDATE
			   SET drained_to = greatest(om.drained_to, EXCLUDED.drained_to), member = EXCLUDED.member,
			       claim_epoch = EXCLUDED.claim_epoch, marked_at = EXCLUDED.marked_at
			RETURNING 1 AS done)`, epoch, int64(seq))
}
