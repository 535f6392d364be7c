package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/member"
)

// puller pulls one held unit's consumer in the pinned priority group and
// hands its rows to the Handler, under one token. The core starts it
// (member.StartPuller) and decides when it drains or stops; the puller
// checks the core's published permission before every delivery and
// settlement, and reports back when it prepared, fetched and stopped.
type puller struct {
	w     *Worker
	id    member.PullerID
	unit  ownership.Unit
	token poolctl.Token
	ref   natsops.ConsumerRef
	// incarnation and under identify the claim in the history.
	incarnation, under int64
	// unpinFirst: lift the consumer's pin before the first pull.
	unpinFirst bool
	// takeover: lift the previous process's unacked rows too.
	takeover bool
	from     string
	// reset is the census verdict, read at resetReadAt (monotonic).
	reset       poolctl.ResetPermission
	resetReadAt time.Duration

	ctx       context.Context // cancelled: stop at once, settle nothing more
	kill      context.CancelFunc
	stopFetch chan struct{} // closed: finish the current batch, fetch no more
	stopOnce  sync.Once
	abandon   atomic.Bool // set: nak what is left of the batch unhandled
	done      chan struct{}

	// withheld counts rows neither delivered nor settled because the
	// claim was lost or the member fenced itself.
	withheld atomic.Int64
	// pending is what NATS said was left in the consumer with the latest
	// row (0 after a pull that brought none), for the lag gauge.
	pending atomic.Int64

	// failingSince is when the current run of failed lookups and pulls
	// began (sinceStart), 0 while the last one succeeded; lastReason is
	// the latest failure's counter reason. Ready reads both.
	failingSince atomic.Int64
	lastReason   atomic.Pointer[string]
	// failures and loggedAt count the run's failures and when one was
	// last logged at the default level; only the puller's goroutine
	// touches them.
	failures int
	loggedAt time.Duration
}

// startPuller starts the puller the core asked for.
func (w *Worker) startPuller(a member.StartPuller) {
	ctx, cancel := context.WithCancel(w.runCtx)
	p := &puller{
		w: w, id: a.Puller, unit: a.Unit, token: a.Token, ref: w.consumerRef(a.Unit),
		incarnation: a.Incarnation, under: a.Under, unpinFirst: a.Unpin, takeover: a.Takeover, from: a.From,
		reset: a.Reset, resetReadAt: a.ResetReadAt,
		ctx: ctx, kill: cancel, stopFetch: make(chan struct{}), done: make(chan struct{}),
	}
	w.pullers[a.Puller] = p
	w.log.V(1).Info("Puller started", "unit", a.Unit.String(), "token", a.Token.Epoch,
		"takeover", a.Takeover, "unpinFirst", a.Unpin)
	go p.run()
}

func (p *puller) run() {
	defer func() {
		p.endFailing()
		close(p.done)
		p.w.post(member.PullerStopped{Unit: p.unit, Puller: p.id, Withheld: p.withheld.Load() > 0,
			DrainTimedOut: p.abandon.Load()})
	}()
	if !p.prepare() {
		return
	}
	var cons jetstream.Consumer
	backoff := newBackoff(50*time.Millisecond, 2*time.Second)
	for p.fetching() {
		if !p.mayDeliver() {
			// Fenced, or the claim moved on and the core has not stopped
			// this puller yet: a pull now would take the pin the new
			// holder just lifted (simulator seed 1896), so wait for the
			// core's word instead.
			backoff.wait(p.ctx, p.stopFetch)
			continue
		}
		if cons == nil {
			c, err := p.w.js.Consumer(p.ctx, p.ref.Stream, p.ref.Name)
			if err != nil {
				if p.ctx.Err() == nil {
					p.fetchFailed(err, true)
				}
				backoff.wait(p.ctx, nil)
				continue
			}
			cons = c
		}
		if err := p.fetchBatch(cons); err != nil {
			// Another client still pinned, a leader election, a restart:
			// all pass; try again shortly. A consumer that is gone is
			// looked up again, so one re-created is found.
			if p.ctx.Err() == nil && p.fetchFailed(err, false) {
				cons = nil
			}
			backoff.wait(p.ctx, nil)
			continue
		}
		p.fetchOK()
		backoff.reset()
	}
}

// prepare runs before the first pull. Every new holder lifts the
// consumer's pin: the pin may belong to a process that is dead, fenced, or
// this very process's previous puller, and it would keep the consumer from
// serving this puller until the pinned TTL ran out. A takeover also RESETs
// the consumer when the census allows it (P4), so rows the previous
// process left unacknowledged come back now rather than after ack wait.
// It reports false when the claim was lost meanwhile.
func (p *puller) prepare() bool {
	w := p.w
	// A handover that stops a puller still waiting for a slot need not
	// wait for its UNPIN: the handover UNPINs anyway, and every later
	// holder too. A takeover waits, so its RESET is not lost.
	var handedOver <-chan struct{}
	if !p.takeover {
		handedOver = p.stopFetch
	}
	select {
	case w.takeoverSlots() <- struct{}{}:
	case <-p.ctx.Done():
		return false
	case <-handedOver:
		return false
	}
	defer func() { <-w.takeoverSlots() }()
	if !p.mayDeliver() {
		return false
	}
	if p.unpinFirst && !p.unpinUntilAnswered() {
		return false
	}
	if p.takeover {
		if !p.mayDeliver() {
			return false // fenced meanwhile: no RESET (P5)
		}
		w.resetOnTakeover(p.ctx, p)
	}
	w.post(member.PullerPrepared{Unit: p.unit, Puller: p.id})
	w.log.V(1).Info("Pulling", "unit", p.unit.String())
	return true
}

// unpinUntilAnswered lifts the consumer's pin before the first pull, asking
// again until NATS answers: a lost or failed UNPIN (a consumer leader
// being elected, a server down) leaves the previous holder's pin in place
// and this holder waiting for the pinned TTL (simulator seed 30747; chaos
// scenario 6, where the leader is down 20s). It reports false when the
// claim was lost or the puller stopped meanwhile.
func (p *puller) unpinUntilAnswered() bool {
	b := newBackoff(50*time.Millisecond, time.Second)
	for p.fetching() {
		if !p.mayDeliver() {
			return false
		}
		if p.w.unpin(p.ctx, p.unit) == nil {
			return true
		}
		b.wait(p.ctx, p.stopFetch)
	}
	return false
}

// mayDeliver is the P1 check for this puller's unit and token.
func (p *puller) mayDeliver() bool { return p.w.mayDeliver(p.unit, p.token) }

// fetchBatch pulls one batch and handles its rows in order.
func (p *puller) fetchBatch(cons jetstream.Consumer) error {
	start := history.Now()
	batch, err := cons.Fetch(p.w.opts.FetchBatch,
		jetstream.FetchMaxWait(p.w.opts.FetchWait), jetstream.FetchPriorityGroup(natsops.PriorityGroup))
	if err != nil {
		return err
	}
	rows := 0
	for msg := range batch.Messages() {
		rows++
		p.handle(msg, start)
	}
	if rows == 0 && batch.Error() == nil {
		p.pending.Store(0)
	}
	p.record(history.Record{Kind: history.KindFetch, Rows: rows, Start: start, End: history.Now()})
	p.w.post(member.PullerFetched{Unit: p.unit, Puller: p.id, Rows: rows})
	return batch.Error()
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
// Once a drain timed out (abandon), the rest of the batch is nak'd unhandled
// for the next owner, as long as the claim is still ours. fetched is when
// the pull that brought msg was sent, for the history.
func (p *puller) handle(msg jetstream.Msg, fetched int64) {
	row := p.row(msg)
	if p.abandon.Load() {
		p.settleUnhandled(msg, row)
		return
	}
	if p.ctx.Err() != nil || !p.mayDeliver() {
		p.withhold(row, p.now(), "claim lost or fenced before delivery")
		return
	}
	// Stamped after the check: Start is the instant delivery was allowed
	// (pkg/history), so a pause between check and stamp cannot hide a
	// delivery made after the claim moved.
	at := p.now()
	if p.recording() {
		p.record(history.Record{Kind: history.KindDeliver, RowID: p.rowID(row), StreamSeq: row.StreamSeq,
			NumDelivered: row.NumDelivered, Start: at, Fetch: fetched})
	}
	if row.NumDelivered > 1 {
		p.w.metrics.redeliveries.Inc()
	}
	verdict := p.w.opts.Handler(p.ctx, row)
	p.settle(msg, row, verdict)
}

// settleUnhandled naks a row the drain gave up on, if the claim is still
// ours; otherwise it is withheld.
func (p *puller) settleUnhandled(msg jetstream.Msg, row Row) {
	if !p.mayDeliver() {
		p.withhold(row, history.Now(), "claim lost or fenced before the drain nak")
		return
	}
	at := history.Now()
	err := msg.Nak()
	p.record(history.Record{Kind: history.KindNak, RowID: p.rowID(row), StreamSeq: row.StreamSeq,
		NumDelivered: row.NumDelivered, Detail: errDetail(err, "drain timed out"), Start: at, End: history.Now()})
	p.w.metrics.drainNaks.Inc()
}

// settle applies the handler's verdict after checking the claim again.
func (p *puller) settle(msg jetstream.Msg, row Row, verdict Settlement) {
	if !p.mayDeliver() {
		p.withhold(row, p.now(), "claim lost or fenced before settling")
		return
	}
	at := p.now() // after the check it stamps
	err := settle(msg, verdict)
	if p.recording() {
		p.record(history.Record{Kind: settlementKind(verdict), RowID: p.rowID(row), StreamSeq: row.StreamSeq,
			NumDelivered: row.NumDelivered, Detail: errDetail(err, ""), Start: at, End: history.Now()})
	}
	if err != nil {
		p.w.log.V(1).Info("Settle failed", "unit", p.unit.String(), "settlement", verdict.String(), "error", err.Error())
		return
	}
	p.w.metrics.settledCounter(verdict).Inc()
}

// withhold counts and records a row this member may no longer act on.
func (p *puller) withhold(row Row, at int64, why string) {
	p.withheld.Add(1)
	p.w.metrics.rowsWithheld.Inc()
	p.record(history.Record{Kind: history.KindWithheld, RowID: p.rowID(row), StreamSeq: row.StreamSeq,
		NumDelivered: row.NumDelivered, Detail: why, Start: at})
}

// row builds the Handler's view of msg.
func (p *puller) row(msg jetstream.Msg) Row {
	row := Row{Unit: p.unit, Token: p.token, Subject: msg.Subject(), Data: msg.Data(), Headers: msg.Headers()}
	if md, ok := ackMetadata(msg.Reply()); ok {
		row.StreamSeq, row.NumDelivered = md.streamSeq, md.delivered
		p.pending.Store(int64(md.pending))
	}
	return row
}

// recording reports whether a history recorder is set. Without one a row
// costs no history clock reads and no records: only the P1 checks.
func (p *puller) recording() bool { return p.w.opts.History != nil }

// now is the history clock when recording, else 0.
func (p *puller) now() int64 {
	if !p.recording() {
		return 0
	}
	return history.Now()
}

// rowID names row in the history; it costs nothing without a recorder.
func (p *puller) rowID(row Row) string {
	if p.w.opts.History == nil {
		return ""
	}
	return p.w.opts.RowID(row)
}

// record stamps rec with the puller's claim and hands it to the recorder.
func (p *puller) record(rec history.Record) {
	if p.w.opts.History == nil {
		return
	}
	rec.Unit, rec.Member, rec.Incarnation = p.unit.String(), p.token.Member, p.incarnation
	rec.Epoch, rec.TopologyEpoch = p.token.Epoch, p.under
	p.w.opts.History.Record(rec)
}

func settlementKind(s Settlement) history.Kind {
	switch s {
	case Ack:
		return history.KindAck
	case Nak:
		return history.KindNak
	case Term:
		return history.KindTerm
	default:
		return history.KindAbandon
	}
}

func errDetail(err error, otherwise string) string {
	if err != nil {
		return err.Error()
	}
	return otherwise
}

// drain stops fetching and gives the current batch up to timeout to be
// handled; what is left then is nak'd so the next owner gets it at once.
// It returns at once: the puller reports PullerStopped when it ended.
func (p *puller) drain(timeout time.Duration) {
	p.stopOnce.Do(func() { close(p.stopFetch) })
	p.w.async(func() {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-p.done:
		case <-p.w.loopDone: // Run ended; it stops every puller itself
		case <-t.C:
			// Abandon before cancelling: handle() checks abandon first,
			// so the rest of the batch is nak'd rather than withheld.
			p.abandon.Store(true)
			p.kill() // cancel the handler's context too
		}
	})
}

// backoff is a capped exponential wait.
type backoff struct{ min, max, cur time.Duration }

func newBackoff(min, max time.Duration) *backoff { return &backoff{min: min, max: max, cur: min} }

func (b *backoff) reset() { b.cur = b.min }

// wait waits the current backoff, or until ctx ends or wake fires (a nil
// wake never fires), and doubles the next one.
func (b *backoff) wait(ctx context.Context, wake <-chan struct{}) {
	t := time.NewTimer(b.cur)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
	case <-t.C:
	}
	b.cur = min(b.cur*2, b.max)
}
