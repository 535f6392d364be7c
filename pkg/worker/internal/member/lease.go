package member

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Backoff bounds for failed lease calls.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// ErrShutdownFenced ends a shutdown that found the member fenced: it must
// not touch its units, and the registry lets others adopt them under P5.
var ErrShutdownFenced = errors.New("shut down while fenced; units left to takeover")

// ErrNotJoined ends a shutdown before the member ever joined.
var ErrNotJoined = errors.New("shut down before joining")

// nextLaneCall is the lease call the member needs next, in priority order.
func (c *Core) nextLaneCall() (callKind, bool) {
	switch {
	case c.lease == nil:
		return callJoin, c.phase == phaseMember
	case c.recovery == recoverRenew || c.now >= c.renewAt():
		return callRenew, true
	case c.recovery == recoverFence:
		return callFence, true
	case c.recovery == recoverUnfence:
		return callUnfence, true
	case c.recovery == recoverConfirm:
		return callConfirm, true
	case c.phase == phaseLeaving && c.readyToLeave():
		return callLeave, true
	case c.needConfirm && !c.fenced:
		return callConfirm, true
	}
	return 0, false
}

// renewAt is when the next renewal is due: a little early rather than
// late, so renewals are never further apart than the renew interval the
// registry's grace is sized for (P5).
func (c *Core) renewAt() time.Duration {
	i := c.params.RenewInterval
	if c.lease == nil || i <= 0 {
		return c.now
	}
	return c.renewedAt + i - i/10
}

// laneDue is when the lease lane wants to act next.
func (c *Core) laneDue() time.Duration {
	if _, ok := c.nextLaneCall(); ok {
		return max(c.now, c.retryAt)
	}
	if c.lease != nil {
		return max(c.renewAt(), c.retryAt)
	}
	return never
}

// driveLane sends the next lease call when the lane is free and it is due.
func (c *Core) driveLane() {
	if c.lane != nil || c.phase == phaseDone || c.now < c.retryAt {
		return
	}
	k, ok := c.nextLaneCall()
	if !ok {
		return
	}
	cl := &call{id: c.newID(), kind: k, incarnation: c.incarnation(), gen: c.fenceGen, seq: c.seq, sentAt: c.now}
	c.lane = cl
	ref := c.ref()
	switch k {
	case callJoin:
		ref := poolctl.MemberRef{Topology: c.cfg.Topology, Member: c.cfg.Member, Incarnation: c.lastInc}
		if c.cfg.mutations.on(StaleIncarnationRejoinsAtOnce) {
			// Mutation: join as a process that never held the name, so a
			// later process's incarnation is taken over at once.
			ref.Incarnation = 0
		}
		c.emit(Join{Req: cl.id, Ref: ref, Process: c.cfg.Process})
	case callRenew:
		c.emit(Renew{Req: cl.id, Ref: ref})
	case callFence:
		c.emit(Fence{Req: cl.id, Ref: ref, Gen: cl.gen})
	case callUnfence:
		c.emit(Unfence{Req: cl.id, Ref: ref, Gen: cl.gen})
	case callConfirm:
		c.emit(Confirm{Req: cl.id, Ref: ref, Expected: c.expected()})
		if c.cfg.mutations.on(StaleConfirmationApplied) {
			c.pastConfirms[cl.id] = cl
		}
	case callLeave:
		c.emit(Leave{Req: cl.id, Ref: ref})
	}
}

// takeLane returns the lane call e answers and frees the lane, or nil when
// e answers no current question (a late or duplicated reply).
func (c *Core) takeLane(req ReqID, k callKind) *call {
	cl := c.lane
	if cl == nil || cl.id != req || cl.kind != k {
		return nil
	}
	c.lane = nil
	if k != callJoin && cl.incarnation != c.incarnation() {
		return nil // asked for an incarnation that is gone
	}
	return cl
}

// failed paces the next lease call after a failure.
func (c *Core) failed(what string, err error) {
	c.note(NoteCallFailed, ownership.Unit{}, 0, fmt.Sprintf("%s: %v", what, err))
	cap := maxBackoff
	if r := c.params.RenewInterval; r > 0 {
		// Half a renew interval: after a registry outage every member
		// whose lease lapsed rejoins inside the grace, before the first
		// one back may adopt their units.
		cap = min(maxBackoff, max(50*time.Millisecond, r/2))
	}
	c.backoff = min(max(c.backoff*2, minBackoff), cap)
	c.retryAt = c.now + c.backoff
}

func (c *Core) succeeded() { c.backoff, c.retryAt = 0, 0 }

// grant records a lease granted by a request sent at sentAt and moves the
// self-fence to sentAt + TTL - margin: the registry counts the TTL from
// when it ran the request, no earlier than sentAt, so the member fences
// first (P5).
func (c *Core) grant(l poolctl.Lease, sentAt time.Duration) {
	c.lease = &l
	c.configure(l.Params)
	margin := c.cfg.FenceMargin
	if margin == 0 {
		margin = c.params.QueryBound
	}
	c.renewedAt = sentAt
	c.fenceDue = sentAt + l.TTL - margin
	if c.cfg.mutations.on(SelfFenceAfterExpiry) {
		c.fenceDue = sentAt + l.TTL + margin
	}
	c.permDirty = true
}

// configure takes the registry's parameters when they are set.
func (c *Core) configure(p poolctl.Params) {
	if p.QueryBound <= 0 || p == c.params {
		return
	}
	c.params = p
	if p.Worker.DrainTimeout > 0 {
		c.drain = p.Worker.DrainTimeout
	}
	c.emit(Configure{Params: p})
}

func (c *Core) onJoin(e JoinReply) {
	cl := c.takeLane(e.Req, callJoin)
	if cl == nil {
		return
	}
	if errors.Is(e.Err, poolctl.ErrDisplaced) {
		c.displaced(e.Err)
		return
	}
	if e.Err != nil {
		c.failed("join", e.Err)
		return
	}
	c.succeeded()
	c.lastInc = e.Lease.Incarnation
	c.grant(e.Lease, cl.sentAt)
	c.joinedAt = c.now
	c.fenceSent = 0 // a new incarnation starts unfenced in the registry
	c.acked.epoch, c.acked.incarnation = 0, 0
	// Claims this member holds stay its own in the registry until a
	// confirmation re-homes them onto this incarnation.
	c.recovery = recoverConfirm
	c.unsureInFlight()
	c.note(NoteJoined, ownership.Unit{}, float64(e.Lease.Incarnation), "")
}

func (c *Core) onRenew(e RenewReply) {
	cl := c.takeLane(e.Req, callRenew)
	if cl == nil {
		return
	}
	switch {
	case e.Err == nil:
		c.succeeded()
		c.grant(e.Lease, cl.sentAt)
		if c.recovery == recoverRenew {
			c.recovery = recoverUnfence
			if c.fenceSent < c.fenceGen {
				c.recovery = recoverFence
			}
		}
		if !c.fenced {
			c.needConfirm = c.needConfirm || c.waiting > 0
			c.reportActivity()
		}
	case leaseLost(e.Err):
		c.loseLease(e.Err)
	default:
		c.note(NoteRenewFailed, ownership.Unit{}, 0, e.Err.Error())
		c.failed("renew", e.Err)
	}
}

func (c *Core) onFence(e FenceReply) {
	cl := c.takeLane(e.Req, callFence)
	if cl == nil {
		return
	}
	switch {
	case e.Err == nil:
		c.succeeded()
		c.fenceSent = max(c.fenceSent, cl.gen)
		if c.recovery == recoverFence && cl.gen == c.fenceGen {
			c.recovery = recoverUnfence
		}
	case leaseLost(e.Err):
		c.loseLease(e.Err)
	default:
		c.failed("record fence", e.Err)
	}
}

func (c *Core) onUnfence(e UnfenceReply) {
	cl := c.takeLane(e.Req, callUnfence)
	if cl == nil {
		return
	}
	switch {
	case e.Err == nil:
		c.succeeded()
		if c.recovery == recoverUnfence && cl.gen == c.fenceGen {
			c.recovery = recoverConfirm
		}
	case leaseLost(e.Err):
		c.loseLease(e.Err)
	default:
		c.failed("lift fence", e.Err)
	}
}

func (c *Core) onConfirm(e ConfirmReply) {
	cl := c.takeLane(e.Req, callConfirm)
	if cl == nil {
		if past := c.pastConfirms[e.Req]; past != nil && e.Err == nil {
			// Mutation: a stale answer applied as if just read.
			c.applyConfirmation(&call{seq: c.seq}, e.Conf)
		}
		return
	}
	switch {
	case e.Err == nil:
		c.succeeded()
		// The confirmation that ends a recovery lifts the fence before
		// it is applied: a unit it says is being handed over then goes
		// on to its UNPIN and release. Applied while still fenced, a
		// handover whose puller had already stopped was parked as held,
		// and the lift started its puller again.
		ends := c.recovery == recoverConfirm && cl.gen == c.fenceGen
		fencedApply := c.cfg.mutations.on(RecoveryConfirmAppliedFenced)
		lifted := ends && !fencedApply && c.unfence()
		c.applyConfirmation(cl, e.Conf)
		if ends && fencedApply {
			lifted = c.unfence() // Mutation: applied while still fenced.
		}
		c.waiting = len(e.Conf.Waiting)
		c.needConfirm = c.unsureSince(cl.seq) || cl.seq < c.staleRelease
		if lifted {
			c.resumePulling()
		}
		c.note(NoteConfirmed, ownership.Unit{}, float64(len(e.Conf.Held)),
			fmt.Sprintf("moved %d, handover %d, waiting %d", len(e.Conf.Moved), len(e.Conf.Handover), len(e.Conf.Waiting)))
	case leaseLost(e.Err):
		c.loseLease(e.Err)
	default:
		c.failed("confirm", e.Err)
	}
}

func (c *Core) onLeave(e LeaveReply) {
	cl := c.takeLane(e.Req, callLeave)
	if cl == nil {
		return
	}
	switch {
	case e.Err == nil, leaseLost(e.Err):
		// Refused as not a member: an earlier attempt whose reply was
		// lost already left.
		c.finish(nil)
	case errors.Is(e.Err, poolctl.ErrStillHolding):
		// A claim the member does not know of (a reply lost), or one
		// of an earlier incarnation still within its grace: confirm,
		// hand over, leave again, paced like any failed call.
		c.needConfirm = true
		c.failed("leave", e.Err)
	default:
		c.failed("leave", e.Err)
	}
}

// fence stops every puller at once: no row is delivered or settled until
// the fence lifts (P1, P5). Claims stay; recovery confirms them. A handover
// under way stops before its UNPIN: the unit may be adopted meanwhile.
func (c *Core) fence(reason string) {
	if c.fenced {
		return
	}
	c.fenced, c.fencedAt = true, c.now
	c.fenceGen++
	c.recovery = recoverRenew
	c.permDirty = true
	for _, u := range sortedUnits(c.units) {
		x := c.units[u]
		c.stopPuller(u, x)
		if x.state == stDraining {
			x.state, x.deadline = stHeld, 0
			c.touch(u)
		}
	}
	c.note(NoteFenced, ownership.Unit{}, float64(len(c.units)), reason)
}

// checkFence fences when the self-fence deadline has passed, before the
// event is applied: a process resumed after a pause may find a reply
// waiting before its timer.
func (c *Core) checkFence(ev Event) {
	if c.lease == nil || c.fenced || c.cfg.mutations.on(NoSelfFence) || c.now < c.fenceDue {
		return
	}
	if _, timer := ev.(Timer); !timer && c.cfg.mutations.on(NoLazyFenceCheck) {
		return
	}
	c.fence("lease not renewed in time")
}

// unfence ends a fence once the recovery confirmed the claims, and
// reports whether it did: a lease that ran out while recovering is
// renewed first.
func (c *Core) unfence() bool {
	c.recovery = recoverNone
	if !c.fenced {
		return false
	}
	if c.now >= c.fenceDue {
		c.recovery = recoverRenew
		return false
	}
	c.fenced = false
	c.permDirty = true
	c.note(NoteUnfenced, ownership.Unit{}, (c.now - c.fencedAt).Seconds(), "")
	return true
}

// resumePulling starts the pullers a fence stopped. They start once a
// snapshot read from now on shows the order barrier (startPuller): read
// it now rather than at the next tick.
func (c *Core) resumePulling() {
	c.ensurePullers()
	c.readSnapshot()
}

// loseLease fences and forgets a lease the registry will not renew, and
// joins again (Rejoin, naming the incarnation lost and this process). A
// later incarnation under this name (ErrStaleIncarnation) need not be
// another process's: it may be this process's own join that reached the
// registry after the member had given up on it and joined again. The
// registry tells the two apart by the process each incarnation was
// granted to, and refuses the rejoin (ErrDisplaced) only in the second
// case; then the member gives up (displaced).
func (c *Core) loseLease(err error) {
	c.fence("lease lost")
	c.note(NoteLeaseLost, ownership.Unit{}, 0, err.Error())
	c.lease = nil
	c.recovery = recoverNone
	c.unsureInFlight()
	if errors.Is(err, poolctl.ErrStaleIncarnation) && c.cfg.mutations.on(StaleIncarnationGivesUp) {
		c.displaced(err)
		return
	}
	if errors.Is(err, poolctl.ErrStaleIncarnation) {
		// Rejoin at once: were the later incarnation another process's,
		// waiting would not help, and were it this process's own, its
		// units wait for this member's confirmation.
		c.succeeded()
	} else {
		c.failed("lease", err)
	}
	if c.phase == phaseLeaving {
		c.finish(fmt.Errorf("lease lost while leaving: %w", err))
	}
}

// displaced ends a member whose rejoin the registry refused because a
// later process under its name is live. The pod name belongs to that
// process: this one is the old pod's (a partitioned pod replaced
// meanwhile) and gives up for good. Waiting for the other's lease to lapse
// and joining again, as it once did, races the other's own rejoin (after
// a registry outage, say): whichever joins second displaces the first,
// which then delivers outside its claim until its next renewal (found by
// the simulator, seeds 287, 1080, 1645, 3206).
func (c *Core) displaced(err error) {
	c.note(NoteDisplaced, ownership.Unit{}, float64(c.lastInc), "a later process under this name joined")
	c.lease = nil
	c.recovery = recoverNone
	c.finish(fmt.Errorf("displaced by a later process under the name %s: %w", c.cfg.Member, err))
}

// unsureInFlight turns the units of claims sent under an incarnation
// that is gone into unknown outcomes: a confirmation decides them.
func (c *Core) unsureInFlight() {
	ids := make([]ReqID, 0, len(c.claims))
	for id := range c.claims {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		cl := c.claims[id]
		if cl.incarnation == c.incarnation() {
			continue
		}
		for _, u := range cl.units {
			if x := c.units[u]; x != nil && x.state == stClaiming && x.req == cl.id {
				x.state, x.req = stUnsure, 0
				c.touch(u)
				c.needConfirm = true
			}
		}
	}
}

// unsureSince reports whether a unit became unsure after seq, so another
// confirmation is needed.
func (c *Core) unsureSince(seq uint64) bool {
	for u, x := range c.units {
		if x.state == stUnsure && c.changed[u] > seq {
			return true
		}
	}
	return false
}

// expected lists the units the member has a token for, for Confirm.
func (c *Core) expected() map[string]int64 {
	out := map[string]int64{}
	for u, x := range c.units {
		if x.hasToken() {
			out[u.String()] = x.token.Epoch
		}
	}
	return out
}

// reportActivity tells the registry, for each unit with a puller, the
// claim token it pulls under, since when (the puller's start, so the
// window opens no later than its first fetch and after the claim
// committed), and when it last pulled and received rows (P1, P7). A unit
// being handed over is not reported: its puller is draining, and the row
// goes. Best effort; one at a time.
func (c *Core) reportActivity() {
	if c.activity != nil || c.lease == nil {
		return
	}
	var acts []poolctl.UnitActivity
	for _, u := range sortedUnits(c.units) {
		x := c.units[u]
		if x.puller == nil || x.state != stHeld {
			continue
		}
		a := poolctl.UnitActivity{Unit: u.String(), Epoch: x.puller.token.Epoch, SinceFetch: -1, SinceRows: -1,
			SincePullStart: c.now - x.puller.started}
		if x.fetched {
			a.SinceFetch = c.now - x.lastFetch
		}
		if x.gotRows {
			a.SinceRows = c.now - x.lastRows
		}
		acts = append(acts, a)
	}
	c.activity = &call{id: c.newID()}
	c.emit(ReportActivity{Req: c.activity.id, Ref: c.ref(), Units: acts})
}

// onShutdown starts the graceful leave: every unit is handed over (the
// lease keeps being renewed meanwhile), then Leave.
func (c *Core) onShutdown() {
	switch {
	case c.lease == nil:
		c.finish(ErrNotJoined)
	case c.fenced:
		c.finish(fmt.Errorf("%w: %d units", ErrShutdownFenced, len(c.units)))
	default:
		c.phase = phaseLeaving
		c.plan = nil
	}
}

// leaving hands over every held unit while the member is leaving.
func (c *Core) leaving() {
	if c.phase != phaseLeaving || c.fenced {
		return
	}
	for _, u := range sortedUnits(c.units) {
		if c.units[u].state == stHeld {
			c.beginHandover(u)
		}
	}
}

// readyToLeave: nothing held, claimed, unknown or waiting to come home.
func (c *Core) readyToLeave() bool {
	return len(c.units) == 0 && len(c.claims) == 0 && len(c.releases) == 0 && !c.needConfirm && c.waiting == 0
}

// finish ends the core.
func (c *Core) finish(err error) {
	for _, u := range sortedUnits(c.units) {
		c.stopPuller(u, c.units[u])
	}
	c.phase = phaseDone
	if err == nil {
		c.note(NoteLeft, ownership.Unit{}, 0, "")
	}
	c.emit(Done{Err: err})
}
