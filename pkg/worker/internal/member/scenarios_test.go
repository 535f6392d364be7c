package member

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// scenario is one scripted interleaving. breaks lists the mutations that
// must make it fail: the scenario is the evidence that the core keeps the
// rule each mutation breaks.
type scenario struct {
	name   string
	breaks []Mutation
	script func(h *harness)
}

// confirmInFlight joins with a unit of an earlier incarnation waiting (so
// every renewal confirms), takes 0.0 at epoch 1, and leaves a Confirm
// open that expects it.
func confirmInFlight(h *harness) Confirm {
	h.step(Tick{})
	j := take[Join](h)
	h.step(JoinReply{Req: j.Req, Lease: lease(1)})
	h.confirm(nil, "0.9")
	h.tick(snapshot(1, 1, false, 0))
	h.claimAll(1)
	h.advance(3 * time.Second)
	h.step(Timer{})
	h.renewOK()
	c := take[Confirm](h)
	if c.Expected["0.0"] != 1 {
		h.fail("setup: confirmation does not expect 0.0 at epoch 1: %v", c.Expected)
	}
	return c
}

// handOverAll makes the registry drain this member, so the tick hands 0.0
// over, and runs the handover to its release.
func handOverAll(h *harness) Release {
	h.tick(snapshot(1, 1, true, 0))
	take[DrainPuller](h)
	h.stopped("0.0")
	u := take[Unpin](h)
	h.step(UnpinDone{Req: u.Req})
	return take[Release](h)
}

// renewUntil keeps the lease renewed in steps of the renew interval up to
// the instant until.
func renewUntil(h *harness, until time.Duration) {
	for h.now+3*time.Second <= until {
		h.advance(3 * time.Second)
		h.step(Timer{})
		h.renewOK()
	}
}

// fencedMidRenewal holds 0.0 at epoch 1 and lets the lease lapse with a
// renewal in flight, so the member fences; it returns that renewal.
func fencedMidRenewal(h *harness) Renew {
	h.holding(1)
	h.advance(3 * time.Second)
	h.step(Timer{})
	r := take[Renew](h)
	h.advance(6 * time.Second)
	h.step(Timer{})
	if !h.c.fenced {
		h.fail("not fenced at %v", h.now)
	}
	return r
}

// recoverToConfirm answers the late renewal r and runs the recovery up
// to its confirmation, which it leaves open.
func recoverToConfirm(h *harness, r Renew) {
	h.step(RenewReply{Req: r.Req, Lease: lease(1)})
	h.renewOK() // that renewal is old by now: another goes first
	f := take[Fence](h)
	h.step(FenceReply{Req: f.Req})
	u := take[Unfence](h)
	h.step(UnfenceReply{Req: u.Req})
}

var scenarios = []scenario{
	{
		// Issue 20 defect 1: a confirmation read before a release must
		// not bring the released unit back.
		name:   "a late confirmation does not bring back a released unit",
		breaks: []Mutation{ConfirmWithoutVersionCheck},
		script: func(h *harness) {
			c := confirmInFlight(h)
			r := handOverAll(h)
			h.step(ReleaseReply{Req: r.Req, Errs: []error{nil}})
			h.step(ConfirmReply{Req: c.Req, Conf: poolctl.Confirmation{Held: map[string]poolctl.Token{"0.0": tok("0.0", 1)}}})
			if h.delivering("0.0", 1) || has[StartPuller](h) {
				h.fail("the released unit 0.0 is delivered again after a late confirmation")
			}
		},
	},
	{
		// Defect 2: a confirmation arriving while a unit drains for its
		// handover must not start a second puller.
		name:   "a confirmation during a handover starts no puller",
		breaks: []Mutation{ConfirmDuringHandoverStartsPuller},
		script: func(h *harness) {
			h.step(Tick{})
			j := take[Join](h)
			h.step(JoinReply{Req: j.Req, Lease: lease(1)})
			h.confirm(nil, "0.9")
			h.tick(snapshot(1, 1, false, 0))
			h.claimAll(1)
			h.tick(snapshot(1, 1, true, 0))
			take[DrainPuller](h)
			h.advance(3 * time.Second)
			h.step(Timer{})
			h.renewOK()
			c := take[Confirm](h)
			h.step(ConfirmReply{Req: c.Req, Conf: poolctl.Confirmation{Held: map[string]poolctl.Token{"0.0": tok("0.0", 1)},
				Waiting: []string{"0.9"}}})
			h.stopped("0.0")
			if has[StartPuller](h) {
				h.fail("a puller started for 0.0, which is being handed over")
			}
			take[Unpin](h)
		},
	},
	{
		// Issue 22: a renewal refused because the registry went back in
		// time (a failover lost commits this member saw) stops delivery
		// as a lost lease does, and the member joins again.
		name: "a renewal refused as behind fences the member",
		script: func(h *harness) {
			h.holding(1)
			h.advance(3 * time.Second)
			h.step(Timer{})
			r := take[Renew](h)
			h.step(RenewReply{Req: r.Req, Err: &poolctl.RegistryBehindError{Topology: "t", Seq: 12, Seen: 25,
				Reason: "a client has seen a later sequence"}})
			h.stopped("0.0")
			if !h.c.Fenced() {
				h.fail("not fenced after a renewal refused as behind")
			}
			h.advance(time.Second)
			h.step(Timer{})
			h.join(2, map[string]int64{"0.0": 2})
		},
	},
	{
		// Defect 4: an acknowledgement sent under incarnation 1 that
		// returns after the rejoin does not count for incarnation 2.
		name:   "a freeze acknowledgement counts only for its incarnation",
		breaks: []Mutation{FreezeAckAcrossRejoin},
		script: func(h *harness) {
			h.holding(1)
			h.tick(snapshot(1, 1, false, 2))
			ack := take[AckFreeze](h)
			h.advance(3 * time.Second)
			h.step(Timer{})
			r := take[Renew](h)
			h.step(RenewReply{Req: r.Req, Err: poolctl.ErrLeaseExpired})
			h.stopped("0.0")
			h.advance(time.Second)
			h.step(Timer{})
			h.join(2, map[string]int64{"0.0": 2})
			h.step(AckFreezeReply{Req: ack.Req})
			h.tick(snapshot(2, 1, false, 2))
			if a := take[AckFreeze](h); a.Ref.Incarnation != 2 {
				h.fail("acknowledged under incarnation %d, want 2", a.Ref.Incarnation)
			}
		},
	},
	{
		// Defect 5: a claim whose reply was lost is confirmed; when
		// placement moved meanwhile, the unit is handed over, not
		// stranded.
		name:   "a lost claim reply is confirmed and the unit handed over after placement moved",
		breaks: []Mutation{LostClaimReplyGuessed},
		script: func(h *harness) {
			h.join(1, nil)
			h.tick(snapshot(1, 1, false, 0))
			cl := take[Claim](h)
			h.step(ClaimReply{Req: cl.Req, Err: errLost})
			c := take[Confirm](h)
			h.tick(snapshot(1, 1, true, 0))
			h.step(ConfirmReply{Req: c.Req, Conf: poolctl.Confirmation{Held: map[string]poolctl.Token{"0.0": tok("0.0", 1)}}})
			r := handOverAll(h)
			if len(r.Tokens) != 1 || r.Tokens[0] != tok("0.0", 1) {
				h.fail("released %v, want 0.0 at epoch 1", r.Tokens)
			}
		},
	},
	{
		// Defect 6: displaced by a later process under the same name
		// (the registry refuses the rejoin, naming another process), the
		// member gives up for good: the name is the later process's.
		name:   "a process displaced by another process under its name gives up and does not take the name back",
		breaks: []Mutation{StaleIncarnationRejoinsAtOnce},
		script: func(h *harness) {
			r := h.registry()
			h.step(Tick{})
			if _, err := h.rejoin(r, take[Join](h)); err != nil {
				h.fail("setup: first join refused: %v", err)
			}
			h.confirm(nil)
			// The pod's replacement (another process) joins while this
			// one's lease is live: it takes the name.
			later, err := r.Rejoin(context.Background(), poolctl.MemberRef{Topology: topoName, Member: me}, "w-0/proc-b")
			if err != nil {
				h.fail("setup: the later process's join refused: %v", err)
			}
			h.advance(3 * time.Second)
			h.step(Timer{})
			rn := take[Renew](h)
			_, err = r.Renew(context.Background(), rn.Ref)
			if !errors.Is(err, poolctl.ErrStaleIncarnation) {
				h.fail("setup: renewal of the superseded incarnation answered %v, want ErrStaleIncarnation", err)
			}
			h.step(RenewReply{Req: rn.Req, Err: err})
			j := take[Join](h)
			if j.Process != myProcess {
				h.fail("rejoined as process %q, want %q", j.Process, myProcess)
			}
			if _, err := h.rejoin(r, j); err == nil {
				h.fail("took the name back from the later process's live incarnation %d", later.Incarnation)
			}
			if !h.c.fenced || h.c.phase != phaseDone {
				h.fail("displaced by another process, but it did not give up (fenced=%v)", h.c.fenced)
			}
			for range 20 {
				h.advance(time.Second)
				h.step(Timer{})
				h.step(Tick{})
				if has[Join](h) {
					h.fail("joined again at %v after another process under this name displaced it", h.now)
				}
			}
		},
	},
	{
		// Issue 20: the member's join timed out and it joined again; the
		// first join then reached the registry while the member was
		// paused past its lease, and took a later incarnation (a join that
		// finds the process's own incarnation live renews it instead).
		// That incarnation is this process's own: the member's renewal is
		// refused as stale, it rejoins naming its process, the registry
		// hands it that incarnation, and it carries on, rather than
		// taking itself for displaced and exiting.
		name:   "the member's own delayed join does not displace it",
		breaks: []Mutation{StaleIncarnationGivesUp},
		script: func(h *harness) {
			r := h.registry()
			h.step(Tick{})
			late := take[Join](h)
			h.advance(testParams.QueryBound)
			h.step(JoinReply{Req: late.Req, Err: errLost}) // timed out; still on its way
			h.advance(time.Second)
			h.step(Timer{})
			first, err := h.rejoin(r, take[Join](h))
			if err != nil {
				h.fail("setup: the retried join refused: %v", err)
			}
			h.holdingFrom(first.Incarnation)
			// Landing now, while the process's incarnation is live, the
			// late join only renews it.
			if l, err := r.Rejoin(context.Background(), late.Ref, late.Process); err != nil || l.Incarnation != first.Incarnation {
				h.fail("the late join, landing while the process's incarnation %d is live: %+v, %v; want that incarnation renewed",
					first.Incarnation, l, err)
			}
			// The process is paused past its lease; the late join lands
			// again (a second copy) and takes a later incarnation.
			h.advance(testParams.LeaseTTL + time.Second)
			own, err := r.Rejoin(context.Background(), late.Ref, late.Process)
			if err != nil || own.Incarnation <= first.Incarnation {
				h.fail("setup: the late join did not take a later incarnation: %+v, %v", own, err)
			}
			h.step(Timer{}) // resumes: fenced, renews
			rn := take[Renew](h)
			_, err = r.Renew(context.Background(), rn.Ref)
			if !errors.Is(err, poolctl.ErrStaleIncarnation) {
				h.fail("setup: renewal of the superseded incarnation answered %v, want ErrStaleIncarnation", err)
			}
			if acts := h.step(RenewReply{Req: rn.Req, Err: err}); gaveUp(acts, err) || h.c.phase == phaseDone {
				h.fail("gave up when the incarnation that superseded it was its own late join")
			}
			j := take[Join](h)
			if j.Ref.Incarnation != first.Incarnation || j.Process != myProcess {
				h.fail("rejoined naming incarnation %d as %q, want %d as %q", j.Ref.Incarnation, j.Process, first.Incarnation, myProcess)
			}
			again, err := h.rejoin(r, j)
			if err != nil || again.Incarnation != own.Incarnation {
				h.fail("the rejoin: %+v, %v; want its own incarnation %d", again, err, own.Incarnation)
			}
			h.confirm(map[string]int64{"0.0": 1})
			if h.c.fenced || h.c.incarnation() != own.Incarnation || !h.delivering("0.0", 1) {
				h.fail("after rejoining as incarnation %d: fenced=%v incarnation=%d delivering 0.0=%v",
					own.Incarnation, h.c.fenced, h.c.incarnation(), h.delivering("0.0", 1))
			}
		},
	},
	{
		// Issue 19: a process that resumes after a pause longer than its
		// lease stops delivering before its timer runs (lazy check), and
		// fences before the registry could see the lease expire.
		name:   "a member past its fence deadline delivers nothing, whatever event comes first",
		breaks: []Mutation{NoLazyFenceCheck, NoSelfFence, SelfFenceAfterExpiry},
		script: func(h *harness) {
			h.holding(1)
			h.advance(3 * time.Second)
			h.step(Timer{})
			take[Renew](h) // never answered: the registry is gone
			h.advance(5*time.Second + 500*time.Millisecond)
			h.step(PullerFetched{Unit: unitOf("0.0"), Puller: 1, Rows: 1})
			h.advance(3 * time.Second)
			h.step(Timer{})
		},
	},
	{
		// Issue 19: every new holder lifts the pin before its first pull.
		name:   "every puller lifts the pin before its first pull",
		breaks: []Mutation{UnpinSkippedBeforeFirstPull},
		script: func(h *harness) { h.holding(2) },
	},
	{
		// Issue 19: a confirmation answer that is no longer the one in
		// flight (a duplicate of one whose reply was taken for lost) is
		// not applied.
		name:   "a confirmation reply no longer in flight is not applied",
		breaks: []Mutation{StaleConfirmationApplied},
		script: func(h *harness) {
			c := confirmInFlight(h)
			h.step(ConfirmReply{Req: c.Req, Err: errLost})
			r := handOverAll(h)
			h.step(ReleaseReply{Req: r.Req, Errs: []error{nil}})
			h.advance(time.Second)
			h.step(Timer{})
			take[Confirm](h) // the retry, still open
			h.step(ConfirmReply{Req: c.Req, Conf: poolctl.Confirmation{Held: map[string]poolctl.Token{"0.0": tok("0.0", 1)}}})
			if h.delivering("0.0", 1) {
				h.fail("a duplicate of a confirmation taken for lost brought 0.0 back")
			}
		},
	},
	{
		// Suspected in issue 20: the self-fence racing a recovery must
		// never run two handlers of one unit at once. The harness fails
		// the script on a second puller while the first runs.
		name: "a fence racing recovery never runs two pullers of one unit",
		script: func(h *harness) {
			r := fencedMidRenewal(h)
			take[StopPuller](h)
			recoverToConfirm(h, r)
			mark := len(h.all)
			h.confirm(map[string]int64{"0.0": 1})
			if h.c.fenced || h.emittedSince(mark, "StartPuller") {
				h.fail("fenced=%v, or a puller started before the stopped one reported", h.c.fenced)
			}
			h.stopped("0.0")
			h.answerSnapshot(snapshot(1, 1, false, 0)) // the barrier read since the lift
			take[StartPuller](h)
		},
	},
	{
		// Defect 10 of issue 20, its puller already gone: the
		// confirmation that ends a recovery says a unit is being handed
		// over (the intent was recorded while the member was fenced),
		// and the unit's puller stopped before that reply came. The
		// handover goes on once the fence lifts (UNPIN, then release);
		// no puller starts for it. It was parked as held while still
		// fenced, and the lift started its puller again under the
		// handed-over claim, which the member then kept for good
		// (TestRecoveryDoesNotRestartAUnitInHandover, once a pull's wait
		// was shorter than the recovery).
		name:   "a recovery's confirmation of a handover continues it when the puller already stopped",
		breaks: []Mutation{RecoveryConfirmAppliedFenced},
		script: func(h *harness) {
			r := fencedMidRenewal(h)
			h.stopped("0.0")
			recoverToConfirm(h, r)
			mark := len(h.all)
			c := take[Confirm](h)
			h.step(ConfirmReply{Req: c.Req, Conf: poolctl.Confirmation{Held: map[string]poolctl.Token{"0.0": tok("0.0", 1)},
				Handover: []string{"0.0"}}})
			if h.c.fenced || h.emittedSince(mark, "StartPuller") || h.delivering("0.0", 1) {
				h.fail("fenced=%v, or the unit being handed over got a puller or delivery after the recovery", h.c.fenced)
			}
			un := take[Unpin](h)
			h.step(UnpinDone{Req: un.Req})
			take[Release](h)
		},
	},
	{
		// The premise of pkg/worker's former real-time test "a fence
		// during claims delays takeovers until it lifts": adoptions
		// granted while the member is fenced get no puller (no UNPIN,
		// no RESET, no pull) until the fence lifts, and then take over.
		name: "an adoption granted while fenced waits for the fence to lift",
		script: func(h *harness) {
			h.join(1, nil)
			h.tick(snapshot(1, 1, false, 0))
			cl := take[Claim](h)
			h.advance(3 * time.Second)
			h.step(Timer{})
			r := take[Renew](h)
			h.advance(6 * time.Second)
			h.step(Timer{})
			mark := len(h.all)
			h.step(ClaimReply{Req: cl.Req, Outcomes: []poolctl.ClaimOutcome{{Unit: "0.0",
				Claim: poolctl.Claim{Token: tok("0.0", 5), Adopted: true, From: "w-x"}}}})
			h.step(RenewReply{Req: r.Req, Lease: lease(1)})
			h.renewOK()
			f := take[Fence](h)
			h.step(FenceReply{Req: f.Req})
			u := take[Unfence](h)
			h.step(UnfenceReply{Req: u.Req})
			if h.emittedSince(mark, "StartPuller") || h.delivering("0.0", 5) {
				h.fail("the adopted unit got a puller, or delivery, while the member was fenced")
			}
			h.confirm(map[string]int64{"0.0": 5})
			h.answerSnapshot(snapshot(1, 1, false, 0)) // the barrier read since the lift
			if p := take[StartPuller](h); !p.Takeover || p.Token != tok("0.0", 5) {
				h.fail("after the fence lifted: %+v, want a takeover at epoch 5", p)
			}
		},
	},
	{
		// Issue 24 (the simulator's seed 540 of the ordered runs): a
		// process that comes out of a fence (here its first join) and
		// is confirmed a unit, while a change of V's barrier holds moved
		// keys, starts its puller only once a registry read gave it the
		// barrier; the permission carries the barrier from the first
		// row on.
		name:   "a member out of a fence pulls only with the order barrier read",
		breaks: []Mutation{PullersBeforeBarrierRead},
		script: func(h *harness) {
			mark := len(h.all)
			h.join(1, map[string]int64{"0.0": 3})
			if h.emittedSince(mark, "StartPuller") {
				h.fail("a puller started on the confirmation, before any registry read")
			}
			s := snapshot(1, 2, false, 0)
			s.Barrier = &poolctl.OrderBarrier{Epoch: 1, FromShards: 1, ToShards: 2, Partitions: []poolctl.PartitionBarrier{
				{Partition: 0, BeforeSeq: 10, Predecessors: []poolctl.BarrierPredecessor{{Shard: 0}}}}}
			h.answerSnapshot(s)
			take[StartPuller](h)
			if h.perm.Barrier == nil || h.perm.Barrier.Epoch != 1 {
				h.fail("the puller started with barrier %+v in the permission, want epoch 1's", h.perm.Barrier)
			}
		},
	},
	{
		// A unit re-homed onto a new incarnation while its release is in
		// flight is released at its new token: the old one is refused,
		// and a unit the member holds without knowing is stranded.
		name: "a unit re-homed during its release is released at its new token",
		script: func(h *harness) {
			h.holding(1)
			r := handOverAll(h)
			h.advance(3 * time.Second)
			h.step(Timer{})
			rn := take[Renew](h)
			h.step(RenewReply{Req: rn.Req, Err: poolctl.ErrLeaseExpired})
			h.advance(time.Second)
			h.step(Timer{})
			h.join(2, map[string]int64{"0.0": 2})
			h.step(ReleaseReply{Req: r.Req, Errs: []error{&poolctl.StaleEpochError{Token: r.Tokens[0], Reason: poolctl.StaleMoved}}})
			r2 := take[Release](h)
			if r2.Tokens[0] != tok("0.0", 2) || has[Unpin](h) {
				h.fail("second release %v, want 0.0 at epoch 2 without another UNPIN", r2.Tokens)
			}
		},
	},
	{
		// A Leave refused because the member still holds a claim it did
		// not know of confirms it, hands it over and leaves again.
		name: "a leave refused for a claim the member did not know hands it over first",
		script: func(h *harness) {
			h.join(1, nil)
			h.step(Shutdown{})
			l := take[Leave](h)
			h.step(LeaveReply{Req: l.Req, Err: &poolctl.HoldingError{Member: me, Units: 1}})
			h.advance(time.Second)
			h.step(Timer{})
			h.confirm(map[string]int64{"0.0": 1})
			u := take[Unpin](h)
			h.step(UnpinDone{Req: u.Req})
			r := take[Release](h)
			h.step(ReleaseReply{Req: r.Req, Errs: []error{nil}})
			l = take[Leave](h)
			if !done(h.step(LeaveReply{Req: l.Req})) {
				h.fail("not done after the second leave")
			}
		},
	},
	{
		// A held unit that left the topology (a V decrease) is delivered
		// until its consumer is drained, and only then handed over.
		name: "a unit that left the topology is handed over only once its consumer is drained",
		script: func(h *harness) {
			h.holding(2)
			shrunk := snapshot(1, 1, false, 0)
			shrunk.Active.Number = 2
			h.step(Tick{})
			s := take[ReadSnapshot](h)
			h.step(SnapshotReply{Req: s.Req, Snap: shrunk})
			p := take[Probe](h)
			h.step(ProbeReply{Req: p.Req, Busy: []ownership.Unit{unitOf("0.1")}})
			if has[DrainPuller](h) || !h.delivering("0.1", 1) {
				h.fail("0.1 handed over while its consumer still holds rows")
			}
			h.step(Tick{})
			s = take[ReadSnapshot](h)
			h.step(SnapshotReply{Req: s.Req, Snap: shrunk})
			p = take[Probe](h)
			h.step(ProbeReply{Req: p.Req})
			if d := take[DrainPuller](h); d.Unit != unitOf("0.1") {
				h.fail("drained %s, want 0.1", d.Unit)
			}
		},
	},
	{
		// Suspected: a drain that outlasts the lease must not UNPIN the
		// unit afterwards: it may have been adopted meanwhile.
		name: "a drain that outlasts the lease sends no UNPIN",
		script: func(h *harness) {
			h.holding(1)
			h.tick(snapshot(1, 1, true, 0))
			take[DrainPuller](h)
			h.advance(3 * time.Second)
			h.step(Timer{})
			take[Renew](h)
			h.advance(6 * time.Second)
			h.step(Timer{})
			h.stopped("0.0")
			if has[Unpin](h) || has[Release](h) {
				h.fail("handover went on while fenced")
			}
		},
	},
	{
		// Issue 20 defect 1, in virtual time (pkg/worker's
		// TestRenewalsContinueWhileAHandoverDrains needs the machine to
		// answer renewals of a 2s lease in time): a handover whose drain
		// outlasts the lease twice over keeps the lease renewed and never
		// fences the member.
		name: "renewals continue while a handover's drain outlasts the lease",
		script: func(h *harness) {
			h.holding(1)
			h.tick(snapshot(1, 1, true, 0))
			take[DrainPuller](h)
			renewUntil(h, h.now+2*testParams.LeaseTTL)
			if h.c.fenced || h.c.incarnation() != 1 {
				h.fail("fenced=%v incarnation=%d after a drain of %v", h.c.fenced, h.c.incarnation(), 2*testParams.LeaseTTL)
			}
			h.stopped("0.0")
			u := take[Unpin](h)
			h.step(UnpinDone{Req: u.Req})
			if r := take[Release](h); len(r.Tokens) != 1 || r.Tokens[0] != tok("0.0", 1) {
				h.fail("released %v, want 0.0 at epoch 1", r.Tokens)
			}
		},
	},
	{
		// Found by the chaos suite (a registry unreachable for 30s), in
		// virtual time (pkg/worker's TestAMemberRetriesTheRegistryWithinTheGrace
		// measures the gaps on the wall clock of a possibly loaded
		// machine): while the registry does not answer, the member asks
		// again within half a renew interval of each failure, fenced or
		// not, so it renews or rejoins within the grace after an outage,
		// before the first member back may adopt its units.
		name: "a member retries the registry within half a renew interval while it does not answer",
		script: func(h *harness) {
			h.holding(1)
			h.advance(3 * time.Second)
			h.step(Timer{})
			for i := range 12 {
				r := take[Renew](h)
				h.advance(testParams.QueryBound)
				h.step(RenewReply{Req: r.Req, Err: errLost})
				failedAt := h.now
				for !has[Renew](h) {
					if h.c.timerAt < 0 || h.c.timerAt-failedAt > testParams.RenewInterval/2 {
						h.fail("after failed renewal %d no retry within %v (timer at %v)", i+1, testParams.RenewInterval/2, h.c.timerAt-failedAt)
					}
					h.now = h.c.timerAt
					h.step(Timer{})
				}
			}
			if !h.c.fenced {
				h.fail("setup: not fenced after %v of failed renewals", 12*testParams.QueryBound)
			}
		},
	},
	{
		// The shutdown half: a graceful stop whose drain outlasts the
		// lease keeps renewing until the member has left, instead of
		// falling into the crash path.
		name: "a shutdown whose drain outlasts the lease keeps renewing and leaves",
		script: func(h *harness) {
			h.holding(1)
			h.step(Shutdown{})
			take[DrainPuller](h)
			renewUntil(h, h.now+2*testParams.LeaseTTL)
			h.stopped("0.0")
			u := take[Unpin](h)
			h.step(UnpinDone{Req: u.Req})
			r := take[Release](h)
			h.step(ReleaseReply{Req: r.Req, Errs: make([]error, len(r.Tokens))})
			l := take[Leave](h)
			acts := h.step(LeaveReply{Req: l.Req})
			for _, a := range acts {
				if d, ok := a.(Done); ok {
					if d.Err != nil {
						h.fail("left with %v", d.Err)
					}
					return
				}
			}
			h.fail("no Done after the leave succeeded")
		},
	},
	{
		// Suspected: a release whose reply was lost is retried with the
		// same token and never UNPINs again (the unit may have a new
		// holder by then).
		name: "a retried release sends no second UNPIN",
		script: func(h *harness) {
			h.holding(1)
			r := handOverAll(h)
			h.step(ReleaseReply{Req: r.Req, Err: errLost})
			h.tick(snapshot(1, 1, true, 0))
			r2 := take[Release](h)
			if has[Unpin](h) || r2.Tokens[0] != r.Tokens[0] {
				h.fail("retry sent an UNPIN, or another token: %v", r2.Tokens)
			}
			h.step(ReleaseReply{Req: r2.Req, Errs: []error{&poolctl.StaleEpochError{Token: r.Tokens[0], Reason: poolctl.StaleFree}}})
			if len(h.c.units) != 0 {
				h.fail("still holds %v after the release was found done", h.c.Held())
			}
		},
	},
	{
		// Suspected: a handler that ignores its context cannot hold a
		// handover forever: after the drain timeout and the stop bound
		// the handover goes on with delivery revoked.
		name: "a drain whose handler ignores its context is bounded",
		script: func(h *harness) {
			h.holding(1)
			h.tick(snapshot(1, 1, true, 0))
			d := take[DrainPuller](h)
			renewUntil(h, h.now+d.Timeout+h.c.cfg.StopBound+3*time.Second)
			h.step(Timer{})
			take[Unpin](h)
			if h.delivering("0.0", 1) {
				h.fail("delivery of 0.0 still permitted after its handover moved on")
			}
		},
	},
	{
		// Suspected: cancelling Run mid-claim must not turn a graceful
		// stop into the crash path: the lost claim is confirmed and
		// handed over before Leave.
		name:   "a shutdown during a claim whose reply was lost still leaves cleanly",
		breaks: []Mutation{LostClaimReplyGuessed},
		script: func(h *harness) {
			h.join(1, nil)
			h.tick(snapshot(1, 1, false, 0))
			cl := take[Claim](h)
			h.step(Shutdown{})
			h.step(ClaimReply{Req: cl.Req, Err: errLost})
			h.confirm(map[string]int64{"0.0": 1})
			if has[StartPuller](h) {
				h.fail("a puller started while leaving")
			}
			u := take[Unpin](h)
			h.step(UnpinDone{Req: u.Req})
			r := take[Release](h)
			if has[Leave](h) {
				h.fail("left before the release returned")
			}
			h.step(ReleaseReply{Req: r.Req, Errs: []error{nil}})
			l := take[Leave](h)
			if acts := h.step(LeaveReply{Req: l.Req}); !done(acts) {
				h.fail("not done after leaving")
			}
		},
	},
}

func done(acts []Action) bool {
	for _, a := range acts {
		if d, ok := a.(Done); ok && d.Err == nil {
			return true
		}
	}
	return false
}

func TestScriptedInterleavingsKeepTheRules(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			h := newHarness(t)
			if err := h.run(sc.script); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Each mutation re-introduces a defect; the scenarios that name it must
// then fail, or the rule is one nothing tests.
func TestEveryMutationIsCaughtByAScript(t *testing.T) {
	caught := map[Mutation][]string{}
	for _, sc := range scenarios {
		for _, m := range sc.breaks {
			t.Run(string(m)+"/"+sc.name, func(t *testing.T) {
				h := newHarness(t, m)
				err := h.run(sc.script)
				if err == nil {
					t.Fatalf("mutation %s survived", m)
				}
				caught[m] = append(caught[m], sc.name)
				t.Logf("caught: %v", firstLine(err))
			})
		}
	}
	// make mutate prints this table beside the simulator's: the scripts
	// are deterministic, and they catch the mutations the simulator's
	// model cannot reach (sim.Unreachable).
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "mutation\tcaught by the member's script")
	for _, m := range Mutations() {
		if len(caught[m]) == 0 {
			t.Errorf("mutation %s is caught by no scenario", m)
			fmt.Fprintf(w, "%s\tnot caught\n", m)
			continue
		}
		fmt.Fprintf(w, "%s\t%s\n", m, strings.Join(caught[m], "; "))
	}
	_ = w.Flush()
	t.Logf("script table:\n%s", b.String())
}

func TestMutateRefusesUnknownNames(t *testing.T) {
	if _, err := Mutate(Config{}, "no-such-mutation"); err == nil {
		t.Fatal("an unknown mutation was accepted")
	}
}

func firstLine(err error) string {
	s := err.Error()
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}

func TestInBatchesSplitsOnlyWhenAsked(t *testing.T) {
	xs := []int{1, 2, 3, 4, 5}
	tests := []struct {
		size int
		want [][]int
	}{
		{0, [][]int{{1, 2, 3, 4, 5}}},
		{1, [][]int{{1}, {2}, {3}, {4}, {5}}},
		{2, [][]int{{1, 2}, {3, 4}, {5}}},
		{5, [][]int{{1, 2, 3, 4, 5}}},
		{9, [][]int{{1, 2, 3, 4, 5}}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("size %d", tt.size), func(t *testing.T) {
			got := inBatches(xs, tt.size)
			if !slices.EqualFunc(got, tt.want, slices.Equal[[]int]) {
				t.Fatalf("inBatches(%v, %d) = %v, want %v", xs, tt.size, got, tt.want)
			}
		})
	}
}

// The simulator replays a failing seed exactly only if a Core's actions
// depend on its events alone, never on map iteration order.
func TestTheSameEventsGiveTheSameActions(t *testing.T) {
	script := func(h *harness) {
		h.holding(8)
		h.step(Shutdown{})
		for i := range 8 {
			h.stopped(fmt.Sprintf("0.%d", i))
		}
		h.advance(9 * time.Second) // renewals unanswered: fenced
		h.step(Timer{})
	}
	var traces [2]string
	for i := range traces {
		h := newHarness(t)
		if err := h.run(script); err != nil {
			t.Fatal(err)
		}
		traces[i] = strings.Join(h.all, "\n")
	}
	if traces[0] != traces[1] {
		t.Fatalf("two runs of the same events differ:\n%s\n\n%s", traces[0], traces[1])
	}
	if n := strings.Count(traces[0], "Unpin"); n != 8 {
		t.Fatalf("%d UNPINs, want 8:\n%s", n, traces[0])
	}
}
