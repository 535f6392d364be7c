package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/member"
)

// tickEvery is how often the simulator ticks a core, as pkg/worker's
// driver does.
const tickEvery = 500 * time.Millisecond

// NewCore plugs the worker's protocol core (pkg/worker/internal/member)
// into the simulator: the same state machine pkg/worker runs, with its
// registry calls, timer, pullers and permission carried by the
// simulator instead of the real driver. A mutation named in env (one of
// member.Mutations) is applied to the core.
func NewCore(env MemberEnv) Member {
	cfg := member.Config{Topology: env.Topology, Member: env.Name, Process: env.Process, DrainTimeout: 2 * time.Second, StopBound: time.Second}
	if env.Mutation != "" && isCoreMutation(env.Mutation) {
		var err error
		if cfg, err = member.Mutate(cfg, member.Mutation(env.Mutation)); err != nil {
			panic(err)
		}
	}
	return &coreMember{c: member.New(cfg), ops: map[uint64]Op{}}
}

// CoreMutations lists the core's mutations by name.
func CoreMutations() []string {
	var out []string
	for _, m := range member.Mutations() {
		out = append(out, string(m))
	}
	return out
}

func isCoreMutation(name string) bool {
	for _, m := range member.Mutations() {
		if string(m) == name {
			return true
		}
	}
	return false
}

// coreMember adapts a member.Core to Member.
type coreMember struct {
	c    *member.Core
	perm *member.Permission
	ops  map[uint64]Op // request id -> the call it named, for its reply
}

func (m *coreMember) Start(now time.Duration) []Action {
	return append(m.step(member.Tick{Now: now}), timer("tick", now+tickEvery))
}

func (m *coreMember) May(now time.Duration, unit string, tok poolctl.Token) bool {
	u, err := ownership.ParseUnit(unit)
	return err == nil && m.perm.Allows(u, tok, now)
}

func (m *coreMember) Holds(_ time.Duration, unit string, seq uint64, key string) bool {
	u, err := ownership.ParseUnit(unit)
	return err == nil && m.perm.Holds(u, seq, key)
}

func (m *coreMember) Barrier() *poolctl.OrderBarrier {
	if m.perm == nil {
		return nil
	}
	return m.perm.Barrier
}

func (m *coreMember) Step(now time.Duration, ev Event) []Action {
	switch ev.Kind {
	case EvTimer:
		if ev.Timer == "tick" {
			return append(m.step(member.Tick{Now: now}), timer("tick", now+tickEvery))
		}
		return m.step(member.Timer{Now: now})
	case EvReply:
		return m.step(m.reply(now, ev.Reply))
	case EvNATS:
		return m.step(member.UnpinDone{Now: now, Req: member.ReqID(ev.Req)})
	case EvProbe:
		var busy []ownership.Unit
		for _, u := range ev.Busy {
			busy = append(busy, mustUnit(u))
		}
		return m.step(member.ProbeReply{Now: now, Req: member.ReqID(ev.Req), Busy: busy})
	case EvPullerPrepared:
		return m.step(member.PullerPrepared{Now: now, Unit: mustUnit(ev.Unit), Puller: member.PullerID(ev.Puller)})
	case EvPullerFetched:
		return m.step(member.PullerFetched{Now: now, Unit: mustUnit(ev.Unit), Puller: member.PullerID(ev.Puller), Rows: ev.Rows})
	case EvPullerStopped:
		return m.step(member.PullerStopped{Now: now, Unit: mustUnit(ev.Unit), Puller: member.PullerID(ev.Puller),
			Withheld: ev.Withheld, DrainTimedOut: ev.DrainTimedOut})
	}
	return nil
}

func mustUnit(s string) ownership.Unit {
	u, err := ownership.ParseUnit(s)
	if err != nil {
		panic(err)
	}
	return u
}

// reply turns a registry call's outcome into the core's reply event.
func (m *coreMember) reply(now time.Duration, r Reply) member.Event {
	req := member.ReqID(r.ID)
	delete(m.ops, r.ID)
	err := r.Err
	switch r.Op {
	case OpJoin:
		l, _ := r.Value.(poolctl.Lease)
		return member.JoinReply{Now: now, Req: req, Lease: l, Err: err}
	case OpRenew:
		l, _ := r.Value.(poolctl.Lease)
		return member.RenewReply{Now: now, Req: req, Lease: l, Err: err}
	case OpFence:
		return member.FenceReply{Now: now, Req: req, Err: err}
	case OpUnfence:
		return member.UnfenceReply{Now: now, Req: req, Err: err}
	case OpConfirm:
		c, _ := r.Value.(poolctl.Confirmation)
		return member.ConfirmReply{Now: now, Req: req, Conf: c, Err: err}
	case OpSnapshot:
		s, _ := r.Value.(poolctl.Snapshot)
		return member.SnapshotReply{Now: now, Req: req, Snap: s, Err: err}
	case OpClaimMany:
		o, _ := r.Value.([]poolctl.ClaimOutcome)
		return member.ClaimReply{Now: now, Req: req, Outcomes: o, Err: err}
	case OpReleaseMany:
		e, _ := r.Value.([]error)
		return member.ReleaseReply{Now: now, Req: req, Errs: e, Err: err}
	case OpAckFreeze:
		return member.AckFreezeReply{Now: now, Req: req, Err: err}
	case OpLeave:
		return member.LeaveReply{Now: now, Req: req, Err: err}
	case OpReport:
		return member.ActivityReply{Now: now, Req: req, Err: err}
	}
	panic(fmt.Sprintf("reply to unknown call %s", r.Op))
}

// step runs the core and translates its actions.
func (m *coreMember) step(ev member.Event) []Action {
	var out []Action
	for _, a := range m.c.Step(ev) {
		out = append(out, m.translate(a)...)
	}
	return out
}

func (m *coreMember) call(id member.ReqID, op Op, do func(ctx context.Context, r poolctl.Registry) (any, error)) []Action {
	m.ops[uint64(id)] = op
	return []Action{{Kind: ActCall, Call: Call{ID: uint64(id), Op: op, Do: do}}}
}

func (m *coreMember) translate(a member.Action) []Action {
	switch a := a.(type) {
	case member.Join:
		return m.call(a.Req, OpJoin, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return r.Rejoin(ctx, a.Ref, a.Process)
		})
	case member.Renew:
		return m.call(a.Req, OpRenew, func(ctx context.Context, r poolctl.Registry) (any, error) { return r.Renew(ctx, a.Ref) })
	case member.Fence:
		return m.call(a.Req, OpFence, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return nil, r.Fence(ctx, a.Ref, a.Gen)
		})
	case member.Unfence:
		return m.call(a.Req, OpUnfence, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return nil, r.Unfence(ctx, a.Ref, a.Gen)
		})
	case member.Confirm:
		return m.call(a.Req, OpConfirm, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return r.ConfirmOwned(ctx, a.Ref, a.Expected)
		})
	case member.ReadSnapshot:
		return m.call(a.Req, OpSnapshot, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return r.Snapshot(ctx, a.Topology)
		})
	case member.Claim:
		return m.call(a.Req, OpClaimMany, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return r.ClaimMany(ctx, a.Ref, a.Under, a.Units)
		})
	case member.Release:
		return m.call(a.Req, OpReleaseMany, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return r.ReleaseMany(ctx, a.Tokens)
		})
	case member.AckFreeze:
		return m.call(a.Req, OpAckFreeze, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return nil, r.AckFreeze(ctx, a.Ref, a.Epoch)
		})
	case member.Leave:
		return m.call(a.Req, OpLeave, func(ctx context.Context, r poolctl.Registry) (any, error) { return nil, r.Leave(ctx, a.Ref) })
	case member.ReportActivity:
		return m.call(a.Req, OpReport, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return nil, r.ReportActivity(ctx, a.Ref, a.Units)
		})
	case member.Probe:
		units := make([]string, len(a.Units))
		for i, u := range a.Units {
			units[i] = u.String()
		}
		return []Action{{Kind: ActProbe, Req: uint64(a.Req), Units: units}}
	case member.Unpin:
		return []Action{{Kind: ActUnpin, Unit: a.Unit.String(), Req: uint64(a.Req)}}
	case member.StartPuller:
		// The RESET guard (P4) is the census verdict the core passes on;
		// the simulator's census always allows.
		return []Action{{Kind: ActStartPuller, Unit: a.Unit.String(), Token: a.Token, Incarnation: a.Incarnation,
			TopologyEpoch: a.Under, Puller: uint64(a.Puller), Unpin: a.Unpin, Reset: a.Takeover && a.Reset.Allowed}}
	case member.DrainPuller:
		return []Action{{Kind: ActDrainPuller, Unit: a.Unit.String(), Puller: uint64(a.Puller), Timeout: a.Timeout}}
	case member.StopPuller:
		return []Action{{Kind: ActStopPuller, Unit: a.Unit.String(), Puller: uint64(a.Puller)}}
	case member.Publish:
		m.perm = a.Perm
	case member.SetTimer:
		return []Action{timer("core", a.At)}
	case member.Note:
		return []Action{{Kind: ActNote, Detail: fmt.Sprintf("%s %s %v %s", a.Kind, a.Unit, a.Value, a.Detail)}}
	case member.Done:
		return []Action{{Kind: ActExit, Detail: fmt.Sprint(a.Err)}}
	case member.Configure:
	}
	return nil
}
