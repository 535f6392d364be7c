package member

import (
	"errors"
	"sort"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// A handover runs held -> draining -> unpinning -> releasing -> forgotten.
// The state changes in the same step as the decision, so no confirmation
// or claim reply handled later can see the unit as held (issue 20 defect
// 2). UNPIN is sent once, before the first Release and never while
// fenced: a retried release must not UNPIN the unit's next holder.

// beginHandover starts giving u up: its puller stops fetching and settles
// what it delivered, for at most the drain timeout plus the stop bound.
func (c *Core) beginHandover(u ownership.Unit) {
	x := c.units[u]
	if x == nil || x.state != stHeld {
		return
	}
	x.state, x.handoverAt = stDraining, c.now
	c.touch(u)
	switch {
	case x.puller == nil:
		c.afterDrain(u, x)
	case x.puller.state == pRunning:
		x.puller.state = pDraining
		x.deadline = c.now + c.drain + c.cfg.StopBound
		c.emit(DrainPuller{Puller: x.puller.id, Unit: u, Timeout: c.drain})
	default: // stopping after a fence: wait for its report, bounded
		x.deadline = c.now + c.cfg.StopBound
	}
}

// afterDrain moves on once u's puller stopped (or the bound passed): the
// delivery permission is revoked and the pin lifted. A member fenced
// meanwhile stops here: its unit may have been adopted, and an UNPIN would
// take the pin from the adopter. Recovery and the next tick decide again.
func (c *Core) afterDrain(u ownership.Unit, x *unit) {
	x.deadline = 0
	if c.fenced {
		x.state = stHeld
		c.touch(u)
		return
	}
	x.state, x.req = stUnpinning, c.newID()
	c.unpins[x.req] = u
	c.touch(u)
	c.emit(Unpin{Req: x.req, Unit: u})
}

func (c *Core) onUnpinDone(e UnpinDone) {
	u, ok := c.unpins[e.Req]
	if !ok {
		return
	}
	delete(c.unpins, e.Req)
	x := c.units[u]
	if x == nil || x.state != stUnpinning || x.req != e.Req {
		return
	}
	x.state, x.req = stReleasing, 0
	c.touch(u)
}

// flushReleases sends every queued release in one call (ClaimBatch per
// call when set), when none is in flight: releases that become ready while
// one is in flight go together in the next.
func (c *Core) flushReleases() {
	if len(c.releases) > 0 {
		return
	}
	var ready []ownership.Unit
	for u, x := range c.units {
		if x.state == stReleasing && x.req == 0 && !x.parked {
			ready = append(ready, u)
		}
	}
	sortUnits(ready)
	for _, batch := range inBatches(ready, c.cfg.ClaimBatch) {
		cl := &call{id: c.newID(), units: batch}
		for _, u := range batch {
			x := c.units[u]
			x.req = cl.id
			cl.tokens = append(cl.tokens, x.token)
		}
		c.releases[cl.id] = cl
		c.emit(Release{Req: cl.id, Tokens: cl.tokens})
	}
}

// onRelease forgets every unit the registry released, or that was no
// longer this member's at that token. A release whose outcome is unknown is
// sent again at the next tick with the same token: the registry's
// compare-and-set makes the repeat a no-op or a refusal, never a loss.
func (c *Core) onRelease(e ReleaseReply) {
	cl := c.releases[e.Req]
	if cl == nil {
		return
	}
	delete(c.releases, e.Req)
	for i, u := range cl.units {
		x := c.units[u]
		if x == nil || x.state != stReleasing || x.req != cl.id || x.token != cl.tokens[i] {
			continue
		}
		err := e.Err
		if err == nil && i < len(e.Errs) {
			err = e.Errs[i]
		}
		if err != nil && !errors.Is(err, poolctl.ErrStaleEpoch) {
			x.req, x.parked = 0, true
			c.note(NoteCallFailed, u, 0, "release: "+err.Error())
			continue
		}
		if err != nil {
			// Refused as stale: the unit may still be this member's at a
			// newer epoch (a confirmation re-homed it onto a new
			// incarnation while the release was out). Forgotten here, it
			// would stay with this live member for good: a confirmation
			// tells, and brings it back to be handed over (found by the
			// simulator, seed 98558).
			c.needConfirm = true
		}
		c.note(NoteHandedOver, u, (c.now - x.handoverAt).Seconds(), "")
		c.forget(u)
		if err != nil {
			// A confirmation asked before this forget does not count.
			c.staleRelease = c.seq
		}
	}
}

// forget drops u; a puller it still has is stopped.
func (c *Core) forget(u ownership.Unit) {
	x := c.units[u]
	if x == nil {
		return
	}
	c.detachPuller(u, x)
	delete(c.units, u)
	c.touch(u)
}

// applyConfirmation applies a ConfirmOwned answer, unit by unit, only to
// units that have not changed since the question was asked: a unit
// released, claimed or handed over meanwhile is not brought back by an
// answer read before (issue 20 defect 1).
func (c *Core) applyConfirmation(cl *call, conf poolctl.Confirmation) {
	current := func(u ownership.Unit) bool {
		return c.changed[u] <= cl.seq || c.cfg.mutations.on(ConfirmWithoutVersionCheck)
	}
	handover := map[string]bool{}
	for _, name := range conf.Handover {
		handover[name] = true
	}
	waiting := map[string]bool{}
	for _, name := range conf.Waiting {
		waiting[name] = true
	}
	for _, name := range sortedNames(conf.Held) {
		if u, err := ownership.ParseUnit(name); err == nil && current(u) {
			c.confirmed(u, conf.Held[name], handover[name])
		}
	}
	for _, name := range conf.Waiting {
		// An earlier incarnation's claim not re-homed yet (its lease plus
		// the grace has not passed): this incarnation has no valid token
		// for it, so no puller may run for it until a later confirmation
		// re-homes it onto this incarnation (found by the simulator, seed
		// 46: a rejoined member delivered under the old incarnation's
		// token).
		if u, err := ownership.ParseUnit(name); err == nil && c.units[u] != nil && current(u) {
			c.forget(u)
		}
	}
	for _, mv := range conf.Moved {
		u, err := ownership.ParseUnit(mv.Unit)
		if x := c.units[u]; err == nil && x != nil && x.hasToken() && x.token.Epoch == mv.Expected && current(u) {
			c.forget(u)
		}
	}
	for _, u := range sortedUnits(c.units) {
		x := c.units[u]
		_, held := conf.Held[u.String()]
		if x.state == stUnsure && !held && !waiting[u.String()] && current(u) {
			c.forget(u) // the claim never committed
		}
	}
}

// confirmed applies one held claim of a confirmation to u.
func (c *Core) confirmed(u ownership.Unit, t poolctl.Token, handover bool) {
	x := c.units[u]
	switch {
	case x == nil:
		// An earlier incarnation's claim, re-homed onto this one: its
		// process's pin and unacked rows are ours to lift.
		x = &unit{state: stHeld, token: t, takeover: true, from: c.cfg.Member + " (earlier incarnation)"}
		c.units[u] = x
	case x.confirmable() || c.cfg.mutations.on(ConfirmDuringHandoverStartsPuller):
		if x.token != t || !x.hasToken() || x.state != stHeld {
			// A lost claim reply (it may have been an adoption) or a
			// re-home: the old puller's token is stale.
			c.detachPuller(u, x)
			x.takeover = true
		}
		x.state, x.req, x.token = stHeld, 0, t
	case x.token != t:
		// Being handed over and re-homed meanwhile: the release must
		// carry the current token, or it is refused and the unit
		// stranded with this member.
		x.token = t
		if x.state == stReleasing {
			x.req = 0
		}
	default:
		return
	}
	c.touch(u)
	if handover && x.state == stHeld {
		c.beginHandover(u) // the member gave it up before a restart
		return
	}
	if !c.fenced && c.recovery == recoverNone {
		c.startPuller(u, x)
	}
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
