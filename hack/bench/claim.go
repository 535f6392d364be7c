package main

import (
	"context"
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
)

// Row a: one worker claiming 4096 units with PostgreSQL 10ms away each way,
// in one ClaimMany against one Claim per unit. The per-unit baseline takes
// minutes, so it is measured a quarter at a time, alternating with whole
// batched rounds, and its quarters are added up.

const (
	pgLatency   = 10 * time.Millisecond // each way
	claimShape  = 1024                  // shards per partition; 4 partitions
	claimUnits  = 4 * claimShape
	claimRounds = 4
)

// claimFixture is a member of a 4 x 1024 topology, a direct registry for
// setup and a one-connection registry through the latency proxy.
type claimFixture struct {
	direct, slow *poolctl.PG
	proxy        *faultproxy.Proxy
	member       poolctl.MemberRef
	units        []string
}

func runClaim(ctx context.Context, e *env) ([]result, error) {
	f, err := newClaimFixture(ctx, e)
	if err != nil {
		return nil, err
	}
	defer f.close()
	prof, err := e.startProfile("a-claim")
	if err != nil {
		return nil, err
	}
	var batch []time.Duration
	var batchTrips []int64
	var each time.Duration
	var eachTrips int64
	part := claimUnits / claimRounds
	for i := range claimRounds {
		d, trips, err := f.measure(func() error { return f.claimMany(ctx, f.units) })
		if err != nil {
			prof.stop()
			return nil, err
		}
		batch, batchTrips = append(batch, d), append(batchTrips, trips)
		e.debug("a: ClaimMany of %d units %s (%d round trips)", claimUnits, d, trips)
		d, trips, err = f.measure(func() error { return f.claimEach(ctx, f.units[i*part:(i+1)*part]) })
		if err != nil {
			prof.stop()
			return nil, err
		}
		each, eachTrips = each+d, eachTrips+trips
		e.say("a: round %d of %d: ClaimMany %s, %d units one at a time %s", i+1, claimRounds, ms(batch[i]), part, ms(d))
	}
	prof.stop()
	return []result{f.result(batch, batchTrips, each, eachTrips, prof)}, nil
}

func (f *claimFixture) result(batch []time.Duration, batchTrips []int64, each time.Duration, eachTrips int64, prof *profile) result {
	b := median(batch)
	ratio := float64(each) / float64(b)
	r := result{
		row: "a", what: "one worker claims 4096 units, PostgreSQL 10ms each way (faultproxy)",
		measured: fmt.Sprintf("ClaimMany %s (%d round trips)", ms(b), batchTrips[len(batchTrips)/2]),
		baseline: fmt.Sprintf("Claim per unit %s (%d round trips)", ms(each), eachTrips),
		ratio:    fmt.Sprintf("%.0fx", ratio), goal: ">= 100x", verdict: judge(ratio >= 100),
		notes: []string{
			fmt.Sprintf("ClaimMany of all %d units, %d rounds: %s (the table shows their median); round trips counted by the proxy: %v",
				claimUnits, claimRounds, durations(batch), batchTrips),
			fmt.Sprintf("per unit: %d units one Claim at a time in each round, alternating with the batches; the %d rounds add up to all %d units",
				claimUnits/claimRounds, claimRounds, claimUnits),
		},
	}
	if r.verdict == missed {
		r.why = []string{fmt.Sprintf("a batch took %d round trips of %s; 100x needs 100 per-unit round trips per batch round trip; this process's CPU while it ran:",
			batchTrips[len(batchTrips)/2], 2*pgLatency)}
		r.profile = prof.top(15)
	}
	return r
}

func newClaimFixture(ctx context.Context, e *env) (*claimFixture, error) {
	dsn, err := e.database(ctx, "bench_claim")
	if err != nil {
		return nil, err
	}
	direct, err := poolctl.Open(ctx, poolctl.Config{DSN: dsn, MaxConns: 4})
	if err != nil {
		return nil, fmt.Errorf("open registry: %w", err)
	}
	f := &claimFixture{direct: direct}
	// A lease far longer than the run: the member never needs renewing.
	p := poolctl.Params{LeaseTTL: time.Hour, RenewInterval: time.Minute, QueryBound: time.Minute, Grace: 2 * time.Minute}
	if err := activateShape(ctx, direct, "bench/claim", p, 4, claimShape); err != nil {
		f.close()
		return nil, err
	}
	l, err := direct.Join(ctx, "bench/claim", "worker-0")
	if err != nil {
		f.close()
		return nil, fmt.Errorf("join: %w", err)
	}
	f.member = l.MemberRef
	for i := range claimUnits {
		f.units = append(f.units, fmt.Sprintf("%d.%d", i/claimShape, i%claimShape))
	}
	proxy, slowDSN, err := e.latencyProxy(dsn, pgLatency)
	if err != nil {
		f.close()
		return nil, err
	}
	f.proxy = proxy
	if f.slow, err = poolctl.Open(ctx, poolctl.Config{DSN: slowDSN, MaxConns: 1, SkipMigrate: true}); err != nil {
		f.close()
		return nil, fmt.Errorf("open registry through the proxy: %w", err)
	}
	// Prepare the statements on the one connection, as a running worker has.
	if err := f.claimMany(ctx, f.units[:1]); err != nil {
		f.close()
		return nil, err
	}
	return f, f.releaseAll(ctx)
}

// activateShape creates topology with partitions x shards as its active
// epoch.
func activateShape(ctx context.Context, r poolctl.Registry, topology string, p poolctl.Params, partitions, shards int) error {
	if err := r.EnsureTopology(ctx, topology, p); err != nil {
		return fmt.Errorf("create topology %s: %w", topology, err)
	}
	epoch, err := r.CreatePending(ctx, topology, partitions, shards)
	if err != nil {
		return fmt.Errorf("create epoch of %s: %w", topology, err)
	}
	if err := r.Activate(ctx, topology, epoch); err != nil {
		return fmt.Errorf("activate epoch %d of %s: %w", epoch, topology, err)
	}
	return nil
}

func (f *claimFixture) close() {
	if f.slow != nil {
		f.slow.Close()
	}
	f.direct.Close()
}

// measure runs fn and returns how long it took and the round trips the
// proxy counted.
func (f *claimFixture) measure(fn func() error) (time.Duration, int64, error) {
	before := f.proxy.Stats().Flights
	start := time.Now()
	err := fn()
	return time.Since(start), f.proxy.Stats().Flights - before, err
}

func (f *claimFixture) claimMany(ctx context.Context, units []string) error {
	outs, err := f.slow.ClaimMany(ctx, f.member, 1, units)
	if err != nil {
		return fmt.Errorf("ClaimMany of %d units: %w", len(units), err)
	}
	for _, o := range outs {
		if o.Err != nil {
			return fmt.Errorf("ClaimMany refused %s: %w", o.Unit, o.Err)
		}
	}
	return nil
}

func (f *claimFixture) claimEach(ctx context.Context, units []string) error {
	for _, u := range units {
		if _, err := f.slow.Claim(ctx, f.member, 1, u); err != nil {
			return fmt.Errorf("claim %s: %w", u, err)
		}
	}
	return nil
}

// releaseAll frees every held unit again, directly (not through the proxy).
func (f *claimFixture) releaseAll(ctx context.Context) error {
	return releaseHeld(ctx, f.direct, f.member.Topology)
}

// releaseHeld releases every held claim of topology in one call.
func releaseHeld(ctx context.Context, r poolctl.Registry, topology string) error {
	cl, err := r.Claims(ctx, topology)
	if err != nil {
		return fmt.Errorf("read claims: %w", err)
	}
	var toks []poolctl.Token
	for _, c := range cl {
		if c.State != poolctl.StateFree {
			toks = append(toks, poolctl.Token{Topology: topology, Unit: c.Unit, Member: c.Owner, Epoch: c.Epoch})
		}
	}
	if len(toks) == 0 {
		return nil
	}
	errs, err := r.ReleaseMany(ctx, toks)
	if err != nil {
		return fmt.Errorf("release %d claims: %w", len(toks), err)
	}
	for i, e := range errs {
		if e != nil {
			return fmt.Errorf("release %s: %w", toks[i].Unit, e)
		}
	}
	return nil
}
