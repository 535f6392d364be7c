package controllers

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Whether units flow is judged from evidence, never assumed (P7: a
// dashboard must never show a reassuring 0 that nothing measured). Workers
// report, every renew interval, each unit they hold with when they last
// completed a pull and last received a row (Registry.ReportActivity, on
// the registry's clock). The census reads each unit consumer's pending
// rows from the JSZ replies it collects anyway. From these:
//
//   - a unit is multiply owned when two fresh reports (made within
//     flowWindow) under different claim tokens (member, incarnation and
//     claim epoch) have pull windows that overlap by more than
//     overlapSlack: two processes pulling one unit at the same time,
//     whatever the claims say. A report's window runs from when its
//     puller started pulling under the token to the report. In a
//     handover the old owner's puller stops before its release commits
//     and the new owner's starts after its claim commits, so the two
//     windows are sequential however close together they are (the old
//     rule, any two pulls within flowWindow, counted every handover of a
//     pod roll);
//   - an owned unit is stalled when its owner's report for it is missing
//     or stale, when the owner reports freshly that its pulls made no
//     progress (none completed, no row of one handled: a slow handler
//     is progress) for stallBound (NATS unreachable, a consumer gone, a
//     handler stuck on a row: a worker that cannot pull still renews
//     its lease and reports), or
//     when a census saw rows pending in its consumer and the
//     owner's latest report, made at least stallBound after that census,
//     says it received no row since the census. The census judged is the
//     latest one at least stallBound older than the report, so censuses
//     more frequent than the bound still catch a stall.
//
// "Owned" in the progress line and Ready means owned and flowing.

// flowWindow is how recent a report, and a pull it reports, must be to
// count: two renew intervals, so one late report is not yet a stall.
func flowWindow(p poolctl.Params) time.Duration { return 2 * renewInterval(p) }

// stallBound is how long an owner may receive no row while rows wait in
// its unit's consumer before the unit counts as stalled: three renew
// intervals. A worker that pulls receives waiting rows within one fetch;
// its report lags by at most one renew interval; the rest is margin for a
// slow batch.
func stallBound(p poolctl.Params) time.Duration { return 3 * renewInterval(p) }

// clockSlack absorbs the error of putting the census's time (the
// operator's clock) on the registry's clock, which is about one round trip.
const clockSlack = time.Second

// overlapSlack is how much two pull windows under different tokens may
// seem to overlap although they were sequential. A window's times are a
// member's ages put on the registry's clock when its report ran, which is
// later than when the member measured them by at most the query bound
// (the worker gives its report no longer), so each window lands late by
// between 0 and the query bound: two sequential windows can seem to
// overlap by up to the query bound. clockSlack on top covers a statement
// that started just after the bound. A real double pull shorter than this
// is not counted; one that lasts is, at every report.
func overlapSlack(p poolctl.Params) time.Duration {
	qb := p.QueryBound
	if qb <= 0 {
		qb = poolctl.DefaultParams().QueryBound
	}
	return qb + clockSlack
}

func renewInterval(p poolctl.Params) time.Duration {
	if p.RenewInterval > 0 {
		return p.RenewInterval
	}
	return poolctl.DefaultParams().RenewInterval
}

// pendingRows is what one census counted in the active epoch's unit
// consumers.
type pendingRows struct {
	// at is when the census's first reply came, on the registry's clock.
	at time.Time
	// units maps a unit to the rows pending (never delivered) in its
	// consumer. A unit whose consumer the census did not find is absent.
	units map[string]uint64
}

// unitFlow is what the evidence says about the units.
type unitFlow struct {
	// multiplyOwned counts units pulled under two or more claim tokens at
	// once; multiplyOwnedUnits names them, in the reports' unit order.
	multiplyOwned      int
	multiplyOwnedUnits []string
	// stalled lists the owned units of the active epoch that do not flow,
	// in unit order.
	stalled []stalledUnit
}

// stalledUnit is one owned unit that does not flow, and why.
type stalledUnit struct {
	unit, owner, why string
}

func (s stalledUnit) String() string { return fmt.Sprintf("%s (%s: %s)", s.unit, s.owner, s.why) }

// assessFlow judges the units from the registry's snapshot and claims, the
// members' activity reports and the recent censuses' pending rows, oldest
// first (none when no census counted them). It is pure; now is the
// snapshot's registry clock.
func assessFlow(snap *poolctl.Snapshot, claims map[string]poolctl.ClaimInfo, reports []poolctl.ActivityReport, pending []pendingRows) unitFlow {
	var f unitFlow
	if snap == nil {
		return f
	}
	now, window, bound := snap.Now, flowWindow(snap.Params), stallBound(snap.Params)
	fresh := func(r *poolctl.ActivityReport) bool { return now.Sub(r.ReportedAt) <= window }
	f.multiplyOwnedUnits = multiplyPulled(reports, fresh, overlapSlack(snap.Params))
	f.multiplyOwned = len(f.multiplyOwnedUnits)
	if snap.Active == nil {
		return f
	}
	latest := latestReports(snap, reports)
	owners := ownedBy(snap, claims)
	// Owners handing a unit over stopped pulling it on purpose.
	handingOver := func(unit, owner string) bool {
		m := snap.Member(owner)
		return claims[unit].State == poolctl.StateHandover || (m != nil && m.Draining)
	}
	for _, u := range epochTopology(snap.Active).Units() {
		unit := u.String()
		owner := owners[unit]
		if owner == "" {
			continue
		}
		r, ok := latest[memberUnit{unit: unit, member: owner}]
		var why string
		switch {
		case !ok:
			why = "no activity report"
		case !fresh(r):
			why = fmt.Sprintf("last activity report %s ago", now.Sub(r.ReportedAt).Round(time.Second))
		case !r.LastFetch.IsZero() && r.ReportedAt.Sub(r.LastFetch) > bound && !handingOver(unit, owner):
			// A fresh report of an old pull: the owner is alive but
			// cannot pull (every NATS server down, its consumer gone).
			// A unit never pulled yet is left to the other checks: a new
			// owner reports before its first pull completes.
			why = fmt.Sprintf("no pull progress for %s", r.ReportedAt.Sub(r.LastFetch).Round(time.Second))
		default:
			c := censusBefore(pending, r.ReportedAt.Add(-bound))
			if n := pendingAt(c, unit); n > 0 && (r.LastRows.IsZero() || r.LastRows.Before(c.at.Add(-clockSlack))) {
				why = fmt.Sprintf("%d rows pending at the census %s ago, none received since", n, now.Sub(c.at).Round(time.Second))
			}
		}
		if why != "" {
			f.stalled = append(f.stalled, stalledUnit{unit: unit, owner: owner, why: why})
		}
	}
	return f
}

// memberUnit keys reports by unit and member. Struct keys rather than
// formatted strings: at 4096 units the formatting was most of what a
// reconcile allocated.
type memberUnit struct{ unit, member string }

// pullToken is the claim token a report's pulls were made under, with
// the process: two processes of one member name are two pullers.
type pullToken struct {
	member      string
	incarnation int64
	epoch       int64
}

// pullWindow is when r's puller pulled its unit under its token: from its
// start to the report. A report that does not say when its puller started
// (an older worker) is taken from its last completed pull, and one that
// never completed a pull is the instant of the report: both only narrow
// the window, so they can miss an overlap but never invent one.
func pullWindow(r *poolctl.ActivityReport) (from, to time.Time) {
	to = r.ReportedAt
	switch {
	case !r.PullingSince.IsZero():
		from = r.PullingSince
	case !r.LastFetch.IsZero():
		from = r.LastFetch
	default:
		from = to
	}
	if from.After(to) {
		from = to
	}
	return from, to
}

// multiplyPulled lists units that counted reports under two or more claim
// tokens show pulled at the same time: two windows overlapping by more
// than slack. Sequential windows (a handover, a crash and an adoption, a
// restart under a new incarnation) are never counted.
func multiplyPulled(reports []poolctl.ActivityReport, counted func(*poolctl.ActivityReport) bool, slack time.Duration) []string {
	type window struct {
		unit     string
		token    pullToken
		from, to time.Time
	}
	// One slice, sorted by unit, rather than a map of slices: at 4096
	// units the per-unit allocations would dominate the reconcile.
	ws := make([]window, 0, len(reports))
	for i := range reports {
		r := &reports[i]
		if counted(r) {
			from, to := pullWindow(r)
			ws = append(ws, window{r.Unit, pullToken{r.Member, r.Incarnation, r.Epoch}, from, to})
		}
	}
	slices.SortStableFunc(ws, func(a, b window) int { return strings.Compare(a.unit, b.unit) })
	overlap := func(a, b window) bool {
		start, end := a.from, a.to
		if b.from.After(start) {
			start = b.from
		}
		if b.to.Before(end) {
			end = b.to
		}
		return a.token != b.token && end.Sub(start) > slack
	}
	var units []string
	for lo := 0; lo < len(ws); {
		hi := lo + 1
		for hi < len(ws) && ws[hi].unit == ws[lo].unit {
			hi++
		}
	pairs:
		for i := lo; i < hi; i++ {
			for j := i + 1; j < hi; j++ {
				if overlap(ws[i], ws[j]) {
					units = append(units, ws[lo].unit)
					break pairs
				}
			}
		}
		lo = hi
	}
	return units
}

// latestReports is, for each unit and member, the latest report of the
// member's current incarnation.
func latestReports(snap *poolctl.Snapshot, reports []poolctl.ActivityReport) map[memberUnit]*poolctl.ActivityReport {
	current := make(map[string]int64, len(snap.Members))
	for _, m := range snap.Members {
		current[m.Name] = m.Incarnation
	}
	latest := make(map[memberUnit]*poolctl.ActivityReport, len(reports))
	for i := range reports {
		r := &reports[i]
		if inc, ok := current[r.Member]; !ok || inc != r.Incarnation {
			continue
		}
		k := memberUnit{r.Unit, r.Member}
		if old, ok := latest[k]; !ok || r.ReportedAt.After(old.ReportedAt) {
			latest[k] = r
		}
	}
	return latest
}

// pendingAt is the rows census c counted pending in unit's consumer (0
// without a census).
func pendingAt(c *pendingRows, unit string) uint64 {
	if c == nil {
		return 0
	}
	return c.units[unit]
}

// censusBefore is the latest census taken at or before t, or nil.
func censusBefore(pending []pendingRows, t time.Time) *pendingRows {
	var found *pendingRows
	for i := range pending {
		if !pending[i].at.After(t) {
			found = &pending[i]
		}
	}
	return found
}

// keepPending appends p to the recent censuses and drops those no stall
// judgement can need any more: every census older than the newest one
// taken at least bound before p.
func keepPending(recent []pendingRows, p pendingRows, bound time.Duration) []pendingRows {
	recent = append(recent, p)
	keepFrom := 0
	for i := range recent {
		if !recent[i].at.After(p.at.Add(-bound)) {
			keepFrom = i
		}
	}
	return append([]pendingRows(nil), recent[keepFrom:]...)
}
