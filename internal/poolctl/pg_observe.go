package poolctl

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Observe implements Registry: the reads in one read-only REPEATABLE READ
// transaction, so all see one snapshot, sent as one pipeline (one round
// trip; it takes no row locks, and holds nothing across a round trip).
// The replication settings come with it: the operator judges them every
// reconcile, and as a statement of their own they were one more round
// trip each time.
func (p *PG) Observe(ctx context.Context, topology string) (Observation, error) {
	var o Observation
	err := pipelineTx(ctx, p.pool, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", func(b *pgx.Batch) {
		b.Queue(snapshotSQL, topology)
		b.Queue(claimsSQL, topology)
		b.Queue(activitySQL, topology)
		b.Queue(durabilitySQL)
	}, func(br pgx.BatchResults) error {
		var err error
		if o.Snapshot, err = scanSnapshot(br.QueryRow(), topology); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		c := o.Snapshot.Counts
		if o.Claims, err = scanClaims(rows, topology, c.Held+c.Handover+c.Free); err != nil {
			return err
		}
		if rows, err = br.Query(); err != nil {
			return err
		}
		if o.Activity, err = scanActivity(rows, topology); err != nil {
			return err
		}
		d, err := scanDurability(br.QueryRow())
		if err != nil {
			return err
		}
		o.Durability = &d
		return nil
	})
	if err != nil {
		return Observation{}, fmt.Errorf("observe %s: %w", topology, err)
	}
	return o, nil
}
