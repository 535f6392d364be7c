package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/member"
)

// Worker is one member of a fleet. Create it with New and run it with Run.
//
// All of its membership state lives in one state machine (package
// internal/member), owned by Run's goroutine: Run feeds it events (ticks,
// timers, registry replies, puller reports) and performs the actions it
// returns. Registry calls and NATS requests run on goroutines of their own
// and post their outcome back, tagged with the request they answer, so a
// slow call delays nothing else (a renewal never waits for a drain). The
// only state other goroutines read is the delivery permission the core
// publishes, an immutable value behind one atomic pointer.
type Worker struct {
	opts    Options
	log     logr.Logger
	reg     poolctl.Registry
	js      jetstream.JetStream
	metrics *metrics

	// perm is the core's latest delivery permission: pullers check it
	// before every delivery and settlement.
	perm atomic.Pointer[member.Permission]
	// layout names streams and consumers: the options' until the
	// registry's settings arrive.
	layout atomic.Pointer[natsops.Layout]
	// queryBound bounds one registry call (the registry's QueryBound);
	// drain is the registry's drain timeout (0 until it sets one);
	// fetchWait bounds one pull (FetchWait, at most the registry's
	// renew interval).
	queryBound, drain, fetchWait atomic.Int64

	// inbox carries events from calls and pullers to Run's goroutine;
	// loopDone closes when Run stops reading it.
	inbox    chan member.Event
	loopDone chan struct{}
	// runCtx ends after the core is done: calls and pullers outlive Run's
	// context by the shutdown handover.
	runCtx context.Context
	// slots bounds concurrent UNPIN and RESET requests.
	slots chan struct{}
	// streams caches partition stream handles by name, for UNPIN.
	streams sync.Map
	// pullers are the running pullers, by id; only Run's goroutine
	// touches the map.
	pullers map[member.PullerID]*puller
	// failing holds the pullers whose latest lookup or pull failed, by id
	// (fetchhealth.go), for Readiness.
	failing sync.Map
	// calls counts goroutines performing an action, so Run returns only
	// after they ended.
	calls sync.WaitGroup
	// process names this Worker to the registry when it joins: a later
	// incarnation of its member name granted under the same process is
	// its own (a join that arrived late), one under another process
	// displaces it (poolctl.Registry.Rejoin).
	process string
}

// New checks the options and returns a Worker ready to Run.
func New(o Options) (*Worker, error) {
	opts := o.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(opts.NATS)
	if err != nil {
		return nil, fmt.Errorf("jetstream context: %w", err)
	}
	m, err := newMetrics(opts.Metrics)
	if err != nil {
		return nil, err
	}
	w := &Worker{
		opts:     opts,
		log:      opts.Logger.WithValues("member", opts.Member, "topology", opts.Topology),
		reg:      opts.Registry.reg,
		js:       js,
		metrics:  m,
		inbox:    make(chan member.Event, 1024),
		loopDone: make(chan struct{}),
		slots:    make(chan struct{}, opts.TakeoverConcurrency),
		pullers:  map[member.PullerID]*puller{},
		process:  newProcessID(),
	}
	w.layout.Store(&natsops.Layout{SubjectPrefix: opts.SubjectPrefix, ConsumerName: opts.ConsumerName})
	w.queryBound.Store(int64(2 * time.Second))
	w.fetchWait.Store(int64(opts.FetchWait))
	return w, nil
}

// newProcessID returns a name for one Worker that no other Worker, in this
// OS process or any other, shares: the host, the OS process id, the start
// time and random bits (two Workers of one test binary differ by the
// last).
func newProcessID() string {
	host, _ := os.Hostname()
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return fmt.Sprintf("%s/%d/%s/%s", host, os.Getpid(), time.Now().UTC().Format("20060102T150405.000000Z"), hex.EncodeToString(b[:]))
}

// processStart anchors the worker's monotonic clock: the core's instants
// and the permission's fence deadline are durations since it.
var processStart = time.Now()

// sinceStart is the monotonic clock the core and the permission use: one
// clock read, where time.Now reads the wall clock too.
func sinceStart() time.Duration { return time.Since(processStart) }

// Run takes part in the fleet until ctx ends, then hands every unit over
// and leaves, bounded by twice the drain timeout plus ten seconds. It
// returns nil after a clean leave. The lease keeps being renewed until the
// member has left, so a slow handover on shutdown never turns into the
// crash path. A process displaced by a later one under the same member
// name (the registry reports a later incarnation) returns an error at
// once: the name is the other's.
func (w *Worker) Run(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.Background())
	w.runCtx = runCtx
	defer func() {
		close(w.loopDone)
		cancel()
		w.stopAllPullers()
		w.calls.Wait()
	}()
	core := member.New(coreConfig(member.Config{Topology: w.opts.Topology, Member: w.opts.Member, Process: w.process,
		FenceMargin: w.opts.FenceMargin, DrainTimeout: w.opts.DrainTimeout, ClaimBatch: w.opts.ClaimBatch}))
	l := &loop{w: w, core: core, timer: time.NewTimer(time.Hour), ticker: time.NewTicker(w.opts.TickInterval)}
	defer l.ticker.Stop()
	defer l.timer.Stop()
	return l.run(ctx)
}

// loop is Run's goroutine: the only one that steps the core.
type loop struct {
	w      *Worker
	core   *member.Core
	timer  *time.Timer
	ticker *time.Ticker
	// deadline bounds the shutdown once it began.
	deadline <-chan time.Time
	done     bool
	err      error
}

func (l *loop) run(ctx context.Context) error {
	l.step(member.Tick{})
	ctxDone := ctx.Done()
	for !l.done {
		select {
		case ev := <-l.w.inbox:
			l.step(ev)
		case <-l.ticker.C:
			l.step(member.Tick{})
		case <-l.timer.C:
			l.step(member.Timer{})
		case <-ctxDone:
			ctxDone = nil
			l.deadline = time.After(2*l.w.drainTimeout() + 10*time.Second)
			l.w.log.Info("Shutting down: handing over")
			l.step(member.Shutdown{})
		case <-l.deadline:
			return fmt.Errorf("shut down: handover and leave did not finish within %s", 2*l.w.drainTimeout()+10*time.Second)
		}
	}
	if errors.Is(l.err, member.ErrNotJoined) {
		return fmt.Errorf("join %s: %w", l.w.opts.Member, ctx.Err())
	}
	return l.err
}

// step stamps ev with the monotonic clock, steps the core and performs
// its actions in order.
func (l *loop) step(ev member.Event) {
	switch e := ev.(type) {
	case member.PullerStopped:
		delete(l.w.pullers, e.Puller)
	case member.Tick:
		l.w.gaugePending()
	}
	for _, a := range l.core.Step(member.Stamp(ev, sinceStart())) {
		switch a := a.(type) {
		case member.SetTimer:
			l.timer.Reset(max(0, a.At-sinceStart()))
		case member.Done:
			l.done, l.err = true, a.Err
		default:
			l.w.perform(a)
		}
	}
}

// post hands an event to Run's goroutine; after Run returned it is
// dropped.
func (w *Worker) post(ev member.Event) {
	select {
	case w.inbox <- ev:
	case <-w.loopDone:
	}
}

// drainTimeout is the drain bound the registry set, else the option's.
func (w *Worker) drainTimeout() time.Duration {
	if d := w.drain.Load(); d > 0 {
		return time.Duration(d)
	}
	return w.opts.DrainTimeout
}

// Ready reports whether the worker holds a lease, is not fenced, and no
// unit it delivers has failed every pull for longer than
// FetchFailureBound (Readiness says why not).
func (w *Worker) Ready() bool { return w.Readiness() == nil }

// Status is a point-in-time account of the worker, for health endpoints
// and tests.
type Status struct {
	Member      string
	Incarnation int64
	Slot        int
	Fenced      bool
	// Held maps each unit the member delivers to its fencing epoch; units
	// being released are left out.
	Held map[string]int64
}

// Status returns the worker's current state, as of its latest permission.
func (w *Worker) Status() Status {
	p := w.perm.Load()
	s := Status{Member: w.opts.Member, Fenced: p.FencedAt(sinceStart()), Slot: -1, Held: map[string]int64{}}
	if p == nil {
		return s
	}
	s.Incarnation, s.Slot = p.Incarnation, p.Slot
	for u, t := range p.Units {
		s.Held[u.String()] = t.Epoch
	}
	return s
}

// queryCtx bounds one registry call by the registry's query bound.
func (w *Worker) queryCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(w.runCtx, time.Duration(w.queryBound.Load()))
}

// gaugePending sets the lag gauge from what NATS last told each puller.
func (w *Worker) gaugePending() {
	var n int64
	for _, p := range w.pullers {
		n += p.pending.Load()
	}
	w.metrics.pendingRows.Set(float64(n))
}
