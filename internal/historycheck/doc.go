// Package historycheck decides promises P1 (one owner), P2 (one unit set)
// and P3 (nothing lost) of docs/design.md, and the completeness and
// duplicates of a run, from evidence: the workers' delivery histories
// (pkg/history), the registry's append-only claim and lease history, the
// topology epochs' active intervals, and every write the sink took. It
// never asks a worker what it holds (design.md section 9, "Evidence, not
// self-report").
//
// It does not collect the evidence. Its input types are its own; adapters
// that read the registry or the sink into them live with the test harness,
// so this package needs no PostgreSQL, NATS or worker to run.
//
// # Definitions
//
// These are the project's definitions of the checks; tests and benchmarks
// quote them.
//
// Times. Delivery records carry CLOCK_MONOTONIC; each is put on the wall
// clock with its Process's MonoToWall and then compared with registry and
// sink times (one machine: PostgreSQL's clock_timestamp is CLOCK_REALTIME).
// All comparisons are in nanoseconds.
//
// Claim validity. Per unit, ClaimEvents are sorted by At (events with equal
// At keep their input order); an event's (Owner, Incarnation, Epoch, State)
// holds from its At until the unit's next event. A token (unit, member,
// epoch) is valid at instant x iff the unit's event holding at x has
// Owner == member, Epoch == epoch and State "held" or "handover", and that
// member's lease for the event's Incarnation is live at x: the member's
// latest LeaseEvent with At <= x has the same Incarnation, is not Left, and
// has ExpiresAt > x. Beyond that, a record that names its Incarnation (not
// 0) is valid only if it is the claim's (when the claim names one too): a
// zombie process of an earlier incarnation of the same pod does not borrow
// its successor's claim.
//
// Records. A record without a Member is taken to be its process's (the
// member of the file's clock record).
//
// Delivery window. A delivery runs from the pull that brought its row (the
// deliver record's Fetch; its Start when there is none) to the End (or
// Start, when End is 0) of the ack, nak or term record that settled it
// ("fetch to settle": a process waiting on a pull of a unit is pulling it):
// the first such record that follows it in the same process with the same
// unit, epoch and row id, preferring the open delivery with the same
// NumDelivered when the settle record names one, else the oldest open one.
// An abandon or withheld record that follows a delivery the same way closes
// it unsettled. A delivery never settled (withheld, abandoned, or the
// process died) has only its start instant, a zero-length window: it took no
// action on NATS after its start, and its sink write, if any, is judged by
// the stale-write check. An ack, nak or term that follows no delivery of its
// row is an action on the unit all the same: it gets the window
// [Start, End] of its own record.
//
// Pulled by two. A fetch record is a window of its process pulling its
// unit, rows or not. Units whose fetch windows of two processes overlap
// are counted ("units pulled by two processes", what field reports count),
// as information: a process paused inside a pull is pulling without being
// able to act, so this is not a P1 check.
//
// P1 overlap. Windows are closed intervals [s, e]. Two windows of different
// processes on one unit overlap iff s1 < e2 and s2 < e1: they share an
// instant that lies strictly inside at least one of them. So a window ending
// at the very instant another starts is not an overlap, nor are two
// zero-length windows at one instant, but a zero-length window strictly
// inside another one is. Windows of one process never overlap each other
// (a process may run handlers concurrently). Reported: the number of
// overlapping pairs, the units with at least one, and the largest number of
// units whose overlaps (the intersections of overlapping pairs) contain one
// instant.
//
// P1 deliveries, acks and writes. A deliver record's Start, an ack, nak or
// term record's Start (the claim check before settling) and a SinkWrite's
// At must each be an instant at which the token (Unit, Member, Epoch) it
// carries is valid. Failures are "deliveries outside claim", "stale acks"
// and "stale writes".
//
// P2. (a) A claim event with Op "claim" or "adopt" must have At inside an
// active interval [ActivatedAt, RetiredAt) of its Under epoch (a zero
// RetiredAt means still active; a zero ActivatedAt means never active), and
// its unit must be in that epoch's shape, unless it is leaving: in the shape
// of an epoch numbered below Under but not in Under's, which is a drain
// adoption. (b) A delivery's unit must be in the shape of some epoch
// activated at or before the delivery's start: either the active epoch, or
// an earlier one the unit is leaving (drained under its own claim). A unit
// of a not-yet-active epoch is a violation. (c) No two epochs' active
// intervals intersect: the design has exactly one active epoch at a time.
// P2 needs Epochs: without any it is reported n/a, like with NoRegistry.
//
// P3. Every row id of Published appears in Sink; otherwise it is lost.
//
// Completeness. Every SinkWrite matches a deliver record with the same
// RowID, Member and Epoch, of any process; an unmatched write is
// "unrecorded", a delivery that escaped the history, and fails the run.
//
// Duplicates. A row id written to the sink n > 1 times has n-1 duplicates:
// each write after the first, taken in At order, against the write just
// before it. Each write is matched to its delivery: of the deliveries with
// its row id, member and epoch, the latest that started at or before the
// write, else the first. A duplicate is explained, in this order of
// precedence, by
//
//   - takeover: the earlier write's delivery was never acked by its process;
//   - reset: a KindReset record of the unit lies strictly between the
//     earlier write's delivery and the later one (the writes' At when a
//     delivery is missing);
//   - redelivery: the later delivery's NumDelivered > 1 (NATS itself says
//     the ack did not land).
//
// Otherwise it is unexplained, and fails the run.
//
// NoRegistry. A baseline without claims (the independent strategy): P1
// overlap, P3, completeness (matching RowID and Member only) and duplicates
// are computed as above; claim validity and P2 are n/a.
//
// # Cost
//
// Check sorts once and sweeps: claim and lease events are indexed per unit
// and per member and searched by binary search, and overlapping pairs are
// counted without being enumerated, so a history of hundreds of thousands of
// records takes well under a second.
package historycheck
