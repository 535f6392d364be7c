package poolctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// This file is the fault matrix's world: simulated callers that follow the
// worker protocol of design.md section 7 against one backend, and the four
// checks. It never fails a test itself; it collects violations, and
// matrix_test.go compares the outcomes of the two backends.

// matrixBackend is a registry as the callers reach it: each caller has its
// own connection (link) that faults can cut; the observer's connection
// (raw) is never faulted.
type matrixBackend interface {
	name() string
	link(actor string) Registry
	raw() testRegistry
	cut(actor string)
	heal(actor string)
	// linkDown reports a cut link the backend does not cut for real.
	linkDown(actor string) bool
}

var (
	errInjected  = errors.New("injected statement error")
	errReplyLost = errors.New("reply lost after commit")
	errLinkDown  = errors.New("connection refused")
	errCrashed   = errors.New("caller crashed")
)

// heldToken is a caller's belief: a token and the incarnation it was
// obtained or confirmed under.
type heldToken struct {
	tok Token
	inc int64
}

// actor is one simulated caller: a worker ("a", "b", the probe "z") or the
// operator ("op").
type actor struct {
	name    string
	member  bool
	alive   bool
	stalled bool // cut off from the registry, still running
	left    bool
	joined  bool // ever tried to join
	lease   *Lease
	// sentAt is the caller's clock when it sent its last renewal that
	// succeeded; it delivers only until sentAt + TTL - fenceMargin.
	sentAt    time.Duration
	clockJump time.Duration
	// localFence: the caller fenced itself (deadline passed, lease lost or
	// fence lifted) and delivers nothing until a ConfirmOwned succeeds.
	localFence bool
	// fenced: the caller recorded a registry fence and delivers nothing.
	fenced  bool
	held    map[string]heldToken
	stopped map[string]bool // handing over or releasing
	pending int64           // operator: the pending epoch it created
}

func (a *actor) ref() MemberRef { return a.lease.MemberRef }

func (w *world) localNow(a *actor) time.Duration { return w.now + a.clockJump }

func (a *actor) deadline() time.Duration { return a.sentAt + matrixParams.LeaseTTL - fenceMargin }

// checkDeadline fences the caller when its own clock passed its deadline.
func (w *world) checkDeadline(a *actor) {
	if a.lease != nil && w.localNow(a) >= a.deadline() {
		a.localFence = true
	}
}

// delivering says whether the caller would fetch and ack the unit now.
func (w *world) delivering(a *actor, unit string) bool {
	h, ok := a.held[unit]
	return ok && a.alive && a.lease != nil && !a.left && !a.localFence && !a.fenced && !a.stopped[unit] &&
		h.inc == a.lease.Incarnation && w.localNow(a) < a.deadline()
}

func (a *actor) wipe() {
	a.lease, a.held, a.stopped = nil, map[string]heldToken{}, map[string]bool{}
	a.localFence, a.fenced, a.stalled, a.pending = false, false, false, 0
}

// world is one combination's run.
type world struct {
	ctx    context.Context
	be     matrixBackend
	topo   string
	now    time.Duration
	actors map[string]*actor
	seq    int64

	fault        faultKind
	trace        []string
	violations   []string
	tokens       []Token
	committed    map[string]bool // units whose claim committed at least once
	summary      string
	finalClaims  string
	faultApplied bool
}

func newWorld(ctx context.Context, be matrixBackend, topo string, sc scenario) (*world, error) {
	w := &world{ctx: ctx, be: be, topo: topo, actors: map[string]*actor{}, committed: map[string]bool{}}
	for _, n := range []string{"a", "b", "z", "op"} {
		a := &actor{name: n, member: n != "op", alive: true}
		a.wipe()
		w.actors[n] = a
	}
	r := be.raw()
	if err := r.EnsureTopology(ctx, topo, matrixParams); err != nil {
		return nil, err
	}
	e, err := r.CreatePending(ctx, topo, sc.shape[0], sc.shape[1])
	if err != nil {
		return nil, err
	}
	return w, r.Activate(ctx, topo, e)
}

func (w *world) violate(format string, args ...any) {
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

func (w *world) note(a *actor, what string, err error) {
	w.trace = append(w.trace, fmt.Sprintf("%s %s=%s", a.name, what, errClass(err)))
}

// do runs one registry call by a, injecting the world's fault when inject
// is set. committed reports whether the call itself succeeded (so its
// effects are in the registry), whatever the caller was told.
func (w *world) do(a *actor, what string, inject bool, f func(r Registry) error) (err error, committed bool) {
	if inject {
		w.faultApplied = true
		switch w.fault {
		case faultStatement:
			w.note(a, what, errInjected)
			return errInjected, false
		case faultConnCut:
			w.be.cut(a.name)
		}
	}
	if w.be.linkDown(a.name) {
		err = errLinkDown
	} else {
		err = f(w.be.link(a.name))
	}
	committed = err == nil
	if inject && w.fault == faultReplyLost && err == nil {
		err = errReplyLost
	}
	w.note(a, what, err)
	if inject {
		switch w.fault {
		case faultCrash:
			a.alive = false
			a.wipe()
			return errCrashed, committed
		case faultClockJump:
			a.clockJump += matrixParams.LeaseTTL
			w.checkDeadline(a)
		}
	}
	return err, committed
}

func isLeaseLoss(err error) bool {
	return errors.Is(err, ErrLeaseExpired) || errors.Is(err, ErrStaleIncarnation) || errors.Is(err, ErrNotMember)
}

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
		w.do(a, "fence", inject, func(r Registry) error { return r.Fence(w.ctx, a.ref()) })
	case opUnfence:
		err, _ := w.do(a, "unfence", inject, func(r Registry) error { return r.Unfence(w.ctx, a.ref()) })
		if err == nil {
			a.fenced, a.localFence = false, true // deliver again only after ConfirmOwned
		}
	case opClaim:
		w.claimAs(a, s.unit, inject)
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
		l, err = r.Join(w.ctx, w.topo, a.name)
		return err
	})
	if err == nil {
		a.lease, a.sentAt, a.left = &l, sent, false
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
	a.held, a.stopped = map[string]heldToken{}, map[string]bool{}
	for u, t := range c.Held {
		a.held[u] = heldToken{tok: t, inc: a.lease.Incarnation}
	}
	for _, u := range c.Handover {
		a.stopped[u] = true
	}
	if w.localNow(a) < a.deadline() {
		a.localFence = false
	}
}

// claimAs claims unit for a under the active epoch, and checks P5 on any
// adoption against the registry's state just before.
func (w *world) claimAs(a *actor, unit string, inject bool) error {
	before, err := w.be.raw().Snapshot(w.ctx, w.topo)
	if err != nil {
		w.violate("snapshot before claim: %v", err)
		return err
	}
	var under int64
	if before.Active != nil {
		under = before.Active.Number
	}
	var c Claim
	err, committed := w.do(a, "claim "+unit, inject, func(r Registry) (err error) {
		c, err = r.Claim(w.ctx, a.ref(), under, unit)
		return err
	})
	if committed {
		w.committed[unit] = true
		w.tokens = append(w.tokens, c.Token)
		if c.Adopted {
			w.checkAdoption(a, c, before)
		}
	}
	if err == nil && a.alive {
		a.held[unit] = heldToken{tok: c.Token, inc: a.lease.Incarnation}
		delete(a.stopped, unit)
	}
	return err
}

// checkAdoption verifies P5 for one adoption. checks P5
func (w *world) checkAdoption(a *actor, c Claim, before Snapshot) {
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

// recover is a caller coming back after a fault: renew or rejoin, then
// confirm everything it holds in one statement.
func (w *world) recover(a *actor) {
	if !a.alive || a.left || !a.member || !a.joined {
		return
	}
	w.be.heal(a.name)
	a.stalled = false
	if a.lease != nil {
		if err := w.renewMember(a, false); isLeaseLoss(err) {
			a.lease = nil
		}
	}
	if a.lease == nil {
		w.joinMember(a, false)
		if a.lease == nil {
			return
		}
	}
	w.confirmMember(a, false)
}

// probe returns the member "z", joining it first if needed.
func (w *world) probe() *actor {
	z := w.actors["z"]
	if z.lease == nil {
		w.recover(z)
		if !z.joined {
			w.joinMember(z, false)
		}
	}
	return z
}

func (w *world) sortedActors() []*actor {
	out := []*actor{}
	for _, n := range []string{"a", "b", "z", "op"} {
		out = append(out, w.actors[n])
	}
	return out
}

// advance moves time in renewal-sized chunks: the registry's clock and
// every caller's clock move together; members that are not stalled renew
// (and recover if their lease was lost), and the probe acknowledges any
// pending epoch.
func (w *world) advance(d time.Duration) {
	for d > 0 {
		c := min(d, tickChunk)
		d -= c
		w.now += c
		if err := w.be.raw().ShiftClock(w.ctx, w.topo, c); err != nil {
			w.violate("shift clock: %v", err)
		}
		for _, a := range w.sortedActors() {
			if !a.member || !a.alive || a.stalled || a.left || a.lease == nil {
				continue
			}
			w.checkDeadline(a)
			err := w.renewMember(a, false)
			switch {
			case isLeaseLoss(err):
				a.lease = nil
				w.recover(a)
			case err == nil && a.localFence:
				w.confirmMember(a, false)
			}
			if a.name == "z" && a.lease != nil {
				if s, err := w.be.raw().Snapshot(w.ctx, w.topo); err == nil && s.Pending != nil && !slices.Contains(s.Pending.Acked, "z") {
					w.do(a, "ack-freeze", false, func(r Registry) error { return r.AckFreeze(w.ctx, a.ref(), s.Pending.Number) })
				}
			}
		}
		w.observe(fmt.Sprintf("t=%v", w.now))
	}
}

// observe checks P1 at one instant: at most one caller delivers each unit,
// and every caller that delivers holds a valid token.
func (w *world) observe(where string) {
	owners := map[string][]string{}
	for _, a := range w.sortedActors() {
		w.checkDeadline(a)
		for u, h := range a.held {
			if !w.delivering(a, u) {
				continue
			}
			owners[u] = append(owners[u], a.name)
			if err := w.be.raw().CheckToken(w.ctx, h.tok); err != nil {
				w.violate("P1 at %s: %s delivers %s with an invalid token: %v", where, a.name, u, errClass(err))
			}
		}
	}
	for u, names := range owners {
		if len(names) > 1 {
			sort.Strings(names)
			w.violate("P1 at %s: %s all deliver %s", where, strings.Join(names, ", "), u)
		}
	}
}

func errClass(err error) string {
	var (
		he *HeldError
		se *StaleEpochError
		pe *pgconn.PgError
	)
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, errInjected):
		return "injected"
	case errors.Is(err, errReplyLost):
		return "reply-lost"
	case errors.Is(err, errCrashed):
		return "crashed"
	case errors.As(err, &he):
		return "held/" + string(he.Reason)
	case errors.As(err, &se):
		return "stale/" + string(se.Reason)
	case errors.As(err, &pe):
		return "sql/" + pe.Code + "/" + pe.Message
	}
	for _, s := range []error{ErrUnknownTopology, ErrNotMember, ErrStaleIncarnation, ErrLeaseExpired, ErrFenced,
		ErrNoActiveEpoch, ErrEpochMoved, ErrFrozen, ErrUnitOutOfRange, ErrStillHolding, ErrPendingExists,
		ErrEpochState, ErrFreezeIncomplete, ErrConflict, ErrInvalid} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "net"
}
