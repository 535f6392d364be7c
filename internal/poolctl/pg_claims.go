package poolctl

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A batch of claims takes two round trips once its statements are
// prepared, whatever the number of units, and never holds a lock across a
// round trip (issue 20, defect 3: a claimer SIGSTOPped or cut off between
// a locking read and its write held its owners' member rows, so their
// renewals waited and they fenced themselves):
//
//  1. The read (claimReadSQL) is one statement without locks: a consistent
//     view of everything decideBatch needs.
//  2. The rules decide in Go, on that view (the twin applies the same).
//  3. The write is one pipeline the server runs without waiting for the
//     client: BEGIN; lock the claim rows FOR UPDATE in unit order (so
//     concurrent batches cannot deadlock); lock the active epoch and the
//     claimer's member row (so an activation of the next epoch, P2, or a
//     leave or rejoin of the claimer waits until the batch commits, while
//     renewals do not wait at all); then, in a statement whose snapshot and clock are
//     taken after those locks, write each decided unit only where the rows
//     its decision read are still as they were (claimWriteSQL); COMMIT.
//
// A unit whose rows changed between the read and the write is decided
// again from a new read (at most maxClaimAttempts times), so a batch
// answers what a serial registry would (the twin) rather than a spurious
// conflict.

// claimReadSQL reads, without locks, everything decideBatch needs: the
// claimer's member row, the active epoch and whether one is pending, the
// claim rows, their owners' member rows and the retiring set. Each part
// comes back as its own kind of row.
var claimReadSQL = `
	WITH t AS (SELECT shardkeeper.clock(topology) AS now, grace, recovered_until FROM shardkeeper.topologies WHERE topology = $1),
	me AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
	ae AS (SELECT * FROM shardkeeper.epochs WHERE topology = $1 AND state = 'active'),
	pe AS (SELECT count(*) AS n FROM shardkeeper.epochs WHERE topology = $1 AND state = 'pending'),
	c AS MATERIALIZED (SELECT * FROM shardkeeper.claims WHERE topology = $1 AND unit = ANY($3::text[])),
	ow AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member IN (SELECT owner FROM c)),
	ru AS (SELECT unit FROM shardkeeper.retiring_units WHERE topology = $1 AND unit = ANY($3::text[]))
	SELECT 'head', t.now, t.grace, t.recovered_until, pe.n > 0, ae.epoch, ae.partitions, ae.shards, ` + memberCols("me") + `,
	       ` + nulls(claimColCount) + `, NULL
	  FROM t CROSS JOIN pe LEFT JOIN ae ON true LEFT JOIN me ON true
	UNION ALL
	SELECT 'claim', ` + nulls(7+memberColCount) + `, ` + claimCols("c") + `, NULL FROM c
	UNION ALL
	SELECT 'owner', ` + nulls(7) + `, ` + memberCols("ow") + `, ` + nulls(claimColCount) + `, NULL FROM ow
	UNION ALL
	SELECT 'retiring', ` + nulls(7+memberColCount+claimColCount) + `, ru.unit FROM ru`

// claimLockRowsSQL and claimLockRefsSQL take the write's locks, each in a
// statement of its own so that the write's snapshot and clock are taken
// after every wait: the claim rows in unit order, then the active epoch
// FOR SHARE (Activate's update of it waits) and the claimer's member row
// FOR KEY SHARE. KEY SHARE conflicts with the FOR UPDATE that Join and
// Leave take first, so neither interleaves with a claim of the member,
// but not with the plain updates of Renew, Fence and Unfence: a member's
// renewal never waits for a claim, not even its own.
const (
	claimLockRowsSQL = `SELECT unit FROM shardkeeper.claims WHERE topology = $1 AND unit = ANY($2::text[]) ORDER BY unit FOR UPDATE`
	claimLockRefsSQL = `
		SELECT e.epoch FROM shardkeeper.epochs e, shardkeeper.members m
		 WHERE e.topology = $1 AND e.state = 'active' AND m.topology = $1 AND m.member = $2
		   FOR SHARE OF e FOR KEY SHARE OF m`
)

// claimWriteSQL writes every decided unit in one statement, and only
// where the decision still holds: the claimer is the same incarnation,
// live on the clock read now (after the locks), unfenced, not draining,
// with the fence lift and the same-name grace it was decided with; the
// active epoch is the one decided under and none is pending; the claim
// row is as read (absent, or at the epoch below the decided one in the
// same state, owner and handover target); and, for an adoption, the
// owner's member row is as read. It returns the clock and each written
// unit with its checkpoint.
const claimWriteSQL = `
	WITH t AS (SELECT shardkeeper.clock(topology) AS now FROM shardkeeper.topologies WHERE topology = $1),
	ok AS (
		SELECT 1 FROM t, shardkeeper.members me
		 WHERE me.topology = $1 AND me.member = $2 AND me.incarnation = $3 AND me.left_at IS NULL
		   AND me.lease_expires_at > t.now AND NOT me.fenced AND NOT me.draining
		   AND me.fence_lifted_at IS NOT DISTINCT FROM $5 AND me.prev_lease_expires_at IS NOT DISTINCT FROM $6
		   AND EXISTS (SELECT 1 FROM shardkeeper.epochs e WHERE e.topology = $1 AND e.state = 'active' AND e.epoch = $4)
		   AND NOT EXISTS (SELECT 1 FROM shardkeeper.epochs e WHERE e.topology = $1 AND e.state = 'pending')),
	w AS (SELECT * FROM unnest($7::text[], $8::bigint[], $9::text[], $10::boolean[], $11::text[],
	                           $12::text[], $13::text[], $14::bigint[], $15::text[],
	                           $16::boolean[], $17::bigint[], $18::timestamptz[], $19::boolean[])
	        AS w(unit, epoch, adopted_from, rehomed, op, prev_state, prev_owner, prev_inc, prev_handover,
	             check_owner, owner_inc, owner_expires, owner_left)),
	ins AS (
		INSERT INTO shardkeeper.claims AS cl (topology, unit, owner, owner_incarnation, fencing_epoch, state,
		                                      adopted_from, rehomed, last_op, under_epoch, updated_at)
		SELECT $1, w.unit, $2, $3, w.epoch, 'held', nullif(w.adopted_from, ''), w.rehomed, w.op, $4, t.now
		  FROM w CROSS JOIN t CROSS JOIN ok
		  LEFT JOIN shardkeeper.claims c ON c.topology = $1 AND c.unit = w.unit
		 WHERE (w.prev_state = '' AND c.unit IS NULL)
		    OR (c.fencing_epoch = w.epoch - 1 AND c.state = w.prev_state AND coalesce(c.owner, '') = w.prev_owner
		        AND coalesce(c.owner_incarnation, 0) = w.prev_inc AND coalesce(c.handover_to, '') = w.prev_handover
		        AND (NOT w.check_owner
		             OR (w.owner_inc = 0 AND NOT EXISTS (
		                   SELECT 1 FROM shardkeeper.members o WHERE o.topology = $1 AND o.member = w.prev_owner))
		             OR EXISTS (
		                   SELECT 1 FROM shardkeeper.members o WHERE o.topology = $1 AND o.member = w.prev_owner
		                      AND o.incarnation = w.owner_inc AND o.lease_expires_at = w.owner_expires
		                      AND (o.left_at IS NOT NULL) = w.owner_left)))
		 ORDER BY w.unit
		ON CONFLICT (topology, unit) DO UPDATE
		   SET owner = excluded.owner, owner_incarnation = excluded.owner_incarnation, fencing_epoch = excluded.fencing_epoch,
		       state = 'held', handover_to = NULL, adopted_from = excluded.adopted_from, rehomed = excluded.rehomed,
		       last_op = excluded.last_op, under_epoch = excluded.under_epoch, updated_at = excluded.updated_at
		 WHERE cl.fencing_epoch = excluded.fencing_epoch - 1
		RETURNING cl.unit, cl.checkpoint_seq)
	SELECT t.now, ins.unit, ins.checkpoint_seq FROM t LEFT JOIN ins ON true`

// maxClaimAttempts bounds how often a batch decides a unit again after
// its rows changed between the read and the write; a unit still changing
// after that is refused with ErrConflict.
const maxClaimAttempts = 4

// testHookClaimRead, when set by a test, runs after a claim batch's read
// and before its write: the client stalled between its two round trips.
var testHookClaimRead func()

// Claim implements Registry as a batch of one unit, so single and batch
// claims share one code path.
func (p *PG) Claim(ctx context.Context, m MemberRef, under int64, unit string) (Claim, error) {
	return claimOne(ctx, p, m, under, unit)
}

// claimOne is Claim through ClaimMany, for both backends.
func claimOne(ctx context.Context, r Registry, m MemberRef, under int64, unit string) (Claim, error) {
	outs, err := r.ClaimMany(ctx, m, under, []string{unit})
	if err != nil {
		return Claim{}, err
	}
	return outs[0].Claim, outs[0].Err
}

// ClaimMany implements Registry in one transaction of two pipelines.
func (p *PG) ClaimMany(ctx context.Context, m MemberRef, under int64, units []string) ([]ClaimOutcome, error) {
	if len(units) == 0 {
		return []ClaimOutcome{}, nil
	}
	distinct := distinctUnits(units)
	outs, err := p.claimBatch(ctx, m, under, distinct)
	if err != nil {
		return nil, fmt.Errorf("claim %s for %s: %w", batchLabel(distinct), m.Member, err)
	}
	return outcomesInOrder(units, outs), nil
}

func (p *PG) claimBatch(ctx context.Context, m MemberRef, under int64, units []string) (map[string]ClaimOutcome, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	// A connection left inside a transaction (a failed pipeline whose
	// ROLLBACK did not get through) is destroyed by the pool on release.
	defer conn.Release()
	outs := make(map[string]ClaimOutcome, len(units))
	checked := false // the registry's sequence, once a repeat is answered
	for attempt := 1; ; attempt++ {
		v, err := readClaimView(ctx, conn, m, units)
		if err != nil {
			return nil, err
		}
		if testHookClaimRead != nil {
			testHookClaimRead()
		}
		decided, writes := decideBatch(m, under, units, pgMutation.bent(v))
		if !checked && repeats(decided, writes) {
			// A repeat writes nothing, so no commit trigger checks the
			// registry it was read from: on a standby that lost this
			// member's release it would hand the released token back
			// (chaos 14a).
			if err := p.checkReadNow(ctx, conn, m.Topology); err != nil {
				return nil, err
			}
			checked = true
		}
		for u, o := range decided {
			outs[u] = o
		}
		if len(writes) == 0 {
			return outs, nil
		}
		now, written, err := writeClaims(ctx, conn, m, under, v, writes)
		if err != nil {
			rollback(ctx, conn)
			return nil, err
		}
		var again []string
		for _, w := range writes {
			seq, ok := written[w.Unit]
			if !ok {
				again = append(again, w.Unit)
				continue
			}
			o := outs[w.Unit]
			o.Claim.CheckpointSeq, o.Claim.At = seq, now
			outs[w.Unit] = o
		}
		if len(again) == 0 {
			return outs, nil
		}
		if attempt == maxClaimAttempts {
			for _, u := range again {
				conflicted(outs, m, u)
			}
			return outs, nil
		}
		units = again
	}
}

// readClaimView reads the view in one statement, without locks.
func readClaimView(ctx context.Context, conn *pgxpool.Conn, m MemberRef, units []string) (claimView, error) {
	rows, err := conn.Query(ctx, claimReadSQL, m.Topology, m.Member, units)
	if err != nil {
		return claimView{}, err
	}
	defer rows.Close()
	v := claimView{Rows: map[string]*claimRow{}, Owners: map[string]*memberRow{}, Retiring: map[string]bool{}}
	found := false
	for rows.Next() {
		head, err := scanClaimViewRow(rows, &v)
		if err != nil {
			return claimView{}, err
		}
		found = found || head
	}
	if err := rows.Err(); err != nil {
		return claimView{}, err
	}
	if !found {
		return claimView{}, fmt.Errorf("topology %q: %w", m.Topology, ErrUnknownTopology)
	}
	return v, nil
}

// scanClaimViewRow adds one row of claimReadSQL to v; head reports the
// header row (the topology exists).
func scanClaimViewRow(rows pgx.Rows, v *claimView) (head bool, err error) {
	var (
		kind              string
		now               *time.Time
		grace             *time.Duration
		recovered         *time.Time
		pending           *bool
		epoch             *int64
		partitions, shard *int
		ms                memberScan
		cs                claimScan
		retiring          *string
	)
	if err := rows.Scan(scanAll([]any{&kind, &now, &grace, &recovered, &pending, &epoch, &partitions, &shard},
		ms.dest(), cs.dest(), []any{&retiring})...); err != nil {
		return false, err
	}
	switch kind {
	case "head":
		v.Now, v.Grace, v.Pending, v.Claimer = *now, *grace, *pending, ms.row()
		if recovered != nil {
			v.RecoveredUntil = *recovered
		}
		if epoch != nil {
			v.Active = &epochRow{Number: *epoch, Partitions: *partitions, Shards: *shard, State: EpochActive}
		}
		return true, nil
	case "claim":
		row := cs.row()
		v.Rows[row.Unit] = row
	case "owner":
		row := ms.row()
		v.Owners[row.Name] = row
	case "retiring":
		v.Retiring[*retiring] = true
	}
	return false, nil
}

// writeClaims takes the locks, writes the decided units where their
// decisions still hold and commits, in one pipeline. It returns the
// registry's clock at the write and the written units with their
// checkpoints.
func writeClaims(ctx context.Context, conn *pgxpool.Conn, m MemberRef, under int64, v claimView, writes []claimWrite) (time.Time, map[string]int64, error) {
	n := len(writes)
	var (
		units, from, ops, prevState, prevOwner, prevHandover = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n),
			make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		epochs, prevInc, ownerInc      = make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
		rehomed, checkOwner, ownerLeft = make([]bool, 0, n), make([]bool, 0, n), make([]bool, 0, n)
		ownerExpires                   = make([]time.Time, 0, n)
	)
	for _, w := range writes {
		row := w.Decision.claimed(m, under, w.Unit, w.Prev)
		units, epochs = append(units, w.Unit), append(epochs, w.Decision.NewEpoch)
		from, rehomed, ops = append(from, row.AdoptedFrom), append(rehomed, row.Rehomed), append(ops, string(row.LastOp))
		var st, owner, handover string
		var inc int64
		if w.Prev != nil {
			st, owner, inc, handover = string(w.Prev.State), w.Prev.Owner, w.Prev.OwnerIncarnation, w.Prev.HandoverTo
		}
		prevState, prevOwner, prevInc, prevHandover = append(prevState, st), append(prevOwner, owner), append(prevInc, inc), append(prevHandover, handover)
		// An adoption was decided on the owner's lease: it applies only if
		// the owner's row is as read (absent: incarnation 0).
		var oInc int64
		var oExp time.Time
		var oLeft bool
		if o := v.input(w.Unit).Owner; o != nil {
			oInc, oExp, oLeft = o.Incarnation, o.LeaseExpiresAt, o.Left
		}
		checkOwner = append(checkOwner, w.Decision.Adopted)
		ownerInc, ownerExpires, ownerLeft = append(ownerInc, oInc), append(ownerExpires, oExp), append(ownerLeft, oLeft)
	}
	me := v.Claimer
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(claimLockRowsSQL, m.Topology, units)
	b.Queue(claimLockRefsSQL, m.Topology, m.Member)
	b.Queue(claimWriteSQL, m.Topology, m.Member, m.Incarnation, under, nullTime(me.FenceLiftedAt), nullTime(me.PrevLeaseExpiresAt),
		units, epochs, from, rehomed, ops, prevState, prevOwner, prevInc, prevHandover, checkOwner, ownerInc, ownerExpires, ownerLeft)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	for i := 0; i < 3; i++ {
		if _, err := br.Exec(); err != nil {
			return time.Time{}, nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return time.Time{}, nil, err
	}
	var now time.Time
	written := map[string]int64{}
	for rows.Next() {
		var (
			unit *string
			seq  *int64
		)
		if err := rows.Scan(&now, &unit, &seq); err != nil {
			rows.Close()
			return time.Time{}, nil, err
		}
		if unit != nil {
			written[*unit] = *seq
		}
	}
	if err := rows.Err(); err != nil {
		return time.Time{}, nil, err
	}
	if _, err := br.Exec(); err != nil {
		return time.Time{}, nil, err
	}
	return now, written, br.Close()
}

// rollback ends a failed batch's transaction. If it cannot (the connection
// broke), the pool destroys the connection on release.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = conn.Exec(ctx, "ROLLBACK")
}

// nulls is n untyped NULL columns.
func nulls(n int) string {
	return strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ")
}
