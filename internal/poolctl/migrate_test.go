package poolctl

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
)

func TestMigrateIsIdempotentAndSerializesConcurrentOperators(t *testing.T) {
	dsn := newDatabase(t)
	ctx := context.Background()
	pools := []*PG{}
	for i := 0; i < 4; i++ {
		pools = append(pools, New(newPool(t, dsn, 2)))
	}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, len(pools))
	)
	for i, p := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = Migrate(ctx, p.Pool())
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("operator %d: %v", i, err)
		}
	}
	must(t, Migrate(ctx, pools[0].Pool()))
	var n, max int
	must(t, pools[0].Pool().QueryRow(ctx, "SELECT count(*), max(version) FROM shardkeeper.schema_migrations").Scan(&n, &max))
	if n != SchemaVersion() || max != SchemaVersion() || n == 0 {
		t.Fatalf("schema_migrations has %d rows up to %d, want %d", n, max, SchemaVersion())
	}
	// The schema works.
	r := pools[1]
	topo := newTopology(t, r, testParams, 1, 1)
	if _, err := r.Join(ctx, topo, "a"); err != nil {
		t.Fatal(err)
	}

	// A database migrated by a newer binary is refused.
	_, err := pools[0].Pool().Exec(ctx, "INSERT INTO shardkeeper.schema_migrations (version, name) VALUES ($1, 'future.sql')", SchemaVersion()+1)
	must(t, err)
	if err := Migrate(ctx, pools[0].Pool()); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("migrate a newer schema: %v", err)
	}
}

func TestOpenRejectsABadDSNWithoutEchoingIt(t *testing.T) {
	_, err := Open(context.Background(), Config{DSN: "postgres://u:hunter2@127.0.0.1:notaport/db"})
	if err == nil {
		t.Fatal("bad DSN accepted")
	}
	if msg := err.Error(); strings.Contains(msg, "hunter2") {
		t.Fatalf("error leaks the password: %s", msg)
	}
}
