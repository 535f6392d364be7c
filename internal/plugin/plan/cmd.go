// Package plan is "kubectl shardkeeper plan NAME": the change of N or V a
// ShardTopology proposes or rolls out, as the operator computed it from
// the live members and their claims (status.plan): units added, removed
// and moved, per pod, the estimated duration, the hash approve needs, and
// the steps in the API's vocabulary. With --from/--to/--members it is
// offline arithmetic over the capped rendezvous placement, reading
// nothing.
package plan

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
)

// StepDoc says in a line what each step of a topology change does; the
// keys are the API's step names, which status.rollout.step reports too.
var StepDoc = map[string]string{
	topologyv1.StepApprove:   "a person approves this plan by its hash (spec.rollout.approval: Manual only)",
	topologyv1.StepProvision: "the new units' streams and consumers are created; nothing moves",
	topologyv1.StepFreeze:    "the new epoch is written as pending: every member stops taking new claims and acknowledges it; held units keep flowing",
	topologyv1.StepActivate:  "the new epoch becomes active once every live member acknowledged the freeze",
	topologyv1.StepHandOver:  "owners of moved units stop fetching, let delivered rows settle, unpin and release",
	topologyv1.StepClaim:     "new owners claim the released and added units",
	topologyv1.StepRetire:    "units that left are drained to zero pending, released and their consumers deleted",
}

// maxListedUnits is how many units a step lists unless --units.
const maxListedUnits = 8

type options struct {
	f        *plugin.Factory
	from, to string
	members  int
	workload string
	epoch    int64
	allUnits bool
	output   string
}

// NewCmd returns the plan command.
func NewCmd(f *plugin.Factory) *cobra.Command {
	o := &options{f: f}
	cmd := &cobra.Command{
		Use:   "plan [NAME | --from NxV --to NxV --members N]",
		Short: "Show the change of N or V a ShardTopology proposes or rolls out, per pod, with its hash",
		Long: `With NAME: reads the ShardTopology and shows the plan the operator computed
from the live members and their claims (status.plan): units added, removed
and moved, per pod, the estimated duration, and the hash that
kubectl shardkeeper approve needs under spec.rollout.approval: Manual.

With --from, --to and --members instead: offline arithmetic, reading
nothing. Members are <workload>-0..N-1 in slots 0..N-1 holding the units
placement gives them; a live fleet may differ.`,
		Example: `  kubectl shardkeeper plan ingest
  kubectl shardkeeper plan --from 4x8 --to 4x16 --members 4`,
		Args: func(_ *cobra.Command, args []string) error {
			switch {
			case len(args) > 1:
				return plugin.Usagef("at most one NAME, got %q", args)
			case len(args) == 1 && o.from != "":
				return plugin.Usagef("give NAME for the live plan or --from/--to/--members for an offline one, not both")
			case len(args) == 0 && o.from == "":
				return plugin.Usagef("give a ShardTopology NAME, or --from NxV --to NxV --members N")
			}
			return nil
		},
		ValidArgsFunction: f.CompleteTopologies,
		RunE: func(_ *cobra.Command, args []string) error {
			if err := plugin.CheckDataFormat(o.output); err != nil {
				return err
			}
			if len(args) == 1 {
				return o.live(args[0])
			}
			return o.offline()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.from, "from", "", "offline: N x V now, e.g. 4x8")
	fl.StringVar(&o.to, "to", "", "offline: N x V after the change, e.g. 4x16")
	fl.IntVar(&o.members, "members", 0, "offline: live worker pods")
	fl.StringVar(&o.workload, "workload", "worker", "offline: StatefulSet name; pods are <workload>-<ordinal>")
	fl.Int64Var(&o.epoch, "epoch", 1, "offline: the active topology epoch")
	fl.BoolVar(&o.allUnits, "units", false, "offline: list every unit a step moves, not only the first few")
	fl.StringVarP(&o.output, "output", "o", "", "json or yaml (the plan alone); default a human view")
	return cmd
}

func (o *options) live(name string) error {
	return o.f.WithTopology(name, func(ctx context.Context, c client.Client, t *topologyv1.ShardTopology) error {
		p := t.Status.Plan
		if p == nil {
			if o.output != "" {
				return fmt.Errorf("shardtopology %s/%s has no plan in status", t.Namespace, t.Name)
			}
			return printNoPlan(o.f.Out, t)
		}
		if o.output != "" {
			return plugin.WriteData(o.f.Out, o.output, "plan", p)
		}
		return PrintLive(o.f.Out, t)
	})
}

func printNoPlan(w io.Writer, t *topologyv1.ShardTopology) error {
	a := t.Status.ActiveEpoch
	switch {
	case a == nil:
		fmt.Fprintf(w, "shardtopology %s/%s has no active epoch yet: the first epoch (%dx%d) needs no plan.\n",
			t.Namespace, t.Name, t.Spec.Partitions, t.Spec.ShardsPerPartition)
	case t.Status.Rollout != nil:
		fmt.Fprintf(w, "shardtopology %s/%s: a %s rollout is at step %s; kubectl shardkeeper status %s shows it.\n",
			t.Namespace, t.Name, t.Status.Rollout.Kind, t.Status.Rollout.Step, t.Name)
	case a.Partitions == t.Spec.Partitions && a.ShardsPerPartition == t.Spec.ShardsPerPartition:
		fmt.Fprintf(w, "No change: the spec (%dx%d) is the active epoch %d. To see a change before making it: kubectl shardkeeper plan --from %dx%d --to NxV --members N\n",
			t.Spec.Partitions, t.Spec.ShardsPerPartition, a.Number, a.Partitions, a.ShardsPerPartition)
	default:
		fmt.Fprintf(w, "shardtopology %s/%s wants %dx%d but the operator has not published a plan yet (observed generation %d of %d).\n",
			t.Namespace, t.Name, t.Spec.Partitions, t.Spec.ShardsPerPartition, t.Status.ObservedGeneration, t.Generation)
	}
	return nil
}

// PrintLive writes status.plan of t: the change, per pod, the steps and
// how to approve it.
func PrintLive(w io.Writer, t *topologyv1.ShardTopology) error {
	p := t.Status.Plan
	from := "-"
	if p.From != nil {
		from = fmt.Sprintf("epoch %d (%dx%d)", p.From.Number, p.From.Partitions, p.From.ShardsPerPartition)
	}
	est := "-"
	if p.EstimatedDuration != nil {
		est = p.EstimatedDuration.Duration.String()
	}
	fmt.Fprintf(w, "Plan %s (%s) for shardtopology %s/%s\n", p.Hash, p.State, t.Namespace, t.Name)
	fmt.Fprintf(w, "Change %s -> %s: %d units stay put, %d move, %d added, %d removed; about %s before Retire.\n\n",
		from, p.To, p.UnitsKept, p.UnitsMoved, p.UnitsAdded, p.UnitsRemoved, est)
	var tot topologyv1.PodPlan
	rows := make([][]string, 0, len(p.Pods)+1)
	for _, pod := range p.Pods {
		rows = append(rows, podRow(pod.Name, pod))
		tot.Before, tot.After, tot.MovedIn, tot.MovedOut = tot.Before+pod.Before, tot.After+pod.After, tot.MovedIn+pod.MovedIn, tot.MovedOut+pod.MovedOut
		tot.Added, tot.Removed = tot.Added+pod.Added, tot.Removed+pod.Removed
	}
	if len(p.Pods) == 0 {
		fmt.Fprintln(w, "No live worker: nothing moves; the units are claimed by whoever joins.")
	} else if err := plugin.PrintTable(w, []string{"pod", "before", "after", "moved in", "moved out", "added", "removed"}, append(rows, podRow("total", tot))); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nSteps:")
	i := 0
	for _, s := range topologyv1.TopologySteps {
		if s == topologyv1.StepApprove && t.Spec.Rollout.Approval != topologyv1.ApprovalManual {
			continue
		}
		i++
		fmt.Fprintf(w, "%d. %-9s %s\n", i, s, StepDoc[s])
	}
	if p.State == topologyv1.PlanProposalReady {
		fmt.Fprintf(w, "\nApprove it with: kubectl shardkeeper approve %s --hash %s\n", t.Name, p.Hash)
	}
	return nil
}

func podRow(name string, p topologyv1.PodPlan) []string {
	return []string{name, itoa(int(p.Before)), itoa(int(p.After)), itoa(int(p.MovedIn)), itoa(int(p.MovedOut)), itoa(int(p.Added)), itoa(int(p.Removed))}
}

func (o *options) offline() error {
	from, err := parseShape("--from", o.from)
	if err != nil {
		return err
	}
	if o.to == "" {
		return plugin.Usagef("--to is required with --from, e.g. --to 4x16")
	}
	to, err := parseShape("--to", o.to)
	if err != nil {
		return err
	}
	if o.members < 1 {
		return plugin.Usagef("--members must be at least 1, got %d", o.members)
	}
	members := make([]ownership.Member, o.members)
	for i := range members {
		members[i] = ownership.Member{Name: o.workload + "-" + strconv.Itoa(i), Ordinal: i, Slot: ownership.Slot(i)}
	}
	p, err := ownership.PlanChange(ownership.ChangeInput{Epoch: o.epoch, From: from, To: to, Members: members, Claims: ownership.ClaimsOf(from, members)})
	if err != nil {
		return err
	}
	if o.output != "" {
		return plugin.WriteData(o.f.Out, o.output, "plan", p)
	}
	return PrintOffline(o.f.Out, p, o.allUnits)
}

// parseShape reads "NxV".
func parseShape(flag, v string) (ownership.Topology, error) {
	n, s, ok := strings.Cut(strings.ToLower(v), "x")
	pn, err1 := strconv.Atoi(n)
	sn, err2 := strconv.Atoi(s)
	if !ok || err1 != nil || err2 != nil || pn < 1 || sn < 1 {
		return ownership.Topology{}, plugin.Usagef("%s must be partitions x shards such as 4x8, got %q", flag, v)
	}
	return ownership.Topology{Partitions: pn, Shards: sn}, nil
}

// PrintOffline writes an offline plan: the members table and the steps
// with the units each moves.
func PrintOffline(w io.Writer, p ownership.Plan, allUnits bool) error {
	d := ownership.Diff(p.From, p.To)
	t := p.Totals()
	fmt.Fprintf(w, "Change %s -> %s (epoch %d -> %d) over %d members: %d units kept (%d stay put, %d move), %d added, %d removed.\n\n",
		p.From, p.To, p.FromEpoch, p.ToEpoch, len(p.Members), len(d.Kept), t.Kept, t.MovedIn, len(d.Added), len(d.Removed))
	rows := make([][]string, 0, len(p.Members)+1)
	row := func(name string, c ownership.MemberChange) []string {
		return []string{name, itoa(c.Before), itoa(c.After), itoa(c.Kept), itoa(c.MovedIn), itoa(c.MovedOut), itoa(c.Added), itoa(c.Retired)}
	}
	for _, m := range p.Members {
		rows = append(rows, row(m.Member, m))
	}
	if err := plugin.PrintTable(w, []string{"pod", "before", "after", "kept", "moved in", "moved out", "added", "removed"}, append(rows, row("total", t))); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nSteps:")
	moves := map[string][]ownership.Move{}
	for _, st := range p.Steps {
		moves[string(st.Name)] = st.Moves
	}
	i := 0
	for _, s := range topologyv1.TopologySteps {
		if s == topologyv1.StepApprove {
			continue
		}
		i++
		fmt.Fprintf(w, "%d. %-9s %s\n", i, s, StepDoc[s])
		if mv := moves[s]; len(mv) > 0 {
			fmt.Fprintf(w, "   %d units: %s\n", len(mv), moveList(mv, allUnits))
		}
	}
	return nil
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
