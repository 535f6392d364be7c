package worker

import (
	"context"
	"strings"
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
	// pending is what NATS said was left in the consumer with a batch's
	// last row (0 after a pull that brought none), for the lag gauge;
	// lastPending is the latest row's, set once a batch (one atomic store
	// a row fewer). Only the puller's goroutine touches lastPending.
	pending     atomic.Int64
	lastPending int64
	// acks reads the rows' ack subjects; settled counts settlements by
	// verdict not yet added to the metric (flushSettled: once a batch and
	// with every progress report, not an atomic add a row). Only the
	// puller's goroutine touches them.
	acks    ackSubjects
	settled [Abandon + 1]uint64

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
	// unreported counts rows handled since the core was last told
	// (PullerFetched) at reportedAt (sinceStart); only the puller's
	// goroutine touches them.
	unreported int
	reportedAt time.Duration
	// seen is the permission the latest P1 check read, delivers its
	// answer without the clock (Permission.Delivers) and checkedAt that
	// check's clock (sinceStart). A permission is immutable, so while it
	// is the same only the clock is compared: a clock read and a map
	// lookup were each a fifth of the SDK's per-row cost
	// (BenchmarkHandleRow). Only the puller's goroutine touches them.
	seen      *member.Permission
	delivers  bool
	checkedAt time.Duration

	// held are rows of moved keys waiting for the order barrier (issue
	// 24), in arrival order, and heldKeys counts them by key: a later row
	// of a key waits behind its earlier ones. keptAt is when they were
	// last kept from redelivery (InProgress), ackWait the consumer's.
	// Only the puller's goroutine touches them.
	held     []heldRow
	heldKeys map[string]int
	keptAt   time.Time
	ackWait  time.Duration
	// marked is the drained-to mark this puller last recorded under a
	// change of N's barrier, markedAt when it last measured one
	// (sinceStart). Only the puller's goroutine touches them.
	marked   uint64
	markedAt time.Duration
}

// heldRow is a row the order barrier holds.
type heldRow struct {
	msg     jetstream.Msg
	row     Row
	key     string
	fetched int64
}

// startPuller starts the puller the core asked for.
func (w *Worker) startPuller(a member.StartPuller) {
	ctx, cancel := context.WithCancel(w.runCtx)
	p := &puller{
		w: w, id: a.Puller, unit: a.Unit, token: a.Token, ref: w.consumerRef(a.Unit),
		incarnation: a.Incarnation, under: a.Under, unpinFirst: a.Unpin, takeover: a.Takeover, from: a.From,
		reset: a.Reset, resetReadAt: a.ResetReadAt,
		ctx: ctx, kill: cancel, stopFetch: make(chan struct{}), done: make(chan struct{}),
		heldKeys: map[string]int{},
	}
	w.pullers[a.Puller] = p
	w.log.V(1).Info("Puller started", "unit", a.Unit.String(), "token", a.Token.Epoch,
		"takeover", a.Takeover, "unpinFirst", a.Unpin)
	go p.run()
}

func (p *puller) run() {
	defer func() {
		p.endFailing()
		p.releaseHeld()
		p.handBackHeld()
		p.flushSettled()
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
		p.releaseHeld()
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
					p.fetchFailed(err, stepLookup)
				}
				backoff.wait(p.ctx, nil)
				continue
			}
			cons = c
			p.ackWait = c.CachedInfo().Config.AckWait
		}
		if err := p.fetchBatch(cons); err != nil {
			// Another client still pinned, a leader election, a restart:
			// all pass; try again shortly. A consumer that is gone is
			// looked up again, so one re-created is found.
			if p.ctx.Err() == nil && p.fetchFailed(err, stepPull) {
				cons = nil
			}
			backoff.wait(p.ctx, nil)
			continue
		}
		p.fetchOK()
		backoff.reset()
		p.recordMark()
	}
}

// markEvery bounds how often a puller measures its drained-to mark: one
// consumer read and one registry write at most this often, not a batch.
const markEvery = 500 * time.Millisecond

// recordMark measures and records, between batches, how far the unit's
// rows are settled while a change of N's barrier waits for it as an old
// unit (design.md section 8): the rows this puller holds for keys moving
// in keep its ack floor below the switch, so the operator lifts it by
// this mark instead. Nothing is in flight between batches, which the
// measurement needs (natsops.MarkOf); the write is guarded by the claim
// token. A failure is only logged: the next batch measures again, and
// the floor still lifts a unit that holds nothing.
func (p *puller) recordMark() {
	perm := p.w.perm.Load()
	if perm == nil || perm.Barrier == nil || !perm.Barrier.ChangesN() || p.checkedAt-p.markedAt < markEvery {
		return
	}
	b := perm.Barrier
	if pb, ok := b.Partition(p.unit.Partition); !ok || pb.Lifted(p.unit.Shard) {
		return
	}
	p.markedAt = p.checkedAt
	marks, ok := p.w.reg.(poolctl.OrderMarks)
	if !ok {
		// Only a test double lacks them (OpenRegistry's PostgreSQL
		// registry keeps marks); say so rather than wait silently.
		p.w.log.Info("The registry keeps no drained-to marks: the order barrier lifts this unit only by its ack floor", "unit", p.unit.String())
		return
	}
	ctx, cancel := p.w.queryCtx()
	defer cancel()
	m, err := natsops.MarkOf(ctx, p.w.js, p.ref, len(p.held))
	if err == nil && m.Seq > p.marked {
		if err = marks.MarkDrained(ctx, p.token, b.Epoch, m.Seq); err == nil {
			p.marked = m.Seq
		}
	}
	if err != nil {
		p.w.log.V(1).Info("Drained-to mark not recorded", "unit", p.unit.String(), "barrierEpoch", b.Epoch, "error", err.Error())
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
	if p.unpinFirst && !p.unpinUntilAnswered() {
		return false
	}
	if p.takeover && !p.inSlot(func() bool {
		if !p.mayDeliver() {
			return false // fenced meanwhile: no RESET (P5)
		}
		w.resetOnTakeover(p.ctx, p)
		return true
	}) {
		return false
	}
	if !p.mayDeliver() {
		return false
	}
	w.post(member.PullerPrepared{Unit: p.unit, Puller: p.id})
	w.log.V(1).Info("Pulling", "unit", p.unit.String())
	return true
}

// inSlot runs f holding one of the worker's takeover slots, which bound
// the UNPIN and RESET requests in flight at once, and reports f's
// answer, or false when the puller stopped while waiting for a slot. A
// handover that stops a puller still waiting need not wait for its
// UNPIN: the handover UNPINs anyway, and every later holder too. A
// takeover waits, so its RESET is not lost.
func (p *puller) inSlot(f func() bool) bool {
	var handedOver <-chan struct{}
	if !p.takeover {
		handedOver = p.stopFetch
	}
	select {
	case p.w.takeoverSlots() <- struct{}{}:
	case <-p.ctx.Done():
		return false
	case <-handedOver:
		return false
	}
	defer func() { <-p.w.takeoverSlots() }()
	return f()
}

// unpinUntilAnswered lifts the consumer's pin before the first pull, asking
// again until NATS answers: a lost or failed UNPIN (a consumer leader
// being elected, a server down) leaves the previous holder's pin in place
// and this holder waiting for the pinned TTL (simulator seed 30747; chaos
// scenario 6, where the leader is down 20s). Its failures count, log and
// judge readiness as failed pulls do: a puller that starts while its
// consumer is missing fails every UNPIN and never pulls, which went
// unreported (issue 21's hole; TestAConsumerMissingWhenItsPullerStarts...
// shows it, and it can explain TestAVanishedConsumer...'s rare failure
// under load, where any new puller for the unit stalled so). The slot is held
// for each request only, not across the waits between them, so units
// whose consumers are gone do not hold up other units' takeovers. It
// reports false when the claim was lost or the puller stopped meanwhile.
func (p *puller) unpinUntilAnswered() bool {
	b := newBackoff(50*time.Millisecond, time.Second)
	for p.fetching() {
		p.releaseHeld()
		var err error
		if !p.inSlot(func() bool {
			if !p.mayDeliver() {
				return false // the claim moved on: an UNPIN now would lift the new holder's pin
			}
			err = p.w.unpin(p.ctx, p.unit)
			return true
		}) {
			return false
		}
		if err == nil {
			p.fetchOK()
			return true
		}
		if p.ctx.Err() == nil {
			p.fetchFailed(err, stepUnpin)
		}
		b.wait(p.ctx, p.stopFetch)
	}
	return false
}

// mayDeliver is the P1 check made before a row is delivered and before it
// is settled: the member holds the unit under this very token, is not
// fenced, and its self-fence deadline has not passed on its own clock
// (Permission.Allows). One atomic load and one monotonic clock read; the
// map read only when the core published a new permission.
func (p *puller) mayDeliver() bool {
	perm := p.w.perm.Load()
	if perm != p.seen {
		p.seen, p.delivers = perm, perm.Delivers(p.unit, p.token)
	}
	p.checkedAt = sinceStart()
	return p.delivers && p.checkedAt < perm.FenceDue
}

// fetchBatch pulls one batch and handles its rows in order.
func (p *puller) fetchBatch(cons jetstream.Consumer) error {
	start := history.Now()
	batch, err := cons.Fetch(p.w.opts.FetchBatch,
		jetstream.FetchMaxWait(time.Duration(p.w.fetchWait.Load())), jetstream.FetchPriorityGroup(natsops.PriorityGroup))
	if err != nil {
		return err
	}
	rows := 0
	for msg := range batch.Messages() {
		rows++
		p.handle(msg, start)
		// A slow handler works through a batch for longer than the
		// operator's stall bound; rows handled are progress, so they are
		// reported as they go, not only once the batch is done.
		p.progress(1, false)
	}
	switch {
	case rows > 0:
		p.pending.Store(p.lastPending)
	case batch.Error() == nil:
		p.pending.Store(0)
	}
	p.flushSettled()
	p.record(history.Record{Kind: history.KindFetch, Rows: rows, Start: start, End: history.Now()})
	// A pull that brought nothing took its whole wait and is reported at once
	// (with any rows not yet reported); rows are reported at most every
	// pullProgressEvery, not after every batch: at 64 rows a batch a
	// busy unit completed a thousand pulls a second, each an event the
	// core handled and a wakeup of its goroutine.
	p.progress(0, rows == 0)
	return batch.Error()
}

// progress counts rows handled and tells the core (PullerFetched) when
// pullProgressEvery has passed since it last did, or now. Its clock is
// the latest P1 check's, which every handled row made (one clock read a
// row fewer).
func (p *puller) progress(rows int, now bool) {
	p.unreported += rows
	t := p.checkedAt
	if now {
		t = sinceStart()
	}
	if now || t-p.reportedAt >= pullProgressEvery {
		p.w.post(member.PullerFetched{Unit: p.unit, Puller: p.id, Rows: p.unreported})
		p.unreported, p.reportedAt = 0, t
		p.flushSettled()
	}
}

// flushSettled adds the settlements counted since the last flush to the
// settled rows metric.
func (p *puller) flushSettled() {
	for v, n := range p.settled {
		if n > 0 {
			p.w.metrics.settled[v].Add(float64(n))
			p.settled[v] = 0
		}
	}
}

// pullProgressEvery is how often at most a puller reports the rows
// handled so far (PullerFetched): well inside the operator's stall bound
// (three renew intervals), so a unit whose handler is slow but moving is
// not reported stalled; a handler stuck on one row still is.
const pullProgressEvery = 100 * time.Millisecond

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
	var row Row
	p.fill(&row, msg)
	if p.abandon.Load() {
		p.settleUnhandled(msg, &row)
		return
	}
	if p.ctx.Err() != nil || !p.mayDeliver() {
		p.withhold(&row, p.now(), "claim lost or fenced before delivery")
		return
	}
	// Without a barrier and nothing held, a row costs one more field read
	// (delivery overhead, make bench row c). The permission is the one the
	// check above allowed the row under.
	if perm := p.seen; len(p.held) > 0 || perm.Barrier != nil {
		if key := rowKey(row.Subject); p.heldKeys[key] > 0 || perm.Holds(p.unit, row.StreamSeq, key) {
			p.hold(msg, row, key, fetched)
			return
		}
	}
	p.deliver(msg, &row, fetched)
}

// deliver hands one row to the Handler and settles it. The caller checked
// the claim. Rows go by pointer up to the Handler, which gets its own
// copy: a Row is 136 bytes, and each call that took it by value copied it.
func (p *puller) deliver(msg jetstream.Msg, row *Row, fetched int64) {
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
	verdict := p.w.opts.Handler(p.ctx, *row)
	p.settle(msg, row, verdict)
}

// rowKey is a routed row's key: the subject's last token
// (<prefix>.ingest.<p>.<s>.<key>).
func rowKey(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// hold keeps a row of a moved key back until its old unit is lifted: not
// delivered, not settled, kept from redelivery (InProgress) while it
// waits. It is delivered by releaseHeld, in arrival order, before any
// later row of its key.
func (p *puller) hold(msg jetstream.Msg, row Row, key string, fetched int64) {
	if len(p.held) == 0 {
		p.keptAt = time.Now()
	}
	p.held = append(p.held, heldRow{msg: msg, row: row, key: key, fetched: fetched})
	p.heldKeys[key]++
	p.w.metrics.rowsHeld.Inc()
}

// releaseHeld delivers, in arrival order, the held rows whose key's old
// unit was lifted since, and keeps the others from redelivery. A row
// stays held while an earlier row of its key does.
func (p *puller) releaseHeld() {
	if len(p.held) == 0 {
		return
	}
	perm := p.w.perm.Load()
	blocked := map[string]bool{}
	var keep []heldRow
	for i, h := range p.held {
		if p.ctx.Err() != nil || p.abandon.Load() || !p.mayDeliver() {
			keep = append(keep, p.held[i:]...)
			break
		}
		if blocked[h.key] || perm.Holds(p.unit, h.row.StreamSeq, h.key) {
			blocked[h.key] = true
			keep = append(keep, h)
			continue
		}
		if p.heldKeys[h.key]--; p.heldKeys[h.key] == 0 {
			delete(p.heldKeys, h.key)
		}
		p.deliver(h.msg, &h.row, h.fetched)
	}
	p.held = keep
	p.keepHeld()
}

// keepHeld tells NATS the held rows are still being worked on, a third of
// the consumer's ack wait after it last did, so none is redelivered while
// it waits (a redelivery to this puller would come back out of order).
func (p *puller) keepHeld() {
	every := max(p.ackWait/3, 100*time.Millisecond)
	if len(p.held) == 0 || time.Since(p.keptAt) < every || !p.mayDeliver() {
		return
	}
	for _, h := range p.held {
		if err := h.msg.InProgress(); err != nil {
			p.w.log.V(1).Info("Keeping a held row failed", "unit", p.unit.String(), "streamSeq", h.row.StreamSeq, "error", err.Error())
		}
	}
	p.keptAt = time.Now()
}

// handBackHeld naks the rows still held when the puller stops (a
// handover, a drain), in order, so the next holder gets them at once and
// holds them under the same barrier; withheld when the claim is lost.
func (p *puller) handBackHeld() {
	for _, h := range p.held {
		if !p.mayDeliver() {
			p.withhold(&h.row, p.now(), "claim lost or fenced while the order barrier held the row")
			continue
		}
		at := history.Now()
		err := h.msg.Nak()
		p.record(history.Record{Kind: history.KindNak, RowID: p.rowID(&h.row), StreamSeq: h.row.StreamSeq,
			NumDelivered: h.row.NumDelivered, Detail: errDetail(err, "held by the order barrier when the puller stopped"), Start: at, End: history.Now()})
	}
	p.held, p.heldKeys = nil, map[string]int{}
}

// settleUnhandled naks a row the drain gave up on, if the claim is still
// ours; otherwise it is withheld.
func (p *puller) settleUnhandled(msg jetstream.Msg, row *Row) {
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
func (p *puller) settle(msg jetstream.Msg, row *Row, verdict Settlement) {
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
	p.settled[verdict.known()]++
}

// withhold counts and records a row this member may no longer act on.
func (p *puller) withhold(row *Row, at int64, why string) {
	p.withheld.Add(1)
	p.w.metrics.rowsWithheld.Inc()
	p.record(history.Record{Kind: history.KindWithheld, RowID: p.rowID(row), StreamSeq: row.StreamSeq,
		NumDelivered: row.NumDelivered, Detail: why, Start: at})
}

// fill builds the Handler's view of msg in row and notes what NATS said
// is left in the consumer.
func (p *puller) fill(row *Row, msg jetstream.Msg) {
	*row = Row{Unit: p.unit, Token: p.token, Subject: msg.Subject(), Data: msg.Data(), Headers: msg.Headers()}
	if md, ok := p.acks.parse(msg.Reply()); ok {
		row.StreamSeq, row.NumDelivered = md.streamSeq, md.delivered
		p.lastPending = int64(md.pending)
	}
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
func (p *puller) rowID(row *Row) string {
	if p.w.opts.History == nil {
		return ""
	}
	return p.w.opts.RowID(*row)
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
