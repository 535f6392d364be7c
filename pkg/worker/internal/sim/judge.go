package sim

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// judge decides the run from the evidence, as the chaos suite does:
// historycheck.Check on the processes' histories, the twin's claim, lease
// and epoch history and the sink; then P5 from the twin's history.
func (w *world) judge() {
	ctx := context.Background()
	claims, err := w.twin.ClaimHistory(ctx, topology)
	must(err)
	leases, err := w.twin.LeaseHistory(ctx, topology)
	must(err)
	epochs, err := w.twin.EpochHistory(ctx, topology)
	must(err)
	in := historycheck.Input{Sink: w.sink, Published: w.published, Grace: Params.Grace}
	if w.order != nil {
		in.Keys, in.Ordering = w.order.keys, historycheck.OrderingPerKey
	}
	for _, p := range w.procs {
		// Every process the world started has a history; none is cut.
		in.Expected = append(in.Expected, historycheck.ExpectedProcess{Member: p.name})
		clock := history.Record{Kind: history.KindClock, Member: p.name, Start: p.started, Wall: base.UnixNano() + p.started}
		in.Processes = append(in.Processes, history.Process{Name: p.id, Records: append([]history.Record{clock}, p.rec...),
			MonoToWall: base.UnixNano()})
	}
	for _, c := range claims {
		in.Claims = append(in.Claims, historycheck.ClaimEvent{Unit: c.Unit, Owner: c.Owner, Incarnation: c.Incarnation,
			Epoch: c.Epoch, State: string(c.State), Under: c.Under, Op: c.Op, At: c.At})
	}
	for _, l := range leases {
		in.Leases = append(in.Leases, historycheck.LeaseEvent(l))
	}
	for _, e := range epochs {
		in.Epochs = append(in.Epochs, historycheck.EpochSpan{Number: e.Number, Partitions: e.Partitions, Shards: e.Shards,
			ActivatedAt: e.ActivatedAt, RetiredAt: e.RetiredAt})
	}
	v := historycheck.Check(in)
	var violations []historycheck.Violation
	for _, x := range v.Violations {
		if x.Check != historycheck.CheckP5 {
			violations = append(violations, x)
		}
	}
	violations = append(violations, w.p5OnRegistryClock(in)...)
	for _, x := range violations {
		at := "the end"
		if !x.At.IsZero() {
			at = x.At.Sub(base).String()
		}
		w.fail = append(w.fail, fmt.Sprintf("at %s: historycheck %s", at, x))
	}
	if !v.Clean() && len(v.Violations) == 0 {
		w.fail = append(w.fail, "historycheck: "+v.Table())
	}
	sort.SliceStable(w.fail, func(i, j int) bool { return failAt(w.fail[i]) < failAt(w.fail[j]) })
}

// failAt reads the instant a violation message starts with.
func failAt(s string) time.Duration {
	d := time.Duration(1<<63 - 1)
	var rest string
	if _, err := fmt.Sscanf(s, "at %s", &rest); err == nil {
		if x, err := time.ParseDuration(rest[:len(rest)-1]); err == nil {
			d = x
		}
	}
	return d
}

// regTime is the registry's clock at virtual instant t: the wall clock
// plus every step made by then.
func (w *world) regOffset(wall time.Time) int64 {
	t := int64(wall.Sub(base))
	off := int64(0)
	for _, o := range w.offsets {
		if o[0] <= t {
			off = o[1]
		}
	}
	return off
}

// p5OnRegistryClock judges P5 as historycheck does, but with the claim
// and lease history put on the registry's clock as it read at each event:
// the simulator steps that clock (Twin.ShiftClock) while the twin's
// history keeps the unshifted one, and P5 is the registry's rule on its
// own clock (design.md section 7), which a stepped clock may not break.
// Only the P5 verdict of this pass counts; every other check reads the
// unshifted history against the processes' clock.
func (w *world) p5OnRegistryClock(in historycheck.Input) []historycheck.Violation {
	shift := func(t time.Time) time.Time {
		if t.IsZero() {
			return t
		}
		return t.Add(time.Duration(w.regOffset(t)))
	}
	reg := in
	reg.Claims = make([]historycheck.ClaimEvent, len(in.Claims))
	for i, c := range in.Claims {
		c.At = shift(c.At)
		reg.Claims[i] = c
	}
	reg.Leases = make([]historycheck.LeaseEvent, len(in.Leases))
	for i, l := range in.Leases {
		off := time.Duration(w.regOffset(l.At))
		l.At, l.ExpiresAt = l.At.Add(off), l.ExpiresAt.Add(off)
		if !l.FenceLiftedAt.IsZero() {
			l.FenceLiftedAt = l.FenceLiftedAt.Add(off)
		}
		reg.Leases[i] = l
	}
	var out []historycheck.Violation
	for _, x := range historycheck.Check(reg).Violations {
		if x.Check == historycheck.CheckP5 {
			out = append(out, x)
		}
	}
	return out
}
