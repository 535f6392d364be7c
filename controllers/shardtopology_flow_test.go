package controllers

import (
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
	flowing := []poolctl.ActivityReport{report("0.0", "w-0", 1, 0, 0, never), report("0.1", "w-1", 2, 0, 0, never)}
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
			append(slices.Clone(flowing), report("0.0", "w-1", 2, time.Second, time.Second, never)), nil, 1, nil},
		{"a second member's report is stale: not counted",
			append(slices.Clone(flowing), report("0.0", "w-1", 2, 3*renew, time.Second, never)), nil, 0, nil},
		{"a second member reports freshly but pulled long ago: not counted",
			append(slices.Clone(flowing), report("0.0", "w-1", 2, 0, 3*renew, never)), nil, 0, nil},
		{"a second member never pulled: not counted",
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
			[]string{"0.0 (w-0: no pull completed for 10s"}},
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
		f := assessFlow(s, claims, append(slices.Clone(flowing), report("0.0", "w-1", 2, 0, 0, never)), nil)
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
