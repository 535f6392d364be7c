// Command custom-worker is the smallest useful worker built on the
// shardkeeper SDK from another module: it joins the fleet named by its
// environment, writes every row into a PostgreSQL table behind the claim's
// write guard, and acknowledges a row only after the write committed. Copy
// it, then replace write with what your rows mean.
//
// Environment (what a StatefulSet pod spec sets; see
// config/samples/worker_statefulset.yaml in the shardkeeper repository):
//
//	SHARDKEEPER_TOPOLOGY  namespace/name of the ShardTopology
//	POD_NAME              this worker's member name (the downward API)
//	NATS_URL              NATS server URL(s), comma-separated
//	REGISTRY_DSN          the registry's PostgreSQL DSN (also the sink here)
//	WORKER_HEALTH_ADDR    address of /readyz and /healthz (default :8081)
//	WORKER_HISTORY_DIR    optional: record a delivery history there, the
//	                      evidence shardkeeper's history checker judges
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(ctx, log); err != nil {
		log.Error("worker stopped", "error", err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	env := func(name string) (string, error) {
		if v := os.Getenv(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("environment variable %s is required", name)
	}
	topology, err := env("SHARDKEEPER_TOPOLOGY")
	if err != nil {
		return err
	}
	member, err := env("POD_NAME")
	if err != nil {
		return err
	}
	natsURL, err := env("NATS_URL")
	if err != nil {
		return err
	}
	dsn, err := env("REGISTRY_DSN")
	if err != nil {
		return err
	}

	nc, err := nats.Connect(natsURL, nats.Name("custom-worker "+member), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	reg, err := worker.OpenRegistry(ctx, worker.RegistryConfig{DSN: dsn})
	if err != nil {
		return err
	}
	defer reg.Close()
	sink, err := openSink(ctx, dsn)
	if err != nil {
		return err
	}
	defer sink.Close()

	opts := worker.Options{
		Topology: topology, Member: member, Registry: reg, NATS: nc,
		Handler: func(ctx context.Context, row worker.Row) worker.Settlement { return write(ctx, sink, row) },
		Logger:  logr.FromSlogHandler(log.Handler()),
	}
	if dir := os.Getenv("WORKER_HISTORY_DIR"); dir != "" {
		rec, err := history.NewFileRecorder(dir, member)
		if err != nil {
			return err
		}
		defer rec.Close()
		opts.History = rec
	}
	w, err := worker.New(opts)
	if err != nil {
		return err
	}
	stopHealth := serveHealth(w)
	defer stopHealth()
	return w.Run(ctx)
}

// table is where rows land: the same append-only layout as shardkeeper's
// reference worker, so the project's history checker can judge this
// example in its end-to-end test. Yours will differ.
const table = "shardkeeper_sink_writes"

func openSink(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("open sink: %w", err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Workers starting together would race on CREATE TABLE.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('`+table+`'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
			seq bigserial PRIMARY KEY, id text NOT NULL, unit text NOT NULL, member text NOT NULL,
			epoch bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
		return err
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("create sink table: %w", err)
	}
	return pool, nil
}

// write stores the row only while the worker's claim on its unit is valid
// (worker.GuardSQL locks the claim until the insert commits), acks it after
// the commit, and leaves it unsettled when the guard refused: the unit has
// a new owner, who gets the row.
func write(ctx context.Context, sink *pgxpool.Pool, row worker.Row) worker.Settlement {
	args := append(worker.GuardArgs(row.Token), worker.DefaultRowID(row))
	tag, err := sink.Exec(ctx, `INSERT INTO `+table+` (id, unit, member, epoch)
		SELECT $5, $2, $3, $4 WHERE `+worker.GuardSQL, args...)
	switch {
	case err != nil:
		return worker.Nak
	case tag.RowsAffected() == 0:
		return worker.Abandon
	default:
		return worker.Ack
	}
}

// serveHealth answers /healthz always and /readyz while the worker holds a
// lease and is not fenced.
func serveHealth(w *worker.Worker) func() {
	addr := os.Getenv("WORKER_HEALTH_ADDR")
	if addr == "" {
		addr = ":8081"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "ok") })
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !w.Ready() {
			http.Error(rw, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(rw, "ok")
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "health server:", err)
		}
	}()
	return func() { _ = srv.Close() }
}
