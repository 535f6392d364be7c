package poolctl

import (
	"context"
	"time"
)

// The twin records the same history as PG's triggers, on its clock
// without the test offset, and under the same conditions: a claim event
// when a row is new or its owner, incarnation, epoch or state changed; a
// lease event when a member row is new or its incarnation, lease expiry,
// departure, fence or fence lift changed.

type twinHistory struct {
	claims []ClaimEvent
	leases []LeaseEvent
}

// setClaim stores row (replacing the unit's row) and records the change.
func (t *Twin) setClaim(tp *twinTopology, row *claimRow) {
	prev := tp.claims[row.Unit]
	tp.claims[row.Unit] = row
	if prev != nil && prev.Owner == row.Owner && prev.OwnerIncarnation == row.OwnerIncarnation &&
		prev.Epoch == row.Epoch && prev.State == row.State {
		return
	}
	tp.history.claims = append(tp.history.claims, ClaimEvent{Unit: row.Unit, Owner: row.Owner,
		Incarnation: row.OwnerIncarnation, Epoch: row.Epoch, State: row.State, Under: row.UnderEpoch,
		Op: string(row.LastOp), At: t.wall()})
}

// setMember stores row (replacing the member's row) and records the change.
func (t *Twin) setMember(tp *twinTopology, row *memberRow) {
	prev := tp.members[row.Name]
	tp.members[row.Name] = row
	if prev != nil && prev.Incarnation == row.Incarnation && prev.LeaseExpiresAt.Equal(row.LeaseExpiresAt) &&
		prev.Left == row.Left && prev.Fenced == row.Fenced && prev.FenceLiftedAt.Equal(row.FenceLiftedAt) {
		return
	}
	var lifted time.Time
	if !row.FenceLiftedAt.IsZero() {
		lifted = row.FenceLiftedAt.Add(-tp.offset)
	}
	tp.history.leases = append(tp.history.leases, LeaseEvent{Member: row.Name, Incarnation: row.Incarnation,
		At: t.wall(), ExpiresAt: row.LeaseExpiresAt.Add(-tp.offset), Left: row.Left,
		Fenced: row.Fenced, FenceLiftedAt: lifted})
}

// ClaimHistory implements HistoryReader.
func (t *Twin) ClaimHistory(_ context.Context, topology string) ([]ClaimEvent, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return []ClaimEvent{}, nil // PG keeps no topology check on history either
	}
	return append([]ClaimEvent{}, tp.history.claims...), nil
}

// LeaseHistory implements HistoryReader.
func (t *Twin) LeaseHistory(_ context.Context, topology string) ([]LeaseEvent, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return []LeaseEvent{}, nil
	}
	return append([]LeaseEvent{}, tp.history.leases...), nil
}

// EpochHistory implements HistoryReader.
func (t *Twin) EpochHistory(_ context.Context, topology string) ([]EpochSpan, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return []EpochSpan{}, nil
	}
	out := []EpochSpan{}
	for n := int64(1); n <= int64(len(tp.epochs)); n++ {
		e := tp.epochs[n]
		out = append(out, EpochSpan{Number: e.Number, Partitions: e.Partitions, Shards: e.Shards, State: e.State,
			ActivatedAt: e.ActivatedWall, RetiredAt: e.RetiredWall})
	}
	return out, nil
}

// PruneHistory implements HistoryReader.
func (t *Twin) PruneHistory(_ context.Context, topology string, before time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(topology)
	if err != nil {
		return nil
	}
	claims := tp.history.claims[:0]
	for _, e := range tp.history.claims {
		if !e.At.Before(before) {
			claims = append(claims, e)
		}
	}
	leases := tp.history.leases[:0]
	for _, e := range tp.history.leases {
		if !e.At.Before(before) {
			leases = append(leases, e)
		}
	}
	tp.history.claims, tp.history.leases = claims, leases
	return nil
}
