package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// join starts a new incarnation. Claims of the old one stay ours in the
// registry until ConfirmOwned re-homes them, so recover runs next.
func (w *Worker) join(ctx context.Context) error {
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	sent := time.Now()
	l, err := w.reg.Join(qctx, w.opts.Topology, w.opts.Member)
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	w.mu.Lock()
	w.ackedPending = 0 // acknowledgements belong to an incarnation
	w.mu.Unlock()
	w.setLease(l, sent)
	w.log.Info("Joined", "incarnation", l.Incarnation, "slot", l.Slot)
	w.metrics.joins.Inc()
	return w.recover(ctx, true)
}

// renew extends the lease when it is due. A lost lease means fence (if
// not already) and join again; any other failure leaves the watchdog to
// fence on time.
func (w *Worker) renew(ctx context.Context, _ *tickState) error {
	ref, ok := w.memberRef()
	if !ok {
		return w.join(ctx)
	}
	if !w.renewDue() {
		return nil
	}
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	sent := time.Now()
	l, err := w.reg.Renew(qctx, ref)
	switch {
	case err == nil:
		w.setLease(l, sent)
		if w.isFenced() {
			return w.recover(ctx, false)
		}
		return nil
	case isLeaseLost(err):
		w.fence("lease lost")
		return w.join(ctx)
	default:
		w.metrics.renewFailures.Inc()
		return fmt.Errorf("renew: %w", err)
	}
}

// renewDue reports whether the next renewal should go out this tick:
// one tick early rather than one tick late, so renewals are never further
// apart than the renew interval the registry's grace is sized for (P5).
func (w *Worker) renewDue() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	interval := w.params.RenewInterval
	if interval <= 0 || w.fenced {
		return true
	}
	return time.Since(w.renewedAt) >= interval-w.opts.TickInterval
}

// setLease records a lease granted by a request sent at sent, and arms the
// self-fence for sent + TTL - margin on this process's monotonic clock.
// The registry counts the TTL from when it ran the request, which is no
// earlier than sent, so the fence always comes first (P5).
func (w *Worker) setLease(l poolctl.Lease, sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	margin := w.opts.FenceMargin
	if margin == 0 {
		margin = w.params.QueryBound
	}
	w.lease = &l
	w.renewedAt = sent
	w.fenceAt = sent.Add(l.TTL - margin)
	if w.watchdog == nil {
		w.watchdog = time.AfterFunc(time.Until(w.fenceAt), w.onWatchdog)
	} else {
		w.watchdog.Reset(time.Until(w.fenceAt))
	}
}

func (w *Worker) onWatchdog() {
	w.mu.Lock()
	due := !time.Now().Before(w.fenceAt)
	w.mu.Unlock()
	if due {
		w.fence("lease not renewed in time")
	}
}

func (w *Worker) stopWatchdog() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watchdog != nil {
		w.watchdog.Stop()
	}
}

func (w *Worker) isFenced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fenced
}

// fence stops every puller at once: no row is delivered or settled until
// the fence lifts (P1, P5). Claims stay recorded; recover confirms them.
func (w *Worker) fence(reason string) {
	w.mu.Lock()
	if w.fenced {
		w.mu.Unlock()
		return
	}
	w.fenced = true
	w.fencedSince = time.Now()
	pullers := w.detachPullers()
	ref := w.lease.MemberRef
	w.mu.Unlock()

	w.log.Info("Fenced", "reason", reason, "units", len(pullers))
	w.metrics.fences.Inc()
	w.metrics.fenced.Set(1)
	for _, p := range pullers {
		p.stop()
	}
	// Tell the registry too, if it can be reached: it then refuses our
	// claims until the fence lifts, and applies the grace after.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = w.reg.Fence(ctx, ref, 0)
	}()
}

// recover confirms every claim in one statement after a join or after a
// renewal that found the member fenced, restarts delivery of what is still
// ours, forgets what moved, and lifts the fence.
func (w *Worker) recover(ctx context.Context, joined bool) error {
	ref, _ := w.memberRef()
	expected := w.expectedClaims()
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	conf, err := w.reg.ConfirmOwned(qctx, ref, expected)
	if err != nil {
		return fmt.Errorf("confirm %d claims: %w", len(expected), err)
	}
	if !joined {
		// The registry saw no lapse, only our own fence: record a lift so
		// P5's grace applies before we adopt anything.
		if err := w.reg.Fence(qctx, ref, 0); err != nil {
			return fmt.Errorf("record fence: %w", err)
		}
	}
	if err := w.reg.Unfence(qctx, ref, 0); err != nil {
		return fmt.Errorf("lift fence: %w", err)
	}
	w.adoptConfirmation(conf)
	return nil
}

func (w *Worker) expectedClaims() map[string]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	exp := make(map[string]int64, len(w.held))
	for u, h := range w.held {
		exp[u.String()] = h.token.Epoch
	}
	return exp
}

// adoptConfirmation replaces the held set with what the registry confirmed
// and resumes delivery under the confirmed tokens.
func (w *Worker) adoptConfirmation(conf poolctl.Confirmation) {
	held := make(map[ownership.Unit]*holding, len(conf.Held))
	for name, t := range conf.Held {
		if u, err := ownership.ParseUnit(name); err == nil {
			held[u] = &holding{token: t}
		}
	}
	w.mu.Lock()
	stale := w.detachPullers()
	w.held = held
	w.fenced = false
	if !w.fencedSince.IsZero() {
		w.metrics.fencedSeconds.Add(time.Since(w.fencedSince).Seconds())
		w.fencedSince = time.Time{}
	}
	w.mu.Unlock()
	for _, p := range stale {
		p.stop()
	}

	w.metrics.fenced.Set(0)
	for u, h := range held {
		w.setPuller(u, h.token)
	}
	w.log.Info("Claims confirmed", "held", len(conf.Held), "moved", len(conf.Moved))
}
