package poolctl

import (
	"context"
	"fmt"
	"sort"
)

// Claim implements Registry as a batch of one unit, as PG does.
func (t *Twin) Claim(ctx context.Context, m MemberRef, under int64, unit string) (Claim, error) {
	return claimOne(ctx, t, m, under, unit)
}

// ClaimMany implements Registry: one view, decideBatch, then the writes.
func (t *Twin) ClaimMany(_ context.Context, m MemberRef, under int64, units []string) ([]ClaimOutcome, error) {
	if len(units) == 0 {
		return []ClaimOutcome{}, nil
	}
	distinct := distinctUnits(units)
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return nil, fmt.Errorf("claim %s for %s: %w", batchLabel(distinct), m.Member, err)
	}
	outs, writes := decideBatch(m, under, distinct, t.claimView(tp, m.Member))
	for _, w := range writes {
		row := w.Decision.claimed(m, under, w.Unit, w.Prev)
		t.setClaim(tp, &row)
	}
	return outcomesInOrder(units, outs), nil
}

// claimView is the twin's state as decideBatch reads it.
func (t *Twin) claimView(tp *twinTopology, member string) claimView {
	v := claimView{Now: t.now(tp), Grace: tp.params.Grace, Claimer: tp.members[member],
		Rows: tp.claims, Owners: tp.members, Retiring: tp.retiring}
	for _, e := range tp.epochs {
		switch e.State {
		case EpochActive:
			v.Active = e
		case EpochPending:
			v.Pending = true
		}
	}
	t.mutation.bend(&v)
	return v
}

// Handover implements Registry.
func (t *Twin) Handover(_ context.Context, tok Token, to string) error {
	if to == tok.Member {
		return fmt.Errorf("handover %s to its owner: %w", tok.Unit, ErrInvalid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(tok.Topology)
	if err != nil {
		return err
	}
	cur := tp.claims[tok.Unit]
	if err := givesUp(tok, cur); err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	row := *cur
	row.State, row.HandoverTo, row.AdoptedFrom, row.Rehomed, row.LastOp, row.UnderEpoch = StateHandover, to, "", false, lastHandover, 0
	t.setClaim(tp, &row)
	return nil
}

// Release implements Registry as a batch of one token, as PG does.
func (t *Twin) Release(ctx context.Context, tok Token) error {
	return releaseOne(ctx, t, tok)
}

// ReleaseMany implements Registry. Like PG's single statement, it judges
// every token against the state before the batch, then releases.
func (t *Twin) ReleaseMany(_ context.Context, tokens []Token) ([]error, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	errs := make([]error, len(tokens))
	var release []Token
	for i, tok := range tokens {
		tp, err := t.topo(tok.Topology)
		if err != nil {
			errs[i] = fmt.Errorf("release %s: %w", tok.Unit, err)
			continue
		}
		errs[i] = releaseOutcome(tok, true, true, tp.claims[tok.Unit])
		if errs[i] == nil {
			release = append(release, tok)
		}
	}
	for _, tok := range release {
		tp := t.topos[tok.Topology]
		if cur := tp.claims[tok.Unit]; cur.State != StateFree {
			row := *cur
			row.State, row.Owner, row.OwnerIncarnation, row.HandoverTo = StateFree, "", 0, ""
			row.AdoptedFrom, row.Rehomed, row.LastOp, row.UnderEpoch = "", false, lastRelease, 0
			t.setClaim(tp, &row)
		}
	}
	return errs, nil
}

// ConfirmOwned implements Registry.
func (t *Twin) ConfirmOwned(_ context.Context, m MemberRef, expected map[string]int64) (Confirmation, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return Confirmation{}, err
	}
	now := t.now(tp)
	me := tp.members[m.Member]
	if err := checkMember(m, me, now); err != nil {
		return Confirmation{}, fmt.Errorf("confirm owned: %w", err)
	}
	// No re-home while an epoch is pending (P2), as for a claim.
	may := mayRehome(me, tp.params.Grace, now) && !tp.pending()
	c := Confirmation{Held: map[string]Token{}}
	waiting := map[string]bool{}
	for _, unit := range sortedKeys(tp.claims) {
		cur := tp.claims[unit]
		if cur.State == StateFree || cur.Owner != m.Member {
			continue
		}
		if cur.OwnerIncarnation != m.Incarnation {
			if !may {
				c.Waiting, waiting[unit] = append(c.Waiting, unit), true
				continue
			}
			row := *cur
			row.OwnerIncarnation, row.Epoch = m.Incarnation, row.Epoch+1
			row.AdoptedFrom, row.Rehomed, row.LastOp, row.UnderEpoch = m.Member, true, lastRehome, 0
			t.setClaim(tp, &row)
			cur = tp.claims[unit]
		}
		c.Held[unit] = Token{Topology: m.Topology, Unit: unit, Member: m.Member, Epoch: cur.Epoch}
		if cur.State == StateHandover {
			c.Handover = append(c.Handover, unit)
		}
	}
	for unit, want := range expected {
		if _, ok := c.Held[unit]; ok || waiting[unit] {
			continue
		}
		mv := Moved{Unit: unit, Expected: want}
		if row := tp.claims[unit]; row != nil {
			mv.Owner, mv.Epoch, mv.State = row.Owner, row.Epoch, row.State
		}
		c.Moved = append(c.Moved, mv)
	}
	sort.Slice(c.Moved, func(i, j int) bool { return c.Moved[i].Unit < c.Moved[j].Unit })
	return c, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// pending reports whether an epoch is pending.
func (tp *twinTopology) pending() bool {
	for _, e := range tp.epochs {
		if e.State == EpochPending {
			return true
		}
	}
	return false
}
