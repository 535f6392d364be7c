package worker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// errStaleSnapshot ends a tick whose snapshot does not describe this
// incarnation.
var errStaleSnapshot = errors.New("snapshot does not show this incarnation live; waiting for the lease loop")

// tickState is what one tick learned, passed from step to step.
type tickState struct {
	snap poolctl.Snapshot
	// mine is this member's placement under the active epoch.
	mine map[ownership.Unit]bool
	// drain lists retiring units placement gives this member to drain
	// when nobody holds them (their holder died or left).
	drain []ownership.Unit
	// frozen: a new epoch is pending, so nothing is claimed (P2).
	frozen bool
}

// tickSteps run in order each tick; a failing step ends the tick and the
// next tick starts again from the top. A fenced member, or one without a
// lease, skips the tick: what it holds is unknown until the lease loop
// confirms it.
var tickSteps = []struct {
	name string
	run  func(w *Worker, ctx context.Context, ts *tickState) error
}{
	{"Snapshot", (*Worker).snapshot},
	{"Freeze", (*Worker).freeze},
	{"Place", (*Worker).place},
	{"HandOver", (*Worker).handOver},
	{"Claim", (*Worker).claim},
}

func (w *Worker) tick(ctx context.Context) error {
	if _, ok := w.memberRef(); !ok || w.isFenced() {
		return nil
	}
	var ts tickState
	for _, st := range tickSteps {
		if err := st.run(w, ctx, &ts); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
	}
	w.mu.Lock()
	w.metrics.unitsHeld.Set(float64(len(w.held)))
	var pending int64
	for _, h := range w.held {
		if h.puller != nil {
			pending += h.puller.pending.Load()
		}
	}
	w.metrics.pendingRows.Set(float64(pending))
	w.mu.Unlock()
	return nil
}

func (w *Worker) snapshot(ctx context.Context, ts *tickState) error {
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	s, err := w.reg.Snapshot(qctx, w.opts.Topology)
	if err != nil {
		return err
	}
	ts.snap = s
	w.mu.Lock()
	w.params = s.Params
	w.applySettingsLocked(s.Params.Worker)
	w.reset, w.resetAt = s.Reset, time.Now()
	w.mu.Unlock()
	return nil
}

// freeze acknowledges a pending epoch once. Claims stop from here (the
// Claim step checks ts.frozen); units already held keep flowing.
func (w *Worker) freeze(ctx context.Context, ts *tickState) error {
	pending := ts.snap.Pending
	if pending == nil {
		return nil
	}
	ts.frozen = true
	w.mu.Lock()
	done := w.ackedPending == pending.Number
	w.mu.Unlock()
	ref, ok := w.memberRef()
	if done || !ok || w.isFenced() {
		return nil
	}
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	if err := w.reg.AckFreeze(qctx, ref, pending.Number); err != nil {
		return fmt.Errorf("acknowledge freeze of epoch %d: %w", pending.Number, err)
	}
	w.mu.Lock()
	w.ackedPending = pending.Number
	w.mu.Unlock()
	w.log.Info("Froze for pending epoch", "epoch", pending.Number)
	return nil
}

// place computes this member's units: capped rendezvous placement of the
// active epoch's units over the slots of live, non-draining members, and
// the same placement of the retiring units (which only need a drainer
// when their holder is gone). A member the operator asked to drain places
// nothing on itself, so it hands everything over.
func (w *Worker) place(_ context.Context, ts *tickState) error {
	ts.mine = map[ownership.Unit]bool{}
	active := ts.snap.Active
	me := ts.snap.Member(w.opts.Member)
	ref, ok := w.memberRef()
	if !ok || me == nil || me.Incarnation != ref.Incarnation || !me.Live {
		// The snapshot predates a rejoin, or the lease loop has not
		// caught up with the registry: placing nothing here would hand
		// every unit over.
		return errStaleSnapshot
	}
	if active == nil || me.Slot < 0 || me.Draining {
		return nil
	}
	key := placementKey{epoch: active.Number, slot: me.Slot, slots: fmt.Sprint(ts.snap.PlacementSlots(), ts.snap.Retiring)}
	if w.placed.key == key {
		// Unchanged inputs: placement is a pure function of them.
		ts.mine, ts.drain = w.placed.mine, w.placed.drain
		return nil
	}
	var slots []ownership.Slot
	for _, s := range ts.snap.PlacementSlots() {
		slots = append(slots, ownership.Slot(s))
	}
	topo := ownership.Topology{Partitions: active.Partitions, Shards: active.Shards}
	for _, u := range ownership.Place(topo.Units(), slots).UnitsOf(ownership.Slot(me.Slot)) {
		ts.mine[u] = true
	}
	var retiring []ownership.Unit
	for _, name := range ts.snap.Retiring {
		if u, err := ownership.ParseUnit(name); err == nil && !topo.Contains(u) {
			retiring = append(retiring, u)
		}
	}
	if len(retiring) > 0 {
		ts.drain = ownership.Place(retiring, slots).UnitsOf(ownership.Slot(me.Slot))
	}
	w.placed = placedCache{key: key, mine: ts.mine, drain: ts.drain}
	return nil
}

// placementKey is everything placement depends on: the active epoch (and
// so N and V), this member's slot, every placement slot and the retiring
// set.
type placementKey struct {
	epoch int64
	slot  int
	slots string
}

// placedCache keeps the last placement so a tick whose inputs did not
// change skips recomputing it (hundreds of milliseconds at 65536 units over
// 1024 members). Only the tick goroutine touches it, and its maps are never
// written after place returns.
type placedCache struct {
	key   placementKey
	mine  map[ownership.Unit]bool
	drain []ownership.Unit
}

// handOver gives up every held unit this member should no longer own:
// stop fetching, let delivered rows settle (bounded), UNPIN, release, all
// units in parallel and every release in one statement. A unit that left
// the topology keeps being delivered until its consumer is drained.
func (w *Worker) handOver(ctx context.Context, ts *tickState) error {
	var releasing, leaving, ready []ownership.Unit
	w.mu.Lock()
	for u, h := range w.held {
		switch {
		case h.releasing:
			// A release that failed is finished before anything else.
			releasing = append(releasing, u)
		case !ts.mine[u]:
			leaving = append(leaving, u)
		}
	}
	w.mu.Unlock()
	for _, u := range leaving {
		if !w.retiringWithRows(ctx, ts, u) {
			ready = append(ready, u)
		} // else keep delivering until the removed unit is drained
	}
	return w.handOverUnits(ctx, append(releasing, ready...))
}

// retiringWithRows reports whether u left the topology (an N or V
// decrease) and its consumer still holds rows. Its holder keeps delivering
// it until it is drained, and only then releases it for the operator to
// retire (design.md section 8). A unit whose consumer cannot be read
// counts as holding rows.
func (w *Worker) retiringWithRows(ctx context.Context, ts *tickState, u ownership.Unit) bool {
	a := ts.snap.Active
	if a == nil || (ownership.Topology{Partitions: a.Partitions, Shards: a.Shards}).Contains(u) {
		return false
	}
	return w.consumerHoldsRows(ctx, u)
}

// consumerHoldsRows reports whether u's consumer has rows pending or
// awaiting an ack; an unreadable consumer counts as holding rows, a
// missing one as empty.
func (w *Worker) consumerHoldsRows(ctx context.Context, u ownership.Unit) bool {
	ref := w.consumerRef(u)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := w.js.Consumer(rctx, ref.Stream, ref.Name)
	if err != nil {
		return !errors.Is(err, jetstream.ErrConsumerNotFound)
	}
	info := c.CachedInfo()
	return info.NumPending > 0 || info.NumAckPending > 0
}

// claim takes, in one registry call (ClaimBatch units per call when set),
// every unit placed here that this member does not hold, plus the retiring units placed here that nobody
// drains, unless claims are frozen or the member is fenced. Adoptions and
// re-homes are takeovers: their pullers lift the old pin (and RESET when
// the census allows) before pulling.
func (w *Worker) claim(ctx context.Context, ts *tickState) error {
	active := ts.snap.Active
	ref, ok := w.memberRef()
	if ts.frozen || active == nil || !ok || w.isFenced() {
		return nil
	}
	units := w.wanted(ts.mine)
	for _, u := range w.wanted(unitSet(ts.drain)) {
		if w.consumerHoldsRows(ctx, u) {
			units = append(units, u)
		}
	}
	if len(units) == 0 {
		return nil
	}
	names := make([]string, len(units))
	for i, u := range units {
		names[i] = u.String()
	}
	var errs []error
	for _, batch := range inBatches(names, w.opts.ClaimBatch) {
		outs, err := w.claimUnits(ctx, ref, active.Number, batch)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		errs = append(errs, w.takeGranted(outs, active.Number)...)
	}
	return errors.Join(errs...)
}

// claimUnits is one registry call claiming names under the active epoch.
func (w *Worker) claimUnits(ctx context.Context, ref poolctl.MemberRef, under int64, names []string) ([]poolctl.ClaimOutcome, error) {
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	outs, err := w.reg.ClaimMany(qctx, ref, under, names)
	if err != nil {
		return nil, fmt.Errorf("claim %d units: %w", len(names), err)
	}
	return outs, nil
}

// takeGranted starts delivering every unit the registry granted and
// returns the refusals worth reporting.
func (w *Worker) takeGranted(outs []poolctl.ClaimOutcome, under int64) []error {
	var errs []error
	for _, o := range outs {
		switch {
		case errors.Is(o.Err, poolctl.ErrHeld):
			// Its owner is live, within P5's grace, or an earlier
			// incarnation of ours is within the same-name grace.
		case o.Err != nil:
			errs = append(errs, fmt.Errorf("claim %s: %w", o.Unit, o.Err))
		default:
			w.took(o.Claim, under)
		}
	}
	return errs
}

// inBatches splits xs into runs of at most size; size 0 keeps xs whole.
func inBatches[T any](xs []T, size int) [][]T {
	if size <= 0 || size >= len(xs) {
		return [][]T{xs}
	}
	out := make([][]T, 0, (len(xs)+size-1)/size)
	for len(xs) > 0 {
		n := min(size, len(xs))
		out = append(out, xs[:n])
		xs = xs[n:]
	}
	return out
}

// took records a claim the registry granted and starts its delivery.
func (w *Worker) took(c poolctl.Claim, under int64) {
	u, err := ownership.ParseUnit(c.Unit)
	if err != nil {
		return
	}
	h := &holding{token: c.Token, under: under}
	if c.Adopted || c.Rehomed {
		h.takeover, h.from = true, c.From
	}
	w.mu.Lock()
	if old := w.held[u]; old != nil && old.token == c.Token {
		// The lease loop's confirmation re-homed it meanwhile and its
		// puller runs: a second holding would start a second puller.
		w.mu.Unlock()
		return
	}
	w.held[u] = h
	w.mu.Unlock()
	w.startDelivery(u)
}

// wanted lists, in unit order, the units of set this member does not hold.
func (w *Worker) wanted(set map[ownership.Unit]bool) []ownership.Unit {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []ownership.Unit
	for u := range set {
		if w.held[u] == nil {
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool { return ownership.CompareUnits(out[i], out[j]) < 0 })
	return out
}

func unitSet(us []ownership.Unit) map[ownership.Unit]bool {
	out := make(map[ownership.Unit]bool, len(us))
	for _, u := range us {
		out[u] = true
	}
	return out
}
