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
// Registry is implemented by PG (PostgreSQL through a pgx/v5 pool, built
// with Open from a Config holding the DSN, or with New from a pool) and by
// Twin, an in-memory twin with an injectable clock. Both apply the same
// rules (rules.go) to the state they read, and the fault matrix and the
// property test require them to answer every call alike.
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
// it leaves), claims (one row per unit ever claimed) and reset_permissions.
//
// # Clock
//
// Expiry is judged on the database's clock only (shardkeeper.clock, which is
// clock_timestamp() plus a per-topology offset that production leaves at
// zero; tests move it with ShiftClock instead of sleeping). No operation
// takes a time from its caller. Renew returns the lease TTL; the registry
// counts it from when it ran the request, which is never before the caller
// sent it, so a worker that fences itself at sent+TTL-margin on its own
// monotonic clock stops before the registry can see its lease as expired.
//
// # Decisions
//
//   - Membership. Join starts a new incarnation (numbers grow per topology)
//     and gives the member its old slot back if no live member took it,
//     otherwise the lowest slot no live member holds (taking it from a
//     member that is not live). An expired lease cannot be renewed
//     (ErrLeaseExpired): the worker joins again. Leave refuses while the
//     member holds any claim (ErrStillHolding); it never releases silently.
//   - Claims. A row is absent only if the unit was never claimed. Release
//     keeps the row as free (owner NULL) with its fencing epoch, so the epoch
//     grows by one at every owner change and never goes back, across release
//     and re-claim. Free and absent units are claimable at once.
//   - Ownership belongs to the member (pod name); the incarnation that last
//     claimed or confirmed a unit is recorded on the row. Whether a held
//     unit may be adopted is judged by its member's current lease, so a
//     member that rejoins at once protects its units even before it
//     confirms them. Writes are valid only from the recorded incarnation, so
//     a rejoin makes the old incarnation's tokens stale at once;
//     ConfirmOwned (or a Claim of its own unit) re-homes the claims onto the
//     new incarnation and raises their epochs by one.
//   - Adoption (P5): a unit held by X may be claimed by Y only when the
//     registry's clock is at least X's lease expiry plus the grace, Y is not
//     fenced, and Y's last fence lifted at least the grace ago. A join after
//     a lapsed lease counts as lifting the member's self-fence. Params.Validate
//     requires grace >= renew interval + query bound.
//   - Handover records an intent (the owner has stopped delivering); the unit
//     stays held by the owner, row and all, until the target's claim (or
//     anyone's, for an open handover) or the owner's release settles it.
//   - Fence forbids every claim; Unfence allows free units at once and
//     adoption after the grace. A repeated Unfence does not move the lift.
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
//   - ConfirmOwned is one statement, one round trip once prepared, for any
//     number of claims: the batch path after a fence lifts.
//   - Snapshot reads in one statement what a worker needs each tick (clock,
//     parameters, active and pending epochs with acknowledgements, members
//     with liveness, fences and holdings, the RESET permission and its age
//     on the registry's clock) and the counts the operator reports.
//
// Every operation is one statement or one transaction. Errors are wrapped
// with context and match the sentinels in errors.go; IsConnectionError tells
// a refusal by the rules from an unknown outcome. The package does not log;
// the DSN never appears in its errors (pgx redacts the password).
package poolctl
