package historycheck

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// A tiny language for hand-built histories. Times are milliseconds after t0
// on the wall clock; each process gets its own monotonic offset, so every
// test also exercises the conversion through MonoToWall.

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func wall(ms int) int64 { return at(ms).UnixNano() }

type procBuilder struct {
	p      history.Process
	member string
	inc    int64
}

// newProc starts a process of member (incarnation inc) whose monotonic
// clock reads wall time minus an offset of its own.
func newProc(name, member string, inc int64) *procBuilder {
	offset := t0.UnixNano() - int64(len(name)+1)*int64(time.Hour)
	clock := history.Record{Kind: history.KindClock, Member: member, Start: 1000, Wall: 1000 + offset}
	return &procBuilder{p: history.Process{Name: name, Records: []history.Record{clock}, MonoToWall: offset}, member: member, inc: inc}
}

func (b *procBuilder) mono(ms int) int64 { return wall(ms) - b.p.MonoToWall }

func (b *procBuilder) add(k history.Kind, unit string, epoch int64, row string, startMs, endMs int) *procBuilder {
	r := history.Record{Kind: k, Unit: unit, Member: b.member, Incarnation: b.inc, Epoch: epoch, RowID: row, Start: b.mono(startMs)}
	if endMs > 0 {
		r.End = b.mono(endMs)
	}
	b.p.Records = append(b.p.Records, r)
	return b
}

func (b *procBuilder) deliver(unit string, epoch int64, row string, ms int) *procBuilder {
	return b.add(history.KindDeliver, unit, epoch, row, ms, 0).nd(1)
}

func (b *procBuilder) ack(unit string, epoch int64, row string, startMs, endMs int) *procBuilder {
	return b.add(history.KindAck, unit, epoch, row, startMs, endMs)
}

// fetched sets the last (deliver) record's pull start.
func (b *procBuilder) fetched(ms int) *procBuilder {
	b.p.Records[len(b.p.Records)-1].Fetch = b.mono(ms)
	return b
}

// nd sets the last record's NATS delivery count.
func (b *procBuilder) nd(n uint64) *procBuilder {
	b.p.Records[len(b.p.Records)-1].NumDelivered = n
	return b
}

// detail sets the last record's Detail (a settle's error).
func (b *procBuilder) detail(d string) *procBuilder {
	b.p.Records[len(b.p.Records)-1].Detail = d
	return b
}

// fetch records a pull of unit from startMs to endMs that brought rows.
func (b *procBuilder) fetch(unit string, startMs, endMs, rows int) *procBuilder {
	b.add(history.KindFetch, unit, 0, "", startMs, endMs)
	b.p.Records[len(b.p.Records)-1].Rows = rows
	return b
}

func (b *procBuilder) reset(unit string, ms int) *procBuilder {
	return b.add(history.KindReset, unit, 0, "", ms, ms+1)
}

func (b *procBuilder) done() history.Process { return b.p }

func claim(unit, owner string, inc, epoch int64, op string, under int64, ms int) ClaimEvent {
	return ClaimEvent{Unit: unit, Owner: owner, Incarnation: inc, Epoch: epoch, State: StateHeld, Under: under, Op: op, At: at(ms)}
}

func release(unit string, epoch int64, ms int) ClaimEvent {
	return ClaimEvent{Unit: unit, Epoch: epoch, State: StateFree, Op: "release", At: at(ms)}
}

func lease(member string, inc int64, ms, expiresMs int) LeaseEvent {
	return LeaseEvent{Member: member, Incarnation: inc, At: at(ms), ExpiresAt: at(expiresMs)}
}

func epoch(n int64, partitions, shards, activatedMs, retiredMs int) EpochSpan {
	e := EpochSpan{Number: n, Partitions: partitions, Shards: shards, ActivatedAt: at(activatedMs)}
	if activatedMs < 0 {
		e.ActivatedAt = time.Time{}
	}
	if retiredMs > 0 {
		e.RetiredAt = at(retiredMs)
	}
	return e
}

func write(row, unit, member string, epoch int64, ms int) SinkWrite {
	return SinkWrite{RowID: row, Unit: unit, Member: member, Epoch: epoch, At: at(ms)}
}

func published(unit string, rows ...string) map[string]string {
	out := map[string]string{}
	for _, r := range rows {
		out[r] = unit
	}
	return out
}

// example returns the first example of check in v, "" if none.
func example(v Verdict, check string) string {
	for _, x := range v.Violations {
		if x.Check == check {
			return x.Detail
		}
	}
	return ""
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
