package poolctl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// The "no statement or lock timeouts": a worker stopped inside a
// transaction must not hold the registry up. The server ends its session
// after the idle timeout, and a statement waiting on a lock fails with
// lock_timeout instead of hanging.
func TestServerEndsIdleTransactionsAndLockWaits(t *testing.T) {
	dsn := newDatabase(t)
	ctx := context.Background()
	reg, err := Open(ctx, Config{DSN: dsn, MaxConns: 4, LockTimeout: 200 * time.Millisecond,
		IdleInTransactionTimeout: 600 * time.Millisecond})
	must(t, err)
	t.Cleanup(reg.Close)
	for name, want := range map[string]string{"lock_timeout": "200ms", "idle_in_transaction_session_timeout": "600ms",
		"statement_timeout": "30s"} {
		var got string
		must(t, reg.Pool().QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got))
		if got != want {
			t.Fatalf("%s = %s, want %s", name, got, want)
		}
	}
	topo := newTopology(t, reg, testParams, 1, 2)
	a, _ := reg.Join(ctx, topo, "a")
	b, _ := reg.Join(ctx, topo, "b")
	ca, err := reg.Claim(ctx, a.MemberRef, 1, "0.0")
	must(t, err)

	// A sink transaction (on a connection without timeouts) holds the claim
	// row while a lapses past its grace: b's adoption fails fast.
	holder, err := newPool(t, dsn, 1).Begin(ctx)
	must(t, err)
	defer holder.Rollback(ctx) // before the pool closes, or Close waits for it
	_, err = GuardedExec(ctx, holder, ca.Token, "SELECT 1")
	must(t, err)
	lapse(t, reg, topo, b.MemberRef)
	// The client gives up after 5s; the server must have given up first.
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = reg.Claim(bounded, b.MemberRef, 1, "0.0")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("claim waiting on the held row: %v, want lock_timeout (55P03)", err)
	}
	must(t, holder.Rollback(ctx))

	// A worker's transaction on the registry's own pool holds the row, and
	// the worker stops: the server ends the idle session, releasing it.
	a2, _ := reg.Join(ctx, topo, "a")
	conf, err := reg.ConfirmOwned(ctx, a2.MemberRef, nil)
	must(t, err)
	if len(conf.Held) != 1 {
		lapse(t, reg, topo, a2.MemberRef) // the re-home grace
		conf, err = reg.ConfirmOwned(ctx, a2.MemberRef, nil)
		must(t, err)
	}
	stopped, err := reg.Pool().Begin(ctx)
	must(t, err)
	defer stopped.Rollback(ctx)
	_, err = GuardedExec(ctx, stopped, conf.Held["0.0"], "SELECT 1")
	must(t, err)
	// a2's release updates the row, so it waits for the stopped worker's
	// lock (and fails after lock_timeout) until the server ends that
	// session. (A claim would not wait: it reads without locks and, a2
	// being live, writes nothing.)
	testbed.Eventually(t, 10*time.Second, func() error {
		bounded, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := reg.Release(bounded, conf.Held["0.0"]); err != nil {
			return fmt.Errorf("release while the stopped worker's transaction lives: %w", err)
		}
		return nil
	})
	if err := stopped.Commit(ctx); err == nil {
		t.Fatal("the stopped worker's transaction committed after the server ended its session")
	}
	// The ended backend may be listed a moment longer than it holds locks.
	testbed.Eventually(t, 10*time.Second, func() error {
		var n int
		if err := reg.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("%d sessions still idle in a transaction", n)
		}
		return nil
	})
}

// lapse moves the registry clock past every lease but keep's, and past the
// grace.
func lapse(t *testing.T, r testRegistry, topo string, keep MemberRef) {
	t.Helper()
	for i := 0; i < 5; i++ {
		must(t, r.ShiftClock(context.Background(), topo, 20*time.Second))
		_, err := r.Renew(context.Background(), keep)
		must(t, err)
	}
}

// The registry's clock offset is a test hook: where shardkeeper.test_clock
// is not on (every production database), the offset cannot be set and is
// not applied.
func TestClockOffsetNeedsTheTestClockSetting(t *testing.T) {
	ctx := context.Background()
	srv := pgServer(t)
	prodDSN, err := srv.NewDatabase(ctx, strings.ToLower(fmt.Sprintf("prod_%d", time.Now().UnixNano())))
	must(t, err)
	testDSN := newDatabase(t)
	cases := []struct {
		name     string
		dsn      string
		shifts   bool
		pretests func(*testing.T, string) // prepare an offset the session must ignore
	}{
		{"test database", testDSN, true, nil},
		{"production database", prodDSN, false, nil},
		{"test database, session with the setting off", testDSN + "&shardkeeper.test_clock=off", false,
			func(t *testing.T, topo string) {
				// The offset exists in the row (set where it may be) but this
				// session does not see it.
				on, err := Open(ctx, Config{DSN: testDSN, SkipMigrate: true})
				must(t, err)
				defer on.Close()
				must(t, on.ShiftClock(ctx, topo, time.Hour))
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg, err := Open(ctx, Config{DSN: c.dsn, MaxConns: 2})
			must(t, err)
			defer reg.Close()
			topo := newTopology(t, reg, testParams, 1, 1)
			if c.pretests != nil {
				c.pretests(t, topo)
			}
			err = reg.ShiftClock(ctx, topo, time.Hour)
			if c.shifts {
				must(t, err)
			} else if err == nil || !strings.Contains(err.Error(), "test hook") {
				t.Fatalf("ShiftClock where the test clock is off: %v", err)
			}
			s, err := reg.Snapshot(ctx, topo)
			must(t, err)
			offset := time.Until(s.Now)
			if shifted := offset > 50*time.Minute; shifted != c.shifts {
				t.Fatalf("registry clock %v from the wall clock; want shifted=%v", offset.Round(time.Second), c.shifts)
			}
		})
	}
}
