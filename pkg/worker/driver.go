package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/member"
)

// perform does one of the core's actions. It never blocks Run's
// goroutine: registry calls and NATS requests run on goroutines of their
// own and post their outcome back, tagged with the request's id.
func (w *Worker) perform(a member.Action) {
	switch a := a.(type) {
	case member.Publish:
		w.publish(a.Perm)
	case member.Configure:
		w.configure(a)
	case member.Note:
		w.noted(a)
	case member.StartPuller:
		w.startPuller(a)
	case member.DrainPuller:
		if p := w.pullers[a.Puller]; p != nil {
			p.drain(a.Timeout)
		}
	case member.StopPuller:
		if p := w.pullers[a.Puller]; p != nil {
			p.kill()
		}
	case member.Unpin:
		w.async(func() { w.unpinForHandover(a) })
	case member.Probe:
		w.async(func() { w.probe(a) })
	default:
		w.async(func() { w.call(a) })
	}
}

// async runs f on a goroutine Run waits for.
func (w *Worker) async(f func()) {
	w.calls.Add(1)
	go func() {
		defer w.calls.Done()
		f()
	}()
}

// call performs one registry call and posts its reply. A call that times
// out is posted with its error: the core takes its outcome as unknown.
func (w *Worker) call(a member.Action) {
	ctx, cancel := w.queryCtx()
	defer cancel()
	switch a := a.(type) {
	case member.Join:
		l, err := w.reg.Rejoin(ctx, a.Ref, a.Process)
		w.post(member.JoinReply{Req: a.Req, Lease: l, Err: err})
	case member.Renew:
		l, err := w.reg.Renew(ctx, a.Ref)
		w.post(member.RenewReply{Req: a.Req, Lease: l, Err: behind(err)})
	case member.Fence:
		w.post(member.FenceReply{Req: a.Req, Err: w.reg.Fence(ctx, a.Ref, a.Gen)})
	case member.Unfence:
		w.post(member.UnfenceReply{Req: a.Req, Err: w.reg.Unfence(ctx, a.Ref, a.Gen)})
	case member.Confirm:
		c, err := w.reg.ConfirmOwned(ctx, a.Ref, a.Expected)
		w.post(member.ConfirmReply{Req: a.Req, Conf: c, Err: behind(err)})
	case member.ReadSnapshot:
		s, err := w.reg.Snapshot(ctx, a.Topology)
		w.post(member.SnapshotReply{Req: a.Req, Snap: s, Err: err})
	case member.Claim:
		outs, err := w.reg.ClaimMany(ctx, a.Ref, a.Under, a.Units)
		w.post(member.ClaimReply{Req: a.Req, Outcomes: outs, Err: err})
	case member.Release:
		errs, err := w.reg.ReleaseMany(ctx, a.Tokens)
		w.post(member.ReleaseReply{Req: a.Req, Errs: errs, Err: err})
	case member.AckFreeze:
		w.post(member.AckFreezeReply{Req: a.Req, Err: w.reg.AckFreeze(ctx, a.Ref, a.Epoch)})
	case member.Leave:
		w.post(member.LeaveReply{Req: a.Req, Err: w.reg.Leave(ctx, a.Ref)})
	case member.ReportActivity:
		w.post(member.ActivityReply{Req: a.Req, Err: w.reg.ReportActivity(ctx, a.Ref, a.Units)})
	}
}

// behind gives a refusal by a registry that went back in time (the commit
// trigger's SQL error included) the type the core matches, so a renewal
// or a confirmation it refuses fences the member as a lost lease does.
func behind(err error) error {
	if be, ok := poolctl.RegistryBehind(err); ok && !errors.Is(err, poolctl.ErrRegistryBehind) {
		return fmt.Errorf("%w: %w", be, err)
	}
	return err
}

// publish makes p the permission every puller checks.
func (w *Worker) publish(p *member.Permission) {
	w.perm.Store(p)
	w.metrics.unitsHeld.Set(float64(len(p.Units)))
	if p.Fenced {
		w.metrics.fenced.Set(1)
	} else {
		w.metrics.fenced.Set(0)
	}
}

// configure takes the registry's parameters and the spec's settings; a
// setting the registry does not carry keeps the option's.
func (w *Worker) configure(c member.Configure) {
	if c.Params.QueryBound > 0 {
		w.queryBound.Store(int64(c.Params.QueryBound))
	}
	// An idle unit's pull completes only when its wait runs out, and the
	// operator calls a unit whose pulls complete none for three renew
	// intervals stalled: with a wait near or above that, every quiet
	// unit looked stalled.
	wait := w.opts.FetchWait
	if ri := c.Params.RenewInterval; ri > 0 {
		wait = min(wait, ri)
	}
	w.fetchWait.Store(int64(wait))
	s := c.Params.Worker
	if s.DrainTimeout > 0 {
		w.drain.Store(int64(s.DrainTimeout))
	}
	if s.SubjectPrefix == "" && s.ConsumerName == "" {
		return
	}
	l := *w.layout.Load()
	if s.SubjectPrefix != "" {
		l.SubjectPrefix = s.SubjectPrefix
	}
	if s.ConsumerName != "" {
		l.ConsumerName = s.ConsumerName
	}
	w.layout.Store(&l)
}

// noted turns the core's notes into logs and metrics.
func (w *Worker) noted(n member.Note) {
	switch n.Kind {
	case member.NoteJoined:
		w.metrics.joins.Inc()
		w.log.Info("Joined", "incarnation", int64(n.Value))
	case member.NoteFenced:
		w.metrics.fences.Inc()
		w.log.Info("Fenced", "reason", n.Detail, "units", int(n.Value))
	case member.NoteUnfenced:
		w.metrics.fencedSeconds.Add(n.Value)
		w.log.Info("Fence lifted", "fencedSeconds", n.Value)
	case member.NoteRenewFailed:
		w.metrics.renewFailures.Inc()
		w.log.Info("Renewal failed", "error", n.Detail)
	case member.NoteHandedOver:
		w.metrics.handoverSeconds.Observe(n.Value)
		w.log.V(1).Info("Handed over", "unit", n.Unit.String())
	case member.NoteDrainTimeout:
		w.log.Info("Drain timed out; unsettled rows nak'd for the next owner", "unit", n.Unit.String())
	case member.NoteStuckPuller:
		w.log.Info("A puller did not stop in time; its handler ignores its context", "unit", n.Unit.String())
	case member.NoteCallFailed:
		w.log.V(1).Info("Registry call failed", "unit", n.Unit.String(), "error", n.Detail)
	default:
		w.log.Info(string(n.Kind), "unit", n.Unit.String(), "value", n.Value, "detail", n.Detail)
	}
}

// unpinForHandover lifts the pin of a unit being handed over, so its next
// holder is served at once, unless the member's fence deadline passed
// meanwhile: the unit may have been adopted, and the pin is the adopter's.
func (w *Worker) unpinForHandover(a member.Unpin) {
	defer w.post(member.UnpinDone{Req: a.Req})
	w.bounded(func() {
		if !w.perm.Load().FencedAt(sinceStart()) {
			w.unpin(w.runCtx, a.Unit)
		}
	})
}

// bounded runs f holding one of the takeover slots, which the pullers'
// first UNPIN and RESET take too: TakeoverConcurrency bounds every such
// request in flight, so a handover while new holders start never doubles
// the load on the servers.
func (w *Worker) bounded(f func()) {
	w.slots <- struct{}{}
	defer func() { <-w.slots }()
	f()
}

// probe reads which units' consumers still hold rows.
func (w *Worker) probe(a member.Probe) {
	var busy []ownership.Unit
	for _, u := range a.Units {
		if w.consumerHoldsRows(w.runCtx, u) {
			busy = append(busy, u)
		}
	}
	w.post(member.ProbeReply{Req: a.Req, Busy: busy})
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

func (w *Worker) consumerRef(u ownership.Unit) natsops.ConsumerRef {
	return w.layout.Load().ConsumerRef(natsops.Unit{Partition: u.Partition, Shard: u.Shard})
}

// stopAllPullers stops every puller when Run ends and waits for them,
// at most a few seconds: a handler that ignores its context is left
// behind (its rows are withheld by the revoked permission).
func (w *Worker) stopAllPullers() {
	w.perm.Store(&member.Permission{Fenced: true, Slot: -1})
	deadline := time.After(5 * time.Second)
	for _, p := range w.pullers {
		p.kill()
	}
	for _, p := range w.pullers {
		select {
		case <-p.done:
		case <-deadline:
			return
		}
	}
}
