package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// takeoverSlots bounds the UNPIN and RESET requests in flight at once.
func (w *Worker) takeoverSlots() chan struct{} { return w.slots }

// resetOnTakeover RESETs a taken-over unit's consumer to its ack floor, so
// rows the previous process left unacknowledged come back now, but only
// when natsops.GuardedReset, reading the consumer's current leader and
// replicas at this moment, finds each of them at or above the floor in
// the census the operator published, and that census is young enough now
// (P4). Otherwise those rows come back after ack wait.
func (w *Worker) resetOnTakeover(ctx context.Context, p *puller) {
	perm := p.reset
	if !perm.Published {
		w.countTakeover("ackwait", "no_census")
		w.log.Info("Takeover without RESET: no census published; unacked rows return after ack wait", "unit", p.unit.String(), "from", p.from)
		return
	}
	// The verdict was read at resetReadAt on the monotonic clock; its
	// age now is that much older than the census age it was read with.
	readAt := time.Now().Add(-(sinceStart() - p.resetReadAt))
	v := natsops.ResetVerdict{Allowed: perm.Allowed, Floor: perm.Floor, Servers: perm.Servers, Reason: perm.Reason,
		TakenAt: readAt.Add(-perm.CensusAge)}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := history.Now()
	err := natsops.GuardedReset(rctx, w.js, p.ref, v, w.opts.MaxCensusAge, time.Now())
	var refused *natsops.RefusedError
	switch {
	case errors.As(err, &refused):
		w.countTakeover("ackwait", "refused")
		w.log.Info("Takeover without RESET; unacked rows return after ack wait", "unit", p.unit.String(), "from", p.from, "reason", refused.Error())
	case err != nil:
		w.countTakeover("ackwait", "reset_failed")
		w.log.Info("RESET failed; unacked rows return after ack wait", "unit", p.unit.String(), "error", err.Error())
	default:
		p.record(history.Record{Kind: history.KindReset, Start: start, End: history.Now()})
		w.countTakeover("reset", "")
		w.log.Info("Took over with RESET", "unit", p.unit.String(), "from", p.from, "epoch", p.token.Epoch)
	}
}

func (w *Worker) countTakeover(outcome, reason string) {
	w.metrics.takeovers.WithLabelValues(outcome, reason).Inc()
}

// unpin lifts the unit's pinned client so the next pull is served at once.
// UNPIN needs 2.11, which the version floor guarantees; a failure only
// delays the holder until the pin times out.
func (w *Worker) unpin(ctx context.Context, u ownership.Unit) error {
	ref := w.consumerRef(u)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := w.stream(rctx, ref.Stream)
	if err == nil {
		err = s.UnpinConsumer(rctx, ref.Name, natsops.PriorityGroup)
	}
	if err != nil {
		w.log.V(1).Info("UNPIN failed", "unit", u.String(), "error", err.Error())
	}
	return err
}

// stream returns a handle on a partition stream, looked up once per
// process: UNPIN needs only the stream's name, and a STREAM.INFO before
// every UNPIN would double the requests a handover of many units sends.
func (w *Worker) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if s, ok := w.streams.Load(name); ok {
		return s.(jetstream.Stream), nil
	}
	s, err := w.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	w.streams.Store(name, s)
	return s, nil
}
