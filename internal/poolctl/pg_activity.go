package poolctl

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
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

// activitySQL lists a topology's activity reports a row per member, the
// units in arrays as member_activity keeps them (unnested and sorted on
// the server, they cost the operator's read more than they saved), taking
// each member's newer report: member_activity's or, from a worker of the
// previous release, unit_activity's, one unit a row in the same shape
// (migration 0015). One row of NULLs when the topology has no report, none
// when it is unknown.
const activitySQL = `
	WITH r AS (
	  SELECT m.topology, m.member, m.incarnation, m.reported_at, m.units, m.epochs, m.since_fetch, m.since_rows, m.since_pull
	    FROM shardkeeper.member_activity m
	   WHERE m.topology = $1
	     AND NOT EXISTS (SELECT 1 FROM shardkeeper.unit_activity o
	                      WHERE o.topology = m.topology AND o.member = m.member AND o.reported_at > m.reported_at)
	  UNION ALL
	  SELECT o.topology, o.member, o.incarnation, o.reported_at, ARRAY[o.unit], ARRAY[o.epoch],
	         ARRAY[coalesce((extract(epoch FROM o.reported_at - o.last_fetch_at) * 1000000)::bigint, -1)],
	         ARRAY[coalesce((extract(epoch FROM o.reported_at - o.last_rows_at) * 1000000)::bigint, -1)],
	         ARRAY[coalesce((extract(epoch FROM o.reported_at - o.pulling_since) * 1000000)::bigint, -1)]
	    FROM shardkeeper.unit_activity o
	   WHERE o.topology = $1
	     AND NOT EXISTS (SELECT 1 FROM shardkeeper.member_activity m
	                      WHERE m.topology = o.topology AND m.member = o.member AND m.reported_at >= o.reported_at))
	SELECT a.member, a.incarnation, a.reported_at, a.units, a.epochs, a.since_fetch, a.since_rows, a.since_pull
	  FROM shardkeeper.topologies t LEFT JOIN r a ON a.topology = t.topology
	 WHERE t.topology = $1`

// scanActivity reads activitySQL's rows: one report per unit and member,
// sorted by unit, then member.
func scanActivity(rows pgx.Rows, topology string) ([]ActivityReport, error) {
	defer rows.Close()
	found := false
	var (
		reports []memberReport
		total   int
	)
	for rows.Next() {
		found = true
		var r memberReport
		if err := rows.Scan(&r.member, &r.inc, &r.reported, &r.units, &r.epochs, &r.fetch, &r.got, &r.pull); err != nil {
			return nil, fmt.Errorf("activity of %s: %w", topology, err)
		}
		if !r.member.Valid {
			continue // the topology, without reports
		}
		reports = append(reports, r)
		total += len(r.units)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("activity of %s: %w", topology, err)
	}
	if !found {
		return nil, fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return expandActivity(reports, total), nil
}

// memberReport is one row of activitySQL: a member's report, its units
// in arrays.
type memberReport struct {
	member                   pgtype.Text
	inc                      pgtype.Int8
	reported                 pgtype.Timestamptz
	units                    []string
	epochs, fetch, got, pull []int64
}

// expandActivity is one ActivityReport per unit of each member's report,
// sorted by unit, then member, in byte order (as the SQL's COLLATE "C"
// sorted them before). It sorts small keys and builds the reports once,
// in order: appending 4096 reports of 144 bytes one by one and then
// sorting them, each moved many times, was most of what Observe cost its
// caller.
func expandActivity(reports []memberReport, total int) []ActivityReport {
	type key struct {
		unit   string
		report int32
		index  int32
	}
	keys := make([]key, 0, total)
	for r, rep := range reports {
		for i, u := range rep.units {
			keys = append(keys, key{unit: u, report: int32(r), index: int32(i)})
		}
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(strings.Compare(a.unit, b.unit), strings.Compare(reports[a.report].member.String, reports[b.report].member.String))
	})
	out := make([]ActivityReport, len(keys))
	for n, k := range keys {
		rep, i := &reports[k.report], k.index
		at := rep.reported.Time
		out[n] = ActivityReport{Unit: k.unit, Member: rep.member.String, Incarnation: rep.inc.Int64, Epoch: rep.epochs[i],
			ReportedAt: at, LastFetch: before(at, rep.fetch[i]), LastRows: before(at, rep.got[i]), PullingSince: before(at, rep.pull[i])}
	}
	return out
}

// before is the time micros microseconds before at; never (negative) is
// the zero time, as ActivityReport documents.
func before(at time.Time, micros int64) time.Time {
	if micros < 0 {
		return time.Time{}
	}
	return at.Add(-time.Duration(micros) * time.Microsecond)
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
