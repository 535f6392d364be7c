package member

import (
	"math"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Action is something the core wants done. The caller performs the
// actions of one Step in order and reports each registry call's outcome
// back as the reply event carrying the same Req.
type Action interface{ action() }

// Join starts a new incarnation (poolctl.Registry.Rejoin). Ref names the
// member and the last incarnation this process was granted (0: none), and
// Process this process: the registry refuses the join (ErrDisplaced) only
// when a later incarnation granted to another process under the same name
// is live, so this process's own join that arrived late never displaces
// it.
type Join struct {
	Req     ReqID
	Ref     poolctl.MemberRef
	Process string
}

// Renew extends the lease (poolctl.Registry.Renew).
type Renew struct {
	Req ReqID
	Ref poolctl.MemberRef
}

// Fence records a local fence of generation Gen in the registry.
type Fence struct {
	Req ReqID
	Ref poolctl.MemberRef
	Gen int64
}

// Unfence lifts the fence of generation Gen in the registry.
type Unfence struct {
	Req ReqID
	Ref poolctl.MemberRef
	Gen int64
}

// Confirm confirms every claim the member holds (ConfirmOwned).
type Confirm struct {
	Req      ReqID
	Ref      poolctl.MemberRef
	Expected map[string]int64
}

// ReadSnapshot reads the topology's registry state (Snapshot).
type ReadSnapshot struct {
	Req      ReqID
	Topology string
}

// Claim claims Units under topology epoch Under (ClaimMany).
type Claim struct {
	Req   ReqID
	Ref   poolctl.MemberRef
	Under int64
	Units []string
}

// Release gives Tokens up (ReleaseMany).
type Release struct {
	Req    ReqID
	Tokens []poolctl.Token
}

// AckFreeze acknowledges the freeze for pending epoch Epoch.
type AckFreeze struct {
	Req   ReqID
	Ref   poolctl.MemberRef
	Epoch int64
}

// Leave ends the membership.
type Leave struct {
	Req ReqID
	Ref poolctl.MemberRef
}

// ReportActivity reports, for each unit with a puller, when it last pulled
// and last received rows.
type ReportActivity struct {
	Req   ReqID
	Ref   poolctl.MemberRef
	Units []poolctl.UnitActivity
}

// Probe asks which of Units' consumers still hold rows (ProbeReply).
type Probe struct {
	Req   ReqID
	Units []ownership.Unit
}

// Unpin lifts the pin on Unit's consumer before its release, so the next
// holder is served at once (UnpinDone). The caller must not send it once
// the permission's fence deadline has passed.
type Unpin struct {
	Req  ReqID
	Unit ownership.Unit
}

// StartPuller starts pulling Unit under Token. The puller delivers only
// while the published Permission allows (Unit, Token).
type StartPuller struct {
	Puller PullerID
	Unit   ownership.Unit
	Token  poolctl.Token
	// Incarnation and Under identify the claim in the history.
	Incarnation, Under int64
	// Unpin: lift the consumer's pin before the first pull (every new
	// holder does; only a mutation turns it off).
	Unpin bool
	// Takeover: also RESET the consumer when the census allows (P4).
	Takeover bool
	From     string
	// Reset is the census verdict last read, ResetReadAt when (on the
	// caller's monotonic clock), so its age is judged at the RESET.
	Reset       poolctl.ResetPermission
	ResetReadAt time.Duration
}

// DrainPuller stops a puller's fetching and lets delivered rows settle for
// at most Timeout; the rest are nak'd for the next owner. The puller then
// reports PullerStopped.
type DrainPuller struct {
	Puller  PullerID
	Unit    ownership.Unit
	Timeout time.Duration
}

// StopPuller stops a puller at once (its handler's context is cancelled);
// it settles nothing more and reports PullerStopped.
type StopPuller struct {
	Puller PullerID
	Unit   ownership.Unit
}

// Publish replaces the delivery permission pullers check before every
// delivery and settlement.
type Publish struct{ Perm *Permission }

// Configure passes the registry's parameters and worker settings to the
// caller (query bound, NATS naming).
type Configure struct{ Params poolctl.Params }

// SetTimer asks for a Timer event at At (replacing any earlier request).
type SetTimer struct{ At time.Duration }

// Note reports something worth a log line or a metric.
type Note struct {
	Kind NoteKind
	Unit ownership.Unit
	// Value is the note's number (seconds fenced, handover seconds, units).
	Value  float64
	Detail string
}

// Done says the member left (Err nil) or gave up (Err says why); the
// caller stops feeding events.
type Done struct{ Err error }

// NoteKind says what a Note reports.
type NoteKind string

// Notes the core emits.
const (
	NoteJoined       NoteKind = "joined"
	NoteFenced       NoteKind = "fenced"
	NoteUnfenced     NoteKind = "unfenced"
	NoteRenewFailed  NoteKind = "renew-failed"
	NoteLeaseLost    NoteKind = "lease-lost"
	NoteDisplaced    NoteKind = "displaced"
	NoteHandedOver   NoteKind = "handed-over"
	NoteDrainTimeout NoteKind = "drain-timeout"
	NoteStuckPuller  NoteKind = "stuck-puller"
	NoteFroze        NoteKind = "froze"
	NoteConfirmed    NoteKind = "confirmed"
	NoteCallFailed   NoteKind = "call-failed"
	NoteLeft         NoteKind = "left"
)

func (Join) action()           {}
func (Renew) action()          {}
func (Fence) action()          {}
func (Unfence) action()        {}
func (Confirm) action()        {}
func (ReadSnapshot) action()   {}
func (Claim) action()          {}
func (Release) action()        {}
func (AckFreeze) action()      {}
func (Leave) action()          {}
func (ReportActivity) action() {}
func (Probe) action()          {}
func (Unpin) action()          {}
func (StartPuller) action()    {}
func (DrainPuller) action()    {}
func (StopPuller) action()     {}
func (Publish) action()        {}
func (Configure) action()      {}
func (SetTimer) action()       {}
func (Note) action()           {}
func (Done) action()           {}

// Permission is what pullers may do now: deliver and settle the rows of
// each unit in Units under exactly that token, while the member is not
// fenced and its own clock is before FenceDue. It is immutable once
// published; the caller swaps a pointer to it.
type Permission struct {
	Units map[ownership.Unit]poolctl.Token
	// Fenced is the core's fence; FenceDue is when the self-fence falls
	// due on the caller's monotonic clock, checked lazily on every row so
	// a process resumed after a pause stops before its timer runs.
	Fenced   bool
	FenceDue time.Duration
	// Lease, Incarnation and Slot are for status.
	Lease       bool
	Incarnation int64
	Slot        int
	// Barrier is the active epoch's order barrier (nil: none): Holds
	// reads it for every row.
	Barrier *poolctl.OrderBarrier
}

// Holds reports whether the row of key stored at stream sequence seq in
// unit u must wait for the order barrier (issue 24): its key moved into u
// at the change of V, the row was stored after the transform switched,
// and the key's old unit has not acknowledged its rows up to the switch.
// Rows at or below the switch were routed by the old transform (or their
// key did not move), so they never wait; neither do unmoved keys. While
// the switch is not recorded yet, every row above the sequence read
// before it whose key moved waits. A change of N: holdsForN.
func (p *Permission) Holds(u ownership.Unit, seq uint64, key string) bool {
	if p == nil || p.Barrier == nil {
		return false
	}
	b := p.Barrier
	if b.ChangesN() {
		return holdsForN(b, u, seq, key)
	}
	pb, ok := b.Partition(u.Partition)
	if !ok || u.Shard >= b.ToShards {
		return false
	}
	if (pb.Switched && seq <= pb.SwitchSeq) || (!pb.Switched && seq <= pb.BeforeSeq) {
		return false
	}
	old, moved := ownership.MovedFrom(key, b.FromShards, u.Shard)
	return moved && !pb.Lifted(old)
}

// holdsForN is Holds under the barrier of a change of N: a row of a key
// whose old partition is not u's was published under the new N (no
// publisher on the old one sends the key to u), so it waits while the
// key's old unit, in the same shard, is not lifted. Unless it is stored
// at or below the sequence u's stream had when the barrier was written,
// before any publisher could use the new N: such a row is a key an
// earlier change moved, older than the key's rows in its old partition.
func holdsForN(b *poolctl.OrderBarrier, u ownership.Unit, seq uint64, key string) bool {
	if u.Partition >= b.ToPartitions || u.Shard >= b.ToShards {
		return false
	}
	if own, ok := b.Partition(u.Partition); ok && seq <= own.BeforeSeq {
		return false
	}
	old, moved := ownership.MovedFromPartition(key, b.FromPartitions, u.Partition)
	if !moved {
		return false
	}
	pb, ok := b.Partition(old)
	return ok && !pb.Lifted(u.Shard)
}

// Allows is the per-row P1 check: one map read and one comparison of now
// (the caller's monotonic clock) with the fence deadline.
func (p *Permission) Allows(u ownership.Unit, t poolctl.Token, now time.Duration) bool {
	return p.Delivers(u, t) && now < p.FenceDue
}

// Delivers is Allows without the clock: unit u is held under token t and
// the member is not fenced. A permission is never changed once
// published, so a puller may keep this answer for as long as it sees the
// same permission, and compare only the clock on every row.
func (p *Permission) Delivers(u ownership.Unit, t poolctl.Token) bool {
	if p == nil || p.Fenced {
		return false
	}
	held, ok := p.Units[u]
	return ok && held == t
}

// FencedAt reports whether the member counts as fenced at now.
func (p *Permission) FencedAt(now time.Duration) bool {
	return p == nil || p.Fenced || now >= p.FenceDue
}

// never is a deadline that does not come.
const never = time.Duration(math.MaxInt64)
