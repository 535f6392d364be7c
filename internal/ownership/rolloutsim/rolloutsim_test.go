package rolloutsim

import (
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// TestFieldReportCases replays the two changes of the field reports. It
// checks that sequenced never has a multiply-owned or stranded unit and that
// independent, the reference, does, and logs both for the report.
// checks P1
func TestFieldReportCases(t *testing.T) {
	tests := []struct {
		name     string
		from, to int
	}{
		{"N=4 V 8 to 16", 8, 16},
		{"N=4 V 32 to 48", 32, 48},
	}
	for _, tt := range tests {
		for _, views := range []Views{Stale, Fresh} {
			t.Run(tt.name+" "+string(views), func(t *testing.T) {
				sc := Scenario{From: ownership.Topology{Partitions: 4, Shards: tt.from}, To: ownership.Topology{Partitions: 4, Shards: tt.to}, Members: 4, Views: views}
				ind, seq := replay(t, sc)
				t.Logf("independent: max multiply-owned %d, max unowned %d, unowned unit-steps %d", ind.MaxMulti(), maxUnowned(ind), ind.UnownedUnitSteps())
				t.Logf("sequenced:   max multiply-owned %d, max unowned %d, unowned unit-steps %d (all waiting on a planned claim)", seq.MaxMulti(), maxUnowned(seq), seq.UnownedUnitSteps())
				if seq.MaxMulti() != 0 || seq.StrandedUnitSteps() != 0 || len(seq.Violations) != 0 {
					t.Fatalf("sequenced: multi %d, stranded %d, violations %v", seq.MaxMulti(), seq.StrandedUnitSteps(), seq.Violations)
				}
				if ind.UnownedUnitSteps() == 0 {
					t.Fatalf("independent left no unit unowned; the model lost the effect the field reports")
				}
				if views == Stale && ind.MaxMulti() == 0 {
					t.Fatalf("independent had no multiply-owned unit with stale views")
				}
			})
		}
	}
}

// TestSequencedNeverMultiplyOwns replays random changes of N and V, fleet
// size and restart order, and checks that the sequenced plans never give a
// unit two owners, never break a promise, and never strand a unit.
// checks P1, checks P2
func TestSequencedNeverMultiplyOwns(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "members")
		order := rapid.Permutation(ordinals(n)).Draw(t, "order")
		sc := Scenario{
			From:    ownership.Topology{Partitions: rapid.IntRange(1, 6).Draw(t, "n"), Shards: rapid.IntRange(1, 24).Draw(t, "v")},
			To:      ownership.Topology{Partitions: rapid.IntRange(1, 6).Draw(t, "n2"), Shards: rapid.IntRange(1, 24).Draw(t, "v2")},
			Members: n,
			Order:   order,
		}
		seq, err := Sequenced(sc)
		if err != nil {
			t.Fatal(err)
		}
		if seq.MaxMulti() != 0 || seq.StrandedUnitSteps() != 0 || len(seq.Violations) != 0 {
			t.Fatalf("%+v: multi %d, stranded %d, violations %v", sc, seq.MaxMulti(), seq.StrandedUnitSteps(), seq.Violations)
		}
	})
}

// TestSweep checks the sweep cmd/rollout-sim --sweep prints: at least 200
// cases, sequenced at zero everywhere.
// checks P1, checks P2
func TestSweep(t *testing.T) {
	sum, err := Sweep(200, 1, Stale)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("independent: %+v", sum.Independent)
	t.Logf("sequenced:   %+v", sum.Sequenced)
	s := sum.Sequenced
	if s.MaxMulti != 0 || s.Violations != 0 || s.StrandedUnitSteps != 0 {
		t.Fatalf("sequenced: %+v", s)
	}
	if sum.Independent.CasesWithMulti == 0 {
		t.Fatalf("independent never had a multiply-owned unit in %d cases", sum.Cases)
	}
}

func TestScenarioValidate(t *testing.T) {
	good := Scenario{From: ownership.Topology{Partitions: 1, Shards: 2}, To: ownership.Topology{Partitions: 1, Shards: 4}, Members: 3}
	tests := []struct {
		name   string
		change func(*Scenario)
	}{
		{"no members", func(s *Scenario) { s.Members = 0 }},
		{"invalid topology", func(s *Scenario) { s.To.Shards = 2000 }},
		{"order repeats an ordinal", func(s *Scenario) { s.Order = []int{0, 0, 1} }},
		{"order is short", func(s *Scenario) { s.Order = []int{2, 1} }},
		{"order names a stranger", func(s *Scenario) { s.Order = []int{0, 1, 3} }},
		{"unknown views", func(s *Scenario) { s.Views = "psychic" }},
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("good scenario: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := good
			tt.change(&sc)
			if err := sc.Validate(); !errors.Is(err, ErrInvalidScenario) {
				t.Fatalf("Validate = %v, want ErrInvalidScenario", err)
			}
		})
	}
}

func replay(t *testing.T, sc Scenario) (Run, Run) {
	t.Helper()
	ind, err := Independent(sc)
	if err != nil {
		t.Fatal(err)
	}
	seq, err := Sequenced(sc)
	if err != nil {
		t.Fatal(err)
	}
	return ind, seq
}

func maxUnowned(r Run) int {
	m := 0
	for _, row := range r.Rows {
		m = max(m, row.Unowned)
	}
	return m
}

func ordinals(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
