package historycheck

import (
	"fmt"
	"slices"
	"strings"
)

// Check decides every check of the package doc from in. It does not modify
// in.
func Check(in Input) Verdict {
	c := &checker{in: in, ev: gatherEvidence(in.Processes), ex: examples{}}
	v := Verdict{
		Processes: len(in.Processes), Truncated: c.ev.truncated,
		Deliveries: len(c.ev.deliveries), Settles: len(c.ev.settles), LoneSettles: len(c.ev.orphans),
		Withheld: c.ev.withheld, Fetches: c.ev.fetches,
		ClaimEvents: len(in.Claims), Leases: len(in.Leases), Epochs: len(in.Epochs),
		SinkWrites: len(in.Sink), Published: len(in.Published),
		Expected:      len(in.Expected),
		ClaimChecksNA: in.NoRegistry, P2NA: in.NoRegistry,
	}
	c.checkHistories(&v)
	if !in.NoRegistry {
		c.clipToLeases()
	}
	c.checkOverlap(&v)
	c.countPulls(&v)
	if !v.ClaimChecksNA {
		c.checkTokens(&v)
		c.checkP2(&v)
		c.checkP5(&v)
	}
	c.checkLost(&v)
	c.checkSink(&v)
	c.checkKeyOrder(&v)
	c.ex.into(&v)
	return v
}

// checker holds one Check's evidence and the examples it found.
type checker struct {
	in Input
	ev *evidence
	ex examples
	t  *tokens // the claim and lease index, built on first use
}

// claimIndex returns the claim and lease index, building it once.
func (c *checker) claimIndex() *tokens {
	if c.t == nil {
		c.t = indexTokens(c.in.Claims, c.in.Leases)
	}
	return c.t
}

// clipToLeases ends each delivery's window no later than its member's
// lease (of the record's incarnation) stopped being live: a process whose
// lease lapsed (paused, cut off) is no longer the unit's owner as far as
// anyone else may act, and what it does after that is judged by the token
// checks of its settles and sink writes. A window left open across a
// release, with the lease live, stays open: a handler still working after
// its member gave the unit up overlaps the next owner.
func (c *checker) clipToLeases() {
	t := c.claimIndex()
	for i := range c.ev.deliveries {
		d := &c.ev.deliveries[i]
		if d.windowEnd > d.end {
			d.windowEnd = max(d.end, t.leaseEnd(d.member, d.rec.Incarnation, d.start, d.windowEnd))
		}
	}
}

// countPulls counts units two processes were pulling at once: their fetch
// windows overlap, whether or not rows came. It is what a field report
// calls "pulled by two processes", and information, not a P1 check: a
// process paused in a pull is pulling without being able to act, and only
// deliveries and settles are actions.
func (c *checker) countPulls(v *Verdict) {
	byUnit := map[string][]window{}
	for i := range c.ev.pulls {
		a := &c.ev.pulls[i]
		byUnit[a.rec.Unit] = append(byUnit[a.rec.Unit], window{a.start, a.end, a.proc, a})
	}
	v.UnitsPulledByTwo = findOverlaps(byUnit).units
}

// checkOverlap is P1 overlap: no two processes' windows on one unit overlap.
func (c *checker) checkOverlap(v *Verdict) {
	byUnit := map[string][]window{}
	for i := range c.ev.deliveries {
		d := &c.ev.deliveries[i]
		byUnit[d.rec.Unit] = append(byUnit[d.rec.Unit], window{d.windowStart, d.windowEnd, d.proc, &d.action})
	}
	for i := range c.ev.orphans {
		a := &c.ev.orphans[i]
		byUnit[a.rec.Unit] = append(byUnit[a.rec.Unit], window{a.start, a.end, a.proc, a})
	}
	o := findOverlaps(byUnit)
	v.OverlappingWindows, v.UnitsDoublePulled, v.MaxDoublePulled = o.pairs, o.units, o.maxAtOnce
	for _, p := range o.firstByUnit {
		c.ex.add(CheckOverlaps, p.b.start, fmt.Sprintf("unit %s: window [%s, %s] of %s overlaps window [%s, %s] of %s",
			p.b.act.rec.Unit, fmtTime(p.a.start), fmtTime(p.a.end), c.describe(p.a.act),
			fmtTime(p.b.start), fmtTime(p.b.end), c.describe(p.b.act)))
	}
}

// checkTokens is P1 validity: deliveries, settles and sink writes each
// happen under a token valid at their instant.
func (c *checker) checkTokens(v *Verdict) {
	t := c.claimIndex()
	for i := range c.ev.deliveries {
		d := &c.ev.deliveries[i].action
		if why := t.actionInvalid(d); why != "" {
			v.StaleDeliveries++
			c.ex.add(CheckStaleDeliveries, d.start, c.describe(d)+": "+why)
		}
	}
	for i := range c.ev.settles {
		a := &c.ev.settles[i]
		if why := t.actionInvalid(a); why != "" {
			v.StaleAcks++
			c.ex.add(CheckStaleAcks, a.start, c.describe(a)+": "+why)
		}
	}
	for i := range c.in.Sink {
		w := &c.in.Sink[i]
		at := w.At.UnixNano()
		if why := t.invalid(w.Unit, w.Member, w.Epoch, 0, at); why != "" {
			v.StaleWrites++
			c.ex.add(CheckStaleWrites, at, describeWrite(w)+": "+why)
		}
	}
}

// checkP2 is P2: claim decisions under their active epoch and its units,
// deliveries only of units of an epoch activated by then, one active epoch
// at a time.
func (c *checker) checkP2(v *Verdict) {
	report := func(at int64, detail string) {
		v.P2Violations++
		c.ex.add(CheckP2, at, detail)
	}
	if len(c.in.Epochs) == 0 {
		// No epochs, no verdict: P2 cannot pass on no evidence.
		report(noInstant, "the evidence has no topology epoch: claims and deliveries cannot be judged against one")
		return
	}
	e := indexEpochs(c.in.Epochs)
	for i := range c.in.Claims {
		cl := &c.in.Claims[i]
		if cl.Op != OpClaim && cl.Op != OpAdopt {
			continue
		}
		if why := e.claimViolation(cl); why != "" {
			report(cl.At.UnixNano(), fmt.Sprintf("%s of unit %s by %s epoch %d at %s: %s", cl.Op, cl.Unit, cl.Owner, cl.Epoch, fmtTime(cl.At.UnixNano()), why))
		}
	}
	for i := range c.ev.deliveries {
		d := &c.ev.deliveries[i].action
		if why := e.deliveryViolation(d.rec.Unit, d.start); why != "" {
			report(d.start, c.describe(d)+": "+why)
		}
	}
	e.together(report)
}

// checkLost is P3: every published row reached the sink.
func (c *checker) checkLost(v *Verdict) {
	written := make(map[string]bool, len(c.in.Sink))
	for i := range c.in.Sink {
		written[c.in.Sink[i].RowID] = true
	}
	var lost []string
	for id := range c.in.Published {
		if !written[id] {
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	v.Lost = len(lost)
	v.LostIDs = lost[:min(len(lost), maxExamples)]
	for _, id := range v.LostIDs {
		c.ex.add(CheckLost, noInstant, fmt.Sprintf("row %s published to unit %s never reached the sink", id, c.in.Published[id]))
	}
}

// describe names a record for a violation: process, kind, unit, member,
// incarnation, epoch, row and times.
func (c *checker) describe(a *action) string {
	r := a.rec
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s unit %s member %s inc %d epoch %d", c.in.Processes[a.proc].Name, r.Kind, r.Unit, a.member, r.Incarnation, r.Epoch)
	if r.RowID != "" {
		fmt.Fprintf(&b, " row %s", r.RowID)
	}
	if r.StreamSeq != 0 {
		fmt.Fprintf(&b, " stream seq %d", r.StreamSeq)
	}
	if r.NumDelivered != 0 {
		fmt.Fprintf(&b, " delivery %d", r.NumDelivered)
	}
	fmt.Fprintf(&b, " at %s", fmtTime(a.start))
	if a.end != a.start {
		fmt.Fprintf(&b, " to %s", fmtTime(a.end))
	}
	if r.Detail != "" {
		fmt.Fprintf(&b, " (%s)", r.Detail)
	}
	return b.String()
}

func describeWrite(w *SinkWrite) string {
	return fmt.Sprintf("sink write of row %s unit %s by %s epoch %d at %s", w.RowID, w.Unit, w.Member, w.Epoch, fmtTime(w.At.UnixNano()))
}
