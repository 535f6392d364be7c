package poolctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Join implements Registry. One transaction: it locks the topology row (so
// joins of one topology serialize), takes the next incarnation, picks the
// slot and writes the member row.
func (p *PG) Join(ctx context.Context, topology, member string) (Lease, error) {
	if member == "" {
		return Lease{}, fmt.Errorf("join: empty member name: %w", ErrInvalid)
	}
	var lease Lease
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var (
			inc int64
			now time.Time
			ttl time.Duration
		)
		err := tx.QueryRow(ctx, `
			UPDATE shardkeeper.topologies SET next_incarnation = next_incarnation + 1 WHERE topology = $1
			RETURNING next_incarnation - 1, shardkeeper.clock(topology), lease_ttl`, topology).Scan(&inc, &now, &ttl)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
		} else if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT `+memberCols("m")+` FROM shardkeeper.members m WHERE m.topology = $1`, topology)
		if err != nil {
			return err
		}
		var (
			all  []memberRow
			prev *memberRow
		)
		for rows.Next() {
			var ms memberScan
			if err := rows.Scan(ms.dest()...); err != nil {
				rows.Close()
				return err
			}
			all = append(all, *ms.row())
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for i := range all {
			if all[i].Name == member {
				prev = &all[i]
			}
		}
		slot, taken := pickSlot(prev, all, now)
		if taken != "" {
			if _, err := tx.Exec(ctx, `UPDATE shardkeeper.members SET slot = NULL WHERE topology = $1 AND member = $2`,
				topology, taken); err != nil {
				return err
			}
		}
		row := joinRow(member, prev, slot, inc, now, ttl)
		var lifted *time.Time
		if !row.FenceLiftedAt.IsZero() {
			lifted = &row.FenceLiftedAt
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO shardkeeper.members (topology, member, slot, incarnation, lease_expires_at, fenced, fence_lifted_at, joined_at)
			VALUES ($1, $2, $3, $4, $5, false, $6, $7)
			ON CONFLICT (topology, member) DO UPDATE SET slot = excluded.slot, incarnation = excluded.incarnation,
				lease_expires_at = excluded.lease_expires_at, fenced = false, fence_lifted_at = excluded.fence_lifted_at,
				joined_at = excluded.joined_at, left_at = NULL`,
			topology, member, slot, inc, row.LeaseExpiresAt, lifted, now); err != nil {
			return err
		}
		lease = Lease{MemberRef: MemberRef{Topology: topology, Member: member, Incarnation: inc},
			Slot: slot, TTL: ttl, ExpiresAt: row.LeaseExpiresAt}
		return nil
	})
	if err != nil {
		return Lease{}, fmt.Errorf("join %s to %s: %w", member, topology, err)
	}
	return lease, nil
}

// Renew implements Registry in one statement: the update applies only to a
// live lease of this incarnation; the member row read alongside explains a
// refusal.
func (p *PG) Renew(ctx context.Context, m MemberRef) (Lease, error) {
	var (
		now     *time.Time
		ttl     *time.Duration
		expires *time.Time
		slot    *int
		cur     memberScan
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock(topology) AS now, lease_ttl FROM shardkeeper.topologies WHERE topology = $1),
		cur AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
		upd AS (
			UPDATE shardkeeper.members m SET lease_expires_at = t.now + t.lease_ttl FROM t
			 WHERE m.topology = $1 AND m.member = $2 AND m.incarnation = $3
			   AND m.left_at IS NULL AND m.lease_expires_at > t.now
			RETURNING m.lease_expires_at, coalesce(m.slot, -1) AS slot)
		SELECT t.now, t.lease_ttl, upd.lease_expires_at, upd.slot, `+memberCols("cur")+`
		  FROM (SELECT 1) one LEFT JOIN t ON true LEFT JOIN cur ON true LEFT JOIN upd ON true`,
		m.Topology, m.Member, m.Incarnation).Scan(scanAll([]any{&now, &ttl, &expires, &slot}, cur.dest())...)
	if err != nil {
		return Lease{}, fmt.Errorf("renew %s: %w", m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return Lease{}, err
	}
	if expires == nil {
		return Lease{}, fmt.Errorf("renew: %w", refusal(checkMember(m, cur.row(), *now)))
	}
	return Lease{MemberRef: m, Slot: *slot, TTL: *ttl, ExpiresAt: *expires}, nil
}

// refusal is the error for a conditional write that matched nothing: the
// rule that refused it, or ErrConflict when the row changed between the
// statement's snapshot and its write.
func refusal(ruleErr error) error {
	if ruleErr != nil {
		return ruleErr
	}
	return ErrConflict
}

// Leave implements Registry in one statement.
func (p *PG) Leave(ctx context.Context, m MemberRef) error {
	var (
		now   *time.Time
		holds int
		done  *int
		cur   memberScan
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		cur AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
		h AS (SELECT count(*)::int AS n FROM shardkeeper.claims WHERE topology = $1 AND owner = $2 AND state <> 'free'),
		upd AS (
			UPDATE shardkeeper.members m SET left_at = t.now, lease_expires_at = least(m.lease_expires_at, t.now)
			  FROM t, h
			 WHERE m.topology = $1 AND m.member = $2 AND m.incarnation = $3 AND m.left_at IS NULL AND h.n = 0
			RETURNING 1 AS done)
		SELECT t.now, h.n, upd.done, `+memberCols("cur")+`
		  FROM t CROSS JOIN h LEFT JOIN cur ON true LEFT JOIN upd ON true`,
		m.Topology, m.Member, m.Incarnation).Scan(scanAll([]any{&now, &holds, &done}, cur.dest())...)
	if err != nil {
		return fmt.Errorf("leave %s: %w", m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return err
	}
	if done != nil {
		return nil
	}
	if err := checkIncarnation(m, cur.row()); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	if holds > 0 {
		return &HoldingError{Member: m.Member, Units: holds}
	}
	return fmt.Errorf("leave %s: %w", m.Member, ErrConflict)
}

// Fence implements Registry.
func (p *PG) Fence(ctx context.Context, m MemberRef, _ int64) error {
	return p.setFence(ctx, m, "fence", `fenced = true`)
}

// Unfence implements Registry. Lifting a fence that is not set changes
// nothing, so a repeated Unfence does not extend the grace.
func (p *PG) Unfence(ctx context.Context, m MemberRef, _ int64) error {
	return p.setFence(ctx, m, "unfence",
		`fenced = false, fence_lifted_at = CASE WHEN m.fenced THEN t.now ELSE m.fence_lifted_at END`)
}

// setFence updates this incarnation's fence with set (a constant).
func (p *PG) setFence(ctx context.Context, m MemberRef, op, set string) error {
	var (
		now  *time.Time
		done *int
		cur  memberScan
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		cur AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
		upd AS (
			UPDATE shardkeeper.members m SET `+set+` FROM t
			 WHERE m.topology = $1 AND m.member = $2 AND m.incarnation = $3 AND m.left_at IS NULL
			RETURNING 1 AS done)
		SELECT t.now, upd.done, `+memberCols("cur")+` FROM t LEFT JOIN cur ON true LEFT JOIN upd ON true`,
		m.Topology, m.Member, m.Incarnation).Scan(scanAll([]any{&now, &done}, cur.dest())...)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return err
	}
	if done == nil {
		return fmt.Errorf("%s: %w", op, refusal(checkIncarnation(m, cur.row())))
	}
	return nil
}

// SetDraining implements Registry.
func (p *PG) SetDraining(ctx context.Context, topology, member string, draining bool) error {
	tag, err := p.pool.Exec(ctx, `UPDATE shardkeeper.members SET draining = $3 WHERE topology = $1 AND member = $2`,
		topology, member, draining)
	if err != nil {
		return fmt.Errorf("set draining of %s: %w", member, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("set draining of %s in %s: %w", member, topology, ErrNotMember)
	}
	return nil
}
