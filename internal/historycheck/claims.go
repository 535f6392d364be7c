package historycheck

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
)

// claimAt is a claim event with its instant in ns, for binary search.
type claimAt struct {
	at int64
	ev *ClaimEvent
}

// leaseAt is a lease event with its instants in ns.
type leaseAt struct {
	at, expires int64
	ev          *LeaseEvent
}

// tokens answers "is this token valid at this instant" from the claim and
// lease histories.
type tokens struct {
	claims map[string][]claimAt // by unit, sorted by at
	leases map[string][]leaseAt // by member, sorted by at
}

func indexTokens(claims []ClaimEvent, leases []LeaseEvent) *tokens {
	t := &tokens{claims: map[string][]claimAt{}, leases: map[string][]leaseAt{}}
	for i := range claims {
		c := &claims[i]
		t.claims[c.Unit] = append(t.claims[c.Unit], claimAt{c.At.UnixNano(), c})
	}
	for _, list := range t.claims {
		// Stable: events of one unit at one instant apply in input order.
		slices.SortStableFunc(list, func(a, b claimAt) int { return cmp.Compare(a.at, b.at) })
	}
	for i := range leases {
		l := &leases[i]
		t.leases[l.Member] = append(t.leases[l.Member], leaseAt{l.At.UnixNano(), l.ExpiresAt.UnixNano(), l})
	}
	for _, list := range t.leases {
		slices.SortStableFunc(list, func(a, b leaseAt) int { return cmp.Compare(a.at, b.at) })
	}
	return t
}

// holding returns the index of the last element with at <= x, or -1.
func holding(n int, at func(int) int64, x int64) int {
	return sort.Search(n, func(i int) bool { return at(i) > x }) - 1
}

// invalid says why the token (unit, member, epoch) of a record of
// incarnation inc (0: not named) is not valid at instant x, or "" if it is.
func (t *tokens) invalid(unit, member string, epoch, inc, x int64) string {
	list := t.claims[unit]
	i := holding(len(list), func(i int) int64 { return list[i].at }, x)
	if i < 0 {
		return fmt.Sprintf("unit %s had no claim yet", unit)
	}
	c := list[i].ev
	switch {
	case c.State != StateHeld && c.State != StateHandover:
		return fmt.Sprintf("claim was %s (%s at epoch %d since %s)", c.State, c.Op, c.Epoch, fmtTime(list[i].at))
	case c.Owner != member || c.Epoch != epoch:
		return fmt.Sprintf("claim was %s's at epoch %d (%s, %s since %s)", c.Owner, c.Epoch, c.State, c.Op, fmtTime(list[i].at))
	case inc != 0 && c.Incarnation != 0 && inc != c.Incarnation:
		return fmt.Sprintf("claim was incarnation %d's, the record is incarnation %d's", c.Incarnation, inc)
	}
	return t.leaseInvalid(member, c.Incarnation, x)
}

// leaseInvalid says why member's lease of incarnation inc is not live at x,
// or "" if it is.
func (t *tokens) leaseInvalid(member string, inc, x int64) string {
	list := t.leases[member]
	i := holding(len(list), func(i int) int64 { return list[i].at }, x)
	if i < 0 {
		return fmt.Sprintf("%s had no lease yet", member)
	}
	l := list[i]
	switch {
	case l.ev.Incarnation != inc:
		return fmt.Sprintf("lease was incarnation %d's (since %s), the claim incarnation %d's", l.ev.Incarnation, fmtTime(l.at), inc)
	case l.ev.Left:
		return fmt.Sprintf("%s left at %s", member, fmtTime(l.at))
	case l.expires <= x:
		return fmt.Sprintf("lease expired at %s", fmtTime(l.expires))
	}
	return ""
}

// movedAway says, for an action of token (unit, member, epoch) whose check
// passed earlier and that took effect until x, whether the unit was
// another token's before x: the claim holding just before x is held or
// handed over by another owner or at another epoch. (An action ending at
// the very instant the claim moves shares no instant with the new owner's,
// as windows touching at an end do not overlap.) "" when it was not.
func (t *tokens) movedAway(unit, member string, epoch, x int64) string {
	list := t.claims[unit]
	i := holding(len(list), func(i int) int64 { return list[i].at }, x-1)
	if i < 0 {
		return ""
	}
	c := list[i].ev
	if (c.State == StateHeld || c.State == StateHandover) && (c.Owner != member || c.Epoch != epoch) {
		return fmt.Sprintf("it took effect until %s, when the claim was %s's at epoch %d (%s since %s)",
			fmtTime(x), c.Owner, c.Epoch, c.Op, fmtTime(list[i].at))
	}
	return ""
}

// actionInvalid judges a record by both its instants: its token must be
// valid at Start (the check passed), and the unit must not have moved to
// another token by its End (the action returned), when it names one.
func (t *tokens) actionInvalid(a *action) string {
	r := a.rec
	if why := t.invalid(r.Unit, a.member, r.Epoch, r.Incarnation, a.start); why != "" {
		return why
	}
	if a.end > a.start {
		return t.movedAway(r.Unit, a.member, r.Epoch, a.end)
	}
	return ""
}

// leaseEnd is the first instant at or after x at which member's lease of
// incarnation inc (of any incarnation when inc is 0) was no longer live,
// or limit when it was live until then: renewals before an expiry carry
// the lease on; a lapse, a leave or another incarnation's join ends it.
func (t *tokens) leaseEnd(member string, inc, x, limit int64) int64 {
	list := t.leases[member]
	i := holding(len(list), func(i int) int64 { return list[i].at }, x)
	if i < 0 {
		return x
	}
	valid := func(l leaseAt) bool { return !l.ev.Left && (inc == 0 || l.ev.Incarnation == inc) }
	if !valid(list[i]) {
		return x
	}
	until := list[i].expires
	for j := i + 1; j < len(list); j++ {
		for j+1 < len(list) && list[j+1].at == list[j].at {
			j++ // of events at one instant, the last holds
		}
		next := list[j]
		if next.at >= limit || next.at > until {
			break // past the window, or lapsed before anything renewed it
		}
		if !valid(next) || (inc == 0 && next.ev.Incarnation != list[i].ev.Incarnation) {
			return max(x, next.at)
		}
		until = next.expires
	}
	return max(x, min(until, limit))
}
