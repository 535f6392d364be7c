package sim

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"
)

// FaultKind is one kind of fault. Each seed enables a subset of the kinds
// (swarm testing), so rare combinations get their turn.
type FaultKind string

// The fault kinds.
const (
	// FaultLostRequest loses a registry request before it commits.
	FaultLostRequest FaultKind = "lost-request"
	// FaultLostReply loses a registry reply after the call committed: the
	// member cannot tell whether it did.
	FaultLostReply FaultKind = "lost-reply"
	// FaultDelay delays a request or a reply, up to twice the query
	// bound, so replies come out of order and after the caller gave up,
	// and delays a call's outcome on its way to the member (the
	// driver's goroutine posting it), so the member may handle it after
	// later events.
	FaultDelay FaultKind = "delay"
	// FaultDupReply delivers a reply a second time, later (a retrying
	// driver, a duplicated message): a member must apply a reply only
	// while it answers the current question.
	FaultDupReply FaultKind = "dup-reply"
	// FaultOutage makes the registry refuse or drop every request for a
	// while.
	FaultOutage FaultKind = "outage"
	// FaultClockStep steps the registry's clock forward
	// (Twin.ShiftClock) by up to 0.9 of the query bound, the margin by
	// which a member fences itself before its lease ends (FenceMargin's
	// default): leases end that much earlier in real time, and the
	// margin absorbs it. A larger step ends a lease before its member
	// could know (seed 6348 with steps up to 0.9 of the grace: a
	// delivery 0.28s after the lease ended in real time, its write
	// refused by the guard); the design assumes the registry's clock
	// never steps by more than the margin (design.md section 9). A step
	// back only makes leases last longer in real time, which is safe,
	// but then the registry accepts writes the history's unshifted lease
	// records call stale, so the evidence would disagree with the
	// registry rather than the member with the protocol.
	FaultClockStep FaultKind = "clock-step"
	// FaultPause stops a process for a while (SIGSTOP): it acts on
	// nothing until it resumes, then carries on where it was.
	FaultPause FaultKind = "pause"
	// FaultCrash kills a process; a new process starts under the same pod
	// name after a while.
	FaultCrash FaultKind = "crash"
	// FaultPartition cuts a process off from the registry and NATS for a
	// while; half the time its pod's replacement starts meanwhile, so two
	// processes run under one name once it heals.
	FaultPartition FaultKind = "partition"
	// FaultDuplicate pauses a process past its lease and starts its
	// pod's replacement meanwhile (as a kubelet whose probes failed
	// would); the old process resumes later, so two processes run under
	// one pod name.
	FaultDuplicate FaultKind = "duplicate"
	// FaultFreeze is not a fault but a topology change the operator makes
	// (a pending epoch, growing the units or not), which freezes claims
	// until every live member acknowledges it.
	FaultFreeze FaultKind = "freeze"
)

// FaultKinds lists every kind, in report order.
var FaultKinds = []FaultKind{FaultLostRequest, FaultLostReply, FaultDelay, FaultDupReply, FaultOutage, FaultClockStep,
	FaultPause, FaultCrash, FaultPartition, FaultDuplicate, FaultFreeze}

// windowFault is one planned fault instance.
type windowFault struct {
	kind   FaultKind
	at     int64
	dur    int64 // pause, outage, partition; crash: the restart delay
	target int   // pod index
	step   int64 // clock step
	// replace: a partitioned process's replacement starts after this
	// long (0: none). grow: the freeze adds shards.
	replace int64
	grow    bool
}

// faultPlan is what the seed decided about faults.
type faultPlan struct {
	members int
	enabled map[FaultKind]bool
	list    []windowFault
	// msgUntil is when per-message faults stop; rate is each per-message
	// kind's probability per message.
	msgUntil int64
	rate     map[FaultKind]float64
	// quiet is when the last fault stopped acting.
	quiet int64
}

// newPlan draws the plan from its own random stream, so the shrinker can
// leave instances out without moving the others.
func newPlan(cfg Config, rng *rand.Rand) faultPlan {
	pl := faultPlan{members: 2 + rng.IntN(2), enabled: map[FaultKind]bool{}}
	horizon := int64(4*sec) + rng.Int64N(int64(8*sec))
	for _, k := range FaultKinds {
		if rng.IntN(2) == 0 && !cfg.Disabled[k] {
			pl.enabled[k] = true
		}
	}
	pl.msgUntil = horizon
	pl.quiet = horizon
	draw := func() int64 { return int64(500*ms) + rng.Int64N(horizon-int64(500*ms)) }
	// Per-message faults come at an intensity the seed picks, so some
	// runs see a few and some a storm.
	intensity := []float64{0.03, 0.1, 0.25}
	pl.rate = map[FaultKind]float64{}
	for _, k := range []FaultKind{FaultLostRequest, FaultLostReply, FaultDelay, FaultDupReply} {
		pl.rate[k] = intensity[rng.IntN(len(intensity))]
	}
	for _, k := range FaultKinds {
		n := 1 + rng.IntN(2)
		if k == FaultFreeze {
			n = 1 + rng.IntN(3)
		}
		for range n {
			f := windowFault{kind: k, at: roundUS(draw()), target: rng.IntN(pl.members)}
			switch k {
			case FaultLostRequest, FaultLostReply, FaultDelay, FaultDupReply:
				continue
			case FaultOutage:
				f.dur = roundUS(int64(200*ms) + rng.Int64N(int64(5*sec)))
			case FaultClockStep:
				f.step = roundUS(1000 + rng.Int64N(int64(Params.QueryBound)*9/10))
			case FaultPause:
				f.dur = roundUS(int64(100*ms) + rng.Int64N(int64(8*sec)))
			case FaultCrash:
				f.dur = roundUS(rng.Int64N(int64(3 * sec)))
			case FaultPartition:
				f.dur = roundUS(int64(500*ms) + rng.Int64N(int64(8*sec)))
				if rng.IntN(2) == 0 {
					// The replacement starts once the cut-off process
					// must have fenced itself: a process cannot know that
					// a newer one joined under its name, so until then
					// its deliveries would be outside its claim.
					f.replace = roundUS(int64(Params.LeaseTTL) + rng.Int64N(int64(3*sec)))
				}
			case FaultDuplicate:
				f.dur = roundUS(int64(Params.LeaseTTL) + rng.Int64N(int64(6*sec)))
				f.replace = roundUS(int64(Params.LeaseTTL) + rng.Int64N(f.dur-int64(Params.LeaseTTL)+1))
			case FaultFreeze:
				f.grow = rng.IntN(2) == 0
			}
			if !pl.enabled[k] {
				continue
			}
			idx := len(pl.list)
			if cfg.Skip[-(idx + 1)] {
				pl.list = append(pl.list, windowFault{kind: k, at: -1})
				continue
			}
			pl.list = append(pl.list, f)
			pl.quiet = max(pl.quiet, f.at+f.dur)
		}
	}
	return pl
}

// windows returns the planned instances of kind.
func (pl *faultPlan) windows(kind FaultKind) []windowFault {
	var out []windowFault
	for _, f := range pl.list {
		if f.kind == kind && f.at >= 0 {
			out = append(out, f)
		}
	}
	return out
}

// fault decides one per-message fault: true when kind is enabled, the
// per-message window is open and the draw says so. Each decision that
// comes out true has an ordinal the shrinker can skip.
func (w *world) fault(kind FaultKind) bool {
	if !w.plan.enabled[kind] || w.s.now >= w.plan.msgUntil {
		return false
	}
	if !w.s.chance(w.plan.rate[kind]) {
		return false
	}
	w.faultOrd++
	if w.cfg.Skip[w.faultOrd] {
		return false
	}
	w.injected[kind]++
	return true
}

// schedulePlan puts the planned instances on the timeline.
func (w *world) schedulePlan() {
	for i, f := range w.plan.list {
		if f.at < 0 {
			continue
		}
		name := podName(f.target)
		w.s.at(f.at, nil, func() {
			w.injected[f.kind]++
			switch f.kind {
			case FaultOutage:
				w.tracef("fault %d: registry outage for %s", i, time.Duration(f.dur))
			case FaultClockStep:
				w.tracef("fault %d: registry clock steps %s", i, time.Duration(f.step))
				must(w.twin.ShiftClock(context.Background(), topology, time.Duration(f.step)))
				w.offset += f.step
				w.offsets = append(w.offsets, [2]int64{w.s.now, w.offset})
			case FaultPause:
				if p := w.newest(name); p != nil {
					w.tracef("fault %d: %s paused for %s", i, p.id, time.Duration(f.dur))
					p.isolate(w.s.now, w.s.now+f.dur, false)
				}
			case FaultCrash:
				if p := w.newest(name); p != nil {
					w.tracef("fault %d: %s crashes, restarts after %s", i, p.id, time.Duration(f.dur))
					w.kill(p)
					w.s.after(f.dur, nil, func() {
						// The kubelet restarts the pod's container, unless a
						// live process holds the name's current incarnation
						// (an older process that regained it): a restart
						// would displace a process still delivering.
						if !w.nameHeldByLive(name) {
							w.startProcess(name)
						}
					})
				}
			case FaultPartition:
				if p := w.newest(name); p != nil {
					w.tracef("fault %d: %s cut off for %s", i, p.id, time.Duration(f.dur))
					p.isolate(w.s.now, w.s.now+f.dur, true)
					if f.replace > 0 {
						w.s.after(f.replace, nil, func() { w.replace(p, f.at) })
					}
				}
			case FaultDuplicate:
				if p := w.newest(name); p != nil {
					w.tracef("fault %d: %s paused for %s, its replacement starts after %s", i, p.id,
						time.Duration(f.dur), time.Duration(f.replace))
					p.isolate(w.s.now, w.s.now+f.dur, false)
					w.s.after(f.replace, nil, func() { w.replace(p, f.at) })
				}
			case FaultFreeze:
				w.freeze(f.grow)
			}
		})
	}
}

// replace starts the replacement of p under its pod name, unless a
// newer process runs under the name already (the replacement of an
// earlier fault): a pod has one replacement at a time.
//
// It also needs the registry's current incarnation of the name to be the
// one p learned from its last join, and p's last lease call to have
// succeeded (so when it heals it renews, learns of the newer incarnation
// and steps aside, rather than joining again): a process cannot tell that a newer
// one joined under its name until the registry tells it, so a process
// that joins without knowing of the other (its own join's reply was lost)
// would deliver outside its claim for a renew interval, which no member
// logic can avoid. A kubelet starts a replacement only for a pod it gave
// up on, long after that pod joined.
//
// The process must still be cut off or paused: a replacement is for a
// pod that stopped answering, and the fault started it at least a lease
// TTL ago, so the process has fenced itself since.
func (w *world) replace(p *process, since int64) {
	if !w.alone(p) || p.inc == 0 || !p.leased || !p.isolatedThrough(since, w.s.now) {
		return
	}
	snap, err := w.twin.Snapshot(context.Background(), topology)
	must(err)
	if m := snap.Member(p.name); m == nil || m.Incarnation != p.inc {
		return
	}
	w.startProcess(p.name)
	w.isolate(p)
}

// isolate keeps p cut off or paused until a newer process under its name
// holds the name's current incarnation. Were p to heal before its
// replacement's first join commits, p would join again (its lease
// lapsed) and the replacement's join would then displace a live process,
// which would deliver outside its claim until its next renewal: a race
// between two processes that each believe they are the pod, which no
// member logic can win. A kubelet's replacement joins in the window the
// old pod is gone; the heal comes after.
func (w *world) isolate(p *process) {
	if p.dead {
		return
	}
	snap, err := w.twin.Snapshot(context.Background(), topology)
	must(err)
	if m := snap.Member(p.name); m != nil && m.Incarnation != p.inc {
		for _, o := range w.byName[p.name] {
			if o != p && o.inc == m.Incarnation {
				return // a newer process holds the name
			}
		}
	}
	const step = 100 * ms
	if p.cut(w.s.now) {
		p.isolate(w.s.now, w.s.now+step, true)
	}
	if p.pausedUntil > w.s.now {
		p.isolate(w.s.now, w.s.now+step, false)
	}
	w.s.after(step/2, nil, func() { w.isolate(p) })
}

// alone is false when p is dead or another process under its name is not.
func (w *world) alone(p *process) bool {
	if p.dead {
		return false
	}
	for _, o := range w.byName[p.name] {
		if o != p && !o.dead {
			return false
		}
	}
	return true
}

// nameHeldByLive reports whether a process that is not dead holds the
// registry's current incarnation of name, or is still joining.
func (w *world) nameHeldByLive(name string) bool {
	snap, err := w.twin.Snapshot(context.Background(), topology)
	must(err)
	m := snap.Member(name)
	for _, o := range w.byName[name] {
		// A live process still joining (a restart already under way)
		// would be displaced by this one's join, or displace it.
		if !o.dead && (o.inc == 0 || m != nil && o.inc == m.Incarnation) {
			return true
		}
	}
	return false
}

// newest is the latest process started under name that is not dead.
func (w *world) newest(name string) *process {
	ps := w.byName[name]
	for i := len(ps) - 1; i >= 0; i-- {
		if !ps[i].dead {
			return ps[i]
		}
	}
	return nil
}

// kill ends a process: its pullers and timers die with it; requests it
// already sent may still commit.
func (w *world) kill(p *process) {
	p.dead = true
	for _, pl := range p.pullers {
		pl.done = true
	}
}

// isolate cuts p off (cut) or pauses it from now until end.
func (p *process) isolate(now, end int64, cut bool) {
	if cut {
		p.cutUntil = max(p.cutUntil, end)
	} else {
		p.pausedUntil = max(p.pausedUntil, end)
	}
	p.iso = append(p.iso, [2]int64{now, end})
}

// isolatedThrough reports whether p was cut off or paused at every
// instant of [from, to].
func (p *process) isolatedThrough(from, to int64) bool {
	iso := slices.Clone(p.iso)
	slices.SortFunc(iso, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	at := from
	for _, x := range iso {
		if x[0] > at {
			break
		}
		at = max(at, x[1])
	}
	return at > to
}
