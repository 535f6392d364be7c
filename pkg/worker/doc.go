// Package worker is the SDK an ingest process embeds to take part in a
// shardkeeper fleet. A Worker joins the PostgreSQL registry, renews its
// lease, places the active topology epoch's units over the live members,
// hands over what it should no longer own, claims what it should, and pulls
// the units it holds from their JetStream consumers, passing each row to the
// Handler with its unit and fencing epoch.
//
// Safety comes from three rules the Worker keeps on its own:
//
//   - It delivers and acknowledges a unit's rows only while it holds the
//     unit's claim and is not fenced (P1).
//   - It fences itself on its own monotonic clock before the registry could
//     see its lease as expired: at the instant the renewal that granted the
//     lease was sent, plus the lease TTL, minus a margin (P5).
//   - It claims only under the active topology epoch, and stops claiming
//     while a new epoch is pending, after acknowledging the freeze (P2).
//
// The registry (internal/poolctl) enforces the same rules on its side, so a
// Worker that is wrong about its own state is refused rather than believed.
//
// All membership state (lease, fence, claims, handovers, pullers' life)
// lives in one state machine, internal/member, stepped by one goroutine;
// this package is its driver: it performs the registry calls and NATS
// requests the core asks for and feeds their replies back, tagged with the
// request they answer.
//
// The package owns the worker's driver, its NATS pulling and its metrics.
// It does not own placement (internal/ownership), the registry's rules
// (internal/poolctl) or what a row means (the Handler).
package worker
