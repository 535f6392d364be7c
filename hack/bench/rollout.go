package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// Row b: rollout convergence. 16 real SDK workers (pkg/worker, in this
// process) over 4096 units (16 partitions x 256 shards, R1 consumers on one
// nats-server) and PostgreSQL 10ms away each way. Each round starts the
// workers on a fresh topology key, writes the first epoch pending, waits
// for every worker's freeze acknowledgement, then times Activate to every
// unit claimed, and a drain request (Registry.SetDraining) of one worker
// to its holding nothing and to every unit claimed again. Rounds alternate
// between the SDK's default (all of a tick's claims in one call) and
// Options.ClaimBatch = 1 (one unit per registry call).

const (
	rolloutWorkers    = 16
	rolloutPartitions = 16
	rolloutShards     = 256
	rolloutUnits      = rolloutPartitions * rolloutShards
	rolloutRounds     = 3
	rolloutTick       = 500 * time.Millisecond // the SDK's default TickInterval
)

// rolloutFixture is what every round shares: NATS with the consumers, the
// registry directly and through the proxy.
type rolloutFixture struct {
	e       *env
	natsURL string
	direct  *poolctl.PG
	proxy   *faultproxy.Proxy
	slowDSN string
	layout  natsops.Layout
}

// rolloutRound is what one round measured.
type rolloutRound struct {
	batch      int // ClaimBatch
	activate   time.Duration
	drainEmpty time.Duration
	drainOwned time.Duration
	// trips is the round trips the proxy counted from Activate to every
	// unit owned, over all workers (ticks, renewals and claims).
	trips int64
	// spread is when the claims landed.
	spread claimSpread
}

func runRollout(ctx context.Context, e *env) ([]result, error) {
	f, err := newRolloutFixture(ctx, e)
	if err != nil {
		return nil, err
	}
	defer f.direct.Close()
	prof, err := e.startProfile("b-rollout")
	if err != nil {
		return nil, err
	}
	var rounds []rolloutRound
	for i := range 2 * rolloutRounds {
		batch := 0
		if i%2 == 1 {
			batch = 1
		}
		r, err := f.round(ctx, fmt.Sprintf("bench/rollout-%d", i), batch)
		if err != nil {
			prof.stop()
			return nil, err
		}
		e.say("b: round %d (ClaimBatch %d): Activate->owned %s, drain->empty %s, drain->owned %s",
			i+1, batch, ms(r.activate), ms(r.drainEmpty), ms(r.drainOwned))
		rounds = append(rounds, r)
	}
	prof.stop()
	return rolloutResults(rounds, prof), nil
}

func newRolloutFixture(ctx context.Context, e *env) (*rolloutFixture, error) {
	srv, err := e.natsServer("rollout")
	if err != nil {
		return nil, err
	}
	f := &rolloutFixture{e: e, natsURL: appURL(srv), layout: natsops.Layout{SubjectPrefix: "rollout", ConsumerName: "ingest",
		Partitions: rolloutPartitions, Shards: rolloutShards, Replicas: 1, PinnedTTL: 2 * time.Minute, AckWait: 30 * time.Second}}
	nc, err := nats.Connect(f.natsURL)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	start := time.Now()
	_, err = natsops.Provision(ctx, nc, f.layout)
	nc.Close()
	if err != nil {
		return nil, fmt.Errorf("provision %d consumers: %w", rolloutUnits, err)
	}
	e.say("b: provisioned %d R1 consumers in %s", rolloutUnits, ms(time.Since(start)))
	dsn, err := e.database(ctx, "bench_rollout")
	if err != nil {
		return nil, err
	}
	if f.direct, err = poolctl.Open(ctx, poolctl.Config{DSN: dsn, MaxConns: 4}); err != nil {
		return nil, fmt.Errorf("open registry: %w", err)
	}
	if f.proxy, f.slowDSN, err = e.latencyProxy(dsn, pgLatency); err != nil {
		f.direct.Close()
		return nil, err
	}
	return f, nil
}

// round runs one measurement on a fresh topology key with ClaimBatch
// batch, and stops its workers.
func (f *rolloutFixture) round(ctx context.Context, topo string, batch int) (rolloutRound, error) {
	r := rolloutRound{batch: batch}
	if err := f.direct.EnsureTopology(ctx, topo, poolctl.DefaultParams()); err != nil {
		return r, fmt.Errorf("create topology: %w", err)
	}
	fleet, err := f.startFleet(ctx, topo, batch)
	if err != nil {
		return r, err
	}
	defer fleet.stop()
	if err := f.freeze(ctx, topo); err != nil {
		return r, err
	}
	epoch := int64(1)
	tripsBefore := f.proxy.Stats().Flights
	start := time.Now()
	if err := f.direct.Activate(ctx, topo, epoch); err != nil {
		return r, fmt.Errorf("activate: %w", err)
	}
	if err := waitFor(ctx, 5*time.Minute, func() (bool, error) { return allClaimed(ctx, f.direct, topo, "") }); err != nil {
		return r, fmt.Errorf("wait for every unit to be claimed: %w", err)
	}
	r.activate = time.Since(start)
	r.trips = f.proxy.Stats().Flights - tripsBefore
	if r.spread, err = spreadOf(ctx, f.direct, topo); err != nil {
		return r, err
	}
	return r, f.drain(ctx, topo, &r)
}

// freeze writes the first epoch pending and waits until every worker
// acknowledged it, so Activate is accepted at once.
func (f *rolloutFixture) freeze(ctx context.Context, topo string) error {
	err := waitFor(ctx, time.Minute, func() (bool, error) {
		s, err := f.direct.Snapshot(ctx, topo)
		return len(s.LiveMembers()) == rolloutWorkers, err
	})
	if err != nil {
		return fmt.Errorf("wait for %d workers to join: %w", rolloutWorkers, err)
	}
	if _, err := f.direct.CreatePending(ctx, topo, rolloutPartitions, rolloutShards); err != nil {
		return fmt.Errorf("create the first epoch: %w", err)
	}
	err = waitFor(ctx, time.Minute, func() (bool, error) {
		s, err := f.direct.Snapshot(ctx, topo)
		return err == nil && s.Pending != nil && len(s.Pending.Acked) == rolloutWorkers, err
	})
	if err != nil {
		return fmt.Errorf("wait for every worker's freeze acknowledgement: %w", err)
	}
	return nil
}

// drain asks the last worker to hand everything over and times it.
func (f *rolloutFixture) drain(ctx context.Context, topo string, r *rolloutRound) error {
	member := fmt.Sprintf("worker-%d", rolloutWorkers-1)
	start := time.Now()
	if err := f.direct.SetDraining(ctx, topo, member, true); err != nil {
		return fmt.Errorf("drain %s: %w", member, err)
	}
	err := waitFor(ctx, 5*time.Minute, func() (bool, error) {
		s, err := f.direct.Snapshot(ctx, topo)
		if err != nil {
			return false, err
		}
		m := s.Member(member)
		return m != nil && m.Holds == 0, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s to hold nothing: %w", member, err)
	}
	r.drainEmpty = time.Since(start)
	if err := waitFor(ctx, 5*time.Minute, func() (bool, error) { return allClaimed(ctx, f.direct, topo, member) }); err != nil {
		return fmt.Errorf("wait for %s's units to be claimed again: %w", member, err)
	}
	r.drainOwned = time.Since(start)
	return nil
}

// allClaimed reports whether every unit is held, and except (if any)
// holds none of them. It reads the snapshot's counts, one row: reading
// every claim row every 10ms would cost this process more CPU than the
// workers it measures.
func allClaimed(ctx context.Context, r poolctl.Registry, topo, except string) (bool, error) {
	s, err := r.Snapshot(ctx, topo)
	if err != nil {
		return false, err
	}
	if m := s.Member(except); except != "" && (m == nil || m.Holds > 0) {
		return false, nil
	}
	return s.Counts.Held == rolloutUnits, nil
}

// waitFor polls cond every 10ms until it holds, fails, or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("not within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// fleet is the round's running workers.
type fleet struct {
	cancels []context.CancelFunc
	done    []chan error
	closers []func()
}

// startFleet starts rolloutWorkers SDK workers, each with its own registry
// pool through the proxy and its own NATS connection.
func (f *rolloutFixture) startFleet(ctx context.Context, topo string, batch int) (*fleet, error) {
	fl := &fleet{}
	for i := range rolloutWorkers {
		if err := fl.start(ctx, f, topo, fmt.Sprintf("worker-%d", i), batch); err != nil {
			fl.stop()
			return nil, err
		}
	}
	return fl, nil
}

func (fl *fleet) start(ctx context.Context, f *rolloutFixture, topo, member string, batch int) error {
	reg, err := worker.OpenRegistry(ctx, worker.RegistryConfig{DSN: f.slowDSN, MaxConns: 4})
	if err != nil {
		return fmt.Errorf("registry for %s: %w", member, err)
	}
	fl.closers = append(fl.closers, reg.Close)
	nc, err := nats.Connect(f.natsURL, nats.Name(member))
	if err != nil {
		return fmt.Errorf("connect %s to NATS: %w", member, err)
	}
	fl.closers = append(fl.closers, nc.Close)
	w, err := worker.New(worker.Options{Topology: topo, Member: member, Registry: reg,
		NATS: nc, SubjectPrefix: f.layout.SubjectPrefix, ConsumerName: f.layout.ConsumerName, ClaimBatch: batch,
		Handler: func(context.Context, worker.Row) worker.Settlement { return worker.Ack }})
	if err != nil {
		return fmt.Errorf("worker %s: %w", member, err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	fl.cancels, fl.done = append(fl.cancels, cancel), append(fl.done, done)
	return nil
}

// stop shuts every worker down (each hands its units over and leaves) and
// closes their connections.
func (fl *fleet) stop() {
	for _, c := range fl.cancels {
		c()
	}
	for _, d := range fl.done {
		<-d
	}
	for _, c := range fl.closers {
		c()
	}
}

// claimSpread is when the claims of a convergence landed, on the
// registry's clock, from its claim history: for each worker, its first
// and last claim after the activation.
type claimSpread struct {
	firstMedian, spanMedian, last time.Duration
}

// spreadOf reads topo's claim history against its activation.
func spreadOf(ctx context.Context, r *poolctl.PG, topo string) (claimSpread, error) {
	epochs, err := r.EpochHistory(ctx, topo)
	if err != nil || len(epochs) == 0 || epochs[0].ActivatedAt.IsZero() {
		return claimSpread{}, fmt.Errorf("epoch history of %s: %v", topo, err)
	}
	activated := epochs[0].ActivatedAt
	events, err := r.ClaimHistory(ctx, topo)
	if err != nil {
		return claimSpread{}, fmt.Errorf("claim history of %s: %w", topo, err)
	}
	first, last := map[string]time.Time{}, map[string]time.Time{}
	var sp claimSpread
	for _, ev := range events {
		if ev.Op != "claim" || ev.At.Before(activated) {
			continue
		}
		if f, ok := first[ev.Owner]; !ok || ev.At.Before(f) {
			first[ev.Owner] = ev.At
		}
		if ev.At.After(last[ev.Owner]) {
			last[ev.Owner] = ev.At
		}
		sp.last = max(sp.last, ev.At.Sub(activated))
	}
	var firsts, spans []time.Duration
	for m, f := range first {
		firsts, spans = append(firsts, f.Sub(activated)), append(spans, last[m].Sub(f))
	}
	sp.firstMedian, sp.spanMedian = median(firsts), median(spans)
	return sp, nil
}

func rolloutResults(rounds []rolloutRound, prof *profile) []result {
	var batched, perUnit []rolloutRound
	for _, r := range rounds {
		if r.batch == 0 {
			batched = append(batched, r)
		} else {
			perUnit = append(perUnit, r)
		}
	}
	goal := 2*rolloutTick + 10*2*pgLatency
	act := func(r rolloutRound) time.Duration { return r.activate }
	empty := func(r rolloutRound) time.Duration { return r.drainEmpty }
	owned := func(r rolloutRound) time.Duration { return r.drainOwned }
	a := result{row: "b", what: "Activate -> all 4096 units claimed, 16 SDK workers, PostgreSQL 10ms each way",
		goal: fmt.Sprintf("<= %s (2 ticks + 10 round trips)", ms(goal))}
	fillRatio(&a, batched, perUnit, act)
	a.verdict = judge(medianOf(batched, act) <= goal)
	a.notes = rolloutNotes(rounds)
	if a.verdict == missed {
		a.why = rolloutWhy(batched, goal)
		a.profile = prof.top(20)
	}
	d := result{row: "b", what: "drain request -> the pod holds nothing", goal: "reported", verdict: noGoal}
	fillRatio(&d, batched, perUnit, empty)
	o := result{row: "b", what: "drain request -> its units claimed again", goal: "reported", verdict: noGoal}
	fillRatio(&o, batched, perUnit, owned)
	return []result{a, d, o}
}

func fillRatio(r *result, batched, perUnit []rolloutRound, f func(rolloutRound) time.Duration) {
	b, p := medianOf(batched, f), medianOf(perUnit, f)
	r.measured = "batched " + ms(b)
	r.baseline = "one unit per call " + ms(p)
	r.ratio = fmt.Sprintf("%.1fx faster", float64(p)/float64(b))
}

func medianOf(rs []rolloutRound, f func(rolloutRound) time.Duration) time.Duration {
	ds := make([]time.Duration, len(rs))
	for i, r := range rs {
		ds[i] = f(r)
	}
	return median(ds)
}

func rolloutNotes(rounds []rolloutRound) []string {
	notes := []string{fmt.Sprintf("%d workers, %d x %d units (R1 consumers, one nats-server), SDK defaults (tick %s), rounds alternate; medians of %d each",
		rolloutWorkers, rolloutPartitions, rolloutShards, rolloutTick, rolloutRounds)}
	for i, r := range rounds {
		notes = append(notes, fmt.Sprintf("round %d, ClaimBatch %d: Activate->owned %s (%d round trips by all workers meanwhile; a worker's first claim %s after activation, its last %s later (medians), the last of all at %s, registry clock); drain->empty %s, drain->owned %s",
			i+1, r.batch, ms(r.activate), r.trips, ms(r.spread.firstMedian), ms(r.spread.spanMedian), ms(r.spread.last),
			ms(r.drainEmpty), ms(r.drainOwned)))
	}
	return notes
}

// rolloutWhy breaks the median batched round down: the wait for a tick
// and the claims.
func rolloutWhy(batched []rolloutRound, goal time.Duration) []string {
	if len(batched) == 0 {
		return []string{"no batched round"}
	}
	r := batched[len(batched)/2]
	return []string{
		fmt.Sprintf("Activate->owned took %s against %s", ms(r.activate), ms(goal)),
		fmt.Sprintf("a worker's first claim landed %s after the activation (its next tick), its last %s after its first; the last claim of all at %s (registry clock)",
			ms(r.spread.firstMedian), ms(r.spread.spanMedian), ms(r.spread.last)),
		"this process's CPU over the row (16 workers, their pullers and the bench):",
	}
}
