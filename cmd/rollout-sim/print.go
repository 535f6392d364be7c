package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/shardkeeper/shardkeeper/internal/ownership/rolloutsim"
)

func runOne(sc rolloutsim.Scenario, out io.Writer) error {
	ind, err := rolloutsim.Independent(sc)
	if err != nil {
		return err
	}
	seq, err := rolloutsim.Sequenced(sc)
	if err != nil {
		return err
	}
	views := sc.Views
	if views == "" {
		views = rolloutsim.Stale
	}
	fmt.Fprintf(out, "rollout-sim: %s -> %s, %d members, restart order %s, independent views %s\n",
		sc.From, sc.To, sc.Members, strings.Join(podNames(sc.RestartOrder()), " "), views)
	fmt.Fprintln(out, "counted: units that carry rows (publishers' topology, plus old units not yet retired)")
	fmt.Fprintln(out)
	printTable(out, ind, seq)
	fmt.Fprintln(out)
	for _, v := range seq.Violations {
		fmt.Fprintln(out, "sequenced violation:", v)
	}
	fmt.Fprintf(out, "stranded unit-steps (unowned, no planned claim): independent=%d sequenced=%d\n",
		ind.StrandedUnitSteps(), seq.StrandedUnitSteps())
	printSummary(out, ind.MaxMulti(), seq.MaxMulti(), ind.UnownedUnitSteps(), seq.UnownedUnitSteps())
	if seq.MaxMulti() > 0 || len(seq.Violations) > 0 {
		return errSequencedBroken
	}
	return nil
}

// printTable prints both runs side by side, row i of each on line i. The
// runs have different numbers of steps, so a line pairs steps by index, not
// by time.
func printTable(out io.Writer, ind, seq rolloutsim.Run) {
	iw, sw := eventWidth(ind, "independent"), eventWidth(seq, "sequenced")
	fmt.Fprintf(out, "%4s  %-*s %7s %5s | %-*s %7s %7s %5s\n", "step", iw, "independent", "unowned", "multi", sw, "sequenced", "unowned", "waiting", "multi")
	for i := range max(len(ind.Rows), len(seq.Rows)) {
		left := fmt.Sprintf("%-*s %7s %5s", iw, "", "", "")
		if i < len(ind.Rows) {
			r := ind.Rows[i]
			left = fmt.Sprintf("%-*s %7d %5d", iw, r.Event, r.Unowned, r.Multi)
		}
		right := ""
		if i < len(seq.Rows) {
			r := seq.Rows[i]
			right = fmt.Sprintf("%-*s %7d %7d %5d", sw, r.Event, r.Unowned, r.Waiting, r.Multi)
		}
		fmt.Fprintf(out, "%4d  %s | %s\n", i, left, right)
	}
}

func eventWidth(r rolloutsim.Run, title string) int {
	w := len(title)
	for _, row := range r.Rows {
		w = max(w, len(row.Event))
	}
	return w
}

func runSweep(o options, out io.Writer) error {
	sum, err := rolloutsim.Sweep(o.cases, o.seed, rolloutsim.Views(o.views))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sweep: %d cases, seed %d, independent views %s: N 1..8, V 1..64 -> another V in 1..64, members 1..12, random restart orders\n",
		sum.Cases, sum.Seed, o.views)
	s, i := sum.Sequenced, sum.Independent
	fmt.Fprintf(out, "sequenced:   multiply-owned in %d/%d cases (max %d), promise violations %d, stranded unit-steps %d\n",
		s.CasesWithMulti, sum.Cases, s.MaxMulti, s.Violations, s.StrandedUnitSteps)
	fmt.Fprintf(out, "independent: multiply-owned in %d/%d cases (max %d, e.g. %s -> %s with %d members), stranded units in %d/%d cases (%d unit-steps)\n",
		i.CasesWithMulti, sum.Cases, i.MaxMulti, i.Worst.From, i.Worst.To, i.Worst.Members, i.CasesStranded, sum.Cases, i.StrandedUnitSteps)
	printSummary(out, i.MaxMulti, s.MaxMulti, i.UnownedUnitSteps, s.UnownedUnitSteps)
	if s.MaxMulti > 0 || s.Violations > 0 {
		return errSequencedBroken
	}
	return nil
}

func printSummary(out io.Writer, indMulti, seqMulti, indUnowned, seqUnowned int) {
	fmt.Fprintf(out, "max multiply-owned: independent=%d sequenced=%d; unowned unit-steps: independent=%d sequenced=%d\n",
		indMulti, seqMulti, indUnowned, seqUnowned)
}

func podNames(ordinals []int) []string {
	out := make([]string, len(ordinals))
	for i, o := range ordinals {
		out[i] = rolloutsim.PodName(o)
	}
	return out
}
