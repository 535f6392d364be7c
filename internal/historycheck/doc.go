// Package historycheck decides promises P1 (one owner), P2 (one unit set),
// P3 (nothing lost) and P5 (fenced takeover) of docs/design.md, and the
// completeness and duplicates of a run, from evidence: the workers'
// delivery histories (pkg/history), the list of processes the harness
// started, the registry's append-only claim and lease (and fence) history,
// the topology epochs' active intervals and the grace, and every write the
// sink took. It never asks a worker what it holds (design.md section 9,
// "Evidence, not self-report").
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
// member of the file's clock record). A record's Start is the instant its
// claim check passed; its End, when it has one after Start, the instant
// its action returned (a settle call, a handler hand-off).
//
// Delivery window. A delivery runs from the pull that brought its row (the
// deliver record's Fetch; its Start when there is none) to the End (or
// Start, when End is 0) of the record that closed it ("fetch to settle": a
// process waiting on a pull of a unit is pulling it): the first ack, nak,
// term, abandon or withheld record that follows it in the same process
// with the same unit, epoch and row id, preferring the open delivery with
// the same NumDelivered when the closing record names one, else the oldest
// open one. A delivery nothing closed runs to its process's end, the
// latest instant of any record of that process after its clock record: its
// handler may have been working until then. With a registry, a window
// ends no later than its member's lease of the record's incarnation
// stopped being live (the first instant from its start at which the lease
// event holding is of another incarnation, a leave, or expired; of any
// incarnation, the one holding at the start, when the record names none):
// a process whose lease lapsed (paused inside its handler, cut off) is no
// longer the owner anyone else waits for, and what it does afterwards is
// judged by the token checks of its settles and sink writes. A window left
// open across a release while the lease is live stays open: a handler
// still working after its member gave the unit up overlaps the next
// owner. An ack, nak or term that follows no delivery of its row is an
// action on the unit all the same: it gets the window [Start, End] of its
// own record.
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
// carries is valid. A deliver, ack, nak or term record with an End after
// its Start is judged at both instants: at End the unit must not have
// become another token's (the claim holding just before End is not held
// or handed over by another owner or at another epoch), so a check passed
// before a pause and acted on after the takeover fails. Failures are
// "deliveries outside claim", "stale acks" and "stale writes".
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
// P2 needs Epochs: without any it fails (no evidence, no verdict); it is
// n/a only with NoRegistry.
//
// P5. Judged from the registry's own history, per unit, each claim event
// against the one before it; Input.Grace is the grace (zero fails P5, as
// no verdict). Every event that gives the unit to a member (Op "claim",
// "adopt", "rehome" or "settle", State "held") needs that member's lease
// on record at its At, and, but for a "rehome" (a confirmation moves a
// member's own units onto its new incarnation whatever its fence), not
// Fenced. An "adopt" also needs the adopter's
// FenceLiftedAt, if any, at least the grace before it, and, when the
// previous event held the unit for another member, that member's lease
// event holding at At (of any incarnation: a rejoined member protects its
// units) to be Left or to expire at least the grace before At. A "rehome"
// (from an earlier incarnation of the same member) needs the last lease
// event of the previous holder's incarnation at or before At to be Left or
// to expire at least the grace before At: that incarnation may still be
// delivering until then. Any other event that gives a unit held (not
// handed over) by another member or incarnation to someone needs that
// holder's lease over (Left, or expired by At): two valid claims on one
// unit at one instant fail. A holder without a lease on record fails.
// A "recover" event (the registry's Recover after a failover moving the
// token of the holder the promoted standby knew) gives the unit to nobody
// and is not judged; an event that gives the unit to someone right after
// one or more of them is judged as above against the recover event, and
// also against the holder before the recovery (as the lost primary's
// history shows it): that holder's latest lease expiry on record, of any
// of its events, plus the grace, must be at or before At.
//
// P3. Every row id of Published appears in Sink; otherwise it is lost.
//
// Histories. Every ExpectedProcess (each process the harness started, each
// incarnation of a pod) must have a history: one of its Member (from the
// clock record) whose file name "<member>-<pid>-<mono>" carries its PID
// (any unclaimed one of the Member when PID is 0, matched after those with
// a PID). A history that ended in a partial record (Truncated) passes only
// for an Abrupt process (killed, or running when the evidence was read): a
// SIGKILL may cost one partial record, nothing more. A history of no
// listed process fails too (the list would not be the whole run), and so
// does a nil Expected: no list, no verdict. Reported as "histories missing
// or cut".
//
// Completeness. Every SinkWrite matches a deliver record with the same
// RowID, Member and Epoch, of any process, that started at or before the
// write; an unmatched write is "unrecorded", a delivery that escaped the
// history, and fails the run.
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
// Per-key order. Input.Keys gives rows a key and a sequence number (the
// publisher's: 1, 2, 3 ... per key). A keyed row's first delivery is the
// Start of its earliest deliver record (any process); its acknowledgement
// is the Start of its earliest ack or term record whose settle reported no
// error (the instant the ack was sent: a barrier that reads the consumer's
// ack floor cannot have seen it earlier, so a later row delivered after it
// is never counted); its unit is the unit of its last deliver record. A
// row j is out of order when some row i of its key with a smaller Seq was
// acknowledged strictly after j's first delivery. It is a cross-unit
// inversion when some such i is of another unit than j (a change of N or V
// moved the key while i still waited in its old unit), else a reorder
// within the unit (NATS redelivered i after j: at-least-once). Each row
// counts once, cross-unit first. Rows never delivered are not judged, and
// rows never acknowledged judge no later row (P3 and the duplicates judge
// them). Cross-unit inversions fail the run only when Input.Ordering is
// PerKey (an unknown Ordering is judged as PerKey, and fails); otherwise
// they are information, as reorders within a unit always are. PerKey with
// no keyed row delivered fails: no evidence, no verdict.
//
// NoRegistry. A baseline without claims (the independent strategy): P1
// overlap, P3, histories, completeness (matching RowID and Member only) and
// duplicates are computed as above, and per-key order too; claim
// validity, P2 and P5 are n/a.
//
// # Cost
//
// Check sorts once and sweeps: claim and lease events are indexed per unit
// and per member and searched by binary search, and overlapping pairs are
// counted without being enumerated, so a history of hundreds of thousands of
// records takes well under a second.
package historycheck
