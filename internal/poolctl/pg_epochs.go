package poolctl

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Epoch changes lock the topology row first, in a pipeline the server
// runs to the end by itself (see pipeline), so that a Join (which takes
// the same lock) cannot interleave and their own statements read after
// the lock.
const lockTopologySQL = `SELECT 1 FROM shardkeeper.topologies WHERE topology = $1 FOR UPDATE`

// createPendingSQL creates the pending epoch unless one is pending, and
// returns the created epoch or the pending one.
const createPendingSQL = createPendingCTEs + createPendingResult

const createPendingCTEs = `
	WITH pe AS (SELECT epoch, partitions, shards FROM shardkeeper.epochs WHERE topology = $1 AND state = 'pending'),
	tp AS (SELECT 1 FROM shardkeeper.topologies WHERE topology = $1),
	ins AS (
		INSERT INTO shardkeeper.epochs (topology, epoch, partitions, shards, state, created_at)
		SELECT $1, greatest(coalesce(max(epoch), 0), (SELECT epoch_floor FROM shardkeeper.topologies WHERE topology = $1)) + 1,
		       $2, $3, 'pending', shardkeeper.clock($1) FROM shardkeeper.epochs
		 WHERE topology = $1 HAVING NOT EXISTS (SELECT 1 FROM pe) AND EXISTS (SELECT 1 FROM tp)
		RETURNING epoch)`

const createPendingResult = `
	SELECT EXISTS (SELECT 1 FROM tp), (SELECT epoch FROM ins), pe.epoch, pe.partitions, pe.shards
	  FROM (SELECT 1) one LEFT JOIN pe ON true`

// floorRowsSQL gives every unit of a new shape that has no claim row a
// free row at the token floor, after a Recover set one (issue 22): a lost
// primary may have issued tokens for units the standby never saw, from 1
// up. Without a floor (never recovered) it writes nothing.
const floorRowsSQL = `
	INSERT INTO shardkeeper.claims (topology, unit, fencing_epoch, state, updated_at)
	SELECT $1, p || '.' || s, t.token_floor, 'free', shardkeeper.clock($1)
	  FROM shardkeeper.topologies t, generate_series(0, $2::int - 1) p, generate_series(0, $3::int - 1) s
	 WHERE t.topology = $1 AND t.token_floor > 0
	ON CONFLICT (topology, unit) DO NOTHING`

// CreatePending implements Registry in one pipeline under the topology
// row's lock.
func (p *PG) CreatePending(ctx context.Context, topology string, partitions, shards int) (int64, error) {
	return p.createPending(ctx, topology, partitions, shards, func(b *pgx.Batch) {
		b.Queue(createPendingSQL, topology, partitions, shards)
	})
}

// createPending creates the pending epoch with queueCreate's statement
// (createPendingSQL, or one that also writes what the new epoch comes
// with) between the topology row's lock and the claim floor rows.
func (p *PG) createPending(ctx context.Context, topology string, partitions, shards int, queueCreate func(*pgx.Batch)) (int64, error) {
	if err := checkShape(partitions, shards); err != nil {
		return 0, err
	}
	var (
		known       bool
		created, pn *int64
		pp, ps      *int
	)
	err := p.opPipeline(ctx, topology, func(b *pgx.Batch) {
		b.Queue(lockTopologySQL, topology)
		queueCreate(b)
		b.Queue(floorRowsSQL, topology, partitions, shards)
	}, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		if err := br.QueryRow().Scan(&known, &created, &pn, &pp, &ps); err != nil {
			return err
		}
		_, err := br.Exec()
		return err
	})
	switch {
	case err != nil:
		return 0, fmt.Errorf("create pending epoch of %s: %w", topology, err)
	case !known:
		return 0, fmt.Errorf("create pending epoch of %s: topology %q: %w", topology, topology, ErrUnknownTopology)
	case created != nil:
		return *created, nil
	case *pp == partitions && *ps == shards:
		return *pn, nil
	}
	return 0, fmt.Errorf("create pending epoch of %s: create epoch %dx%d while epoch %d (%dx%d) is pending: %w",
		topology, partitions, shards, *pn, *pp, *ps, ErrPendingExists)
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

// activateMissingCTE lists the live members whose current incarnation
// has not acknowledged epoch $2.
const activateMissingCTE = `
	t AS (SELECT shardkeeper.clock($1) AS now),
	missing AS (
		SELECT m.member FROM shardkeeper.members m, t
		 WHERE m.topology = $1 AND m.left_at IS NULL AND m.lease_expires_at > t.now
		   AND NOT EXISTS (SELECT 1 FROM shardkeeper.freeze_acks a
		                    WHERE a.topology = m.topology AND a.epoch = $2 AND a.member = m.member AND a.incarnation = m.incarnation))`

// activateRetireSQL retires the active epoch if epoch $2 is pending and
// every live member acknowledged it; activateSQL then activates $2 under
// the same conditions once no epoch is active. They are two statements
// because one active epoch is a unique index, checked row by row, and the
// two updates of one statement have no order. Between them nothing can
// add a member that must acknowledge (joins wait for the topology row) and
// acknowledgements only add, so both see the same verdict.
const (
	activateRetireSQL = `
	WITH ` + activateMissingCTE + `
	UPDATE shardkeeper.epochs x SET state = 'retired', retired_at = t.now FROM t
	 WHERE x.topology = $1 AND x.state = 'active'
	   AND EXISTS (SELECT 1 FROM shardkeeper.epochs p WHERE p.topology = $1 AND p.epoch = $2 AND p.state = 'pending')
	   AND NOT EXISTS (SELECT 1 FROM missing)`
	activateSQL = `
	WITH ` + activateMissingCTE + `,
	e AS (SELECT state FROM shardkeeper.epochs WHERE topology = $1 AND epoch = $2),
	act AS (
		UPDATE shardkeeper.epochs x SET state = 'active', activated_at = t.now FROM t
		 WHERE x.topology = $1 AND x.epoch = $2 AND x.state = 'pending' AND NOT EXISTS (SELECT 1 FROM missing)
		   AND NOT EXISTS (SELECT 1 FROM shardkeeper.epochs a WHERE a.topology = $1 AND a.state = 'active')
		RETURNING 1)
	SELECT EXISTS (SELECT 1 FROM shardkeeper.topologies WHERE topology = $1), e.state, EXISTS (SELECT 1 FROM act),
	       (SELECT coalesce(array_agg(member ORDER BY member COLLATE "C"), '{}') FROM missing)
	  FROM (SELECT 1) one LEFT JOIN e ON true`
)

// Activate implements Registry in one pipeline under the topology row's
// lock. Retiring the previous epoch updates its row, which waits for any
// claim batch still writing under it (batches lock the active epoch FOR
// SHARE), so no claim under the old epoch commits after the next one is
// active (P2).
func (p *PG) Activate(ctx context.Context, topology string, epoch int64) error {
	var (
		known, activated bool
		state            *string
		missing          []string
	)
	err := p.opPipeline(ctx, topology, func(b *pgx.Batch) {
		b.Queue(lockTopologySQL, topology)
		b.Queue(activateRetireSQL, topology, epoch)
		b.Queue(activateSQL, topology, epoch)
	}, func(br pgx.BatchResults) error {
		for i := 0; i < 2; i++ {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return br.QueryRow().Scan(&known, &state, &activated, &missing)
	})
	switch {
	case err != nil:
		return fmt.Errorf("activate epoch %d of %s: %w", epoch, topology, err)
	case !known:
		return fmt.Errorf("activate epoch %d of %s: topology %q: %w", epoch, topology, topology, ErrUnknownTopology)
	case activated || (state != nil && EpochState(*state) == EpochActive):
		return nil
	case state == nil || EpochState(*state) != EpochPending:
		return fmt.Errorf("activate epoch %d of %s: not pending: %w", epoch, topology, ErrEpochState)
	case len(missing) > 0:
		return fmt.Errorf("activate epoch %d of %s: %w", epoch, topology, &FreezeIncompleteError{Epoch: epoch, Missing: missing})
	}
	return fmt.Errorf("activate epoch %d of %s: %w", epoch, topology, ErrConflict)
}

// Retire implements Registry in one statement.
func (p *PG) Retire(ctx context.Context, topology string, epoch int64) error {
	var (
		now   *time.Time
		state *string
		done  *int
	)
	err := p.opQueryRow(ctx, topology, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		e AS (SELECT * FROM shardkeeper.epochs WHERE topology = $1 AND epoch = $2),
		upd AS (
			UPDATE shardkeeper.epochs x SET state = 'retired', retired_at = t.now FROM t
			 WHERE x.topology = $1 AND x.epoch = $2 AND x.state = 'pending'
			RETURNING 1 AS done)
		SELECT t.now, e.state, upd.done FROM t LEFT JOIN e ON true LEFT JOIN upd ON true`,
		[]any{topology, epoch}, &now, &state, &done)
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
	tag, err := p.opExec(ctx, topology, `
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
