package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// RowIDHeader carries a row's unique id; without it the row's stream and
// sequence stand in.
const RowIDHeader = "Nats-Msg-Id"

// sinkSchema is the table rows land in. deliveries counts how often a row
// was written, so duplicates (at-least-once redeliveries) are visible.
const sinkSchema = `
CREATE TABLE IF NOT EXISTS shardkeeper_sink_rows (
	id          text PRIMARY KEY,
	unit        text NOT NULL,
	epoch       bigint NOT NULL,
	member      text NOT NULL,
	deliveries  integer NOT NULL DEFAULT 1,
	written_at  timestamptz NOT NULL DEFAULT now()
)`

// insertGuarded writes only while the token is valid (poolctl.GuardSQL
// locks the claim row until commit, so an adoption waits for it).
const insertGuarded = `
INSERT INTO shardkeeper_sink_rows (id, unit, epoch, member)
SELECT $5, $2, $4, $3 WHERE ` + poolctl.GuardSQL + `
ON CONFLICT (id) DO UPDATE SET deliveries = shardkeeper_sink_rows.deliveries + 1,
	epoch = EXCLUDED.epoch, member = EXCLUDED.member
RETURNING deliveries`

// sink writes rows into PostgreSQL behind the claim's write guard.
type sink struct {
	pool       *pgxpool.Pool
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
			Help: "Rows written to the sink (first deliveries)."}),
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
	id := rowID(row)
	args := append(poolctl.GuardArgs(row.Token), id)
	var deliveries int
	err := s.pool.QueryRow(ctx, insertGuarded, args...).Scan(&deliveries)
	switch {
	case err == nil && deliveries == 1:
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

func rowID(row worker.Row) string {
	if ids := row.Headers[RowIDHeader]; len(ids) > 0 && ids[0] != "" {
		return ids[0]
	}
	return row.Unit.String() + "@" + strconv.FormatUint(row.StreamSeq, 10)
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
