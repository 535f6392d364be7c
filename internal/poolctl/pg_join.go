package poolctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A Rejoin by the process that already holds a later, live incarnation
// (its own join that arrived late, or one whose reply was lost) renews that
// incarnation through Renew instead of starting another (ownIncarnation).
//
// Join and Rejoin take two round trips and hold no lock across either, as
// claim batches do (pg_claims.go): one read without locks, the decision in
// Go by the rules the twin applies (checkDisplaced, pickSlot, joinRow),
// and one pipeline the server runs to the end by itself: BEGIN; lock the
// topology row (joins of a topology serialize) and the member rows the
// decision touches FOR UPDATE (the joining member's, which also waits for
// any claim batch of it to commit, and the one whose slot it takes); check
// in a statement whose snapshot comes after those locks that everything
// decided from is as read, and if so take the incarnation and free the
// slot (joinCheckSQL); write the member row (joinWriteSQL); COMMIT. A join
// whose view changed (a renewal of the earlier incarnation, another join)
// reads and decides again, so the same-name grace is always computed from
// the earlier incarnation's final expiry, never a stale one.

// joinReadSQL reads the topology's next incarnation, clock and parameters,
// and every member row, without locks.
var joinReadSQL = `
	WITH t AS (SELECT next_incarnation, shardkeeper.clock(topology) AS now, ` + paramsCols + `
	             FROM shardkeeper.topologies WHERE topology = $1)
	SELECT t.next_incarnation, t.now, ` + paramsColsOf("t") + `, ` + memberCols("m") + `
	  FROM t LEFT JOIN shardkeeper.members m ON m.topology = $1`

const (
	joinLockTopologySQL = `SELECT 1 FROM shardkeeper.topologies WHERE topology = $1 FOR UPDATE`
	joinLockMembersSQL  = `SELECT 1 FROM shardkeeper.members WHERE topology = $1 AND member = ANY($2::text[]) ORDER BY member FOR UPDATE`
)

// joinCheckSQL applies the decision's first half only where its view
// holds: the next incarnation is the one read; the joining member's row is
// absent as read ($17 false), or exactly as read (a drain request for a
// name that never joined leaves a row of incarnation 0, so absence is its
// own argument); the member whose slot is taken still
// holds it with the lease it was judged by. It then takes the incarnation,
// frees the taken slot and marks the transaction (shardkeeper.join_ok) for
// joinWriteSQL, a statement of its own because the slot's unique index is
// checked row by row and the two writes of one statement have no order.
const joinCheckSQL = `
	WITH t AS (SELECT next_incarnation FROM shardkeeper.topologies WHERE topology = $1),
	ok AS (
		SELECT 1 FROM t WHERE t.next_incarnation = $2
		   AND CASE WHEN NOT $17::boolean
		            THEN NOT EXISTS (SELECT 1 FROM shardkeeper.members WHERE topology = $1 AND member = $3)
		            ELSE EXISTS (SELECT 1 FROM shardkeeper.members m WHERE m.topology = $1 AND m.member = $3
		                            AND m.incarnation = $4 AND m.lease_expires_at = $5 AND (m.left_at IS NOT NULL) = $6
		                            AND m.fenced = $7 AND m.fence_lifted_at IS NOT DISTINCT FROM $8 AND m.draining = $9
		                            AND m.prev_lease_expires_at IS NOT DISTINCT FROM $10 AND coalesce(m.slot, -1) = $11)
		       END
		   AND ($12 = '' OR EXISTS (SELECT 1 FROM shardkeeper.members m WHERE m.topology = $1 AND m.member = $12
		                               AND m.slot = $13 AND m.incarnation = $14 AND m.lease_expires_at = $15
		                               AND (m.left_at IS NOT NULL) = $16))),
	bump AS (UPDATE shardkeeper.topologies x SET next_incarnation = $2 + 1 FROM ok WHERE x.topology = $1 RETURNING 1),
	freed AS (UPDATE shardkeeper.members m SET slot = NULL FROM ok WHERE m.topology = $1 AND m.member = $12 RETURNING 1)
	SELECT set_config('shardkeeper.join_ok', (SELECT count(*) FROM bump)::text, true), (SELECT count(*) FROM freed)`

// joinWriteSQL writes the member row if joinCheckSQL applied, with the
// lease and (when the join lifts a fence) the lift counted from the clock
// read after the locks.
const joinWriteSQL = `
	WITH t AS (SELECT shardkeeper.clock(topology) AS now FROM shardkeeper.topologies WHERE topology = $1)
	INSERT INTO shardkeeper.members AS m (topology, member, slot, incarnation, lease_expires_at, fenced, fence_lifted_at,
		fence_gen, prev_lease_expires_at, joined_at, process)
	SELECT $1, $2, $3, $4, t.now + $5::interval, false, CASE WHEN $6 THEN t.now ELSE $7::timestamptz END, 0, $8, t.now,
	       nullif($9, '')
	  FROM t WHERE current_setting('shardkeeper.join_ok', true) = '1'
	ON CONFLICT (topology, member) DO UPDATE SET slot = excluded.slot, incarnation = excluded.incarnation,
		lease_expires_at = excluded.lease_expires_at, fenced = false, fence_lifted_at = excluded.fence_lifted_at,
		fence_gen = 0, prev_lease_expires_at = excluded.prev_lease_expires_at,
		joined_at = excluded.joined_at, left_at = NULL, process = excluded.process
	RETURNING m.lease_expires_at`

// testHookJoinRead, when set by a test, runs after a join's read and
// before its decision and write.
var testHookJoinRead func()

// maxJoinAttempts bounds how often a join decides again after its view
// changed before it gives up with ErrConflict.
const maxJoinAttempts = 4

// Join implements Registry.
func (p *PG) Join(ctx context.Context, topology, member string) (Lease, error) {
	return p.join(ctx, MemberRef{Topology: topology, Member: member}, false, "")
}

// Rejoin implements Registry.
func (p *PG) Rejoin(ctx context.Context, m MemberRef, process string) (Lease, error) {
	return p.join(ctx, m, true, process)
}

func (p *PG) join(ctx context.Context, ref MemberRef, rejoin bool, process string) (Lease, error) {
	if ref.Member == "" {
		return Lease{}, fmt.Errorf("join: empty member name: %w", ErrInvalid)
	}
	for attempt := 1; attempt <= maxJoinAttempts; attempt++ {
		l, own, applied, err := p.joinOnce(ctx, ref, rejoin, process)
		if err != nil {
			return Lease{}, fmt.Errorf("join %s to %s: %w", ref.Member, ref.Topology, err)
		}
		if applied {
			return l, nil
		}
		if own == 0 {
			continue
		}
		// The process's own live incarnation: renew it (with the join's
		// connection back in the pool). A renewal refused because it
		// lapsed or changed since the read decides again from a fresh
		// read.
		l, err = p.Renew(ctx, MemberRef{Topology: ref.Topology, Member: ref.Member, Incarnation: own})
		switch {
		case err == nil:
			return l, nil
		case !errors.Is(err, ErrLeaseExpired) && !errors.Is(err, ErrStaleIncarnation) && !errors.Is(err, ErrNotMember):
			return Lease{}, fmt.Errorf("join %s to %s (renewing its own incarnation %d): %w", ref.Member, ref.Topology, own, err)
		}
	}
	return Lease{}, fmt.Errorf("join %s to %s: the members changed at every attempt: %w", ref.Member, ref.Topology, ErrConflict)
}

// joinOnce reads, decides and writes once. It reports the lease when the
// write applied, or the caller's process's own live incarnation to renew
// (own), or neither when the view changed before the write.
func (p *PG) joinOnce(ctx context.Context, ref MemberRef, rejoin bool, process string) (Lease, int64, bool, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return Lease{}, 0, false, err
	}
	defer conn.Release()
	v, err := readJoinView(ctx, conn, ref.Topology)
	if err != nil {
		return Lease{}, 0, false, err
	}
	if testHookJoinRead != nil {
		testHookJoinRead()
	}
	d, err := decideJoin(ref, rejoin, process, v)
	if err != nil {
		return Lease{}, 0, false, err
	}
	if d.Own != nil {
		return Lease{}, d.Own.Incarnation, false, nil
	}
	expires, applied, err := writeJoin(ctx, conn, ref, v, d)
	if err != nil {
		rollback(ctx, conn)
		return Lease{}, 0, false, err
	}
	if !applied {
		return Lease{}, 0, false, nil
	}
	return Lease{MemberRef: MemberRef{Topology: ref.Topology, Member: ref.Member, Incarnation: v.NextInc},
		Slot: d.Row.Slot, TTL: v.Params.LeaseTTL, ExpiresAt: expires, Params: v.Params}, 0, true, nil
}

// readJoinView reads the view in one statement, without locks.
func readJoinView(ctx context.Context, conn *pgxpool.Conn, topology string) (joinView, error) {
	rows, err := conn.Query(ctx, joinReadSQL, topology)
	if err != nil {
		return joinView{}, err
	}
	defer rows.Close()
	var v joinView
	found := false
	for rows.Next() {
		var ms memberScan
		if err := rows.Scan(scanAll([]any{&v.NextInc, &v.Now}, paramsDest(&v.Params), ms.dest())...); err != nil {
			return joinView{}, err
		}
		found = true
		if m := ms.row(); m != nil {
			v.Members = append(v.Members, *m)
		}
	}
	if err := rows.Err(); err != nil {
		return joinView{}, err
	}
	if !found {
		return joinView{}, fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return v, nil
}

// writeJoin runs the join's pipeline and reports whether its view still
// held (and so whether it wrote), with the lease expiry it wrote.
func writeJoin(ctx context.Context, conn *pgxpool.Conn, ref MemberRef, v joinView, d joinDecision) (time.Time, bool, error) {
	self := d.Prev
	if self == nil {
		self = &memberRow{}
	}
	taken := d.Taken
	if taken == nil {
		taken = &memberRow{Slot: -1}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(joinLockTopologySQL, ref.Topology)
	b.Queue(joinLockMembersSQL, ref.Topology, []string{ref.Member, taken.Name})
	b.Queue(joinCheckSQL, ref.Topology, v.NextInc, ref.Member,
		self.Incarnation, self.LeaseExpiresAt, self.Left, self.Fenced, nullTime(self.FenceLiftedAt), self.Draining,
		nullTime(self.PrevLeaseExpiresAt), self.Slot,
		taken.Name, taken.Slot, taken.Incarnation, taken.LeaseExpiresAt, taken.Left, d.Prev != nil)
	b.Queue(joinWriteSQL, ref.Topology, ref.Member, d.Row.Slot, v.NextInc, v.Params.LeaseTTL, d.LiftsFence,
		nullTime(d.Row.FenceLiftedAt), nullTime(d.Row.PrevLeaseExpiresAt), d.Row.Process)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	for i := 0; i < 4; i++ {
		if _, err := br.Exec(); err != nil {
			return time.Time{}, false, err
		}
	}
	var expires time.Time
	applied := true
	if err := br.QueryRow().Scan(&expires); errors.Is(err, pgx.ErrNoRows) {
		applied = false
	} else if err != nil {
		return time.Time{}, false, err
	}
	if _, err := br.Exec(); err != nil {
		return time.Time{}, false, err
	}
	return expires, applied, br.Close()
}
