package sim

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
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
	in := historycheck.Input{Sink: w.sink, Published: w.published}
	for _, p := range w.procs {
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
	if !v.Clean() {
		for _, x := range v.Violations {
			at := "the end"
			if !x.At.IsZero() {
				at = x.At.Sub(base).String()
			}
			w.fail = append(w.fail, fmt.Sprintf("at %s: historycheck %s", at, x))
		}
		if len(v.Violations) == 0 {
			w.fail = append(w.fail, "historycheck: "+v.Table())
		}
	}
	w.checkP5(claims, leases)
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

// checkP5 judges every adoption and re-home on the registry's own clock:
// the previous holder's lease had expired at least the grace before.
// (historycheck judges P1 from the same history; P5 is the simulator's
// until the checker has it.)
func (w *world) checkP5(claims []poolctl.ClaimEvent, leases []poolctl.LeaseEvent) {
	grace := int64(Params.Grace)
	prev := map[string]poolctl.ClaimEvent{}
	for _, c := range claims {
		p, had := prev[c.Unit]
		prev[c.Unit] = c
		if !had || (c.Op != "adopt" && c.Op != "rehome") || p.State == poolctl.StateFree {
			continue
		}
		// The lease the registry's rule reads: for an adoption, the
		// owner's latest lease at the decision (whatever its
		// incarnation, as the rule reads the member row); for a re-home,
		// the lease of the incarnation that held the claim.
		var last *poolctl.LeaseEvent
		for i := range leases {
			l := &leases[i]
			if l.Member == p.Owner && (c.Op == "adopt" || l.Incarnation == p.Incarnation) && !l.At.After(c.At) {
				last = l
			}
		}
		if last == nil || last.Left {
			continue
		}
		// Lease history stamps are unshifted; put both on the registry's
		// clock as it read at each.
		expires := last.ExpiresAt.UnixNano() + w.regOffset(last.At)
		decided := c.At.UnixNano() + w.regOffset(c.At)
		if decided < expires+grace {
			w.fail = append(w.fail, fmt.Sprintf("at %s: P5: %s of unit %s by %s (incarnation %d) at registry time %s, but %s incarnation %d's lease expired at %s: %s before expiry plus the grace %s",
				c.At.Sub(base), c.Op, c.Unit, c.Owner, c.Incarnation, time.Duration(decided-base.UnixNano()), p.Owner, p.Incarnation,
				time.Duration(expires-base.UnixNano()), time.Duration(expires+grace-decided), Params.Grace))
		}
	}
}
