package rolloutsim

import (
	"fmt"
	"math/rand/v2"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// Sweep bounds: the random cases draw N, old V and new V, the member count
// and the restart order from these ranges.
const (
	sweepMaxPartitions = 8
	sweepMaxShards     = 64
	sweepMaxMembers    = 12
)

// Totals sums one strategy's runs over a sweep.
type Totals struct {
	// MaxMulti is the most multiply-owned units at any step of any case,
	// and CasesWithMulti how many cases had any.
	MaxMulti, CasesWithMulti int
	// UnownedUnitSteps and StrandedUnitSteps sum over all cases.
	UnownedUnitSteps, StrandedUnitSteps int
	// CasesStranded counts cases with any stranded unit.
	CasesStranded int
	// Violations counts promise violations the plans' steps reported.
	Violations int
	// Worst is a case with MaxMulti.
	Worst Scenario
}

// SweepSummary is the result of a sweep.
type SweepSummary struct {
	// Cases is how many scenarios were replayed, drawn from Seed.
	Cases int
	Seed  uint64
	// Membership and Views are how independent workers placed.
	Membership Membership
	Views      Views
	// Independent and Sequenced sum each strategy's runs.
	Independent, Sequenced Totals
}

// Sweep replays cases random scenarios (N, old V, new V, member count and
// restart order drawn from seed) under both strategies, independent
// workers placing with the given membership and views.
func Sweep(cases int, seed uint64, membership Membership, views Views) (SweepSummary, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	sum := SweepSummary{Cases: cases, Seed: seed, Membership: membership, Views: views}
	for range cases {
		sc := randomScenario(rng, membership, views)
		ind, err := Independent(sc)
		if err != nil {
			return sum, fmt.Errorf("sweep case %+v: %w", sc, err)
		}
		seq, err := Sequenced(sc)
		if err != nil {
			return sum, fmt.Errorf("sweep case %+v: %w", sc, err)
		}
		sum.Independent.add(ind, sc)
		sum.Sequenced.add(seq, sc)
	}
	return sum, nil
}

func (t *Totals) add(r Run, sc Scenario) {
	m := r.MaxMulti()
	if m > 0 {
		t.CasesWithMulti++
	}
	if m > t.MaxMulti || t.Worst.Members == 0 {
		t.MaxMulti, t.Worst = max(m, t.MaxMulti), sc
	}
	t.UnownedUnitSteps += r.UnownedUnitSteps()
	s := r.StrandedUnitSteps()
	t.StrandedUnitSteps += s
	if s > 0 {
		t.CasesStranded++
	}
	t.Violations += len(r.Violations)
}

// randomScenario draws one change of V (N stays) with a random restart
// order.
func randomScenario(rng *rand.Rand, membership Membership, views Views) Scenario {
	n := 1 + rng.IntN(sweepMaxPartitions)
	from := 1 + rng.IntN(sweepMaxShards)
	to := 1 + rng.IntN(sweepMaxShards-1)
	if to >= from {
		to++ // any V but the old one
	}
	m := 1 + rng.IntN(sweepMaxMembers)
	return Scenario{
		From:       ownership.Topology{Partitions: n, Shards: from},
		To:         ownership.Topology{Partitions: n, Shards: to},
		Members:    m,
		Order:      rng.Perm(m),
		Membership: membership,
		Views:      views,
	}
}
