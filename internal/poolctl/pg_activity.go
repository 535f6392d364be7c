package poolctl

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReportActivity implements Registry in one statement: it deletes the
// member's rows for units no longer reported and upserts the others, with
// times on the registry's clock. It needs the member's current incarnation
// but not a live lease: a member that lost its lease still tells the truth
// about what it pulled.
func (p *PG) ReportActivity(ctx context.Context, m MemberRef, units []UnitActivity) error {
	rep, err := activityRows(units)
	if err != nil {
		return fmt.Errorf("report activity of %s: %w", m.Member, err)
	}
	var (
		now  *time.Time
		done *bool
		cur  memberScan
	)
	err = p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		me AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
		ok AS (SELECT 1 FROM me WHERE me.incarnation = $3 AND me.left_at IS NULL),
		w AS (SELECT * FROM unnest($4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[]) AS w(unit, epoch, since_fetch, since_rows, since_pull)),
		del AS (DELETE FROM shardkeeper.unit_activity a
		         WHERE a.topology = $1 AND a.member = $2 AND EXISTS (SELECT 1 FROM ok) AND a.unit <> ALL($4::text[])),
		up AS (INSERT INTO shardkeeper.unit_activity AS a (topology, unit, member, incarnation, epoch, reported_at, last_fetch_at, last_rows_at, pulling_since)
		       SELECT $1, w.unit, $2, $3, w.epoch, t.now,
		              CASE WHEN w.since_fetch < 0 THEN NULL ELSE t.now - w.since_fetch * interval '1 microsecond' END,
		              CASE WHEN w.since_rows < 0 THEN NULL ELSE t.now - w.since_rows * interval '1 microsecond' END,
		              CASE WHEN w.since_pull < 0 THEN NULL ELSE t.now - w.since_pull * interval '1 microsecond' END
		         FROM w, t, ok
		       ON CONFLICT (topology, member, unit) DO UPDATE
		          SET incarnation = excluded.incarnation, epoch = excluded.epoch, reported_at = excluded.reported_at,
		              last_fetch_at = excluded.last_fetch_at, last_rows_at = excluded.last_rows_at,
		              pulling_since = excluded.pulling_since)
		SELECT t.now, EXISTS (SELECT 1 FROM ok), `+memberCols("me")+` FROM t LEFT JOIN me ON true`,
		m.Topology, m.Member, m.Incarnation, rep.units, rep.epochs, rep.sinceFetch, rep.sinceRows, rep.sincePull).Scan(
		scanAll([]any{&now, &done}, cur.dest())...)
	if err != nil {
		return fmt.Errorf("report activity of %s: %w", m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return err
	}
	if !*done {
		return fmt.Errorf("report activity: %w", refusal(checkIncarnation(m, cur.row())))
	}
	return nil
}

// Activity implements Registry in one statement.
func (p *PG) Activity(ctx context.Context, topology string) ([]ActivityReport, error) {
	rows, err := p.pool.Query(ctx, activitySQL, topology)
	if err != nil {
		return nil, fmt.Errorf("activity of %s: %w", topology, err)
	}
	return scanActivity(rows, topology)
}

// activitySQL lists a topology's activity reports (one row of NULLs when
// it has none, none when the topology is unknown).
const activitySQL = `
	SELECT a.unit, a.member, a.incarnation, a.epoch, a.reported_at, a.last_fetch_at, a.last_rows_at, a.pulling_since
	  FROM shardkeeper.topologies t LEFT JOIN shardkeeper.unit_activity a ON a.topology = t.topology
	 WHERE t.topology = $1
	 ORDER BY a.unit COLLATE "C", a.member COLLATE "C"`

// scanActivity reads activitySQL's rows.
func scanActivity(rows pgx.Rows, topology string) ([]ActivityReport, error) {
	defer rows.Close()
	found := false
	out := []ActivityReport{}
	for rows.Next() {
		found = true
		var (
			unit, member            *string
			inc, epoch              *int64
			reported, fetch, recent *time.Time
			pulling                 *time.Time
		)
		if err := rows.Scan(&unit, &member, &inc, &epoch, &reported, &fetch, &recent, &pulling); err != nil {
			return nil, fmt.Errorf("activity of %s: %w", topology, err)
		}
		if unit == nil {
			continue // the topology, without reports
		}
		r := ActivityReport{Unit: *unit, Member: *member, Incarnation: *inc, Epoch: *epoch, ReportedAt: *reported}
		if fetch != nil {
			r.LastFetch = *fetch
		}
		if recent != nil {
			r.LastRows = *recent
		}
		if pulling != nil {
			r.PullingSince = *pulling
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("activity of %s: %w", topology, err)
	}
	if !found {
		return nil, fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return out, nil
}
