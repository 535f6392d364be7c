package controllers

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// checks P1, checks P7
func TestAssessFlow(t *testing.T) {
	now := registryNow
	renew := poolctl.DefaultParams().RenewInterval // 3s: window 6s, bound 9s
	// One active epoch of 1x2: w-0 owns 0.0, w-1 owns 0.1, both live.
	snap := func() *poolctl.Snapshot {
		s := registryWith(1, 2, 2, 2, nil).snap
		return &s
	}
	claims := registryWith(1, 2, 2, 2, nil).claims
	report := func(unit, member string, inc int64, reportedAgo, fetchAgo, rowsAgo time.Duration) poolctl.ActivityReport {
		r := poolctl.ActivityReport{Unit: unit, Member: member, Incarnation: inc, Epoch: 1, ReportedAt: now.Add(-reportedAgo)}
		if fetchAgo >= 0 {
			r.LastFetch = now.Add(-fetchAgo)
		}
		if rowsAgo >= 0 {
			r.LastRows = now.Add(-rowsAgo)
		}
		return r
	}
	const never = -1
	// pulling sets since when r's puller pulls under its token.
	pulling := func(r poolctl.ActivityReport, ago time.Duration) poolctl.ActivityReport {
		r.PullingSince = now.Add(-ago)
		return r
	}
	flowing := []poolctl.ActivityReport{pulling(report("0.0", "w-0", 1, 0, 0, never), time.Minute), pulling(report("0.1", "w-1", 2, 0, 0, never), time.Minute)}
	census := now.Add(-20 * time.Second)
	waiting := []pendingRows{{at: census, units: map[string]uint64{"0.0": 40, "0.1": 0}}}
	tests := []struct {
		name     string
		reports  []poolctl.ActivityReport
		pending  []pendingRows
		multiply int
		stalled  []string // "unit: why" substrings
	}{
		{"every owner reports pulls just now: flowing", flowing, nil, 0, nil},
		{"a second member pulls an owned unit too: multiply owned",
			append(slices.Clone(flowing), pulling(report("0.0", "w-1", 2, time.Second, time.Second, never), 30*time.Second)), nil, 1, nil},
		{"a second member's report is stale: not counted",
			append(slices.Clone(flowing), pulling(report("0.0", "w-1", 2, 3*renew, time.Second, never), 30*time.Second)), nil, 0, nil},
		{"a second member whose report does not say when it started: its window runs from its last pull",
			append(slices.Clone(flowing), report("0.0", "w-1", 2, 0, 3*renew, never)), nil, 1, nil},
		{"a second member that says neither when it started nor a pull: an instant, not counted",
			append(slices.Clone(flowing), report("0.0", "w-1", 2, 0, never, never)), nil, 0, nil},
		{"the owner's report is missing: stalled",
			flowing[1:], nil, 0, []string{"0.0 (w-0: no activity report"}},
		{"the owner's report is stale: stalled",
			[]poolctl.ActivityReport{report("0.0", "w-0", 1, 3*renew, 3*renew, never), flowing[1]}, nil, 0, []string{"0.0 (w-0: last activity report 9s ago"}},
		{"only an earlier incarnation of the owner reported: stalled",
			[]poolctl.ActivityReport{report("0.0", "w-0", 0, 0, 0, never), flowing[1]}, nil, 0, []string{"0.0 (w-0: no activity report"}},
		{"rows pending at the census and none received since, reported after the bound: stalled",
			[]poolctl.ActivityReport{report("0.0", "w-0", 1, 0, 0, time.Hour), flowing[1]}, waiting, 0,
			[]string{"0.0 (w-0: 40 rows pending at the census 20s ago, none received since"}},
		{"rows pending at the census and never any received: stalled",
			flowing, waiting, 0, []string{"0.0 (w-0: 40 rows pending"}},
		{"rows pending at the census and received after it: flowing",
			[]poolctl.ActivityReport{report("0.0", "w-0", 1, 0, 0, 15*time.Second), flowing[1]}, waiting, 0, nil},
		{"rows pending at the census, received just before it (clock slack): flowing",
			[]poolctl.ActivityReport{report("0.0", "w-0", 1, 0, 0, 20*time.Second+500*time.Millisecond), flowing[1]}, waiting, 0, nil},
		{"rows pending, but no report yet made a bound after the census: not yet stalled",
			flowing, []pendingRows{{at: now.Add(-5 * time.Second), units: map[string]uint64{"0.0": 40}}}, 0, nil},
		{"censuses more frequent than the bound: the latest one a bound old is judged",
			flowing, []pendingRows{{at: census, units: map[string]uint64{"0.0": 40}}, {at: now.Add(-time.Second), units: map[string]uint64{"0.0": 41}}}, 0,
			[]string{"0.0 (w-0: 40 rows pending at the census 20s ago"}},
		{"rows pended once, but not at the latest census a bound old: not stalled",
			flowing, []pendingRows{{at: census, units: map[string]uint64{"0.0": 40}}, {at: now.Add(-10 * time.Second), units: map[string]uint64{"0.0": 0}}}, 0, nil},
		{"nothing pending and no row ever: idle, not stalled", flowing, []pendingRows{{at: census, units: map[string]uint64{}}}, 0, nil},
		{"the owner reports freshly but completed no pull for longer than the bound (NATS down): stalled",
			[]poolctl.ActivityReport{report("0.0", "w-0", 1, 0, 10*time.Second, 10*time.Second), flowing[1]}, nil, 0,
			[]string{"0.0 (w-0: no pull progress for 10s"}},
		{"the owner's last pull is within the bound: flowing",
			[]poolctl.ActivityReport{report("0.0", "w-0", 1, 0, 8*time.Second, never), flowing[1]}, nil, 0, nil},
		{"the owner never pulled yet (just claimed): not judged by its pulls",
			[]poolctl.ActivityReport{report("0.0", "w-0", 1, 0, never, never), flowing[1]}, nil, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := assessFlow(snap(), claims, tt.reports, tt.pending)
			if f.multiplyOwned != tt.multiply {
				t.Errorf("multiply owned %d, want %d", f.multiplyOwned, tt.multiply)
			}
			if len(f.stalled) != len(tt.stalled) {
				t.Fatalf("stalled %v, want %d like %v", f.stalled, len(tt.stalled), tt.stalled)
			}
			for i, want := range tt.stalled {
				if got := f.stalled[i].String(); !strings.Contains(got, want) {
					t.Errorf("stalled[%d] = %q, want it to contain %q", i, got, want)
				}
			}
		})
	}

	t.Run("a unit whose owner's lease lapsed is unowned, not stalled", func(t *testing.T) {
		s := snap()
		s.Members[0].Live = false
		if f := assessFlow(s, claims, flowing[1:], nil); len(f.stalled) != 0 {
			t.Fatalf("stalled %v", f.stalled)
		}
	})
	t.Run("a draining owner stopped pulling on purpose: not stalled by its pulls", func(t *testing.T) {
		s := snap()
		s.Members[0].Draining = true
		old := []poolctl.ActivityReport{report("0.0", "w-0", 1, 0, time.Minute, never), flowing[1]}
		if f := assessFlow(s, claims, old, nil); len(f.stalled) != 0 {
			t.Fatalf("stalled %v", f.stalled)
		}
	})
	t.Run("no active epoch: nothing owned, multiply owned still counted", func(t *testing.T) {
		s := snap()
		s.Active = nil
		f := assessFlow(s, claims, append(slices.Clone(flowing), pulling(report("0.0", "w-1", 2, 0, 0, never), 30*time.Second)), nil)
		if len(f.stalled) != 0 || f.multiplyOwned != 1 {
			t.Fatalf("flow %+v", f)
		}
	})
}

func TestKeepPendingKeepsWhatAStallJudgementNeeds(t *testing.T) {
	t0 := registryNow
	var recent []pendingRows
	for i := range 10 {
		recent = keepPending(recent, pendingRows{at: t0.Add(time.Duration(i) * time.Second)}, 3*time.Second)
	}
	// The newest census at least 3s old (t0+6s) and everything newer.
	if len(recent) != 4 || !recent[0].at.Equal(t0.Add(6*time.Second)) {
		t.Fatalf("kept %d censuses from %s, want 4 from t0+6s", len(recent), recent[0].at.Sub(t0))
	}
}

// A unit is multiply owned only when two claim tokens' pull windows
// overlap: the sequential windows of a handover, an adoption or a restart
// under the same name never count, however close together (issue 21: a
// plain pod roll read 11 and 22). Times are the default parameters': renew
// 3s (reports fresh for 6s), query bound 2s (overlap slack 3s).
// checks P1
func TestMultiplyOwnedCountsOnlyOverlappingTokenWindows(t *testing.T) {
	now := registryNow
	s := registryWith(1, 2, 2, 2, nil)
	snap := s.snap
	// rep is member's report of unit 0.0 under the claim at epoch, made
	// reportedAgo before now, pulling since pullingAgo before now, its
	// last pull completed at the report.
	rep := func(member string, inc, epoch int64, reportedAgo, pullingAgo time.Duration) poolctl.ActivityReport {
		at := now.Add(-reportedAgo)
		return poolctl.ActivityReport{Unit: "0.0", Member: member, Incarnation: inc, Epoch: epoch, ReportedAt: at,
			LastFetch: at, PullingSince: now.Add(-pullingAgo)}
	}
	tests := []struct {
		name    string
		reports []poolctl.ActivityReport
		want    int
	}{
		{"a pod roll's handover: the old owner's last report came before it stopped, the new owner's window opened after its claim",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, 4*time.Second, time.Minute), rep("w-1", 2, 2, 0, 3*time.Second)}, 0},
		{"a handover whose old report ran late: the windows seem to overlap, by less than the query bound",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, time.Second, time.Minute), rep("w-1", 2, 2, 0, 3*time.Second)}, 0},
		{"a crash and an adoption: the dead owner's last report is still fresh",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, 5900*time.Millisecond, time.Minute), rep("w-1", 2, 2, 0, time.Second)}, 0},
		{"a restart under the same name: the new process re-homed the unit after the old one's last report",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, 5*time.Second, time.Minute), rep("w-0", 3, 2, 0, 2*time.Second)}, 0},
		{"one process's token reported twice: not two pullers",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, time.Second, time.Minute), rep("w-0", 1, 1, 0, time.Minute)}, 0},
		{"two members pull one unit under two tokens at once",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, 0, time.Minute), rep("w-1", 2, 2, time.Second, 20*time.Second)}, 1},
		{"two processes of one member name pull one unit at once",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, time.Second, time.Minute), rep("w-0", 3, 2, 0, 10*time.Second)}, 1},
		{"two tokens overlapping by just more than the slack",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, 0, time.Minute), rep("w-1", 2, 2, 0, 3*time.Second+time.Millisecond)}, 1},
		{"two tokens overlapping by exactly the slack: not counted",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, 0, time.Minute), rep("w-1", 2, 2, 0, 3*time.Second)}, 0},
		{"three tokens, two of them sequential, the third overlapping both: the unit counts once",
			[]poolctl.ActivityReport{rep("w-0", 1, 1, 4*time.Second, time.Minute), rep("w-1", 2, 2, 0, 3*time.Second), rep("w-2", 5, 3, 0, time.Minute)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if f := assessFlow(&snap, s.claims, tt.reports, nil); f.multiplyOwned != tt.want {
				t.Fatalf("multiply owned %d (%v), want %d", f.multiplyOwned, f.multiplyOwnedUnits, tt.want)
			}
		})
	}
}

// Property: however the reports of a chain of handovers land (each
// report's times late by anything up to the query bound, measured anywhere
// in its window, the next window opening any time after the previous one
// closed), no unit is counted; two tokens that really pulled together for
// longer than the slack plus the query bound always are.
// checks P1
func TestMultiplyPulledProperty(t *testing.T) {
	p := poolctl.DefaultParams()
	slack := overlapSlack(p)
	all := func(*poolctl.ActivityReport) bool { return true }
	rng := rand.New(rand.NewPCG(21, 1))
	dur := func(max time.Duration) time.Duration { return time.Duration(rng.Int64N(int64(max) + 1)) }
	t0 := registryNow
	// report puts a window [start, measured] of real time on the registry's
	// clock as a report that ran delay after the member measured it.
	report := func(member string, inc, epoch int64, start, measured, delay time.Duration) poolctl.ActivityReport {
		return poolctl.ActivityReport{Unit: "0.0", Member: member, Incarnation: inc, Epoch: epoch,
			ReportedAt: t0.Add(measured + delay), LastFetch: t0.Add(measured + delay), PullingSince: t0.Add(start + delay)}
	}
	for i := range 5000 {
		var reports []poolctl.ActivityReport
		at := time.Duration(0)
		for k := range 2 + rng.IntN(4) {
			start := at
			end := start + dur(10*time.Second)
			measured := start + dur(end-start)
			member := fmt.Sprintf("w-%d", rng.IntN(3)) // names repeat: restarts under one name
			reports = append(reports, report(member, int64(k+1), int64(k+1), start, measured, dur(p.QueryBound)))
			at = end + time.Nanosecond + dur(2*time.Second)
		}
		rng.Shuffle(len(reports), func(a, b int) { reports[a], reports[b] = reports[b], reports[a] })
		if got := multiplyPulled(reports, all, slack); len(got) != 0 {
			t.Fatalf("case %d: sequential windows counted: %+v", i, reports)
		}

		startA, startB := dur(time.Minute), dur(time.Minute)
		together := max(startA, startB) + slack + p.QueryBound + time.Millisecond
		pair := []poolctl.ActivityReport{
			report("w-0", 1, 1, startA, together+dur(5*time.Second), dur(p.QueryBound)),
			report(fmt.Sprintf("w-%d", rng.IntN(2)), 2, 2, startB, together+dur(5*time.Second), dur(p.QueryBound)),
		}
		if got := multiplyPulled(pair, all, slack); len(got) != 1 {
			t.Fatalf("case %d: two tokens pulling together not counted: %+v", i, pair)
		}
	}
}
