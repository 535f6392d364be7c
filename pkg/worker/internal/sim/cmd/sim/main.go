// Command sim runs the member simulator (make sim, make mutate): a sweep
// of seeds with a summary of faults and violations, one seed's replay
// with its trace, or the mutation table.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/sim"
)

func main() {
	var (
		seeds    = flag.Int64("seeds", 100000, "how many seeds to run")
		from     = flag.Int64("from", 0, "first seed")
		seed     = flag.Int64("seed", -1, "replay only this seed and print its trace")
		mutation = flag.String("mutation", "", "apply this mutation")
		disable  = flag.String("disable", "", "with -seed: fault kinds to turn off (as the shrinker prints)")
		skip     = flag.String("skip", "", "with -seed: fault ordinals to leave out (as the shrinker prints)")
		mutate   = flag.Bool("mutate", false, "print the mutation table: each mutation, the check that caught it, the seeds it took")
		budget   = flag.Int64("budget", sim.MutationSeeds, "with -mutate: seeds per mutation at most")
		member   = flag.String("member", "core", "the member logic: core (the worker's) or standin (the simulator's own)")
	)
	flag.Parse()
	newMember, err := sim.MemberByName(*member)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	switch {
	case *seed >= 0:
		cfg := sim.Config{Seed: *seed, Mutation: *mutation, Trace: true, NewMember: newMember}
		if err := sim.ParseReplay(&cfg, *disable, *skip); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		r := sim.Run(cfg)
		for _, l := range r.Trace {
			fmt.Println(l)
		}
		fmt.Printf("seed %d: %d events, enabled %v, injected %v\n", r.Seed, r.Events, r.Enabled, r.Injected)
		for _, v := range r.Violations {
			fmt.Println("VIOLATION", v)
		}
		if r.Failed() {
			os.Exit(1)
		}
	case *mutate:
		start := time.Now()
		names := append([]string(nil), sim.WorldMutations...)
		if *member == "core" {
			names = append(names, sim.MemberMutations()...)
		}
		rows := sim.RunMutations(names, newMember, *budget, func(r sim.MutationRow) {
			fmt.Fprintf(os.Stderr, "%s: %s after %d seeds\n", r.Mutation, r.CaughtBy, r.Seeds)
		})
		fmt.Print(sim.MutationTable(rows))
		fmt.Printf("(%d mutations in %s; seeds = the first failing seed + 1, searching from seed 0)\n", len(rows), time.Since(start).Round(time.Second))
		failed := false
		for _, r := range rows {
			switch why, known := sim.Unreachable[r.Mutation]; {
			case r.Seeds == 0 && known:
				fmt.Printf("out of the simulator's reach, caught by the member's scripts (next table): %s: %s\n", r.Mutation, why)
			case r.Seeds == 0:
				fmt.Printf("FAIL: mutation %s survived %d seeds\n", r.Mutation, *budget)
				failed = true
			}
		}
		if failed {
			os.Exit(1)
		}
	default:
		s := sim.Sweep{From: *from, Count: *seeds, Config: sim.Config{Mutation: *mutation, NewMember: newMember}}.Run()
		fmt.Print(s.String())
		if s.Failures > 0 {
			orig := sim.Config{Seed: s.FirstFailing, Mutation: *mutation, NewMember: newMember}
			shrunk, r := sim.Shrink(orig, 200)
			fmt.Print(sim.Report(orig, s.Failed[0].First(), shrunk, r, 60))
			os.Exit(1)
		}
	}
}
