package sim

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/poolctl/twinhook"
)

// The simulator's own mutations: rules of the registry and the sink
// broken on purpose. The member's mutations belong to the member (its
// core) and reach it through MemberEnv.Mutation.
const (
	MutAdoptLive   = "adopt-while-lease-live"
	MutNoGrace     = "no-grace"
	MutNoSinkGuard = "no-sink-write-guard"
	// MutHidePendingBarrier shows an order barrier to members only once
	// its epoch is active: the operator that wrote it at the activation
	// (issue 24), which let a member that kept a unit across the
	// activation deliver moved keys' rows before it read the barrier.
	MutHidePendingBarrier = "barrier-hidden-while-pending"
	// MutMarkPastPending records a drained-to mark at the last row
	// delivered even when rows other than the held ones are pending
	// (in a handler, nak'd, or a dead predecessor's): natsops.MarkOf
	// without its count.
	MutMarkPastPending = "mark-past-pending-rows"
)

// WorldMutations lists the simulator's own mutations.
var WorldMutations = []string{MutAdoptLive, MutNoGrace, MutNoSinkGuard, MutHidePendingBarrier, MutMarkPastPending}

// mutations is what a run breaks on the simulator's side.
type mutations struct {
	registry        string
	noSinkGuard     bool
	markPastPending bool
}

func parseMutation(name string) mutations {
	switch name {
	case MutAdoptLive, MutNoGrace, MutHidePendingBarrier:
		return mutations{registry: name}
	case MutNoSinkGuard:
		return mutations{noSinkGuard: true}
	case MutMarkPastPending:
		return mutations{markPastPending: true}
	}
	return mutations{}
}

func (m mutations) applyRegistry(t *poolctl.Twin) error {
	if m.registry == "" {
		return nil
	}
	return twinhook.Mutate(t, m.registry)
}

// MutationSeeds is the search budget per mutation (issue 19/20: every
// mutation caught within 10,000 seeds).
const MutationSeeds = 10000

// MutationRow is one line of the mutation table.
type MutationRow struct {
	Mutation, CaughtBy string
	// Seeds is how many seeds the search ran until the first failing one
	// (the failing seed + 1, counting from seed 0); 0 when not caught.
	Seeds int64
	First string
}

// RunMutations applies each mutation in turn and searches seeds 0.. until
// one fails, at most budget seeds each.
func RunMutations(names []string, newMember func(MemberEnv) Member, budget int64, progress func(MutationRow)) []MutationRow {
	var rows []MutationRow
	for _, m := range names {
		s := Sweep{From: 0, Count: budget, Config: Config{Mutation: m, NewMember: newMember}, StopAtFirst: true, KeepFailures: 1}.Run()
		row := MutationRow{Mutation: m, CaughtBy: "not caught"}
		if s.FirstFailing >= 0 {
			row.Seeds, row.First, row.CaughtBy = s.FirstFailing+1, s.Failed[0].First(), CaughtBy(s.Failed[0].First())
		}
		rows = append(rows, row)
		if progress != nil {
			progress(row)
		}
	}
	return rows
}

// MutationTable renders rows as the README shows them.
func MutationTable(rows []MutationRow) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "mutation\tcaught by\tseeds")
	for _, r := range rows {
		seeds := fmt.Sprint(r.Seeds)
		if r.Seeds == 0 {
			seeds = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", r.Mutation, r.CaughtBy, seeds)
	}
	_ = w.Flush()
	return b.String()
}

// Unreachable names the mutations the simulator's model cannot reach, and
// why. Each is a known survivor: reported, not failed. Anything else that
// survives fails make mutate and TestMutationsAreCaught.
var Unreachable = map[string]string{
	"stale-incarnation-gives-up": "a process's join that lands while its own incarnation is live renews that incarnation " +
		"(poolctl's ownIncarnation), so the core meets its own later incarnation only when a late join lands after the " +
		"process's lease lapsed, within two query bounds of being sent: not found in 10,000 seeds; member's scripted " +
		"scenario \"the member's own delayed join does not displace it\" catches it (TestEveryMutationIsCaughtByAScript)",
	"freeze-ack-across-rejoin": "calls honour their query bound (as pgx does), so an acknowledgement's outcome reaches the core " +
		"within the bound plus a posting delay, and a rejoin inside that window needs the lease to lapse between the " +
		"acknowledgement's commit and a renewal's: not found in 10,000 seeds; member's scripted scenario \"a freeze " +
		"acknowledgement counts only for its incarnation\" catches it (TestEveryMutationIsCaughtByAScript), and pkg/worker's " +
		"TestAFreezeAcknowledgementReturningAfterARejoinIsSentAgain on the real parts, holding the reply past the deadline",
	"recovery-confirm-applied-fenced": "it needs a member fenced mid-renewal whose puller for a unit stopped before " +
		"the recovery's confirmation came back naming that unit as being handed over: not found in 10,000 seeds, and " +
		"why the simulated fleet never lines a handover up with a recovery so is not yet known (a fleet that records " +
		"handover intents while a member is fenced would be the model to add); member's scripted scenario \"a " +
		"recovery's confirmation of a handover continues it when the puller already stopped\" catches it " +
		"(TestEveryMutationIsCaughtByAScript), and pkg/worker's TestRecoveryDoesNotRestartAUnitInHandover on the real parts",
}
