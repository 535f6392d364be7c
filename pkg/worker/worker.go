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
type Worker struct {
	opts    Options
	log     logr.Logger
	reg     poolctl.Registry
	js      jetstream.JetStream
	layout  natsops.Layout
	metrics *metrics

	// runCtx outlives Run's context by the shutdown handover: pullers keep
	// delivering while their units are handed over.
	runCtx    context.Context
	cancelRun context.CancelFunc

	mu      sync.Mutex
	lease   *poolctl.Lease
	fenceAt time.Time // monotonic: stop delivering at this instant (P5)
	fenced  bool
	// fencedSince is when the current fence began (zero before the
	// first lease), for the fenced-seconds metric.
	fencedSince time.Time
	watchdog    *time.Timer
	held        map[ownership.Unit]*holding
	// ackedPending is the pending epoch this incarnation acknowledged.
	ackedPending int64
	params       poolctl.Params
	lastTick     tickState
	// renewedAt is when the last successful renewal's request was sent.
	renewedAt time.Time
	// placed is the tick goroutine's placement cache.
	placed placedCache
}

// holding is a claim this member holds, and its puller when delivering.
type holding struct {
	token  poolctl.Token
	puller *puller
	// releasing is set once delivery stopped for a handover, before the
	// release is sent: from then on the member no longer counts the unit
	// as its own, even if the release must be retried.
	releasing bool
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
		opts:    opts,
		log:     opts.Logger.WithValues("member", opts.Member, "topology", opts.Topology),
		reg:     opts.Registry,
		js:      js,
		layout:  natsops.Layout{SubjectPrefix: opts.SubjectPrefix, ConsumerName: opts.ConsumerName},
		metrics: m,
		held:    map[ownership.Unit]*holding{},
		fenced:  true, // until the first lease
	}, nil
}

// Run takes part in the fleet until ctx ends, then hands every unit over
// within the drain timeout and leaves. It returns nil after a clean leave.
func (w *Worker) Run(ctx context.Context) error {
	w.runCtx, w.cancelRun = context.WithCancel(context.Background())
	defer w.cancelRun()
	defer w.stopWatchdog()

	if err := w.joinUntilDone(ctx); err != nil {
		return err
	}
	for {
		interval := min(w.renewInterval(), w.opts.TickInterval)
		if err := w.tick(ctx); err != nil && ctx.Err() == nil {
			w.log.Info("Tick incomplete", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return w.shutdown()
		case <-time.After(interval):
		}
	}
}

// joinUntilDone joins the registry, retrying until it works or ctx ends.
func (w *Worker) joinUntilDone(ctx context.Context) error {
	b := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		err := w.join(ctx)
		if err == nil {
			return nil
		}
		w.log.Info("Join failed; retrying", "error", err.Error())
		b.wait(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("join %s: %w", w.opts.Member, err)
		}
	}
}

func (w *Worker) renewInterval() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.params.RenewInterval > 0 {
		return w.params.RenewInterval
	}
	return time.Second
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
	return w.fenced || !time.Now().Before(w.fenceAt)
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
