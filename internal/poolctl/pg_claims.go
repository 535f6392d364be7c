package poolctl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// claimReadSQL reads, with locks, everything decideClaim needs: the claim
// row FOR UPDATE; the claimer's and the owner's member rows and the active
// epoch FOR SHARE, so a rejoin of the owner, a fence of the claimer or an
// activation of the next epoch waits until this claim commits.
var claimReadSQL = `
	WITH t AS (SELECT shardkeeper.clock(topology) AS now, grace FROM shardkeeper.topologies WHERE topology = $1),
	c AS (SELECT * FROM shardkeeper.claims WHERE topology = $1 AND unit = $2 FOR UPDATE),
	me AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $3 FOR SHARE),
	ow AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = (SELECT owner FROM c) FOR SHARE),
	ae AS (SELECT * FROM shardkeeper.epochs WHERE topology = $1 AND state = 'active' FOR SHARE),
	pe AS (SELECT count(*) AS n FROM shardkeeper.epochs WHERE topology = $1 AND state = 'pending')
	SELECT t.now, t.grace, pe.n > 0, ae.epoch, ae.partitions, ae.shards,
		` + memberCols("me") + `, ` + claimCols("c") + `, ` + memberCols("ow") + `
	  FROM t CROSS JOIN pe LEFT JOIN ae ON true LEFT JOIN me ON true LEFT JOIN c ON true LEFT JOIN ow ON true`

// Claim implements Registry: one transaction that reads with locks,
// applies decideClaim, and writes with a compare-and-set on the epoch.
func (p *PG) Claim(ctx context.Context, m MemberRef, under int64, unit string) (Claim, error) {
	var out Claim
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var (
			in                claimInput
			epoch             *int64
			partitions, shard *int
			me, ow            memberScan
			c                 claimScan
		)
		err := tx.QueryRow(ctx, claimReadSQL, m.Topology, unit, m.Member).Scan(scanAll(
			[]any{&in.Now, &in.Grace, &in.Pending, &epoch, &partitions, &shard}, me.dest(), c.dest(), ow.dest())...)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("topology %q: %w", m.Topology, ErrUnknownTopology)
		} else if err != nil {
			return err
		}
		if epoch != nil {
			in.Active = &epochRow{Number: *epoch, Partitions: *partitions, Shards: *shard, State: EpochActive}
		}
		in.Claimer, in.Row, in.Owner = me.row(), c.row(), ow.row()
		d, err := decideClaim(m, under, unit, in)
		if err != nil {
			return err
		}
		var seq int64
		if in.Row != nil {
			seq = in.Row.CheckpointSeq
		}
		out = Claim{
			Token:   Token{Topology: m.Topology, Unit: unit, Member: m.Member, Epoch: d.NewEpoch},
			Adopted: d.Adopted, Settled: d.Settled, From: d.From, CheckpointSeq: seq, At: in.Now,
		}
		switch {
		case d.Noop:
			return nil
		case d.Insert:
			tag, err := tx.Exec(ctx, `
				INSERT INTO shardkeeper.claims (topology, unit, owner, owner_incarnation, fencing_epoch, state, updated_at)
				VALUES ($1, $2, $3, $4, 1, 'held', $5) ON CONFLICT DO NOTHING`,
				m.Topology, unit, m.Member, m.Incarnation, in.Now)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return ErrConflict
			}
		default:
			tag, err := tx.Exec(ctx, `
				UPDATE shardkeeper.claims
				   SET owner = $3, owner_incarnation = $4, fencing_epoch = $6, state = 'held', handover_to = NULL, updated_at = $7
				 WHERE topology = $1 AND unit = $2 AND fencing_epoch = $5`,
				m.Topology, unit, m.Member, m.Incarnation, in.Row.Epoch, d.NewEpoch, in.Now)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return ErrConflict
			}
		}
		return nil
	})
	if err != nil {
		return Claim{}, fmt.Errorf("claim %s for %s: %w", unit, m.Member, err)
	}
	return out, nil
}

// Handover implements Registry in one statement.
func (p *PG) Handover(ctx context.Context, t Token, to string) error {
	if to == t.Member {
		return fmt.Errorf("handover %s to its owner: %w", t.Unit, ErrInvalid)
	}
	return p.giveUp(ctx, t, "handover", `state = 'handover', handover_to = nullif($5, '')`, to)
}

// Release implements Registry in one statement. The row stays, free, with
// its epoch.
func (p *PG) Release(ctx context.Context, t Token) error {
	return p.giveUp(ctx, t, "release",
		`state = 'free', owner = NULL, owner_incarnation = NULL, handover_to = nullif($5, '')`, "")
}

// giveUp updates the claim with set (a constant) when the token's owner
// and epoch still hold it. set must use $5 (arg, text).
func (p *PG) giveUp(ctx context.Context, t Token, op, set string, arg string) error {
	var (
		now  *time.Time
		done *int
		c    claimScan
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		c AS (SELECT * FROM shardkeeper.claims WHERE topology = $1 AND unit = $2),
		upd AS (
			UPDATE shardkeeper.claims cl SET `+set+`, updated_at = t.now FROM t
			 WHERE cl.topology = $1 AND cl.unit = $2 AND cl.owner = $3 AND cl.fencing_epoch = $4 AND cl.state <> 'free'
			RETURNING 1 AS done)
		SELECT t.now, upd.done, `+claimCols("c")+` FROM t LEFT JOIN c ON true LEFT JOIN upd ON true`,
		t.Topology, t.Unit, t.Member, t.Epoch, arg).Scan(scanAll([]any{&now, &done}, c.dest())...)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, t.Unit, err)
	}
	if err := topologyErr(t.Topology, now); err != nil {
		return err
	}
	if done == nil {
		return fmt.Errorf("%s: %w", op, refusal(givesUp(t, c.row())))
	}
	return nil
}

// tokenReadSQL reads the claim row and its owner's member row.
var tokenReadSQL = `
	WITH t AS (SELECT shardkeeper.clock($1) AS now),
	c AS (SELECT * FROM shardkeeper.claims WHERE topology = $1 AND unit = $2),
	ow AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = (SELECT owner FROM c))`

// Checkpoint implements Registry: a guarded write in one statement.
func (p *PG) Checkpoint(ctx context.Context, t Token, seq int64) error {
	var (
		now  *time.Time
		done *int
		c    claimScan
		ow   memberScan
	)
	err := p.pool.QueryRow(ctx, tokenReadSQL+`,
		upd AS (
			UPDATE shardkeeper.claims cl SET checkpoint_seq = greatest(cl.checkpoint_seq, $5), updated_at = t.now
			  FROM t, shardkeeper.members m
			 WHERE cl.topology = $1 AND cl.unit = $2 AND cl.owner = $3 AND cl.fencing_epoch = $4 AND cl.state <> 'free'
			   AND m.topology = cl.topology AND m.member = cl.owner AND m.incarnation = cl.owner_incarnation
			   AND m.left_at IS NULL AND m.lease_expires_at > t.now
			RETURNING 1 AS done)
		SELECT t.now, upd.done, `+claimCols("c")+`, `+memberCols("ow")+`
		  FROM t LEFT JOIN c ON true LEFT JOIN ow ON true LEFT JOIN upd ON true`,
		t.Topology, t.Unit, t.Member, t.Epoch, seq).Scan(scanAll([]any{&now, &done}, c.dest(), ow.dest())...)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", t.Unit, err)
	}
	if err := topologyErr(t.Topology, now); err != nil {
		return err
	}
	if done == nil {
		return fmt.Errorf("checkpoint: %w", refusal(tokenValid(t, c.row(), ow.row(), *now)))
	}
	return nil
}

// CheckToken implements Registry in one statement, without locks: it says
// what was true when it ran. Sinks in this database use GuardedExec.
func (p *PG) CheckToken(ctx context.Context, t Token) error {
	return readToken(ctx, p.pool, t)
}

// Claims implements Registry.
func (p *PG) Claims(ctx context.Context, topology string) ([]ClaimInfo, error) {
	rows, err := p.pool.Query(ctx, `
		SELECT `+claimCols("c")+` FROM shardkeeper.topologies t
		  LEFT JOIN shardkeeper.claims c ON c.topology = t.topology WHERE t.topology = $1`, topology)
	if err != nil {
		return nil, fmt.Errorf("list claims of %s: %w", topology, err)
	}
	found := false
	out := []ClaimInfo{}
	for rows.Next() {
		found = true
		var c claimScan
		if err := rows.Scan(c.dest()...); err != nil {
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
	sort.Slice(out, func(i, j int) bool { return out[i].Unit < out[j].Unit })
	return out, nil
}
