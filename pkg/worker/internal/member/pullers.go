package member

import (
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// startPuller starts u's puller if u is held, the member is live, not
// leaving and not fenced, and no earlier puller of u is still running: two pullers of one
// unit in one process would run two handlers at once.
func (c *Core) startPuller(u ownership.Unit, x *unit) {
	if x.state != stHeld || x.puller != nil || c.fenced || c.lease == nil || c.phase != phaseMember || c.lingering[u] != nil ||
		c.barrierGen != c.fenceGen && !c.cfg.mutations.on(PullersBeforeBarrierRead) {
		return
	}
	c.pullers++
	x.puller = &pullerRef{id: PullerID(c.pullers), token: x.token, started: c.now}
	c.emit(StartPuller{Puller: x.puller.id, Unit: u, Token: x.token, Incarnation: c.incarnation(), Under: x.under,
		Unpin: !c.cfg.mutations.on(UnpinSkippedBeforeFirstPull), Takeover: x.takeover, From: x.from,
		Reset: c.reset, ResetReadAt: c.resetAt})
}

// ensurePullers starts a puller for every held unit without one (after a
// fence lifts, or a puller that ended on its own).
func (c *Core) ensurePullers() {
	for _, u := range sortedUnits(c.units) {
		c.startPuller(u, c.units[u])
	}
}

// stopPuller stops u's puller at once, bounded by the stop bound.
func (c *Core) stopPuller(u ownership.Unit, x *unit) {
	p := x.puller
	if p == nil || p.state == pStopping {
		return
	}
	p.state, p.deadline = pStopping, c.now+c.cfg.StopBound
	c.emit(StopPuller{Puller: p.id, Unit: u})
}

// detachPuller stops u's puller and lets it linger until it reports: the
// unit gets no new puller before then.
func (c *Core) detachPuller(u ownership.Unit, x *unit) {
	if x.puller == nil {
		return
	}
	c.stopPuller(u, x)
	c.lingering[u] = x.puller
	x.puller = nil
}

func (c *Core) onStopped(e PullerStopped) {
	if p := c.lingering[e.Unit]; p != nil && p.id == e.Puller {
		delete(c.lingering, e.Unit)
		if x := c.units[e.Unit]; x != nil {
			c.startPuller(e.Unit, x)
		}
		return
	}
	x := c.units[e.Unit]
	if x == nil || x.puller == nil || x.puller.id != e.Puller {
		return
	}
	asked := x.puller.state != pRunning
	x.puller = nil
	if e.Withheld {
		x.takeover = true // the next puller RESETs, so withheld rows come back at once
	}
	if e.DrainTimedOut {
		c.note(NoteDrainTimeout, e.Unit, 0, "unsettled rows nak'd for the next owner")
	}
	switch {
	case x.state == stDraining:
		c.afterDrain(e.Unit, x)
	case asked:
		// Stopped for a fence: a new puller starts when it lifts.
		c.startPuller(e.Unit, x)
	}
	// A puller that ended on its own is started again at the next tick.
}

func (c *Core) onPrepared(e PullerPrepared) {
	if x := c.units[e.Unit]; x != nil && x.puller != nil && x.puller.id == e.Puller {
		x.takeover = false
	}
}

func (c *Core) onFetched(e PullerFetched) {
	x := c.units[e.Unit]
	if x == nil || x.puller == nil || x.puller.id != e.Puller {
		return
	}
	x.lastFetch, x.fetched = c.now, true
	if e.Rows > 0 {
		x.lastRows, x.gotRows = c.now, true
	}
}

// expireDeadlines stops waiting for pullers that did not report in time
// (a handler that ignores its context): a drain moves on to UNPIN and
// release with the puller's permission revoked, and the puller lingers,
// so its unit gets no second puller in this process until it ends.
func (c *Core) expireDeadlines() {
	var due []ownership.Unit
	for u, x := range c.units {
		if x.deadline > 0 && c.now >= x.deadline || x.puller != nil && x.puller.deadline > 0 && c.now >= x.puller.deadline {
			due = append(due, u)
		}
	}
	sortUnits(due) // the order of notes and actions must not depend on map order
	for _, u := range due {
		x := c.units[u]
		if x.state == stDraining && x.deadline > 0 && c.now >= x.deadline {
			c.stuck(u, x)
			c.afterDrain(u, x)
		} else if p := x.puller; p != nil && p.state == pStopping && p.deadline > 0 && c.now >= p.deadline {
			c.stuck(u, x)
		}
	}
	for _, u := range sortedUnits(c.lingering) {
		if p := c.lingering[u]; p.deadline > 0 && c.now >= p.deadline {
			p.deadline = 0
			c.note(NoteStuckPuller, u, 0, "puller did not stop in time; its handler ignores its context")
		}
	}
}

// stuck moves u's unresponsive puller to the lingering set.
func (c *Core) stuck(u ownership.Unit, x *unit) {
	if x.puller == nil {
		return
	}
	c.stopPuller(u, x)
	x.puller.deadline = 0
	c.note(NoteStuckPuller, u, 0, "puller did not stop in time; its handler ignores its context")
	c.lingering[u] = x.puller
	x.puller = nil
}
