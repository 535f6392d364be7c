package poolctl

import (
	"context"
	"testing"
	"time"
)

// The issue's "status must not show a reassuring 0 when nothing was
// measured": members report what they pulled, on the registry's clock, and
// a report replaces the member's previous one. checks P7
func TestActivityReportReplacesTheMembersPrevious(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		must(t, r.ReportActivity(ctx, a.MemberRef, []UnitActivity{
			{Unit: "0.0", Epoch: 1, SinceFetch: 2 * time.Second, SinceRows: 5 * time.Second, SincePullStart: 90*time.Second + 250*time.Microsecond},
			{Unit: "0.1", Epoch: 3, SinceFetch: time.Second, SinceRows: -1, SincePullStart: -1},
		}))
		must(t, r.ReportActivity(ctx, b.MemberRef, []UnitActivity{{Unit: "0.1", Epoch: 4, SinceFetch: -1, SinceRows: -1, SincePullStart: 0}}))
		got, err := r.Activity(ctx, topo)
		must(t, err)
		if len(got) != 3 || got[0].Unit != "0.0" || got[1].Member != "a" || got[2].Member != "b" {
			t.Fatalf("activity %+v", got)
		}
		r0 := got[0]
		if r0.Incarnation != a.Incarnation || r0.Epoch != 1 || r0.ReportedAt.Sub(r0.LastFetch) != 2*time.Second ||
			r0.ReportedAt.Sub(r0.LastRows) != 5*time.Second {
			t.Fatalf("a's report on 0.0: %+v", r0)
		}
		if !got[1].LastRows.IsZero() || !got[2].LastFetch.IsZero() {
			t.Fatalf("never is reported as a time: %+v", got[1:])
		}
		// The pull window (issue 21): since when the member pulls under the
		// token, on the registry's clock, to the microsecond; unknown is
		// zero, and a puller that started at the report opens it there.
		if w := r0.ReportedAt.Sub(r0.PullingSince); w != 90*time.Second+250*time.Microsecond {
			t.Fatalf("a's window on 0.0 opened %v before its report, want 1m30.00025s: %+v", w, r0)
		}
		if !got[1].PullingSince.IsZero() || !got[2].PullingSince.Equal(got[2].ReportedAt) {
			t.Fatalf("an unknown start is zero and a start at the report is the report: %+v", got[1:])
		}
		snap, err := r.Snapshot(ctx, topo)
		must(t, err)
		if d := snap.Now.Sub(r0.ReportedAt); d < 0 || d > 5*time.Second {
			t.Fatalf("reported at %v, registry clock %v", r0.ReportedAt, snap.Now)
		}

		// a's next report replaces its rows; b's stay. It needs a's current
		// incarnation, not a live lease.
		must(t, r.ShiftClock(ctx, topo, 2*time.Minute))
		must(t, r.ReportActivity(ctx, a.MemberRef, []UnitActivity{{Unit: "0.2", Epoch: 1, SinceFetch: 0, SinceRows: 0}}))
		got, err = r.Activity(ctx, topo)
		must(t, err)
		if len(got) != 2 || got[0].Unit != "0.1" || got[0].Member != "b" || got[1].Unit != "0.2" || got[1].Member != "a" {
			t.Fatalf("after a's second report: %+v", got)
		}
		a2, _ := r.Join(ctx, topo, "a")
		wantErr(t, "report by a superseded incarnation", r.ReportActivity(ctx, a.MemberRef, nil), ErrStaleIncarnation)
		wantErr(t, "a unit reported twice", r.ReportActivity(ctx, a2.MemberRef, []UnitActivity{{Unit: "0.1"}, {Unit: "0.1"}}), ErrInvalid)
		wantErr(t, "a bad unit", r.ReportActivity(ctx, a2.MemberRef, []UnitActivity{{Unit: "zero"}}), ErrInvalid)
		must(t, r.ReportActivity(ctx, a2.MemberRef, nil))
		got, err = r.Activity(ctx, topo)
		must(t, err)
		if len(got) != 1 || got[0].Member != "b" {
			t.Fatalf("after a's empty report: %+v", got)
		}
		_, err = r.Activity(ctx, "ns/none")
		wantErr(t, "activity of an unknown topology", err, ErrUnknownTopology)
	})
}

// A worker of the previous release reports into unit_activity, one row
// per unit (migration 0015 keeps the table until workers are rolled): its
// report is read like any other, the newer of a member's two reports
// wins, and the member's first report in the new form removes the old
// rows.
func TestActivityOfAWorkerOfThePreviousReleaseIsReadUntilItReportsAgain(t *testing.T) {
	ctx := context.Background()
	pg, _ := newPG(t)
	topo := newTopology(t, pg, testParams, 1, 4)
	a, err := pg.Join(ctx, topo, "a")
	must(t, err)
	b, err := pg.Join(ctx, topo, "b")
	must(t, err)
	oldReport := func(m MemberRef, unit string) {
		t.Helper()
		_, err := pg.pool.Exec(ctx, `
			INSERT INTO shardkeeper.unit_activity (topology, unit, member, incarnation, epoch, reported_at, last_fetch_at, last_rows_at, pulling_since)
			SELECT $1, $2, $3, $4, 1, now, now - interval '2 seconds', NULL, now - interval '1 minute'
			  FROM (SELECT shardkeeper.clock($1) AS now) t`, m.Topology, unit, m.Member, m.Incarnation)
		must(t, err)
	}
	oldReport(a.MemberRef, "0.0")
	oldReport(a.MemberRef, "0.1")
	must(t, pg.ReportActivity(ctx, b.MemberRef, []UnitActivity{{Unit: "0.2", Epoch: 1, SinceFetch: 0, SinceRows: -1, SincePullStart: 0}}))
	got, err := pg.Activity(ctx, topo)
	must(t, err)
	if len(got) != 3 || got[0].Member != "a" || got[1].Member != "a" || got[2].Member != "b" {
		t.Fatalf("both tables' reports: %+v", got)
	}
	if r := got[0]; r.ReportedAt.Sub(r.LastFetch) != 2*time.Second || !r.LastRows.IsZero() || r.ReportedAt.Sub(r.PullingSince) != time.Minute {
		t.Fatalf("an old row is read as written: %+v", r)
	}

	// An old row newer than the member's report in the new form wins (a
	// worker rolled back), and the new form wins over older rows.
	must(t, pg.ReportActivity(ctx, a.MemberRef, []UnitActivity{{Unit: "0.3", Epoch: 1, SinceFetch: 0, SinceRows: 0, SincePullStart: 0}}))
	must(t, pg.ShiftClock(ctx, topo, time.Minute))
	oldReport(a.MemberRef, "0.0")
	got, err = pg.Activity(ctx, topo)
	must(t, err)
	if len(got) != 2 || got[0].Unit != "0.0" || got[0].Member != "a" || got[1].Member != "b" {
		t.Fatalf("a's newer old-form report wins: %+v", got)
	}
	must(t, pg.ReportActivity(ctx, a.MemberRef, []UnitActivity{{Unit: "0.3", Epoch: 1, SinceFetch: 0, SinceRows: 0, SincePullStart: 0}}))
	var left int
	must(t, pg.pool.QueryRow(ctx, "SELECT count(*) FROM shardkeeper.unit_activity WHERE topology = $1", topo).Scan(&left))
	got, err = pg.Activity(ctx, topo)
	must(t, err)
	if left != 0 || len(got) != 2 || got[0].Unit != "0.2" || got[1].Unit != "0.3" || got[1].Member != "a" {
		t.Fatalf("a's report in the new form replaced its old rows (%d left): %+v", left, got)
	}
}
