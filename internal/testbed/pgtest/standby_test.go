package pgtest

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestARestartedServerHasEveryCommitItAcknowledgedBeforeItsKill is what
// the chaos suite's failover family relies on to read the lost primary's
// history back: with synchronous_commit on, a commit acknowledged before
// the SIGKILL is there after Restart, on a new port, and the killed
// server's port no longer answers.
func TestARestartedServerHasEveryCommitItAcknowledgedBeforeItsKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := New(t)
	exec := func(dsn, sql string, args ...any) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(s.DSN("postgres"), "ALTER ROLE postgres SET synchronous_commit = 'on'")
	dsn := s.NewTestDatabase(t)
	exec(dsn, "CREATE TABLE acked (n int)")
	const rows = 200
	for i := range rows {
		exec(dsn, "INSERT INTO acked VALUES ($1)", i)
	}
	if _, err := s.Restart(ctx); err == nil {
		t.Fatal("Restart of a running server succeeded")
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	back, err := s.Restart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(back.Stop)
	if back.Port == s.Port {
		t.Fatalf("restarted on the killed server's port %d", s.Port)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = "127.0.0.1:" + strconv.Itoa(back.Port)
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM acked").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != rows {
		t.Fatalf("the restarted server has %d of the %d rows acknowledged before the kill", n, rows)
	}
}
