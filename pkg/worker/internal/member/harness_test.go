package member

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// The scripted tests drive one Core through an exact interleaving of
// events, as etcd's raft interaction tests do: each step is an event, and
// the harness answers the core's requests by their ids, in whatever order
// the script says, and checks the core's invariants after every step.

const (
	topoName = "ns/topo"
	me       = "w-0"
	// myProcess is the process identity of the Core under test.
	myProcess = "w-0/proc-a"
)

var testParams = poolctl.Params{LeaseTTL: 10 * time.Second, RenewInterval: 3 * time.Second, QueryBound: 2 * time.Second,
	Grace: 5 * time.Second}

// errLost is a reply nobody received: the request may or may not have
// taken effect.
var errLost = fmt.Errorf("reply lost: %w", context.DeadlineExceeded)

// harness feeds a Core and records what it asked for.
type harness struct {
	t    *testing.T
	c    *Core
	now  time.Duration
	perm *Permission
	// open are requests and puller commands not yet answered.
	open []Action
	// all is every action, for the trace printed on failure.
	all []string
	// running are pullers started and not reported stopped.
	running map[PullerID]ownership.Unit
	err     error
}

// errStop ends a script at its first violation.
var errStop = errors.New("script stopped")

func newHarness(t *testing.T, ms ...Mutation) *harness {
	cfg, err := Mutate(Config{Topology: topoName, Member: me, Process: myProcess}, ms...)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, c: New(cfg), running: map[PullerID]ownership.Unit{}}
}

// run runs script and returns the first violation it found.
func (h *harness) run(script func(h *harness)) (err error) {
	defer func() {
		if r := recover(); r != nil && r != errStop { //nolint:errorlint // sentinel identity
			panic(r)
		}
		err = h.err
	}()
	script(h)
	return nil
}

// fail records a violation and ends the script.
func (h *harness) fail(format string, args ...any) {
	h.err = fmt.Errorf(format+"\ntrace:\n  %s", append(args, strings.Join(h.all, "\n  "))...)
	panic(errStop)
}

// advance moves the clock forward.
func (h *harness) advance(d time.Duration) { h.now += d }

// step feeds ev (stamped with the harness clock) and checks invariants.
func (h *harness) step(ev Event) []Action {
	ev = Stamp(ev, h.now)
	acts := h.c.Step(ev)
	h.all = append(h.all, fmt.Sprintf("%v %T", h.now, ev))
	for _, a := range acts {
		h.all = append(h.all, "    -> "+describe(a))
		switch a := a.(type) {
		case Publish:
			h.perm = a.Perm
		case SetTimer, Note, Configure, Done:
		default:
			h.open = append(h.open, a)
		}
	}
	h.check(acts)
	return acts
}

// check enforces the invariants every step must keep.
func (h *harness) check(acts []Action) {
	for _, a := range acts {
		switch a := a.(type) {
		case StartPuller:
			for id, u := range h.running {
				if u == a.Unit {
					h.fail("second puller %d started for %s while puller %d still runs", a.Puller, u, id)
				}
			}
			if !h.perm.Allows(a.Unit, a.Token, h.now) {
				h.fail("puller for %s started without permission to deliver it", a.Unit)
			}
			if !a.Unpin {
				h.fail("puller for %s starts without lifting the pin", a.Unit)
			}
			h.running[a.Puller] = a.Unit
		case Unpin:
			if h.perm.FencedAt(h.now) {
				h.fail("UNPIN of %s sent while fenced", a.Unit)
			}
			if _, ok := h.perm.Units[a.Unit]; ok {
				h.fail("UNPIN of %s sent while its delivery is still permitted", a.Unit)
			}
		}
	}
	if h.perm != nil && h.c.lease != nil && !h.perm.FencedAt(h.now) && h.now >= h.c.renewedAt+h.c.lease.TTL-testParams.QueryBound {
		h.fail("delivery permitted at %v, after the self-fence deadline %v", h.now, h.c.renewedAt+h.c.lease.TTL-testParams.QueryBound)
	}
}

// take removes and returns the latest open action of type T.
func take[T Action](h *harness) T {
	for i := len(h.open) - 1; i >= 0; i-- {
		if a, ok := h.open[i].(T); ok {
			h.open = append(h.open[:i], h.open[i+1:]...)
			return a
		}
	}
	var zero T
	h.fail("expected an open %T", zero)
	return zero
}

// has reports whether an open action of type T is waiting.
func has[T Action](h *harness) bool {
	for _, a := range h.open {
		if _, ok := a.(T); ok {
			return true
		}
	}
	return false
}

// lease is incarnation inc's lease.
func lease(inc int64) poolctl.Lease {
	return poolctl.Lease{MemberRef: poolctl.MemberRef{Topology: topoName, Member: me, Incarnation: inc}, Slot: 0,
		TTL: testParams.LeaseTTL, Params: testParams}
}

func tok(unit string, epoch int64) poolctl.Token {
	return poolctl.Token{Topology: topoName, Unit: unit, Member: me, Epoch: epoch}
}

func unitOf(name string) ownership.Unit {
	u, err := ownership.ParseUnit(name)
	if err != nil {
		panic(err)
	}
	return u
}

// join joins as incarnation inc and confirms held (unit -> epoch).
func (h *harness) join(inc int64, held map[string]int64) {
	if !has[Join](h) {
		h.step(Tick{})
	}
	j := take[Join](h)
	h.step(JoinReply{Req: j.Req, Lease: lease(inc)})
	h.confirm(held)
	if h.c.fenced {
		h.fail("still fenced after joining and confirming")
	}
}

// confirm answers the open Confirm with held (unit -> epoch).
func (h *harness) confirm(held map[string]int64, waiting ...string) {
	c := take[Confirm](h)
	conf := poolctl.Confirmation{Held: map[string]poolctl.Token{}, Waiting: waiting}
	for u, e := range held {
		conf.Held[u] = tok(u, e)
	}
	h.step(ConfirmReply{Req: c.Req, Conf: conf})
}

// registry returns a twin registry (the rules PG applies) holding the
// topology, on the harness's clock, for scripts whose point is what the
// registry answers a join.
func (h *harness) registry() *poolctl.Twin {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := poolctl.NewTwin(func() time.Time { return base.Add(h.now) })
	if err := r.EnsureTopology(context.Background(), topoName, testParams); err != nil {
		h.fail("setup: %v", err)
	}
	return r
}

// rejoin answers the open Join from r, as the driver does (Rejoin).
func (h *harness) rejoin(r poolctl.Registry, j Join) (poolctl.Lease, error) {
	l, err := r.Rejoin(context.Background(), j.Ref, j.Process)
	h.step(JoinReply{Req: j.Req, Lease: l, Err: err})
	return l, err
}

// gaveUp reports whether acts end the core with an error matching target.
func gaveUp(acts []Action, target error) bool {
	for _, a := range acts {
		if d, ok := a.(Done); ok && errors.Is(d.Err, target) {
			return true
		}
	}
	return false
}

// renewOK answers the open Renew with a granted lease.
func (h *harness) renewOK() {
	r := take[Renew](h)
	h.step(RenewReply{Req: r.Req, Lease: lease(r.Ref.Incarnation)})
}

// snapshot is the registry as seen by incarnation inc: one member, an
// active epoch of 1 x shards, optionally draining (placing nothing here)
// and a pending epoch.
func snapshot(inc int64, shards int, draining bool, pending int64) poolctl.Snapshot {
	s := poolctl.Snapshot{Topology: topoName, Params: testParams,
		Active:  &poolctl.Epoch{Number: 1, Partitions: 1, Shards: shards, State: poolctl.EpochActive},
		Members: []poolctl.Member{{Name: me, Slot: 0, Incarnation: inc, Live: true, Draining: draining}}}
	if pending > 0 {
		s.Pending = &poolctl.Epoch{Number: pending, Partitions: 1, Shards: shards, State: poolctl.EpochPending}
	}
	return s
}

// answerSnapshot answers the open ReadSnapshot with s.
func (h *harness) answerSnapshot(s poolctl.Snapshot) {
	r := take[ReadSnapshot](h)
	h.step(SnapshotReply{Req: r.Req, Snap: s})
}

// tick runs a tick and answers its snapshot with s.
func (h *harness) tick(s poolctl.Snapshot) {
	h.step(Tick{})
	r := take[ReadSnapshot](h)
	h.step(SnapshotReply{Req: r.Req, Snap: s})
}

// claimAll grants every unit of the open Claim at epoch.
func (h *harness) claimAll(epoch int64) {
	cl := take[Claim](h)
	var outs []poolctl.ClaimOutcome
	for _, u := range cl.Units {
		outs = append(outs, poolctl.ClaimOutcome{Unit: u, Claim: poolctl.Claim{Token: tok(u, epoch)}})
	}
	h.step(ClaimReply{Req: cl.Req, Outcomes: outs})
}

// stopped reports the open puller command for unit as done.
func (h *harness) stopped(unit string) {
	u := unitOf(unit)
	for id, ru := range h.running {
		if ru == u {
			delete(h.running, id)
			h.dropPullerCommands(id)
			h.step(PullerStopped{Unit: u, Puller: id})
			return
		}
	}
	h.fail("no running puller for %s", unit)
}

func (h *harness) dropPullerCommands(id PullerID) {
	kept := h.open[:0]
	for _, a := range h.open {
		switch a := a.(type) {
		case DrainPuller:
			if a.Puller == id {
				continue
			}
		case StopPuller:
			if a.Puller == id {
				continue
			}
		case StartPuller:
			if a.Puller == id {
				continue
			}
		}
		kept = append(kept, a)
	}
	h.open = kept
}

// holding joins as incarnation 1 and takes units 0.0 .. 0.(n-1) at epoch 1.
func (h *harness) holding(n int) {
	h.join(1, nil)
	h.tick(snapshot(1, n, false, 0))
	h.claimAll(1)
	for i := range n {
		u := fmt.Sprintf("0.%d", i)
		if !h.perm.Allows(unitOf(u), tok(u, 1), h.now) {
			h.fail("setup: %s not delivering after its claim", u)
		}
	}
}

// holdingFrom confirms the join of incarnation inc (nothing held) and
// takes unit 0.0 at epoch 1.
func (h *harness) holdingFrom(inc int64) {
	h.confirm(nil)
	h.tick(snapshot(inc, 1, false, 0))
	h.claimAll(1)
	if !h.delivering("0.0", 1) {
		h.fail("setup: 0.0 not delivering after its claim")
	}
}

// delivering reports whether the permission lets unit be delivered at
// epoch now.
func (h *harness) delivering(unit string, epoch int64) bool {
	return h.perm.Allows(unitOf(unit), tok(unit, epoch), h.now)
}

// describe is an action in one line, for traces.
func describe(a Action) string {
	switch a := a.(type) {
	case Publish:
		return fmt.Sprintf("Publish fenced=%v due=%v units=%v", a.Perm.Fenced, a.Perm.FenceDue, a.Perm.Units)
	case StartPuller:
		return fmt.Sprintf("StartPuller #%d %s@%d takeover=%v", a.Puller, a.Unit, a.Token.Epoch, a.Takeover)
	case Note:
		return fmt.Sprintf("Note %s %s %v %s", a.Kind, a.Unit, a.Value, a.Detail)
	default:
		return fmt.Sprintf("%T %+v", a, a)
	}
}

// emittedSince reports whether an action whose description starts with
// prefix was emitted after the trace had mark lines.
func (h *harness) emittedSince(mark int, prefix string) bool {
	for _, line := range h.all[mark:] {
		if strings.HasPrefix(strings.TrimPrefix(line, "    -> "), prefix) {
			return true
		}
	}
	return false
}
