package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/registryhook"
)

// This file runs pkg/worker itself in the test process, against the
// fleet's real PostgreSQL and NATS, for the defects that need a fault
// placed exactly: a registry call delayed, a reply lost, a renewal held.
// The faults wrap the real registry; nothing of the SDK is re-implemented.

// faultyRegistry is the real registry with faults a test arms.
type faultyRegistry struct {
	poolctl.Registry

	mu sync.Mutex
	// renewGate, when set, holds every Renew until it is closed (or the
	// call's context ends), like a registry that stopped answering.
	renewGate chan struct{}
	// lateFence, when set, makes the next Fence report a timeout at once
	// and reach the registry only that much later: a request that arrived
	// after the caller gave up on it.
	lateFence time.Duration
	// loseClaimReply makes the next ClaimMany that adopts a unit commit
	// and lose its reply.
	loseClaimReply bool
	// afterLostClaim, when set, makes the next ClaimMany that grants a
	// unit commit, run it (a change that lands before the reply would
	// have), and lose its reply; lostClaims counts such replies.
	afterLostClaim func()
	lostClaims     int
	// ackGate, when set, makes the next AckFreeze commit and hold its
	// (successful) reply until the gate closes, whatever the caller's
	// deadline: a reply that arrives late. heldAcks counts such replies.
	ackGate  chan struct{}
	heldAcks int
	// late counts late requests still in flight.
	late sync.WaitGroup
	// heldRenewals are when each Renew the gate held was made.
	heldRenewals []time.Time

	// confirmGate, when set, makes the next ConfirmOwned that succeeds
	// read its answer and hold it until the gate closes, whatever the
	// caller's deadline: an answer read now that arrives late.
	// heldConfirms are the answers it held.
	confirmGate  chan struct{}
	heldConfirms []confirmAnswer
	// confirms is every answer ConfirmOwned gave, held or not.
	confirms []confirmAnswer
	// releaseGate, when set, holds every ReleaseMany before it reaches
	// the registry until the gate closes; the request then runs with a
	// deadline of its own (it arrives late, and commits). heldReleases
	// are the tokens of each release it held.
	releaseGate  chan struct{}
	heldReleases [][]poolctl.Token
	// snapshotGate, when set, holds every Snapshot until it closes or the
	// call's deadline passes (the read then fails): the member's ticks
	// place, claim and hand over nothing meanwhile.
	snapshotGate chan struct{}
	// lane logs the member's lease calls (join, renew, fence, unfence,
	// confirm, leave) in the order they were made. The member's core has
	// one in flight at a time and sends the next only after it handled
	// the previous one's reply, so a call logged after a held reply was
	// let through shows that the core handled that reply.
	lane []string
}

// confirmAnswer is one answer of ConfirmOwned and what it was asked.
type confirmAnswer struct {
	// lane is the call's index in faultyRegistry.lane.
	lane     int
	expected map[string]int64
	conf     poolctl.Confirmation
}

// logLane records a lease call and returns its index in r.lane.
func (r *faultyRegistry) logLane(call string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lane = append(r.lane, call)
	return len(r.lane) - 1
}

// laneLog returns a copy of the lease calls made so far.
func (r *faultyRegistry) laneLog() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lane...)
}

// MarkDrained passes to the inner registry (PostgreSQL keeps the marks).
func (r *faultyRegistry) MarkDrained(ctx context.Context, t poolctl.Token, epoch int64, seq uint64) error {
	return r.Registry.(poolctl.OrderMarks).MarkDrained(ctx, t, epoch, seq)
}

func (r *faultyRegistry) Rejoin(ctx context.Context, m poolctl.MemberRef, process string) (poolctl.Lease, error) {
	r.logLane("join")
	return r.Registry.Rejoin(ctx, m, process)
}

func (r *faultyRegistry) Unfence(ctx context.Context, m poolctl.MemberRef, gen int64) error {
	r.logLane("unfence")
	return r.Registry.Unfence(ctx, m, gen)
}

func (r *faultyRegistry) Leave(ctx context.Context, m poolctl.MemberRef) error {
	r.logLane("leave")
	return r.Registry.Leave(ctx, m)
}

func (r *faultyRegistry) ConfirmOwned(ctx context.Context, m poolctl.MemberRef, expected map[string]int64) (poolctl.Confirmation, error) {
	idx := r.logLane("confirm")
	c, err := r.Registry.ConfirmOwned(ctx, m, expected)
	if err != nil {
		return c, err
	}
	ans := confirmAnswer{lane: idx, expected: map[string]int64{}, conf: c}
	for u, e := range expected {
		ans.expected[u] = e
	}
	r.mu.Lock()
	r.confirms = append(r.confirms, ans)
	gate := r.confirmGate
	if gate != nil {
		r.confirmGate = nil
		r.heldConfirms = append(r.heldConfirms, ans)
	}
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return c, nil
}

// confirmAt returns the answer of the ConfirmOwned logged at lane index
// i, if it succeeded.
func (r *faultyRegistry) confirmAt(i int) (confirmAnswer, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.confirms {
		if a.lane == i {
			return a, true
		}
	}
	return confirmAnswer{}, false
}

func (r *faultyRegistry) ReleaseMany(ctx context.Context, tokens []poolctl.Token) ([]error, error) {
	r.mu.Lock()
	gate := r.releaseGate
	if gate != nil {
		r.heldReleases = append(r.heldReleases, append([]poolctl.Token(nil), tokens...))
	}
	r.mu.Unlock()
	if gate == nil {
		return r.Registry.ReleaseMany(ctx, tokens)
	}
	<-gate
	late, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return r.Registry.ReleaseMany(late, tokens)
}

func (r *faultyRegistry) Snapshot(ctx context.Context, topology string) (poolctl.Snapshot, error) {
	r.mu.Lock()
	gate := r.snapshotGate
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return poolctl.Snapshot{}, fmt.Errorf("snapshot held by the test: %w", ctx.Err())
		}
	}
	return r.Registry.Snapshot(ctx, topology)
}

// holdSnapshots holds every Snapshot from now until the returned func
// is called (or the test ends).
func (r *faultyRegistry) holdSnapshots(t *testing.T) func() {
	g, open := gate(t)
	r.mu.Lock()
	r.snapshotGate = g
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		r.snapshotGate = nil
		r.mu.Unlock()
		open()
	}
}

// gate returns a channel and a func that closes it once. The func is
// also a cleanup of t, so a test that fails while a call is held lets
// the worker stop: call gate after starting the worker, so this cleanup
// runs before the worker's.
func gate(t *testing.T) (chan struct{}, func()) {
	c := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(c) }) }
	t.Cleanup(open)
	return c, open
}

func (r *faultyRegistry) Renew(ctx context.Context, m poolctl.MemberRef) (poolctl.Lease, error) {
	r.logLane("renew")
	r.mu.Lock()
	gate := r.renewGate
	if gate != nil {
		r.heldRenewals = append(r.heldRenewals, time.Now())
	}
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return poolctl.Lease{}, fmt.Errorf("renew held by the test: %w", ctx.Err())
		}
	}
	return r.Registry.Renew(ctx, m)
}

func (r *faultyRegistry) Fence(ctx context.Context, m poolctl.MemberRef, gen int64) error {
	r.logLane("fence")
	r.mu.Lock()
	late := r.lateFence
	r.lateFence = 0
	r.mu.Unlock()
	if late == 0 {
		return r.Registry.Fence(ctx, m, gen)
	}
	r.late.Add(1)
	go func() {
		defer r.late.Done()
		time.Sleep(late) // the request's time in a slow network
		_ = r.Registry.Fence(context.Background(), m, gen)
	}()
	return fmt.Errorf("fence: %w", context.DeadlineExceeded)
}

func (r *faultyRegistry) ClaimMany(ctx context.Context, m poolctl.MemberRef, under int64, units []string) ([]poolctl.ClaimOutcome, error) {
	outs, err := r.Registry.ClaimMany(ctx, m, under, units)
	if err == nil && grants(outs) {
		r.mu.Lock()
		after := r.afterLostClaim
		r.afterLostClaim = nil
		if after != nil {
			r.lostClaims++
		}
		r.mu.Unlock()
		if after != nil {
			after()
			return nil, errors.New("claim reply lost (test)")
		}
	}
	if err == nil && adopts(outs) {
		r.mu.Lock()
		lose := r.loseClaimReply
		r.loseClaimReply = false
		r.mu.Unlock()
		if lose {
			return nil, errors.New("claim reply lost (test)")
		}
	}
	return outs, err
}

func (r *faultyRegistry) AckFreeze(ctx context.Context, m poolctl.MemberRef, epoch int64) error {
	err := r.Registry.AckFreeze(ctx, m, epoch)
	r.mu.Lock()
	gate := r.ackGate
	if err == nil && gate != nil {
		r.ackGate = nil
		r.heldAcks++
	}
	r.mu.Unlock()
	if err == nil && gate != nil {
		<-gate
	}
	return err
}

func grants(outs []poolctl.ClaimOutcome) bool {
	for _, o := range outs {
		if o.Err == nil {
			return true
		}
	}
	return false
}

func adopts(outs []poolctl.ClaimOutcome) bool {
	for _, o := range outs {
		if o.Err == nil && o.Claim.Adopted {
			return true
		}
	}
	return false
}

func (r *faultyRegistry) holdRenewals() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.renewGate = make(chan struct{})
	return r.renewGate
}

func (r *faultyRegistry) releaseRenewals() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.renewGate != nil {
		close(r.renewGate)
		r.renewGate = nil
	}
}

// sdkWorker is pkg/worker running in the test process.
type sdkWorker struct {
	w        *worker.Worker
	reg      *faultyRegistry
	hist     *history.Memory
	metrics  *prometheus.Registry
	cancel   context.CancelFunc
	done     chan error
	topology string
}

// startSDK runs a worker named member on the fleet, with handler (nil:
// ack every row) and the options tweak changes.
func startSDK(t *testing.T, f *fleettest.Fleet, member string, handler worker.Handler, tweak func(*worker.Options)) *sdkWorker {
	t.Helper()
	return startArmedSDK(t, f, member, handler, nil, tweak)
}

// startArmedSDK is startSDK with faults armed (arm) before the worker
// starts.
func startArmedSDK(t *testing.T, f *fleettest.Fleet, member string, handler worker.Handler, arm func(*faultyRegistry), tweak func(*worker.Options)) *sdkWorker {
	t.Helper()
	ctx := context.Background()
	// ClientDSN, as a worker process gets: a test may give workers
	// another route or role than its own.
	pg, err := poolctl.Open(ctx, poolctl.Config{DSN: f.ClientDSN, MaxConns: 8, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	if handler == nil {
		handler = func(context.Context, worker.Row) worker.Settlement { return worker.Ack }
	}
	s := &sdkWorker{reg: &faultyRegistry{Registry: pg}, hist: &history.Memory{}, metrics: prometheus.NewRegistry(),
		done: make(chan error, 1), topology: f.Topology}
	o := worker.Options{Topology: f.Topology, Member: member, Registry: registryhook.Wrap(s.reg).(*worker.Registry),
		NATS: f.NATS.Connect(-1), Handler: handler,
		DrainTimeout: f.Opts.DrainTimeout, History: s.hist, Metrics: s.metrics, Logger: testr.New(t)}
	if arm != nil {
		arm(s.reg)
	}
	if tweak != nil {
		tweak(&o)
	}
	s.w, err = worker.New(o)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	go func() { s.done <- s.w.Run(runCtx) }()
	t.Cleanup(func() {
		s.stop(30 * time.Second)
		s.reg.late.Wait()
	})
	return s
}

// stop ends Run (a graceful shutdown) and returns its error.
func (s *sdkWorker) stop(timeout time.Duration) error {
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err // later callers see it too
		return err
	case <-time.After(timeout):
		return fmt.Errorf("worker did not stop within %s", timeout)
	}
}

// counter reads one of the worker's counters (summed over labels).
func (s *sdkWorker) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := s.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// histogramCount reads how many observations one of the worker's
// histograms has.
func (s *sdkWorker) histogramCount(t *testing.T, name string) uint64 {
	t.Helper()
	mfs, err := s.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var n uint64
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
		}
		return n
	}
	return 0
}

// token is the worker's current claim on unit.
func (s *sdkWorker) token(t *testing.T, unit string) poolctl.Token {
	t.Helper()
	st := s.w.Status()
	epoch, ok := st.Held[unit]
	if !ok {
		t.Fatalf("%s does not hold %s", st.Member, unit)
	}
	return poolctl.Token{Topology: s.topology, Unit: unit, Member: st.Member, Epoch: epoch}
}

// records returns the worker's history records of kind k for unit ("" for
// every unit).
func (s *sdkWorker) records(k history.Kind, unit string) []history.Record {
	var out []history.Record
	for _, r := range s.hist.Records() {
		if r.Kind == k && (unit == "" || r.Unit == unit) {
			out = append(out, r)
		}
	}
	return out
}

// waitHolding waits until the worker holds exactly units (by name).
func waitHolding(t *testing.T, s *sdkWorker, timeout time.Duration, units ...string) {
	t.Helper()
	fleettest.Eventually(t, timeout, func() error {
		st := s.w.Status()
		if st.Fenced {
			return errors.New("fenced")
		}
		for _, u := range units {
			if _, ok := st.Held[u]; !ok {
				return fmt.Errorf("does not hold %s yet: %v", u, st.Held)
			}
		}
		if len(st.Held) != len(units) {
			return fmt.Errorf("holds %v, want %v", st.Held, units)
		}
		return nil
	})
}
