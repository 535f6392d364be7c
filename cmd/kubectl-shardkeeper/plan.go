package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// planFlags are the flags of "plan".
type planFlags struct {
	from, to ownership.Topology
	members  int
	workload string
	epoch    int64
	format   string
	allUnits bool
}

// stepDoc says in a line what each step does, for people reading a plan.
var stepDoc = map[ownership.StepName]string{
	ownership.StepFreeze:      "every member stops taking new claims and acknowledges the epoch; held units keep flowing",
	ownership.StepActivate:    "the new epoch becomes active once every member acknowledged the freeze",
	ownership.StepHandOver:    "owners stop fetching, let delivered rows settle, unpin and release",
	ownership.StepClaim:       "new owners claim the released and added units",
	ownership.StepRetire:      "units that left are drained to zero pending, released and deleted",
	ownership.StepVerifyEmpty: "the registry shows the pod holds nothing",
	ownership.StepRestart:     "the pod is deleted and replaced",
	ownership.StepRejoin:      "the new pod joins with its old slot",
}

// maxListedUnits is how many units a step lists in a table unless --units.
const maxListedUnits = 8

func runPlan(args []string) error {
	f, err := parsePlanFlags(args)
	if err != nil {
		return err
	}
	members := make([]ownership.Member, f.members)
	for i := range members {
		members[i] = ownership.Member{Name: f.workload + "-" + strconv.Itoa(i), Ordinal: i, Slot: ownership.Slot(i)}
	}
	p, err := ownership.PlanChange(ownership.ChangeInput{
		Epoch: f.epoch, From: f.from, To: f.to, Members: members, Claims: ownership.ClaimsOf(f.from, members),
	})
	if err != nil {
		return err
	}
	if f.format == formatJSON {
		return printJSON(stdout, p)
	}
	return printPlan(stdout, p, f.allUnits)
}

func parsePlanFlags(args []string) (planFlags, error) {
	var f planFlags
	fs := newFlagSet("plan")
	fs.IntVar(&f.from.Partitions, "partitions", 0, "N, partitions now (required)")
	fs.IntVar(&f.from.Shards, "shards", 0, "V, shards per partition now (required)")
	fs.IntVar(&f.to.Partitions, "to-partitions", 0, "N after the change (default: unchanged)")
	fs.IntVar(&f.to.Shards, "to-shards", 0, "V after the change (default: unchanged)")
	fs.IntVar(&f.members, "members", 0, "live worker pods (required)")
	fs.StringVar(&f.workload, "workload", "worker", "StatefulSet name; pods are <workload>-<ordinal>")
	fs.Int64Var(&f.epoch, "epoch", 1, "the active topology epoch")
	fs.BoolVar(&f.allUnits, "units", false, "list every unit a step moves, not only the first few")
	format := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, err
		}
		return f, fmt.Errorf("%w: %w", errUsage, err)
	}
	f.format = *format
	if fs.NArg() > 0 {
		return f, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if f.from.Partitions == 0 || f.from.Shards == 0 || f.members == 0 {
		return f, fmt.Errorf("%w: --partitions, --shards and --members are required", errUsage)
	}
	if f.to.Partitions == 0 {
		f.to.Partitions = f.from.Partitions
	}
	if f.to.Shards == 0 {
		f.to.Shards = f.from.Shards
	}
	return f, checkFormat(f.format)
}

func printPlan(w io.Writer, p ownership.Plan, allUnits bool) error {
	d := ownership.Diff(p.From, p.To)
	t := p.Totals()
	fmt.Fprintf(w, "Change %s -> %s (epoch %d -> %d) over %d members: %d units kept (%d stay put, %d move), %d added, %d retired.\n\n",
		p.From, p.To, p.FromEpoch, p.ToEpoch, len(p.Members), len(d.Kept), t.Kept, t.MovedIn, len(d.Added), len(d.Removed))
	if err := printTable(w, []string{"member", "before", "after", "kept", "moved in", "moved out", "added", "retired"}, memberRows(p)); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nSteps:")
	for i, st := range p.Steps {
		fmt.Fprintf(w, "%d. %s epoch %d: %s\n", i+1, st.Name, st.Epoch, stepDoc[st.Name])
		if len(st.Moves) > 0 {
			fmt.Fprintf(w, "   %d units: %s\n", len(st.Moves), moveList(st.Moves, allUnits))
		}
	}
	return nil
}

func memberRows(p ownership.Plan) [][]string {
	row := func(name string, c ownership.MemberChange) []string {
		return []string{name, itoa(c.Before), itoa(c.After), itoa(c.Kept), itoa(c.MovedIn), itoa(c.MovedOut), itoa(c.Added), itoa(c.Retired)}
	}
	rows := make([][]string, 0, len(p.Members)+1)
	for _, m := range p.Members {
		rows = append(rows, row(m.Member, m))
	}
	return append(rows, row("total", p.Totals()))
}

// moveList shows moves as "unit from->to", the first few unless all.
func moveList(moves []ownership.Move, all bool) string {
	n := len(moves)
	if !all {
		n = min(n, maxListedUnits)
	}
	parts := make([]string, 0, n+1)
	for _, mv := range moves[:n] {
		parts = append(parts, fmt.Sprintf("%s %s->%s", mv.Unit, orNone(mv.From), orNone(mv.To)))
	}
	if n < len(moves) {
		parts = append(parts, fmt.Sprintf("... (%d more, --units lists all)", len(moves)-n))
	}
	return strings.Join(parts, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func itoa(n int) string { return strconv.Itoa(n) }
