package pgtest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestStartServesQueriesAndIsolatesDatabases(t *testing.T) {
	s := New(t)
	ctx := context.Background()
	a, b := s.NewTestDatabase(t), s.NewTestDatabase(t)
	if a == b {
		t.Fatalf("two databases share DSN %s", a)
	}
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	connB, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close(ctx)
	var n int
	if err := connB.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("table from database a visible in b")
	}
}

func TestTestDatabasesHaveTheTestClockOn(t *testing.T) {
	s := New(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		dsn  func() string
		want string
	}{
		{"test database", func() string { return s.NewTestDatabase(t) }, "on"},
		{"plain database", func() string {
			dsn, err := s.NewDatabase(ctx, "plain_"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_")))
			if err != nil {
				t.Fatal(err)
			}
			return dsn
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := pgx.Connect(ctx, c.dsn())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var got *string
			if err := conn.QueryRow(ctx, "SELECT current_setting('shardkeeper.test_clock', true)").Scan(&got); err != nil {
				t.Fatal(err)
			}
			if (got == nil && c.want != "") || (got != nil && *got != c.want) {
				t.Fatalf("shardkeeper.test_clock = %v, want %q", got, c.want)
			}
		})
	}
}
