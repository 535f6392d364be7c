package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

const (
	ms  = int64(time.Millisecond)
	sec = int64(time.Second)
)

// topology is the one topology every run uses.
const topology = "sim"

// base is virtual time zero on the registry's wall clock.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Params are the fleet's timings, in virtual time. Short, so a run of a
// few virtual seconds crosses many leases.
var Params = poolctl.Params{
	LeaseTTL:      3 * time.Second,
	RenewInterval: time.Second,
	QueryBound:    500 * time.Millisecond,
	Grace:         1500 * time.Millisecond,
}

// The NATS side's timings.
const (
	pinnedTTL    = 120 * sec // the CRD's default
	ackWait      = 3 * sec
	fetchExpires = 500 * ms
	fetchBatch   = 3
)

// Config is one run: the seed decides everything else, except what the
// shrinker took out (Disabled, Skip).
type Config struct {
	Seed int64
	// Mutation names a deliberate defect to apply ("" for none): a core
	// mutation handed to NewMember, or one of the simulator's own
	// (registry and sink, see mutations.go).
	Mutation string
	// NewMember builds the member logic of one process; nil uses the
	// default (Default).
	NewMember func(MemberEnv) Member
	// Disabled turns fault kinds off on top of the seed's swarm choice.
	Disabled map[FaultKind]bool
	// Skip turns off individual fault instances by their ordinal.
	Skip map[int]bool
	// Trace keeps a line per event for the report of a failing seed.
	Trace bool
}

// MemberEnv is what a Member gets to start with.
type MemberEnv struct {
	Topology string
	Name     string // the pod name
	// Process names the process ("w-0#2"), unique in the run: the
	// identity a member gives the registry when it rejoins.
	Process string
	// Params are the topology's lease parameters (the member reads them
	// from its first lease too).
	Params   poolctl.Params
	Mutation string
	// Rand is the member's own random stream (jitter), from the seed.
	Rand *rand.Rand
}

// process is one OS process of one member: a pod name may have two.
type process struct {
	id          string // "w-0#2": pod name and the process's ordinal under it
	name        string
	member      Member
	rec         []history.Record
	dead        bool
	pausedUntil int64
	// cutUntil: partitioned from the registry and NATS until then.
	cutUntil int64
	pullers  map[string]*puller
	timers   map[string]uint64 // name -> generation of its pending setting
	started  int64
	// leased: the last answer to a lease call of the process that was
	// not lost granted it.
	leased bool
	// iso are the intervals it was cut off or paused.
	iso [][2]int64
	// inc is the incarnation the process's last delivered join reply
	// gave it (0: none yet).
	inc int64
}

func (p *process) cut(now int64) bool { return now < p.cutUntil }

func (p *process) record(r history.Record) { p.rec = append(p.rec, r) }

// world is one run.
type world struct {
	cfg    Config
	s      *sched
	twin   *poolctl.Twin
	reg    poolctl.Registry
	mut    mutations
	procs  []*process
	byName map[string][]*process
	cons   map[string]*consumer
	units  []string
	// offsets is every registry clock step: (virtual instant, new offset).
	offsets [][2]int64
	offset  int64

	sink      []historycheck.SinkWrite
	published map[string]string
	probes    map[string]int64 // row id -> published at (liveness probes)
	nextRow   int
	nextCall  uint64

	plan      faultPlan
	injected  map[FaultKind]int
	faultOrd  int
	lastFault int64
	quietAt   int64
	end       int64

	// operator: the pending epoch it waits on, and when it was created.
	pendingEpoch int64
	pendingSince int64
	activatedAt  map[int64]int64

	// order is the ordered run's streams, transform and keys; nil in an
	// unordered run (order.go).
	order *orderState

	// granted is, per pod name, the latest incarnation a join granted and
	// the process it went to, for the displacement check at an exit.
	granted map[string]grant

	trace []string
	fail  []string
}

// grant is an incarnation the registry granted and the process it went to.
type grant struct {
	inc  int64
	proc *process
}

// run performs a call on the twin and records the incarnation a join
// granted, with the process it went to.
func (w *world) run(p *process, c Call) (any, error) {
	v, err := c.Do(context.Background(), w.reg)
	if l, ok := v.(poolctl.Lease); ok && err == nil && c.Op == OpJoin {
		if w.granted == nil {
			w.granted = map[string]grant{}
		}
		w.granted[p.name] = grant{inc: l.Incarnation, proc: p}
	}
	return v, err
}

// checkDisplaced judges a process that exits as displaced: the name's
// live incarnation must be another process's. A process that gives up
// while the incarnation that superseded it is its own (a join of its own
// that committed after it had given up on it) left its units for nothing.
func (w *world) checkDisplaced(p *process, detail string) {
	if !strings.Contains(detail, "displaced") {
		return
	}
	g, ok := w.granted[p.name]
	if !ok || g.proc != p {
		return
	}
	snap, err := w.twin.Snapshot(context.Background(), topology)
	if err != nil {
		return
	}
	if m := snap.Member(p.name); m != nil && m.Live && m.Incarnation == g.inc {
		w.violate("displacement: %s exits as displaced (%s), but %s's live incarnation %d is its own", p.id, detail, p.name, g.inc)
	}
}

func (w *world) wall(t int64) time.Time { return base.Add(time.Duration(t)) }

func (w *world) tracef(format string, args ...any) {
	if w.cfg.Trace {
		w.trace = append(w.trace, fmt.Sprintf("%8.3fs ", float64(w.s.now)/1e9)+fmt.Sprintf(format, args...))
	}
}

// newWorld builds the registry with epoch 1 active and the fault plan.
func newWorld(cfg Config) *world {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed))
	w := &world{cfg: cfg, s: &sched{rng: rng}, byName: map[string][]*process{}, cons: map[string]*consumer{},
		published: map[string]string{}, probes: map[string]int64{}, injected: map[FaultKind]int{},
		activatedAt: map[int64]int64{}}
	w.twin = poolctl.NewTwin(func() time.Time { return w.wall(w.s.now) })
	w.mut = parseMutation(cfg.Mutation)
	w.reg = w.twin
	if err := w.mut.applyRegistry(w.twin); err != nil {
		panic(err)
	}
	ctx := context.Background()
	must(w.twin.EnsureTopology(ctx, topology, Params))
	e, err := w.twin.CreatePending(ctx, topology, 2, 2)
	must(err)
	must(w.twin.Activate(ctx, topology, e))
	// The census allows RESET: every server of the model is at the floor.
	must(w.twin.PublishResetPermission(ctx, topology, poolctl.ResetPermission{Allowed: true, Floor: "2.14.0",
		Servers: map[string]string{"n1": "2.14.9"}}))
	w.activatedAt[e] = 0
	w.setUnits(2, 2)
	if drawOrdered(cfg.Seed) {
		w.order = newOrderState(2, drawOrderedN(cfg.Seed))
	}
	w.plan = newPlan(cfg, rand.New(rand.NewPCG(uint64(cfg.Seed), 0xfa17)))
	return w
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func (w *world) setUnits(n, v int) {
	w.units = w.units[:0]
	for p := range n {
		for s := range v {
			u := fmt.Sprintf("%d.%d", p, s)
			w.units = append(w.units, u)
			if w.cons[u] == nil {
				w.cons[u] = &consumer{unit: u}
			}
		}
	}
}

// startProcess starts a process under pod name.
func (w *world) startProcess(name string) *process {
	p := &process{id: fmt.Sprintf("%s#%d", name, len(w.byName[name])+1), name: name,
		pullers: map[string]*puller{}, timers: map[string]uint64{}, started: w.s.now}
	env := MemberEnv{Topology: topology, Name: name, Process: p.id, Params: Params, Mutation: w.cfg.Mutation,
		Rand: rand.New(rand.NewPCG(uint64(w.cfg.Seed), uint64(len(w.procs))+1))}
	newMember := w.cfg.NewMember
	if newMember == nil {
		newMember = Default
	}
	p.member = newMember(env)
	w.procs = append(w.procs, p)
	w.byName[name] = append(w.byName[name], p)
	w.tracef("%s starts", p.id)
	w.perform(p, p.member.Start(time.Duration(w.s.now)))
	return p
}

// deliver gives the member of p one event and performs its actions.
func (w *world) deliver(p *process, ev Event) {
	if p.dead {
		return
	}
	w.perform(p, p.member.Step(time.Duration(w.s.now), ev))
}

// perform carries out a member's actions.
func (w *world) perform(p *process, acts []Action) {
	for _, a := range acts {
		switch a.Kind {
		case ActCall:
			w.send(p, a.Call)
		case ActTimer:
			w.setTimer(p, a.Timer, int64(a.At))
		case ActUnpin, ActReset:
			w.natsOp(p, a)
		case ActStartPuller:
			w.startPuller(p, a)
		case ActStopPuller, ActDrainPuller:
			mode := stopping
			if a.Kind == ActDrainPuller {
				mode = draining
			}
			if pl := p.pullers[a.Unit]; pl != nil && (a.Puller == 0 || pl.id == a.Puller) {
				pl.stop(mode, a.Timeout)
			} else {
				// No such puller runs (it stopped, or a newer one replaced
				// it): report it stopped.
				unit, id := a.Unit, a.Puller
				w.tracef("%s stop of puller %d of %s, which does not run", p.id, id, unit)
				w.s.after(0, p, func() { w.deliver(p, Event{Kind: EvPullerStopped, Unit: unit, Puller: id}) })
			}
		case ActProbe:
			var busy []string
			for _, u := range a.Units {
				if c := w.cons[u]; c == nil || c.unacked() > 0 {
					busy = append(busy, u)
				}
			}
			req := a.Req
			w.s.after(w.s.between(100*1000, 5*ms), p, func() { w.deliver(p, Event{Kind: EvProbe, Req: req, Busy: busy}) })
		case ActNote:
			w.tracef("%s note: %s", p.id, a.Detail)
		case ActExit:
			w.tracef("%s exits: %s", p.id, a.Detail)
			w.checkDisplaced(p, a.Detail)
			w.kill(p)
		}
	}
}

func (w *world) setTimer(p *process, name string, at int64) {
	p.timers[name]++
	gen := p.timers[name]
	w.s.at(at, p, func() {
		if p.timers[name] != gen {
			return
		}
		w.deliver(p, Event{Kind: EvTimer, Timer: name})
	})
}

// registryDown reports whether a registry outage covers now.
func (w *world) registryDown() bool {
	for _, o := range w.plan.windows(FaultOutage) {
		if w.s.now >= o.at && w.s.now < o.at+o.dur {
			return true
		}
	}
	return false
}

// send carries a registry call: request leg, execution on the twin at its
// arrival, reply leg, each subject to the seed's faults. The member hears
// back exactly once: the reply, or a timeout at its query bound (an
// unknown outcome).
func (w *world) send(p *process, c Call) {
	sent := w.s.now
	answered := false
	answer := func(r Reply) {
		if answered {
			return
		}
		answered = true
		r.ID, r.Op, r.Sent = c.ID, c.Op, time.Duration(sent)
		post := func() {
			if l, ok := r.Value.(poolctl.Lease); ok && r.Err == nil && c.Op == OpJoin {
				p.inc = l.Incarnation
			}
			w.deliver(p, Event{Kind: EvReply, Reply: r})
		}
		// The call is over (its outcome decided); the driver's goroutine
		// then posts it to the member, which a descheduled goroutine or a
		// busy event queue can delay past later events.
		if w.fault(FaultDelay) {
			w.s.after(w.slow(Params.QueryBound.Nanoseconds()), p, post)
		} else {
			post()
		}
		if w.fault(FaultDupReply) {
			// The same reply once more, later: the member must apply a
			// reply only while it answers the current question.
			w.s.after(w.s.between(ms, 2*sec), p, func() {
				w.tracef("%s %s #%d: reply delivered again", p.id, c.Op, c.ID)
				w.deliver(p, Event{Kind: EvReply, Reply: r})
			})
		}
	}
	bound := int64(Params.QueryBound)
	w.s.after(bound, p, func() {
		if !answered {
			w.tracef("%s %s #%d times out", p.id, c.Op, c.ID)
		}
		answer(Reply{Err: errTimeout, Unknown: true})
	})
	if p.cut(w.s.now) {
		w.tracef("%s %s #%d: cut off", p.id, c.Op, c.ID)
		return
	}
	if w.fault(FaultLostRequest) {
		w.tracef("%s %s #%d: request lost", p.id, c.Op, c.ID)
		return
	}
	reqDelay := w.s.between(100*1000, 15*ms)
	if w.fault(FaultDelay) {
		reqDelay = w.slow(bound)
	}
	w.s.after(reqDelay, nil, func() {
		if p.dead {
			return // the connection died with the process
		}
		if answered {
			// The caller gave up (its query bound passed) and closed the
			// connection before the request arrived. A join then commits
			// half the time (the close races the server's commit): the
			// member has retried meanwhile, so its own late join
			// supersedes the incarnation the retry got, and the member
			// must tell that from a later process's join (Rejoin names
			// the process). Other calls are dropped. (A request that
			// commits and whose reply then comes too late is the delayed
			// reply below.)
			if c.Op != OpJoin || w.registryDown() || !w.s.chance(0.5) {
				w.tracef("%s %s #%d arrives after its caller gave up: dropped", p.id, c.Op, c.ID)
				return
			}
			v, err := w.run(p, c)
			w.tracef("%s %s #%d arrives after its caller gave up and runs: %s", p.id, c.Op, c.ID, brief(v, err))
			return
		}
		if w.registryDown() {
			w.tracef("%s %s #%d: registry down", p.id, c.Op, c.ID)
			if w.s.chance(0.5) {
				// refused: known not to have run
				w.s.after(w.s.between(100*1000, 5*ms), p, func() { answer(Reply{Err: errRefused}) })
			}
			return
		}
		v, err := w.run(p, c)
		w.tracef("%s %s #%d runs: %s", p.id, c.Op, c.ID, brief(v, err))
		if p.cut(w.s.now) || w.fault(FaultLostReply) {
			w.tracef("%s %s #%d: reply lost", p.id, c.Op, c.ID)
			return
		}
		if c.Op == OpJoin || c.Op == OpRenew {
			// What the process will learn about its lease, set when the
			// answer leaves the registry (a paused process learns it on
			// resuming): see replace.
			p.leased = err == nil
		}
		repDelay := w.s.between(100*1000, 15*ms)
		if w.fault(FaultDelay) {
			repDelay = w.slow(bound)
		}
		w.s.after(repDelay, p, func() {
			if p.cut(w.s.now) {
				return
			}
			answer(Reply{Value: v, Err: err})
		})
	})
}

// slow is a delayed leg: mostly within the caller's query bound (a reply
// that comes late but in time, overtaken by others), sometimes past it.
func (w *world) slow(bound int64) int64 {
	if w.s.chance(0.75) {
		return w.s.between(20*ms, bound-ms)
	}
	return w.s.between(bound, 2*bound)
}

// brief is a call's outcome for the trace.
func brief(v any, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	switch x := v.(type) {
	case poolctl.Lease:
		return fmt.Sprintf("inc %d slot %d expires %s", x.Incarnation, x.Slot, x.ExpiresAt.Sub(base))
	case []poolctl.ClaimOutcome:
		var b []string
		for _, o := range x {
			if o.Err != nil {
				b = append(b, o.Unit+" refused ("+o.Err.Error()+")")
			} else {
				b = append(b, fmt.Sprintf("%s@%d", o.Unit, o.Claim.Epoch))
			}
		}
		return strings.Join(b, " ")
	case poolctl.Confirmation:
		var b []string
		for u, t := range x.Held {
			b = append(b, fmt.Sprintf("%s@%d", u, t.Epoch))
		}
		slices.Sort(b)
		return "held " + strings.Join(b, " ") + fmt.Sprintf(" waiting %v", x.Waiting)
	case []error:
		n := 0
		for _, e := range x {
			if e == nil {
				n++
			}
		}
		return fmt.Sprintf("%d/%d released", n, len(x))
	}
	return "ok"
}

// natsOp carries an UNPIN or RESET to the unit's consumer and its answer
// back.
func (w *world) natsOp(p *process, a Action) {
	op := OpUnpin
	if a.Kind == ActReset {
		op = OpReset
	}
	unit, req := a.Unit, a.Req
	c := w.cons[unit]
	answered := false
	w.s.after(2*sec, p, func() {
		if !answered {
			answered = true
			w.deliver(p, Event{Kind: EvNATS, Unit: unit, Op: op, Req: req, Err: errTimeout})
		}
	})
	if p.cut(w.s.now) || c == nil {
		return
	}
	at := w.s.now
	w.s.after(w.s.between(100*1000, 3*ms), nil, func() {
		w.tracef("%s %s %s", p.id, op, unit)
		if op == OpUnpin {
			c.unpin()
		} else {
			c.reset()
			p.record(history.Record{Kind: history.KindReset, Unit: unit, Member: p.name, Start: at})
		}
		w.s.after(w.s.between(100*1000, 3*ms), p, func() {
			if answered || p.cut(w.s.now) {
				return
			}
			answered = true
			w.deliver(p, Event{Kind: EvNATS, Unit: unit, Op: op, Req: req})
		})
	})
}

// publish appends a row to unit's stream.
func (w *world) publish(unit string) string {
	w.nextRow++
	id := fmt.Sprintf("r%d", w.nextRow)
	c := w.cons[unit]
	c.msgs = append(c.msgs, &msg{seq: uint64(len(c.msgs) + 1), rowID: id})
	w.published[id] = unit
	return id
}

// write is the sink: a guarded write of one row under tok at this
// instant. It reports whether the sink took it.
func (w *world) write(p *process, rowID string, tok poolctl.Token) bool {
	if !w.mut.noSinkGuard {
		if err := w.twin.CheckToken(context.Background(), tok); err != nil {
			w.tracef("%s sink refuses %s of %s@%d: %v", p.id, rowID, tok.Unit, tok.Epoch, err)
			return false
		}
	}
	w.sink = append(w.sink, historycheck.SinkWrite{RowID: rowID, Unit: tok.Unit, Member: tok.Member,
		Epoch: tok.Epoch, At: w.wall(w.s.now)})
	return true
}
