package poolctl

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
)

// The twin's order barrier: PG's order_barriers rows, one per (epoch,
// partition, predecessor), with the same operator fencing and errors.

var _ OrderBarriers = (*Twin)(nil)

// CreateOrderedPending implements OrderBarriers.
func (t *Twin) CreateOrderedPending(_ context.Context, topology string, partitions, shards int, b BarrierStart) (int64, error) {
	if err := b.validate(topology, partitions, shards); err != nil {
		return 0, err
	}
	return t.createPendingWith(topology, partitions, shards, func(tp *twinTopology, epoch int64) {
		tp.barrier = slices.DeleteFunc(tp.barrier, func(r barrierRow) bool { return r.Epoch < epoch })
		maps.DeleteFunc(tp.marks, func(k markKey, _ uint64) bool { return k.epoch < epoch })
		var fromN, toN *int
		if b.FromPartitions != 0 {
			fromN, toN = &b.FromPartitions, &partitions
		}
		for part, before := range b.Before {
			for _, pr := range b.Predecessors {
				if tp.barrierRow(epoch, part, pr) == nil {
					tp.barrier = append(tp.barrier, barrierRow{Epoch: epoch, From: b.FromShards, To: shards,
						Partition: part, Predecessor: pr, Before: before, FromPartitions: copyPtr(fromN), ToPartitions: copyPtr(toN)})
				}
			}
		}
		slices.SortFunc(tp.barrier, func(x, y barrierRow) int {
			return cmp.Or(cmp.Compare(x.Epoch, y.Epoch), cmp.Compare(x.Partition, y.Partition), cmp.Compare(x.Predecessor, y.Predecessor))
		})
	})
}

// barrierRow finds one row of the barrier, nil when there is none.
func (tp *twinTopology) barrierRow(epoch int64, partition, predecessor int) *barrierRow {
	for i := range tp.barrier {
		if r := &tp.barrier[i]; r.Epoch == epoch && r.Partition == partition && r.Predecessor == predecessor {
			return r
		}
	}
	return nil
}

// RecordSwitch implements OrderBarriers.
func (t *Twin) RecordSwitch(_ context.Context, topology string, epoch int64, partition int, seq uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return fmt.Errorf("record the switch of %s partition %d (epoch %d) at %d: %w", topology, partition, epoch, seq, err)
	}
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	n := 0
	for i := range tp.barrier {
		if r := &tp.barrier[i]; r.Epoch == epoch && r.Partition == partition {
			n++
			if r.Switch == nil {
				r.Switch = &seq
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("record the switch of %s partition %d: epoch %d has no barrier there: %w", topology, partition, epoch, ErrEpochState)
	}
	return nil
}

// LiftPredecessors implements OrderBarriers.
func (t *Twin) LiftPredecessors(_ context.Context, topology string, epoch int64, partition int, shards []int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return fmt.Errorf("lift predecessors %v of %s partition %d (epoch %d): %w", shards, topology, partition, epoch, err)
	}
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	now, unswitched := t.now(tp), 0
	for i := range tp.barrier {
		r := &tp.barrier[i]
		if r.Epoch != epoch || r.Partition != partition || !slices.Contains(shards, r.Predecessor) {
			continue
		}
		switch {
		case r.Switch == nil:
			unswitched++
		case r.LiftedAt == nil:
			r.LiftedAt = &now
		}
	}
	if unswitched > 0 {
		return fmt.Errorf("lift predecessors of %s partition %d (epoch %d): its switch is not recorded yet: %w", topology, partition, epoch, ErrInvalid)
	}
	return nil
}

// OrderBarrier implements OrderBarriers.
func (t *Twin) OrderBarrier(_ context.Context, topology string) (*OrderBarrier, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return nil, err
	}
	var latest int64
	for _, r := range tp.barrier {
		latest = max(latest, r.Epoch)
	}
	return tp.barrierOf(func(e int64) bool { return e == latest }), nil
}

// barrierOf is the barrier of the epoch keep selects (the rows of one
// epoch), as PG's read returns it.
func (tp *twinTopology) barrierOf(keep func(epoch int64) bool) *OrderBarrier {
	var rows []barrierRow
	for _, r := range tp.barrier {
		if keep(r.Epoch) {
			r.Switch, r.LiftedAt = copyPtr(r.Switch), copyPtr(r.LiftedAt)
			r.FromPartitions, r.ToPartitions = copyPtr(r.FromPartitions), copyPtr(r.ToPartitions)
			if m, ok := tp.marks[markKey{r.Epoch, fmt.Sprintf("%d.%d", r.Partition, r.Predecessor)}]; ok {
				r.Mark = &m
			}
			rows = append(rows, r)
		}
	}
	return barrierOf(rows)
}

// markKey names a drained-to mark: the barrier's epoch and the unit.
type markKey struct {
	epoch int64
	unit  string
}

var _ OrderMarks = (*Twin)(nil)

// MarkDrained implements OrderMarks.
func (t *Twin) MarkDrained(_ context.Context, tok Token, epoch int64, seq uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(tok.Topology)
	if err != nil {
		return err
	}
	if err := t.valid(tp, tok, tp.claims[tok.Unit]); err != nil {
		return fmt.Errorf("mark %s drained: %w", tok.Unit, err)
	}
	if tp.marks == nil {
		tp.marks = map[markKey]uint64{}
	}
	k := markKey{epoch, tok.Unit}
	tp.marks[k] = max(tp.marks[k], seq)
	return nil
}

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
