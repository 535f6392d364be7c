package poolctl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
)

// The one PostgreSQL server of this test binary starts on the first test
// that needs it, so tests of the twin alone run on a machine without
// PostgreSQL (go test -run Twin). A test that needs it and cannot have it
// fails with the reason; none skips.
var (
	pgOnce   sync.Once
	pgSrv    *pgtest.Server
	pgSrvErr error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if pgSrv != nil {
		pgSrv.Stop()
	}
	os.Exit(code)
}

// pgServer returns the shared server, starting it on first use, and fails
// the test if it cannot be started (binaries missing included).
func pgServer(t testing.TB) *pgtest.Server {
	t.Helper()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pgSrv, pgSrvErr = pgtest.Start(ctx)
	})
	if pgSrvErr != nil {
		t.Fatalf("this test needs PostgreSQL, which did not start: %v", pgSrvErr)
	}
	return pgSrv
}

// pgAddr is the shared server's address, for proxies.
func pgAddr(t testing.TB) string {
	return fmt.Sprintf("127.0.0.1:%d", pgServer(t).Port)
}

// newDatabase creates a fresh database (with the test clock on) and
// returns its DSN.
func newDatabase(t testing.TB) string {
	t.Helper()
	return pgServer(t).NewTestDatabase(t)
}

// newPool opens a pool on dsn, closed when the test ends.
func newPool(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newPG returns a registry on a fresh, migrated database, and its DSN.
func newPG(t testing.TB) (*PG, string) {
	t.Helper()
	dsn := newDatabase(t)
	pg, err := Open(context.Background(), Config{DSN: dsn, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	return pg, dsn
}

// viaAddr rewrites dsn to connect through addr (a proxy).
func viaAddr(t testing.TB, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// testRegistry is a registry whose clock tests can move.
type testRegistry interface {
	Registry
	ClockShifter
}

// backend makes a fresh registry for one test.
type backend struct {
	name string
	new  func(t testing.TB) testRegistry
}

// backends are the twin and PostgreSQL.
func backends() []backend {
	return []backend{
		{"Twin", func(testing.TB) testRegistry { return NewTwin(risingClock()) }},
		{"Postgres", func(t testing.TB) testRegistry { pg, _ := newPG(t); return pg }},
	}
}

// risingClock is the wall clock, made to rise by at least a microsecond
// (the registry's resolution) between reads, as clock_timestamp() does
// between statements: history events get distinct times.
func risingClock() func() time.Time {
	var (
		mu   sync.Mutex
		last time.Time
	)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now().Truncate(time.Microsecond)
		if !now.After(last) {
			now = last.Add(time.Microsecond)
		}
		last = now
		return now
	}
}

var topologySeq atomic.Int64

// newTopology creates a topology with params p and an active epoch of
// partitions x shards, and returns its name.
func newTopology(t testing.TB, r Registry, p Params, partitions, shards int) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("ns/topo-%d", topologySeq.Add(1))
	must(t, r.EnsureTopology(ctx, name, p))
	e, err := r.CreatePending(ctx, name, partitions, shards)
	must(t, err)
	must(t, r.Activate(ctx, name, e))
	return name
}

// fataler is what must needs: a testing.TB or a *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
}

func must(t fataler, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantErr fails unless err matches target (nil means success).
func wantErr(t testing.TB, what string, err, target error) {
	t.Helper()
	switch {
	case target == nil && err != nil:
		t.Fatalf("%s: unexpected error %v", what, err)
	case target != nil && !errors.Is(err, target):
		t.Fatalf("%s: got %v, want %v", what, err, target)
	}
}

// testParams is a minute-scale lease: tests move the clock explicitly.
var testParams = Params{LeaseTTL: 60 * time.Second, RenewInterval: 20 * time.Second, QueryBound: 10 * time.Second, Grace: 30 * time.Second}
