package poolctl

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Observe implements Registry: the three reads in one read-only
// REPEATABLE READ transaction, so all see one snapshot, sent as one
// pipeline (one round trip; it takes no row locks, and holds nothing
// across a round trip).
func (p *PG) Observe(ctx context.Context, topology string) (Observation, error) {
	var o Observation
	err := pipelineTx(ctx, p.pool, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", func(b *pgx.Batch) {
		b.Queue(snapshotSQL, topology)
		b.Queue(claimsSQL, topology)
		b.Queue(activitySQL, topology)
	}, func(br pgx.BatchResults) error {
		var err error
		if o.Snapshot, err = scanSnapshot(br.QueryRow(), topology); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		if o.Claims, err = scanClaims(rows, topology); err != nil {
			return err
		}
		if rows, err = br.Query(); err != nil {
			return err
		}
		o.Activity, err = scanActivity(rows, topology)
		return err
	})
	if err != nil {
		return Observation{}, fmt.Errorf("observe %s: %w", topology, err)
	}
	return o, nil
}
