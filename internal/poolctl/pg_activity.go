package poolctl

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ReportActivity implements Registry in one statement: the member's
// report replaces its previous one, as one row (member_activity), with
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
	err = p.pool.QueryRow(ctx, reportActivitySQL,
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
// it has none, none when the topology is unknown): each member's newer
// report of member_activity and, from workers of the previous release,
// unit_activity (see migration 0015).
const activitySQL = `
	WITH r AS (
	  SELECT m.topology, u.unit, m.member, m.incarnation, u.epoch, m.reported_at,
	         CASE WHEN u.since_fetch < 0 THEN NULL ELSE m.reported_at - u.since_fetch * interval '1 microsecond' END AS last_fetch_at,
	         CASE WHEN u.since_rows < 0 THEN NULL ELSE m.reported_at - u.since_rows * interval '1 microsecond' END AS last_rows_at,
	         CASE WHEN u.since_pull < 0 THEN NULL ELSE m.reported_at - u.since_pull * interval '1 microsecond' END AS pulling_since
	    FROM shardkeeper.member_activity m
	    CROSS JOIN LATERAL unnest(m.units, m.epochs, m.since_fetch, m.since_rows, m.since_pull) AS u(unit, epoch, since_fetch, since_rows, since_pull)
	   WHERE m.topology = $1
	     AND NOT EXISTS (SELECT 1 FROM shardkeeper.unit_activity o
	                      WHERE o.topology = m.topology AND o.member = m.member AND o.reported_at > m.reported_at)
	  UNION ALL
	  SELECT o.topology, o.unit, o.member, o.incarnation, o.epoch, o.reported_at, o.last_fetch_at, o.last_rows_at, o.pulling_since
	    FROM shardkeeper.unit_activity o
	   WHERE o.topology = $1
	     AND NOT EXISTS (SELECT 1 FROM shardkeeper.member_activity m
	                      WHERE m.topology = o.topology AND m.member = o.member AND m.reported_at >= o.reported_at))
	SELECT a.unit, a.member, a.incarnation, a.epoch, a.reported_at, a.last_fetch_at, a.last_rows_at, a.pulling_since
	  FROM shardkeeper.topologies t LEFT JOIN r a ON a.topology = t.topology
	 WHERE t.topology = $1
	 ORDER BY a.unit COLLATE "C", a.member COLLATE "C"`

// scanActivity reads activitySQL's rows.
func scanActivity(rows pgx.Rows, topology string) ([]ActivityReport, error) {
	defer rows.Close()
	found := false
	out := []ActivityReport{}
	// Declared once: Scan's destinations escape, and per row they were
	// allocated per row.
	var (
		unit, member                     pgtype.Text
		inc, epoch                       pgtype.Int8
		reported, fetch, recent, pulling pgtype.Timestamptz
	)
	for rows.Next() {
		found = true
		if err := rows.Scan(&unit, &member, &inc, &epoch, &reported, &fetch, &recent, &pulling); err != nil {
			return nil, fmt.Errorf("activity of %s: %w", topology, err)
		}
		if !unit.Valid {
			continue // the topology, without reports
		}
		// A NULL time is the zero time, as ActivityReport documents.
		r := ActivityReport{Unit: unit.String, Member: member.String, Incarnation: inc.Int64, Epoch: epoch.Int64,
			ReportedAt: reported.Time, LastFetch: fetch.Time, LastRows: recent.Time, PullingSince: pulling.Time}
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

// reportActivitySQL is ReportActivity's statement: one row per member,
// and the member's rows in unit_activity, written by its previous
// release, go.
var reportActivitySQL = `
	WITH t AS (SELECT shardkeeper.clock($1) AS now),
	me AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
	ok AS (SELECT 1 FROM me WHERE me.incarnation = $3 AND me.left_at IS NULL),
	old AS (DELETE FROM shardkeeper.unit_activity a
	         WHERE a.topology = $1 AND a.member = $2 AND EXISTS (SELECT 1 FROM ok)),
	up AS (INSERT INTO shardkeeper.member_activity AS a (topology, member, incarnation, reported_at, units, epochs, since_fetch, since_rows, since_pull)
	       SELECT $1, $2, $3, t.now, $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[]
	         FROM t, ok
	       ON CONFLICT (topology, member) DO UPDATE
	          SET incarnation = excluded.incarnation, reported_at = excluded.reported_at, units = excluded.units,
	              epochs = excluded.epochs, since_fetch = excluded.since_fetch, since_rows = excluded.since_rows,
	              since_pull = excluded.since_pull)
	SELECT t.now, EXISTS (SELECT 1 FROM ok), ` + memberCols("me") + ` FROM t LEFT JOIN me ON true`
