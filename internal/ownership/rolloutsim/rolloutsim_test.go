package rolloutsim

import (
	"errors"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// fieldCases are the two changes of the field reports (N=4, 4 pods), with
// the ranges those reports measured on fleets that hash on their own:
// units pulled by two processes, and units pulled by nobody.
var fieldCases = []struct {
	name               string
	from, to           int
	doubleLo, doubleHi int
	nobodyLo, nobodyHi int
}{
	{"N=4 V 8 to 16", 8, 16, 3, 3, 2, 4},
	{"N=4 V 32 to 48", 32, 48, 4, 6, 2, 4},
}

func fieldScenario(from, to int, m Membership, v Views) Scenario {
	return Scenario{From: ownership.Topology{Partitions: 4, Shards: from}, To: ownership.Topology{Partitions: 4, Shards: to}, Members: 4, Membership: m, Views: v}
}

// TestFieldReportCases replays the two changes of the field reports under
// every independent model. It checks that sequenced never has a
// multiply-owned or stranded unit whatever the baseline, that independent
// leaves units unowned, and that live membership with stale views double
// pulls; it logs the figures for the report.
// checks P1
func TestFieldReportCases(t *testing.T) {
	models := []struct {
		membership Membership
		views      Views
	}{{Fixed, ""}, {Live, Stale}, {Live, Fresh}}
	for _, tt := range fieldCases {
		for _, md := range models {
			t.Run(tt.name+" "+string(md.membership)+" "+string(md.views), func(t *testing.T) {
				ind, seq := replay(t, fieldScenario(tt.from, tt.to, md.membership, md.views))
				f := ind.Figures()
				t.Logf("independent: pulled by two or more %d %v (max %d at one step); pulled by nobody while every pod ran %d %v (%d with restart windows, max %d at one step)",
					len(f.DoublePulled), f.DoublePulled, f.MaxMulti, len(f.PulledByNobody), f.PulledByNobody, f.PulledByNobodyAny, f.MaxUnowned)
				t.Logf("sequenced:   max multiply-owned %d, max unowned %d, unowned unit-steps %d (all waiting on a planned claim)", seq.MaxMulti(), maxUnowned(seq), seq.UnownedUnitSteps())
				if seq.MaxMulti() != 0 || seq.StrandedUnitSteps() != 0 || len(seq.Violations) != 0 {
					t.Fatalf("sequenced: multi %d, stranded %d, violations %v", seq.MaxMulti(), seq.StrandedUnitSteps(), seq.Violations)
				}
				if ind.UnownedUnitSteps() == 0 {
					t.Fatalf("independent left no unit unowned; the model lost the effect the field reports")
				}
				if md.views == Stale && ind.MaxMulti() == 0 {
					t.Fatalf("independent had no multiply-owned unit with stale views")
				}
			})
		}
	}
}

// TestFixedMembershipFiguresFollowFromThePlacements checks the fixed model
// against what the two placements alone imply (predictFixed), for the field
// cases, and logs how the figures compare with the field's ranges. The
// figures are whatever the project's hash gives; the test pins how they
// arise, not what they are.
func TestFixedMembershipFiguresFollowFromThePlacements(t *testing.T) {
	for _, tt := range fieldCases {
		t.Run(tt.name, func(t *testing.T) {
			sc := fieldScenario(tt.from, tt.to, Fixed, "")
			ind, err := Independent(sc)
			if err != nil {
				t.Fatal(err)
			}
			f := ind.Figures()
			checkPrediction(t, sc, f)
			t.Logf("pulled by two or more: %d %v, field %d-%d: %s", len(f.DoublePulled), f.DoublePulled, tt.doubleLo, tt.doubleHi, inRange(len(f.DoublePulled), tt.doubleLo, tt.doubleHi))
			t.Logf("pulled by nobody while every pod ran: %d %v, field %d-%d: %s", len(f.PulledByNobody), f.PulledByNobody, tt.nobodyLo, tt.nobodyHi, inRange(len(f.PulledByNobody), tt.nobodyLo, tt.nobodyHi))
			t.Logf("pulled by nobody with restart windows: %d of %d", f.PulledByNobodyAny, sc.From.Len())
		})
	}
}

// TestFixedMembershipFiguresFollowFromThePlacementsAnyChange is the same
// check over random changes, fleet sizes and restart orders.
func TestFixedMembershipFiguresFollowFromThePlacementsAnyChange(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "members")
		sc := Scenario{
			From:       ownership.Topology{Partitions: rapid.IntRange(1, 6).Draw(t, "n"), Shards: rapid.IntRange(1, 24).Draw(t, "v")},
			To:         ownership.Topology{Partitions: rapid.IntRange(1, 6).Draw(t, "n2"), Shards: rapid.IntRange(1, 24).Draw(t, "v2")},
			Members:    n,
			Order:      rapid.Permutation(ordinals(n)).Draw(t, "order"),
			Membership: Fixed,
		}
		ind, err := Independent(sc)
		if err != nil {
			t.Fatal(err)
		}
		checkPrediction(t, sc, ind.Figures())
	})
}

// checkPrediction fails when the fixed model's figures differ from
// predictFixed's.
func checkPrediction(t interface {
	Helper()
	Fatalf(string, ...any)
}, sc Scenario, f Figures) {
	t.Helper()
	double, nobody, gap := predictFixed(sc)
	if !slices.Equal(f.DoublePulled, double) || !slices.Equal(f.PulledByNobody, nobody) || f.PulledByNobodyAny != gap {
		t.Fatalf("%+v: figures %v / %v / %d, the placements imply %v / %v / %d",
			sc, f.DoublePulled, f.PulledByNobody, f.PulledByNobodyAny, double, nobody, gap)
	}
}

// predictFixed derives the fixed model's figures from the two placements
// over the fixed slots and the restart order, without replaying. A unit of
// both topologies that placement moves from slot a to slot b is pulled
// twice from b's restart until a's when b restarts first, and by nobody
// while every pod runs from a's restart until b's when a restarts first. A
// unit only the old topology has is pulled by nobody once its owner
// restarted, since nothing retires it. Units of the new topology alone
// carry rows only once every pod runs it. With restart windows counted,
// every old unit goes unpulled while its owner is down, except one whose
// new owner already pulls it.
func predictFixed(sc Scenario) (double, nobody []ownership.Unit, gap int) {
	slots := make([]ownership.Slot, sc.Members)
	for i := range slots {
		slots[i] = ownership.Slot(i)
	}
	pos := make(map[ownership.Slot]int, sc.Members) // slot to restart position
	for i, o := range sc.RestartOrder() {
		pos[ownership.Slot(o)] = i
	}
	before, after := ownership.Place(sc.From.Units(), slots), ownership.Place(sc.To.Units(), slots)
	for _, u := range sc.From.Units() {
		a, _ := before.Owner(u)
		b, kept := after.Owner(u)
		switch {
		case !kept:
			nobody = append(nobody, u)
		case pos[b] < pos[a]:
			double = append(double, u)
		case pos[a] < pos[b]:
			nobody = append(nobody, u)
		}
	}
	return double, nobody, sc.From.Len() - len(double)
}

func inRange(n, lo, hi int) string {
	if n >= lo && n <= hi {
		return "inside"
	}
	return "OUTSIDE"
}

// TestFiguresCountDistinctUnits checks the counting definition: a unit
// counts once however many steps it spends double-pulled or unpulled, and
// an unpulled unit counts as pulled by nobody only at a step where every
// pod ran.
func TestFiguresCountDistinctUnits(t *testing.T) {
	a, b := ownership.Unit{Partition: 0, Shard: 0}, ownership.Unit{Partition: 0, Shard: 1}
	tests := []struct {
		name                   string
		rows                   []Row
		double, nobody, gapAny int
	}{
		{"a unit double-pulled at two steps counts once",
			[]Row{{Multi: 1, MultiUnits: []ownership.Unit{a}, AllUp: true}, {Multi: 2, MultiUnits: []ownership.Unit{a, b}, AllUp: true}}, 2, 0, 0},
		{"unpulled while a pod is down is a restart window only",
			[]Row{{Unowned: 2, UnownedUnits: []ownership.Unit{a, b}}}, 0, 0, 2},
		{"unpulled while every pod runs counts",
			[]Row{{Unowned: 1, UnownedUnits: []ownership.Unit{a}}, {Unowned: 1, UnownedUnits: []ownership.Unit{a}, AllUp: true}}, 0, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Run{Rows: tt.rows}.Figures()
			if len(f.DoublePulled) != tt.double || len(f.PulledByNobody) != tt.nobody || f.PulledByNobodyAny != tt.gapAny {
				t.Fatalf("figures %+v, want %d double, %d nobody, %d with restarts", f, tt.double, tt.nobody, tt.gapAny)
			}
		})
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
	for _, m := range []Membership{Fixed, Live} {
		t.Run(string(m), func(t *testing.T) {
			sum, err := Sweep(200, 1, m, Stale)
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
		})
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
		{"unknown membership", func(s *Scenario) { s.Membership = "elastic" }},
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
