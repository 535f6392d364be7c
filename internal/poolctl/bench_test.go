package poolctl

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
)

// The registry benchmark of design.md section 10: confirming 1000 claims
// at 10ms each way must take at most 3 round trips; per-row confirmation is
// the baseline, measured in the same run.

const (
	benchClaims  = 1000
	benchLatency = 10 * time.Millisecond // each way
)

// confirmFixture: a member holding benchClaims claims, and a one-connection
// pool that reaches PostgreSQL through a proxy adding benchLatency each way.
type confirmFixture struct {
	proxy    *faultproxy.Proxy
	slow     *PG
	dsn      string
	member   MemberRef
	expected map[string]int64
}

func newConfirmFixture(tb testing.TB) *confirmFixture {
	ctx := context.Background()
	direct, dsn := newPG(tb)
	p := Params{LeaseTTL: time.Hour, RenewInterval: time.Minute, QueryBound: time.Minute, Grace: 2 * time.Minute}
	topo := newTopology(tb, direct, p, 1, benchClaims)
	l, err := direct.Join(ctx, topo, "a")
	must(tb, err)
	f := &confirmFixture{dsn: dsn, member: l.MemberRef, expected: map[string]int64{}}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make(chan error, 4)
	)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < benchClaims; i += 4 {
				c, err := direct.Claim(ctx, l.MemberRef, 1, fmt.Sprintf("0.%d", i))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				f.expected[c.Unit] = c.Epoch
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	f.proxy = newProxy(tb, benchLatency)
	f.slow = New(newPool(tb, viaAddr(tb, dsn, f.proxy.Addr()), 1))
	return f
}

// newProxy is a proxy to the test server adding latency each way.
func newProxy(tb testing.TB, latency time.Duration) *faultproxy.Proxy {
	p := faultproxy.New(tb, pgAddr(tb))
	p.SetLatency(latency)
	return p
}

// measure runs f and returns its duration and the round trips it took.
func (f *confirmFixture) measure(fn func()) (time.Duration, int64) {
	before := f.proxy.Stats().Flights
	start := time.Now()
	fn()
	return time.Since(start), f.proxy.Stats().Flights - before
}

func (f *confirmFixture) batch(tb testing.TB) {
	c, err := f.slow.ConfirmOwned(context.Background(), f.member, f.expected)
	must(tb, err)
	if len(c.Held) != benchClaims || len(c.Moved) != 0 {
		tb.Fatalf("confirmed %d, moved %d", len(c.Held), len(c.Moved))
	}
}

func (f *confirmFixture) perRow(tb testing.TB) {
	for u, e := range f.expected {
		c, err := f.slow.ConfirmOwned(context.Background(), f.member, map[string]int64{u: e})
		must(tb, err)
		if c.Held[u].Epoch != e {
			tb.Fatalf("unit %s not confirmed: %+v", u, c)
		}
	}
}

// perRowSQL is the per-row baseline: one point query per claim, as a
// worker without the batch statement would confirm them.
const perRowSQL = `SELECT fencing_epoch = $4 FROM shardkeeper.claims WHERE topology = $1 AND unit = $2 AND owner = $3`

func (f *confirmFixture) perRowQueries(tb testing.TB) {
	ctx := context.Background()
	for u, e := range f.expected {
		var ok bool
		must(tb, f.slow.Pool().QueryRow(ctx, perRowSQL, f.member.Topology, u, f.member.Member, e).Scan(&ok))
		if !ok {
			tb.Fatalf("unit %s not at epoch %d", u, e)
		}
	}
}

func TestConfirmOwnedBatchTakesAtMostThreeRoundTrips(t *testing.T) {
	t.Parallel() // with the fault matrix; round trips are counted, not inferred from time
	f := newConfirmFixture(t)
	rtt := 2 * benchLatency

	// A connection that just opened: the statement is prepared, then run.
	must(t, f.slow.Pool().Ping(context.Background()))
	coldTime, coldTrips := f.measure(func() { f.batch(t) })
	// The same connection after more than a second idle: pgxpool pings it
	// first.
	time.Sleep(1100 * time.Millisecond)
	idleTime, idleTrips := f.measure(func() { f.batch(t) })
	// Warm: the statement is prepared on the connection.
	batchTime, batchTrips := f.measure(func() { f.batch(t) })
	perRowTime, perRowTrips := f.measure(func() { f.perRow(t) })

	for _, m := range []struct {
		name  string
		trips int64
	}{{"cold", coldTrips}, {"idle", idleTrips}, {"warm", batchTrips}} {
		if m.trips > 3 {
			t.Errorf("%s batch ConfirmOwned of %d claims took %d round trips, want at most 3", m.name, benchClaims, m.trips)
		}
	}
	if perRowTrips < benchClaims {
		t.Errorf("per-row confirmation took %d round trips for %d claims; the proxy is not counting", perRowTrips, benchClaims)
	}
	if batchTime > 3*rtt+200*time.Millisecond {
		t.Errorf("warm batch took %v at a %v round trip", batchTime, rtt)
	}
	fmt.Printf("ConfirmOwned of %d claims at %v each way (%v round trip):\n", benchClaims, benchLatency, rtt)
	fmt.Printf("  batch: warm %v (%d round trips), new connection %v (%d), idle connection %v (%d)\n",
		batchTime.Round(time.Millisecond), batchTrips, coldTime.Round(time.Millisecond), coldTrips,
		idleTime.Round(time.Millisecond), idleTrips)
	fmt.Printf("per-row: %v (%d round trips), batch: %v (%d round trips), ratio: %.0fx\n",
		perRowTime.Round(time.Millisecond), perRowTrips, batchTime.Round(time.Millisecond), batchTrips,
		float64(perRowTime)/float64(batchTime))
}

// BenchmarkConfirmOwned compares the batch statement with per-row
// confirmation (ConfirmOwned of one claim at a time, and a plain point
// query per claim) at 10ms each way.
func BenchmarkConfirmOwned(b *testing.B) {
	f := newConfirmFixture(b)
	f.batch(b) // prepare the statement
	for _, bm := range []struct {
		name string
		run  func(testing.TB)
	}{{"batch", f.batch}, {"per-row-confirm", f.perRow}, {"per-row-query", f.perRowQueries}} {
		b.Run(bm.name, func(b *testing.B) {
			var trips int64
			for i := 0; i < b.N; i++ {
				_, n := f.measure(func() { bm.run(b) })
				trips += n
			}
			b.ReportMetric(float64(trips)/float64(b.N), "round-trips/op")
		})
	}
}

// rowE is one topology of bench row e: 16 x 256 units, every unit
// claimed by one of four members that each reported activity for what it
// holds.
type rowE struct {
	pg      *PG
	topo    string
	members []MemberRef
	acts    [][]UnitActivity
}

func newRowE(b *testing.B) *rowE {
	ctx := context.Background()
	pg, _ := newPG(b)
	f := &rowE{pg: pg, topo: newTopology(b, pg, testParams, 16, 256)}
	for m := 0; m < 4; m++ {
		l, err := pg.Join(ctx, f.topo, fmt.Sprintf("m%d", m))
		must(b, err)
		var units []string
		var acts []UnitActivity
		for p := m * 4; p < (m+1)*4; p++ {
			for s := 0; s < 256; s++ {
				units = append(units, fmt.Sprintf("%d.%d", p, s))
			}
		}
		outs, err := pg.ClaimMany(ctx, l.MemberRef, 1, units)
		must(b, err)
		for _, o := range outs {
			acts = append(acts, UnitActivity{Unit: o.Unit, Epoch: o.Claim.Epoch, SinceFetch: time.Second, SinceRows: time.Second, SincePullStart: time.Minute})
		}
		must(b, pg.ReportActivity(ctx, l.MemberRef, acts))
		f.members, f.acts = append(f.members, l.MemberRef), append(f.acts, acts)
	}
	// Statistics as autovacuum leaves them on a live registry: with them
	// PostgreSQL plans a prepared statement generically after five runs.
	_, err := pg.pool.Exec(ctx, "ANALYZE shardkeeper.unit_activity, shardkeeper.claims, shardkeeper.members")
	must(b, err)
	return f
}

// BenchmarkObserve is the operator's registry read of bench row e, per
// topology and reconcile, on an idle server.
func BenchmarkObserve(b *testing.B) {
	f := newRowE(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o, err := f.pg.Observe(context.Background(), f.topo)
		must(b, err)
		if len(o.Claims) != 4096 || len(o.Activity) != 4096 {
			b.Fatalf("observed %d claims, %d activity reports; want 4096 each", len(o.Claims), len(o.Activity))
		}
	}
}

// BenchmarkReportActivity is one member of bench row e reporting its 1024
// units, as every worker does at each renewal: the registry's heaviest
// steady load in row e (sampled pg_stat_activity, 2026-12-03). It runs
// past the five executions after which PostgreSQL may plan a prepared
// statement generically, as it does for a long-lived worker.
func BenchmarkReportActivity(b *testing.B) {
	f := newRowE(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m := i % len(f.members)
		must(b, f.pg.ReportActivity(context.Background(), f.members[m], f.acts[m]))
	}
}

// BenchmarkSnapshot is one member's snapshot of bench row e's topology,
// which every worker reads once a tick.
func BenchmarkSnapshot(b *testing.B) {
	f := newRowE(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := f.pg.Snapshot(context.Background(), f.topo)
		must(b, err)
		if s.Counts.Held != 4096 {
			b.Fatalf("snapshot counts %d held units, want 4096", s.Counts.Held)
		}
	}
}

// BenchmarkSetRetiring is the operator writing the retiring set of a
// shrink from 16 x 256 units to 0 x 256: 4096 units retiring, then one
// fewer (one drained), alternately: every write deletes or adds a unit
// beside 4095 it keeps.
func BenchmarkSetRetiring(b *testing.B) {
	ctx := context.Background()
	pg, _ := newPG(b)
	topo := newTopology(b, pg, testParams, 16, 256)
	var all []string
	for p := 0; p < 16; p++ {
		for s := 0; s < 256; s++ {
			all = append(all, fmt.Sprintf("%d.%d", p, s))
		}
	}
	must(b, pg.SetRetiring(ctx, topo, all))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		units := all
		if i%2 == 0 {
			units = all[1:]
		}
		must(b, pg.SetRetiring(ctx, topo, units))
	}
}
