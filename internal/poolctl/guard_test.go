package poolctl

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestGuardedWritesCommitOnlyUnderTheCurrentEpoch(t *testing.T) { // checks P1
	pg, _ := newPG(t)
	ctx := context.Background()
	pool := pg.Pool()
	_, err := pool.Exec(ctx, "CREATE TABLE sink (unit text, seq bigint, epoch bigint)")
	must(t, err)
	topo := newTopology(t, pg, testParams, 1, 2)
	a, _ := pg.Join(ctx, topo, "a")
	b, _ := pg.Join(ctx, topo, "b")
	ca, err := pg.Claim(ctx, a.MemberRef, 1, "0.0")
	must(t, err)

	// Embedded guard: the sink's own statement carries the condition.
	tag, err := pool.Exec(ctx, "INSERT INTO sink SELECT $2, $5, $4 WHERE "+GuardSQL, append(GuardArgs(ca.Token), int64(1))...)
	must(t, err)
	if tag.RowsAffected() != 1 {
		t.Fatalf("embedded guard wrote %d rows", tag.RowsAffected())
	}

	// A guarded transaction holds the claim row until it ends: b's adoption
	// waits for it.
	tx, err := pool.Begin(ctx)
	must(t, err)
	defer tx.Rollback(ctx)
	_, err = GuardedExec(ctx, tx, ca.Token, "INSERT INTO sink VALUES ($1, $2, $3)", "0.0", int64(2), ca.Epoch)
	must(t, err)
	for i := 0; i < 5; i++ { // a lapses past its grace; b stays live
		must(t, pg.ShiftClock(ctx, topo, 20*time.Second))
		_, err := pg.Renew(ctx, b.MemberRef)
		must(t, err)
	}
	adopted := make(chan error, 1)
	go func() {
		_, err := pg.Claim(ctx, b.MemberRef, 1, "0.0")
		adopted <- err
	}()
	select {
	case err := <-adopted:
		t.Fatalf("adoption did not wait for the guarded write: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	must(t, tx.Commit(ctx))
	select {
	case err := <-adopted:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("adoption still blocked after the guarded write committed")
	}

	// a's later writes with its old epoch are refused, by both paths.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := GuardedExec(ctx, tx, ca.Token, "INSERT INTO sink VALUES ($1, $2, $3)", "0.0", int64(3), ca.Epoch)
		return err
	})
	var se *StaleEpochError
	if !errors.As(err, &se) || se.Reason != StaleMoved || se.Owner != "b" || se.Epoch != 2 {
		t.Fatalf("stale guarded write: %v", err)
	}
	tag, err = pool.Exec(ctx, "INSERT INTO sink SELECT $2, $5, $4 WHERE "+GuardSQL, append(GuardArgs(ca.Token), int64(4))...)
	must(t, err)
	if tag.RowsAffected() != 0 {
		t.Fatal("embedded guard wrote with a stale epoch")
	}
	var n int
	must(t, pool.QueryRow(ctx, "SELECT count(*) FROM sink").Scan(&n))
	if n != 2 {
		t.Fatalf("sink has %d rows, want the 2 written under epoch 1", n)
	}
}
