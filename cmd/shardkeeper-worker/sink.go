package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// sinkSchema is the table rows land in. It is append-only: every write is
// kept, duplicates (at-least-once redeliveries) included, with the member
// and fencing epoch that wrote it and when (the database's wall clock), so
// the history checker can tell a redelivery from a stale duplicate.
const sinkSchema = `
CREATE TABLE IF NOT EXISTS shardkeeper_sink_writes (
	seq         bigserial PRIMARY KEY,
	id          text NOT NULL,
	unit        text NOT NULL,
	member      text NOT NULL,
	epoch       bigint NOT NULL,
	written_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS shardkeeper_sink_writes_id ON shardkeeper_sink_writes (id)`

// insertGuarded writes only while the token is valid (worker.GuardSQL
// locks the claim row until commit, so an adoption waits for it), and
// returns how many writes of the row were there before.
const insertGuarded = `
WITH ins AS (
	INSERT INTO shardkeeper_sink_writes (id, unit, member, epoch)
	SELECT $5, $2, $3, $4 WHERE ` + sinkGuard + `
	RETURNING 1)
SELECT (SELECT count(*) FROM shardkeeper_sink_writes WHERE id = $5) FROM ins`

// sink writes rows into PostgreSQL behind the claim's write guard.
type sink struct {
	pool *pgxpool.Pool
	// delay is waited before each write (a test knob).
	delay time.Duration
	// delayFile, while it exists, holds a duration also waited before
	// each write (a test knob).
	delayFile  string
	written    prometheus.Counter
	duplicates prometheus.Counter
	refused    prometheus.Counter
}

// createSinkTable creates the sink table if it is missing. CREATE TABLE IF
// NOT EXISTS races with itself when workers start together; an advisory
// lock makes them take turns.
func createSinkTable(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('shardkeeper_sink_rows'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sinkSchema)
		return err
	})
	if err != nil {
		return fmt.Errorf("create sink table: %w", err)
	}
	return nil
}

func newSink(ctx context.Context, pool *pgxpool.Pool, reg prometheus.Registerer) (*sink, error) {
	if err := createSinkTable(ctx, pool); err != nil {
		return nil, err
	}
	s := &sink{
		pool: pool,
		written: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_rows_written_total",
			Help: "Rows written to the sink for the first time."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_rows_duplicate_total",
			Help: "Rows written again: redeliveries the sink absorbed."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_rows_refused_total",
			Help: "Writes the guard refused because the claim moved (stale epoch)."}),
	}
	reg.MustRegister(s.written, s.duplicates, s.refused)
	return s, nil
}

// write is the worker's Handler: ack only after commit; leave a refused
// (stale) row unsettled for its new owner; nak on a database error.
func (s *sink) write(ctx context.Context, row worker.Row) worker.Settlement {
	if !s.wait(ctx) {
		return worker.Nak
	}
	args := append(worker.GuardArgs(row.Token), worker.DefaultRowID(row))
	var before int
	err := s.pool.QueryRow(ctx, insertGuarded, args...).Scan(&before)
	switch {
	case err == nil && before == 0:
		s.written.Inc()
		return worker.Ack
	case err == nil:
		s.duplicates.Inc()
		return worker.Ack
	case isNoRows(err):
		s.refused.Inc()
		return worker.Abandon
	default:
		return worker.Nak
	}
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// fileDelayPoll is how often a write waiting on the delay file checks
// that the file still holds a delay.
const fileDelayPoll = 50 * time.Millisecond

// wait waits the test knobs' delays before a write: the fixed delay, then
// the file's for as long as the file still holds one, so a test that
// removes the file lets every waiting write go on at once (a chaos test
// keeps rows in flight until its SIGSTOP lands, then lets the resumed
// handlers run into the fence). It reports false when ctx ended first.
func (s *sink) wait(ctx context.Context) bool {
	if !sleep(ctx, s.delay) {
		return false
	}
	end := time.Now().Add(s.fileDelay())
	for left := time.Until(end); left > 0; left = time.Until(end) {
		if !sleep(ctx, min(left, fileDelayPoll)) {
			return false
		}
		if s.fileDelay() == 0 {
			return true
		}
	}
	return true
}

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// fileDelay reads the delay test knob's file: the duration written in it,
// 0 when there is no file or it does not hold one.
func (s *sink) fileDelay() time.Duration {
	if s.delayFile == "" {
		return 0
	}
	b, err := os.ReadFile(s.delayFile)
	if err != nil {
		return 0
	}
	d, _ := time.ParseDuration(strings.TrimSpace(string(b)))
	return d
}
