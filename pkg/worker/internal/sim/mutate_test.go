package sim

import "testing"

// TestMutationsAreCaught applies each mutation (the simulator's own to the
// registry and the sink, and every mutation the member offers) and wants
// the simulator to fail within 10,000 seeds: a rule whose mutation
// survives is a rule nothing tests.
func TestMutationsAreCaught(t *testing.T) {
	names := append([]string(nil), WorldMutations...)
	names = append(names, MemberMutations()...)
	rows := RunMutations(names, nil, MutationSeeds, nil)
	t.Logf("\n%s", MutationTable(rows))
	for _, r := range rows {
		switch why, known := Unreachable[r.Mutation]; {
		case r.Seeds == 0 && known:
			t.Logf("mutation %s survived %d seeds, as known: %s", r.Mutation, MutationSeeds, why)
		case r.Seeds == 0:
			t.Errorf("mutation %s survived %d seeds", r.Mutation, MutationSeeds)
		}
	}
}
