package poolctl

import (
	"errors"
	"fmt"
	"strings"
)

// This file is what each scenario step does in the fault matrix's world:
// the callers follow the worker protocol of design.md section 7.

// runStep runs one scenario step; inject applies the fault to it.
func (w *world) runStep(s step, inject bool) {
	a := w.actors[s.actor]
	switch s.op {
	case opAdvance:
		w.advance(s.d)
		return
	case opStall:
		a.stalled = true
		return
	case opWake:
		a.stalled = false
		w.be.heal(a.name)
		return
	case opRestart:
		a.alive = true
		a.wipe()
		if !a.member {
			w.operatorReload(a)
		}
		return
	}
	if !a.alive || a.stalled || a.left || (a.member && s.op != opJoin && a.lease == nil) {
		w.trace = append(w.trace, fmt.Sprintf("%s=skip", s))
		return
	}
	switch s.op {
	case opJoin:
		w.joinMember(a, inject)
	case opRenew:
		w.renewMember(a, inject)
	case opLeave:
		err, _ := w.do(a, "leave", inject, func(r Registry) error { return r.Leave(w.ctx, a.ref()) })
		if err == nil {
			a.left, a.lease = true, nil
		}
	case opFence:
		a.fenced = true // stop delivering before recording it
		a.fenceGen++
		gen := a.fenceGen
		w.do(a, "fence", inject, func(r Registry) error { return r.Fence(w.ctx, a.ref(), gen) })
	case opLateFence:
		// The Fence of the last generation arrives again, after its
		// Unfence (an asynchronous send that was delayed): it must change
		// nothing.
		gen := a.fenceGen
		w.do(a, "late-fence", inject, func(r Registry) error { return r.Fence(w.ctx, a.ref(), gen) })
	case opUnfence:
		gen := a.fenceGen
		err, _ := w.do(a, "unfence", inject, func(r Registry) error { return r.Unfence(w.ctx, a.ref(), gen) })
		if err == nil {
			a.fenced, a.localFence = false, true // deliver again only after ConfirmOwned
		}
	case opClaim:
		w.claimAs(a, s.unit, inject)
	case opClaimMany:
		w.claimManyAs(a, s.units, inject)
	case opReleaseMany:
		w.releaseManyAs(a, s.units, inject)
	case opSetRetiring:
		units := s.units
		w.do(a, "set-retiring "+strings.Join(units, ","), inject, func(r Registry) error { return r.SetRetiring(w.ctx, w.topo, units) })
	case opHandover:
		h, ok := a.held[s.unit]
		if !ok {
			w.trace = append(w.trace, fmt.Sprintf("%s=skip", s))
			return
		}
		a.stopped[s.unit] = true
		err, _ := w.do(a, "handover "+s.unit+"->"+s.to, inject, func(r Registry) error { return r.Handover(w.ctx, h.tok, s.to) })
		if errors.Is(err, ErrStaleEpoch) {
			delete(a.held, s.unit)
		}
	case opRelease:
		w.releaseAs(a, s.unit, inject)
	case opConfirm:
		w.confirmMember(a, inject)
	case opCheckpoint:
		if !w.delivering(a, s.unit) {
			w.trace = append(w.trace, fmt.Sprintf("%s=skip", s))
			return
		}
		w.seq++
		h := a.held[s.unit]
		err, _ := w.do(a, "checkpoint "+s.unit, inject, func(r Registry) error { return r.Checkpoint(w.ctx, h.tok, w.seq) })
		if errors.Is(err, ErrStaleEpoch) {
			delete(a.held, s.unit)
		}
	case opAck:
		snap, err := w.be.raw().Snapshot(w.ctx, w.topo)
		if err != nil || snap.Pending == nil {
			w.trace = append(w.trace, a.name+" ack-freeze=skip")
			return
		}
		w.do(a, "ack-freeze", inject, func(r Registry) error { return r.AckFreeze(w.ctx, a.ref(), snap.Pending.Number) })
	case opCreatePending:
		var e int64
		err, _ := w.do(a, "create-pending", inject, func(r Registry) (err error) {
			e, err = r.CreatePending(w.ctx, w.topo, s.shape[0], s.shape[1])
			return err
		})
		if err == nil {
			a.pending = e
		}
	case opActivate:
		if a.pending == 0 {
			w.trace = append(w.trace, "op activate=skip")
			return
		}
		err, _ := w.do(a, "activate", inject, func(r Registry) error { return r.Activate(w.ctx, w.topo, a.pending) })
		if err == nil {
			a.pending = 0
		}
	default:
		panic("unknown step " + s.String())
	}
}

// operatorReload is the operator rebuilding its state from the registry.
func (w *world) operatorReload(a *actor) {
	if s, err := w.be.raw().Snapshot(w.ctx, w.topo); err == nil && s.Pending != nil {
		a.pending = s.Pending.Number
	}
}

func (w *world) joinMember(a *actor, inject bool) {
	a.joined = true
	sent := w.localNow(a)
	var l Lease
	err, _ := w.do(a, "join", inject, func(r Registry) (err error) {
		// As a worker does: its first join and every later one name the
		// process and the last incarnation it was granted.
		l, err = r.Rejoin(w.ctx, MemberRef{Topology: w.topo, Member: a.name, Incarnation: a.lastInc}, a.process)
		return err
	})
	if err == nil {
		a.lease, a.sentAt, a.left, a.fenceGen, a.lastInc = &l, sent, false, 0, l.Incarnation
		if l.Params != matrixParams {
			w.violate("%s's first lease carries %+v, want the topology's parameters", a.name, l.Params)
		}
	}
}

func (w *world) renewMember(a *actor, inject bool) error {
	sent := w.localNow(a)
	err, _ := w.do(a, "renew", inject, func(r Registry) error {
		_, err := r.Renew(w.ctx, a.ref())
		return err
	})
	switch {
	case err == nil && a.lease != nil:
		a.sentAt = sent
	case isLeaseLoss(err):
		a.localFence = true
	}
	return err
}

func (w *world) confirmMember(a *actor, inject bool) {
	expected := map[string]int64{}
	for u, h := range a.held {
		expected[u] = h.tok.Epoch
	}
	var c Confirmation
	err, committed := w.do(a, "confirm", inject, func(r Registry) (err error) {
		c, err = r.ConfirmOwned(w.ctx, a.ref(), expected)
		return err
	})
	if committed {
		for _, t := range c.Held {
			w.tokens = append(w.tokens, t)
		}
	}
	if err != nil || !a.alive {
		if isLeaseLoss(err) {
			a.localFence = true
		}
		return
	}
	a.held, a.stopped, a.waiting = map[string]heldToken{}, map[string]bool{}, map[string]bool{}
	for u, t := range c.Held {
		a.held[u] = heldToken{tok: t, inc: a.lease.Incarnation}
	}
	for _, u := range c.Handover {
		a.stopped[u] = true
	}
	for _, u := range c.Waiting {
		a.waiting[u] = true
	}
	if w.localNow(a) < a.deadline() {
		a.localFence = false
	}
}

// claimAs claims unit for a under the active epoch, and checks P5 on any
// adoption against the registry's state just before.
func (w *world) claimAs(a *actor, unit string, inject bool) error {
	before, under, err := w.beforeClaim()
	if err != nil {
		return err
	}
	var c Claim
	err, committed := w.do(a, "claim "+unit, inject, func(r Registry) (err error) {
		c, err = r.Claim(w.ctx, a.ref(), under, unit)
		return err
	})
	w.afterClaim(a, before, ClaimOutcome{Unit: unit, Claim: c, Err: err}, committed, inject)
	return err
}

// claimManyAs claims units in one batch, with the same checks per unit.
func (w *world) claimManyAs(a *actor, units []string, inject bool) {
	before, under, err := w.beforeClaim()
	if err != nil {
		return
	}
	var outs []ClaimOutcome
	err, committed := w.do(a, "claim-many "+strings.Join(units, ","), inject, func(r Registry) (err error) {
		outs, err = r.ClaimMany(w.ctx, a.ref(), under, units)
		return err
	})
	for i, u := range units {
		o, made := ClaimOutcome{Unit: u, Err: err}, false
		if committed {
			o, made = outs[i], outs[i].Err == nil
			if err != nil {
				o.Err = err // the caller did not get the reply
			} else {
				w.trace = append(w.trace, fmt.Sprintf("%s claim-many %s: %s", a.name, u, errClass(o.Err)))
			}
		}
		w.afterClaim(a, before, o, made, inject)
	}
}

// beforeClaim reads what a claim is checked against, and the epoch to
// claim under.
func (w *world) beforeClaim() (Snapshot, int64, error) {
	before, err := w.be.raw().Snapshot(w.ctx, w.topo)
	if err != nil {
		w.violate("snapshot before claim: %v", err)
		return Snapshot{}, 0, err
	}
	var under int64
	if before.Active != nil {
		under = before.Active.Number
	}
	return before, under, nil
}

// afterClaim records one unit's claim outcome: tokens issued, P5 on
// adoptions, the caller's belief, and the lost-reply check (defect 9).
func (w *world) afterClaim(a *actor, before Snapshot, o ClaimOutcome, committed, inject bool) {
	c, unit := o.Claim, o.Unit
	if !committed && inject && w.fault != faultStatement && a.lease != nil {
		// The caller does not know whether the claim happened; the
		// registry does.
		c, committed = w.claimIfMade(a, unit)
	}
	if committed {
		w.committed[unit] = true
		w.tokens = append(w.tokens, c.Token)
		if c.Adopted {
			w.checkAdoption(a, c, before)
		}
		if o.Err != nil {
			w.lost[unit] = w.decisionOf(a, unit)
		}
	}
	if o.Err == nil && committed {
		w.checkRepeat(a, c)
	}
	if o.Err == nil && a.alive {
		a.held[unit] = heldToken{tok: c.Token, inc: a.lease.Incarnation}
		delete(a.stopped, unit)
		delete(a.waiting, unit)
	}
}

// lostClaim is a claim decision whose reply the caller did not get.
type lostClaim struct {
	inc, epoch       int64
	adopted, rehomed bool
	from             string
}

// claimIfMade reads whether a's current incarnation holds unit, after a
// call with an unknown outcome, and returns the claim as the registry has
// it.
func (w *world) claimIfMade(a *actor, unit string) (Claim, bool) {
	claims, err := w.be.raw().Claims(w.ctx, w.topo)
	if err != nil {
		w.violate("claims: %v", err)
		return Claim{}, false
	}
	for _, c := range claims {
		if c.Unit == unit && c.Owner == a.name && c.OwnerIncarnation == a.lease.Incarnation && c.State != StateFree {
			return Claim{Token: Token{Topology: w.topo, Unit: unit, Member: a.name, Epoch: c.Epoch}}, true
		}
	}
	return Claim{}, false
}

// decisionOf reads the decision that gave a the unit from the history.
func (w *world) decisionOf(a *actor, unit string) lostClaim {
	h, err := w.be.raw().(HistoryReader).ClaimHistory(w.ctx, w.topo)
	if err != nil {
		w.violate("claim history: %v", err)
		return lostClaim{}
	}
	var prev, last ClaimEvent
	for _, e := range h {
		if e.Unit == unit {
			prev, last = last, e
		}
	}
	l := lostClaim{inc: last.Incarnation, epoch: last.Epoch, adopted: last.Op == "adopt", rehomed: last.Op == "rehome"}
	switch {
	case l.adopted:
		l.from = prev.Owner
	case l.rehomed:
		l.from = a.name
	}
	return l
}

// checkRepeat: a claim that repeats one whose reply was lost reports the
// decision as it was taken (defect 9).
func (w *world) checkRepeat(a *actor, c Claim) {
	l, ok := w.lost[c.Unit]
	if !ok || l.inc != a.lease.Incarnation || l.epoch != c.Epoch {
		return
	}
	delete(w.lost, c.Unit)
	if c.Adopted != l.adopted || c.Rehomed != l.rehomed || c.From != l.from {
		w.violate("defect 9: %s's repeat of its claim of %s reported adopted=%v rehomed=%v from %q; the decision was adopted=%v rehomed=%v from %q",
			a.name, c.Unit, c.Adopted, c.Rehomed, c.From, l.adopted, l.rehomed, l.from)
	}
}

// checkAdoption verifies P5 for one adoption. checks P5
func (w *world) checkAdoption(a *actor, c Claim, before Snapshot) {
	if c.At.IsZero() {
		return // known only from the registry; its time is not
	}
	grace := before.Params.Grace
	if from := before.Member(c.From); from == nil || c.At.Before(from.LeaseExpiresAt.Add(grace)) {
		w.violate("P5: %s adopted %s from %s before its lease expiry plus grace", a.name, c.Unit, c.From)
	}
	if me := before.Member(a.name); me == nil || me.Fenced ||
		(!me.FenceLiftedAt.IsZero() && c.At.Before(me.FenceLiftedAt.Add(grace))) {
		w.violate("P5: %s adopted %s while fenced or within the grace after its fence lifted", a.name, c.Unit)
	}
}

func (w *world) releaseAs(a *actor, unit string, inject bool) error {
	h, ok := a.held[unit]
	if !ok {
		w.trace = append(w.trace, a.name+" release "+unit+"=skip")
		return nil
	}
	a.stopped[unit] = true // stop delivering before giving it up
	err, _ := w.do(a, "release "+unit, inject, func(r Registry) error { return r.Release(w.ctx, h.tok) })
	if err == nil || errors.Is(err, ErrStaleEpoch) {
		delete(a.held, unit)
		delete(a.stopped, unit)
	}
	return err
}

// releaseManyAs releases the units a holds among units, in one batch.
func (w *world) releaseManyAs(a *actor, units []string, inject bool) {
	var toks []Token
	for _, u := range units {
		if h, ok := a.held[u]; ok {
			toks = append(toks, h.tok)
			a.stopped[u] = true
		}
	}
	if len(toks) == 0 {
		w.trace = append(w.trace, a.name+" release-many=skip")
		return
	}
	var errs []error
	err, committed := w.do(a, "release-many "+strings.Join(units, ","), inject, func(r Registry) (err error) {
		errs, err = r.ReleaseMany(w.ctx, toks)
		return err
	})
	if err != nil || !committed {
		return
	}
	for i, t := range toks {
		w.trace = append(w.trace, fmt.Sprintf("%s release-many %s: %s", a.name, t.Unit, errClass(errs[i])))
		if errs[i] == nil || errors.Is(errs[i], ErrStaleEpoch) {
			delete(a.held, t.Unit)
			delete(a.stopped, t.Unit)
		}
	}
}
