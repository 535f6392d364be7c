package poolctl

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A batch of claims is one transaction of two round trips once its
// statements are prepared, whatever the number of units: BEGIN and the
// read go in one pipeline, the rules decide in Go, and the write and
// COMMIT go in another.

// claimReadSQL reads, with locks, everything decideBatch needs: the claim
// rows FOR UPDATE in unit order (so concurrent batches lock in one order
// and cannot deadlock); the claimer's and the owners' member rows and the
// active epoch FOR SHARE, so a rejoin of an owner, a fence of the claimer
// or an activation of the next epoch waits until the batch commits (P2).
// Each part comes back as its own kind of row, so every locking CTE is
// read to the end.
var claimReadSQL = `
	WITH t AS (SELECT shardkeeper.clock(topology) AS now, grace FROM shardkeeper.topologies WHERE topology = $1),
	me AS MATERIALIZED (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2 FOR SHARE),
	ae AS MATERIALIZED (SELECT * FROM shardkeeper.epochs WHERE topology = $1 AND state = 'active' FOR SHARE),
	pe AS (SELECT count(*) AS n FROM shardkeeper.epochs WHERE topology = $1 AND state = 'pending'),
	c AS MATERIALIZED (SELECT * FROM shardkeeper.claims WHERE topology = $1 AND unit = ANY($3::text[]) ORDER BY unit FOR UPDATE),
	ow AS MATERIALIZED (SELECT * FROM shardkeeper.members
	                     WHERE topology = $1 AND member IN (SELECT owner FROM c) ORDER BY member FOR SHARE),
	ru AS (SELECT unit FROM shardkeeper.retiring_units WHERE topology = $1 AND unit = ANY($3::text[]))
	SELECT 'head', t.now, t.grace, pe.n > 0, ae.epoch, ae.partitions, ae.shards, ` + memberCols("me") + `,
	       ` + nulls(claimColCount) + `, NULL
	  FROM t CROSS JOIN pe LEFT JOIN ae ON true LEFT JOIN me ON true
	UNION ALL
	SELECT 'claim', ` + nulls(6+memberColCount) + `, ` + claimCols("c") + `, NULL FROM c
	UNION ALL
	SELECT 'owner', ` + nulls(6) + `, ` + memberCols("ow") + `, ` + nulls(claimColCount) + `, NULL FROM ow
	UNION ALL
	SELECT 'retiring', ` + nulls(6+memberColCount+claimColCount) + `, ru.unit FROM ru`

// claimWriteSQL writes every decided unit in one statement, each row a
// compare-and-set on the epoch it was decided at: a new row only where
// none exists, an update only where the epoch is still the one below the
// decided epoch (every decision raises it by exactly one).
const claimWriteSQL = `
	INSERT INTO shardkeeper.claims AS cl (topology, unit, owner, owner_incarnation, fencing_epoch, state,
	                                      adopted_from, rehomed, last_op, under_epoch, updated_at)
	SELECT $1, w.unit, $2, $3, w.epoch, 'held', nullif(w.adopted_from, ''), w.rehomed, w.op, $4, $5
	  FROM unnest($6::text[], $7::bigint[], $8::text[], $9::boolean[], $10::text[]) AS w(unit, epoch, adopted_from, rehomed, op)
	 ORDER BY w.unit
	ON CONFLICT (topology, unit) DO UPDATE
	   SET owner = excluded.owner, owner_incarnation = excluded.owner_incarnation, fencing_epoch = excluded.fencing_epoch,
	       state = 'held', handover_to = NULL, adopted_from = excluded.adopted_from, rehomed = excluded.rehomed,
	       last_op = excluded.last_op, under_epoch = excluded.under_epoch, updated_at = excluded.updated_at
	 WHERE cl.fencing_epoch = excluded.fencing_epoch - 1
	RETURNING cl.unit`

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
	v, err := readClaimView(ctx, conn, m, units)
	if err != nil {
		rollback(ctx, conn)
		return nil, err
	}
	if testHookClaimRead != nil {
		testHookClaimRead()
	}
	outs, writes := decideBatch(m, under, units, v)
	written, err := writeClaims(ctx, conn, m, under, v.Now, writes)
	if err != nil {
		rollback(ctx, conn)
		return nil, err
	}
	for _, w := range writes {
		if !written[w.Unit] {
			conflicted(outs, m, w.Unit)
		}
	}
	return outs, nil
}

// readClaimView begins the transaction and reads the view, in one pipeline.
func readClaimView(ctx context.Context, conn *pgxpool.Conn, m MemberRef, units []string) (claimView, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(claimReadSQL, m.Topology, m.Member, units)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return claimView{}, err
	}
	rows, err := br.Query()
	if err != nil {
		return claimView{}, err
	}
	v := claimView{Rows: map[string]*claimRow{}, Owners: map[string]*memberRow{}, Retiring: map[string]bool{}}
	found := false
	for rows.Next() {
		head, err := scanClaimViewRow(rows, &v)
		if err != nil {
			rows.Close()
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
	return v, br.Close()
}

// scanClaimViewRow adds one row of claimReadSQL to v; head reports the
// header row (the topology exists).
func scanClaimViewRow(rows pgx.Rows, v *claimView) (head bool, err error) {
	var (
		kind              string
		now               *time.Time
		grace             *time.Duration
		pending           *bool
		epoch             *int64
		partitions, shard *int
		ms                memberScan
		cs                claimScan
		retiring          *string
	)
	if err := rows.Scan(scanAll([]any{&kind, &now, &grace, &pending, &epoch, &partitions, &shard},
		ms.dest(), cs.dest(), []any{&retiring})...); err != nil {
		return false, err
	}
	switch kind {
	case "head":
		v.Now, v.Grace, v.Pending, v.Claimer = *now, *grace, *pending, ms.row()
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

// writeClaims writes the decided units and commits, in one pipeline, and
// returns the units whose compare-and-set applied.
func writeClaims(ctx context.Context, conn *pgxpool.Conn, m MemberRef, under int64, now time.Time, writes []claimWrite) (map[string]bool, error) {
	b := &pgx.Batch{}
	if len(writes) > 0 {
		var (
			units, from, ops []string
			epochs           []int64
			rehomed          []bool
		)
		for _, w := range writes {
			units, epochs = append(units, w.Unit), append(epochs, w.Decision.NewEpoch)
			row := w.Decision.claimed(m, under, w.Unit, w.Prev)
			from, rehomed, ops = append(from, row.AdoptedFrom), append(rehomed, row.Rehomed), append(ops, string(row.LastOp))
		}
		b.Queue(claimWriteSQL, m.Topology, m.Member, m.Incarnation, under, now, units, epochs, from, rehomed, ops)
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	written := map[string]bool{}
	if len(writes) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var u string
			if err := rows.Scan(&u); err != nil {
				rows.Close()
				return nil, err
			}
			written[u] = true
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	return written, br.Close()
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
