package poolctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockTopology locks the topology row for the rest of tx and returns the
// registry's clock.
func lockTopology(ctx context.Context, tx pgx.Tx, topology string) (time.Time, error) {
	var now time.Time
	err := tx.QueryRow(ctx, `SELECT shardkeeper.clock(topology) FROM shardkeeper.topologies WHERE topology = $1 FOR UPDATE`,
		topology).Scan(&now)
	if errors.Is(err, pgx.ErrNoRows) {
		return now, fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return now, err
}

// CreatePending implements Registry in one transaction under the topology
// row's lock.
func (p *PG) CreatePending(ctx context.Context, topology string, partitions, shards int) (int64, error) {
	if err := checkShape(partitions, shards); err != nil {
		return 0, err
	}
	var epoch int64
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		now, err := lockTopology(ctx, tx, topology)
		if err != nil {
			return err
		}
		var pn, pp, ps int
		err = tx.QueryRow(ctx, `SELECT epoch, partitions, shards FROM shardkeeper.epochs WHERE topology = $1 AND state = 'pending'`,
			topology).Scan(&pn, &pp, &ps)
		switch {
		case err == nil && pp == partitions && ps == shards:
			epoch = int64(pn)
			return nil
		case err == nil:
			return fmt.Errorf("create epoch %dx%d while epoch %d (%dx%d) is pending: %w", partitions, shards, pn, pp, ps, ErrPendingExists)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		return tx.QueryRow(ctx, `
			INSERT INTO shardkeeper.epochs (topology, epoch, partitions, shards, state, created_at)
			SELECT $1, coalesce(max(epoch), 0) + 1, $2, $3, 'pending', $4 FROM shardkeeper.epochs WHERE topology = $1
			RETURNING epoch`, topology, partitions, shards, now).Scan(&epoch)
	})
	if err != nil {
		return 0, fmt.Errorf("create pending epoch of %s: %w", topology, err)
	}
	return epoch, nil
}

// AckFreeze implements Registry in one statement.
func (p *PG) AckFreeze(ctx context.Context, m MemberRef, epoch int64) error {
	var (
		now   *time.Time
		state *string
		done  *int
		cur   memberScan
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		me AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
		e AS (SELECT * FROM shardkeeper.epochs WHERE topology = $1 AND epoch = $4),
		ins AS (
			INSERT INTO shardkeeper.freeze_acks (topology, epoch, member, incarnation, acked_at)
			SELECT $1, $4, $2, $3, t.now FROM t, me, e
			 WHERE me.incarnation = $3 AND me.left_at IS NULL AND me.lease_expires_at > t.now AND e.state = 'pending'
			ON CONFLICT (topology, epoch, member) DO UPDATE SET incarnation = excluded.incarnation, acked_at = excluded.acked_at
			RETURNING 1 AS done)
		SELECT t.now, e.state, ins.done, `+memberCols("me")+`
		  FROM t LEFT JOIN me ON true LEFT JOIN e ON true LEFT JOIN ins ON true`,
		m.Topology, m.Member, m.Incarnation, epoch).Scan(scanAll([]any{&now, &state, &done}, cur.dest())...)
	if err != nil {
		return fmt.Errorf("ack freeze of epoch %d by %s: %w", epoch, m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return err
	}
	if done != nil {
		return nil
	}
	if err := checkMember(m, cur.row(), *now); err != nil {
		return fmt.Errorf("ack freeze: %w", err)
	}
	if state == nil || EpochState(*state) != EpochPending {
		return fmt.Errorf("ack freeze of epoch %d: not pending: %w", epoch, ErrEpochState)
	}
	return fmt.Errorf("ack freeze: %w", ErrConflict)
}

// Activate implements Registry in one transaction under the topology row's
// lock. Retiring the previous epoch updates its row, which waits for any
// claim still deciding under it (claims lock the active epoch FOR SHARE),
// so no claim under the old epoch commits after the new one is active (P2).
func (p *PG) Activate(ctx context.Context, topology string, epoch int64) error {
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		now, err := lockTopology(ctx, tx, topology)
		if err != nil {
			return err
		}
		var state string
		err = tx.QueryRow(ctx, `SELECT state FROM shardkeeper.epochs WHERE topology = $1 AND epoch = $2`, topology, epoch).Scan(&state)
		switch {
		case err == nil && EpochState(state) == EpochActive:
			return nil
		case errors.Is(err, pgx.ErrNoRows) || (err == nil && EpochState(state) != EpochPending):
			return fmt.Errorf("activate epoch %d: not pending: %w", epoch, ErrEpochState)
		case err != nil:
			return err
		}
		rows, err := tx.Query(ctx, `
			SELECT m.member FROM shardkeeper.members m
			 WHERE m.topology = $1 AND m.left_at IS NULL AND m.lease_expires_at > $3
			   AND NOT EXISTS (SELECT 1 FROM shardkeeper.freeze_acks a
			                    WHERE a.topology = m.topology AND a.epoch = $2 AND a.member = m.member AND a.incarnation = m.incarnation)
			 ORDER BY m.member COLLATE "C"`, topology, epoch, now)
		if err != nil {
			return err
		}
		missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(missing) > 0 {
			return &FreezeIncompleteError{Epoch: epoch, Missing: missing}
		}
		if _, err := tx.Exec(ctx, `UPDATE shardkeeper.epochs SET state = 'retired', retired_at = $2 WHERE topology = $1 AND state = 'active'`,
			topology, now); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE shardkeeper.epochs SET state = 'active', activated_at = $3 WHERE topology = $1 AND epoch = $2`,
			topology, epoch, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("activate epoch %d of %s: %w", epoch, topology, err)
	}
	return nil
}

// Retire implements Registry in one statement.
func (p *PG) Retire(ctx context.Context, topology string, epoch int64) error {
	var (
		now   *time.Time
		state *string
		done  *int
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		e AS (SELECT * FROM shardkeeper.epochs WHERE topology = $1 AND epoch = $2),
		upd AS (
			UPDATE shardkeeper.epochs x SET state = 'retired', retired_at = t.now FROM t
			 WHERE x.topology = $1 AND x.epoch = $2 AND x.state = 'pending'
			RETURNING 1 AS done)
		SELECT t.now, e.state, upd.done FROM t LEFT JOIN e ON true LEFT JOIN upd ON true`,
		topology, epoch).Scan(&now, &state, &done)
	if err != nil {
		return fmt.Errorf("retire epoch %d of %s: %w", epoch, topology, err)
	}
	if err := topologyErr(topology, now); err != nil {
		return err
	}
	if done != nil || (state != nil && EpochState(*state) == EpochRetired) {
		return nil
	}
	return fmt.Errorf("retire epoch %d: only a pending epoch can be retired: %w", epoch, ErrEpochState)
}

// PublishResetPermission implements Registry. The census age is turned
// into a time on the registry's clock, so workers read its age without
// comparing the operator's clock with their own.
func (p *PG) PublishResetPermission(ctx context.Context, topology string, rp ResetPermission) error {
	servers, err := json.Marshal(rp.Servers)
	if err != nil || rp.Servers == nil {
		servers = []byte("{}")
	}
	tag, err := p.pool.Exec(ctx, `
		INSERT INTO shardkeeper.reset_permissions (topology, allowed, census_taken_at, reason, floor, servers, published_at)
		SELECT topology, $2, shardkeeper.clock(topology) - $3::interval, $4, $5, $6::jsonb, shardkeeper.clock(topology)
		  FROM shardkeeper.topologies WHERE topology = $1
		ON CONFLICT (topology) DO UPDATE SET allowed = excluded.allowed, census_taken_at = excluded.census_taken_at,
			reason = excluded.reason, floor = excluded.floor, servers = excluded.servers, published_at = excluded.published_at`,
		topology, rp.Allowed, rp.CensusAge.Truncate(time.Microsecond), rp.Reason, rp.Floor, string(servers))
	if err != nil {
		return fmt.Errorf("publish reset permission of %s: %w", topology, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return nil
}
