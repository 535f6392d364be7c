package worker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// puller pulls one held unit's consumer in the pinned priority group and
// hands its rows to the Handler, under one token. A new token (after a
// re-home) means a new puller.
type puller struct {
	w     *Worker
	unit  ownership.Unit
	token poolctl.Token
	ref   natsops.ConsumerRef

	ctx       context.Context // cancelled: stop at once, settle nothing more
	kill      context.CancelFunc
	stopFetch chan struct{} // closed: finish the current batch, fetch no more
	abandon   atomic.Bool   // set: nak what is left of the batch unhandled
	done      chan struct{}
}

func (w *Worker) startPuller(u ownership.Unit, t poolctl.Token) *puller {
	ctx, cancel := context.WithCancel(w.runCtx)
	p := &puller{
		w: w, unit: u, token: t, ref: w.layout.ConsumerRef(natsops.Unit{Partition: u.Partition, Shard: u.Shard}),
		ctx: ctx, kill: cancel, stopFetch: make(chan struct{}), done: make(chan struct{}),
	}
	go p.run()
	return p
}

func (p *puller) run() {
	defer close(p.done)
	var cons jetstream.Consumer
	backoff := newBackoff(50*time.Millisecond, 2*time.Second)
	for p.fetching() {
		if cons == nil {
			c, err := p.w.js.Consumer(p.ctx, p.ref.Stream, p.ref.Name)
			if err != nil {
				p.w.log.V(1).Info("Consumer lookup failed", "unit", p.unit.String(), "error", err.Error())
				backoff.wait(p.ctx)
				continue
			}
			cons = c
		}
		batch, err := cons.Fetch(p.w.opts.FetchBatch,
			jetstream.FetchMaxWait(p.w.opts.FetchWait), jetstream.FetchPriorityGroup(natsops.PriorityGroup))
		if err != nil {
			// Another client still pinned, a leader election, a restart:
			// all pass; try again shortly.
			p.w.log.V(1).Info("Fetch failed", "unit", p.unit.String(), "error", err.Error())
			backoff.wait(p.ctx)
			continue
		}
		for msg := range batch.Messages() {
			p.handle(msg)
		}
		if err := batch.Error(); err != nil {
			p.w.log.V(1).Info("Batch ended with error", "unit", p.unit.String(), "error", err.Error())
			backoff.wait(p.ctx)
			continue
		}
		backoff.reset()
	}
}

// fetching reports whether the puller should issue another pull.
func (p *puller) fetching() bool {
	select {
	case <-p.stopFetch:
		return false
	case <-p.ctx.Done():
		return false
	default:
		return true
	}
}

// handle delivers one row and settles it, checking the claim before each
// (P1): a row that arrives after the member lost the claim or fenced itself
// is neither delivered nor settled, and NATS redelivers it to the owner.
func (p *puller) handle(msg jetstream.Msg) {
	if p.ctx.Err() != nil || !p.w.mayDeliver(p.unit, p.token) {
		p.w.metrics.rowsWithheld.Inc()
		return
	}
	if p.abandon.Load() {
		_ = msg.Nak()
		p.w.metrics.rowsNaked.Inc()
		return
	}
	row := Row{Unit: p.unit, Token: p.token, Subject: msg.Subject(), Data: msg.Data(), Headers: msg.Headers()}
	if md, err := msg.Metadata(); err == nil {
		row.StreamSeq, row.NumDelivered = md.Sequence.Stream, md.NumDelivered
		if md.NumDelivered > 1 {
			p.w.metrics.redeliveries.Inc()
		}
	}
	verdict := p.w.opts.Handler(p.ctx, row)
	if !p.w.mayDeliver(p.unit, p.token) {
		p.w.metrics.rowsWithheld.Inc()
		return
	}
	if err := settle(msg, verdict); err != nil {
		p.w.log.V(1).Info("Settle failed", "unit", p.unit.String(), "settlement", verdict.String(), "error", err.Error())
		return
	}
	p.w.metrics.rowsSettled.WithLabelValues(verdict.String()).Inc()
}

// drain stops fetching and waits up to timeout for the current batch to be
// handled; what is left then is nak'd so the next owner gets it at once.
// It reports whether the batch finished within the timeout.
func (p *puller) drain(timeout time.Duration) bool {
	close(p.stopFetch)
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
	}
	p.abandon.Store(true)
	p.kill() // cancel the handler's context too
	<-p.done
	return false
}

// stop stops at once: used when the member fences itself.
func (p *puller) stop() {
	p.kill()
	<-p.done
}

// backoff is a capped exponential wait.
type backoff struct{ min, max, cur time.Duration }

func newBackoff(min, max time.Duration) *backoff { return &backoff{min: min, max: max, cur: min} }

func (b *backoff) reset() { b.cur = b.min }

func (b *backoff) wait(ctx context.Context) {
	t := time.NewTimer(b.cur)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	b.cur = min(b.cur*2, b.max)
}
