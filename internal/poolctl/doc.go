// Package poolctl is the PostgreSQL ownership registry: members and their
// leases, claims on units with fencing epochs, topology epochs with the
// freeze, the write guard for sinks, and the census's RESET permission for
// workers. It makes promises P1 (one owner), P5 (fenced takeover) and P6
// (rows never absent) of design.md true, and gives P2 (one unit set) its
// registry half.
//
// It owns the schema and every statement against it. It does not place
// units (internal/ownership), talk to NATS (internal/natsops), or run the
// worker loop (pkg/worker); it exposes what they need.
//
// # Backends
//
// Registry (and HistoryReader) is implemented by PG (PostgreSQL through a
// pgx/v5 pool, built with Open from a Config holding the DSN, or with New
// from a pool) and by Twin, an in-memory twin with an injectable clock.
// Both apply the same rules (rules*.go) to the state they read, and the
// fault matrix and the property test require them to answer every call
// alike.
//
// Units are named "p.s" and every key includes a topology id, conventionally
// the ShardTopology's "namespace/name"; one registry serves many topologies.
//
// # Schema
//
// The schema lives in the shardkeeper schema and is migrated at start by
// Migrate: embedded, numbered SQL files (migrations/NNNN_name.sql) applied in
// one transaction under pg_advisory_xact_lock, recorded in
// shardkeeper.schema_migrations, so operators starting at once serialize and
// a binary older than the schema refuses it (ErrSchemaTooNew). Tables:
// topologies (lease parameters, incarnation counter), epochs (one active, at
// most one pending), freeze_acks, members (one row per pod name, kept after
// it leaves), claims (one row per unit ever claimed), retiring_units,
// member_activity (one row per member's latest activity report;
// unit_activity, one row per unit, is read until workers of the release
// before 0015 are rolled), reset_permissions, and the append-only claim_history and
// lease_history, which triggers fill so that no writer can forget them.
//
// # Sessions and locks
//
// No registry transaction holds a lock across a client round trip: each
// operation is one statement, or one pipeline (BEGIN, statements, COMMIT
// sent at once) that the server runs to the end without waiting for the
// client. A claimer or joiner SIGSTOPped or cut off between round trips
// therefore holds nothing. Operations that decide in Go (claim batches,
// Join) read without locks, decide, and then write in a pipeline whose
// first statements take the locks and whose write, in a snapshot and on a
// clock read after those locks, applies only where everything decided
// from is still as read; what changed in between is read and decided
// again. No registry statement locks a row that Renew updates, except
// Join's and Leave's FOR UPDATE of the member's own row for the length
// of their pipelines; claim batches hold the claimer's row FOR KEY SHARE,
// which plain updates (Renew, Fence, Unfence) do not wait for (issue 20,
// defect 3: a claim read that held owners' rows FOR SHARE across a round
// trip fenced healthy owners).
//
// Open sets three timeouts on every connection (Config), as backstops for
// a client cut off mid-pipeline and for sinks' guarded transactions:
// idle_in_transaction_session_timeout (1s) and lock_timeout (1.5s), both
// below the default query bound (2s), so a Renew queued behind a stalled
// session is released in time rather than failed or fenced, and
// statement_timeout (30s), which no statement that locks member rows can
// come near.
//
// # Clock
//
// Expiry is judged on the database's clock only: shardkeeper.clock is the
// primary's clock_timestamp(). No operation takes a time from its caller.
// Renew returns the lease TTL; the registry counts it from when it ran the
// request, which is never before the caller sent it, so a worker that
// fences itself at sent+TTL-margin on its own monotonic clock stops before
// the registry can see its lease as expired.
//
// Tests move a topology's clock with ShiftClock instead of sleeping. The
// offset is added only in sessions where shardkeeper.test_clock is on,
// which pgtest sets for test databases (ALTER DATABASE ... SET), and a
// trigger refuses to change it anywhere else; production cannot move its
// clock by accident (anyone who can set the setting can also edit the
// tables, so it is a guard, not a security boundary).
//
// What the registry's clock cannot do is ignore the primary's wall clock:
//   - An NTP step forward expires every lease early by the step. Members
//     fence themselves on their own monotonic clocks at sent+TTL-margin, so
//     a member still renewing on time has fenced itself before anyone can
//     adopt only if the step is smaller than its margin plus the grace; a
//     larger step lets an adoption start while the old owner still
//     delivers (the guard still refuses its writes, which carry the old
//     epoch).
//   - A step backward extends every lease by the step: a crashed member's
//     units wait longer before adoption. Safe, but slow.
//   - A failover to a replica whose clock is behind extends every lease by
//     the skew, as a step backward; one whose clock is ahead shortens them,
//     as a step forward.
//   - So: run chrony or ntpd in slewing mode (no steps once synchronized)
//     on the database hosts, and keep their skew well below the grace.
//
// History times are clock_timestamp() without the test offset (the wall
// clock of the database host), so the history checker can compare them
// with other processes' clocks; an event's time is when the change was
// made inside its transaction, which commits right after. Lease events
// carry their expiry moved onto the same clock. Epochs keep activated_at
// and retired_at on the registry's clock (they are part of its state) and
// activated_wall_at and retired_wall_at on the history's, which
// EpochHistory returns.
//
// # Decisions
//
//   - Membership. Join starts a new incarnation (numbers grow per topology)
//     and gives the member its old slot back if no live member took it,
//     otherwise the lowest slot no live member holds (taking it from a
//     member that is not live). An expired lease cannot be renewed
//     (ErrLeaseExpired): the worker joins again, with Rejoin, naming its
//     last incarnation and its process. Two live processes under one pod
//     name (a partitioned pod that heals after its replacement started)
//     would otherwise take the name from each other at every renewal, each
//     join restarting the same-name grace, so the re-home never came
//     (issue 20, defect 6): Rejoin refuses (ErrDisplaced) a process whose
//     incarnation a later one, granted to another process, superseded,
//     whether that one is still live or not. The newer process keeps the
//     name; the displaced one stops. An incarnation granted to the
//     caller's own process (a join of its own that arrived after it gave
//     up on it, or whose reply was lost) does not displace it. Leave refuses while the
//     member holds any claim (ErrStillHolding); it never releases silently.
//     Join and Renew return the topology's Params with the lease, so a
//     member knows its fence margin from its first lease.
//   - Claims. A row is absent only if the unit was never claimed. Release
//     keeps the row as free (owner NULL) with its fencing epoch, so the epoch
//     grows by one at every owner change and never goes back, across release
//     and re-claim. Free and absent units are claimable at once.
//   - Batches. Claim is ClaimMany of one unit: two round trips once its
//     statements are prepared, whatever the number of units: the read (one
//     statement, no locks), the decisions in Go, and the write pipeline,
//     which locks the claim rows FOR UPDATE in unit order (so concurrent
//     batches cannot deadlock), the active epoch FOR SHARE and the claimer
//     FOR KEY SHARE, then writes each unit in one INSERT ... ON CONFLICT
//     DO UPDATE only where its decision still holds (the claim row, the
//     claimer's incarnation, fence and grace, the owner's lease for an
//     adoption, the active epoch, all as read, and the claimer live on the
//     clock read after the locks). A unit whose rows changed is decided
//     again (up to four times, then ErrConflict). Each unit gets its own
//     outcome; the batch fails as a whole only for what concerns all of it
//     (the connection, an unknown topology). A unit named twice gets one
//     decision. Release is ReleaseMany of one token, one statement: each
//     token is judged against the rows as they were before the batch.
//   - Ownership belongs to the member (pod name); the incarnation that last
//     claimed or confirmed a unit is recorded on the row. Whether a held
//     unit may be adopted is judged by its member's current lease, so a
//     member that rejoins at once protects its units even before it
//     confirms them. Writes are valid only from the recorded incarnation, so
//     a rejoin makes the old incarnation's tokens stale at once.
//   - Re-homing. ConfirmOwned (or a Claim of the member's own unit) moves
//     claims of earlier incarnations onto the new one and raises their
//     epochs by one, but only once the previous incarnation's lease expiry
//     (recorded by Join when it had not left, from the row as it is when
//     the join commits: a renewal between the join's read and its write
//     makes it decide again) plus the grace has passed: a second process
//     under the same pod name may still be delivering until it fences
//     itself. Nor while an epoch is pending (P2: no ownership moves during
//     a freeze, for ConfirmOwned as for Claim). Before that Claim refuses with
//     HeldPreviousIncarnation and ConfirmOwned reports the units in
//     Confirmation.Waiting, in neither Held (no valid token yet) nor Moved
//     (nobody else may take them: the member is live). A rejoin long after
//     the lease lapsed (the registry-outage path) re-homes at once. A Claim
//     that re-homes says Rehomed, From being the member itself.
//   - Adoption (P5): a unit held by X may be claimed by Y only when the
//     registry's clock is at least X's lease expiry plus the grace, Y is not
//     fenced, and Y's last fence lifted at least the grace ago. A join after
//     a lapsed lease counts as lifting the member's self-fence. Params.Validate
//     requires grace >= renew interval + query bound.
//   - Repeats. The row records its last claim decision when it was an
//     adoption (adopted_from) or a re-home (rehomed); every other transition
//     clears them. A Claim by the incarnation that holds the unit takes no
//     new decision and reports the recorded Adopted, Rehomed and From, so a
//     retry after a lost reply still knows the old owner's pin and unacked
//     rows are its to lift. Settled is not recorded: a settled handover
//     left nothing to lift.
//   - Handover records an intent (the owner has stopped delivering); the unit
//     stays held by the owner, row and all, until the target's claim (or
//     anyone's, for an open handover) or the owner's release settles it.
//   - Fences have generations: the worker numbers its local fences (from 1
//     in each incarnation; Join starts the registry at 0). Fence of
//     generation g applies only when g is above the recorded generation,
//     and Unfence of g lifts every fence up to g; anything older is a no-op,
//     not an error, so a Fence sent asynchronously that arrives after its
//     Unfence changes nothing. Fence forbids every claim; Unfence allows
//     free units at once and adoption after the grace. A repeated Unfence
//     does not move the lift.
//   - Draining. SetDraining marks a member whose pod the operator is about
//     to restart: every member leaves its slot out of placement, and the
//     member itself claims nothing (ErrDraining) while it hands over. The
//     mark survives rejoins until cleared. Marking a name that never
//     joined writes a placeholder row (left, no slot, incarnation 0) that
//     carries the mark to its first join, so the operator can mark a pod
//     before deleting it whether or not its worker joined yet.
//   - Retiring units. A unit outside the active epoch's shape is refused
//     (ErrUnitOutOfRange) unless it is in the topology's retiring set
//     (SetRetiring replaces it, in one statement): then the usual rules
//     apply (free and never-claimed units at once, adoption under P5), so
//     someone drains a retired unit's rows even if its owner died.
//   - Topology epochs: CreatePending freezes claims (ErrFrozen) while held
//     units keep flowing; Activate requires every live member's current
//     incarnation to have acknowledged and retires the previous epoch in the
//     same transaction; Retire abandons a pending epoch. Claim names the
//     epoch it decided under and is refused under any other
//     (ErrEpochMoved); claims lock the active epoch row, so none decided
//     under the old epoch commits after the next one is active (P2).
//   - Write guard. A token (topology, unit, member, epoch) is valid while the
//     claim is held at that epoch by that member's recorded incarnation with
//     a live lease. Sinks in the registry's database embed GuardSQL or call
//     GuardedExec, which lock the claim row until their transaction ends;
//     sinks elsewhere call CheckToken and keep an EpochFence. Writes,
//     releases and handovers from stale tokens are refused with a
//     *StaleEpochError (ErrStaleEpoch). Release and Handover need only the
//     owner and epoch to match, since giving a unit up can only narrow who
//     may deliver it.
//   - ConfirmOwned is one pipeline, one round trip once prepared, for any
//     number of claims: the batch path after a fence lifts.
//   - Activity. ReportActivity replaces the member's report (one statement:
//     rows for units no longer reported go): per unit, the claim epoch the
//     member pulls under, since when it pulls under it (its pull window
//     opens then and runs to the report), and when it last pulled and last
//     received rows, sent as ages on the member's clock and stored as times
//     on the registry's, so no two clocks are compared. It needs the
//     member's current incarnation but not a live lease. The operator reads
//     Activity to find units pulled under two claim tokens at once
//     (overlapping windows) and owned units that do not flow (P7): no
//     report means nothing measured, not zero.
//   - History. Triggers append a claim event whenever a claim row is new or
//     its owner, incarnation, epoch or state changed (never for a
//     checkpoint), with the writer's last_op (claim, adopt, rehome, settle,
//     handover, release) and the epoch a claim was decided under, and a
//     lease event whenever a member row is new or its incarnation, expiry
//     or departure changed. HistoryReader reads them in order; PruneHistory
//     deletes events older than a time. The twin records the same events.
//   - Observe reads Snapshot, Claims and Activity as of one instant (one
//     read-only REPEATABLE READ transaction, one round trip), for the
//     operator, which judges claims and activity against members.
//   - Snapshot reads in one statement what a worker needs each tick (clock,
//     parameters, active and pending epochs with acknowledgements, members
//     with liveness, fences and holdings, the retiring set, the RESET
//     permission with the census floor and server versions and its age on
//     the registry's clock) and the counts the operator reports.
//
// Every operation is one statement or one pipelined transaction. Errors are wrapped
// with context and match the sentinels in errors.go; IsConnectionError tells
// a refusal by the rules from an unknown outcome. The package does not log;
// the DSN never appears in its errors (pgx redacts the password).
//
// # Tests
//
// PostgreSQL starts on the first test that needs it; a test that needs it
// and cannot have it fails with the reason. go test -run Twin runs the
// tests that need no PostgreSQL (the twin's half of the fault matrix).
package poolctl
