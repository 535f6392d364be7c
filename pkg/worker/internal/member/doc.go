// Package member is the protocol core of a fleet member: every piece of a
// worker's membership state (lease, fence, claims, handovers, pullers'
// lifecycle, freeze acknowledgement) in one state machine with one writer.
//
// It is shaped after etcd's raft: the caller feeds events into Core.Step
// (a tick, a timer, a reply to a registry call tagged with the request it
// answers, a puller's report, a shutdown) and performs the actions Step
// returns (registry calls, each with a fresh request id, UNPIN, starting,
// draining and stopping pullers, publishing the delivery permission,
// setting the timer). The core does no IO, starts no goroutine and never
// reads a clock: time comes in with each event as a monotonic duration.
// So the same core runs under pkg/worker's real driver and under a
// deterministic simulator that chooses the order of every reply.
//
// The caller's side of the contract: every action with a Req gets exactly
// one reply event with that Req (a call that timed out or whose reply was
// lost is answered with its error: the core takes any error that is not
// one of the registry's refusals as an unknown outcome); every StartPuller
// gets exactly one PullerStopped; Publish takes effect before the next
// action is performed; a Timer comes at or after the last SetTimer's
// instant. Replies may come in any order and late: the core drops those
// that no longer answer a current question.
//
// Rules the core keeps, each the answer to a defect of the goroutines and
// mutex it replaces (issue 20):
//
//   - A reply is applied only while it still answers the current question:
//     its request id is the one in flight, and for per-unit answers (a
//     confirmation) the unit has not changed since the question was asked.
//   - A reply whose outcome is unknown (timeout, lost, cancelled) leads to a
//     confirmation (ConfirmOwned), never to a guess.
//   - A freeze acknowledgement counts only for the incarnation it was sent
//     under.
//   - A member whose incarnation was superseded (ErrStaleIncarnation)
//     rejoins naming the incarnation it held and its process; it gives up
//     for good (Done with an error) only when the registry refuses that
//     (ErrDisplaced): a later incarnation granted to another process under
//     the same name is live. The name is then the later process's, and two
//     processes under one name that rejoin take turns displacing each
//     other. A later incarnation that was this process's own join, arrived
//     late, does not displace it.
//   - A unit being handed over is never given a puller again, and UNPIN is
//     sent once, before the first release, and never while fenced.
//   - Drains and stops are bounded even when a handler ignores its context.
//
// The package owns no placement rule (internal/ownership, called from
// here), no registry rule (internal/poolctl) and no NATS call (the driver).
package member
