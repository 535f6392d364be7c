package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Worker is one member of a fleet. Create it with New and run it with Run.
//
// Two loops share its state under mu: the lease loop (lease.go) joins,
// renews on the registry's schedule, records fences and confirms claims;
// the tick loop (tick.go) reads the registry, places, hands over and
// claims. Only the lease loop talks to the registry about the lease and
// the fence, so those calls are ordered; a tick, however long, never
// delays a renewal.
type Worker struct {
	opts    Options
	log     logr.Logger
	reg     poolctl.Registry
	js      jetstream.JetStream
	metrics *metrics

	// runCtx outlives Run's context by the shutdown handover: pullers keep
	// delivering while their units are handed over.
	runCtx    context.Context
	cancelRun context.CancelFunc
	// wakeLease asks the lease loop to act now (a fence to record).
	wakeLease chan struct{}
	// slots bounds concurrent UNPIN and RESET requests.
	slots chan struct{}
	// streams caches partition stream handles by name, for UNPIN.
	streams sync.Map

	mu sync.Mutex
	// layout names streams and consumers and drain bounds handovers: from
	// the options until the registry's settings arrive with the lease.
	layout  natsops.Layout
	drain   time.Duration
	lease   *poolctl.Lease
	fenceAt time.Time // monotonic: stop delivering at this instant (P5)
	// fenceDue is fenceAt as time since processStart: checking it takes
	// one monotonic clock read, where time.Now reads the wall clock too,
	// and delivery checks it twice per row.
	fenceDue time.Duration
	fenced   bool
	// fenceGen counts this incarnation's local fences; the registry
	// applies a Fence or Unfence only in generation order.
	fenceGen int64
	// fenceSent is the highest generation whose Fence reached the
	// registry.
	fenceSent int64
	// fencedSince is when the current fence began (zero before the
	// first lease), for the fenced-seconds metric.
	fencedSince time.Time
	watchdog    *time.Timer
	held        map[ownership.Unit]*holding
	// waiting counts units an earlier incarnation of this member holds
	// that wait for the same-name grace before they come home.
	waiting int
	// ackedPending is the pending epoch this incarnation acknowledged.
	ackedPending int64
	params       poolctl.Params
	// reset is the census verdict of the last snapshot, and when it was
	// read on this process's clock, so its age can be judged at the
	// moment of a RESET rather than at the start of a tick.
	reset   poolctl.ResetPermission
	resetAt time.Time
	// renewedAt is when the last successful renewal's request was sent.
	renewedAt time.Time
	// placed is the tick goroutine's placement cache.
	placed placedCache
}

// holding is a claim this member holds, and its puller when delivering.
type holding struct {
	token poolctl.Token
	// under is the topology epoch the claim was decided under, for the
	// history (0 when confirmed after a rejoin).
	under  int64
	puller *puller
	// releasing is set once delivery stopped for a handover, before the
	// release is sent: from then on the member no longer counts the unit
	// as its own, even if the release must be retried.
	releasing bool
	// takeover says the next puller must first lift a dead process's pin
	// and, when the census allows it, RESET the consumer: set for
	// adoptions and re-homes, and for units whose rows this process
	// withheld when it fenced itself.
	takeover bool
	// from is the process the unit is taken over from, for logs.
	from string
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
	return &Worker{
		opts:      opts,
		log:       opts.Logger.WithValues("member", opts.Member, "topology", opts.Topology),
		reg:       opts.Registry.reg,
		drain:     opts.DrainTimeout,
		js:        js,
		layout:    natsops.Layout{SubjectPrefix: opts.SubjectPrefix, ConsumerName: opts.ConsumerName},
		metrics:   m,
		held:      map[ownership.Unit]*holding{},
		fenced:    true, // until the first lease
		wakeLease: make(chan struct{}, 1),
		slots:     make(chan struct{}, opts.TakeoverConcurrency),
	}, nil
}

// Run takes part in the fleet until ctx ends, then hands every unit over
// within the drain timeout and leaves. It returns nil after a clean leave.
// The lease keeps being renewed until the member has left, so a slow
// handover on shutdown never turns into the crash path.
func (w *Worker) Run(ctx context.Context) error {
	w.runCtx, w.cancelRun = context.WithCancel(context.Background())
	defer w.cancelRun()
	defer w.stopWatchdog()

	leaseCtx, cancelLease := context.WithCancel(context.Background())
	leaseDone := make(chan struct{})
	go func() { defer close(leaseDone); w.leaseLoop(leaseCtx) }()
	stopLease := func() { cancelLease(); <-leaseDone }
	defer stopLease()

	if err := w.waitForLease(ctx); err != nil {
		return err
	}
	for {
		if err := w.tick(ctx); err != nil && ctx.Err() == nil {
			w.log.Info("Tick incomplete", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return w.shutdown(stopLease)
		case <-time.After(w.opts.TickInterval):
		}
	}
}

// waitForLease returns once the lease loop has joined, or ctx ended first.
func (w *Worker) waitForLease(ctx context.Context) error {
	for {
		if _, ok := w.memberRef(); ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("join %s: %w", w.opts.Member, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// mayDeliver is the P1 check made before a row is delivered and before it
// is settled: the member holds the unit under this very token, is not
// fenced, and its self-fence deadline has not passed on its own clock.
func (w *Worker) mayDeliver(u ownership.Unit, t poolctl.Token) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.held[u]
	return !w.fencedLocked() && h != nil && h.token == t && !h.releasing
}

// Ready reports whether the worker holds a lease and is not fenced.
func (w *Worker) Ready() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lease != nil && !w.fencedLocked()
}

// fencedLocked is the fence as delivery sees it: set, or due on this
// process's clock even if the watchdog has not run yet (a process resumed
// after SIGSTOP runs its goroutines in any order). Callers hold w.mu.
func (w *Worker) fencedLocked() bool {
	return w.fenced || time.Since(processStart) >= w.fenceDue
}

// isFenced is fencedLocked for callers without the lock.
func (w *Worker) isFenced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fencedLocked()
}

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

// Status returns the worker's current state.
func (w *Worker) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Status{Member: w.opts.Member, Fenced: w.fencedLocked(), Slot: -1, Held: map[string]int64{}}
	if w.lease != nil {
		s.Incarnation, s.Slot = w.lease.Incarnation, w.lease.Slot
	}
	for u, h := range w.held {
		if !h.releasing {
			s.Held[u.String()] = h.token.Epoch
		}
	}
	return s
}

// queryCtx bounds one registry call by the registry's query bound.
func (w *Worker) queryCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	w.mu.Lock()
	bound := w.params.QueryBound
	w.mu.Unlock()
	if bound <= 0 {
		bound = 2 * time.Second
	}
	return context.WithTimeout(ctx, bound)
}

// memberRef is this incarnation's reference, or false before a join.
func (w *Worker) memberRef() (poolctl.MemberRef, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lease == nil {
		return poolctl.MemberRef{}, false
	}
	return w.lease.MemberRef, true
}

// isLeaseLost says the registry will not renew this incarnation again.
func isLeaseLost(err error) bool {
	return errors.Is(err, poolctl.ErrLeaseExpired) || errors.Is(err, poolctl.ErrStaleIncarnation) || errors.Is(err, poolctl.ErrNotMember)
}
