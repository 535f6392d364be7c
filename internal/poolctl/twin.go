package poolctl

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Twin is the in-memory twin of the PostgreSQL registry: the same
// interface, the same rules (rules*.go), one mutex standing in for
// transactions, and an injectable clock standing in for the database's
// clock_timestamp(). Tests run the same scenarios against both and compare
// outcomes.
type Twin struct {
	*twinState
	// op is the operator token this view writes under (AsOperator), nil
	// for none.
	op *OperatorToken
}

// twinState is what every view of one twin shares.
type twinState struct {
	mu    sync.Mutex
	clock func() time.Time
	topos map[string]*twinTopology
	// mutation is zero except in the simulator's mutation tests.
	mutation twinMutation
	// ops are the operator tokens taken, by topology (they outlive the
	// topology, as PG's do).
	ops map[string]OperatorToken
}

type twinTopology struct {
	params   Params
	offset   time.Duration
	nextInc  int64
	epochs   map[int64]*epochRow
	acks     map[int64]map[string]int64 // epoch -> member -> incarnation
	members  map[string]*memberRow
	claims   map[string]*claimRow
	retiring map[string]bool
	activity map[[2]string]ActivityReport // (member, unit) -> latest report
	reset    *twinReset
	// barrier are the order barrier's rows, sorted by epoch, partition
	// and predecessor (twin_barrier.go).
	barrier []barrierRow
	// marks are the drained-to marks of a change of N, by barrier epoch
	// and unit (twin_barrier.go).
	marks   map[markKey]uint64
	history twinHistory
}

type twinReset struct {
	allowed     bool
	takenAt     time.Time
	reason      string
	floor       string
	servers     map[string]string
	publishedAt time.Time
}

var (
	_ Registry      = (*Twin)(nil)
	_ HistoryReader = (*Twin)(nil)
)

// NewTwin returns an empty twin whose clock is clock (time.Now if nil).
func NewTwin(clock func() time.Time) *Twin {
	if clock == nil {
		clock = time.Now
	}
	return &Twin{twinState: &twinState{clock: clock, topos: map[string]*twinTopology{}}}
}

// ShiftClock moves the topology's registry clock forward by d (test hook;
// see ClockShifter). The history keeps the unshifted clock, as PG's does.
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

// topo, now and wall are called with t.mu held.
func (t *Twin) topo(topology string) (*twinTopology, error) {
	tp, ok := t.topos[topology]
	if !ok {
		return nil, fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return tp, nil
}

// now is the topology's registry clock.
func (t *Twin) now(tp *twinTopology) time.Time {
	return t.wall().Add(tp.offset)
}

// wall is the clock without the test offset, as the history records it.
func (t *Twin) wall() time.Time {
	return t.clock().Truncate(time.Microsecond)
}

// EnsureTopology implements Registry.
func (t *Twin) EnsureTopology(_ context.Context, topology string, p Params) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("topology %q: %w", topology, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return err
	}
	if tp, ok := t.topos[topology]; ok {
		tp.params = p.normalized()
		return nil
	}
	t.topos[topology] = &twinTopology{
		params: p.normalized(), nextInc: 1,
		epochs: map[int64]*epochRow{}, acks: map[int64]map[string]int64{},
		members: map[string]*memberRow{}, claims: map[string]*claimRow{},
		retiring: map[string]bool{}, activity: map[[2]string]ActivityReport{},
	}
	return nil
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
	return t.claims(topology)
}

// claims is Claims with t.mu held.
func (t *Twin) claims(topology string) ([]ClaimInfo, error) {
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
	if err := t.checkOperator(topology); err != nil {
		return err
	}
	return t.setDraining(topology, member, draining)
}

// setDraining is SetDraining with t.mu held and the operator checked.
func (t *Twin) setDraining(topology, member string, draining bool) error {
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	if member == "" {
		return fmt.Errorf("set draining: empty member name: %w", ErrInvalid)
	}
	row := tp.members[member]
	switch {
	case row == nil && draining:
		// A placeholder carries the request to a later join (PG writes
		// the same row).
		now := t.now(tp)
		t.setMember(tp, &memberRow{Name: member, Slot: -1, LeaseExpiresAt: now, Left: true, Draining: true})
		return nil
	case row == nil:
		return fmt.Errorf("set draining of %s in %s: %w", member, topology, ErrNotMember)
	}
	row.Draining = draining
	return nil
}

// SetRetiring implements Registry.
func (t *Twin) SetRetiring(_ context.Context, topology string, units []string) error {
	units, err := retiringSet(units)
	if err != nil {
		return fmt.Errorf("set retiring units of %s: %w", topology, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return err
	}
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	tp.retiring = map[string]bool{}
	for _, u := range units {
		tp.retiring[u] = true
	}
	return nil
}
