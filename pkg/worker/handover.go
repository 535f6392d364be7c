package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// handOverUnits hands units over: every puller drains in parallel
// (bounded by the drain timeout), every consumer is UNPINned with bounded
// concurrency, and every release goes out in one statement (ClaimBatch
// per statement when set).
func (w *Worker) handOverUnits(ctx context.Context, units []ownership.Unit) error {
	if len(units) == 0 {
		return nil
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, u := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.stopForHandover(u)
		}()
	}
	wg.Wait()
	w.forEachBounded(units, func(u ownership.Unit) { w.unpin(ctx, u) })

	var tokens []poolctl.Token
	w.mu.Lock()
	for _, u := range units {
		if h := w.held[u]; h != nil {
			tokens = append(tokens, h.token)
		}
	}
	w.mu.Unlock()
	if len(tokens) == 0 {
		return nil
	}
	return w.release(ctx, tokens, start)
}

// release gives tokens up, all in one registry call (ClaimBatch per call
// when set), and forgets each one the registry released or that was no
// longer this member's. start is when the handover began, for the metric.
func (w *Worker) release(ctx context.Context, tokens []poolctl.Token, start time.Time) error {
	var failed []error
	for _, batch := range inBatches(tokens, w.opts.ClaimBatch) {
		qctx, cancel := w.queryCtx(ctx)
		errs, err := w.reg.ReleaseMany(qctx, batch)
		cancel()
		if err != nil {
			return errors.Join(append(failed, fmt.Errorf("release %d units: %w", len(batch), err))...)
		}
		for i, t := range batch {
			if errs[i] != nil && !errors.Is(errs[i], poolctl.ErrStaleEpoch) {
				failed = append(failed, fmt.Errorf("release %s: %w", t.Unit, errs[i]))
				continue
			}
			w.forget(t)
			w.metrics.handoverSeconds.Observe(time.Since(start).Seconds())
			w.log.V(1).Info("Handed over", "unit", t.Unit, "epoch", t.Epoch)
		}
	}
	return errors.Join(failed...)
}

// stopForHandover stops u's delivery: its puller drains (stop fetching,
// let delivered rows settle, nak the rest at the drain timeout), and the
// unit stops counting as this member's before the release is sent.
func (w *Worker) stopForHandover(u ownership.Unit) {
	w.mu.Lock()
	h := w.held[u]
	if h == nil {
		w.mu.Unlock()
		return
	}
	p := h.puller
	h.puller = nil
	w.mu.Unlock()
	if p != nil && !p.drain(w.drainTimeout()) {
		w.log.Info("Drain timed out; unsettled rows nak'd for the next owner", "unit", u.String())
	}
	w.mu.Lock()
	h.releasing = true
	w.mu.Unlock()
}

// forget drops a released claim.
func (w *Worker) forget(t poolctl.Token) {
	u, err := ownership.ParseUnit(t.Unit)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if h := w.held[u]; h != nil && h.token == t {
		delete(w.held, u)
	}
}

// forEachBounded runs f for every unit in parallel, and returns when all
// are done. It shares the takeover slots with the pullers' first UNPIN and
// RESET, so TakeoverConcurrency bounds every such request in flight, not
// each path's own: a tick that hands units over while new holders start
// never doubles the load on the servers.
func (w *Worker) forEachBounded(units []ownership.Unit, f func(ownership.Unit)) {
	slots := w.takeoverSlots()
	var wg sync.WaitGroup
	for _, u := range units {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			f(u)
		}()
	}
	wg.Wait()
}

// shutdown hands every unit over and leaves, bounded by the drain timeout
// plus a few registry round trips. The lease loop keeps renewing until the
// units are handed over. A unit that left the topology and still holds rows is first
// delivered until drained (at most the drain timeout); what is left then
// is released anyway: it is in the retiring set, where another member
// claims it to drain it.
func (w *Worker) shutdown(stopLease func()) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.drainTimeout()+10*time.Second)
	defer cancel()
	if w.isFenced() {
		// A fenced member must not touch its units; the registry lets
		// others adopt them under P5.
		return fmt.Errorf("shut down while fenced; %d units left to takeover", len(w.heldUnits()))
	}
	w.log.Info("Shutting down: handing over", "units", len(w.heldUnits()))
	w.drainLeaving(ctx)
	if err := w.handOverUnits(ctx, w.heldUnits()); err != nil {
		return fmt.Errorf("hand over on shutdown: %w", err)
	}
	// No renewal may follow the leave: the lease loop would take the
	// refusal for a lost lease and join again.
	stopLease()
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

// drainLeaving keeps delivering the held units that left the topology
// until their consumers are empty or the drain timeout passes.
func (w *Worker) drainLeaving(ctx context.Context) {
	qctx, cancel := w.queryCtx(ctx)
	snap, err := w.reg.Snapshot(qctx, w.opts.Topology)
	cancel()
	if err != nil || snap.Active == nil {
		return
	}
	ts := &tickState{snap: snap}
	deadline := time.Now().Add(w.drainTimeout())
	for time.Now().Before(deadline) && ctx.Err() == nil {
		busy := false
		for _, u := range w.heldUnits() {
			if w.retiringWithRows(ctx, ts, u) {
				busy = true
				break
			}
		}
		if !busy {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// heldUnits lists the units held now.
func (w *Worker) heldUnits() []ownership.Unit {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]ownership.Unit, 0, len(w.held))
	for u := range w.held {
		out = append(out, u)
	}
	return out
}

// drainTimeout bounds a handover's wait for delivered rows: the registry's
// setting, or the option's until it arrives.
func (w *Worker) drainTimeout() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drain
}
