package member

import (
	"fmt"
	"sort"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// plan is what one tick decided from its snapshot, kept while it waits for
// its probe.
type plan struct {
	incarnation int64
	under       int64
	topo        ownership.Topology
	mine        map[ownership.Unit]bool
	drain       []ownership.Unit
	// claiming: claims may be made (not frozen, not draining).
	claiming bool
}

// onTick starts a tick: read the registry. A fenced member, or one without
// a lease, does not place or claim: what it holds is unknown until the
// lease lane confirms it.
func (c *Core) onTick() {
	for _, x := range c.units {
		x.parked = false // failed releases are retried once a tick
	}
	c.ensurePullers()
	c.readSnapshot()
}

// readSnapshot starts a tick's registry read, unless one is out or the
// member is fenced or has no lease.
func (c *Core) readSnapshot() {
	if c.tick != nil || c.phase != phaseMember {
		return
	}
	if c.lease == nil || c.fenced {
		return
	}
	c.tick = &call{id: c.newID(), kind: callSnapshot, incarnation: c.incarnation(), gen: c.fenceGen}
	c.emit(ReadSnapshot{Req: c.tick.id, Topology: c.cfg.Topology})
}

func (c *Core) onSnapshot(e SnapshotReply) {
	if c.tick == nil || c.tick.id != e.Req || c.tick.kind != callSnapshot {
		return
	}
	cl := c.tick
	c.tick = nil
	if e.Err != nil {
		c.note(NoteCallFailed, ownership.Unit{}, 0, "snapshot: "+e.Err.Error())
		return
	}
	s := e.Snap
	c.configure(s.Params)
	c.reset, c.resetAt = s.Reset, c.now
	if !sameBarrier(c.barrier, s.Barrier) {
		// Published with the next permission: pullers hold a moved
		// key's rows while its old unit is not lifted (issue 24).
		c.barrier = s.Barrier
		c.permDirty = true
	}
	if cl.gen == c.fenceGen && !c.fenced && c.barrierGen != c.fenceGen {
		// The first barrier read since the fence lifted: pullers may
		// start (they waited for it).
		c.barrierGen = c.fenceGen
		c.ensurePullers()
	}
	if c.lease == nil {
		return
	}
	me := s.Member(c.cfg.Member)
	if c.phase != phaseMember || c.fenced || cl.incarnation != c.incarnation() ||
		me == nil || me.Incarnation != cl.incarnation || !me.Live {
		// The snapshot predates a rejoin, or the registry does not show
		// this incarnation live yet: placing nothing here would hand
		// every unit over.
		return
	}
	c.ackFreeze(s)
	p := c.place(s, me)
	if p == nil {
		return
	}
	if probe := c.probeCandidates(p); len(probe) > 0 {
		c.plan = p
		c.tick = &call{id: c.newID(), kind: callProbe, incarnation: cl.incarnation}
		c.emit(Probe{Req: c.tick.id, Units: probe})
		return
	}
	c.decide(p, nil)
}

// ackFreeze acknowledges a pending epoch once per incarnation. Claims stop
// from here (plan.claiming); units already held keep flowing (P2).
func (c *Core) ackFreeze(s poolctl.Snapshot) {
	if s.Pending == nil || c.freeze != nil {
		return
	}
	if c.acked.epoch == s.Pending.Number && c.acked.incarnation == c.incarnation() {
		return
	}
	c.freeze = &call{id: c.newID(), incarnation: c.incarnation(), epoch: s.Pending.Number}
	c.emit(AckFreeze{Req: c.freeze.id, Ref: c.ref(), Epoch: s.Pending.Number})
}

// onAckFreeze records an acknowledgement, but only for the incarnation it
// was sent under: one that returns after a rejoin acknowledged for an
// incarnation that is gone, and the new one must acknowledge again
// (issue 20 defect 4).
func (c *Core) onAckFreeze(e AckFreezeReply) {
	cl := c.freeze
	if cl == nil || cl.id != e.Req {
		return
	}
	c.freeze = nil
	if e.Err != nil {
		c.note(NoteCallFailed, ownership.Unit{}, 0, fmt.Sprintf("acknowledge freeze of epoch %d: %v", cl.epoch, e.Err))
		return
	}
	if cl.incarnation != c.incarnation() && !c.cfg.mutations.on(FreezeAckAcrossRejoin) {
		return
	}
	c.acked.epoch, c.acked.incarnation = cl.epoch, c.incarnation()
	c.note(NoteFroze, ownership.Unit{}, float64(cl.epoch), "")
}

// place computes this member's units: capped rendezvous placement of the
// active epoch's units over the slots of live, non-draining members, and
// the same placement of the retiring units. A member the operator asked to
// drain places nothing on itself, so it hands everything over.
func (c *Core) place(s poolctl.Snapshot, me *poolctl.Member) *plan {
	p := &plan{incarnation: c.incarnation(), mine: map[ownership.Unit]bool{}}
	if s.Active == nil {
		return p
	}
	p.under = s.Active.Number
	p.topo = ownership.Topology{Partitions: s.Active.Partitions, Shards: s.Active.Shards}
	p.claiming = s.Pending == nil && !me.Draining && me.Slot >= 0
	if me.Slot < 0 || me.Draining {
		return p
	}
	key := placementKey{epoch: s.Active.Number, slot: me.Slot, slots: fmt.Sprint(s.PlacementSlots(), s.Retiring)}
	if c.placed.key != key || c.placed.mine == nil {
		c.placed = placeFor(s, p.topo, me.Slot)
		c.placed.key = key
	}
	p.mine, p.drain = c.placed.mine, c.placed.drain
	return p
}

// placeFor is the pure placement of one member's slot.
func placeFor(s poolctl.Snapshot, topo ownership.Topology, slot int) placedCache {
	out := placedCache{mine: map[ownership.Unit]bool{}}
	var slots []ownership.Slot
	for _, x := range s.PlacementSlots() {
		slots = append(slots, ownership.Slot(x))
	}
	for _, u := range ownership.Place(topo.Units(), slots).UnitsOf(ownership.Slot(slot)) {
		out.mine[u] = true
	}
	var retiring []ownership.Unit
	for _, name := range s.Retiring {
		if u, err := ownership.ParseUnit(name); err == nil && !topo.Contains(u) {
			retiring = append(retiring, u)
		}
	}
	if len(retiring) > 0 {
		out.drain = ownership.Place(retiring, slots).UnitsOf(ownership.Slot(slot))
	}
	return out
}

// placementKey is everything placement depends on.
type placementKey struct {
	epoch int64
	slot  int
	slots string
}

// placedCache keeps the last placement: at 65536 units over 1024 members
// it costs hundreds of milliseconds, and its inputs rarely change.
type placedCache struct {
	key   placementKey
	mine  map[ownership.Unit]bool
	drain []ownership.Unit
}

// probeCandidates lists the units whose consumers must be read before the
// tick decides: held units that left the topology (delivered until
// drained, then released) and retiring units placed here that nobody
// holds (claimed only to drain rows).
func (c *Core) probeCandidates(p *plan) []ownership.Unit {
	var out []ownership.Unit
	for u, x := range c.units {
		if x.state == stHeld && !p.mine[u] && p.topo.Len() > 0 && !p.topo.Contains(u) {
			out = append(out, u)
		}
	}
	if p.claiming {
		for _, u := range p.drain {
			if c.units[u] == nil {
				out = append(out, u)
			}
		}
	}
	sortUnits(out)
	return out
}

func (c *Core) onProbe(e ProbeReply) {
	if c.tick == nil || c.tick.id != e.Req || c.tick.kind != callProbe {
		return
	}
	cl, p := c.tick, c.plan
	c.tick, c.plan = nil, nil
	if p == nil || c.phase != phaseMember || c.fenced || cl.incarnation != c.incarnation() {
		return
	}
	busy := map[ownership.Unit]bool{}
	for _, u := range e.Busy {
		busy[u] = true
	}
	c.decide(p, busy)
}

// decide hands over every held unit placement no longer gives this member
// (a unit that left the topology only once its consumer is drained) and
// claims every unit placed here that the member does not know.
func (c *Core) decide(p *plan, busy map[ownership.Unit]bool) {
	for _, u := range sortedUnits(c.units) {
		x := c.units[u]
		leftTopology := p.topo.Len() > 0 && !p.topo.Contains(u)
		if x.state == stHeld && !p.mine[u] && !(leftTopology && busy[u]) {
			c.beginHandover(u)
		}
	}
	if !p.claiming || c.lease == nil {
		return
	}
	var want []ownership.Unit
	for u := range p.mine {
		if c.units[u] == nil {
			want = append(want, u)
		}
	}
	for _, u := range p.drain {
		if c.units[u] == nil && busy[u] {
			want = append(want, u)
		}
	}
	sortUnits(want)
	for _, batch := range inBatches(want, c.cfg.ClaimBatch) {
		c.claim(p.under, batch)
	}
}

// claim sends one Claim for units.
func (c *Core) claim(under int64, units []ownership.Unit) {
	cl := &call{id: c.newID(), incarnation: c.incarnation(), epoch: under, units: units}
	names := make([]string, len(units))
	for i, u := range units {
		names[i] = u.String()
		c.units[u] = &unit{state: stClaiming, req: cl.id}
		c.touch(u)
	}
	c.claims[cl.id] = cl
	c.emit(Claim{Req: cl.id, Ref: c.ref(), Under: under, Units: names})
}

// onClaim applies a claim's outcomes to the units still waiting on it. An
// outcome nobody knows (the batch timed out, the reply was lost) is never
// taken for a refusal: the registry may have granted it, and a unit the
// member holds without knowing is stranded (nobody may adopt a live
// member's unit). A confirmation decides (issue 20 defect 5).
func (c *Core) onClaim(e ClaimReply) {
	cl := c.claims[e.Req]
	if cl == nil {
		return
	}
	delete(c.claims, e.Req)
	outcome := map[string]poolctl.ClaimOutcome{}
	for _, o := range e.Outcomes {
		outcome[o.Unit] = o
	}
	for _, u := range cl.units {
		x := c.units[u]
		if x == nil || x.state != stClaiming || x.req != cl.id {
			continue // decided meanwhile (a confirmation)
		}
		o, ok := outcome[u.String()]
		err := e.Err
		if err == nil && !ok {
			err = fmt.Errorf("no outcome for unit %s", u)
		} else if err == nil {
			err = o.Err
		}
		switch {
		case cl.incarnation != c.incarnation():
			c.unsure(u, x) // granted, if at all, to an incarnation that is gone
		case err == nil:
			c.granted(u, x, o.Claim, cl.epoch)
		case definite(err) || c.cfg.mutations.on(LostClaimReplyGuessed):
			c.forget(u)
		default:
			c.unsure(u, x)
		}
	}
}

// unsure marks u's claim outcome unknown.
func (c *Core) unsure(u ownership.Unit, x *unit) {
	x.state, x.req = stUnsure, 0
	c.touch(u)
	c.needConfirm = true
}

// granted records a claim the registry granted and starts its delivery.
func (c *Core) granted(u ownership.Unit, x *unit, cl poolctl.Claim, under int64) {
	x.state, x.req, x.token, x.under = stHeld, 0, cl.Token, under
	x.takeover, x.from = cl.Adopted || cl.Rehomed, cl.From
	c.touch(u)
	c.startPuller(u, x)
}

// inBatches splits xs into runs of at most size; size 0 keeps xs whole.
func inBatches[T any](xs []T, size int) [][]T {
	if len(xs) == 0 {
		return nil
	}
	if size <= 0 || size >= len(xs) {
		return [][]T{xs}
	}
	out := make([][]T, 0, (len(xs)+size-1)/size)
	for len(xs) > 0 {
		n := min(size, len(xs))
		out = append(out, xs[:n])
		xs = xs[n:]
	}
	return out
}

func sortUnits(us []ownership.Unit) {
	sort.Slice(us, func(i, j int) bool { return ownership.CompareUnits(us[i], us[j]) < 0 })
}

func sortedUnits[V any](m map[ownership.Unit]V) []ownership.Unit {
	out := make([]ownership.Unit, 0, len(m))
	for u := range m {
		out = append(out, u)
	}
	sortUnits(out)
	return out
}

// sameBarrier reports whether two readings of the order barrier say the
// same: same epoch, same switches recorded, same old units lifted.
func sameBarrier(a, b *poolctl.OrderBarrier) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Epoch != b.Epoch || len(a.Partitions) != len(b.Partitions) {
		return false
	}
	for i, pa := range a.Partitions {
		pb := b.Partitions[i]
		if pa.Partition != pb.Partition || pa.Switched != pb.Switched || pa.SwitchSeq != pb.SwitchSeq || pa.BeforeSeq != pb.BeforeSeq ||
			len(pa.Predecessors) != len(pb.Predecessors) {
			return false
		}
		for j, x := range pa.Predecessors {
			if y := pb.Predecessors[j]; x.Shard != y.Shard || x.Lifted() != y.Lifted() {
				return false
			}
		}
	}
	return true
}
