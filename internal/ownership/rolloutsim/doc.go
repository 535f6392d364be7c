// Package rolloutsim replays a topology change, step by step, under two
// strategies and counts, at every step, the units pulled by nobody and the
// units pulled by two or more members. It is the model behind
// cmd/rollout-sim and the baseline of design.md section 10.
//
// It owns the two strategy models and what is counted. It does not own the
// ownership model itself (package ownership: placement and plans), and it
// does no I/O.
//
// # What is counted
//
// A unit is counted at a step when it carries rows: it belongs to the
// topology the publishers write to, or it is an old unit not yet retired
// (it may still hold a backlog). Publishers move to the new topology when
// the consumers are ready for it ("consumers first, then producers"): under
// independent after the last pod restarted, under sequenced after the
// change's Claim step. New units before that carry no rows and are not
// counted; old units nobody retires keep counting.
//
// Among counted units, "unowned" is pulled by nobody and "multiply-owned" by
// two or more. An unowned unit is "waiting" when a plan released it and a
// later step of the same plan claims it (a handover, bounded by the drain
// timeout), and "stranded" otherwise: nothing will pull it until something
// else changes. Unit-steps add a count over steps; steps are not of equal
// length (a HandOver takes a drain, a pod restart takes much longer), so
// unit-steps compare exposure, not time. Every unowned unit of sequenced is
// waiting: P1 makes a handover release before the new owner claims, and a
// pod roll hands each pod's units over and back, so sequenced can show more
// unowned unit-steps than independent while it never strands a unit.
//
// # Figures over the whole roll
//
// Field reports count units, not unit-steps: "3 units were pulled by two
// processes during the roll". Run.Figures counts that way, each unit once:
// pulled by two is the units two or more members pulled at some step;
// pulled by nobody is the units nobody pulled at some step where every pod
// ran, so that no restart explains the gap, only the fleet's disagreement
// about who owns them (or, under sequenced, a planned handover). It also
// gives pulled by nobody with restart windows included, and the most units
// at one step. A pod that is down pulls nothing, so with restart windows
// every unit of every restarted pod goes unpulled at some step (32 of 32
// units for N=4 and V 8 to 16): a count no report of "2-4 units pulled by
// nobody" can mean.
//
// # independent
//
// What fleets do today. Every worker reads N and V once, at start, and pulls
// the units of its own topology that capped rendezvous (ownership.Place, the
// same hash sequenced uses, so the comparison is about sequencing and not
// about hash quality) puts on its slot, its ordinal. Pods restart one at a
// time in the restart order (highest ordinal first, like a StatefulSet) and
// come back with the new N and V; a pod pulls nothing while down.
// Membership says which slots a worker places over:
//
//   - Fixed (the default): the fixed slot set 0..Members-1, whoever runs.
//     This is what a fleet with a fixed replica count does, what
//     cmd/shardkeeper-worker --strategy independent does, and the
//     baseline's definition in design.md ("capped rendezvous over a fixed
//     slot set"). Pods that run one configuration agree on every unit, so
//     the only disagreement is between the two placements: a unit both
//     topologies have that moves from slot a to slot b is pulled twice from
//     b's restart until a's when b restarts first, and by nobody (while
//     every pod runs) from a's restart until b's when a restarts first. A
//     unit only the old topology has is pulled by nobody once its owner
//     restarted. The figures therefore follow from two calls to
//     ownership.Place and the restart order (the tests check exactly that).
//   - Live: the slots the worker believes live, so every restart
//     reshuffles everyone's units. With Stale views (the default) a running
//     worker sees the members of the previous step, since a departure is
//     noticed when a lease or endpoint expires and an arrival at the next
//     poll; a pod that starts sees the members of the moment it starts.
//     With Fresh views everyone sees every change at once. No fleet with a
//     fixed replica count places this way; the model is kept because
//     earlier figures were taken with it.
//
// The run ends with a step where publishers switch (and, under Live, every
// view has caught up).
//
// # sequenced
//
// The plans of package ownership, executed through ownership.State: the
// topology change (Freeze, Activate, HandOver, Claim, Retire), then a pod
// roll in the same restart order, so both strategies restart every pod.
// Every step is applied with ownership.State.Apply, which reports any step
// that would break P1 or P2.
//
// # Field reports
//
// Field reports on fleets that hash on their own over a fixed slot set
// (N=4, 4 pods): V 8 to 16, 3 units pulled by two processes; V 32 to 48,
// 4-6; 2-4 units pulled by nobody. The figures here, over the whole roll
// (pulled by two / pulled by nobody while every pod ran; in brackets the
// most at one step, restart windows included for nobody):
//
//	old units         Fixed            Live, Stale        Live, Fresh    field
//	V 8 to 16, 32     0 (0) / 3 (10)   30 (10) / 0 (10)   0 (0) / 3 (2)  3 / 2-4
//	V 32 to 48, 128   5 (4) / 1 (33)   128 (35) / 0 (33)  9 (4) / 1 (1)  4-6 / 2-4
//
// Fixed, the baseline's definition, lands inside the field's ranges for
// two of the four figures and outside for two. With this hash, placing
// 4x8 and 4x16 over slots 0..3 disagrees on 3 of the 32 shared units (1.3
// from slot 1 to 0, 2.3 from 2 to 0, 3.5 from 2 to 1), all moving to a
// lower slot, which restarts later: 3 pulled by nobody, none pulled twice,
// where the field saw 3 pulled twice. 4x32 and 4x48 disagree on 6 of 128,
// five moving up (pulled twice: inside 4-6) and one down (pulled by
// nobody: 1, below 2-4). In this model each shared unit the placements
// disagree on is pulled twice or by nobody, never both, so the field's 3
// pulled twice and 2-4 by nobody for V 8 to 16 need 5 or more such units;
// ours has 3, so the field's hash is evidently not ours. Nothing here is
// tuned to the field: the figures are what ownership.Place gives.
package rolloutsim
