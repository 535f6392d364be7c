package sim

import "testing"

// TestMutationsAreCaught applies each mutation (the simulator's own to the
// registry and the sink, and every mutation the member offers) and wants
// the simulator to fail within 10,000 seeds: a rule whose mutation
// survives is a rule nothing tests.
func TestMutationsAreCaught(t *testing.T) {
	names := append([]string(nil), WorldMutations...)
	names = append(names, MemberMutations()...)
	rows := RunMutations(names, nil, MutationSeeds)
	t.Logf("\n%s", MutationTable(rows))
	for _, r := range rows {
		if r.Seeds == 0 {
			t.Errorf("mutation %s survived %d seeds", r.Mutation, MutationSeeds)
		}
	}
}
