package poolctl

import (
	"context"
	"fmt"
)

// Join implements Registry.
func (t *Twin) Join(_ context.Context, topology, member string) (Lease, error) {
	return t.join(MemberRef{Topology: topology, Member: member}, false, "")
}

// Rejoin implements Registry.
func (t *Twin) Rejoin(_ context.Context, m MemberRef, process string) (Lease, error) {
	return t.join(m, true, process)
}

// join decides by the rules PG applies (decideJoin) and writes.
func (t *Twin) join(ref MemberRef, rejoin bool, process string) (Lease, error) {
	if ref.Member == "" {
		return Lease{}, fmt.Errorf("join: empty member name: %w", ErrInvalid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(ref.Topology)
	if err != nil {
		return Lease{}, err
	}
	v := joinView{NextInc: tp.nextInc, Now: t.now(tp), Params: tp.params}
	for _, m := range tp.members {
		v.Members = append(v.Members, *m)
	}
	d, err := decideJoin(ref, rejoin, process, v)
	if err != nil {
		return Lease{}, fmt.Errorf("join %s to %s: %w", ref.Member, ref.Topology, err)
	}
	if d.Own != nil {
		// The process's own live incarnation: renew it, as Renew does.
		row := *tp.members[ref.Member]
		row.LeaseExpiresAt = v.Now.Add(tp.params.LeaseTTL)
		t.setMember(tp, &row)
		return Lease{MemberRef: MemberRef{Topology: ref.Topology, Member: ref.Member, Incarnation: row.Incarnation},
			Slot: row.Slot, TTL: tp.params.LeaseTTL, ExpiresAt: row.LeaseExpiresAt, Params: tp.params}, nil
	}
	if d.Taken != nil {
		tp.members[d.Taken.Name].Slot = -1
	}
	tp.nextInc++
	row := d.Row
	t.setMember(tp, &row)
	return Lease{
		MemberRef: MemberRef{Topology: ref.Topology, Member: ref.Member, Incarnation: v.NextInc},
		Slot:      row.Slot, TTL: tp.params.LeaseTTL, ExpiresAt: row.LeaseExpiresAt, Params: tp.params,
	}, nil
}

// Renew implements Registry.
func (t *Twin) Renew(_ context.Context, m MemberRef) (Lease, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return Lease{}, err
	}
	now := t.now(tp)
	cur := tp.members[m.Member]
	if err := checkMember(m, cur, now); err != nil {
		return Lease{}, fmt.Errorf("renew: %w", err)
	}
	row := *cur
	row.LeaseExpiresAt = now.Add(tp.params.LeaseTTL)
	t.setMember(tp, &row)
	return Lease{MemberRef: m, Slot: row.Slot, TTL: tp.params.LeaseTTL, ExpiresAt: row.LeaseExpiresAt, Params: tp.params}, nil
}

// Leave implements Registry.
func (t *Twin) Leave(_ context.Context, m MemberRef) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return err
	}
	now := t.now(tp)
	cur := tp.members[m.Member]
	if err := checkIncarnation(m, cur); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	if n := tp.holds(m.Member); n > 0 {
		return &HoldingError{Member: m.Member, Units: n}
	}
	row := *cur
	row.Left = true
	if row.LeaseExpiresAt.After(now) {
		row.LeaseExpiresAt = now
	}
	t.setMember(tp, &row)
	return nil
}

func (tp *twinTopology) holds(member string) int {
	n := 0
	for _, c := range tp.claims {
		if c.State != StateFree && c.Owner == member {
			n++
		}
	}
	return n
}

// Fence implements Registry: a no-op unless gen is above the last recorded
// generation (fenceApplies).
func (t *Twin) Fence(_ context.Context, m MemberRef, gen int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return err
	}
	row := tp.members[m.Member]
	if err := checkIncarnation(m, row); err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	next := *row
	applyFence(&next, gen)
	t.setMember(tp, &next)
	return nil
}

// Unfence implements Registry: a no-op for a generation older than the
// last recorded one (unfenceApplies).
func (t *Twin) Unfence(_ context.Context, m MemberRef, gen int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return err
	}
	row := tp.members[m.Member]
	if err := checkIncarnation(m, row); err != nil {
		return fmt.Errorf("unfence: %w", err)
	}
	next := *row
	applyUnfence(&next, gen, t.now(tp))
	t.setMember(tp, &next)
	return nil
}
