package poolctl

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// confirmSQL is ConfirmOwned's statement. It checks the member's
// lease and, when mayRehome allows and no epoch is pending (the same
// conditions in SQL: no earlier incarnation may still be delivering, and
// no ownership moves during a freeze, P2), re-homes claims of earlier
// incarnations onto this one, raising their epochs so older tokens go
// stale; it locks them in unit order first, as claim batches do, and the
// active epoch FOR SHARE, so an activation waits for it as for a claim. It
// returns one member row, one row per held claim, one per claim still
// waiting for the re-home grace, and one per expected unit no longer held.
var confirmSQL = `
	WITH t AS (SELECT shardkeeper.clock(topology) AS now, grace FROM shardkeeper.topologies WHERE topology = $1),
	me AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
	ok AS (SELECT 1 FROM me, t WHERE me.incarnation = $3 AND me.left_at IS NULL AND me.lease_expires_at > t.now),
	may AS (SELECT 1 FROM me, t WHERE (me.prev_lease_expires_at IS NULL OR me.prev_lease_expires_at + t.grace <= t.now)
	          AND NOT EXISTS (SELECT 1 FROM shardkeeper.epochs WHERE topology = $1 AND state = 'pending')
	          AND coalesce((SELECT seq FROM shardkeeper.registry_seq WHERE topology = $1), 0) >= $6),
	ae AS MATERIALIZED (SELECT 1 FROM shardkeeper.epochs WHERE topology = $1 AND state = 'active' FOR SHARE),
	lk AS MATERIALIZED (
		SELECT c.unit FROM shardkeeper.claims c
		 WHERE EXISTS (SELECT 1 FROM ok) AND EXISTS (SELECT 1 FROM may) AND (SELECT count(*) FROM ae) >= 0
		   AND c.topology = $1 AND c.owner = $2 AND c.state <> 'free' AND c.owner_incarnation <> $3
		 ORDER BY c.unit FOR UPDATE),
	rehome AS (
		UPDATE shardkeeper.claims c
		   SET owner_incarnation = $3, fencing_epoch = c.fencing_epoch + 1, adopted_from = $2, rehomed = true,
		       last_op = 'rehome', under_epoch = NULL, updated_at = t.now
		  FROM t, lk
		 WHERE c.topology = $1 AND c.unit = lk.unit AND c.owner = $2 AND c.state <> 'free' AND c.owner_incarnation <> $3
		RETURNING c.unit, c.fencing_epoch, c.state),
	held AS (
		SELECT unit, fencing_epoch, state FROM rehome
		UNION ALL
		SELECT c.unit, c.fencing_epoch, c.state FROM shardkeeper.claims c
		 WHERE EXISTS (SELECT 1 FROM ok) AND c.topology = $1 AND c.owner = $2 AND c.state <> 'free'
		   AND c.owner_incarnation = $3),
	waiting AS (
		SELECT c.unit, c.fencing_epoch, c.state FROM shardkeeper.claims c
		 WHERE EXISTS (SELECT 1 FROM ok) AND NOT EXISTS (SELECT 1 FROM may)
		   AND c.topology = $1 AND c.owner = $2 AND c.state <> 'free' AND c.owner_incarnation <> $3),
	want AS (SELECT * FROM unnest($4::text[], $5::bigint[]) AS w(unit, epoch))
	SELECT 'member' AS kind, NULL::text AS unit, NULL::bigint AS expected, NULL::bigint AS epoch, NULL::text AS state,
	       NULL::text AS owner, t.now, ` + memberCols("me") + `
	  FROM t LEFT JOIN me ON true
	UNION ALL
	SELECT 'held', h.unit, NULL, h.fencing_epoch, h.state, NULL, NULL, ` + nulls(memberColCount) + ` FROM held h
	UNION ALL
	SELECT 'waiting', h.unit, NULL, h.fencing_epoch, h.state, NULL, NULL, ` + nulls(memberColCount) + ` FROM waiting h
	UNION ALL
	SELECT 'moved', w.unit, w.epoch, c.fencing_epoch, c.state, c.owner, NULL, ` + nulls(memberColCount) + `
	  FROM want w LEFT JOIN shardkeeper.claims c ON c.topology = $1 AND c.unit = w.unit
	 WHERE EXISTS (SELECT 1 FROM ok) AND w.unit NOT IN (SELECT unit FROM held) AND w.unit NOT IN (SELECT unit FROM waiting)`

// confirmLockSQL takes the locks a re-home needs before confirmSQL runs,
// in the order claim batches take them (claim rows in unit order, then
// the active epoch), so confirmSQL's snapshot and clock come after every
// wait.
var confirmLockSQL = []string{
	`SELECT 1 FROM shardkeeper.claims WHERE topology = $1 AND owner = $2 AND state <> 'free' AND owner_incarnation <> $3
	  ORDER BY unit FOR UPDATE`,
	`SELECT 1 FROM shardkeeper.epochs WHERE topology = $1 AND state = 'active' FOR SHARE`,
}

// ConfirmOwned implements Registry in one pipeline (one round trip once
// its statements are prepared on the connection, however many claims):
// the locks, then confirmSQL. A confirmation settles an unknown outcome,
// so it is checked like a renewal (checkRead), and it re-homes nothing on
// a registry whose sequence is below this client's mark ($6).
func (p *PG) ConfirmOwned(ctx context.Context, m MemberRef, expected map[string]int64) (Confirmation, error) {
	units := make([]string, 0, len(expected))
	epochs := make([]int64, 0, len(expected))
	for u, e := range expected {
		units = append(units, u)
		epochs = append(epochs, e)
	}
	var (
		now *time.Time
		me  *memberRow
		c   Confirmation
		rs  readSeq
	)
	err := pipeline(ctx, p.pool, func(b *pgx.Batch) {
		b.Queue(readSeqSQL, m.Topology)
		b.Queue(confirmLockSQL[0], m.Topology, m.Member, m.Incarnation)
		b.Queue(confirmLockSQL[1], m.Topology)
		b.Queue(confirmSQL, m.Topology, m.Member, m.Incarnation, units, epochs, p.marks.get(m.Topology))
	}, func(br pgx.BatchResults) error {
		if err := br.QueryRow().Scan(rs.dest()...); err != nil {
			return err
		}
		for range confirmLockSQL {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		now, me, c, err = scanConfirmation(rows, m)
		return err
	})
	if err != nil {
		return Confirmation{}, fmt.Errorf("confirm owned by %s: %w", m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return Confirmation{}, err
	}
	if err := p.checkRead(ctx, p.pool, m.Topology, rs); err != nil {
		return Confirmation{}, fmt.Errorf("confirm owned by %s: %w", m.Member, err)
	}
	if err := checkMember(m, me, *now); err != nil {
		return Confirmation{}, fmt.Errorf("confirm owned: %w", err)
	}
	sort.Strings(c.Handover)
	sort.Strings(c.Waiting)
	sort.Slice(c.Moved, func(i, j int) bool { return c.Moved[i].Unit < c.Moved[j].Unit })
	return c, nil
}

// scanConfirmation reads confirmSQL's rows: the clock and the member row,
// and the confirmation.
func scanConfirmation(rows pgx.Rows, m MemberRef) (*time.Time, *memberRow, Confirmation, error) {
	defer rows.Close()
	var (
		now *time.Time
		me  *memberRow
		c   = Confirmation{Held: map[string]Token{}}
	)
	for rows.Next() {
		var (
			kind               string
			unit, state, owner *string
			expectedEp, epoch  *int64
			rowNow             *time.Time
			ms                 memberScan
		)
		if err := rows.Scan(scanAll([]any{&kind, &unit, &expectedEp, &epoch, &state, &owner, &rowNow}, ms.dest())...); err != nil {
			return nil, nil, Confirmation{}, err
		}
		switch kind {
		case "member":
			now, me = rowNow, ms.row()
		case "held":
			c.Held[*unit] = Token{Topology: m.Topology, Unit: *unit, Member: m.Member, Epoch: *epoch}
			if ClaimState(*state) == StateHandover {
				c.Handover = append(c.Handover, *unit)
			}
		case "waiting":
			c.Waiting = append(c.Waiting, *unit)
		case "moved":
			mv := Moved{Unit: *unit, Expected: *expectedEp}
			if epoch != nil {
				mv.Epoch, mv.State = *epoch, ClaimState(*state)
				if owner != nil {
					mv.Owner = *owner
				}
			}
			c.Moved = append(c.Moved, mv)
		}
	}
	return now, me, c, rows.Err()
}
