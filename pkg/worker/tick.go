package worker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// tickState is what one tick learned, passed from step to step.
type tickState struct {
	snap poolctl.Snapshot
	// mine is this member's placement under the active epoch.
	mine map[ownership.Unit]bool
	// frozen: a new epoch is pending, so nothing is claimed (P2).
	frozen bool
}

// tickSteps run in order each renew interval; a failing step ends the tick
// and the next tick starts again from the top.
var tickSteps = []struct {
	name string
	run  func(w *Worker, ctx context.Context, ts *tickState) error
}{
	{"Renew", (*Worker).renew},
	{"Snapshot", (*Worker).snapshot},
	{"Freeze", (*Worker).freeze},
	{"Place", (*Worker).place},
	{"HandOver", (*Worker).handOver},
	{"Claim", (*Worker).claim},
}

func (w *Worker) tick(ctx context.Context) error {
	var ts tickState
	for _, st := range tickSteps {
		if err := st.run(w, ctx, &ts); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
	}
	w.mu.Lock()
	w.lastTick = ts
	w.metrics.unitsHeld.Set(float64(len(w.held)))
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
// active epoch's units over the slots of live, non-draining members. A
// member the operator asked to drain places nothing on itself, so it hands
// everything over.
func (w *Worker) place(_ context.Context, ts *tickState) error {
	ts.mine = map[ownership.Unit]bool{}
	active := ts.snap.Active
	me := ts.snap.Member(w.opts.Member)
	ref, ok := w.memberRef()
	if active == nil || me == nil || !ok || !me.Live || me.Incarnation != ref.Incarnation || me.Slot < 0 || me.Draining {
		return nil
	}
	key := placementKey{epoch: active.Number, slot: me.Slot, slots: fmt.Sprint(ts.snap.PlacementSlots())}
	if w.placed.key == key {
		ts.mine = w.placed.mine // unchanged inputs: placement is a pure function of them
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
	w.placed = placedCache{key: key, mine: ts.mine}
	return nil
}

// placementKey is everything placement depends on: the active epoch (and
// so N and V), this member's slot and every placement slot.
type placementKey struct {
	epoch int64
	slot  int
	slots string
}

// placedCache keeps the last placement so a tick whose inputs did not
// change skips recomputing it (hundreds of milliseconds at 65536 units over
// 1024 members). Only the tick goroutine touches it, and ts.mine is never
// written after place returns.
type placedCache struct {
	key  placementKey
	mine map[ownership.Unit]bool
}

// handOver gives up, in parallel, every held unit this member should no
// longer own: stop fetching, let delivered rows settle (bounded), UNPIN,
// release.
func (w *Worker) handOver(ctx context.Context, ts *tickState) error {
	if w.isFenced() {
		return nil // what we hold is unknown until recover confirms it
	}
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
// decrease) and its consumer still holds rows. Nobody else will claim such
// a unit, so its holder keeps delivering until it is drained, and only then
// releases it for the operator to retire (design.md section 8). A unit
// whose consumer cannot be read counts as holding rows.
func (w *Worker) retiringWithRows(ctx context.Context, ts *tickState, u ownership.Unit) bool {
	a := ts.snap.Active
	if a == nil || (ownership.Topology{Partitions: a.Partitions, Shards: a.Shards}).Contains(u) {
		return false
	}
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

func (w *Worker) handOverUnits(ctx context.Context, units []ownership.Unit) error {
	var wg sync.WaitGroup
	errs := make([]error, len(units))
	for i, u := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.handOverUnit(ctx, u)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (w *Worker) handOverUnit(ctx context.Context, u ownership.Unit) error {
	start := time.Now()
	w.mu.Lock()
	h := w.held[u]
	if h == nil {
		w.mu.Unlock()
		return nil
	}
	p := h.puller
	h.puller = nil
	w.mu.Unlock()

	if p != nil && !p.drain(w.opts.DrainTimeout) {
		w.log.Info("Drain timed out; unsettled rows nak'd for the next owner", "unit", u.String())
	}
	w.mu.Lock()
	h.releasing = true
	w.mu.Unlock()
	w.unpin(ctx, u)
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	err := w.reg.Release(qctx, h.token)
	if err != nil && !errors.Is(err, poolctl.ErrStaleEpoch) {
		return fmt.Errorf("release %s: %w", u, err)
	}
	w.mu.Lock()
	if w.held[u] == h {
		delete(w.held, u)
	}
	w.mu.Unlock()
	w.metrics.handoverSeconds.Observe(time.Since(start).Seconds())
	w.log.V(1).Info("Handed over", "unit", u.String(), "epoch", h.token.Epoch)
	return nil
}

// claim takes every unit placed here that this member does not hold,
// unless claims are frozen or the member is fenced.
func (w *Worker) claim(ctx context.Context, ts *tickState) error {
	active := ts.snap.Active
	ref, ok := w.memberRef()
	if ts.frozen || active == nil || !ok || w.isFenced() {
		return nil
	}
	for _, u := range w.wanted(ts.mine) {
		qctx, cancel := w.queryCtx(ctx)
		c, err := w.reg.Claim(qctx, ref, active.Number, u.String())
		cancel()
		switch {
		case errors.Is(err, poolctl.ErrHeld):
			continue // its owner is live, or within P5's grace
		case err != nil:
			return fmt.Errorf("claim %s: %w", u, err)
		}
		if c.Adopted {
			w.takeOver(ctx, u, c, ts.snap.Reset)
		}
		w.mu.Lock()
		w.held[u] = &holding{token: c.Token}
		w.mu.Unlock()
		w.setPuller(u, c.Token)
	}
	return nil
}

// wanted lists, in unit order, placed units this member does not hold.
func (w *Worker) wanted(mine map[ownership.Unit]bool) []ownership.Unit {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []ownership.Unit
	for u := range mine {
		if w.held[u] == nil {
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool { return ownership.CompareUnits(out[i], out[j]) < 0 })
	return out
}

// takeOver prepares an adopted unit's consumer: the dead owner's pin is
// lifted, and when the operator's census allows it (P4) the consumer is
// RESET to its ack floor so unacked rows come back now, not after ack
// wait.
func (w *Worker) takeOver(ctx context.Context, u ownership.Unit, c poolctl.Claim, perm poolctl.ResetPermission) {
	w.unpin(ctx, u)
	reason := resetBlockReason(perm, w.opts.MaxCensusAge)
	if reason != "" {
		w.metrics.takeovers.WithLabelValues(reason).Inc()
		w.log.Info("Takeover without RESET; unacked rows return after ack wait", "unit", u.String(), "from", c.From, "reason", reason)
		return
	}
	ref := w.consumerRef(u)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.js.ResetConsumer(rctx, ref.Stream, ref.Name); err != nil {
		w.metrics.takeovers.WithLabelValues("reset_failed").Inc()
		w.log.Info("RESET failed; unacked rows return after ack wait", "unit", u.String(), "error", err.Error())
		return
	}
	w.metrics.takeovers.WithLabelValues("reset").Inc()
	w.log.Info("Took over with RESET", "unit", u.String(), "from", c.From, "epoch", c.Epoch)
}

// resetBlockReason is "" when the published census verdict allows RESET,
// else a metric-friendly reason.
func resetBlockReason(p poolctl.ResetPermission, maxAge time.Duration) string {
	switch {
	case !p.Published:
		return "no_census"
	case !p.Allowed:
		return "below_floor"
	case p.CensusAge > maxAge:
		return "census_stale"
	default:
		return ""
	}
}

// unpin lifts the unit's pinned client so the next owner's pulls are
// served at once. UNPIN needs 2.11, which the version floor guarantees; a
// failure only delays the next owner until the pin times out.
func (w *Worker) unpin(ctx context.Context, u ownership.Unit) {
	ref := w.consumerRef(u)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := w.js.Stream(rctx, ref.Stream)
	if err == nil {
		err = s.UnpinConsumer(rctx, ref.Name, natsops.PriorityGroup)
	}
	if err != nil {
		w.log.V(1).Info("UNPIN failed", "unit", u.String(), "error", err.Error())
	}
}

func (w *Worker) consumerRef(u ownership.Unit) natsops.ConsumerRef {
	return w.layout.ConsumerRef(natsops.Unit{Partition: u.Partition, Shard: u.Shard})
}

// setPuller starts delivery of u under t, if u is still held under t.
func (w *Worker) setPuller(u ownership.Unit, t poolctl.Token) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.held[u]
	if h == nil || h.token != t || h.puller != nil || w.fenced {
		return
	}
	h.puller = w.startPuller(u, t)
}

// detachPullers takes every running puller out of the held set; the caller
// stops them after releasing w.mu (pullers take it to check their claim).
func (w *Worker) detachPullers() []*puller {
	var out []*puller
	for _, h := range w.held {
		if h.puller != nil {
			out = append(out, h.puller)
			h.puller = nil
		}
	}
	return out
}

// shutdown hands every unit over and leaves, bounded by the drain timeout
// plus a few registry round trips.
func (w *Worker) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), w.opts.DrainTimeout+10*time.Second)
	defer cancel()
	w.mu.Lock()
	var units []ownership.Unit
	for u := range w.held {
		units = append(units, u)
	}
	fenced := w.fenced
	w.mu.Unlock()
	w.log.Info("Shutting down: handing over", "units", len(units))
	if fenced {
		// A fenced member must not touch its units; the registry lets
		// others adopt them under P5.
		return fmt.Errorf("shut down while fenced; %d units left to takeover", len(units))
	}
	if err := w.handOverUnits(ctx, units); err != nil {
		return fmt.Errorf("hand over on shutdown: %w", err)
	}
	ref, ok := w.memberRef()
	if !ok {
		return nil
	}
	qctx, qcancel := w.queryCtx(ctx)
	defer qcancel()
	if err := w.reg.Leave(qctx, ref); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	w.log.Info("Left the fleet")
	return nil
}
