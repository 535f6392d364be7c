package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/shard"
)

// Default builds the member logic runs use when Config.NewMember is nil:
// the worker's core.
var Default = NewCore

// MemberByName returns the member logic named "core" or "standin".
func MemberByName(name string) (func(MemberEnv) Member, error) {
	switch name {
	case "core", "":
		return NewCore, nil
	case "standin":
		return NewStandin, nil
	}
	return nil, fmt.Errorf("member %q: want core or standin", name)
}

// MemberMutations lists the mutations the default member offers (names it
// accepts in MemberEnv.Mutation).
func MemberMutations() []string { return CoreMutations() }

// standin is the simulator's own member: the protocol of design.md
// section 7 in a small form, written to exercise the simulator before the
// worker's core plugs in, and kept as a second, independent member the
// simulator can judge. One writer: every field changes only in Step.
type standin struct {
	env    MemberEnv
	p      poolctl.Params
	ref    poolctl.MemberRef
	joined bool
	// gone: a newer incarnation of this pod name exists (another process,
	// or this one's own join whose reply was lost). The process waits
	// until that incarnation's lease plus the grace has passed, then
	// joins again: a live other process is never displaced, and a lost
	// join of its own costs one lease.
	gone    bool
	fenceAt time.Duration
	fenced  bool
	held    map[string]*hold
	// version grows at every change of held, so a confirmation read
	// before a change is not applied after it.
	version uint64
	nextID  uint64

	leaseCall, tickCall, claimCall, confirmCall, ackCall uint64
	claimInc, ackInc, ackEpoch                           int64
	confirmVersion, claimVersion                         uint64
	needConfirm                                          bool
	releases                                             map[uint64]string
	acked                                                map[int64]int64 // epoch -> incarnation that acknowledged
	claimUnder                                           int64
	// running are the units with a puller that has not reported its stop.
	running map[string]bool
	// barrier is the order barrier of the last snapshot read. gen grows
	// at every fence and lost lease; tickGen is the gen the snapshot in
	// flight was asked under, barrierGen the gen of the last barrier
	// read: rows are delivered only under a barrier read since the
	// member last came back (a re-homed unit's moved keys wait too).
	barrier                  *poolctl.OrderBarrier
	gen, tickGen, barrierGen int64
}

type holdState int

const (
	holdUnpinning holdState = iota // UNPIN (then RESET) before the first pull
	holdResetting
	holdPulling
	holdStopping  // handing over: waiting for the puller to drain
	holdUnpinRel  // handing over: UNPIN after the drain
	holdReleasing // handing over: the release is out
	holdSuspended // fenced: waiting for a confirmation
	holdWaitStart // ready to pull, waiting for an earlier puller of the unit to stop
)

type hold struct {
	tok   poolctl.Token
	te    int64
	state holdState
	reset bool // adopted or re-homed: RESET after UNPIN
}

// NewStandin returns the simulator's stand-in member.
func NewStandin(env MemberEnv) Member {
	return &standin{env: env, p: env.Params, held: map[string]*hold{}, releases: map[uint64]string{},
		acked: map[int64]int64{}, running: map[string]bool{}, barrierGen: -1}
}

func (m *standin) call(op Op, do func(ctx context.Context, r poolctl.Registry) (any, error)) (uint64, Action) {
	m.nextID++
	return m.nextID, Action{Kind: ActCall, Call: Call{ID: m.nextID, Op: op, Do: do}}
}

func timer(name string, at time.Duration) Action { return Action{Kind: ActTimer, Timer: name, At: at} }

func (m *standin) Start(now time.Duration) []Action {
	return append(m.renew(now), timer("tick", now+500*time.Millisecond))
}

func (m *standin) May(now time.Duration, unit string, tok poolctl.Token) bool {
	epoch := tok.Epoch
	h := m.held[unit]
	if m.gone {
		return false
	}
	return m.joined && !m.fenced && now < m.fenceAt && h != nil && h.tok.Epoch == epoch && h.state == holdPulling &&
		m.barrierGen == m.gen
}

// Holds is the order barrier's rule, written apart from the core's: a
// row of a key that moved into unit, stored after the switch (after the
// sequence read before, while the switch is not recorded), waits while
// the key's old unit is not lifted. Under a change of N a row moved in
// is one whose key the old N put in another partition, whatever its
// sequence above the one read before.
func (m *standin) Holds(_ time.Duration, unit string, seq uint64, key string) bool {
	b := m.barrier
	u, err := ownership.ParseUnit(unit)
	if b == nil || err != nil || u.Shard >= b.ToShards {
		return false
	}
	if b.ChangesN() {
		from := ownership.KeyPartition(key, b.FromPartitions)
		own, mine := b.Partition(u.Partition)
		old, fed := b.Partition(from)
		return u.Partition < b.ToPartitions && from != u.Partition && (!mine || seq > own.BeforeSeq) && fed && !old.Lifted(u.Shard)
	}
	pb, ok := b.Partition(u.Partition)
	if !ok {
		return false
	}
	after := pb.BeforeSeq
	if pb.Switched {
		after = pb.SwitchSeq
	}
	old := ownership.PartitionShard(key, b.FromShards)
	return seq > after && old != u.Shard && !pb.Lifted(old)
}

func (m *standin) Barrier() *poolctl.OrderBarrier { return m.barrier }

func (m *standin) Step(now time.Duration, ev Event) []Action {
	switch ev.Kind {
	case EvTimer:
		switch ev.Timer {
		case "lease":
			return m.renew(now)
		case "fence":
			return m.fence(now)
		case "tick":
			return append(m.tick(), timer("tick", now+500*time.Millisecond))
		}
	case EvReply:
		return m.reply(now, ev.Reply)
	case EvNATS:
		return m.natsDone(ev)
	case EvPullerStopped:
		delete(m.running, ev.Unit)
		h := m.held[ev.Unit]
		switch {
		case h == nil:
		case h.state == holdStopping:
			h.state = holdUnpinRel
			return []Action{{Kind: ActUnpin, Unit: ev.Unit}}
		case h.state == holdWaitStart:
			return m.startPuller(ev.Unit, h)
		}
	}
	return nil
}

// renew joins or renews, once per renew interval (twice as often while
// it fails).
func (m *standin) renew(now time.Duration) []Action {
	next := timer("lease", now+m.p.RenewInterval)
	if m.leaseCall != 0 || m.gone {
		return []Action{next}
	}
	var a Action
	if !m.joined {
		m.leaseCall, a = m.call(OpJoin, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return r.Join(ctx, m.env.Topology, m.env.Name)
		})
		next.At = now + m.p.RenewInterval/2
	} else {
		ref := m.ref
		m.leaseCall, a = m.call(OpRenew, func(ctx context.Context, r poolctl.Registry) (any, error) { return r.Renew(ctx, ref) })
	}
	return []Action{a, next}
}

func (m *standin) fence(now time.Duration) []Action {
	if !m.joined || m.fenced || now < m.fenceAt {
		return nil
	}
	m.fenced = true
	m.gen++
	var out []Action
	for _, u := range sortedKeys(m.held) {
		h := m.held[u]
		switch h.state {
		case holdPulling:
			out = append(out, Action{Kind: ActStopPuller, Unit: u})
			h.state = holdSuspended
		case holdUnpinning, holdResetting, holdWaitStart:
			h.state = holdSuspended
		}
	}
	return out
}

// dropAll forgets every holding: the lease is gone, so are the tokens.
func (m *standin) dropAll() []Action {
	var out []Action
	for _, u := range sortedKeys(m.held) {
		h := m.held[u]
		if h.state == holdPulling || h.state == holdStopping {
			out = append(out, Action{Kind: ActStopPuller, Unit: u})
		}
	}
	m.held = map[string]*hold{}
	m.version++
	m.joined, m.fenced, m.needConfirm = false, false, false
	m.gen++
	m.claimCall, m.confirmCall, m.tickCall, m.ackCall = 0, 0, 0, 0
	m.releases = map[uint64]string{}
	return out
}

func (m *standin) tick() []Action {
	if m.gone && m.tickCall == 0 {
		var a Action
		m.tickCall, a = m.call(OpSnapshot, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return r.Snapshot(ctx, m.env.Topology)
		})
		return []Action{a}
	}
	if !m.joined || m.fenced || m.tickCall != 0 {
		return nil
	}
	var out []Action
	if m.needConfirm {
		out = m.confirm()
	}
	var a Action
	m.tickCall, a = m.call(OpSnapshot, func(ctx context.Context, r poolctl.Registry) (any, error) {
		return r.Snapshot(ctx, m.env.Topology)
	})
	m.tickGen = m.gen
	return append(out, a)
}

func (m *standin) confirm() []Action {
	if m.confirmCall != 0 {
		return nil
	}
	ref := m.ref
	expected := map[string]int64{}
	for _, u := range sortedKeys(m.held) {
		h := m.held[u]
		expected[u] = h.tok.Epoch
	}
	m.confirmVersion = m.version
	var a Action
	m.confirmCall, a = m.call(OpConfirm, func(ctx context.Context, r poolctl.Registry) (any, error) {
		return r.ConfirmOwned(ctx, ref, expected)
	})
	return []Action{a}
}

func (m *standin) reply(now time.Duration, r Reply) []Action {
	switch {
	case r.ID == m.leaseCall:
		m.leaseCall = 0
		return m.leaseReply(now, r)
	case r.ID == m.tickCall:
		m.tickCall = 0
		if r.Err != nil {
			return nil
		}
		if m.gone {
			// Join again once the newer incarnation's lease plus the
			// grace has passed: it may still be delivering until its own
			// self-fence, which a step of the registry's clock can put
			// after the registry's expiry (the grace absorbs that).
			snap := r.Value.(poolctl.Snapshot)
			if me := snap.Member(m.env.Name); me == nil || me.Left || !snap.Now.Before(me.LeaseExpiresAt.Add(m.p.Grace)) {
				m.gone = false
				return m.renew(now)
			}
			return nil
		}
		return m.place(r.Value.(poolctl.Snapshot))
	case r.ID == m.claimCall:
		m.claimCall = 0
		return m.claimed(r)
	case r.ID == m.confirmCall:
		m.confirmCall = 0
		return m.confirmed(r)
	case r.ID == m.ackCall:
		m.ackCall = 0
		if r.Err == nil && m.ackInc == m.ref.Incarnation {
			m.acked[m.ackEpoch] = m.ackInc
		}
	default:
		if u, ok := m.releases[r.ID]; ok {
			delete(m.releases, r.ID)
			return m.released(u, r)
		}
	}
	return nil
}

func (m *standin) leaseReply(now time.Duration, r Reply) []Action {
	if r.Err == nil {
		l := r.Value.(poolctl.Lease)
		if r.Op == OpJoin {
			// Units of an earlier incarnation stay with this member until
			// a confirmation re-homes them (after that incarnation's
			// lease plus the grace), and only then can they be handed
			// over or kept.
			m.ref, m.joined, m.needConfirm = l.MemberRef, true, true
		}
		m.fenceAt = r.Sent + l.TTL - m.p.QueryBound
		out := []Action{timer("fence", m.fenceAt)}
		if m.fenced {
			m.fenced, m.needConfirm = false, true
			out = append(out, m.confirm()...)
		}
		return out
	}
	switch {
	case errors.Is(r.Err, poolctl.ErrStaleIncarnation):
		// A newer incarnation holds this pod name. Joining again at once
		// would displace it (and it this one, for ever): wait until it
		// lapses (see gone).
		out := m.dropAll()
		m.gone = true
		return out
	case errors.Is(r.Err, poolctl.ErrLeaseExpired), errors.Is(r.Err, poolctl.ErrNotMember):
		return append(m.dropAll(), timer("lease", now))
	}
	return nil
}

// place is the tick's work on a fresh snapshot: acknowledge a freeze,
// hand over what placement no longer gives this member, claim what it
// gives.
func (m *standin) place(s poolctl.Snapshot) []Action {
	// Before the freeze acknowledgement below: a member acknowledges a
	// change of V only with its barrier in force.
	m.barrier = s.Barrier
	if m.tickGen == m.gen {
		m.barrierGen = m.gen
	}
	me := s.Member(m.env.Name)
	if me == nil || me.Incarnation != m.ref.Incarnation || !me.Live || s.Active == nil {
		return nil
	}
	var out []Action
	if me.Holds != len(m.held) && m.confirmCall == 0 {
		// The registry counts claims this member does not know of (a
		// claim that committed after the confirmation that followed its
		// lost reply) or the other way round: ask again.
		m.needConfirm = true
		out = append(out, m.confirm()...)
	}
	if s.Pending != nil && m.acked[s.Pending.Number] != m.ref.Incarnation && m.ackCall == 0 {
		ref, e := m.ref, s.Pending.Number
		var a Action
		m.ackCall, a = m.call(OpAckFreeze, func(ctx context.Context, r poolctl.Registry) (any, error) {
			return nil, r.AckFreeze(ctx, ref, e)
		})
		m.ackInc, m.ackEpoch = ref.Incarnation, e
		out = append(out, a)
	}
	var units []shard.Unit
	for p := range s.Active.Partitions {
		for v := range s.Active.Shards {
			units = append(units, shard.Unit{Partition: p, Shard: v})
		}
	}
	pl := ownership.Place(units, slotsOf(s.PlacementSlots()))
	mine := map[string]bool{}
	if me.Slot >= 0 && !me.Draining {
		for _, u := range pl.UnitsOf(ownership.Slot(me.Slot)) {
			mine[u.String()] = true
		}
	}
	for _, u := range sortedKeys(m.held) {
		h := m.held[u]
		if mine[u] {
			continue
		}
		switch h.state {
		case holdPulling:
			h.state = holdStopping
			out = append(out, Action{Kind: ActDrainPuller, Unit: u, Timeout: 2 * time.Second})
		case holdUnpinning, holdResetting, holdWaitStart:
			h.state = holdUnpinRel
			out = append(out, Action{Kind: ActUnpin, Unit: u})
		}
	}
	if s.Pending != nil || m.claimCall != 0 || m.confirmCall != 0 {
		return out
	}
	var want []string
	for _, u := range sortedKeys(mine) {
		if m.held[u] == nil {
			want = append(want, u)
		}
	}
	if len(want) == 0 {
		return out
	}
	ref, under := m.ref, s.Active.Number
	var a Action
	m.claimCall, a = m.call(OpClaimMany, func(ctx context.Context, r poolctl.Registry) (any, error) {
		return r.ClaimMany(ctx, ref, under, want)
	})
	m.claimInc, m.claimUnder, m.claimVersion = ref.Incarnation, under, m.version
	return append(out, a)
}

// sortedKeys keeps every step's actions in one order: the seed, not Go's
// map iteration, must decide the run.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func slotsOf(in []int) []ownership.Slot {
	out := make([]ownership.Slot, len(in))
	for i, s := range in {
		out[i] = ownership.Slot(s)
	}
	return out
}

func (m *standin) claimed(r Reply) []Action {
	if m.claimInc != m.ref.Incarnation {
		return nil
	}
	if r.Unknown {
		m.needConfirm = true
		return m.confirm()
	}
	if r.Err != nil {
		return nil
	}
	if m.version != m.claimVersion {
		// What it holds changed while the claim was out (a
		// confirmation that came first, a release): the outcomes may
		// bring back a unit it has let go since. Ask the registry.
		m.needConfirm = true
		return m.confirm()
	}
	var out []Action
	for _, o := range r.Value.([]poolctl.ClaimOutcome) {
		if o.Err != nil || m.held[o.Unit] != nil {
			continue
		}
		h := &hold{tok: o.Claim.Token, te: m.claimUnder, state: holdUnpinning, reset: o.Claim.Adopted || o.Claim.Rehomed}
		m.held[o.Unit] = h
		m.version++
		out = append(out, Action{Kind: ActUnpin, Unit: o.Unit})
	}
	return out
}

func (m *standin) confirmed(r Reply) []Action {
	if r.Err != nil {
		return nil // needConfirm stays: the next tick asks again
	}
	if m.version != m.confirmVersion {
		return m.confirm() // held changed since the question was asked
	}
	c := r.Value.(poolctl.Confirmation)
	m.needConfirm = len(c.Waiting) > 0
	var out []Action
	for _, u := range sortedKeys(m.held) {
		h := m.held[u]
		tok, ok := c.Held[u]
		switch {
		case !ok || tok.Epoch != h.tok.Epoch:
			if h.state == holdPulling || h.state == holdStopping {
				out = append(out, Action{Kind: ActStopPuller, Unit: u})
			}
			delete(m.held, u)
			m.version++
		case h.state == holdSuspended:
			h.state = holdUnpinning
			out = append(out, Action{Kind: ActUnpin, Unit: u})
		}
	}
	for _, u := range sortedKeys(c.Held) {
		tok := c.Held[u]
		if m.held[u] == nil {
			m.held[u] = &hold{tok: tok, state: holdUnpinning, reset: true}
			m.version++
			out = append(out, Action{Kind: ActUnpin, Unit: u})
		}
	}
	return out
}

func (m *standin) natsDone(ev Event) []Action {
	h := m.held[ev.Unit]
	if h == nil {
		return nil
	}
	if ev.Err != nil {
		switch h.state {
		case holdUnpinning, holdUnpinRel:
			return []Action{{Kind: ActUnpin, Unit: ev.Unit}}
		case holdResetting:
			return []Action{{Kind: ActReset, Unit: ev.Unit}}
		}
		return nil
	}
	switch {
	case h.state == holdUnpinning && ev.Op == OpUnpin && h.reset:
		h.state = holdResetting
		return []Action{{Kind: ActReset, Unit: ev.Unit}}
	case (h.state == holdUnpinning && ev.Op == OpUnpin) || (h.state == holdResetting && ev.Op == OpReset):
		if m.running[ev.Unit] {
			h.state = holdWaitStart
			return nil
		}
		return m.startPuller(ev.Unit, h)
	case h.state == holdUnpinRel && ev.Op == OpUnpin:
		return m.release(ev.Unit, h)
	}
	return nil
}

func (m *standin) startPuller(u string, h *hold) []Action {
	h.state = holdPulling
	m.running[u] = true
	return []Action{{Kind: ActStartPuller, Unit: u, Token: h.tok, Incarnation: m.ref.Incarnation, TopologyEpoch: h.te}}
}

func (m *standin) release(u string, h *hold) []Action {
	h.state = holdReleasing
	tok := h.tok
	id, a := m.call(OpReleaseMany, func(ctx context.Context, r poolctl.Registry) (any, error) {
		return r.ReleaseMany(ctx, []poolctl.Token{tok})
	})
	m.releases[id] = u
	return []Action{a}
}

func (m *standin) released(u string, r Reply) []Action {
	h := m.held[u]
	if h == nil || h.state != holdReleasing {
		return nil
	}
	if r.Err != nil {
		return m.release(u, h) // a release is safe to repeat: a stale one is refused
	}
	delete(m.held, u)
	m.version++
	return nil
}
