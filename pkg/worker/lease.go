package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// leaseLoop owns the lease: it joins, renews on the registry's schedule,
// records local fences in the registry, confirms claims after a fence or
// a rejoin, and reports what the member's pullers are doing. It is the
// only goroutine that calls Join, Renew, Fence, Unfence and ConfirmOwned,
// so they reach the registry in the order they were decided, and it runs
// apart from the tick so that nothing a tick waits on (drains, claims,
// UNPIN, RESET) can delay a renewal (P5 liveness).
func (w *Worker) leaseLoop(ctx context.Context) {
	b := newBackoff(100*time.Millisecond, 2*time.Second)
	for ctx.Err() == nil {
		err := w.leaseStep(ctx)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Info("Lease step failed", "error", err.Error())
			}
			b.max = w.retryCap()
			b.wait(ctx, w.wakeLease)
			continue
		}
		b.reset()
		w.sleepUntilRenewDue(ctx)
	}
}

// retryCap bounds the wait between failed lease steps by half the renew
// interval: when the registry comes back, every member whose lease lapsed
// rejoins within half a renew interval plus one query, inside the grace
// (P5: at least a renew interval plus a query) during which the first one
// back may not adopt yet. With a longer wait, the first member back took
// over the units of members still waiting out their backoff, and the
// units did not return to their owners.
func (w *Worker) retryCap() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r := w.params.RenewInterval; r > 0 {
		return min(2*time.Second, max(50*time.Millisecond, r/2))
	}
	return 2 * time.Second
}

// leaseStep does what the lease needs now: join when there is no lease,
// else record a pending fence and renew when due.
func (w *Worker) leaseStep(ctx context.Context) error {
	if _, ok := w.memberRef(); !ok {
		return w.join(ctx)
	}
	w.recordFence(ctx)
	if !w.renewDue() {
		return nil
	}
	return w.renew(ctx)
}

// sleepUntilRenewDue waits until the next renewal is due, a fence asks
// for the lease loop, or ctx ends.
func (w *Worker) sleepUntilRenewDue(ctx context.Context) {
	w.mu.Lock()
	wait := time.Second
	if w.params.RenewInterval > 0 && !w.fenced {
		wait = time.Until(w.renewedAt.Add(w.params.RenewInterval * 9 / 10))
	}
	if w.fenced {
		// Fenced: try to recover as soon as the registry answers again.
		wait = min(wait, 100*time.Millisecond)
	}
	w.mu.Unlock()
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-w.wakeLease:
	case <-t.C:
	}
}

// join starts a new incarnation and confirms what the earlier one held.
// Claims of an earlier incarnation stay the member's in the registry
// until ConfirmOwned (or a Claim, after the same-name grace) re-homes
// them.
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
	w.fenceSent = 0    // the new incarnation starts unfenced in the registry
	w.params = l.Params
	w.mu.Unlock()
	w.setLease(l, sent)
	w.log.Info("Joined", "incarnation", l.Incarnation, "slot", l.Slot)
	w.metrics.joins.Inc()
	return w.recover(ctx, true)
}

// renew extends the lease. A lost lease means fence (if not already) and
// join again; any other failure leaves the watchdog to fence on time.
func (w *Worker) renew(ctx context.Context) error {
	ref, _ := w.memberRef()
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	sent := time.Now()
	l, err := w.reg.Renew(qctx, ref)
	switch {
	case err == nil:
		w.setLease(l, sent)
		if w.localFence() {
			return w.recover(ctx, false)
		}
		if w.waitingForEarlierIncarnation() {
			if err := w.confirm(ctx); err != nil {
				return err
			}
		}
		w.reportActivity(ctx, ref)
		return nil
	case isLeaseLost(err):
		w.fence("lease lost")
		w.dropLease()
		return nil // the next step joins
	default:
		w.metrics.renewFailures.Inc()
		return fmt.Errorf("renew: %w", err)
	}
}

// renewDue reports whether the next renewal should go out now: a little
// early rather than late, so renewals are never further apart than the
// renew interval the registry's grace is sized for (P5).
func (w *Worker) renewDue() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	interval := w.params.RenewInterval
	if interval <= 0 || w.fenced {
		return true
	}
	return time.Since(w.renewedAt) >= interval-interval/10
}

// setLease records a lease granted by a request sent at sent, and arms the
// self-fence for sent + TTL - margin on this process's monotonic clock.
// The registry counts the TTL from when it ran the request, which is no
// earlier than sent, so the fence always comes first (P5). The margin is
// known from the first lease on: the lease carries the parameters.
func (w *Worker) setLease(l poolctl.Lease, sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.Params.QueryBound > 0 {
		w.params = l.Params
		w.applySettingsLocked(l.Params.Worker)
	}
	margin := w.opts.FenceMargin
	if margin == 0 {
		margin = w.params.QueryBound
	}
	w.lease = &l
	w.renewedAt = sent
	w.fenceAt = sent.Add(l.TTL - margin)
	w.fenceDue = w.fenceAt.Sub(processStart)
	if w.watchdog == nil {
		w.watchdog = time.AfterFunc(time.Until(w.fenceAt), w.onWatchdog)
	} else {
		w.watchdog.Reset(time.Until(w.fenceAt))
	}
}

// applySettingsLocked takes the spec's naming and drain timeout from the
// registry; a value it does not carry keeps the option's. The naming is
// immutable in the API, so it only changes from the option's default to
// the spec's before the first puller starts. Callers hold w.mu.
func (w *Worker) applySettingsLocked(s poolctl.WorkerSettings) {
	if s.SubjectPrefix != "" {
		w.layout.SubjectPrefix = s.SubjectPrefix
	}
	if s.ConsumerName != "" {
		w.layout.ConsumerName = s.ConsumerName
	}
	if s.DrainTimeout > 0 {
		w.drain = s.DrainTimeout
	}
}

// dropLease forgets a lease the registry will not renew.
func (w *Worker) dropLease() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lease = nil
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

// localFence reports whether the member has fenced itself.
func (w *Worker) localFence() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fenced
}

// fence stops every puller at once: no row is delivered or settled until
// the fence lifts (P1, P5). Claims stay recorded; recover confirms them.
// The registry hears of it from the lease loop, under a new fence
// generation, so a Fence that arrives late cannot undo a later Unfence.
func (w *Worker) fence(reason string) {
	w.mu.Lock()
	if w.fenced {
		w.mu.Unlock()
		return
	}
	w.fenced = true
	w.fenceGen++
	w.fencedSince = time.Now()
	pullers := w.detachPullers()
	w.mu.Unlock()

	w.log.Info("Fenced", "reason", reason, "units", len(pullers))
	w.metrics.fences.Inc()
	w.metrics.fenced.Set(1)
	for _, p := range pullers {
		p.stop()
	}
	w.markWithheld(pullers)
	select {
	case w.wakeLease <- struct{}{}:
	default:
	}
}

// markWithheld flags units whose stopped pullers withheld rows: the next
// puller RESETs them (when the census allows), so those rows come back at
// once instead of after ack wait.
func (w *Worker) markWithheld(pullers []*puller) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range pullers {
		if h := w.held[p.unit]; h != nil && h.token == p.token && p.withheld.Load() > 0 {
			h.takeover = true
		}
	}
}

// recordFence tells the registry about a local fence it has not heard of,
// best effort: recover records it again before lifting it.
func (w *Worker) recordFence(ctx context.Context) {
	w.mu.Lock()
	gen, sent, ok := w.fenceGen, w.fenceSent, w.lease != nil && w.fenced
	ref := poolctl.MemberRef{}
	if w.lease != nil {
		ref = w.lease.MemberRef
	}
	w.mu.Unlock()
	if !ok || gen <= sent {
		return
	}
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	if err := w.reg.Fence(qctx, ref, gen); err != nil {
		w.log.V(1).Info("Recording the fence failed", "error", err.Error())
		return
	}
	w.mu.Lock()
	w.fenceSent = max(w.fenceSent, gen)
	w.mu.Unlock()
}

// recover confirms every claim in one statement after a join or after a
// renewal that found the member fenced, records the fence and lifts it in
// the registry (so P5's grace applies before the member adopts anything),
// restarts delivery of what is still ours and forgets what moved.
func (w *Worker) recover(ctx context.Context, joined bool) error {
	return w.confirmClaims(ctx, func(qctx context.Context, ref poolctl.MemberRef, gen int64) error {
		if !joined {
			if err := w.reg.Fence(qctx, ref, gen); err != nil {
				return fmt.Errorf("record fence: %w", err)
			}
		}
		if err := w.reg.Unfence(qctx, ref, gen); err != nil {
			return fmt.Errorf("lift fence: %w", err)
		}
		return nil
	})
}

// confirm confirms the claims again, outside a fence: the units an
// earlier incarnation of this member held come home once its lease and the
// grace have passed (the same-name grace), and the tick then keeps or
// hands them over like any other.
func (w *Worker) confirm(ctx context.Context) error {
	return w.confirmClaims(ctx, nil)
}

// confirmClaims confirms the claims this incarnation expects in one
// statement, runs between (if any) before acting on the answer, and then
// adopts what the registry confirmed.
func (w *Worker) confirmClaims(ctx context.Context, between func(context.Context, poolctl.MemberRef, int64) error) error {
	ref, _ := w.memberRef()
	w.mu.Lock()
	gen := w.fenceGen
	w.mu.Unlock()
	expected := w.expectedClaims()
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	conf, err := w.reg.ConfirmOwned(qctx, ref, expected)
	if err != nil {
		return fmt.Errorf("confirm %d claims: %w", len(expected), err)
	}
	w.noteWaiting(conf.Waiting)
	if between != nil {
		if err := between(qctx, ref, gen); err != nil {
			return err
		}
	}
	w.adoptConfirmation(conf, gen, expected)
	return nil
}

// noteWaiting records how many units still wait for the same-name grace.
func (w *Worker) noteWaiting(units []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting = len(units)
}

// waitingForEarlierIncarnation reports whether units of an earlier
// incarnation still wait to come home.
func (w *Worker) waitingForEarlierIncarnation() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waiting > 0
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
// and resumes delivery under the confirmed tokens. A unit whose token did
// not change keeps its running puller; one whose epoch moved (re-homed from
// an earlier incarnation) is a takeover from that process: its pin and
// unacked rows are lifted before the first pull. A unit with a handover
// intent gets no puller; the next tick releases it. The fence lifts only
// if no newer one began meanwhile (gen).
func (w *Worker) adoptConfirmation(conf poolctl.Confirmation, gen int64, expected map[string]int64) {
	handover := map[string]bool{}
	for _, u := range conf.Handover {
		handover[u] = true
	}
	w.mu.Lock()
	held := make(map[ownership.Unit]*holding, len(conf.Held))
	for name, t := range conf.Held {
		u, err := ownership.ParseUnit(name)
		if err != nil {
			continue
		}
		old := w.held[u]
		switch {
		case old != nil && old.token == t && !handover[name]:
			held[u] = old // keeps its puller, if any, and its takeover flag
			continue
		case old != nil && old.token == t:
			held[u] = &holding{token: t, under: old.under, releasing: true, puller: old.puller}
			old.puller = nil
			continue
		}
		h := &holding{token: t, releasing: handover[name]}
		if exp, ok := expected[name]; !ok || exp != t.Epoch {
			h.takeover, h.from = true, w.opts.Member+" (earlier incarnation)"
		}
		held[u] = h
	}
	var stale []*puller
	for u, h := range w.held {
		if h.puller != nil && held[u] != h {
			stale = append(stale, h.puller)
			h.puller = nil
		}
	}
	w.held = held
	lifted := w.fenceGen == gen
	if lifted && w.fenced {
		w.fenced = false
		if !w.fencedSince.IsZero() {
			w.metrics.fencedSeconds.Add(time.Since(w.fencedSince).Seconds())
			w.fencedSince = time.Time{}
		}
	}
	w.mu.Unlock()
	for _, p := range stale {
		p.stop()
	}
	w.stopHandedOver(held)
	if !lifted {
		return // fenced again meanwhile: the next renewal recovers
	}
	w.metrics.fenced.Set(0)
	for u := range held {
		w.startDelivery(u)
	}
	w.log.Info("Claims confirmed", "held", len(conf.Held), "moved", len(conf.Moved), "handover", len(conf.Handover),
		"waiting", len(conf.Waiting))
}

// stopHandedOver stops the pullers of units the registry shows in
// handover: the member gave them up while its old puller still ran.
func (w *Worker) stopHandedOver(held map[ownership.Unit]*holding) {
	var ps []*puller
	w.mu.Lock()
	for _, h := range held {
		if h.releasing && h.puller != nil {
			ps = append(ps, h.puller)
			h.puller = nil
		}
	}
	w.mu.Unlock()
	for _, p := range ps {
		p.stop()
	}
}

// reportActivity tells the registry, for each unit with a puller, when it
// last pulled and last received a row, so the operator can see units
// pulled twice or owned without rows flowing (P7). Best effort.
func (w *Worker) reportActivity(ctx context.Context, ref poolctl.MemberRef) {
	now := time.Now()
	w.mu.Lock()
	acts := make([]poolctl.UnitActivity, 0, len(w.held))
	for u, h := range w.held {
		if h.puller == nil || h.releasing {
			continue
		}
		acts = append(acts, poolctl.UnitActivity{Unit: u.String(), Epoch: h.token.Epoch,
			SinceFetch: h.puller.since(&h.puller.lastFetch, now), SinceRows: h.puller.since(&h.puller.lastRows, now)})
	}
	w.mu.Unlock()
	qctx, cancel := w.queryCtx(ctx)
	defer cancel()
	if err := w.reg.ReportActivity(qctx, ref, acts); err != nil {
		w.log.V(1).Info("Activity report failed", "error", err.Error())
	}
}
