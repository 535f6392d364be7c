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
	// Draining is the operator's request that the member hand everything
	// over; it survives rejoins until the operator clears it.
	Draining bool
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
}

// epochRow is a topology epoch as the rules see it.
type epochRow struct {
	Number     int64
	Partitions int
	Shards     int
	State      EpochState
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

// claimInput is everything Claim reads, in one consistent view.
type claimInput struct {
	Now     time.Time
	Grace   time.Duration
	Claimer *memberRow
	Active  *epochRow
	Pending bool
	Row     *claimRow  // nil: never claimed
	Owner   *memberRow // the row's owner, when held
}

// claimDecision is what Claim writes.
type claimDecision struct {
	Noop     bool // this incarnation holds it already
	Insert   bool // first claim ever
	NewEpoch int64
	Adopted  bool
	Settled  bool
	From     string
}

// decideClaim applies the claim rules (P1, P2, P5) to one view.
func decideClaim(ref MemberRef, under int64, unit string, in claimInput) (claimDecision, error) {
	if err := checkMember(ref, in.Claimer, in.Now); err != nil {
		return claimDecision{}, err
	}
	if in.Claimer.Fenced {
		return claimDecision{}, fmt.Errorf("claim %s by %s: %w", unit, ref.Member, ErrFenced)
	}
	row := in.Row
	if row != nil && row.State != StateFree && row.Owner == ref.Member && row.OwnerIncarnation == ref.Incarnation {
		// A repeat (say after a lost reply) takes no new decision.
		return claimDecision{Noop: true, NewEpoch: row.Epoch}, nil
	}
	if in.Active == nil {
		return claimDecision{}, fmt.Errorf("claim %s: %w", unit, ErrNoActiveEpoch)
	}
	if under != in.Active.Number {
		return claimDecision{}, fmt.Errorf("claim %s under epoch %d, active is %d: %w", unit, under, in.Active.Number, ErrEpochMoved)
	}
	if in.Pending {
		return claimDecision{}, fmt.Errorf("claim %s: %w", unit, ErrFrozen)
	}
	p, s, err := parseUnit(unit)
	if err != nil {
		return claimDecision{}, err
	}
	if p >= in.Active.Partitions || s >= in.Active.Shards {
		return claimDecision{}, fmt.Errorf("claim %s under %dx%d: %w", unit, in.Active.Partitions, in.Active.Shards, ErrUnitOutOfRange)
	}
	switch {
	case row == nil:
		return claimDecision{Insert: true, NewEpoch: 1}, nil
	case row.State == StateFree:
		return claimDecision{NewEpoch: row.Epoch + 1}, nil
	case row.Owner == ref.Member:
		// An earlier incarnation of this member: re-home it.
		return claimDecision{NewEpoch: row.Epoch + 1, From: row.Owner}, nil
	case row.State == StateHandover && (row.HandoverTo == "" || row.HandoverTo == ref.Member):
		return claimDecision{NewEpoch: row.Epoch + 1, Settled: true, From: row.Owner}, nil
	}
	held := &HeldError{Unit: unit, Owner: row.Owner, Epoch: row.Epoch, Reason: HeldOwnerLive}
	if row.State == StateHandover {
		held.Reason = HeldHandoverToOther
	}
	if in.Owner != nil && !in.Owner.Left {
		held.AdoptableAt = in.Owner.LeaseExpiresAt.Add(in.Grace)
		if in.Now.Before(in.Owner.LeaseExpiresAt) {
			return claimDecision{}, held
		}
		if in.Now.Before(held.AdoptableAt) {
			held.Reason = HeldOwnerGrace
			return claimDecision{}, held
		}
	}
	// The owner's lease lapsed at least the grace ago: adoptable, unless
	// the claimer's own fence lifted less than the grace ago.
	if !in.Claimer.FenceLiftedAt.IsZero() && in.Now.Before(in.Claimer.FenceLiftedAt.Add(in.Grace)) {
		held.Reason = HeldClaimerFenceGrace
		held.AdoptableAt = in.Claimer.FenceLiftedAt.Add(in.Grace)
		return claimDecision{}, held
	}
	return claimDecision{NewEpoch: row.Epoch + 1, Adopted: true, From: row.Owner}, nil
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

// joinRow is the member row a join writes.
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
	}
	return m
}
