package poolctl

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The history tables are filled by triggers (migration 0003), so no writer
// can forget them; these are their readers. Times are the database's wall
// clock, never the test clock offset.

// ClaimHistory implements HistoryReader: every change of the topology's
// claim rows, in the order they were made.
func (p *PG) ClaimHistory(ctx context.Context, topology string) ([]ClaimEvent, error) {
	rows, err := p.pool.Query(ctx, `
		SELECT unit, coalesce(owner, ''), coalesce(incarnation, 0), epoch, state, coalesce(under_epoch, 0), coalesce(op, ''), at
		  FROM shardkeeper.claim_history WHERE topology = $1 ORDER BY id`, topology)
	if err != nil {
		return nil, fmt.Errorf("claim history of %s: %w", topology, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ClaimEvent, error) {
		var e ClaimEvent
		err := r.Scan(&e.Unit, &e.Owner, &e.Incarnation, &e.Epoch, &e.State, &e.Under, &e.Op, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim history of %s: %w", topology, err)
	}
	return out, nil
}

// LeaseHistory implements HistoryReader: every join, renewal, leave and
// fence change.
func (p *PG) LeaseHistory(ctx context.Context, topology string) ([]LeaseEvent, error) {
	rows, err := p.pool.Query(ctx, `
		SELECT member, incarnation, at, expires_at, "left", fenced, fence_lifted_at
		  FROM shardkeeper.lease_history WHERE topology = $1 ORDER BY id`, topology)
	if err != nil {
		return nil, fmt.Errorf("lease history of %s: %w", topology, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LeaseEvent, error) {
		var (
			e      LeaseEvent
			lifted *time.Time
		)
		err := r.Scan(&e.Member, &e.Incarnation, &e.At, &e.ExpiresAt, &e.Left, &e.Fenced, &lifted)
		if lifted != nil {
			e.FenceLiftedAt = *lifted
		}
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("lease history of %s: %w", topology, err)
	}
	return out, nil
}

// EpochHistory implements HistoryReader, with the activation and
// retirement times on the history's wall clock.
func (p *PG) EpochHistory(ctx context.Context, topology string) ([]EpochSpan, error) {
	rows, err := p.pool.Query(ctx, `
		SELECT epoch, partitions, shards, state, activated_wall_at, retired_wall_at
		  FROM shardkeeper.epochs WHERE topology = $1 ORDER BY epoch`, topology)
	if err != nil {
		return nil, fmt.Errorf("epoch history of %s: %w", topology, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EpochSpan, error) {
		var (
			e                  EpochSpan
			activated, retired *time.Time
		)
		err := r.Scan(&e.Number, &e.Partitions, &e.Shards, &e.State, &activated, &retired)
		if activated != nil {
			e.ActivatedAt = *activated
		}
		if retired != nil {
			e.RetiredAt = *retired
		}
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("epoch history of %s: %w", topology, err)
	}
	return out, nil
}

// PruneHistory implements HistoryReader in one statement. Epochs are kept:
// there are few, and they say which unit set was active when.
func (p *PG) PruneHistory(ctx context.Context, topology string, before time.Time) error {
	_, err := p.pool.Exec(ctx, `
		WITH c AS (DELETE FROM shardkeeper.claim_history WHERE topology = $1 AND at < $2)
		DELETE FROM shardkeeper.lease_history WHERE topology = $1 AND at < $2`, topology, before)
	if err != nil {
		return fmt.Errorf("prune history of %s: %w", topology, err)
	}
	return nil
}
