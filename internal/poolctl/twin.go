package poolctl

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Twin is the in-memory twin of the PostgreSQL registry: the same
// interface, the same rules (rules.go), one mutex standing in for
// transactions, and an injectable clock standing in for the database's
// now(). Tests run the same scenarios against both and compare outcomes.
type Twin struct {
	mu    sync.Mutex
	clock func() time.Time
	topos map[string]*twinTopology
}

type twinTopology struct {
	params  Params
	offset  time.Duration
	nextInc int64
	epochs  map[int64]*epochRow
	acks    map[int64]map[string]int64 // epoch -> member -> incarnation
	members map[string]*memberRow
	claims  map[string]*claimRow
	reset   *twinReset
}

type twinReset struct {
	allowed     bool
	takenAt     time.Time
	reason      string
	publishedAt time.Time
}

var _ Registry = (*Twin)(nil)

// NewTwin returns an empty twin whose clock is clock (time.Now if nil).
func NewTwin(clock func() time.Time) *Twin {
	if clock == nil {
		clock = time.Now
	}
	return &Twin{clock: clock, topos: map[string]*twinTopology{}}
}

// ShiftClock moves the topology's registry clock forward by d (test hook;
// see ClockShifter).
func (t *Twin) ShiftClock(_ context.Context, topology string, d time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	tp.offset += d.Truncate(time.Microsecond)
	return nil
}

// topo and now are called with t.mu held.
func (t *Twin) topo(topology string) (*twinTopology, error) {
	tp, ok := t.topos[topology]
	if !ok {
		return nil, fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return tp, nil
}

func (t *Twin) now(tp *twinTopology) time.Time {
	return t.clock().Add(tp.offset).Truncate(time.Microsecond)
}

// EnsureTopology implements Registry.
func (t *Twin) EnsureTopology(_ context.Context, topology string, p Params) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("topology %q: %w", topology, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if tp, ok := t.topos[topology]; ok {
		tp.params = p.normalized()
		return nil
	}
	t.topos[topology] = &twinTopology{
		params: p.normalized(), nextInc: 1,
		epochs: map[int64]*epochRow{}, acks: map[int64]map[string]int64{},
		members: map[string]*memberRow{}, claims: map[string]*claimRow{},
	}
	return nil
}

// Join implements Registry.
func (t *Twin) Join(_ context.Context, topology, member string) (Lease, error) {
	if member == "" {
		return Lease{}, fmt.Errorf("join: empty member name: %w", ErrInvalid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return Lease{}, err
	}
	now := t.now(tp)
	prev := tp.members[member]
	var all []memberRow
	for _, m := range tp.members {
		all = append(all, *m)
	}
	slot, taken := pickSlot(prev, all, now)
	if taken != "" {
		tp.members[taken].Slot = -1
	}
	inc := tp.nextInc
	tp.nextInc++
	row := joinRow(member, prev, slot, inc, now, tp.params.LeaseTTL)
	tp.members[member] = &row
	return Lease{
		MemberRef: MemberRef{Topology: topology, Member: member, Incarnation: inc},
		Slot:      slot, TTL: tp.params.LeaseTTL, ExpiresAt: row.LeaseExpiresAt,
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
	row := tp.members[m.Member]
	if err := checkMember(m, row, now); err != nil {
		return Lease{}, fmt.Errorf("renew: %w", err)
	}
	row.LeaseExpiresAt = now.Add(tp.params.LeaseTTL)
	return Lease{MemberRef: m, Slot: row.Slot, TTL: tp.params.LeaseTTL, ExpiresAt: row.LeaseExpiresAt}, nil
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
	row := tp.members[m.Member]
	if err := checkIncarnation(m, row); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	if n := tp.holds(m.Member); n > 0 {
		return &HoldingError{Member: m.Member, Units: n}
	}
	row.Left = true
	if row.LeaseExpiresAt.After(now) {
		row.LeaseExpiresAt = now
	}
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

// Fence implements Registry.
func (t *Twin) Fence(_ context.Context, m MemberRef, _ int64) error {
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
	row.Fenced = true
	return nil
}

// Unfence implements Registry.
func (t *Twin) Unfence(_ context.Context, m MemberRef, _ int64) error {
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
	if row.Fenced {
		row.Fenced = false
		row.FenceLiftedAt = t.now(tp)
	}
	return nil
}

// Claim implements Registry.
func (t *Twin) Claim(_ context.Context, m MemberRef, under int64, unit string) (Claim, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return Claim{}, err
	}
	now := t.now(tp)
	in := claimInput{Now: now, Grace: tp.params.Grace, Claimer: tp.members[m.Member], Row: tp.claims[unit]}
	for _, e := range tp.epochs {
		switch e.State {
		case EpochActive:
			in.Active = e
		case EpochPending:
			in.Pending = true
		}
	}
	if in.Row != nil && in.Row.State != StateFree {
		in.Owner = tp.members[in.Row.Owner]
	}
	d, err := decideClaim(m, under, unit, in)
	if err != nil {
		return Claim{}, err
	}
	row := in.Row
	if d.Insert {
		row = &claimRow{Unit: unit}
		tp.claims[unit] = row
	}
	if !d.Noop {
		row.Owner, row.OwnerIncarnation, row.Epoch = m.Member, m.Incarnation, d.NewEpoch
		row.State, row.HandoverTo = StateHeld, ""
	}
	return Claim{
		Token:   Token{Topology: m.Topology, Unit: unit, Member: m.Member, Epoch: row.Epoch},
		Adopted: d.Adopted, Settled: d.Settled, From: d.From, CheckpointSeq: row.CheckpointSeq, At: now,
	}, nil
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
	row := tp.claims[tok.Unit]
	if err := givesUp(tok, row); err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	row.State, row.HandoverTo = StateHandover, to
	return nil
}

// Release implements Registry.
func (t *Twin) Release(_ context.Context, tok Token) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(tok.Topology)
	if err != nil {
		return err
	}
	row := tp.claims[tok.Unit]
	if err := givesUp(tok, row); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	row.State, row.Owner, row.OwnerIncarnation, row.HandoverTo = StateFree, "", 0, ""
	return nil
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
	if err := checkMember(m, tp.members[m.Member], now); err != nil {
		return Confirmation{}, fmt.Errorf("confirm owned: %w", err)
	}
	c := Confirmation{Held: map[string]Token{}}
	for unit, row := range tp.claims {
		if row.State == StateFree || row.Owner != m.Member {
			continue
		}
		if row.OwnerIncarnation != m.Incarnation {
			row.OwnerIncarnation, row.Epoch = m.Incarnation, row.Epoch+1
		}
		c.Held[unit] = Token{Topology: m.Topology, Unit: unit, Member: m.Member, Epoch: row.Epoch}
		if row.State == StateHandover {
			c.Handover = append(c.Handover, unit)
		}
	}
	for unit, want := range expected {
		if _, ok := c.Held[unit]; ok {
			continue
		}
		mv := Moved{Unit: unit, Expected: want}
		if row := tp.claims[unit]; row != nil {
			mv.Owner, mv.Epoch, mv.State = row.Owner, row.Epoch, row.State
		}
		c.Moved = append(c.Moved, mv)
	}
	sort.Strings(c.Handover)
	sort.Slice(c.Moved, func(i, j int) bool { return c.Moved[i].Unit < c.Moved[j].Unit })
	return c, nil
}

// Checkpoint implements Registry.
func (t *Twin) Checkpoint(_ context.Context, tok Token, seq int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(tok.Topology)
	if err != nil {
		return err
	}
	row := tp.claims[tok.Unit]
	if err := t.valid(tp, tok, row); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if seq > row.CheckpointSeq {
		row.CheckpointSeq = seq
	}
	return nil
}

// CheckToken implements Registry.
func (t *Twin) CheckToken(_ context.Context, tok Token) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(tok.Topology)
	if err != nil {
		return err
	}
	return t.valid(tp, tok, tp.claims[tok.Unit])
}

func (t *Twin) valid(tp *twinTopology, tok Token, row *claimRow) error {
	var owner *memberRow
	if row != nil && row.State != StateFree {
		owner = tp.members[row.Owner]
	}
	return tokenValid(tok, row, owner, t.now(tp))
}

// Claims implements Registry.
func (t *Twin) Claims(_ context.Context, topology string) ([]ClaimInfo, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return nil, err
	}
	out := make([]ClaimInfo, 0, len(tp.claims))
	for _, c := range tp.claims {
		out = append(out, ClaimInfo{
			Unit: c.Unit, Owner: c.Owner, OwnerIncarnation: c.OwnerIncarnation, Epoch: c.Epoch,
			State: c.State, HandoverTo: c.HandoverTo, CheckpointSeq: c.CheckpointSeq,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Unit < out[j].Unit })
	return out, nil
}

// SetDraining implements Registry.
func (t *Twin) SetDraining(_ context.Context, topology, member string, draining bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	row := tp.members[member]
	if row == nil {
		return fmt.Errorf("set draining of %s in %s: %w", member, topology, ErrNotMember)
	}
	row.Draining = draining
	return nil
}
