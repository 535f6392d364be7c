package member

import (
	"errors"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Config is what a Core needs to know about its member.
type Config struct {
	Topology, Member string
	// FenceMargin is subtracted from the lease to find the self-fence
	// deadline; zero means the registry's query bound.
	FenceMargin time.Duration
	// DrainTimeout bounds a handover's drain until the registry's
	// setting arrives (default 30s).
	DrainTimeout time.Duration
	// StopBound is how long a puller may take to report that it stopped
	// after its drain timeout or its stop, before the core stops waiting
	// for it (a handler that ignores its context). Default 5s.
	StopBound time.Duration
	// ClaimBatch caps the units of one Claim or Release (0: no cap).
	ClaimBatch int
	// Process names this process, the same for its whole life and
	// different for every process (and every Worker) under the member
	// name: the registry tells this process's own late joins from a later
	// process's by it (poolctl.Registry.Rejoin).
	Process string

	mutations mutations
}

// phase is where the member is in its life.
type phase int

const (
	phaseMember  phase = iota // joining, live or fenced
	phaseLeaving              // handing everything over, then Leave
	phaseDone                 // Done emitted
)

// Core is one member's state machine. It is not safe for concurrent use:
// one goroutine owns it and feeds it every event.
type Core struct {
	cfg   Config
	now   time.Duration
	phase phase
	out   []Action

	ids     uint64
	pullers uint64
	// seq counts changes to units; changed[u] is the seq of u's last
	// change (kept after u is forgotten), so a per-unit answer can tell
	// whether the unit changed since its question was asked.
	seq     uint64
	changed map[ownership.Unit]uint64

	lease     *poolctl.Lease
	params    poolctl.Params
	joinedAt  time.Duration
	renewedAt time.Duration // when the last granting request was sent
	fenceDue  time.Duration
	fenced    bool
	fencedAt  time.Duration
	fenceGen  int64
	fenceSent int64
	// lane is the one lease call in flight (Join, Renew, Fence, Unfence,
	// Confirm, Leave): they reach the registry in the order decided.
	lane    *call
	retryAt time.Duration
	backoff time.Duration
	// lastInc is the last incarnation this process was granted (kept
	// after its lease is lost): a rejoin names it, so the registry can
	// tell whether a later incarnation is this process's own.
	lastInc int64
	// recovery: after a fence, renew, record the fence, lift it, confirm.
	recovery recoveryStage
	// needConfirm: some claim's outcome is unknown, or units of an
	// earlier incarnation wait to come home.
	needConfirm bool
	// staleRelease is c.seq when a release was last refused as stale: a
	// confirmation asked before then must be asked again.
	staleRelease uint64
	waiting      int
	// acked is the pending epoch acknowledged, and under which
	// incarnation.
	acked struct{ epoch, incarnation int64 }

	units map[ownership.Unit]*unit
	// lingering are pullers of units the core let go of that have not
	// reported stopping; no new puller starts for such a unit.
	lingering map[ownership.Unit]*pullerRef

	tick     *call // snapshot or probe in flight
	plan     *plan // a tick waiting for its probe
	claims   map[ReqID]*call
	releases map[ReqID]*call
	freeze   *call
	activity *call
	unpins   map[ReqID]ownership.Unit
	// pastConfirms keeps sent confirmations, only under the
	// StaleConfirmationApplied mutation.
	pastConfirms map[ReqID]*call
	placed       placedCache

	reset   poolctl.ResetPermission
	resetAt time.Duration
	drain   time.Duration
	// barrier is the order barrier of the active or pending epoch as the
	// last snapshot showed it (nil: none); the permission carries it to
	// the pullers. barrierGen is the fenceGen it was read under: pullers
	// start only with a barrier read since the member last came out of
	// a fence (a rejoin, a recovery, the first join), so a member that
	// missed a change of V while fenced or away does not re-home a unit
	// and deliver its moved keys' rows before it reads that change's
	// barrier (the simulator found it, seed 540 of the ordered runs).
	barrier    *poolctl.OrderBarrier
	barrierGen int64

	permDirty bool
	timerAt   time.Duration
}

// call is a request in flight: what it asked and under which incarnation.
type call struct {
	id          ReqID
	kind        callKind
	incarnation int64
	gen         int64
	seq         uint64 // c.seq when sent
	sentAt      time.Duration
	units       []ownership.Unit
	tokens      []poolctl.Token
	epoch       int64
}

type callKind int

const (
	callJoin callKind = iota
	callRenew
	callFence
	callUnfence
	callConfirm
	callLeave
	callSnapshot
	callProbe
)

type recoveryStage int

const (
	recoverNone    recoveryStage = iota
	recoverRenew                 // a renewal must succeed first
	recoverFence                 // record the fence
	recoverUnfence               // lift it in the registry
	recoverConfirm               // confirm, then lift locally
)

// New returns a Core that will join when first stepped.
func New(cfg Config) *Core {
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.StopBound <= 0 {
		cfg.StopBound = 5 * time.Second
	}
	return &Core{
		cfg: cfg, changed: map[ownership.Unit]uint64{}, units: map[ownership.Unit]*unit{},
		lingering: map[ownership.Unit]*pullerRef{}, claims: map[ReqID]*call{}, releases: map[ReqID]*call{}, pastConfirms: map[ReqID]*call{}, unpins: map[ReqID]ownership.Unit{},
		fenced: true, drain: cfg.DrainTimeout, fenceDue: never, timerAt: -1, permDirty: true, barrierGen: -1,
	}
}

// Step applies one event and returns the actions it calls for, in order.
func (c *Core) Step(ev Event) []Action {
	c.out = nil
	if c.phase == phaseDone {
		return nil
	}
	if now := ev.at(); now > c.now {
		c.now = now
	}
	c.checkFence(ev)
	c.apply(ev)
	c.settle()
	out := c.out
	c.out = nil
	if c.permDirty {
		c.permDirty = false
		// The permission goes first: a new puller must find its grant,
		// and an UNPIN or stop must follow the revocation.
		out = append([]Action{Publish{Perm: c.permission()}}, out...)
	}
	return out
}

// apply dispatches ev to its handler.
func (c *Core) apply(ev Event) {
	switch e := ev.(type) {
	case Tick:
		c.onTick()
	case Timer:
		c.onTimer()
	case Shutdown:
		c.onShutdown()
	case JoinReply:
		c.onJoin(e)
	case RenewReply:
		c.onRenew(e)
	case FenceReply:
		c.onFence(e)
	case UnfenceReply:
		c.onUnfence(e)
	case ConfirmReply:
		c.onConfirm(e)
	case LeaveReply:
		c.onLeave(e)
	case SnapshotReply:
		c.onSnapshot(e)
	case ProbeReply:
		c.onProbe(e)
	case ClaimReply:
		c.onClaim(e)
	case ReleaseReply:
		c.onRelease(e)
	case AckFreezeReply:
		c.onAckFreeze(e)
	case ActivityReply:
		if c.activity != nil && c.activity.id == e.Req {
			c.activity = nil
		}
	case UnpinDone:
		c.onUnpinDone(e)
	case PullerPrepared:
		c.onPrepared(e)
	case PullerFetched:
		c.onFetched(e)
	case PullerStopped:
		c.onStopped(e)
	}
}

// settle runs after every event: what the new state calls for.
func (c *Core) settle() {
	if c.phase == phaseDone {
		return
	}
	c.expireDeadlines()
	c.leaving()
	c.driveLane()
	c.flushReleases()
	c.armTimer()
}

// emit queues an action.
func (c *Core) emit(a Action) { c.out = append(c.out, a) }

// note queues a Note.
func (c *Core) note(k NoteKind, u ownership.Unit, v float64, detail string) {
	c.emit(Note{Kind: k, Unit: u, Value: v, Detail: detail})
}

// newID returns a fresh request id.
func (c *Core) newID() ReqID {
	c.ids++
	return ReqID(c.ids)
}

// touch records a change of u, for per-unit reply checks.
func (c *Core) touch(u ownership.Unit) {
	c.seq++
	c.changed[u] = c.seq
	c.permDirty = true
}

// ref is the current incarnation's reference (zero before a join).
func (c *Core) ref() poolctl.MemberRef {
	if c.lease == nil {
		return poolctl.MemberRef{}
	}
	return c.lease.MemberRef
}

func (c *Core) incarnation() int64 { return c.ref().Incarnation }

// permission builds the delivery permission from the current state.
func (c *Core) permission() *Permission {
	p := &Permission{Units: map[ownership.Unit]poolctl.Token{}, Fenced: c.fenced, FenceDue: c.fenceDue,
		Lease: c.lease != nil, Slot: -1, Barrier: c.barrier}
	if c.cfg.mutations.on(NoLazyFenceCheck) || c.cfg.mutations.on(NoSelfFence) {
		p.FenceDue = never
	}
	if c.lease != nil {
		p.Incarnation, p.Slot = c.lease.Incarnation, c.lease.Slot
	}
	for u, x := range c.units {
		if x.delivering() {
			p.Units[u] = x.token
		}
	}
	return p
}

// armTimer asks for a Timer at the earliest instant something falls due.
func (c *Core) armTimer() {
	at := never
	if c.lease != nil && !c.fenced && !c.cfg.mutations.on(NoSelfFence) {
		at = min(at, c.fenceDue)
	}
	if c.lane == nil {
		at = min(at, c.laneDue())
	}
	for _, x := range c.units {
		if x.deadline > 0 {
			at = min(at, x.deadline)
		}
		if x.puller != nil && x.puller.deadline > 0 {
			at = min(at, x.puller.deadline)
		}
	}
	for _, p := range c.lingering {
		if p.deadline > 0 {
			at = min(at, p.deadline)
		}
	}
	if at == never || at == c.timerAt {
		return
	}
	if at < c.now {
		at = c.now
	}
	c.timerAt = at
	c.emit(SetTimer{At: at})
}

func (c *Core) onTimer() { c.timerAt = -1 }

// definite reports whether err is the registry's refusal (so the request
// certainly did not take effect, or took the effect the error names), as
// opposed to an outcome nobody knows (timeout, lost reply, cancel).
func definite(err error) bool {
	for _, e := range []error{poolctl.ErrUnknownTopology, poolctl.ErrNotMember, poolctl.ErrStaleIncarnation,
		poolctl.ErrLeaseExpired, poolctl.ErrFenced, poolctl.ErrDraining, poolctl.ErrNoActiveEpoch, poolctl.ErrEpochMoved,
		poolctl.ErrFrozen, poolctl.ErrUnitOutOfRange, poolctl.ErrHeld, poolctl.ErrStaleEpoch, poolctl.ErrStillHolding,
		poolctl.ErrInvalid, poolctl.ErrEpochState, poolctl.ErrDisplaced} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// leaseLost reports whether err says the registry will not renew this
// incarnation again.
func leaseLost(err error) bool {
	// A registry behind this member's mark (a failover to a standby that
	// lost commits, issue 22) may hand this member's units and tokens to
	// others: the lease is as good as lost, so the member fences and
	// rejoins once the registry is recovered.
	return errors.Is(err, poolctl.ErrLeaseExpired) || errors.Is(err, poolctl.ErrStaleIncarnation) ||
		errors.Is(err, poolctl.ErrNotMember) || errors.Is(err, poolctl.ErrRegistryBehind)
}

// Fenced reports whether the core is fenced now (for tests and status).
func (c *Core) Fenced() bool { return c.fenced }

// Lease returns the current lease, or nil before a join.
func (c *Core) Lease() *poolctl.Lease { return c.lease }

// Held lists the units held at a token, whatever their handover state.
func (c *Core) Held() map[ownership.Unit]poolctl.Token {
	out := map[ownership.Unit]poolctl.Token{}
	for u, x := range c.units {
		if x.hasToken() {
			out[u] = x.token
		}
	}
	return out
}
