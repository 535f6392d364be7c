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
	// wire runs f over the actor's link with a wire fault (faultWireCut
	// or faultWireLost) armed on its connection, and reports whether the
	// fault struck the call. what names the call (see multiTrip).
	wire(actor string, kind faultKind, what string, f func(Registry) error) (err error, struck bool)
}

var (
	errInjected  = errors.New("injected statement error")
	errReplyLost = errors.New("reply lost after commit")
	errLinkDown  = errors.New("connection refused")
	errCrashed   = errors.New("caller crashed")
	errWire      = errors.New("connection cut by the wire fault")
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
	fenced bool
	// fenceGen is the caller's last local fence generation (0 after a join).
	fenceGen int64
	held     map[string]heldToken
	// waiting are units an earlier incarnation holds that ConfirmOwned did
	// not re-home yet (the re-home grace); the caller confirms again.
	waiting map[string]bool
	stopped map[string]bool // handing over or releasing
	pending int64           // operator: the pending epoch it created
	// process names the actor's current process for Rejoin, and lastInc
	// is the last incarnation that process was granted (0: none yet).
	process string
	lastInc int64
	starts  int
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
	a.lease, a.held, a.stopped, a.waiting = nil, map[string]heldToken{}, map[string]bool{}, map[string]bool{}
	a.localFence, a.fenced, a.stalled, a.pending, a.fenceGen = false, false, false, 0, 0
	// A wipe is a new process.
	a.starts++
	a.process, a.lastInc = fmt.Sprintf("%s#%d", a.name, a.starts), 0
}

// world is one combination's run.
type world struct {
	ctx    context.Context
	be     matrixBackend
	topo   string
	now    time.Duration
	actors map[string]*actor
	seq    int64

	fault      faultKind
	trace      []string
	violations []string
	tokens     []Token
	committed  map[string]bool // units whose claim committed at least once
	// lost are claim decisions whose reply the caller did not get, by
	// unit: a repeat by the same incarnation must report them again.
	lost         map[string]lostClaim
	summary      string
	finalClaims  string
	faultApplied bool
}

func newWorld(ctx context.Context, be matrixBackend, topo string, sc scenario) (*world, error) {
	w := &world{ctx: ctx, be: be, topo: topo, actors: map[string]*actor{}, committed: map[string]bool{},
		lost: map[string]lostClaim{}}
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
// effects are in the registry), whatever the caller was told; after a wire
// fault nobody knows, and committed is false (callers that need to know
// re-read the registry).
func (w *world) do(a *actor, what string, inject bool, f func(r Registry) error) (err error, committed bool) {
	wire := false
	if inject {
		w.faultApplied = true
		switch w.fault {
		case faultStatement:
			w.note(a, what, errInjected)
			return errInjected, false
		case faultConnCut:
			w.be.cut(a.name)
		case faultWireCut, faultWireLost:
			wire = true
		}
	}
	switch {
	case w.be.linkDown(a.name):
		err = errLinkDown
	case wire:
		var struck bool
		err, struck = w.be.wire(a.name, w.fault, what, f)
		if !struck {
			w.faultApplied = false
		}
	default:
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

// multiTrip says whether PG runs the call in several round trips, so a
// connection cut at its first reply (the read's) leaves nothing done; a
// single statement, or a pipelined transaction (Leave, CreatePending,
// Activate), has committed by the time its first reply is sent. The twin
// simulates wire faults with it.
func multiTrip(what string) bool {
	op, _, _ := strings.Cut(what, " ")
	switch op {
	case "join", "claim", "claim-many":
		return true
	}
	return false
}

func isLeaseLoss(err error) bool {
	return errors.Is(err, ErrLeaseExpired) || errors.Is(err, ErrStaleIncarnation) || errors.Is(err, ErrNotMember)
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
			case err == nil && (a.localFence || len(a.waiting) > 0):
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
	case errors.Is(err, errWire):
		return "net"
	case errors.As(err, &he):
		return "held/" + string(he.Reason)
	case errors.As(err, &se):
		return "stale/" + string(se.Reason)
	case errors.As(err, &pe):
		return "sql/" + pe.Code + "/" + pe.Message
	}
	for _, s := range []error{ErrUnknownTopology, ErrNotMember, ErrStaleIncarnation, ErrLeaseExpired, ErrFenced,
		ErrDraining, ErrNoActiveEpoch, ErrEpochMoved, ErrFrozen, ErrUnitOutOfRange, ErrStillHolding, ErrPendingExists,
		ErrEpochState, ErrFreezeIncomplete, ErrConflict, ErrInvalid} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "net"
}
