package poolctl

import (
	"context"
	"fmt"
)

// SetRetiring implements Registry in one statement: it deletes the units
// that left the set and adds the new ones.
func (p *PG) SetRetiring(ctx context.Context, topology string, units []string) error {
	units, err := retiringSet(units)
	if err != nil {
		return fmt.Errorf("set retiring units of %s: %w", topology, err)
	}
	var known bool
	err = p.opQueryRow(ctx, topology, `
		WITH t AS (SELECT topology FROM shardkeeper.topologies WHERE topology = $1),
		del AS (DELETE FROM shardkeeper.retiring_units r WHERE r.topology IN (SELECT topology FROM t) AND r.unit <> ALL($2::text[])),
		ins AS (INSERT INTO shardkeeper.retiring_units (topology, unit)
		        SELECT t.topology, u FROM t, unnest($2::text[]) AS u ON CONFLICT DO NOTHING)
		SELECT EXISTS (SELECT 1 FROM t)`, []any{topology, units}, &known)
	if err != nil {
		return fmt.Errorf("set retiring units of %s: %w", topology, err)
	}
	if !known {
		return fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return nil
}

// retiringSet validates a retiring set and returns it sorted, without
// repeats.
func retiringSet(units []string) ([]string, error) {
	for _, u := range units {
		if _, _, err := parseUnit(u); err != nil {
			return nil, err
		}
	}
	// Never nil: pgx sends a nil slice as NULL, and "<> ALL (NULL)" keeps
	// every row.
	return append([]string{}, distinctUnits(units)...), nil
}
