package sim

import (
	"context"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// puller is one process's pulling of one unit, as the SDK's puller does
// it: lift the pin (and RESET on a takeover) when asked, then fetch, and
// for each row check the member's permission, record, run the handler (a
// guarded sink write), check again, record and ack. It records exactly
// what the real one records, on the virtual clock.
type puller struct {
	w        *world
	p        *process
	id       uint64
	unit     string
	tok      poolctl.Token
	te, inc  int64
	mode     stopMode
	done     bool
	fetching bool
	handling bool
	withheld bool
	queue    []delivered
	// fetchStart is when the pull that brought the queued rows was sent.
	fetchStart int64
	drainBy    int64
	timedOut   bool
	// held are rows the order barrier holds, in arrival order, as
	// pkg/worker's puller keeps them (heldKeys counts them by key, keptAt
	// is when they were last kept from redelivery); an ordered run's
	// only.
	held     []delivered
	heldKeys map[string]int
	keptAt   int64
	// markedAt is when the puller last measured its drained-to mark.
	markedAt int64
}

type stopMode int

const (
	running stopMode = iota
	draining
	stopping
)

func (w *world) startPuller(p *process, a Action) {
	if old := p.pullers[a.Unit]; old != nil && !old.done {
		// Two pullers of one unit in one process would run two handlers
		// of its rows at once.
		w.violate("second puller: process %s started a puller of unit %s (epoch %d) while one ran (epoch %d)",
			p.id, a.Unit, a.Token.Epoch, old.tok.Epoch)
	}
	pl := &puller{w: w, p: p, id: a.Puller, unit: a.Unit, tok: a.Token, te: a.TopologyEpoch, inc: a.Incarnation}
	p.pullers[a.Unit] = pl
	w.tracef("%s starts puller %s@%d (unpin %v, reset %v)", p.id, a.Unit, a.Token.Epoch, a.Unpin, a.Reset)
	w.s.after(0, p, func() { pl.prepare(a.Unpin, a.Reset) })
}

// prepare lifts the pin and RESETs as asked, reports, and starts pulling.
func (pl *puller) prepare(unpin, reset bool) {
	w, p := pl.w, pl.p
	if pl.mode != running {
		pl.finish()
		return
	}
	c := w.cons[pl.unit]
	steps := 0
	if unpin {
		steps++
	}
	if reset {
		steps++
	}
	at := w.s.now
	ready := func() {
		if pl.done {
			return
		}
		w.deliver(p, Event{Kind: EvPullerPrepared, Unit: pl.unit, Puller: pl.id})
		pl.fetch()
	}
	if steps == 0 {
		w.s.after(0, p, ready)
		return
	}
	if p.cut(w.s.now) {
		// Cut off from NATS: the UNPIN is asked again until NATS answers.
		// A puller that pulled after a lost UNPIN would find the previous
		// holder's pin and wait out the pinned TTL (2 minutes by default):
		// the simulator found it (seed 30747), and pkg/worker's puller,
		// which UNPINs once, should retry too.
		w.s.after(200*ms, p, func() { pl.prepare(unpin, reset) })
		return
	}
	w.s.after(w.s.between(100*1000, 3*ms), nil, func() {
		if unpin {
			w.tracef("%s UNPIN %s (puller)", p.id, pl.unit)
			c.unpin()
		}
		if reset {
			w.tracef("%s RESET %s (puller)", p.id, pl.unit)
			c.reset()
			p.record(history.Record{Kind: history.KindReset, Unit: pl.unit, Member: p.name, Incarnation: pl.inc,
				Epoch: pl.tok.Epoch, Start: at})
		}
		w.s.after(w.s.between(100*1000, 3*ms), p, ready)
	})
}

// stop asks the puller to stop: at once (mode stopping) or after settling
// what it delivered (draining, for at most timeout).
func (pl *puller) stop(mode stopMode, timeout time.Duration) {
	if pl.done || pl.mode == stopping || pl.mode == mode {
		return
	}
	pl.mode = mode
	if mode == draining {
		pl.drainBy = pl.w.s.now + int64(timeout)
	}
	if !pl.fetching && !pl.handling {
		pl.w.s.after(0, pl.p, pl.next)
	}
}

func (pl *puller) may() bool {
	return pl.p.member.May(time.Duration(pl.w.s.now), pl.unit, pl.tok)
}

func (pl *puller) record(kind history.Kind, d delivered, detail string) {
	pl.p.record(history.Record{Kind: kind, Unit: pl.unit, Member: pl.p.name, Incarnation: pl.inc, Epoch: pl.tok.Epoch,
		TopologyEpoch: pl.te, RowID: d.m.rowID, StreamSeq: d.m.seq, NumDelivered: d.deliveries, Detail: detail,
		Start: pl.w.s.now, End: pl.w.s.now, Fetch: pl.fetchStart})
}

func (pl *puller) fetch() {
	w, p := pl.w, pl.p
	if pl.mode != running {
		pl.next()
		return
	}
	if pl.releaseHeld() {
		pl.next() // deliver what the barrier let go before pulling again
		return
	}
	pl.keepHeld()
	if !pl.may() {
		// Pull only while the permission allows the unit: a fenced
		// process (resumed from a pause, say) that pulled before its core
		// stopped the puller would take the pin the new holder just
		// lifted, and keep the unit from it for the pinned TTL. The
		// puller waits for its stop or for the fence to lift.
		w.s.after(100*ms, p, pl.fetch)
		return
	}
	pl.recordMark()
	pl.fetching = true
	start := w.s.now
	c := w.cons[pl.unit]
	reply := func(rows []delivered) {
		if pl.done {
			return
		}
		pl.fetching = false
		p.record(history.Record{Kind: history.KindFetch, Unit: pl.unit, Member: p.name, Incarnation: pl.inc,
			Epoch: pl.tok.Epoch, Rows: len(rows), Start: start, End: w.s.now})
		pl.fetchStart = start
		pl.queue = append(pl.queue, rows...)
		w.deliver(p, Event{Kind: EvPullerFetched, Unit: pl.unit, Puller: pl.id, Rows: len(rows)})
		pl.next()
	}
	if p.cut(w.s.now) {
		w.s.after(fetchExpires+200*ms, p, func() { reply(nil) })
		return
	}
	w.s.after(w.s.between(100*1000, 2*ms), nil, func() {
		rows, ok := c.fetch(p, w.s.now, fetchBatch, pinnedTTL, ackWait)
		back := w.s.between(100*1000, 2*ms)
		switch {
		case !ok:
			back += 100 * ms // pin mismatch: the client waits before it asks again
		case len(rows) == 0:
			back += fetchExpires
		default:
			w.tracef("%s fetched %d rows of %s", p.id, len(rows), pl.unit)
		}
		w.s.after(back, p, func() {
			if p.cut(w.s.now) {
				// The reply is lost: the rows stay in flight to p until
				// ack_wait.
				w.s.after(fetchExpires, p, func() { reply(nil) })
				return
			}
			reply(rows)
		})
	})
}

// next handles the next fetched row, or fetches again, or finishes.
func (pl *puller) next() {
	w, p := pl.w, pl.p
	if pl.done {
		return
	}
	for len(pl.queue) > 0 {
		d := pl.queue[0]
		pl.queue = pl.queue[1:]
		switch {
		case pl.mode == draining && pl.may():
			// A drain hands the rows it did not deliver back at once.
			pl.record(history.KindNak, d, "drain")
			pl.settle(d, false)
			continue
		case pl.mode != running || !pl.may():
			pl.record(history.KindWithheld, d, "released")
			pl.withheld = true
			continue
		case !d.released && pl.holds(d):
			pl.hold(d)
			continue
		}
		fetched := pl.fetchStart
		if d.released {
			fetched = d.fetched
		}
		r := history.Record{Kind: history.KindDeliver, Unit: pl.unit, Member: p.name, Incarnation: pl.inc, Epoch: pl.tok.Epoch,
			TopologyEpoch: pl.te, RowID: d.m.rowID, StreamSeq: d.m.seq, NumDelivered: d.deliveries, Start: w.s.now, Fetch: fetched}
		p.record(r)
		pl.handling = true
		w.s.after(w.handleTime(), p, func() { pl.handled(d) })
		return
	}
	if pl.mode != running {
		pl.handBackHeld()
		pl.finish()
		return
	}
	pl.fetch()
}

// handled is the handler's end: the sink write, then the settle.
func (pl *puller) handled(d delivered) {
	w, p := pl.w, pl.p
	if pl.done {
		return
	}
	pl.handling = false
	if !w.write(p, d.m.rowID, pl.tok) {
		pl.record(history.KindAbandon, d, "sink refused the token")
		pl.withheld = true
		pl.next()
		return
	}
	if pl.mode == draining && w.s.now > pl.drainBy {
		pl.timedOut = true
	}
	if pl.mode == stopping || !pl.may() {
		pl.record(history.KindWithheld, d, "released")
		pl.withheld = true
		pl.next()
		return
	}
	pl.record(history.KindAck, d, "")
	pl.settle(d, true)
	pl.next()
}

// settle sends an ack or a nak to the consumer.
func (pl *puller) settle(d delivered, ack bool) {
	w, p := pl.w, pl.p
	if p.cut(w.s.now) {
		return
	}
	c := w.cons[pl.unit]
	w.s.after(w.s.between(100*1000, 2*ms), nil, func() {
		if ack {
			c.ack(d.m)
		} else {
			c.nak(d.m, d.deliveries)
		}
	})
}

func (pl *puller) finish() {
	if pl.done {
		return
	}
	pl.done = true
	w, p := pl.w, pl.p
	if p.pullers[pl.unit] == pl {
		delete(p.pullers, pl.unit)
	}
	w.tracef("%s puller %s@%d stopped (withheld %v)", p.id, pl.unit, pl.tok.Epoch, pl.withheld)
	w.deliver(p, Event{Kind: EvPullerStopped, Unit: pl.unit, Puller: pl.id, Withheld: pl.withheld, DrainTimedOut: pl.timedOut})
}

// markEvery is pkg/worker's bound on how often a puller measures its
// drained-to mark.
const markEvery = 500 * ms

// recordMark is pkg/worker's puller's, between batches: while a change of
// N's barrier waits for the unit, at most every markEvery, read the
// consumer (natsops.MarkOf: when its pending rows are as many as the rows
// held, every row up to the last delivered is acknowledged or held; else
// the ack floor) and record the mark under the claim token
// (poolctl.OrderMarks, guarded). Both requests take their time on the
// way, and acks sent before may land after the read.
func (pl *puller) recordMark() {
	w, p := pl.w, pl.p
	b := p.member.Barrier()
	if b == nil || !b.ChangesN() || w.s.now-pl.markedAt < markEvery {
		return
	}
	u := mustUnit(pl.unit)
	if pb, ok := b.Partition(u.Partition); !ok || pb.Lifted(u.Shard) {
		return
	}
	pl.markedAt = w.s.now
	if p.cut(w.s.now) {
		return
	}
	c, held, tok := w.cons[pl.unit], len(pl.held), pl.tok
	w.s.after(w.s.between(100*1000, 2*ms), nil, func() {
		mark := c.ackFloor()
		if c.ackPending() == held || w.mut.markPastPending {
			mark = c.delivered
		}
		w.s.after(w.s.between(100*1000, 2*ms), nil, func() {
			err := w.twin.MarkDrained(context.Background(), tok, b.Epoch, mark)
			w.tracef("%s marks %s drained to %d (barrier of epoch %d, %d held): %v", p.id, pl.unit, mark, b.Epoch, held, err)
		})
	})
}

// holds reports whether the barrier holds d: a row of a key with a row
// held already waits behind it; else the member's rule decides.
func (pl *puller) holds(d delivered) bool {
	if d.m.key == "" {
		return false
	}
	return pl.heldKeys[d.m.key] > 0 || pl.p.member.Holds(time.Duration(pl.w.s.now), pl.unit, d.m.seq, d.m.key)
}

// hold keeps d back, neither delivered nor settled.
func (pl *puller) hold(d delivered) {
	if len(pl.held) == 0 {
		pl.keptAt = pl.w.s.now
	}
	if pl.heldKeys == nil {
		pl.heldKeys = map[string]int{}
	}
	d.fetched = pl.fetchStart
	pl.held = append(pl.held, d)
	pl.heldKeys[d.m.key]++
	pl.w.tracef("%s holds %s (key %s, seq %d) in %s", pl.p.id, d.m.rowID, d.m.key, d.m.seq, pl.unit)
}

// releaseHeld moves the held rows the barrier lets go, in arrival order,
// to the front of the queue, and reports whether it moved any. A row
// stays held while an earlier row of its key does.
func (pl *puller) releaseHeld() bool {
	if len(pl.held) == 0 || !pl.may() {
		return false
	}
	blocked := map[string]bool{}
	var keep, out []delivered
	for _, d := range pl.held {
		if blocked[d.m.key] || pl.p.member.Holds(time.Duration(pl.w.s.now), pl.unit, d.m.seq, d.m.key) {
			blocked[d.m.key] = true
			keep = append(keep, d)
			continue
		}
		if pl.heldKeys[d.m.key]--; pl.heldKeys[d.m.key] == 0 {
			delete(pl.heldKeys, d.m.key)
		}
		d.released = true
		out = append(out, d)
	}
	pl.held = keep
	pl.queue = append(out, pl.queue...)
	return len(out) > 0
}

// keepHeld sends InProgress for every held row a third of ack_wait after
// the last time, so none is redelivered while it waits.
func (pl *puller) keepHeld() {
	w, p := pl.w, pl.p
	if len(pl.held) == 0 || w.s.now-pl.keptAt < ackWait/3 || !pl.may() {
		return
	}
	pl.keptAt = w.s.now
	if p.cut(w.s.now) {
		return // lost on the way
	}
	c := w.cons[pl.unit]
	for _, d := range pl.held {
		w.s.after(w.s.between(100*1000, 2*ms), nil, func() { c.inProgress(d.m, d.deliveries, w.s.now, ackWait) })
	}
}

// handBackHeld naks the rows still held when the puller stops, for the
// next holder to hold in turn; withheld when the claim is lost.
func (pl *puller) handBackHeld() {
	for _, d := range pl.held {
		if !pl.may() {
			pl.record(history.KindWithheld, d, "claim lost while the order barrier held the row")
			pl.withheld = true
			continue
		}
		pl.record(history.KindNak, d, "held by the order barrier when the puller stopped")
		pl.settle(d, false)
	}
	pl.held, pl.heldKeys = nil, nil
}
