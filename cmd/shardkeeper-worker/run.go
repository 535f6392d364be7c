package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/version"
	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

func run(ctx context.Context, cfg config, log logr.Logger) (err error) {
	// The history opens first, so every process that ran leaves one, and
	// closes last, after every handler returned.
	rec, err := openHistory(cfg)
	if err != nil {
		return err
	}
	defer closeHistory(rec, &err)
	nc, err := connectNATS(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()

	reg, err := worker.OpenRegistry(ctx, worker.RegistryConfig{DSN: cfg.registryDSN, MaxConns: 8})
	if err != nil {
		return err
	}
	defer reg.Close()
	if err := pingRegistry(ctx, cfg.registryDSN); err != nil {
		return err
	}

	sinkPool, err := pgxpool.New(ctx, cfg.sinkDSN)
	if err != nil {
		return fmt.Errorf("open sink: %w", err)
	}
	defer sinkPool.Close()
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.NewCollector())
	s, err := newSink(ctx, sinkPool, promReg)
	if err != nil {
		return err
	}
	s.delay, s.delayFile = cfg.handlerDelay, cfg.handlerDelayFile

	opts := worker.Options{
		Topology: cfg.topology, Member: cfg.member, Registry: reg, NATS: nc,
		SubjectPrefix: cfg.subjectPrefix, ConsumerName: cfg.consumerName,
		Handler: s.write, DrainTimeout: cfg.drainTimeout, FetchBatch: cfg.fetchBatch,
		Logger: log, Metrics: promReg,
	}
	if rec != nil {
		opts.History = rec
	}
	w, err := worker.New(opts)
	if err != nil {
		return err
	}
	srv, err := serveHTTP(cfg.healthAddr, w, promReg)
	if err != nil {
		return err
	}
	defer srv.Close()
	log.Info("Worker starting", "member", cfg.member, "topology", cfg.topology, "version", version.Get().Version, "revision", version.Get().Revision)
	return w.Run(ctx)
}

// pingRegistry connects to the registry once before anything else uses
// its DSN: the pool dials lazily, so without it a registry DSN that
// reaches nothing (or is refused) surfaced first from the sink, which
// shares the DSN by default, as "create sink table". pgx's errors name the
// host, user and database, never the password.
func pingRegistry(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("reach the registry (--registry-dsn, REGISTRY_DSN): %w", err)
	}
	return conn.Close(ctx)
}

// openHistory opens the delivery history file when --history-dir is set
// (nil otherwise): the evidence the end-to-end tests judge.
func openHistory(cfg config) (*history.FileRecorder, error) {
	if cfg.historyDir == "" {
		return nil, nil
	}
	rec, err := history.NewFileRecorder(cfg.historyDir, cfg.member)
	if err != nil {
		return nil, fmt.Errorf("open delivery history in --history-dir: %w", err)
	}
	return rec, nil
}

// closeHistory closes rec (if any) and joins its error to *err: a history
// with lost records must not pass as complete evidence, so the process
// exits with an error instead.
func closeHistory(rec *history.FileRecorder, err *error) {
	if rec == nil {
		return
	}
	if cerr := rec.Close(); cerr != nil {
		*err = errors.Join(*err, cerr)
	}
}

// natsAuth reads the credential forms and TLS files the operator accepts
// (natsops.AuthOptions) from the files the pod mounts.
func natsAuth(cfg config) ([]nats.Option, error) {
	var creds []byte
	if cfg.natsCreds != "" {
		b, err := os.ReadFile(cfg.natsCreds)
		if err != nil {
			return nil, fmt.Errorf("%w: --nats-creds: %v", errBadFlag, err)
		}
		creds = b
	}
	var files map[string][]byte
	if cfg.natsTLSDir != "" {
		files = map[string][]byte{}
		for _, name := range []string{"ca.crt", "tls.crt", "tls.key"} {
			b, err := os.ReadFile(filepath.Join(cfg.natsTLSDir, name))
			switch {
			case err == nil:
				files[name] = b
			case !errors.Is(err, os.ErrNotExist):
				return nil, fmt.Errorf("%w: --nats-tls-dir: %v", errBadFlag, err)
			}
		}
	}
	opts, err := natsops.AuthOptions(creds, files)
	if err != nil {
		return nil, fmt.Errorf("--nats-creds/--nats-tls-dir: %w", err)
	}
	return opts, nil
}

func connectNATS(cfg config) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("shardkeeper-worker " + cfg.member), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	auth, err := natsAuth(cfg)
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	nc, err := nats.Connect(strings.TrimSpace(cfg.natsURL), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	return nc, nil
}

// serveHTTP starts the health, status and metrics endpoints.
func serveHTTP(addr string, w *worker.Worker, reg *prometheus.Registry) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "ok") })
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if err := w.Readiness(); err != nil {
			http.Error(rw, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(rw, "ok")
	})
	mux.HandleFunc("/status", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(w.Status())
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println("health server:", err)
		}
	}()
	return srv, nil
}
