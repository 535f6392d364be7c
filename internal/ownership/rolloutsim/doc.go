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
// # independent
//
// What fleets do today. Every worker reads N and V once, at start, and pulls
// the units of its own topology that capped rendezvous (ownership.Place, the
// same hash sequenced uses, so the comparison is about sequencing and not
// about hash quality) puts on its slot over the slots it believes live. Pods
// restart one at a time in the restart order and come back with the new N
// and V; a pod pulls nothing while down. Membership views lag: with Stale
// views (the default) a running worker sees the members of the previous
// step, since a departure is noticed when a lease or endpoint expires and an
// arrival at the next poll; a pod that starts sees the members of the moment
// it starts. With Fresh views everyone sees every change at once, which
// leaves only the cost of hashing two unit sets at the same time. The run
// ends with a step where every view has caught up and publishers switch.
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
// Field reports for independent (N=4, V 8 to 16: 3-4 units pulled by nobody
// and 3 by two; V 32 to 48: 2-3 and 4-6) are of the same kind but not the
// same size as these figures. A field figure is a sample taken at some
// instant, while every step here is a whole window: with Stale views the
// step that stops a pod counts all its units as unowned, and the step that
// starts it counts all it pulls as multiply-owned. Those windows last a
// lease expiry or a poll in the field, so a sample mostly falls outside
// them and sees only the units on which the two unit sets disagree, which
// is what Fresh views show. How many units the two unit sets disagree on
// depends on the hash, and the field's hash is not ours. The figures (most
// unowned and most multiply-owned at one step, 4 members, highest ordinal
// first):
//
//	                 Stale views   Fresh views   field
//	V 8 to 16 (64)   10 and 10     2 and 0       3-4 and 3
//	V 32 to 48 (192) 33 and 35     1 and 4       2-3 and 4-6
//
// With this capped hash, 32 units over 4 slots and 64 over 4 happen to agree
// on every shared unit, so V 8 to 16 with Fresh views has no multiply-owned
// unit; the field's hash evidently disagreed on a few.
package rolloutsim
