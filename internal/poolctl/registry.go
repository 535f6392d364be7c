package poolctl

import (
	"context"
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/pkg/shard"
)

// Registry is the ownership registry of one or more ShardTopologies. The
// PostgreSQL implementation (PG) and the in-memory twin (Twin) both satisfy
// it and must give the same answers; the fault matrix checks that they do.
//
// Every operation is one statement or one transaction. Every change of a
// claim is a compare-and-set on its fencing epoch. Expiry is judged on the
// registry's clock only; no operation takes a time from the caller.
type Registry interface {
	// EnsureTopology creates the topology or updates its lease parameters.
	EnsureTopology(ctx context.Context, topology string, p Params) error

	// Join starts a new incarnation of member (a pod name). The member
	// gets its old slot back when no live member took it meanwhile,
	// otherwise the lowest slot no live member holds. Claims held by an
	// earlier incarnation stay with the member (they are judged by the
	// member's current lease) until ConfirmOwned re-homes them.
	//
	// Join is a process's first join. Its later joins (after its lease
	// lapsed or a renewal was refused) go through Rejoin, so that two live
	// processes under one name cannot take the name from each other in
	// turn.
	Join(ctx context.Context, topology, member string) (Lease, error)
	// Rejoin is Join for the process that held incarnation m.Incarnation
	// of m.Member (0: it never had a lease). process names the calling
	// process, the same string for its whole life and different for every
	// process (say the pod UID and the process's start time); the registry
	// records it with the incarnation it grants.
	//
	// Once a later incarnation of the name was granted to another process
	// (one under the same pod name that joined since), Rejoin is refused
	// with a *DisplacedError (ErrDisplaced) and changes nothing, whether
	// that incarnation is still live, lapsed or left: the later process
	// keeps the name. The caller has been displaced, not merely lost its
	// lease: it is the old pod's process, must not deliver, and should
	// stop. A later incarnation granted to the same process (a join of its
	// own that reached the registry after the caller gave up on it, or a
	// Rejoin whose reply was lost) does not displace it: while it is live,
	// Rejoin renews it (as Renew does) and returns it, rather than start
	// another that would supersede the one the process delivers under;
	// once it lapsed, Rejoin proceeds as Join does. For
	// m.Incarnation 0 Rejoin proceeds as Join does. An incarnation that
	// Renew, Fence or ConfirmOwned refuse with ErrStaleIncarnation may have
	// been displaced: Rejoin tells the caller whether it was.
	Rejoin(ctx context.Context, m MemberRef, process string) (Lease, error)
	// Renew extends a live lease. A lease that has expired cannot be
	// renewed: the member must Join again (ErrLeaseExpired).
	Renew(ctx context.Context, m MemberRef) (Lease, error)
	// Leave ends the membership. It refuses (ErrStillHolding) while the
	// member holds any claim, so it never releases anything silently.
	Leave(ctx context.Context, m MemberRef) error
	// Fence records that the member is fenced: it may not claim anything.
	// gen is the member's fence generation, which grows by one at every
	// local fence of this incarnation. The registry applies a Fence only
	// when gen is above the last generation it recorded, so a Fence that
	// arrives late (after the Unfence of the same generation) changes
	// nothing.
	Fence(ctx context.Context, m MemberRef, gen int64) error
	// Unfence lifts the fence of generation gen (and every older one). The
	// member may claim free units at once but may adopt only after the
	// grace has passed since the lift (P5). An Unfence older than the last
	// recorded generation changes nothing and is not an error.
	Unfence(ctx context.Context, m MemberRef, gen int64) error

	// Claim takes unit for the member under the active topology epoch
	// under, raising its fencing epoch by one. The unit must be free,
	// never claimed, handed over to this member (or to anyone), held by an
	// earlier incarnation of this member, or adoptable under P5. Claiming
	// a unit this incarnation already holds returns its token unchanged.
	//
	// A unit outside the active epoch's shape may be claimed only while it
	// is in the retiring set (SetRetiring), to drain it. A draining member
	// (SetDraining) claims nothing (ErrDraining). A unit an earlier,
	// still-live incarnation of this member holds is re-homed only after
	// that incarnation's lease expiry plus the grace (HeldPreviousIncarnation
	// before), so a second process under the same name has fenced itself
	// first. A repeat after a lost reply reports the same Adopted, Rehomed
	// and From as the original decision.
	Claim(ctx context.Context, m MemberRef, under int64, unit string) (Claim, error)
	// ClaimMany is Claim for many units in one transaction of a constant
	// number of round trips: each unit is decided by the same rules, and
	// each gets its own outcome. The error is for the batch as a whole
	// (connection, unknown topology); per-unit refusals are in the
	// outcomes.
	ClaimMany(ctx context.Context, m MemberRef, under int64, units []string) ([]ClaimOutcome, error)
	// Handover records the owner's intent to give the unit to member to
	// (or to anyone when to is ""). The owner must have stopped delivering
	// it. The unit stays held by the owner until the new owner's Claim or
	// the owner's Release settles it.
	Handover(ctx context.Context, t Token, to string) error
	// Release gives the unit up. The row stays (state free), keeping the
	// fencing epoch so it never goes back.
	Release(ctx context.Context, t Token) error
	// ReleaseMany is Release for many tokens in one statement; errs[i] is
	// the outcome of tokens[i].
	ReleaseMany(ctx context.Context, tokens []Token) (errs []error, err error)
	// ConfirmOwned confirms, in one round trip, every claim the member holds,
	// re-homing claims of earlier incarnations onto this one (which raises
	// their epochs) once the same-name grace has passed and while no epoch
	// is pending (otherwise they are reported Waiting), and reports which
	// expected units moved.
	ConfirmOwned(ctx context.Context, m MemberRef, expected map[string]int64) (Confirmation, error)
	// Checkpoint records the unit's checkpoint sequence. It is a guarded
	// write: refused with a *StaleEpochError unless the token is valid.
	Checkpoint(ctx context.Context, t Token, seq int64) error
	// CheckToken reports whether the token is valid now: the claim is held
	// at its epoch by the member's current incarnation, whose lease is
	// live. It returns a *StaleEpochError otherwise.
	CheckToken(ctx context.Context, t Token) error

	// CreatePending writes the next topology epoch (partitions x shards)
	// as pending, which freezes claims. Only one epoch may be pending; a
	// repeat with the same shape returns the pending epoch.
	CreatePending(ctx context.Context, topology string, partitions, shards int) (int64, error)
	// AckFreeze records that the member's current incarnation stopped
	// taking claims for the pending epoch.
	AckFreeze(ctx context.Context, m MemberRef, epoch int64) error
	// Activate makes the pending epoch active and retires the previous
	// active one, in one transaction, once every live member acknowledged
	// the freeze (*FreezeIncompleteError otherwise).
	Activate(ctx context.Context, topology string, epoch int64) error
	// SetDraining sets or clears the operator's drain request for member
	// (a pod about to be restarted). Every member leaves a draining
	// member's slot out of placement, so its units move away, and the
	// draining member claims nothing. The request survives the member's
	// rejoins until cleared. A request for a name that never joined is
	// kept in a placeholder row (left, no slot), so a process joining
	// under that name later claims nothing either: the operator can mark
	// a pod before it deletes it, whether or not its worker joined yet.
	// Clearing the request of a name with no row is ErrNotMember.
	SetDraining(ctx context.Context, topology, member string, draining bool) error
	// SetRetiring replaces the topology's retiring set: units that left
	// the active epoch and whose consumers still hold rows. Their claims
	// stay valid, and a retiring unit that is free or adoptable may be
	// claimed (by the member placement gives it) to drain it to zero.
	SetRetiring(ctx context.Context, topology string, units []string) error

	// ReportActivity replaces the member's activity report: for each unit
	// it holds, the claim epoch it pulls under, since when it pulls under
	// it, and when it last pulled and last received a row. The operator
	// compares reports to find units pulled under two claim tokens at once
	// (overlapping pull windows) and owned units whose rows do not flow
	// (P7).
	ReportActivity(ctx context.Context, m MemberRef, units []UnitActivity) error
	// Activity lists every member's latest activity report.
	Activity(ctx context.Context, topology string) ([]ActivityReport, error)

	// Retire abandons a pending epoch (the abort path). The active epoch is
	// retired only by activating its successor.
	Retire(ctx context.Context, topology string, epoch int64) error

	// PublishResetPermission records the operator's census verdict on
	// consumer RESET for the workers (P4).
	PublishResetPermission(ctx context.Context, topology string, p ResetPermission) error
	// Snapshot reads, in one round trip, what a worker needs each tick: the
	// registry's clock, parameters, active and pending epochs, members and
	// the RESET permission, with claim counts for status.
	Snapshot(ctx context.Context, topology string) (Snapshot, error)
	// Claims lists every claim row of the topology, sorted by unit.
	Claims(ctx context.Context, topology string) ([]ClaimInfo, error)
	// Observe reads what Snapshot, Claims and Activity return as of one
	// instant, in one round trip. Three separate reads may each see a
	// different moment (a claim row newer than the member list, activity
	// older than both); a caller that judges one against another (the
	// operator's status and P7 checks) reads them with Observe.
	Observe(ctx context.Context, topology string) (Observation, error)
}

// Observation is one topology's registry state as of one instant.
type Observation struct {
	Snapshot Snapshot
	// Claims are sorted by unit, Activity by unit and member, as Claims
	// and Activity return them.
	Claims   []ClaimInfo
	Activity []ActivityReport
	// Durability is the registry's replication settings, judged; nil from
	// a registry that has none (the twin).
	Durability *Durability
}

// Params are a topology's lease parameters.
type Params struct {
	// LeaseTTL is how long a renewal keeps a member live.
	LeaseTTL time.Duration
	// RenewInterval is how often workers renew.
	RenewInterval time.Duration
	// QueryBound is the longest a registry query may take before the
	// worker gives up on it.
	QueryBound time.Duration
	// Grace is added to a lapsed lease before its units may be adopted,
	// and to a lifted fence before its member may adopt. P5 requires at
	// least RenewInterval + QueryBound.
	Grace time.Duration
	// Worker is what the operator tells workers beside their lease.
	Worker WorkerSettings
}

// WorkerSettings are the parts of a ShardTopology's spec its workers need:
// they read them from the registry with their lease, so a spec change
// reaches them without flags or a restart. Zero values mean "not set" (a
// worker then keeps its own default).
type WorkerSettings struct {
	// SubjectPrefix and ConsumerName name streams and consumers
	// (spec.nats.subjectPrefix, spec.nats.consumerName).
	SubjectPrefix, ConsumerName string
	// DrainTimeout bounds a handover's wait for delivered rows
	// (spec.rollout.drainTimeout).
	DrainTimeout time.Duration
}

// DefaultParams are safe defaults: a 10s lease renewed every 3s, queries
// bounded at 2s, and a 5s grace.
func DefaultParams() Params {
	return Params{LeaseTTL: 10 * time.Second, RenewInterval: 3 * time.Second, QueryBound: 2 * time.Second, Grace: 5 * time.Second}
}

// Validate checks the parameters against P5.
func (p Params) Validate() error {
	switch {
	case p.LeaseTTL <= 0 || p.RenewInterval <= 0 || p.QueryBound <= 0 || p.Grace <= 0:
		return fmt.Errorf("lease parameters must be positive: %w", ErrInvalid)
	case p.RenewInterval+p.QueryBound >= p.LeaseTTL:
		return fmt.Errorf("renew interval %v plus query bound %v must be shorter than the lease TTL %v: %w",
			p.RenewInterval, p.QueryBound, p.LeaseTTL, ErrInvalid)
	case p.Grace < p.RenewInterval+p.QueryBound:
		return fmt.Errorf("grace %v is shorter than renew interval %v plus query bound %v (P5): %w",
			p.Grace, p.RenewInterval, p.QueryBound, ErrInvalid)
	case p.Worker.DrainTimeout < 0:
		return fmt.Errorf("drain timeout %v is negative: %w", p.Worker.DrainTimeout, ErrInvalid)
	}
	return nil
}

// normalized truncates to the microsecond, PostgreSQL's resolution.
func (p Params) normalized() Params {
	return Params{
		LeaseTTL:      p.LeaseTTL.Truncate(time.Microsecond),
		RenewInterval: p.RenewInterval.Truncate(time.Microsecond),
		QueryBound:    p.QueryBound.Truncate(time.Microsecond),
		Grace:         p.Grace.Truncate(time.Microsecond),
		Worker: WorkerSettings{SubjectPrefix: p.Worker.SubjectPrefix, ConsumerName: p.Worker.ConsumerName,
			DrainTimeout: p.Worker.DrainTimeout.Truncate(time.Microsecond)},
	}
}

// MemberRef names one incarnation of a member.
type MemberRef struct {
	Topology    string
	Member      string
	Incarnation int64
}

// Lease is what Join and Renew grant.
type Lease struct {
	MemberRef
	// Slot is the member's position in the placement hash.
	Slot int
	// TTL is the lease length. The registry counts it from when it ran the
	// request, which is no earlier than when the caller sent it, so a
	// worker that fences itself at sent+TTL-margin on its own monotonic
	// clock stops before the registry can see the lease as expired.
	TTL time.Duration
	// ExpiresAt is the expiry on the registry's clock.
	ExpiresAt time.Time
	// Params are the topology's lease parameters, so a member knows its
	// fence margin (the query bound) from its very first lease.
	Params Params
}

// Token is what a holder presents with every write: the claim at one
// fencing epoch. Sinks check it (GuardedExec, CheckToken, EpochFence). It
// is shard.Token, public so the worker SDK can hand it to its users.
type Token = shard.Token

// Claim is the result of a successful Claim.
type Claim struct {
	Token
	// Adopted says the unit was taken from From after its lease lapsed
	// (the takeover path, where RESET may apply).
	Adopted bool
	// Settled says the claim settled From's handover intent.
	Settled bool
	// Rehomed says the claim moved the unit from an earlier incarnation
	// of this member (a crash-restart or a rejoin): like an adoption, the
	// earlier process's pin and unacked rows are the new owner's to lift.
	Rehomed bool
	// From is the previous owner, "" when the unit was free or new.
	From string
	// CheckpointSeq is the last checkpoint recorded for the unit.
	CheckpointSeq int64
	// At is the registry's clock at the decision.
	At time.Time
}

// ClaimOutcome is one unit's result in ClaimMany: Err is nil and Claim
// set, or Err says why the unit was refused (ErrHeld, ErrFrozen, ...).
type ClaimOutcome struct {
	Unit  string
	Claim Claim
	Err   error
}

// UnitActivity is what a member reports about one unit it holds. Ages are
// on the member's own clock at the report, so no two clocks are compared.
type UnitActivity struct {
	Unit  string
	Epoch int64
	// SinceFetch is the time since the unit's puller last completed a
	// pull (rows or not); negative means it has not pulled yet.
	SinceFetch time.Duration
	// SinceRows is the time since the puller last received a row;
	// negative means never.
	SinceRows time.Duration
	// SincePullStart is the time since the member's puller of the unit
	// started pulling under the claim token at Epoch: the report says the
	// member pulled the unit under that token from then until the report
	// (its pull window). Negative means unknown (a worker that predates
	// it). The operator counts a unit as multiply owned only when two
	// tokens' windows overlap.
	SincePullStart time.Duration
}

// ActivityReport is one unit of one member's latest report, on the
// registry's clock.
type ActivityReport struct {
	Unit        string
	Member      string
	Incarnation int64
	Epoch       int64
	ReportedAt  time.Time
	// LastFetch and LastRows are zero when the member never pulled or
	// never received a row.
	LastFetch, LastRows time.Time
	// PullingSince is when the member's puller started pulling the unit
	// under the claim token at Epoch; its pull window runs from then to
	// ReportedAt. Zero when the report did not say (an older worker).
	PullingSince time.Time
}

// Confirmation is the result of ConfirmOwned.
type Confirmation struct {
	// Held is every claim the member holds, homed on the calling
	// incarnation, at its current epoch. An epoch that differs from the
	// expected one means the caller's old tokens for that unit are stale.
	Held map[string]Token
	// Handover lists held units with a handover intent recorded, sorted.
	Handover []string
	// Moved lists expected units the member no longer holds, sorted by unit.
	Moved []Moved
	// Waiting lists units an earlier incarnation of the member holds that
	// were not re-homed, sorted: that incarnation's lease expiry plus the
	// grace has not passed (a second process under the same name may still
	// deliver them), or an epoch is pending (no ownership moves during a
	// freeze, P2). They are neither Held (the caller has no valid token for
	// them) nor Moved (nobody else may take them); confirm again once the
	// grace has passed and no epoch is pending.
	Waiting []string
}

// Moved is an expected claim that is no longer the member's.
type Moved struct {
	Unit     string
	Expected int64
	// Owner is the current owner, "" if free or absent.
	Owner string
	// Epoch is the current fencing epoch, 0 if the row is absent.
	Epoch int64
	State ClaimState
}

// ClaimState is the state of a claim row.
type ClaimState string

// Claim row states. An absent row means the unit was never claimed; a free
// row means it was cleanly released. Both are claimable at once (P6).
const (
	StateHeld     ClaimState = "held"
	StateHandover ClaimState = "handover"
	StateFree     ClaimState = "free"
)

// ClaimInfo is one claim row.
type ClaimInfo struct {
	Unit             string
	Owner            string
	OwnerIncarnation int64
	Epoch            int64
	State            ClaimState
	HandoverTo       string
	CheckpointSeq    int64
}

// EpochState is the state of a topology epoch.
type EpochState string

// Topology epoch states: exactly one epoch is active once the first was
// activated; at most one is pending.
const (
	EpochPending EpochState = "pending"
	EpochActive  EpochState = "active"
	EpochRetired EpochState = "retired"
)

// Epoch is a topology epoch.
type Epoch struct {
	Number     int64
	Partitions int
	Shards     int
	State      EpochState
	// Acked lists members whose current incarnation acknowledged the freeze
	// (pending epochs only), sorted.
	Acked []string
}

// Member is one member row.
type Member struct {
	Name string
	// Slot is -1 when the member has none (its slot was taken while it
	// was not live).
	Slot           int
	Incarnation    int64
	LeaseExpiresAt time.Time
	// Live means not left and the lease has not expired.
	Live   bool
	Left   bool
	Fenced bool
	// Draining is set while the operator asks the member to hand
	// everything over before its pod restarts (SetDraining).
	Draining bool
	// FenceLiftedAt is when the last fence lifted (zero if never). A rejoin
	// after a lapsed lease counts as lifting the self-fence.
	FenceLiftedAt time.Time
	// Holds counts claims held (including in handover).
	Holds int
	// Handovers counts held claims with a handover intent.
	Handovers int
}

// ResetPermission is the operator's census verdict on consumer RESET.
type ResetPermission struct {
	Allowed bool
	// Floor is the version floor the census judged against.
	Floor string
	// Servers maps each server the census saw to its version ("" when it
	// did not answer). A worker checks the consumer's leader and replicas
	// against it at the moment it would RESET (P4): the verdict alone is
	// topology-wide and may be minutes old.
	Servers map[string]string
	// CensusAge is the census's age when published (write) or now (read).
	CensusAge time.Duration
	Reason    string
	// Published is false when none was ever published (read only).
	Published bool
}

// Counts are claim counts for status. Two owners of one unit cannot be
// represented: the unit is the row's key.
type Counts struct {
	Held, Handover, Free int
}

// Snapshot is a topology's registry state at one instant.
type Snapshot struct {
	Topology string
	// Now is the registry's clock.
	Now     time.Time
	Params  Params
	Active  *Epoch
	Pending *Epoch
	Members []Member
	Reset   ResetPermission
	Counts  Counts
	// Retiring is the retiring set (SetRetiring), sorted.
	Retiring []string
	// Barrier is the order barrier (OrderBarriers) of the active or the
	// pending epoch, nil when neither has one. It is read in the same
	// statement as Active and Pending, and a PerKey change's pending
	// epoch is written with its barrier (CreateOrderedPending): a worker
	// that sees the epoch pending, and acknowledges its freeze, sees the
	// barrier too, before the activation moves the transform. A pending
	// epoch's barrier holds nothing yet: until the transform moves, no
	// moved key's row reaches a new unit.
	Barrier *OrderBarrier
}

// Member returns the named member, or nil.
func (s Snapshot) Member(name string) *Member {
	for i := range s.Members {
		if s.Members[i].Name == name {
			return &s.Members[i]
		}
	}
	return nil
}

// PlacementSlots are the slots units are placed over: those of live,
// non-draining members that have a slot.
func (s Snapshot) PlacementSlots() []int {
	var out []int
	for _, m := range s.Members {
		if m.Live && !m.Draining && m.Slot >= 0 {
			out = append(out, m.Slot)
		}
	}
	return out
}

// LiveMembers returns the live members, sorted by name.
func (s Snapshot) LiveMembers() []Member {
	var out []Member
	for _, m := range s.Members {
		if m.Live {
			out = append(out, m)
		}
	}
	return out
}

// HistoryReader reads the registry's append-only history: every change of
// a claim row and every lease grant, on the registry's wall clock
// (clock_timestamp(), never the test clock offset). It is the evidence the
// history checker judges deliveries against (design.md section 9).
type HistoryReader interface {
	ClaimHistory(ctx context.Context, topology string) ([]ClaimEvent, error)
	LeaseHistory(ctx context.Context, topology string) ([]LeaseEvent, error)
	// EpochHistory lists every topology epoch with when it became active
	// and when it was retired (zero when not).
	EpochHistory(ctx context.Context, topology string) ([]EpochSpan, error)
	// PruneHistory deletes history older than before.
	PruneHistory(ctx context.Context, topology string, before time.Time) error
}

// ClaimEvent is one claim row as it was from At on.
type ClaimEvent struct {
	Unit        string
	Owner       string // "" when free
	Incarnation int64
	Epoch       int64
	State       ClaimState
	// Under is the topology epoch a claim or adoption was decided under
	// (0 for the other operations).
	Under int64
	// Op is what changed the row: claim, adopt, rehome, settle (a
	// handover settled by the new owner's claim), handover or release.
	Op string
	At time.Time
}

// LeaseEvent is one lease grant (join or renewal), a leave, or a change
// of the member's fence: the member row's lease and fence from At on.
type LeaseEvent struct {
	Member      string
	Incarnation int64
	At          time.Time
	ExpiresAt   time.Time
	Left        bool
	// Fenced and FenceLiftedAt (zero if never) are the member's fence, so
	// a reader can judge P5's "never adopts while fenced nor within the
	// grace after its fence lifts".
	Fenced        bool
	FenceLiftedAt time.Time
}

// EpochSpan is a topology epoch and when it was active.
type EpochSpan struct {
	Number      int64
	Partitions  int
	Shards      int
	State       EpochState
	ActivatedAt time.Time // zero: never activated
	RetiredAt   time.Time // zero: not retired
}
