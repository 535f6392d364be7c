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
//     or stale, or when a census saw rows pending in its consumer and the
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
	// multiplyOwned counts units pulled by two or more members at once.
	multiplyOwned int
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
	fresh := func(r poolctl.ActivityReport) bool { return now.Sub(r.ReportedAt) <= window }
	pulled := func(r poolctl.ActivityReport) bool { return !r.LastFetch.IsZero() && now.Sub(r.LastFetch) <= window }

	pullers := map[string]map[string]bool{}
	for _, r := range reports {
		if fresh(r) && pulled(r) {
			if pullers[r.Unit] == nil {
				pullers[r.Unit] = map[string]bool{}
			}
			pullers[r.Unit][fmt.Sprintf("%s/%d", r.Member, r.Incarnation)] = true
		}
	}
	for _, ms := range pullers {
		if len(ms) >= 2 {
			f.multiplyOwned++
		}
	}

	if snap.Active == nil {
		return f
	}
	// The owner's current incarnation's latest report of each unit.
	latest := map[string]poolctl.ActivityReport{}
	for _, r := range reports {
		m := snap.Member(r.Member)
		if m == nil || m.Incarnation != r.Incarnation {
			continue
		}
		k := r.Unit + "/" + r.Member
		if old, ok := latest[k]; !ok || r.ReportedAt.After(old.ReportedAt) {
			latest[k] = r
		}
	}
	owners := ownedBy(snap, claims)
	for _, u := range epochTopology(snap.Active).Units() {
		owner := owners[u.String()]
		if owner == "" {
			continue
		}
		r, ok := latest[u.String()+"/"+owner]
		stall := func(format string, args ...any) {
			f.stalled = append(f.stalled, stalledUnit{unit: u.String(), owner: owner, why: fmt.Sprintf(format, args...)})
		}
		switch {
		case !ok:
			stall("no activity report")
		case !fresh(r):
			stall("last activity report %s ago", now.Sub(r.ReportedAt).Round(time.Second))
		default:
			c := censusBefore(pending, r.ReportedAt.Add(-bound))
			if c != nil && c.units[u.String()] > 0 && (r.LastRows.IsZero() || r.LastRows.Before(c.at.Add(-clockSlack))) {
				stall("%d rows pending at the census %s ago, none received since", c.units[u.String()], now.Sub(c.at).Round(time.Second))
			}
		}
	}
	return f
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
