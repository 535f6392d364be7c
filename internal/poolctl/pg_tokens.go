package poolctl

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// tokenReadSQL reads the claim row and its owner's member row.
var tokenReadSQL = `
	WITH t AS (SELECT shardkeeper.clock($1) AS now),
	c AS (SELECT * FROM shardkeeper.claims WHERE topology = $1 AND unit = $2),
	ow AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = (SELECT owner FROM c))`

// tokenHeldSQL is the guard of a guarded write, over claims cl, members m
// and tokenReadSQL's t: the token in $1-$4 (topology, unit, member,
// epoch) names the claim as held, by a live lease of its owner's current
// incarnation.
const tokenHeldSQL = `cl.topology = $1 AND cl.unit = $2 AND cl.owner = $3 AND cl.fencing_epoch = $4 AND cl.state <> 'free'
			   AND m.topology = cl.topology AND m.member = cl.owner AND m.incarnation = cl.owner_incarnation
			   AND m.left_at IS NULL AND m.lease_expires_at > t.now`

// guardedWrite runs a guarded write in one statement: write is a CTE named
// upd (it may name earlier CTEs of its own before it) that writes only
// under tokenHeldSQL and returns a row when it did; args follow the
// token's four. A refusal says why the token is not valid.
func (p *PG) guardedWrite(ctx context.Context, t Token, op, write string, args ...any) error {
	var (
		now  *time.Time
		done *int
		c    claimScan
		ow   memberScan
	)
	err := p.pool.QueryRow(ctx, tokenReadSQL+`,
		`+write+`
		SELECT t.now, upd.done, `+claimCols("c")+`, `+memberCols("ow")+`
		  FROM t LEFT JOIN c ON true LEFT JOIN ow ON true LEFT JOIN upd ON true`,
		append([]any{t.Topology, t.Unit, t.Member, t.Epoch}, args...)...).Scan(scanAll([]any{&now, &done}, c.dest(), ow.dest())...)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, t.Unit, err)
	}
	if err := topologyErr(t.Topology, now); err != nil {
		return err
	}
	if done == nil {
		return fmt.Errorf("%s: %w", op, refusal(tokenValid(t, c.row(), ow.row(), *now)))
	}
	return nil
}

// Checkpoint implements Registry: a guarded write in one statement.
func (p *PG) Checkpoint(ctx context.Context, t Token, seq int64) error {
	return p.guardedWrite(ctx, t, "checkpoint", `upd AS (
			UPDATE shardkeeper.claims cl SET checkpoint_seq = greatest(cl.checkpoint_seq, $5), updated_at = t.now
			  FROM t, shardkeeper.members m
			 WHERE `+tokenHeldSQL+`
			RETURNING 1 AS done)`, seq)
}

// CheckToken implements Registry in one statement, without locks: it says
// what was true when it ran. Sinks in this database use GuardedExec.
func (p *PG) CheckToken(ctx context.Context, t Token) error {
	return readToken(ctx, p.pool, t)
}

// Claims implements Registry.
func (p *PG) Claims(ctx context.Context, topology string) ([]ClaimInfo, error) {
	rows, err := p.pool.Query(ctx, claimsSQL, topology)
	if err != nil {
		return nil, fmt.Errorf("list claims of %s: %w", topology, err)
	}
	return scanClaims(rows, topology, 0)
}

// claimsSQL lists a topology's claim rows (one row of NULLs when it has
// none, none when the topology is unknown).
var claimsSQL = `
	SELECT ` + claimCols("c") + ` FROM shardkeeper.topologies t
	  LEFT JOIN shardkeeper.claims c ON c.topology = t.topology WHERE t.topology = $1`

// scanClaims reads claimsSQL's rows, sorted by unit; expect is how many
// the caller expects (a snapshot's counts), to allocate once.
func scanClaims(rows pgx.Rows, topology string, expect int) ([]ClaimInfo, error) {
	defer rows.Close()
	found := false
	out := make([]ClaimInfo, 0, expect)
	var c claimScan // once: Scan overwrites every column of each row
	dest := c.dest()
	for rows.Next() {
		found = true
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list claims of %s: %w", topology, err)
		}
		if row := c.row(); row != nil {
			out = append(out, ClaimInfo{Unit: row.Unit, Owner: row.Owner, OwnerIncarnation: row.OwnerIncarnation, Epoch: row.Epoch,
				State: row.State, HandoverTo: row.HandoverTo, CheckpointSeq: row.CheckpointSeq})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list claims of %s: %w", topology, err)
	}
	if !found {
		return nil, fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	byUnit := func(a, b ClaimInfo) int { return strings.Compare(a.Unit, b.Unit) }
	if !slices.IsSortedFunc(out, byUnit) { // an index scan in byte order sent them sorted
		slices.SortFunc(out, byUnit)
	}
	return out, nil
}
