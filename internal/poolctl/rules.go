package poolctl

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// This file holds the rules both backends apply after reading the state
// they need, so PG and Twin differ only in how they read and write.

// memberRow is a member as the rules see it.
type memberRow struct {
	Name           string
	Slot           int // -1 for none
	Incarnation    int64
	LeaseExpiresAt time.Time
	Left           bool
	Fenced         bool
	FenceLiftedAt  time.Time // zero if never
	// FenceGen is the last fence generation recorded for this incarnation
	// (0 after a join).
	FenceGen int64
	// Draining is the operator's request that the member hand everything
	// over; it survives rejoins until the operator clears it.
	Draining bool
	// PrevLeaseExpiresAt is the latest lease expiry of the member's earlier
	// incarnations that had not left (zero if none): until it plus the
	// grace, a second process under this name may still be delivering.
	PrevLeaseExpiresAt time.Time
	// Process names the process granted this incarnation, as its Rejoin
	// named it ("" for Join).
	Process string
}

func (m *memberRow) live(now time.Time) bool {
	return m != nil && !m.Left && now.Before(m.LeaseExpiresAt)
}

// claimRow is a claim as the rules see it.
type claimRow struct {
	Unit             string
	Owner            string
	OwnerIncarnation int64
	Epoch            int64
	State            ClaimState
	HandoverTo       string
	CheckpointSeq    int64
	// AdoptedFrom and Rehomed record the last claim decision when it was
	// an adoption (the previous owner) or a re-home (the member itself),
	// so a repeat after a lost reply reports it again. Every other
	// transition clears them.
	AdoptedFrom string
	Rehomed     bool
	// LastOp and UnderEpoch are what the history records for the row's
	// last transition.
	LastOp     claimOp
	UnderEpoch int64
}

// epochRow is a topology epoch as the rules see it.
type epochRow struct {
	Number     int64
	Partitions int
	Shards     int
	State      EpochState
	// ActivatedWall and RetiredWall are on the wall clock of the history
	// (zero when not yet).
	ActivatedWall, RetiredWall time.Time
}

// checkMember is the common precondition of a member's own operations:
// the row exists, has not left, is this incarnation, and its lease is live.
func checkMember(ref MemberRef, m *memberRow, now time.Time) error {
	switch {
	case m == nil || m.Left:
		return fmt.Errorf("member %s: %w", ref.Member, ErrNotMember)
	case m.Incarnation != ref.Incarnation:
		return fmt.Errorf("member %s incarnation %d (current %d): %w", ref.Member, ref.Incarnation, m.Incarnation, ErrStaleIncarnation)
	case !now.Before(m.LeaseExpiresAt):
		return fmt.Errorf("member %s incarnation %d: %w", ref.Member, ref.Incarnation, ErrLeaseExpired)
	}
	return nil
}

// checkIncarnation is checkMember without the lease: for operations that
// only narrow what the member may do (Fence) or that must work after a
// lapse.
func checkIncarnation(ref MemberRef, m *memberRow) error {
	switch {
	case m == nil || m.Left:
		return fmt.Errorf("member %s: %w", ref.Member, ErrNotMember)
	case m.Incarnation != ref.Incarnation:
		return fmt.Errorf("member %s incarnation %d (current %d): %w", ref.Member, ref.Incarnation, m.Incarnation, ErrStaleIncarnation)
	}
	return nil
}

// parseUnit splits "p.s".
func parseUnit(unit string) (p, s int, err error) {
	ps, ss, ok := strings.Cut(unit, ".")
	if ok {
		p, err = strconv.Atoi(ps)
		if err == nil {
			s, err = strconv.Atoi(ss)
		}
	}
	if !ok || err != nil || p < 0 || s < 0 || strconv.Itoa(p) != ps || strconv.Itoa(s) != ss {
		return 0, 0, fmt.Errorf("unit %q is not p.s: %w", unit, ErrInvalid)
	}
	return p, s, nil
}

// tokenValid is the write guard: the claim is held at the token's epoch by
// the token's member, whose current incarnation owns it and is live.
func tokenValid(t Token, row *claimRow, owner *memberRow, now time.Time) error {
	stale := &StaleEpochError{Token: t}
	switch {
	case row == nil:
		stale.Reason = StaleAbsent
		return stale
	case row.State == StateFree:
		stale.Reason, stale.Epoch = StaleFree, row.Epoch
		return stale
	}
	stale.Owner, stale.Epoch = row.Owner, row.Epoch
	if row.Owner != t.Member || row.Epoch != t.Epoch {
		stale.Reason = StaleMoved
		return stale
	}
	if !owner.live(now) || owner.Incarnation != row.OwnerIncarnation {
		stale.Reason = StaleLease
		return stale
	}
	return nil
}

// givesUp checks a release or handover: only the token's epoch and owner
// matter, since giving a unit up can only narrow who may deliver it.
func givesUp(t Token, row *claimRow) error {
	stale := &StaleEpochError{Token: t}
	switch {
	case row == nil:
		stale.Reason = StaleAbsent
		return stale
	case row.State == StateFree:
		stale.Reason, stale.Epoch = StaleFree, row.Epoch
		return stale
	case row.Owner != t.Member || row.Epoch != t.Epoch:
		stale.Reason, stale.Owner, stale.Epoch = StaleMoved, row.Owner, row.Epoch
		return stale
	}
	return nil
}

// pickSlot returns the member's slot on join: its own when it still has
// one, otherwise the lowest slot no live member holds. taken reports the
// non-live member whose slot is taken over ("" if none).
func pickSlot(self *memberRow, members []memberRow, now time.Time) (slot int, taken string) {
	if self != nil && self.Slot >= 0 {
		return self.Slot, ""
	}
	holder := map[int]*memberRow{}
	for i := range members {
		if members[i].Slot >= 0 {
			holder[members[i].Slot] = &members[i]
		}
	}
	for s := 0; ; s++ {
		h, ok := holder[s]
		if !ok {
			return s, ""
		}
		if !h.live(now) && (self == nil || h.Name != self.Name) {
			return s, h.Name
		}
	}
}

// joinView is everything a join reads, in one consistent view.
type joinView struct {
	NextInc int64
	Now     time.Time
	Params  Params
	Members []memberRow
}

// joinDecision is what a join writes.
type joinDecision struct {
	// Prev is the member's row before the join (nil: never joined), and
	// Taken the member that is not live whose slot the join takes (nil:
	// none). PG writes only if both are still as read.
	Prev, Taken *memberRow
	// Row is the member row the join writes.
	Row memberRow
	// LiftsFence says the join lifts a fence (the earlier incarnation was
	// fenced or its lease lapsed): Row.FenceLiftedAt is the join's time.
	LiftsFence bool
	// Own, when set, is the caller's process's own live incarnation,
	// later than the one the caller names: the join renews it (as Renew
	// does) and returns it instead of starting another (ownIncarnation).
	Own *memberRow
}

// ownIncarnation reports the live incarnation that the calling process
// already holds, later than the one it names: its own join that reached
// the registry after it had given up on it and joined again, or one whose
// reply was lost. A join by that process then renews it rather than
// starting a new one: a new incarnation would supersede the one the
// process delivers under (its renewal refused as stale only a renew
// interval later, its deliveries meanwhile outside its claim: simulator
// seeds 10819, 20380 once late joins commit), and the late join's reply
// finds nobody waiting anyway.
func ownIncarnation(ref MemberRef, process string, cur *memberRow, now time.Time) bool {
	return cur != nil && process != "" && cur.Process == process && !cur.Left && cur.live(now) &&
		cur.Incarnation > ref.Incarnation
}

// decideJoin applies the membership rules to one view. A rejoin (the
// process that held ref.Incarnation) is refused once a later incarnation
// went to another process (checkDisplaced).
func decideJoin(ref MemberRef, rejoin bool, process string, v joinView) (joinDecision, error) {
	var prev *memberRow
	for i := range v.Members {
		if v.Members[i].Name == ref.Member {
			prev = &v.Members[i]
		}
	}
	if rejoin {
		if ownIncarnation(ref, process, prev, v.Now) {
			return joinDecision{Prev: prev, Own: prev}, nil
		}
		if err := checkDisplaced(ref, process, prev); err != nil {
			return joinDecision{}, err
		}
	}
	slot, taken := pickSlot(prev, v.Members, v.Now)
	d := joinDecision{Prev: prev, Row: joinRow(ref.Member, prev, slot, v.NextInc, v.Now, v.Params.LeaseTTL),
		LiftsFence: prev != nil && (prev.Fenced || !prev.live(v.Now))}
	d.Row.Process = process
	for i := range v.Members {
		if taken != "" && v.Members[i].Name == taken {
			d.Taken = &v.Members[i]
		}
	}
	return d, nil
}

// checkDisplaced refuses a rejoin by the process that held ref's
// incarnation when a later incarnation of the same name was granted to
// another process under the same pod name. The later process keeps the
// name: were the earlier one allowed back, each would displace the other
// at every renewal, and since every join starts the same-name grace again
// from the displaced incarnation's expiry, neither would ever get the
// units re-homed (issue 20, defect 6). The refusal holds after the later
// incarnation lapsed or left too: the earlier process is the old pod's,
// and were it let back in, the later one's own rejoin or the pod's next
// process (a first join takes the name) would displace it while it
// delivers (the simulator, seed 9064). The rejoin proceeds when the
// current incarnation is the caller's own (not later than ref's, or
// granted to the same process: a join that reached the registry after the
// caller had given up on it, or whose reply was lost), and for a process
// that never had a lease (ref.Incarnation 0), which takes the name as
// Join does.
func checkDisplaced(ref MemberRef, process string, cur *memberRow) error {
	switch {
	case cur == nil || ref.Incarnation == 0 || cur.Incarnation <= ref.Incarnation:
		return nil
	case process != "" && cur.Process == process:
		return nil
	}
	return &DisplacedError{Member: ref.Member, Incarnation: ref.Incarnation, Current: cur.Incarnation,
		LiveUntil: cur.LeaseExpiresAt}
}

// joinRow is the member row a join writes. It starts the incarnation at
// fence generation 0 and records until when an earlier, not departed
// incarnation may still be delivering (see rehomeAt).
func joinRow(member string, prev *memberRow, slot int, incarnation int64, now time.Time, ttl time.Duration) memberRow {
	m := memberRow{Name: member, Slot: slot, Incarnation: incarnation, LeaseExpiresAt: now.Add(ttl)}
	if prev != nil {
		m.FenceLiftedAt = prev.FenceLiftedAt
		m.Draining = prev.Draining
		// A member that was fenced, or whose lease lapsed (so it must have
		// fenced itself), lifts its fence by joining: P5's grace applies.
		if prev.Fenced || !prev.live(now) {
			m.FenceLiftedAt = now
		}
		if !prev.Left {
			m.PrevLeaseExpiresAt = laterOf(prev.LeaseExpiresAt, prev.PrevLeaseExpiresAt)
		}
	}
	return m
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// rehomeAt is the earliest registry time at which the member's current
// incarnation may re-home units an earlier incarnation holds: that
// incarnation's lease expiry plus the grace, so a second process under the
// same name has fenced itself (P5) before the new one delivers. Zero means
// at once (the earlier incarnation left).
func rehomeAt(m *memberRow, grace time.Duration) time.Time {
	if m.PrevLeaseExpiresAt.IsZero() {
		return time.Time{}
	}
	return m.PrevLeaseExpiresAt.Add(grace)
}

// mayRehome reports whether the member may re-home now. The SQL of
// ConfirmOwned states the same condition.
func mayRehome(m *memberRow, grace time.Duration, now time.Time) bool {
	at := rehomeAt(m, grace)
	return at.IsZero() || !now.Before(at)
}

// fenceApplies says whether a Fence of generation gen changes the member:
// only a generation above the last recorded one does, so a Fence that
// arrives after the Unfence of its own generation is a no-op. The SQL of
// PG.Fence states the same condition.
func fenceApplies(m *memberRow, gen int64) bool { return gen > m.FenceGen }

// unfenceApplies says whether an Unfence of generation gen changes the
// member: it lifts every fence up to gen; an older one is a no-op.
func unfenceApplies(m *memberRow, gen int64) bool { return gen >= m.FenceGen }

// applyFence and applyUnfence are the twin's writes of the two rules above.
func applyFence(m *memberRow, gen int64) {
	if fenceApplies(m, gen) {
		m.Fenced, m.FenceGen = true, gen
	}
}

func applyUnfence(m *memberRow, gen int64, now time.Time) {
	if !unfenceApplies(m, gen) {
		return
	}
	// A repeated Unfence does not move the lift, so it cannot extend the
	// grace either.
	if m.Fenced {
		m.FenceLiftedAt = now
	}
	m.Fenced, m.FenceGen = false, gen
}
