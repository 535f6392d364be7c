package poolctl

import (
	"context"
	"fmt"
	"time"
)

// Handover and release give a unit up. They need only the token's owner
// and epoch to match (givesUp), since giving a unit up can only narrow who
// may deliver it, and they clear the recorded claim decision.

// Handover implements Registry in one statement.
func (p *PG) Handover(ctx context.Context, t Token, to string) error {
	if to == t.Member {
		return fmt.Errorf("handover %s to its owner: %w", t.Unit, ErrInvalid)
	}
	var (
		now  *time.Time
		done *int
		c    claimScan
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		c AS (SELECT * FROM shardkeeper.claims WHERE topology = $1 AND unit = $2),
		upd AS (
			UPDATE shardkeeper.claims cl
			   SET state = 'handover', handover_to = nullif($5, ''), adopted_from = NULL, rehomed = false,
			       last_op = 'handover', under_epoch = NULL, updated_at = t.now
			  FROM t
			 WHERE cl.topology = $1 AND cl.unit = $2 AND cl.owner = $3 AND cl.fencing_epoch = $4 AND cl.state <> 'free'
			RETURNING 1 AS done)
		SELECT t.now, upd.done, `+claimCols("c")+` FROM t LEFT JOIN c ON true LEFT JOIN upd ON true`,
		t.Topology, t.Unit, t.Member, t.Epoch, to).Scan(scanAll([]any{&now, &done}, c.dest())...)
	if err != nil {
		return fmt.Errorf("handover %s: %w", t.Unit, err)
	}
	if err := topologyErr(t.Topology, now); err != nil {
		return err
	}
	if done == nil {
		return fmt.Errorf("handover: %w", refusal(givesUp(t, c.row())))
	}
	return nil
}

// Release implements Registry as a batch of one token.
func (p *PG) Release(ctx context.Context, t Token) error {
	return releaseOne(ctx, p, t)
}

// releaseOne is Release through ReleaseMany, for both backends.
func releaseOne(ctx context.Context, r Registry, t Token) error {
	errs, err := r.ReleaseMany(ctx, []Token{t})
	if err != nil {
		return err
	}
	return errs[0]
}

// releaseSQL releases every token that still holds its unit, in one
// statement. It locks the rows in unit order first (as claim batches do,
// so the two cannot deadlock), and returns, per token in the caller's
// order, whether its unit was released and the row as the statement's
// snapshot saw it before, to explain a refusal. The row stays, free, with
// its epoch (P6).
var releaseSQL = `
	WITH w AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
	             WITH ORDINALITY AS w(topology, unit, member, epoch, i)),
	lk AS MATERIALIZED (
		SELECT cl.topology, cl.unit FROM shardkeeper.claims cl
		 WHERE (cl.topology, cl.unit, cl.owner, cl.fencing_epoch) IN (SELECT topology, unit, member, epoch FROM w)
		   AND cl.state <> 'free'
		 ORDER BY cl.topology, cl.unit FOR UPDATE),
	upd AS (
		UPDATE shardkeeper.claims cl
		   SET state = 'free', owner = NULL, owner_incarnation = NULL, handover_to = NULL, adopted_from = NULL,
		       rehomed = false, last_op = 'release', under_epoch = NULL, updated_at = shardkeeper.clock(cl.topology)
		  FROM lk WHERE cl.topology = lk.topology AND cl.unit = lk.unit
		RETURNING cl.topology, cl.unit)
	SELECT shardkeeper.clock(w.topology), upd.unit IS NOT NULL, ` + claimCols("c") + `
	  FROM w LEFT JOIN upd ON upd.topology = w.topology AND upd.unit = w.unit
	         LEFT JOIN shardkeeper.claims c ON c.topology = w.topology AND c.unit = w.unit
	 ORDER BY w.i`

// ReleaseMany implements Registry in one statement.
func (p *PG) ReleaseMany(ctx context.Context, tokens []Token) ([]error, error) {
	if len(tokens) == 0 {
		return []error{}, nil
	}
	var topos, units, members []string
	var epochs []int64
	for _, t := range tokens {
		topos, units, members, epochs = append(topos, t.Topology), append(units, t.Unit), append(members, t.Member), append(epochs, t.Epoch)
	}
	rows, err := p.pool.Query(ctx, releaseSQL, topos, units, members, epochs)
	if err != nil {
		return nil, fmt.Errorf("release %s: %w", tokenLabel(tokens), err)
	}
	defer rows.Close()
	errs := make([]error, 0, len(tokens))
	for rows.Next() {
		var (
			now      *time.Time
			released bool
			c        claimScan
		)
		if err := rows.Scan(scanAll([]any{&now, &released}, c.dest())...); err != nil {
			return nil, fmt.Errorf("release %s: %w", tokenLabel(tokens), err)
		}
		t := tokens[len(errs)]
		errs = append(errs, releaseOutcome(t, now != nil, released, c.row()))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("release %s: %w", tokenLabel(tokens), err)
	}
	return errs, nil
}

// releaseOutcome is one token's result: the rule's verdict on the row as
// it was before the batch, or a conflict when the row changed before the
// write.
func releaseOutcome(t Token, known, released bool, before *claimRow) error {
	if !known {
		return fmt.Errorf("release %s: topology %q: %w", t.Unit, t.Topology, ErrUnknownTopology)
	}
	if err := givesUp(t, before); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if !released {
		return fmt.Errorf("release %s: %w", t.Unit, ErrConflict)
	}
	return nil
}

// tokenLabel names a batch of tokens in errors.
func tokenLabel(tokens []Token) string {
	if len(tokens) == 1 {
		return tokens[0].Unit
	}
	return fmt.Sprintf("%d tokens", len(tokens))
}
