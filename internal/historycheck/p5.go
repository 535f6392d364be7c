package historycheck

import (
	"fmt"
	"time"
)

// Claim ops P5 judges beside OpAdopt.
const (
	OpRehome = "rehome"
	OpSettle = "settle"
	// OpRecover is the registry's Recover after a failover moving a
	// unit's token past every token a lost primary may have issued. It
	// gives the unit to nobody: the row keeps the holder the promoted
	// standby knew, whose lease Recover ends in the same transaction.
	OpRecover = "recover"
)

// checkP5 is P5 judged from the registry's own history: every change of a
// unit's holder against the previous holder's lease and the new holder's
// fence (package doc, "P5").
func (c *checker) checkP5(v *Verdict) {
	report := func(at int64, detail string) {
		v.P5Violations++
		c.ex.add(CheckP5, at, detail)
	}
	if c.in.Grace <= 0 {
		report(noInstant, "the input names no grace (Input.Grace): adoptions cannot be judged")
		return
	}
	t := c.claimIndex()
	grace := c.in.Grace.Nanoseconds()
	for unit, list := range t.claims {
		for i := range list {
			var prev *ClaimEvent
			if i > 0 {
				prev = list[i-1].ev
			}
			why := t.p5Violation(prev, list[i].ev, list[i].at, grace)
			if why == "" {
				why = t.afterRecoverViolation(list, i, grace)
			}
			if why != "" {
				e := list[i].ev
				report(list[i].at, fmt.Sprintf("%s of unit %s by %s inc %d epoch %d at %s: %s",
					e.Op, unit, e.Owner, e.Incarnation, e.Epoch, fmtTime(list[i].at), why))
			}
		}
	}
}

// afterRecoverViolation judges a decision that follows Recover's token
// moves (list[i-1], ... are OpRecover) against the holder before them. A
// promoted standby may have lost the last claims and renewals: the holder
// the clients knew (the event before the recovery, from the lost
// primary's history) may believe in its lease until the latest expiry any
// of its renewals granted, which the standby never saw. Nobody may be
// given the unit before that expiry plus the grace.
func (t *tokens) afterRecoverViolation(list []claimAt, i int, grace int64) string {
	e, x := list[i].ev, list[i].at
	if !givesUnit(e) {
		return ""
	}
	j := i - 1
	for j >= 0 && list[j].ev.Op == OpRecover {
		j--
	}
	if j == i-1 || j < 0 {
		return "" // not after a recovery, or nothing before it
	}
	before := list[j].ev
	if before.Owner == "" || (before.State != StateHeld && before.State != StateHandover) ||
		(before.Owner == e.Owner && before.Incarnation == e.Incarnation) {
		return ""
	}
	if until, ok := t.latestExpiry(before.Owner, before.Incarnation, x); ok && until+grace > x {
		return fmt.Sprintf("after a recovery: %s (inc %d, epoch %d) held it before, its lease possibly live until %s, less than the grace (%s) before",
			before.Owner, before.Incarnation, before.Epoch, fmtTime(until), time.Duration(grace))
	}
	return ""
}

// givesUnit says whether claim event e is a decision that gives its unit
// to a member.
func givesUnit(e *ClaimEvent) bool {
	return e.Owner != "" && e.State == StateHeld &&
		(e.Op == OpClaim || e.Op == OpAdopt || e.Op == OpRehome || e.Op == OpSettle)
}

// p5Violation says why event e (at x), following prev on its unit, breaks
// P5, or "" if it does not.
func (t *tokens) p5Violation(prev, e *ClaimEvent, x, grace int64) string {
	if !givesUnit(e) {
		return "" // not a decision that gives the unit to someone
	}
	me, ok := t.leaseAt(e.Owner, x)
	switch {
	case !ok:
		return fmt.Sprintf("%s had no lease on record", e.Owner)
	case me.ev.Fenced && e.Op != OpRehome: // a confirmation re-homes a member's own units whatever its fence
		return fmt.Sprintf("%s was fenced (since %s)", e.Owner, fmtTime(me.at))
	case e.Op == OpAdopt && !me.ev.FenceLiftedAt.IsZero() && me.ev.FenceLiftedAt.UnixNano()+grace > x:
		return fmt.Sprintf("%s's own fence lifted at %s, less than the grace (%s) before", e.Owner,
			fmtTime(me.ev.FenceLiftedAt.UnixNano()), time.Duration(grace))
	}
	held := prev != nil && prev.Owner != "" && (prev.State == StateHeld || prev.State == StateHandover)
	if !held || (prev.Owner == e.Owner && prev.Incarnation == e.Incarnation) {
		return "" // nobody else held it
	}
	switch {
	case e.Op == OpAdopt:
		// The registry judges the member's current lease, of any
		// incarnation: a member that rejoined protects its units.
		owner, ok := t.leaseAt(prev.Owner, x)
		switch {
		case !ok:
			return fmt.Sprintf("the owner %s had no lease on record", prev.Owner)
		case owner.ev.Left:
			return ""
		case owner.expires+grace > x:
			return fmt.Sprintf("the owner %s's lease (inc %d) expired at %s, less than the grace (%s) before",
				prev.Owner, owner.ev.Incarnation, fmtTime(owner.expires), time.Duration(grace))
		}
	case e.Op == OpRehome:
		if prev.Owner != e.Owner {
			return fmt.Sprintf("re-home of a unit held by another member, %s", prev.Owner)
		}
		// The earlier incarnation may still be delivering until its lease
		// plus the grace has passed.
		old, ok := t.incarnationLeaseAt(prev.Owner, prev.Incarnation, x)
		switch {
		case !ok:
			return fmt.Sprintf("incarnation %d of %s had no lease on record", prev.Incarnation, prev.Owner)
		case !old.ev.Left && old.expires+grace > x:
			return fmt.Sprintf("incarnation %d's lease expired at %s, less than the grace (%s) before",
				prev.Incarnation, fmtTime(old.expires), time.Duration(grace))
		}
	case prev.State == StateHeld:
		// A plain claim (or settle) of a unit another token held: legal
		// only once that holder's lease was over, else two valid claims.
		old, ok := t.incarnationLeaseAt(prev.Owner, prev.Incarnation, x)
		if ok && !old.ev.Left && old.expires > x {
			return fmt.Sprintf("two valid claims: %s (inc %d, epoch %d) held it, its lease live until %s",
				prev.Owner, prev.Incarnation, prev.Epoch, fmtTime(old.expires))
		}
	}
	return ""
}

// leaseAt is member's lease event holding at x.
func (t *tokens) leaseAt(member string, x int64) (leaseAt, bool) {
	list := t.leases[member]
	i := holding(len(list), func(i int) int64 { return list[i].at }, x)
	if i < 0 {
		return leaseAt{}, false
	}
	return list[i], true
}

// latestExpiry is the latest expiry any lease event of member's
// incarnation inc at or before x granted: across a failover the last
// event (the promoted standby's, or Recover's end of every lease) may be
// earlier than a renewal only the lost primary had.
func (t *tokens) latestExpiry(member string, inc, x int64) (int64, bool) {
	list := t.leases[member]
	var (
		until int64
		found bool
	)
	for i := holding(len(list), func(i int) int64 { return list[i].at }, x); i >= 0; i-- {
		if list[i].ev.Incarnation == inc && (!found || list[i].expires > until) {
			until, found = list[i].expires, true
		}
	}
	return until, found
}

// incarnationLeaseAt is the last lease event of member's incarnation inc
// at or before x.
func (t *tokens) incarnationLeaseAt(member string, inc, x int64) (leaseAt, bool) {
	list := t.leases[member]
	for i := holding(len(list), func(i int) int64 { return list[i].at }, x); i >= 0; i-- {
		if list[i].ev.Incarnation == inc {
			return list[i], true
		}
	}
	return leaseAt{}, false
}
