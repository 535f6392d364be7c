package sim

import "testing"

// TestTheStandInPasses runs the simulator's own small member over 2,000
// seeds: a second, independent implementation of the protocol the judge
// must find clean, so a violation the core shows is the core's and not
// the simulator's.
func TestTheStandInPasses(t *testing.T) {
	s := Sweep{From: 0, Count: 2000, Config: Config{NewMember: NewStandin}}.Run()
	t.Log(s.String())
	if s.Failures > 0 {
		orig := Config{Seed: s.FirstFailing, NewMember: NewStandin}
		shrunk, r := Shrink(orig, 100)
		t.Fatalf("%d of %d seeds failed\n%s", s.Failures, s.Seeds, Report(orig, s.Failed[0].First(), shrunk, r, 40))
	}
}
