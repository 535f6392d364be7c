package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// The order barrier of a change of V under spec.rollout.ordering PerKey
// (issue 24, design.md section 8). With the pending epoch, in the same
// transaction (poolctl's CreateOrderedPending), the operator writes, for
// every partition, the old shards whose keys move
// (ownership.BarrierPairs) and a stream sequence read just before (every
// row at or below it was routed over the old V): every member that
// acknowledges the freeze has the barrier in its pullers' permission
// before the activation moves the transform, including members that keep
// a unit across the activation and receive moved keys' rows in it. Once
// the transform moved, it finds each stream's switch S (ownership.FindSwitch: the last row the
// old transform routed) and records it. Then, every reconcile while the
// barrier is up, it lifts each old unit whose consumer acknowledged every
// row at or below S (natsops.DrainedTo). Workers hold a moved key's rows
// in its new unit until the key's old unit is lifted. A new change waits
// while the barrier is up: a key moved twice must leave its first new
// unit in order too, and one barrier at a time keeps the rule that a
// barrier waits only on rows at or below its own switch, never on rows
// another barrier holds.

// errNoOrderBarriers means the registry keeps no order barriers.
var errNoOrderBarriers = errors.New("the registry keeps no order barriers (PostgreSQL registry needed)")

// CreateOrderedPending passes to the inner registry, when it keeps
// barriers.
func (b *boundedRegistry) CreateOrderedPending(ctx context.Context, topology string, partitions, shards int, st poolctl.BarrierStart) (int64, error) {
	ob, ok := b.inner.(poolctl.OrderBarriers)
	if !ok {
		return 0, errNoOrderBarriers
	}
	return bounded(ctx, b, "CreateOrderedPending", func(c context.Context) (int64, error) {
		return ob.CreateOrderedPending(c, topology, partitions, shards, st)
	})
}

// RecordSwitch passes to the inner registry, when it keeps barriers.
func (b *boundedRegistry) RecordSwitch(ctx context.Context, topology string, epoch int64, partition int, seq uint64) error {
	ob, ok := b.inner.(poolctl.OrderBarriers)
	if !ok {
		return errNoOrderBarriers
	}
	return boundedErr(ctx, b, "RecordSwitch", func(c context.Context) error { return ob.RecordSwitch(c, topology, epoch, partition, seq) })
}

// LiftPredecessors passes to the inner registry, when it keeps barriers.
func (b *boundedRegistry) LiftPredecessors(ctx context.Context, topology string, epoch int64, partition int, shards []int) error {
	ob, ok := b.inner.(poolctl.OrderBarriers)
	if !ok {
		return errNoOrderBarriers
	}
	return boundedErr(ctx, b, "LiftPredecessors", func(c context.Context) error {
		return ob.LiftPredecessors(c, topology, epoch, partition, shards)
	})
}

// OrderBarrier passes to the inner registry; nil when it keeps none.
func (b *boundedRegistry) OrderBarrier(ctx context.Context, topology string) (*poolctl.OrderBarrier, error) {
	ob, ok := b.inner.(poolctl.OrderBarriers)
	if !ok {
		return nil, nil
	}
	return bounded(ctx, b, "OrderBarrier", func(c context.Context) (*poolctl.OrderBarrier, error) { return ob.OrderBarrier(c, topology) })
}

var _ poolctl.OrderBarriers = (*boundedRegistry)(nil)

// barrierReport is what this reconcile measured of the barrier, for
// status.
type barrierReport struct {
	// drains are the old units not lifted, as NATS showed them.
	drains    map[ownership.Unit]natsops.Drain
	checkedAt *metav1.Time
	// unrouted lists partitions whose transform has not moved yet.
	unrouted []int
	// unread says what NATS did not answer this time (unit or partition:
	// error); those stay unlifted and are read at the next reconcile.
	unread []string
	// publishersBehind names the publishers still on an epoch older than
	// a change of N's barrier, as read this time: no switch is recorded
	// while there is one.
	publishersBehind []string
	// ackLimit is the unit consumers' max_ack_pending, which a change of
	// N's old unit may fill with held rows.
	ackLimit int
}

// activeBarrier is the barrier of the active epoch, nil when the barrier
// read belongs to the pending epoch, or there is none: only the active
// epoch's barrier holds anything.
func (s *scope) activeBarrier() *poolctl.OrderBarrier {
	if s.barrier == nil || s.snap == nil || s.snap.Active == nil || s.barrier.Epoch != s.snap.Active.Number {
		return nil
	}
	return s.barrier
}

// barrierUp reports whether the active epoch's barrier still holds keys.
func (s *scope) barrierUp() bool {
	b := s.activeBarrier()
	return b != nil && !b.Lifted()
}

// orderedChange says whether the change from w.active to w.pending keeps
// per-key order, and why not when it does not.
func (s *scope) orderedChange(w *changeWorld) (bool, string) {
	if w.pending == nil {
		return false, ""
	}
	return s.orderedShape(w.active, epochTopology(w.pending))
}

// orderedShape says whether a change from active to target keeps per-key
// order, and why not when it does not.
func (s *scope) orderedShape(active *poolctl.Epoch, target ownership.Topology) (bool, string) {
	switch {
	case s.topo.Spec.Rollout.Ordering != topologyv1.OrderingPerKey:
		return false, ""
	case s.topo.Spec.NATS.ShardAssignment != topologyv1.ShardAssignmentSubjectTransform:
		return false, "spec.rollout.ordering PerKey needs spec.nats.shardAssignment SubjectTransform"
	case active == nil || (active.Shards == target.Shards && active.Partitions == target.Partitions):
		return false, ""
	case active.Shards != target.Shards && active.Partitions != target.Partitions:
		return false, "a change of spec.partitions and spec.shardsPerPartition at once is not ordered (each is on its own)"
	}
	return true, ""
}

// stepTarget is the shape the next change goes to: the spec's, except
// under ordering PerKey when the spec differs from the active epoch in
// both N and V (two updates before the rollout took the first): then V
// first, at the active N, and N once that change and its barrier are
// over. Each keeps per-key order on its own; both at once would not.
func (s *scope) stepTarget() ownership.Topology {
	t := s.target()
	a := s.snap.Active
	if a == nil || s.topo.Spec.Rollout.Ordering != topologyv1.OrderingPerKey ||
		s.topo.Spec.NATS.ShardAssignment != topologyv1.ShardAssignmentSubjectTransform {
		return t
	}
	if a.Partitions != t.Partitions && a.Shards != t.Shards {
		t.Partitions = a.Partitions
	}
	return t
}

// pendingHasBarrier reports whether the snapshot that shows w.pending
// shows its barrier (read in the same statement).
func (s *scope) pendingHasBarrier(w *changeWorld) bool {
	return w.pending != nil && s.snap != nil && s.snap.Barrier != nil && s.snap.Barrier.Epoch == w.pending.Number
}

// barrierStart is the barrier a change from active to target starts
// with. A change of V: the old shards whose keys move and each partition
// stream's last sequence, read now, while the transform routes over the
// active V. A change of N: the old partitions whose keys move, each with
// its stream's last sequence (every row at or below it was published
// under an older N: no publisher uses the new one before the
// activation), and every shard of each.
func (s *scope) barrierStart(ctx context.Context, active *poolctl.Epoch, target ownership.Topology) (poolctl.BarrierStart, error) {
	changesN := active.Partitions != target.Partitions
	var (
		preds, parts []int
		err          error
	)
	if changesN {
		parts, err = ownership.MovingPartitions(active.Partitions, target.Partitions)
		for sh := range active.Shards {
			preds = append(preds, sh)
		}
	} else {
		preds, err = ownership.MovingShards(active.Shards, target.Shards)
	}
	if err != nil {
		return poolctl.BarrierStart{}, err
	}
	nctx, cancel := context.WithTimeout(ctx, natsOpTimeout)
	defer cancel()
	pos, err := natsops.StreamPositions(nctx, s.nc, layoutFor(s.topo, epochTopology(active)))
	if err != nil {
		return poolctl.BarrierStart{}, fmt.Errorf("read the partition streams before the switch: %w", err)
	}
	before := make(map[int]uint64, len(pos))
	for p, sp := range pos {
		if !changesN || slices.Contains(parts, p) {
			before[p] = sp.LastSeq
		}
	}
	st := poolctl.BarrierStart{FromShards: active.Shards, Before: before, Predecessors: preds}
	if changesN {
		st.FromPartitions = active.Partitions
	}
	return st, nil
}

// createPending writes target as the pending epoch: with its order
// barrier, in the same transaction, when the change keeps per-key order.
func (s *scope) createPending(ctx context.Context, w *changeWorld) (int64, error) {
	if ordered, _ := s.orderedShape(w.active, w.target); !ordered {
		return s.reg.CreatePending(ctx, s.registryKey(), w.target.Partitions, w.target.Shards)
	}
	ob, ok := s.reg.(poolctl.OrderBarriers)
	if !ok {
		return 0, errNoOrderBarriers
	}
	st, err := s.barrierStart(ctx, w.active, w.target)
	if err != nil {
		return 0, err
	}
	epoch, err := ob.CreateOrderedPending(ctx, s.registryKey(), w.target.Partitions, w.target.Shards, st)
	if err != nil {
		return 0, err
	}
	// It deleted every earlier epoch's barrier; the new one is the
	// pending epoch's and holds nothing until the activation. The
	// snapshot's barrier is no longer in the registry.
	s.barrier = nil
	return epoch, nil
}

// orderBarrier is the reconcile step that moves the active epoch's barrier
// on: it records each partition's switch once the old shape routes no
// more rows there, and lifts the old units that settled every row up to
// it.
func orderBarrier(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	if s.snap == nil || !s.barrierUp() || s.nc == nil || !s.nc.IsConnected() {
		return ctrl.Result{}, nil
	}
	b := s.activeBarrier()
	nctx, cancel := context.WithTimeout(ctx, natsOpTimeout)
	defer cancel()
	l := s.barrierLayout(b)
	rep := &barrierReport{drains: map[ownership.Unit]natsops.Drain{}, ackLimit: l.MaxAckPending}
	s.barrierRep = rep
	if err := s.recordSwitches(ctx, nctx, b, l, rep); err != nil {
		return ctrl.Result{}, fmt.Errorf("order barrier: %w", err)
	}
	if err := s.liftSettled(ctx, nctx, b, l, rep); err != nil {
		return ctrl.Result{}, fmt.Errorf("order barrier: %w", err)
	}
	if len(rep.unread) > 0 {
		log.FromContext(ctx).Info("Order barrier: NATS did not answer for some old units", "unread", firstN(rep.unread, 4))
	}
	at := metav1.NewTime(s.now)
	rep.checkedAt = &at
	if b.Lifted() {
		r.event(s, eventNormal, "OrderBarrierLifted", "OrderBarrier",
			"every old unit of epoch %d's %s settled its rows up to the switch; moved keys flow in their new units",
			b.Epoch, barrierChange(b))
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: pollFast}, nil
}

// barrierChange names b's change in words.
func barrierChange(b *poolctl.OrderBarrier) string {
	if b.ChangesN() {
		return fmt.Sprintf("change of N (%d -> %d partitions)", b.FromPartitions, b.ToPartitions)
	}
	return fmt.Sprintf("change of V (%d -> %d shards)", b.FromShards, b.ToShards)
}

// barrierLayout is the active layout widened to b's old partitions (a
// change of N that lowered N still reads the streams it left).
func (s *scope) barrierLayout(b *poolctl.OrderBarrier) natsops.Layout {
	t := epochTopology(s.snap.Active)
	t.Partitions = max(t.Partitions, b.FromPartitions)
	return layoutFor(s.topo, t)
}

// recordSwitches records the switch of every partition of b that has
// none yet, where it can be known. A change of V: where the transform
// moved (findSwitch), once the stream routes over the new V. A change of
// N: the stream's last row, once every publisher that acknowledges
// epochs names b's (each does so only after its last row under the old
// N has its stream ack, so every such row is at or below it). What NATS
// does not answer goes to rep and is tried again next time: it must not
// hold the steps after this one (the pod roll, the retiring set).
func (s *scope) recordSwitches(ctx, nctx context.Context, b *poolctl.OrderBarrier, l natsops.Layout, rep *barrierReport) error {
	var open []*poolctl.PartitionBarrier
	for i := range b.Partitions {
		if !b.Partitions[i].Switched {
			open = append(open, &b.Partitions[i])
		}
	}
	if len(open) == 0 {
		return nil
	}
	if b.ChangesN() {
		behind, err := s.publishersBefore(nctx, b.Epoch)
		if err != nil {
			rep.unread = append(rep.unread, err.Error())
			return nil
		}
		if rep.publishersBehind = behind; len(behind) > 0 {
			return nil
		}
	}
	pos, err := natsops.StreamPositions(nctx, s.nc, l)
	if err != nil {
		rep.unread = append(rep.unread, fmt.Sprintf("streams: %v", err))
		return nil
	}
	for _, pb := range open {
		sp := pos[pb.Partition]
		seq := sp.LastSeq
		if !b.ChangesN() {
			if !sp.Routed {
				// The transform has not moved here yet (the
				// activation's provisioning failed): rows may still be
				// routed over the old V, so no switch can be found.
				rep.unrouted = append(rep.unrouted, pb.Partition)
				continue
			}
			if seq, err = s.findSwitch(nctx, l, pb.Partition, pb.BeforeSeq, sp.LastSeq, b.FromShards, b.ToShards); err != nil {
				rep.unread = append(rep.unread, fmt.Sprintf("partition %d's switch: %v", pb.Partition, err))
				continue
			}
		}
		if err := s.reg.(poolctl.OrderBarriers).RecordSwitch(ctx, s.registryKey(), b.Epoch, pb.Partition, seq); err != nil {
			return err
		}
		s.changed = true
		pb.SwitchSeq, pb.Switched = seq, true
		log.FromContext(ctx).Info("Order barrier switch recorded", "epoch", b.Epoch, "partition", pb.Partition, "switchSeq", seq,
			"beforeSeq", pb.BeforeSeq, "readAfter", sp.LastSeq)
	}
	return nil
}

// liftSettled lifts every old unit of a switched partition whose rows at
// or below the switch are all settled: acknowledged by the ack floor's
// test (natsops.DrainedTo) or, under a change of N, acknowledged or held
// as moved-in keys' rows by its holder's recorded mark
// (natsops.MarkPasses). A lift is for good: a row once acknowledged stays
// so, and a held row belongs to a key the old unit feeds to no one.
func (s *scope) liftSettled(ctx, nctx context.Context, b *poolctl.OrderBarrier, l natsops.Layout, rep *barrierReport) error {
	for i := range b.Partitions {
		pb := &b.Partitions[i]
		if !pb.Switched {
			continue
		}
		var lift []int
		for _, pr := range pb.Predecessors {
			if pr.Lifted() {
				continue
			}
			u := ownership.Unit{Partition: pb.Partition, Shard: pr.Shard}
			d, err := natsops.DrainedTo(nctx, s.nc, l, u.Partition, u.Shard, pb.SwitchSeq)
			if err == nil && !d.Drained && pr.Mark > 0 {
				d.Drained, err = natsops.MarkPasses(nctx, s.nc, l, u.Partition, u.Shard, pr.Mark, pb.SwitchSeq)
			}
			switch {
			case err != nil:
				rep.unread = append(rep.unread, fmt.Sprintf("%s: %v", u, err))
			case d.Drained:
				lift = append(lift, pr.Shard)
			default:
				rep.drains[u] = d
			}
		}
		if len(lift) == 0 {
			continue
		}
		if err := s.reg.(poolctl.OrderBarriers).LiftPredecessors(ctx, s.registryKey(), b.Epoch, pb.Partition, lift); err != nil {
			return err
		}
		s.changed = true
		for j := range pb.Predecessors {
			if slices.Contains(lift, pb.Predecessors[j].Shard) {
				pb.Predecessors[j].LiftedAt = s.now
			}
		}
	}
	return nil
}

// findSwitch finds partition p's switch between before and after.
func (s *scope) findSwitch(ctx context.Context, l natsops.Layout, p int, before, after uint64, from, to int) (uint64, error) {
	return ownership.FindSwitch(before, after, func(seq uint64) (ownership.Routing, error) {
		row, ok, err := natsops.RowAt(ctx, s.nc, l, p, seq)
		if err != nil || !ok {
			return ownership.RoutedEither, err
		}
		return ownership.RoutedBy(row.Key, row.Shard, from, to), nil
	})
}

// maxBarrierListed bounds the units status names.
const maxBarrierListed = 16

// orderBarrierStatus is the barrier as status shows it: from the
// registry's rows and, for the old units not lifted, what this reconcile
// read of them in NATS. nil without an active barrier.
func orderBarrierStatus(b *poolctl.OrderBarrier, rep *barrierReport) *topologyv1.OrderBarrierStatus {
	if b == nil {
		return nil
	}
	st := &topologyv1.OrderBarrierStatus{Epoch: b.Epoch, FromShards: int32(b.FromShards), ToShards: int32(b.ToShards),
		FromPartitions: int32(b.FromPartitions), ToPartitions: int32(b.ToPartitions), Partitions: int32(len(b.Partitions))}
	for _, pb := range b.Partitions {
		if pb.Switched {
			st.Switched++
		}
		for _, pr := range pb.Predecessors {
			st.Predecessors++
			if pr.Lifted() {
				st.Lifted++
				continue
			}
			u := ownership.Unit{Partition: pb.Partition, Shard: pr.Shard}
			d, read := natsops.Drain{}, false
			if rep != nil {
				d, read = rep.drains[u]
			}
			if read && b.ChangesN() && rep.ackLimit > 0 && d.AckPending >= rep.ackLimit && len(st.AtAckLimit) < maxBarrierListed {
				st.AtAckLimit = append(st.AtAckLimit, u.String())
			}
			if !read || len(st.Draining) >= maxBarrierListed {
				continue
			}
			bd := topologyv1.BarrierDrain{Unit: u.String(), AckFloor: int64(d.AckFloor), FirstOpen: int64(d.FirstOpen),
				Pending: int64(d.Pending), AckPending: int64(d.AckPending), Mark: int64(pr.Mark)}
			if pb.Switched {
				seq := int64(pb.SwitchSeq)
				bd.SwitchSeq = &seq
			}
			st.Draining = append(st.Draining, bd)
		}
	}
	waiting := newUnitsWaiting(b)
	st.UnitsWaiting = int32(len(waiting))
	st.Waiting = waiting[:min(len(waiting), maxBarrierListed)]
	if rep != nil {
		st.CheckedAt = rep.checkedAt
		st.Unread = rep.unread[:min(len(rep.unread), maxBarrierListed)]
		st.PublishersBehind = rep.publishersBehind[:min(len(rep.publishersBehind), maxBarrierListed)]
	}
	return st
}

// newUnitsWaiting lists the new units that hold moved keys' rows for an
// old unit not lifted yet, with those old units. A change of V: new
// shard s of partition p waits for its predecessor shards in p. A change
// of N: new unit (p', s) waits for (p, s) of each old partition p that
// feeds p' (the shard stays).
func newUnitsWaiting(b *poolctl.OrderBarrier) []topologyv1.BarrierWait {
	var out []topologyv1.BarrierWait
	wait := func(u ownership.Unit, feeds []ownership.Unit) {
		var names []string
		for _, old := range feeds {
			if pb, ok := b.Partition(old.Partition); ok && !pb.Lifted(old.Shard) {
				names = append(names, old.String())
			}
		}
		if len(names) > 0 {
			out = append(out, topologyv1.BarrierWait{Unit: u.String(), For: names})
		}
	}
	if b.ChangesN() {
		for p := range b.ToPartitions {
			preds, _ := ownership.PartitionPredecessors(b.FromPartitions, b.ToPartitions, p)
			for sh := range b.ToShards {
				feeds := make([]ownership.Unit, len(preds))
				for i, old := range preds {
					feeds[i] = ownership.Unit{Partition: old, Shard: sh}
				}
				wait(ownership.Unit{Partition: p, Shard: sh}, feeds)
			}
		}
		return out
	}
	for _, pb := range b.Partitions {
		for sh := range b.ToShards {
			preds, _ := ownership.Predecessors(b.FromShards, b.ToShards, sh)
			feeds := make([]ownership.Unit, len(preds))
			for i, old := range preds {
				feeds[i] = ownership.Unit{Partition: pb.Partition, Shard: old}
			}
			wait(ownership.Unit{Partition: pb.Partition, Shard: sh}, feeds)
		}
	}
	return out
}

// barrierMessage says in words what the barrier holds, "" when nothing.
func barrierMessage(st *topologyv1.OrderBarrierStatus) string {
	if st == nil || st.UnitsWaiting == 0 {
		return ""
	}
	var names []string
	for _, w := range st.Waiting {
		names = append(names, fmt.Sprintf("%s for %v", w.Unit, w.For))
	}
	shape := fmt.Sprintf("%d -> %d shards", st.FromShards, st.ToShards)
	if st.FromPartitions != 0 {
		shape = fmt.Sprintf("%d -> %d partitions", st.FromPartitions, st.ToPartitions)
	}
	msg := fmt.Sprintf("order barrier of epoch %d (%s): %d units hold moved keys' rows until their old units drain (%d/%d old units drained, %d/%d switches recorded)",
		st.Epoch, shape, st.UnitsWaiting, st.Lifted, st.Predecessors, st.Switched, st.Partitions)
	if len(st.PublishersBehind) > 0 {
		msg += fmt.Sprintf("; the switches wait for publishers still on an older epoch: %s", firstN(st.PublishersBehind, 3))
	}
	if len(st.AtAckLimit) > 0 {
		msg += fmt.Sprintf("; old units at spec.nats.maxAckPending unacknowledged rows, which held rows of keys moving in may fill so they receive nothing more (raise it): %s",
			firstN(st.AtAckLimit, 3))
	}
	if len(names) > 0 {
		msg += ": " + firstN(names, 3)
	}
	return msg
}
