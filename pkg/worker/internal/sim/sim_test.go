package sim

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

var (
	seedFlag     = flag.Int64("seed", -1, "replay only this seed, printing its trace")
	mutationFlag = flag.String("mutation", "", "apply this mutation (with -seed)")
	disableFlag  = flag.String("disable", "", "fault kinds to turn off, comma-separated (with -seed; what the shrinker printed)")
	skipFlag     = flag.String("skip", "", "fault ordinals to leave out, comma-separated (with -seed; what the shrinker printed)")
	seedsFlag    = flag.Int64("seeds", 10000, "how many seeds TestSim runs")
	memberFlag   = flag.String("member", "core", "with -seed: the member logic, core or standin")
)

// TestSim is the simulator's CI run: 10,000 seeds (-seeds) of the
// default member, each judged by historycheck, P5 and liveness. With
// -seed it replays one seed and prints its trace.
func TestSim(t *testing.T) {
	if *seedFlag >= 0 {
		cfg := Config{Seed: *seedFlag, Mutation: *mutationFlag, Trace: true}
		if err := ParseReplay(&cfg, *disableFlag, *skipFlag); err != nil {
			t.Fatal(err)
		}
		var err error
		if cfg.NewMember, err = MemberByName(*memberFlag); err != nil {
			t.Fatal(err)
		}
		r := Run(cfg)
		for _, l := range r.Trace {
			t.Log(l)
		}
		t.Logf("seed %d: %d events, enabled %v, injected %v", r.Seed, r.Events, r.Enabled, r.Injected)
		for _, v := range r.Violations {
			t.Error(v)
		}
		return
	}
	n := *seedsFlag
	if env := os.Getenv("SIM_SEEDS"); env != "" {
		if v, err := strconv.ParseInt(env, 10, 64); err == nil {
			n = v
		}
	}
	s := Sweep{From: 0, Count: n}.Run()
	t.Log(s.String())
	if s.Seeds != int(n) {
		t.Fatalf("ran %d seeds, want %d", s.Seeds, n)
	}
	for _, k := range FaultKinds {
		if s.Injected[k] == 0 {
			t.Errorf("no fault of kind %s took effect in %d seeds: the search does not reach it", k, n)
		}
	}
	if s.Failures > 0 {
		orig := Config{Seed: s.FirstFailing}
		shrunk, r := Shrink(orig, 200)
		t.Fatalf("%d of %d seeds failed\n%s", s.Failures, s.Seeds, Report(orig, s.Failed[0].First(), shrunk, r, 60))
	}
}

// TestSimIsDeterministic runs seeds twice and wants the same runs: the
// seed must decide everything, or a failing seed would not replay.
func TestSimIsDeterministic(t *testing.T) {
	for seed := int64(0); seed < 50; seed++ {
		a, b := Run(Config{Seed: seed, Trace: true}), Run(Config{Seed: seed, Trace: true})
		if len(a.Trace) != len(b.Trace) || a.Events != b.Events {
			t.Fatalf("seed %d: %d events / %d trace lines, then %d / %d", seed, a.Events, len(a.Trace), b.Events, len(b.Trace))
		}
		for i := range a.Trace {
			if a.Trace[i] != b.Trace[i] {
				t.Fatalf("seed %d differs at trace line %d:\n%s\n%s", seed, i, a.Trace[i], b.Trace[i])
			}
		}
	}
}
