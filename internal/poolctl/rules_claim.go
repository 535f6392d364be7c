package poolctl

import (
	"fmt"
	"sort"
	"time"
)

// This file holds the claim rules both backends apply to what they read:
// one unit's decision (decideClaim) and the shape of a batch.

// claimOp is what changed a claim row, as the history records it.
type claimOp string

const (
	lastClaim    claimOp = "claim"    // a free or never claimed unit
	lastAdopt    claimOp = "adopt"    // taken after the owner's lease lapsed (P5)
	lastRehome   claimOp = "rehome"   // moved from an earlier incarnation of the member
	lastSettle   claimOp = "settle"   // a handover settled by the new owner's claim
	lastHandover claimOp = "handover" // the owner's intent to give the unit up
	lastRelease  claimOp = "release"  // the owner gave the unit up
	lastRecover  claimOp = "recover"  // Recover moved the token past a lost primary's (recoverSQL; no rule decides it)
)

// claimInput is everything one unit's claim decision reads, in one
// consistent view.
type claimInput struct {
	Now     time.Time
	Grace   time.Duration
	Claimer *memberRow
	Active  *epochRow
	Pending bool
	Row     *claimRow  // nil: never claimed
	Owner   *memberRow // the row's owner, when held
	// Retiring says the unit is in the topology's retiring set.
	Retiring bool
	// RecoveredUntil is the last Recover's instant plus the TTL (zero:
	// never recovered): the end of every lease a lost primary may have
	// granted.
	RecoveredUntil time.Time
}

// claimDecision is what a claim writes.
type claimDecision struct {
	Noop     bool // this incarnation holds it already
	Insert   bool // first claim ever
	NewEpoch int64
	Op       claimOp
	Adopted  bool
	Settled  bool
	Rehomed  bool
	From     string
}

// decideClaim applies the claim rules (P1, P2, P5) to one view.
func decideClaim(ref MemberRef, under int64, unit string, in claimInput) (claimDecision, error) {
	if err := checkClaimer(ref, unit, in); err != nil {
		return claimDecision{}, err
	}
	row := in.Row
	if row != nil && row.State != StateFree && row.Owner == ref.Member && row.OwnerIncarnation == ref.Incarnation {
		// A repeat (say after a lost reply) takes no new decision, and
		// reports the one recorded with the row.
		return claimDecision{Noop: true, NewEpoch: row.Epoch, Adopted: row.AdoptedFrom != "" && !row.Rehomed,
			Rehomed: row.Rehomed, From: row.AdoptedFrom}, nil
	}
	if err := checkClaimable(under, unit, in); err != nil {
		return claimDecision{}, err
	}
	if err := waitRecovered(unit, in); err != nil {
		return claimDecision{}, err
	}
	switch {
	case row == nil:
		return claimDecision{Insert: true, NewEpoch: 1, Op: lastClaim}, nil
	case row.State == StateFree:
		return claimDecision{NewEpoch: row.Epoch + 1, Op: lastClaim}, nil
	case row.Owner == ref.Member:
		return decideRehome(ref, unit, in)
	case row.State == StateHandover && (row.HandoverTo == "" || row.HandoverTo == ref.Member):
		return claimDecision{NewEpoch: row.Epoch + 1, Op: lastSettle, Settled: true, From: row.Owner}, nil
	}
	return decideAdoption(unit, in)
}

// checkClaimer refuses claims by a member that may claim nothing now.
func checkClaimer(ref MemberRef, unit string, in claimInput) error {
	if err := checkMember(ref, in.Claimer, in.Now); err != nil {
		return err
	}
	switch {
	case in.Claimer.Fenced:
		return fmt.Errorf("claim %s by %s: %w", unit, ref.Member, ErrFenced)
	case in.Claimer.Draining:
		return fmt.Errorf("claim %s by %s: %w", unit, ref.Member, ErrDraining)
	}
	return nil
}

// checkClaimable refuses new decisions outside the active epoch (P2): the
// claim must name the active epoch, no epoch may be pending, and the unit
// must be in the active shape or in the retiring set.
func checkClaimable(under int64, unit string, in claimInput) error {
	if in.Active == nil {
		return fmt.Errorf("claim %s: %w", unit, ErrNoActiveEpoch)
	}
	if under != in.Active.Number {
		return fmt.Errorf("claim %s under epoch %d, active is %d: %w", unit, under, in.Active.Number, ErrEpochMoved)
	}
	if in.Pending {
		return fmt.Errorf("claim %s: %w", unit, ErrFrozen)
	}
	p, s, err := parseUnit(unit)
	if err != nil {
		return err
	}
	if (p >= in.Active.Partitions || s >= in.Active.Shards) && !in.Retiring {
		return fmt.Errorf("claim %s under %dx%d, not retiring: %w", unit, in.Active.Partitions, in.Active.Shards, ErrUnitOutOfRange)
	}
	return nil
}

// waitRecovered refuses a decision on a unit nobody took since a Recover
// until every lease the lost primary may have granted is over, plus the
// grace (P5). The promoted standby may show the unit free, or held by
// someone else, while a member the lost primary gave it to (a paused one,
// not refused yet) still believes in its lease. Re-homes and adoptions
// wait for the same horizon through the members' earlier expiry; a free
// row has no member to read it from (chaos 14c gave one away 1.32 s after
// such a lease, inside the grace). Rows not decided since the Recover are
// the ones it moved (op recover), the free rows CreatePending adds at the
// token floor (no op yet) and units without a row.
func waitRecovered(unit string, in claimInput) error {
	if in.RecoveredUntil.IsZero() || (in.Row != nil && in.Row.LastOp != lastRecover && in.Row.LastOp != "") {
		return nil
	}
	at := in.RecoveredUntil.Add(in.Grace)
	if !in.Now.Before(at) {
		return nil
	}
	held := &HeldError{Unit: unit, Reason: HeldRecovered, AdoptableAt: at}
	if in.Row != nil {
		held.Owner, held.Epoch = in.Row.Owner, in.Row.Epoch
	}
	return held
}

// decideRehome moves a unit from an earlier incarnation of the claimer,
// once that incarnation's lease and the grace have passed.
func decideRehome(ref MemberRef, unit string, in claimInput) (claimDecision, error) {
	if !mayRehome(in.Claimer, in.Grace, in.Now) {
		return claimDecision{}, &HeldError{Unit: unit, Owner: ref.Member, Epoch: in.Row.Epoch,
			Reason: HeldPreviousIncarnation, AdoptableAt: rehomeAt(in.Claimer, in.Grace)}
	}
	return claimDecision{NewEpoch: in.Row.Epoch + 1, Op: lastRehome, Rehomed: true, From: ref.Member}, nil
}

// decideAdoption takes a unit another member holds only under P5.
func decideAdoption(unit string, in claimInput) (claimDecision, error) {
	row := in.Row
	held := &HeldError{Unit: unit, Owner: row.Owner, Epoch: row.Epoch, Reason: HeldOwnerLive}
	if row.State == StateHandover {
		held.Reason = HeldHandoverToOther
	}
	if in.Owner != nil && !in.Owner.Left {
		// An earlier incarnation may be believed live for longer than the
		// current one (after a Recover, a lease only the lost primary
		// granted): the owner's last possible lease is the later of both.
		expires := laterOf(in.Owner.LeaseExpiresAt, in.Owner.PrevLeaseExpiresAt)
		held.AdoptableAt = expires.Add(in.Grace)
		if in.Now.Before(expires) {
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
	return claimDecision{NewEpoch: row.Epoch + 1, Op: lastAdopt, Adopted: true, From: row.Owner}, nil
}

// claimed is the row a decided claim leaves behind.
func (d claimDecision) claimed(ref MemberRef, under int64, unit string, prev *claimRow) claimRow {
	row := claimRow{Unit: unit, Owner: ref.Member, OwnerIncarnation: ref.Incarnation, Epoch: d.NewEpoch,
		State: StateHeld, LastOp: d.Op, UnderEpoch: under}
	if prev != nil {
		row.CheckpointSeq = prev.CheckpointSeq
	}
	if d.Adopted || d.Rehomed {
		row.AdoptedFrom, row.Rehomed = d.From, d.Rehomed
	}
	return row
}

// result is the Claim a decision returns.
func (d claimDecision) result(ref MemberRef, unit string, prev *claimRow, now time.Time) Claim {
	c := Claim{Token: Token{Topology: ref.Topology, Unit: unit, Member: ref.Member, Epoch: d.NewEpoch},
		Adopted: d.Adopted, Settled: d.Settled, Rehomed: d.Rehomed, From: d.From, At: now}
	if prev != nil {
		c.CheckpointSeq = prev.CheckpointSeq
	}
	return c
}

// distinctUnits returns the batch's units sorted and without repeats: a
// batch decides each unit once, in this order (which is also the order in
// which PG locks the claim rows, so concurrent batches cannot deadlock),
// and a unit named twice gets the same outcome twice.
func distinctUnits(units []string) []string {
	out := append([]string(nil), units...)
	sort.Strings(out)
	n := 0
	for i, u := range out {
		if i == 0 || u != out[n-1] {
			out[n] = u
			n++
		}
	}
	return out[:n]
}

// outcomesInOrder lays the per-unit outcomes out in the caller's order.
func outcomesInOrder(units []string, by map[string]ClaimOutcome) []ClaimOutcome {
	out := make([]ClaimOutcome, len(units))
	for i, u := range units {
		out[i] = by[u]
	}
	return out
}

// claimView is everything a batch of claims reads, in one consistent view.
type claimView struct {
	Now     time.Time
	Grace   time.Duration
	Claimer *memberRow
	Active  *epochRow
	Pending bool
	// Rows, Owners and Retiring are keyed by unit, by member and by unit;
	// a missing key is an absent row, an absent member, a unit not
	// retiring.
	Rows     map[string]*claimRow
	Owners   map[string]*memberRow
	Retiring map[string]bool
	// RecoveredUntil is claimInput's, for every unit.
	RecoveredUntil time.Time
}

// input is one unit's claimInput.
func (v claimView) input(unit string) claimInput {
	in := claimInput{Now: v.Now, Grace: v.Grace, Claimer: v.Claimer, Active: v.Active, Pending: v.Pending,
		Row: v.Rows[unit], Retiring: v.Retiring[unit], RecoveredUntil: v.RecoveredUntil}
	if in.Row != nil && in.Row.State != StateFree {
		in.Owner = v.Owners[in.Row.Owner]
	}
	return in
}

// claimWrite is one decided unit a batch must write.
type claimWrite struct {
	Unit     string
	Decision claimDecision
	Prev     *claimRow // nil: insert
}

// decideBatch decides each of units (distinct, sorted) against one view.
// It returns every unit's outcome, assuming the writes succeed, and the
// writes to make; a backend replaces the outcome of a write that does not
// apply with ErrConflict.
func decideBatch(ref MemberRef, under int64, units []string, v claimView) (map[string]ClaimOutcome, []claimWrite) {
	outs := make(map[string]ClaimOutcome, len(units))
	var writes []claimWrite
	for _, u := range units {
		in := v.input(u)
		d, err := decideClaim(ref, under, u, in)
		if err != nil {
			outs[u] = ClaimOutcome{Unit: u, Err: fmt.Errorf("claim %s for %s: %w", u, ref.Member, err)}
			continue
		}
		outs[u] = ClaimOutcome{Unit: u, Claim: d.result(ref, u, in.Row, v.Now)}
		if !d.Noop {
			writes = append(writes, claimWrite{Unit: u, Decision: d, Prev: in.Row})
		}
	}
	return outs, writes
}

// repeats reports whether decided answers a claim with nothing to write:
// the member already holds the unit (a Noop decision).
func repeats(decided map[string]ClaimOutcome, writes []claimWrite) bool {
	ok := 0
	for _, o := range decided {
		if o.Err == nil {
			ok++
		}
	}
	return ok > len(writes)
}

// conflicted marks a decided unit whose compare-and-set did not apply.
func conflicted(outs map[string]ClaimOutcome, ref MemberRef, unit string) {
	outs[unit] = ClaimOutcome{Unit: unit, Err: fmt.Errorf("claim %s for %s: %w", unit, ref.Member, ErrConflict)}
}

// batchLabel names a batch in errors.
func batchLabel(units []string) string {
	if len(units) == 1 {
		return units[0]
	}
	return fmt.Sprintf("%d units", len(units))
}
