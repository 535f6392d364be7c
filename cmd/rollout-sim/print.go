package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
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
	fmt.Fprintf(out, "rollout-sim: %s -> %s, %d members, restart order %s, independent %s\n",
		sc.From, sc.To, sc.Members, strings.Join(podNames(sc.RestartOrder()), " "), describeModel(sc))
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
	fmt.Fprintln(out)
	if err := printFigures(out, sc, seq); err != nil {
		return err
	}
	if seq.MaxMulti() > 0 || len(seq.Violations) > 0 {
		return errSequencedBroken
	}
	return nil
}

// models are the independent models the figures compare, the baseline's
// definition last.
var models = []struct {
	membership rolloutsim.Membership
	views      rolloutsim.Views
}{{rolloutsim.Live, rolloutsim.Stale}, {rolloutsim.Live, rolloutsim.Fresh}, {rolloutsim.Fixed, ""}}

// printFigures prints the figures over the whole roll for sequenced and for
// every independent model, whichever one the table showed, and ends with
// the line naming the model that matches the baseline's definition.
func printFigures(out io.Writer, sc rolloutsim.Scenario, seq rolloutsim.Run) error {
	fmt.Fprintln(out, "figures over the whole roll, counted as a field report counts them, in distinct units:")
	fmt.Fprintln(out, "  pulled by two = pulled by two or more pods at some step; pulled by nobody = pulled by nobody at a step where every pod ran")
	fmt.Fprintln(out, "  (in brackets: the most at one step; for pulled by nobody, restart windows included)")
	fmt.Fprintf(out, "sequenced: %s (every unowned unit waiting on a planned claim)\n", figures(seq.Figures()))
	for _, m := range models {
		msc := sc
		msc.Membership, msc.Views = m.membership, m.views
		ind, err := rolloutsim.Independent(msc)
		if err != nil {
			return fmt.Errorf("independent %s: %w", describeModel(msc), err)
		}
		fmt.Fprintf(out, "independent %s: %s\n", describeModel(msc), figures(ind.Figures()))
	}
	fmt.Fprintf(out, "the baseline's definition, capped rendezvous over a fixed slot set (cmd/shardkeeper-worker --strategy independent), is membership %s; membership %s is not it\n",
		rolloutsim.Fixed, rolloutsim.Live)
	return nil
}

// describeModel names an independent model and says whether it is the
// baseline's definition.
func describeModel(sc rolloutsim.Scenario) string {
	m, v := sc.Model()
	if m == rolloutsim.Fixed {
		return fmt.Sprintf("membership fixed (capped rendezvous over the fixed slot set 0..%d: the baseline's definition)", sc.Members-1)
	}
	return fmt.Sprintf("membership live, views %s (capped rendezvous over the slots each pod sees running: not the baseline's definition)", v)
}

func figures(f rolloutsim.Figures) string {
	return fmt.Sprintf("pulled by two %d%s (most at one step %d); pulled by nobody %d%s (with restart windows %d, most at one step %d)",
		len(f.DoublePulled), unitList(f.DoublePulled), f.MaxMulti, len(f.PulledByNobody), unitList(f.PulledByNobody), f.PulledByNobodyAny, f.MaxUnowned)
}

// maxListed is the most units a figure names; beyond, only the count.
const maxListed = 12

func unitList(us []ownership.Unit) string {
	if len(us) == 0 || len(us) > maxListed {
		return ""
	}
	names := make([]string, len(us))
	for i, u := range us {
		names[i] = u.String()
	}
	return " [" + strings.Join(names, " ") + "]"
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

func runSweep(o options, sc rolloutsim.Scenario, out io.Writer) error {
	m, v := sc.Model()
	sum, err := rolloutsim.Sweep(o.cases, o.seed, m, v)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sweep: %d cases, seed %d, independent %s: N 1..8, V 1..64 -> another V in 1..64, members 1..12, random restart orders\n",
		sum.Cases, sum.Seed, sweepModel(m, v))
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

// sweepModel names the sweep's independent model; fleet sizes vary, so no
// slot set is named.
func sweepModel(m rolloutsim.Membership, v rolloutsim.Views) string {
	if m == rolloutsim.Fixed {
		return "membership fixed (slots 0..members-1: the baseline's definition)"
	}
	return fmt.Sprintf("membership live, views %s", v)
}
