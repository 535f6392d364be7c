package sim

import (
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// puller is one process's pulling of one unit, as the SDK's puller does
// it: fetch, then for each row check the member's permission, record,
// run the handler (a guarded sink write), check again, record and ack. It
// records exactly what the real one records, on the virtual clock.
type puller struct {
	w          *world
	p          *process
	unit       string
	tok        poolctl.Token
	te, inc    int64
	stopping   bool
	done       bool
	fetching   bool
	handling   bool
	queue      []delivered
	fetchStart int64
}

func (w *world) startPuller(p *process, a Action) {
	if old := p.pullers[a.Unit]; old != nil && !old.done {
		// Two pullers of one unit in one process: the member asked for a
		// second before the first stopped.
		w.violate("second puller: process %s started a second puller of unit %s (epoch %d) while one ran (epoch %d)",
			p.id, a.Unit, a.Token.Epoch, old.tok.Epoch)
	}
	pl := &puller{w: w, p: p, unit: a.Unit, tok: a.Token, te: a.TopologyEpoch, inc: a.Incarnation}
	p.pullers[a.Unit] = pl
	w.tracef("%s starts puller %s@%d", p.id, a.Unit, a.Token.Epoch)
	w.s.after(0, p, pl.fetch)
}

// stop asks the puller to stop once the row its handler runs is settled.
func (pl *puller) stop() {
	if pl.stopping {
		return
	}
	pl.stopping = true
	if !pl.fetching && !pl.handling {
		pl.w.s.after(0, pl.p, pl.next)
	}
}

func (pl *puller) may() bool {
	return !pl.stopping && pl.p.member.May(time.Duration(pl.w.s.now), pl.unit, pl.tok.Epoch)
}

func (pl *puller) fetch() {
	w, p := pl.w, pl.p
	if pl.stopping {
		pl.finish()
		return
	}
	pl.fetching = true
	pl.fetchStart = w.s.now
	start := w.s.now
	c := w.cons[pl.unit]
	reply := func(rows []delivered) {
		pl.fetching = false
		p.record(history.Record{Kind: history.KindFetch, Unit: pl.unit, Member: p.name, Incarnation: pl.inc,
			Epoch: pl.tok.Epoch, Rows: len(rows), Start: start, End: w.s.now})
		pl.queue = append(pl.queue, rows...)
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

// next handles the next fetched row, or fetches again.
func (pl *puller) next() {
	w, p := pl.w, pl.p
	for len(pl.queue) > 0 {
		d := pl.queue[0]
		pl.queue = pl.queue[1:]
		r := history.Record{Unit: pl.unit, Member: p.name, Incarnation: pl.inc, Epoch: pl.tok.Epoch, TopologyEpoch: pl.te,
			RowID: d.m.rowID, StreamSeq: d.m.seq, NumDelivered: d.deliveries, Start: w.s.now, Fetch: pl.fetchStart}
		if !pl.may() {
			r.Kind, r.Detail = history.KindWithheld, "released"
			p.record(r)
			continue
		}
		r.Kind = history.KindDeliver
		p.record(r)
		pl.handling = true
		w.s.after(w.s.between(ms, 30*ms), p, func() { pl.handled(d) })
		return
	}
	if pl.stopping {
		pl.finish()
		return
	}
	pl.fetch()
}

// handled is the handler's end: the sink write, then the settle.
func (pl *puller) handled(d delivered) {
	w, p := pl.w, pl.p
	pl.handling = false
	r := history.Record{Unit: pl.unit, Member: p.name, Incarnation: pl.inc, Epoch: pl.tok.Epoch, RowID: d.m.rowID,
		StreamSeq: d.m.seq, NumDelivered: d.deliveries, Start: w.s.now, End: w.s.now}
	if !w.write(p, d.m.rowID, pl.tok) {
		r.Kind, r.Detail = history.KindAbandon, "sink refused the token"
		p.record(r)
		pl.next()
		return
	}
	// A handover drains: a row delivered before the stop is still settled.
	if !p.member.May(time.Duration(w.s.now), pl.unit, pl.tok.Epoch) {
		r.Kind, r.Detail = history.KindWithheld, "released"
		p.record(r)
		pl.next()
		return
	}
	r.Kind = history.KindAck
	p.record(r)
	c := w.cons[pl.unit]
	if !p.cut(w.s.now) {
		w.s.after(w.s.between(100*1000, 2*ms), nil, func() { c.ack(d.m) })
	}
	pl.next()
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
	w.tracef("%s puller %s@%d stopped", p.id, pl.unit, pl.tok.Epoch)
	w.deliver(p, Event{Kind: EvPullerStopped, Unit: pl.unit})
}
