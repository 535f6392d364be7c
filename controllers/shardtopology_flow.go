package controllers

import (
	"fmt"
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
//   - a unit is multiply owned when two or more members have a fresh
//     report (made within flowWindow) saying they pulled it within
//     flowWindow: two processes pulling one unit, whatever the claims say;
//   - an owned unit is stalled when its owner's report for it is missing
//     or stale, when the owner reports freshly that its last completed
//     pull is older than stallBound (NATS unreachable, a consumer gone: a
//     worker that cannot pull still renews its lease and reports), or
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
	// multiplyOwned counts units pulled by two or more members at once;
	// multiplyOwnedUnits names them, in the order the reports came.
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
	f.multiplyOwnedUnits = multiplyPulled(reports, func(r *poolctl.ActivityReport) bool {
		return fresh(r) && !r.LastFetch.IsZero() && now.Sub(r.LastFetch) <= window
	})
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
			why = fmt.Sprintf("no pull completed for %s", r.ReportedAt.Sub(r.LastFetch).Round(time.Second))
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

// multiplyPulled lists units that two or more incarnations report
// pulling (counted reports only).
func multiplyPulled(reports []poolctl.ActivityReport, counted func(*poolctl.ActivityReport) bool) []string {
	type puller struct {
		memberUnit
		incarnation int64
	}
	seen := make(map[puller]bool, len(reports))
	perUnit := make(map[string]int, len(reports))
	var units []string
	for i := range reports {
		r := &reports[i]
		k := puller{memberUnit{r.Unit, r.Member}, r.Incarnation}
		if !counted(r) || seen[k] {
			continue
		}
		seen[k] = true
		if perUnit[r.Unit]++; perUnit[r.Unit] == 2 {
			units = append(units, r.Unit)
		}
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
